"""Common machinery of the block verifiers: one algorithm, two executions (implementation).

A verifier is written once as a *walk*: ``walk(inst, coin, draw) -> (accepted_prefix, law)``, where
``inst`` holds everything the verifier computes from the target, the draft and one draft tuple
(``prepare``), every random decision goes through ``coin(prob) -> bool`` or ``draw(law) -> int``
(the primitives of the conformance kit), and the walk ends with the accepted draft prefix and the
law of the correction (or bonus) token. The same walk is

* *sampled*: ``coin`` and ``draw`` answer with uniforms from a generator (one walk per sample, the
  rows that share a draft tuple share ``inst``, correction tokens drawn in one inverse-CDF pass per
  law);
* *enumerated exactly* by the package's one choice-tree enumerator
  (:func:`otbound._replay.enumerate_outcomes`, unchecked mode, the one the conformance kit runs
  checked), which gives the exact law of the emitted sequence given the drafts, and by summing over
  all draft tuples, exact ``E[τ]`` and the exact one-iteration law of the output — the losslessness
  check needs no sampling at all.

Terminology (docs/theory/notation.md): ``τ`` = accepted draft tokens, the emitted sequence is ``τ + 1`` tokens
(bonus/correction included), ``E[τ]`` excludes the bonus.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from otbound._replay import enumerate_outcomes
from otbound._validation import InvalidInputError, check_num_drafts, check_positive_int
from otbound.block.bounds import block_bound
from otbound.block.models import BlockModel, as_block_model, prefix_law, sample_blocks, shifted_model
from otbound.token.draft_laws import inverse_cdf, sample_drafts

#: draft tuples enumerated for exact E[τ] at most ((V^L)^K); read as otbound.block.verifiers.MAX_EXACT_TUPLES, set here
MAX_EXACT_TUPLES = 2_000_000


@dataclass
class BlockSample:
    """One verification iteration per row.

    tokens: ``(n, L + 1)`` int64, the emitted tokens (accepted draft tokens, then the correction or
    bonus token), padded with −1. num_accepted: ``(n,)`` τ (the bonus/correction is not counted).
    Returned by :meth:`BlockVerifier.sample`; the mean of ``num_accepted`` estimates E[τ].

    Attributes
    ----------
    tokens : numpy.ndarray
        int64 ``(n, L + 1)``: row i holds ``num_accepted[i] + 1`` tokens, then −1.
    num_accepted : numpy.ndarray
        int64 ``(n,)``, τ per row.

    References
    ----------
    Sun et al., "Block verification accelerates speculative decoding", arXiv 2403.10444.

    Examples
    --------
    >>> from otbound import BLOCK_VERIFIERS, context_free_model
    >>> p, q = context_free_model([1 / 3, 2 / 3]), context_free_model([2 / 3, 1 / 3])
    >>> s = BLOCK_VERIFIERS["block"].sample(p, q, [[[1, 1]], [[0, 0]]], rng=0)
    >>> s.tokens.shape, s.num_accepted.shape
    ((2, 3), (2,))
    >>> s.tokens[0, :2].tolist(), int(s.num_accepted[0])  # p/q = 2 on token 1: the block is accepted
    ([1, 1], 2)
    """

    tokens: np.ndarray
    num_accepted: np.ndarray


class _RandomChoices:
    """``coin`` and ``draw`` answered with uniforms from ``rng`` (drawn 4096 at a time)."""

    __slots__ = ("_rng", "_u")

    def __init__(self, rng):
        self._rng = rng
        self._u = []

    def _next(self) -> float:
        if not self._u:
            self._u = self._rng.random(4096).tolist()
        return self._u.pop()

    def coin(self, prob: float) -> bool:
        return self._next() < prob

    def draw(self, law: np.ndarray) -> int:
        return int(inverse_cdf(law, np.array([self._next()]))[0])


@dataclass
class DraftLawBounds:
    """U_causal and U_joint (docs/theory/block-bounds.md) of the draft-tuple law a verifier is run with.

    Returned by :meth:`BlockVerifier.own_law_bounds`. ``U_joint = max_π E_π[max_k LCP(X^(k), Y_{1:L})]``
    over couplings of the K draft blocks with a target block Y ~ p; ``U_causal`` is the LP over plans
    that emit a lossless sequence (docs/theory/block-bounds.md); ``U_causal ≤ U_joint``, and a lossless
    verifier's E[τ] never exceeds ``U_causal``.

    Attributes
    ----------
    causal : float
        U_causal, bound on E[τ] (bonus excluded).
    joint : float
        U_joint.

    References
    ----------
    Sun et al., "Block verification accelerates speculative decoding", arXiv 2403.10444; Sun et al.,
    "SpecTr", arXiv 2310.15141.

    Examples
    --------
    Sun et al.'s toy (2403.10444): U_causal = 11/9, U_joint = 12/9.

    >>> from otbound import BLOCK_VERIFIERS, context_free_model
    >>> p, q = context_free_model([1 / 3, 2 / 3]), context_free_model([2 / 3, 1 / 3])
    >>> b = BLOCK_VERIFIERS["block"].own_law_bounds(p, q, vocab_size=2, num_drafts=1, block_len=2)
    >>> round(9 * b.causal, 9), round(9 * b.joint, 9)
    (11.0, 12.0)
    """

    causal: float
    joint: float


class BlockVerifier(ABC):
    """Base class of the block verifiers: subclasses define ``prepare`` and ``walk`` (see the module
    docstring) and set ``name``, ``reference`` and ``lossless``, the attributes the token verifiers
    (:class:`otbound.token.verifiers.Verifier`) carry too.

    Attributes
    ----------
    name : str
        The registry name (:data:`otbound.BLOCK_VERIFIERS`).
    reference : str
        The algorithm and the paper it comes from.
    lossless : bool
        Declared by every verifier: whether one iteration's emitted sequence, continued by the
        target, has the target's law (:meth:`lossless_error` is 0; tested exactly). ``spectr_gbv``
        and ``hsd`` are published verifiers found lossy, kept with ``lossless = False``.
    sampling : str
        The draft-tuple law it is run with, the block layer's ``sampling=`` (as a token verifier's):
        ``"with_replacement"`` = K i.i.d. blocks, the law of :func:`otbound.block_bound`; a verifier
        with its own drafting scheme (``univer``: ``"univer_tree"``) names it and overrides the
        drafting methods.

    Examples
    --------
    Every registered verifier on Sun et al.'s toy (2403.10444: p = (1/3, 2/3), q = (2/3, 1/3) at
    every prefix; K = 2, L = 2): 9·E[τ], 9·U_causal of its own draft-tuple law (:meth:`own_law_bounds`),
    the declaration ``lossless`` and the exact :meth:`lossless_error`.

    >>> import otbound as ob
    >>> t, d = ob.context_free_model([1 / 3, 2 / 3]), ob.context_free_model([2 / 3, 1 / 3])
    >>> kw = dict(vocab_size=2, num_drafts=2, block_len=2)
    >>> for name, v in ob.BLOCK_VERIFIERS.items():
    ...     tau, own = 9 * v.acceptance(t, d, **kw), 9 * v.own_law_bounds(t, d, **kw).causal
    ...     print(f"{name:15} {tau:9.6f} {own:9.6f}  {v.lossless!s:5}  {v.lossless_error(t, d, **kw):.6f}")
    token           10.000000 14.555556  True   0.000000
    block           11.000000 14.555556  True   0.000000
    multipath_rrs   12.000000 14.555556  True   0.000000
    multipath_kseq  12.649379 14.555556  True   0.000000
    traversal       12.666667 14.555556  True   0.000000
    spectr_gbv      12.630919 14.555556  False  0.042091
    causal_optimal  14.555556 14.555556  True   0.000000
    hsd             12.000000 14.555556  False  0.074074
    univer          18.000000 18.000000  True   0.000000
    static_tree     18.000000 18.000000  True   0.000000
    """

    name: str
    reference: str
    lossless: bool
    sampling: str = "with_replacement"  # K i.i.d. blocks; a drafting scheme of its own overrides the methods below

    # -- to implement -----------------------------------------------------------------------
    @abstractmethod
    def prepare(self, target: BlockModel, draft: BlockModel, drafts: tuple, cache: dict):
        """Everything the walk needs from the models and one draft tuple (``K`` blocks of token ids);
        ``cache`` is shared by the tuples of one call."""

    @abstractmethod
    def walk(self, inst, coin, draw):
        """One iteration on a prepared tuple: ``(accepted draft prefix, law of the next token)``, every
        random decision taken through ``coin(prob)`` / ``draw(law)``."""

    # -- exact ---------------------------------------------------------------------------------
    def _outcomes(self, inst):
        """All ``(probability, accepted_prefix, correction_law)`` of one draft tuple."""
        branches = enumerate_outcomes(lambda coin, draw: self.walk(inst, coin, draw), max_branches=None, checked=False)
        return [(w, prefix, law) for w, (prefix, law) in branches]

    def conditional_law(self, target, draft, drafts) -> dict:
        """Exact law ``{emitted sequence: probability}`` of one iteration given a ``(K, L)`` draft tuple
        (the block counterpart of the token verifiers' ``conditional_law``).

        Examples
        --------
        >>> from otbound import BLOCK_VERIFIERS, context_free_model
        >>> p, q = context_free_model([1 / 3, 2 / 3]), context_free_model([2 / 3, 1 / 3])
        >>> law = BLOCK_VERIFIERS["token"].conditional_law(p, q, [[1, 1]])  # p/q = 2 on token 1: accepted
        >>> {seq: round(pr, 12) for seq, pr in sorted(law.items())}
        {(1, 1, 0): 0.333333333333, (1, 1, 1): 0.666666666667}
        """
        batch, single = _check_drafts(drafts, _vocab(target))
        if not single:
            raise InvalidInputError(f"conditional_law takes one draft tuple of shape (K, L), got {batch.shape}")
        target, draft = _models(target, draft)
        tup = _draftable(draft, tuple(tuple(int(t) for t in row) for row in batch[0]))
        return _emitted_law(self._outcomes(self.prepare(target, draft, tup, {})))

    def iteration_law(self, target, draft, *, vocab_size, num_drafts, block_len) -> dict:
        """Exact law of the emitted sequence of one iteration, drafts drawn from the draft model."""
        law = {}
        for prob, outcomes in self._all_tuples(target, draft, vocab_size, num_drafts, block_len):
            for seq, pr in _emitted_law(outcomes).items():
                law[seq] = law.get(seq, 0.0) + prob * pr
        return law

    def lossless_error(self, target, draft, *, vocab_size, num_drafts, block_len) -> float:
        """Exact ``max_v |P(output continued by p = v) − p(v)|`` over ``v ∈ V^{L+1}`` (0 iff lossless).

        One iteration's emitted sequence, continued by sampling the target, must be distributed as
        the target (docs/theory/block-bounds.md); float64 round-off leaves ~1e-16. The token verifiers'
        ``lossless_error`` is the same quantity at L = 1.

        Examples
        --------
        >>> from otbound import BLOCK_VERIFIERS, context_free_model
        >>> p, q = context_free_model([1 / 3, 2 / 3]), context_free_model([2 / 3, 1 / 3])
        >>> kw = dict(vocab_size=2, num_drafts=1, block_len=2)
        >>> BLOCK_VERIFIERS["block"].lossless_error(p, q, **kw) < 1e-15
        True
        >>> round(BLOCK_VERIFIERS["hsd"].lossless_error(p, q, **kw), 12)  # 2/27: found lossy
        0.074074074074
        """
        target, draft = _models(target, draft, vocab_size)
        length = check_positive_int(block_len, "block_len")
        v = target.vocab_size
        law = self.iteration_law(target, draft, vocab_size=v, num_drafts=num_drafts, block_len=length)
        full = np.zeros(v ** (length + 1))
        for seq, prob in law.items():
            rest = length + 1 - len(seq)
            start = int(np.ravel_multi_index(seq, (v,) * len(seq))) * v**rest
            full[start : start + v**rest] += prob * prefix_law(shifted_model(target, seq), rest).ravel()
        return float(np.abs(full - prefix_law(target, length + 1).ravel()).max())

    def acceptance(self, target, draft, *, vocab_size, num_drafts, block_len) -> float:
        """Exact ``E[τ]`` (bonus excluded) by enumerating every draft tuple and every decision; at
        L = 1 it is the token verifiers' ``acceptance`` α.

        Examples
        --------
        Sun et al.'s toy (2403.10444): token-level verification 10/9, block verification 11/9.

        >>> from otbound import BLOCK_VERIFIERS, context_free_model
        >>> p, q = context_free_model([1 / 3, 2 / 3]), context_free_model([2 / 3, 1 / 3])
        >>> kw = dict(vocab_size=2, num_drafts=1, block_len=2)
        >>> [round(9 * BLOCK_VERIFIERS[n].acceptance(p, q, **kw), 12) for n in ("token", "block")]
        [10.0, 11.0]
        """
        total = 0.0
        for prob, outcomes in self._all_tuples(target, draft, vocab_size, num_drafts, block_len):
            total += prob * sum(w * len(prefix) for w, prefix, _ in outcomes)
        return total

    def conditional_acceptance(self, target, draft, drafts) -> np.ndarray:
        """Exact ``E[τ | drafts]`` (bonus excluded) for each ``(K, L)`` tuple of ``drafts``
        (``(n, K, L)``; a single ``(K, L)`` tuple gives a scalar), over the verifier's own randomness.

        Its mean over tuples drawn from the draft model is an unbiased, Rao-Blackwellised estimate
        of :meth:`acceptance` that only queries the models along the drawn tuples — the way
        to measure a verifier on a real language model, whose ``V^{KL}`` tuples cannot be
        enumerated.

        Examples
        --------
        >>> from otbound import BLOCK_VERIFIERS, context_free_model
        >>> p, q = context_free_model([1 / 3, 2 / 3]), context_free_model([2 / 3, 1 / 3])
        >>> float(BLOCK_VERIFIERS["token"].conditional_acceptance(p, q, [[1, 1]]))  # both tokens accepted
        2.0
        """
        batch, single = _check_drafts(drafts, _vocab(target))
        target, draft = _models(target, draft)
        n, k, length = batch.shape
        keys, inverse = np.unique(batch.reshape(n, -1), axis=0, return_inverse=True)
        cache: dict = {}
        values = np.empty(keys.shape[0])
        for g, key in enumerate(keys):
            tup = _draftable(draft, tuple(tuple(int(t) for t in row) for row in key.reshape(k, length)))
            values[g] = self._conditional_value(self.prepare(target, draft, tup, cache))
        out = values[inverse.reshape(-1)]
        return out[0] if single else out

    def _conditional_value(self, inst) -> float:
        """``E[τ | drafts]`` of one prepared tuple; by default from every outcome of :meth:`walk`."""
        return sum(w * len(prefix) for w, prefix, _ in self._outcomes(inst))

    def _all_tuples(self, target, draft, vocab_size, num_drafts, block_len):
        target, draft = _models(target, draft, vocab_size)
        k = check_num_drafts(num_drafts)
        length = check_positive_int(block_len, "block_len")
        cache: dict = {}
        for prob, drafts in self.draft_tuple_law(draft, k, length):
            yield prob, self._outcomes(self.prepare(target, draft, drafts, cache))

    # -- the drafting scheme (K i.i.d. blocks; a verifier with its own scheme overrides these) ----
    def draft_tuple_law(self, draft, num_drafts: int, block_len: int):
        """Every draft tuple (a tuple of K blocks) with its probability, as ``(prob, drafts)``."""
        k, length, v = num_drafts, block_len, draft.vocab_size
        if v**length > MAX_EXACT_TUPLES:  # estimate before building the V^L prefix law
            raise InvalidInputError(
                f"exact enumeration would tabulate V^L = {v}^{length} draft blocks (limit "
                f"otbound.block.verifiers._base.MAX_EXACT_TUPLES = {MAX_EXACT_TUPLES}; raise it to go further): "
                "too many; estimate with sample() instead"
            )
        law = prefix_law(draft, length)
        blocks = [(pre, float(law[pre])) for pre in np.ndindex(law.shape) if law[pre] > 0]
        if len(blocks) ** k > MAX_EXACT_TUPLES:
            raise InvalidInputError(
                f"exact enumeration needs {len(blocks)}^{k} draft tuples (V = {v}, L = {length}; limit "
                f"otbound.block.verifiers._base.MAX_EXACT_TUPLES = {MAX_EXACT_TUPLES}, raise it to go further): "
                "too many; estimate with sample() instead"
            )
        for combo in itertools.product(blocks, repeat=k):
            yield float(np.prod([c[1] for c in combo])), tuple(c[0] for c in combo)

    def draw_drafts(self, draft, num: int, num_drafts: int, block_len: int, rng) -> np.ndarray:
        """``num`` draft tuples ``(num, K, L)`` drawn from the draft model (K i.i.d. blocks each)."""
        return sample_blocks(draft, num * num_drafts, block_len, rng).reshape(num, num_drafts, block_len)

    def num_rows(self, num_drafts: int, block_len: int) -> int:
        """Rows (root-to-leaf draft paths) of one draft tuple: K."""
        return num_drafts

    def node_drafts(self, law: np.ndarray, num_rows: int, num_drafts: int, rng) -> np.ndarray:
        """Next tokens of the ``num_rows`` draft rows through one node of draft law ``law``, in row
        order — how a decoder that drafts depth by depth (:func:`otbound.lm.speculative_sample`)
        builds this verifier's draft tuple: i.i.d. draws of ``law``."""
        return sample_drafts(law, num_rows, "with_replacement", 1, rng)[0]

    def own_law_bounds(self, target, draft, *, vocab_size, num_drafts, block_len) -> DraftLawBounds:
        """U_causal and U_joint of this verifier's draft-tuple law (K i.i.d. blocks:
        :func:`otbound.block_bound`); a lossless verifier's ``E[τ]`` never exceeds the causal one."""

        kw = dict(vocab_size=vocab_size, num_drafts=num_drafts, block_len=block_len)
        return DraftLawBounds(
            block_bound(target, draft, kind="causal", **kw).value, block_bound(target, draft, kind="joint", **kw).value
        )

    # -- sampling ------------------------------------------------------------------------------
    def sample(self, target, draft, drafts, rng=None) -> BlockSample:
        """One iteration for every row of ``drafts`` (``(K, L)`` or ``(n, K, L)`` token ids)."""
        rng = np.random.default_rng(rng)
        target, draft = _models(target, draft)
        batch, single = _check_drafts(drafts, target.vocab_size)
        n, k, length = batch.shape
        tokens = np.full((n, length + 1), -1, dtype=np.int64)
        accepted = np.zeros(n, dtype=np.int64)
        keys, inverse = np.unique(batch.reshape(n, -1), axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        cache: dict = {}
        order = np.argsort(inverse, kind="stable")  # rows grouped by draft tuple in one sort
        for g, rows in enumerate(np.split(order, np.cumsum(np.bincount(inverse, minlength=keys.shape[0]))[:-1])):
            tup = _draftable(draft, tuple(tuple(int(t) for t in row) for row in keys[g].reshape(k, length)))
            inst = self.prepare(target, draft, tup, cache)
            self._sample_group(inst, rows, tokens, accepted, rng)
        if single:
            return BlockSample(tokens[0], accepted[0])
        return BlockSample(tokens, accepted)

    def _sample_group(self, inst, rows, tokens, accepted, rng):
        """Walk once per row; write the accepted prefix and draw corrections law by law."""
        choices = _RandomChoices(rng)
        laws: dict = {}
        for r in rows.tolist():
            prefix, law = self.walk(inst, choices.coin, choices.draw)
            n_acc = len(prefix)
            tokens[r, :n_acc] = prefix
            accepted[r] = n_acc
            laws.setdefault(id(law), (law, []))[1].append(r)
        for law, members in laws.values():
            members = np.asarray(members)
            tokens[members, accepted[members]] = inverse_cdf(law, rng.random(members.size))


def _vocab(model) -> int:
    if isinstance(model, BlockModel):
        return model.vocab_size
    raise InvalidInputError("pass the target as a BlockModel (or give vocab_size to the exact methods)")


def _models(target, draft, vocab_size=None):
    v = vocab_size if vocab_size is not None else _vocab(target)
    return as_block_model(target, v, "target"), as_block_model(draft, v, "draft")


def _check_drafts(drafts, vocab_size: int):
    a = np.asarray(drafts)
    if a.ndim not in (2, 3) or a.size == 0:
        raise InvalidInputError(f"drafts must have shape (K, L) or (n, K, L), got {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        raise InvalidInputError(f"drafts must be integer token ids, got dtype {a.dtype}")
    if a.min() < 0 or a.max() >= vocab_size:
        raise InvalidInputError(f"drafts contain a token outside the vocabulary 0..{vocab_size - 1}")
    single = a.ndim == 2
    return (a[None] if single else a).astype(np.int64), single


def _draftable(draft: BlockModel, drafts: tuple) -> tuple:
    """``drafts`` itself, after checking every block has positive probability under the draft model."""
    for row in drafts:
        for i, tok in enumerate(row):
            if draft(row[:i])[tok] <= 0:
                raise InvalidInputError(
                    f"draft block {list(row)} has draft probability 0 at position {i}: it cannot be drafted"
                )
    return drafts


def _emitted_law(outcomes) -> dict:
    law: dict = {}
    for w, prefix, corr in outcomes:
        for y in np.flatnonzero(corr > 0).tolist():
            seq = tuple(prefix) + (y,)
            law[seq] = law.get(seq, 0.0) + w * float(corr[y])
    return law


def generate(
    verifier: BlockVerifier, target, draft, *, num_drafts: int, block_len: int, length: int, num_samples: int, rng=None
) -> np.ndarray:
    """Iterate ``verifier`` from an empty context until ``length`` tokens; returns ``(num_samples, length)``.

    Each iteration draws a draft tuple (``verifier.draw_drafts``: K i.i.d. draft blocks, or the
    verifier's own drafting scheme) from the draft model continuing the tokens emitted so far
    (samples sharing a context share one batch of model calls). The output is the sequence a
    user sees: its law must be the target's (sequence-level losslessness).

    Parameters
    ----------
    verifier : BlockVerifier
        The verifier (e.g. a value of :data:`otbound.BLOCK_VERIFIERS`).
    target, draft : BlockModel or callable
        The models (prefix → next-token law).
    num_drafts : int
        K, draft blocks per iteration.
    block_len : int
        L, tokens per draft block.
    length : int
        Tokens to generate per sample.
    num_samples : int
        Independent sequences.
    rng : numpy Generator, seed or None

    Returns
    -------
    numpy.ndarray
        int64 ``(num_samples, length)``, the generated sequences.

    Raises
    ------
    InvalidInputError
        A non-positive ``num_drafts`` or ``block_len``, or models that return no law.

    References
    ----------
    Sun et al., "Block verification accelerates speculative decoding", arXiv 2403.10444.

    Examples
    --------
    The sequences have the target's law: token 1 with probability 2/3 at every position (10,000
    sequences, 50,000 tokens: the standard error of the frequency is 0.002).

    >>> import otbound as ob
    >>> from otbound.block.verifiers import generate
    >>> p, q = ob.context_free_model([1 / 3, 2 / 3]), ob.context_free_model([2 / 3, 1 / 3])
    >>> out = generate(ob.BLOCK_VERIFIERS["block"], p, q, num_drafts=1, block_len=2, length=5,
    ...                num_samples=10_000, rng=0)
    >>> out.shape, abs(float((out == 1).mean()) - 2 / 3) < 0.01
    ((10000, 5), True)
    """
    rng = np.random.default_rng(rng)
    target, draft = _models(target, draft)
    k = check_num_drafts(num_drafts)
    blen = check_positive_int(block_len, "block_len")
    n, total = int(num_samples), int(length)
    out = np.full((n, total + blen + 1), -1, dtype=np.int64)
    filled = np.zeros(n, dtype=np.int64)
    while True:
        active = np.flatnonzero(filled < total)
        if active.size == 0:
            return out[:, :total]
        contexts: dict = {}
        for r in active.tolist():
            contexts.setdefault(tuple(out[r, : filled[r]].tolist()), []).append(r)
        for ctx, rows in contexts.items():
            rows = np.asarray(rows)
            tgt, drf = shifted_model(target, ctx), shifted_model(draft, ctx)
            blocks = verifier.draw_drafts(drf, rows.size, k, blen, rng)
            res = verifier.sample(tgt, drf, blocks, rng)
            for i, r in enumerate(rows.tolist()):
                m = int(res.num_accepted[i]) + 1
                out[r, filled[r] : filled[r] + m] = res.tokens[i, :m]
                filled[r] += m
