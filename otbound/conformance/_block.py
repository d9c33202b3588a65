"""Block-level conformance check (implementation of :func:`check_block_verifier`)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from otbound import InvalidInputError, block_bound, prefix_law, sample_blocks, shifted_model
from otbound._validation import check_positive_int
from otbound.conformance._common import as_token_id, check_args, frozen, run_check
from otbound.conformance._drafting import as_drafting
from otbound.conformance._instances import BlockInstance, block_instances, check_instance_count, shrink_block
from otbound.conformance._result import (
    MAX_ROWS,
    ConformanceResult,
    Counterexample,
    InstanceReport,
)
from otbound.conformance._stats import degrees_of_freedom, g_test
from otbound.conformance._tree import MAX_BRANCHES, ConformanceError, enumerate_outcomes

#: exact mode enumerates at most this many draft tuples ((#blocks)^K) per instance
MAX_TUPLES = 20_000


def check_block_verifier(
    verify,
    *,
    vocab_size: int,
    num_drafts: int,
    block_len: int,
    instances: int | Sequence = 8,
    seed: int = 0,
    mode: str = "exact",
    tolerance: float | None = None,
    precision: str = "float64",
    batch: bool = False,
    level: float | None = None,
    distortion: float | None = None,
    power: float | None = None,
    samples: int | None = None,
    max_branches: int = MAX_BRANCHES,
    shrink: bool = True,
    name: str | None = None,
    drafting=None,
) -> ConformanceResult:
    """Check a block verifier (K i.i.d. draft blocks of L tokens) for one-iteration losslessness
    and measure its ``E[τ]`` against ``U_causal`` (and ``U_joint``) of :func:`otbound.block_bound`.

    The verifier reads the target and the draft models (callables ``prefix tuple -> law (V,)``)
    and ``blocks`` (int array (K, L), each row drawn from the draft model) and returns the emitted
    tokens of one iteration: ``τ`` accepted tokens forming a prefix of some draft block, then one
    correction / bonus token (``1 ≤ len ≤ L + 1``); ``τ = len − 1``. Lossless (docs/theory/block-bounds.md): the
    emitted sequence continued by sampling the target to ``L + 1`` tokens has the target's law over
    ``V^{L+1}``; the lossless error is the max absolute difference of those two laws.

    **mode="exact"**: ``verify(target, draft, blocks, coin, draw) -> tokens``, randomness only via
    ``coin(prob) -> bool`` and ``draw(law) -> int``. Every draft tuple of positive probability and
    every branch are enumerated, so laws and ``E[τ]`` are exact; pass iff error ≤ ``tolerance``
    (by ``precision``: "float64" 1e-10, "float32" 1e-6; see :func:`check_token_verifier`). A
    failing instance is shrunk (smaller K, shorter blocks, fewer tokens) to the
    ``counterexample``.

    **mode="sample"**: ``verify(target, draft, blocks, rng) -> tokens``; with ``batch=True``
    ``verify(target, draft, blocks (n, K, L), rng) -> (n, L + 1)`` int array padded with −1. The
    emitted sequences are continued by the target and G-tested over ``V^{L+1}`` cells at level
    ``level / #instances``, with ``n`` chosen for power ≥ ``power`` against any total-variation
    distortion ``distortion`` of the continued law (see :func:`check_token_verifier`); e.g. V = 2,
    L = 2 (7 degrees of freedom), 8 instances: n = 131,946 per instance, power 0.9900.

    ``instances``: a count (adversarial family then random models) or a sequence of
    :class:`BlockInstance`. Models are tabulated for prefixes of length ``0..L``; asking a longer
    prefix is an error.

    ``drafting``: None for K i.i.d. draft blocks; a user's scheme — a
    :class:`~otbound.conformance.DraftingScheme` ``(name, law, draw)`` or a pair ``(draw, law)`` of
    functions, e.g. :func:`~otbound.conformance.top_k_tree` (EAGLE's deterministic top-k tree) —; or a
    :class:`~otbound.block.verifiers.BlockVerifier` with its own drafting scheme (e.g.
    ``BLOCK_VERIFIERS["univer"]``, whose ``num_drafts`` is the branching m of its tree). Draft trees
    are then enumerated by its exact law (``draft_tuple_law``; ``blocks`` holds a tree's root-to-leaf
    rows), drawn by its ``draw_drafts``, and ``E[τ]`` is compared with U_causal / U_joint of that law
    (``own_law_bounds``), not of K i.i.d. blocks. With a count of ``instances``, generated instances
    on which the scheme cannot draft (e.g. fewer than k drafted tokens at a node of a top-k tree) are
    passed over; a given instance on which the law cannot be built raises the scheme's
    :class:`~otbound.InvalidInputError`.

    Parameters
    ----------
    verify : callable
        The verifier (signature by ``mode``, above).
    vocab_size : int
        V.
    num_drafts : int
        K.
    block_len : int
        L.
    instances : int or sequence
        A count, or :class:`otbound.conformance.BlockInstance` objects of this V and L.
    seed, mode, tolerance, precision, batch, level, distortion, power, samples, max_branches, shrink, name
        As in :func:`check_token_verifier` (the same options, defaults and modes).
    drafting : DraftingScheme or pair or BlockVerifier, optional
        The drafting scheme (above); None for K i.i.d. blocks.

    Returns
    -------
    ConformanceResult

    Raises
    ------
    otbound.conformance.ConformanceError
        The verifier broke the contract (a bad probability or law, nondeterminism, an output that
        is not an accepted draft prefix then one token).
    otbound.InvalidInputError
        Bad arguments (e.g. more than a million cells ``V^(L+1)``, an instance of another V or L).

    References
    ----------
    Sun et al., block verification (arXiv:2403.10444); Sun et al., SpecTr (arXiv:2310.15141).

    Examples
    --------
    >>> from otbound import BLOCK_VERIFIERS
    >>> from otbound.conformance import block_adapter, check_block_verifier
    >>> from otbound.conformance.examples import block_shared_uniform
    >>> res = check_block_verifier(block_adapter(BLOCK_VERIFIERS["block"]), vocab_size=2, num_drafts=2,
    ...                            block_len=2, instances=3)
    >>> print(res.summary().splitlines()[0])
    block_adapter(block): PASS: lossless  (block level, V = 2, K = 2, L = 2, exact mode, 3 instances)
    >>> res.efficiency.round(4).tolist()
    [0.7928, 1.0, 0.6965]

    Block verification with one uniform for its whole backward scan is lossy; the counterexample is
    shrunk to K = 1:

    >>> bad = check_block_verifier(block_shared_uniform, vocab_size=2, num_drafts=2, block_len=2, instances=3)
    >>> bad.passed, bad.counterexample.num_drafts, bad.counterexample.block_len
    (False, 1, 2)
    """
    args = check_args(
        verify, name, vocab_size, num_drafts, mode, tolerance=tolerance, precision=precision, batch=batch, level=level,
        distortion=distortion, power=power, samples=samples,
    )  # fmt: skip
    v, k, mode = args.vocab_size, args.num_drafts, args.mode
    length = check_positive_int(block_len, "block_len")
    drafting = as_drafting(drafting)
    _check_size(v, k, length, mode, drafting)
    if isinstance(instances, (int, np.integer)) and not isinstance(instances, bool):
        count = check_instance_count(instances)
        if drafting is None:
            insts = block_instances(v, length, count, int(seed))
        else:
            insts = _draftable_instances(drafting, v, k, length, count, int(seed))
    else:
        insts = list(instances)
        for i, t in enumerate(insts):
            if not isinstance(t, BlockInstance) or (t.vocab_size, t.block_len) != (v, length):
                raise InvalidInputError(
                    f"instance {i} must be a BlockInstance with vocab_size {v} and block_len {length}"
                )
    if not insts:
        raise InvalidInputError("no instance to check")
    law = "with_replacement" if drafting is None else drafting.sampling

    def sample_counterexample(t, rep, out):
        target_law = _seq_dict(prefix_law(t.models()[0], length + 1))
        return Counterexample(
            "block", v, k, law, rep.lossless_error, t.target, t.draft, out, target_law, _worst(out, target_law),
            block_len=length, label=t.label,
        )  # fmt: skip

    return run_check(
        args, "block", law, insts, seed,
        exact_report=lambda t: _exact_report(verify, t, k, args.tolerance, max_branches, drafting),
        exact_error=lambda t, kk: _exact_law(verify, t, kk, max_branches, drafting)[0],
        shrink=(lambda t, kk, fails: shrink_block(t, kk, _draftable_failure(fails, drafting))) if shrink else None,
        counterexample=lambda t, kk: _counterexample(verify, t, kk, max_branches, drafting),
        sample_report=lambda t, plan, rng: _sample_report(verify, t, k, plan, batch, rng, drafting),
        sample_counterexample=sample_counterexample, block_len=length,
    )  # fmt: skip


def _draftable_failure(fails, drafting):
    """``fails`` for shrinking: with a drafting scheme, a smaller candidate it cannot draft on (a
    top-k tree's fixed K, a node left with fewer than k tokens) is no counterexample."""
    if drafting is None:
        return fails

    def draftable_fails(t, kk):
        try:
            return fails(t, kk)
        except InvalidInputError:
            return False

    return draftable_fails


#: models are tabulated over at most this many (prefix, token) cells, ``V^(L+1)``
MAX_CELLS = 1_000_000


def _check_size(v: int, k: int, length: int, mode: str, drafting) -> None:
    """Refuse at once, before any model is tabulated: more than :data:`MAX_CELLS` cells ``V^(L+1)``
    (the tables and the continued law), and in exact mode with K i.i.d. blocks more than
    :data:`MAX_TUPLES` draft tuples ``V^(L·K)``."""
    if v ** (length + 1) > MAX_CELLS:
        raise InvalidInputError(
            f"V^(L+1) = {v}^{length + 1} cells exceed {MAX_CELLS}: use smaller vocab_size or block_len"
        )
    if mode == "exact" and drafting is None and v ** (length * k) > MAX_TUPLES:
        raise InvalidInputError(
            f"exact mode would enumerate up to {v}^{length * k} draft tuples (limit {MAX_TUPLES}) at V = {v}, "
            f"K = {k}, L = {length}; use smaller V, K or L, or mode='sample'"
        )


#: with drafting=, generated instances tried per requested one (the others the scheme cannot draft on)
DRAFTABLE_TRIES = 4


def _draftable_instances(drafting, v: int, k: int, length: int, count: int, seed: int) -> list:
    """The first ``count`` generated instances on which ``drafting``'s law can be built (a top-k
    tree needs k drafted tokens at every node: instances with zeros in the draft may not allow it);
    the error of the first refused one if none can."""
    out, first_error = [], None
    for t in block_instances(v, length, DRAFTABLE_TRIES * count, seed):
        try:  # a verifier's own law is a generator: it refuses while enumerated (to exact mode's limit)
            for _ in itertools.islice(drafting.draft_tuple_law(t.models()[1], k, length), MAX_TUPLES + 1):
                pass
        except InvalidInputError as exc:
            first_error = first_error or exc
            continue
        out.append(t)
        if len(out) == count:
            break
    if not out:
        raise first_error
    return out


def _draft_tuples(draft, v: int, k: int, length: int, drafting=None):
    """Every K-tuple of draft blocks with positive probability: yields ``(Q(tuple), blocks (K, L))``
    (with ``drafting``: every tuple of its own draft law, ``(Q(tuple), paths (rows, L))``)."""
    if drafting is not None:
        tuples = list(drafting.draft_tuple_law(draft, k, length))
        if len(tuples) > MAX_TUPLES:
            raise InvalidInputError(
                f"exact mode would enumerate {len(tuples)} draft tuples of {drafting.name!r} (> {MAX_TUPLES}); "
                "use smaller V, K or L, or mode='sample'"
            )
        for prob, paths in tuples:
            yield prob, np.array(paths, dtype=np.int64)
        return
    law = prefix_law(draft, length)
    blocks = [(np.array(idx), float(law[idx])) for idx in np.ndindex(law.shape) if law[idx] > 0]
    if len(blocks) ** k > MAX_TUPLES:
        raise InvalidInputError(
            f"exact mode would enumerate {len(blocks)}^{k} draft tuples (> {MAX_TUPLES}); "
            "use smaller V, K or L, or mode='sample'"
        )
    for combo in itertools.product(blocks, repeat=k):
        yield float(np.prod([c[1] for c in combo])), np.stack([c[0] for c in combo])


def _emitted(out, blocks: np.ndarray, v: int) -> tuple:
    """Check one iteration's output: 1..L+1 token ids, all but the last a prefix of some draft block."""
    try:
        seq = tuple(as_token_id(y, v, "an emitted token") for y in out)
    except TypeError:
        raise ConformanceError(f"the verifier must return a sequence of token ids, got {type(out).__name__}") from None
    length = blocks.shape[1]
    if not 1 <= len(seq) <= length + 1:
        raise ConformanceError(f"the verifier emitted {len(seq)} tokens; one iteration emits 1..{length + 1}")
    acc = seq[:-1]
    if acc and not any(tuple(b[: len(acc)]) == acc for b in blocks.tolist()):
        raise ConformanceError(
            f"the verifier accepted {list(acc)}, which is not a prefix of any draft block {blocks.tolist()}"
        )
    return seq


def _exact_law(verify, inst: BlockInstance, k: int, max_branches: int, drafting=None):
    """``(lossless error, continued law (V^{L+1},), target law, E[τ], rows)`` of one instance."""
    v, length = inst.vocab_size, inst.block_len
    target, draft = inst.models()
    law: dict = {}
    rows = []
    for qprob, blocks in _draft_tuples(draft, v, k, length, drafting):
        fb = frozen(blocks)
        cond: dict = {}
        for prob, out in enumerate_outcomes(
            lambda coin, draw, fb=fb: verify(target, draft, fb, coin, draw), max_branches=max_branches, vocab_size=v
        ):
            seq = _emitted(out, blocks, v)
            cond[seq] = cond.get(seq, 0.0) + prob
        for seq, prob in cond.items():
            law[seq] = law.get(seq, 0.0) + qprob * prob
        if len(rows) < MAX_ROWS:
            rows.append((blocks.tolist(), qprob, cond))
    tau = sum(prob * (len(seq) - 1) for seq, prob in law.items())
    full = np.zeros(v ** (length + 1))
    for seq, prob in law.items():
        rest = length + 1 - len(seq)
        start = int(np.ravel_multi_index(seq, (v,) * len(seq))) * v**rest
        full[start : start + v**rest] += prob * prefix_law(shifted_model(target, seq), rest).ravel()
    want = prefix_law(target, length + 1).ravel()
    return float(np.abs(full - want).max()), full, want, float(tau), rows


def _bounds(inst: BlockInstance, k: int, drafting=None) -> tuple[float, float]:
    target, draft = inst.models()
    kw = dict(vocab_size=inst.vocab_size, num_drafts=k, block_len=inst.block_len)
    if drafting is not None:
        own = drafting.own_law_bounds(target, draft, **kw)
        return own.causal, own.joint
    return block_bound(target, draft, kind="causal", **kw).value, block_bound(target, draft, kind="joint", **kw).value


def _exact_report(verify, inst, k, tolerance, max_branches, drafting=None) -> InstanceReport:
    err, full, want, tau, _ = _exact_law(verify, inst, k, max_branches, drafting)
    causal, joint = _bounds(inst, k, drafting)
    return InstanceReport(
        inst.label, inst.vocab_size, k, err, tau, causal, passed=err <= tolerance, block_len=inst.block_len,
        joint_bound=joint, total_variation=0.5 * float(np.abs(full - want).sum()),
    )  # fmt: skip


def _seq_dict(law: np.ndarray) -> dict:
    return {idx: float(law[idx]) for idx in np.ndindex(law.shape)}


def _worst(out: dict, want: dict):
    seq = max(want, key=lambda s: abs(out.get(s, 0.0) - want[s]))
    return seq, out.get(seq, 0.0), want[seq]


def _counterexample(verify, inst, k, max_branches, drafting=None) -> Counterexample:
    err, full, want, _, rows = _exact_law(verify, inst, k, max_branches, drafting)
    shape = (inst.vocab_size,) * (inst.block_len + 1)
    out, tgt = _seq_dict(full.reshape(shape)), _seq_dict(want.reshape(shape))
    return Counterexample(
        "block", inst.vocab_size, k, "with_replacement" if drafting is None else drafting.sampling, err,
        inst.target, inst.draft, out, tgt, _worst(out, tgt),
        block_len=inst.block_len, drafts=rows, label=inst.label,
    )  # fmt: skip


def _sample_report(verify, inst, k, plan, batch, rng, drafting=None):
    v, length = inst.vocab_size, inst.block_len
    target, draft = inst.models()
    want = prefix_law(target, length + 1)
    n, pw = plan.size_and_power(degrees_of_freedom(want))
    if drafting is None:
        blocks = sample_blocks(draft, n * k, length, rng).reshape(n, k, length)
    else:
        blocks = drafting.draw_drafts(draft, n, k, length, rng)
    if batch:
        toks = np.asarray(verify(target, draft, frozen(blocks), rng))
        if toks.shape != (n, length + 1) or not np.issubdtype(toks.dtype, np.integer):
            raise ConformanceError(
                f"a batched block verifier must return an int array of shape ({n}, {length + 1}), "
                f"got {toks.dtype} {toks.shape}"
            )
        seqs = [_emitted(row[row >= 0], blocks[i], v) for i, row in enumerate(toks)]
    else:
        seqs = [_emitted(verify(target, draft, frozen(blocks[i]), rng), blocks[i], v) for i in range(n)]
    groups: dict = {}
    for s in seqs:
        groups[s] = groups.get(s, 0) + 1
    counts = np.zeros(v ** (length + 1), dtype=np.int64)
    for s, c in groups.items():
        rest = length + 1 - len(s)
        tail = sample_blocks(shifted_model(target, s), c, rest, rng) if rest else np.zeros((c, 0), dtype=np.int64)
        full = np.concatenate([np.broadcast_to(np.array(s, dtype=np.int64), (c, len(s))), tail], axis=1)
        np.add.at(counts, np.ravel_multi_index(full.T, (v,) * (length + 1)), 1)
    _, pval = g_test(counts, want)
    law = counts / n
    taus = np.array([len(s) - 1 for s in seqs], dtype=np.float64)
    tau = float(taus.mean())
    causal, joint = _bounds(inst, k, drafting)
    rep = InstanceReport(
        inst.label, v, k, float(np.abs(law - want.ravel()).max()), tau, causal, passed=pval >= plan.per_instance_level,
        block_len=length, joint_bound=joint, total_variation=0.5 * float(np.abs(law - want.ravel()).sum()),
        samples=n, p_value=pval, power=pw, acceptance_se=float(taus.std(ddof=1) / np.sqrt(n)) if n > 1 else None,
    )  # fmt: skip
    return rep, _seq_dict(law.reshape(want.shape))
