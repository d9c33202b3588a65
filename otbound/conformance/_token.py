"""Token-level conformance check (implementation of :func:`check_token_verifier`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from otbound import InvalidInputError, draft_law, optimal_acceptance, sample_drafts
from otbound._validation import as_pair, check_positive_int
from otbound.conformance._common import as_token_id, check_args, frozen, run_check
from otbound.conformance._instances import TokenInstance, check_instance_count, shrink_token, token_instances
from otbound.conformance._result import (
    MAX_ROWS,
    ConformanceResult,
    Counterexample,
    InstanceReport,
)
from otbound.conformance._stats import degrees_of_freedom, g_test
from otbound.conformance._tree import MAX_BRANCHES, ConformanceError, enumerate_outcomes
from otbound.token.verifiers import support_tuples

#: exact mode enumerates at most this many draft tuples per instance
MAX_TUPLES = 50_000


def check_token_verifier(
    verify,
    *,
    vocab_size: int,
    num_drafts: int,
    sampling: str = "with_replacement",
    instances: int | Sequence = 24,
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
) -> ConformanceResult:
    """Check a token-level multi-draft verifier for losslessness and measure α against α*.

    A verifier maps a target law ``p``, a draft law ``q`` (float64 arrays (V,)) and a draft tuple
    ``drafts`` (int array (K,), drawn from the draft law ``sampling``) to one emitted token ``Y``.
    It is lossless iff ``Σ_x̄ Q(x̄) P(Y = · | x̄) = p`` (docs/theory/token-verifiers.md); its acceptance is
    ``α = P(Y ∈ x̄)``, at most ``α*`` = :func:`otbound.optimal_acceptance` (p, q, K, sampling) when lossless.

    **mode="exact"**: ``verify(p, q, drafts, coin, draw) -> token``, all randomness through
    ``coin(prob) -> bool`` and ``draw(law) -> int``. Every draft tuple with ``Q(x̄) > 0`` is
    enumerated with its probability (:func:`otbound.draft_joint`) and every branch of the verifier's
    choice tree with its probability, so the output law is exact: an instance passes when
    ``max |law − p| ≤ tolerance``. ``tolerance`` defaults by ``precision``: "float64" 1e-10 (float64
    round-off is ~1e-15), "float32" 1e-6 (≈ 8 float32 ulps of 1, for verifiers computing in float32
    as engines do); give one of the two. A failure whose every error is within float32 rounding is
    reported as such (``ConformanceResult.within_float32_rounding``). A failing instance is
    shrunk (fewer tokens, smaller K) to the ``counterexample``.

    **mode="sample"**: ``verify(p, q, drafts, rng) -> token`` (a black box; ``rng`` a numpy
    Generator), or with ``batch=True`` ``verify(p, q, drafts (n, K), rng) -> tokens (n,)``.
    Per instance ``n`` draft tuples are drawn, verified, and the histogram of ``Y`` is G-tested
    against ``p`` at level ``level / #instances`` (Bonferroni: the chance that a lossless verifier
    fails the run is ≤ ``level``, default 1e-3). ``n`` is the smallest size whose power against
    *any* distortion of total-variation size ``distortion`` (default 0.01) is ≥ ``power`` (default
    0.99), from the noncentral chi-square (``λ ≥ 4nδ²``, :mod:`otbound.conformance._stats`); the power
    actually reached is reported per instance (``InstanceReport.power``, ``ConformanceResult.power``).
    For example V = 3 (2 degrees of freedom), 24 instances: n = 113,123 per instance, power 0.9900;
    V = 4: n = 120,478. No shrinking in this mode (statistical failures). An instance passes exactly
    when its p-value is ≥ ``level / #instances``. ``InstanceReport.acceptance_se`` is the standard
    error of the estimated α (efficiency intervals in the summary).

    Options of the other mode are refused, not ignored: ``tolerance`` / ``precision`` are exact-mode
    options; ``batch``, ``level``, ``distortion``, ``power``, ``samples`` sample-mode ones.

    ``instances``: a count (the adversarial family of :mod:`._instances` first, then random
    Dirichlet laws from ``seed``) or a sequence of :class:`TokenInstance` / ``(p, q)`` pairs.
    Returns a :class:`ConformanceResult`. Raises :class:`ConformanceError` when the verifier breaks
    the contract (a bad probability or law, an output that is not a token id, nondeterminism given
    coin/draw, more than ``max_branches`` branches for one tuple).

    Parameters
    ----------
    verify : callable
        The verifier (signature by ``mode``, above).
    vocab_size : int
        V.
    num_drafts : int
        K.
    sampling : str
        The draft law: a name of :data:`otbound.DRAFT_LAWS` (an unknown name is an InvalidInputError).
    instances : int or sequence
        A count, or :class:`otbound.conformance.TokenInstance` / ``(p, q)`` pairs.
    seed : int
        Seed of the random instances (and of sample mode's draws).
    mode : {"exact", "sample"}
    tolerance : float, optional
        Exact mode: largest lossless error that passes (default by ``precision``).
    precision : {"float64", "float32"}
        Exact mode: the default tolerance (1e-10 / 1e-6).
    batch : bool
        Sample mode: the verifier takes a batch of draft rows.
    level : float, optional
        Sample mode: chance of failing a lossless verifier (default 1e-3, Bonferroni over instances).
    distortion : float, optional
        Sample mode: total-variation size to detect (default 0.01).
    power : float, optional
        Sample mode: power to reach against it (default 0.99).
    samples : int, optional
        Sample mode: samples per instance instead of the size reaching ``power``.
    max_branches : int
        Exact mode: most branches of the verifier's choice tree per draft tuple.
    shrink : bool
        Exact mode: shrink a failing instance to the counterexample.
    name : str, optional
        The verifier's name in the reports (default its qualified name).

    Returns
    -------
    ConformanceResult

    Raises
    ------
    otbound.conformance.ConformanceError
        The verifier broke the contract.
    otbound.InvalidInputError
        Bad arguments (e.g. an option of the other mode, a vocabulary too large for the mode).

    References
    ----------
    Miao et al., SpecInfer (arXiv:2305.09781) — recursive rejection sampling; Sun et al., SpecTr
    (arXiv:2310.15141) — the optimal acceptance α* as an optimal-transport problem.

    Examples
    --------
    SpecInfer's RRS, written against ``coin`` / ``draw``, is lossless; skipping repeated drafts is not:

    >>> from otbound import VERIFIERS
    >>> from otbound.conformance import check_token_verifier, token_sample_adapter
    >>> from otbound.conformance.examples import rrs, rrs_skip_repeats
    >>> res = check_token_verifier(rrs, vocab_size=3, num_drafts=2, instances=4)
    >>> res.passed, res.lossless_error < 1e-10, round(float(res.efficiency.min()), 4)
    (True, True, 0.9367)
    >>> bad = check_token_verifier(rrs_skip_repeats, vocab_size=3, num_drafts=2, instances=9)
    >>> bad.passed, bad.counterexample.vocab_size, bad.counterexample.num_drafts
    (False, 3, 2)

    Sample mode, the package's batched sampler (few samples: low power, stated in the result):

    >>> res = check_token_verifier(token_sample_adapter(VERIFIERS["rrs"]), vocab_size=2, num_drafts=2,
    ...                            instances=1, mode="sample", batch=True, samples=1000)
    >>> res.mode, res.instances[0].samples, res.power < 0.99
    ('sample', 1000, True)
    """
    args = check_args(
        verify, name, vocab_size, num_drafts, mode, tolerance=tolerance, precision=precision, batch=batch, level=level,
        distortion=distortion, power=power, samples=samples,
    )  # fmt: skip
    v, k = args.vocab_size, args.num_drafts
    sampling = draft_law(sampling).name
    _check_size(v, k, sampling, args.mode, instances)
    insts = _token_list(instances, v, k, sampling, seed)
    return run_check(
        args, "token", sampling, insts, seed,
        exact_report=lambda t: _exact_report(verify, t, k, sampling, args.tolerance, max_branches),
        exact_error=lambda t, kk: _exact_law(verify, t, kk, sampling, max_branches)[0],
        shrink=(lambda t, kk, fails: shrink_token(t, kk, sampling, fails)) if shrink else None,
        counterexample=lambda t, kk: _counterexample(verify, t, kk, sampling, max_branches),
        sample_report=lambda t, plan, rng: _sample_report(verify, t, k, sampling, plan, batch, rng),
        sample_counterexample=lambda t, rep, law: Counterexample(
            level="token", vocab_size=v, num_drafts=k, sampling=sampling, lossless_error=rep.lossless_error,
            target=t.p, draft=t.q, output_law=law, target_law=t.p, worst=int(np.argmax(np.abs(law - t.p))),
            label=t.label,
        ),
    )  # fmt: skip


#: sample mode draws laws over at most this many tokens (a G-test over more cells needs more
#: samples than a check can draw)
MAX_SAMPLE_VOCAB = 1 << 16


def _check_size(v: int, k: int, sampling: str, mode: str, instances) -> None:
    """Refuse at once, before any law is allocated, a request no instance can satisfy or exact mode
    cannot enumerate: K > V without replacement / greedy (K distinct drafted tokens), more draft
    tuples than :data:`MAX_TUPLES` (``V^K`` with replacement, ``V!/(V−K)!`` without, ``V − K + 1``
    greedy), a vocabulary above :data:`MAX_SAMPLE_VOCAB` in sample mode, more than
    :data:`~otbound.conformance._instances.MAX_INSTANCES` instances."""
    law = draft_law(sampling)
    if law.distinct and k > v:
        raise InvalidInputError(f"num_drafts={k} > vocab_size={v}: the {sampling} law drafts K distinct tokens")
    if isinstance(instances, (int, np.integer)) and not isinstance(instances, bool):
        check_instance_count(instances)
    if mode == "exact":
        count = law.max_tuples(v, k)
        if count > MAX_TUPLES:
            raise InvalidInputError(
                f"exact mode would enumerate up to {count:.3g} draft tuples at V = {v}, K = {k} ({sampling}; limit "
                f"{MAX_TUPLES}); use smaller V or K, or mode='sample'"
            )
    elif v > MAX_SAMPLE_VOCAB:
        raise InvalidInputError(f"sample mode supports vocab_size ≤ {MAX_SAMPLE_VOCAB}, got {v}")


def _token_list(instances, v, k, sampling, seed) -> list[TokenInstance]:
    if isinstance(instances, (int, np.integer)) and not isinstance(instances, bool):
        out = token_instances(v, k, sampling, check_positive_int(instances, "instances"), int(seed))
    else:
        out = []
        for i, t in enumerate(instances):
            if not isinstance(t, TokenInstance):
                p, q = as_pair(*t)
                t = TokenInstance(f"instance {i}", p, q)
            if t.vocab_size != v:
                raise InvalidInputError(f"instance {i} has {t.vocab_size} tokens, expected vocab_size = {v}")
            draft_law(sampling).check_num_drafts(k, t.q)
            out.append(t)
    if not out:
        raise InvalidInputError(f"no instance: the {sampling} law needs K = {k} tokens of positive draft mass")
    return out


def _conditional_laws(verify, inst: TokenInstance, k: int, sampling: str, max_branches: int):
    """``(weights (m,), tuples (m, K), laws (m, V))``: every draft tuple, Q(x̄), exact law of Y given it."""
    v = inst.vocab_size
    weights, tuples = support_tuples(inst.q, k, sampling)
    if len(weights) > MAX_TUPLES:
        raise InvalidInputError(
            f"exact mode would enumerate {len(weights)} draft tuples (> {MAX_TUPLES}); "
            "use smaller V or K, or mode='sample'"
        )
    p, q = frozen(inst.p), frozen(inst.q)
    laws = np.zeros((len(weights), v))
    for i, tup in enumerate(tuples):
        drafts = frozen(tup)
        for prob, y in enumerate_outcomes(
            lambda coin, draw, drafts=drafts: verify(p, q, drafts, coin, draw), max_branches=max_branches, vocab_size=v
        ):
            laws[i, as_token_id(y, v, "the emitted token")] += prob
    return weights, tuples, laws


def _exact_law(verify, inst, k, sampling, max_branches):
    """``(lossless error, output law, acceptance, (weights, tuples, laws))``."""
    weights, tuples, laws = _conditional_laws(verify, inst, k, sampling, max_branches)
    out = weights @ laws
    hit = np.zeros(laws.shape, dtype=bool)
    hit[np.arange(len(tuples))[:, None], tuples] = True
    acceptance = float(weights @ np.where(hit, laws, 0.0).sum(axis=1))
    return float(np.abs(out - inst.p).max()), out, acceptance, (weights, tuples, laws)


def _exact_report(verify, inst, k, sampling, tolerance, max_branches) -> InstanceReport:
    err, out, acc, _ = _exact_law(verify, inst, k, sampling, max_branches)
    opt = float(optimal_acceptance(inst.p, inst.q, k, sampling))
    tv = 0.5 * float(np.abs(out - inst.p).sum())
    return InstanceReport(inst.label, inst.vocab_size, k, err, acc, opt, passed=err <= tolerance, total_variation=tv)


def _counterexample(verify, inst, k, sampling, max_branches) -> Counterexample:
    err, out, _, (weights, tuples, laws) = _exact_law(verify, inst, k, sampling, max_branches)
    rows = [(tuple(int(x) for x in t), float(w), law) for w, t, law in zip(weights, tuples, laws, strict=True)][
        :MAX_ROWS
    ]
    worst = int(np.argmax(np.abs(out - inst.p)))
    return Counterexample(
        "token", inst.vocab_size, k, sampling, err, inst.p, inst.q, out, inst.p, worst, drafts=rows, label=inst.label
    )


def _sample_report(verify, inst, k, sampling, plan, batch, rng):
    v = inst.vocab_size
    n, pw = plan.size_and_power(degrees_of_freedom(inst.p))
    drafts = sample_drafts(inst.q, k, sampling, n, rng)
    p, q = frozen(inst.p), frozen(inst.q)
    if batch:
        tokens = np.asarray(verify(p, q, frozen(drafts), rng))
        if tokens.shape != (n,) or not np.issubdtype(tokens.dtype, np.integer):
            raise ConformanceError(
                f"a batched verifier must return an integer array of shape ({n},), got {tokens.dtype} {tokens.shape}"
            )
        if tokens.min() < 0 or tokens.max() >= v:
            raise ConformanceError(f"the verifier returned a token outside the vocabulary 0..{v - 1}")
    else:
        tokens = np.fromiter(
            (as_token_id(verify(p, q, drafts[i], rng), v, "the emitted token") for i in range(n)), np.int64, n
        )
    counts = np.bincount(tokens, minlength=v)
    _, pval = g_test(counts, inst.p)
    law = counts / n
    acc = float((tokens[:, None] == drafts).any(axis=1).mean())
    opt = float(optimal_acceptance(inst.p, inst.q, k, sampling))
    rep = InstanceReport(
        inst.label, v, k, float(np.abs(law - inst.p).max()), acc, opt, passed=pval >= plan.per_instance_level,
        total_variation=0.5 * float(np.abs(law - inst.p).sum()), samples=n, p_value=pval, power=pw,
        acceptance_se=float(np.sqrt(acc * (1.0 - acc) / n)),
    )  # fmt: skip
    return rep, law
