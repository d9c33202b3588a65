"""Token-level multi-draft verifiers (docs/theory/token-verifiers.md), each with its exact
conditional law.

:data:`VERIFIERS` maps a name to a ready verifier object; every verifier declares ``lossless``
(tested: ``Σ_x̄ Q(x̄) law(·|x̄) = p`` exactly, :meth:`Verifier.lossless_error`) and ``reference``:

================= =================== ======== =====================================================
name              draft law           lossless algorithm
================= =================== ======== =====================================================
nss               with_replacement    yes      naive: Y ~ p, accepted iff Y ∈ x̄
rrs               with_replacement    yes      SpecInfer recursive rejection sampling (2305.09781)
rrs_wor           without_replacement yes      RRS without replacement (Jeon et al. 2402.14160)
kseq              with_replacement    yes      SpecTr K-SEQ at ρ* (2310.15141)
spechub           greedy (K ≤ 2)      yes      SpecHub (2411.05289)
greedy            greedy              yes      greedy-law optimal verifier, α = α*_greedy
khisti_is         with_replacement    yes      IS draft selection + speculative sampling (2410.18234)
khisti_lp         with_replacement    yes      the same with LP-optimal selection weights, K ≤ 2
ot                with_replacement    yes      the optimal verifier, α = α*, at any V
onehot            deterministic       yes      one-hot-q recursive rule (vLLM's argmax drafts)
nss_deterministic deterministic       yes      Y ~ p, accepted iff Y ∈ top-K(q)
ot_wor_top        without_replacement yes      the optimum seen through the top-m tokens of q
ot_wor_iid        without_replacement yes      ot on K i.i.d. draws rebuilt from the drafts
ot_wor            without_replacement yes      per (p, q, K) the better of ot_wor_top and ot_wor_iid
gls               with_replacement    yes      Gumbel-max list sampling, drafter-invariant (2506.05632)
================= =================== ======== =====================================================

A verifier's facts are attributes of its object, read as ``VERIFIERS[name].fact`` and nowhere else:
its draft law (``sampling``, the object ``law``), ``lossless``, its K cap ``max_drafts``, whether
measurements (``in_default_measurement``) and plans (``planned``) include it by default, the planner's
K cap on synthetic laws (``synthetic_max_drafts``), whether it ``attains_optimum`` and where its
acceptance is a Monte Carlo estimate (``monte_carlo``; exact elsewhere).

``ot_wor_top`` has an exact residual and reaches α* when the top-m tokens hold all of q;
``ot_wor_iid`` reaches at least α* with replacement (exact acceptance at K ≤ 2); the deterministic
verifiers reach α* = p(top-K(q)). ``NaiveVerifier(sampling)`` and ``OptimalVerifier(sampling)``
build the same verifiers for another draft law. :func:`run` draws drafts, verifies them and reports
the Monte Carlo acceptance with a CI. ``gls`` (Gumbel-max list sampling) couples i.i.d. drafts
and the target sample through shared exponential clocks: drafter-invariant, exact law closed at K = 1
and a one-dimensional quadrature at K ≥ 2.
"""

import numpy as np

from otbound._validation import InvalidInputError, check_positive_int
from otbound.token.draft_laws import sample_drafts
from otbound.token.verifiers._base import (
    SequentialVerifier,
    Verifier,
    VerifierRun,
    VerifierSample,
    _check_laws,
    residual,
    support_tuples,
    wilson_interval,
)
from otbound.token.verifiers._deterministic import MembershipVerifier, OneHotVerifier
from otbound.token.verifiers._gls import GumbelListVerifier
from otbound.token.verifiers._greedy import GreedyVerifier, SpecHubVerifier
from otbound.token.verifiers._importance import (
    ImportanceSamplingVerifier,
    OptimalImportanceVerifier,
    optimal_selection,
    selected_law,
)
from otbound.token.verifiers._kseq import KSeqVerifier, kseq_rho
from otbound.token.verifiers._nss import NaiveVerifier
from otbound.token.verifiers._optimal import OptimalCoupling, OptimalVerifier, optimal_coupling
from otbound.token.verifiers._optimal_wor import (
    BestWithoutReplacementVerifier,
    IIDStreamVerifier,
    OptimalWithoutReplacementVerifier,
    TruncatedCoupling,
    truncated_coupling,
    truncation_size,
)
from otbound.token.verifiers._rrs import RRSVerifier, RRSWithoutReplacementVerifier

VERIFIERS: dict[str, Verifier] = {
    v.name: v
    for v in (
        NaiveVerifier(),
        RRSVerifier(),
        RRSWithoutReplacementVerifier(),
        KSeqVerifier(),
        SpecHubVerifier(),
        GreedyVerifier(),
        ImportanceSamplingVerifier(),
        OptimalImportanceVerifier(),
        OptimalVerifier(),
        OneHotVerifier(),
        MembershipVerifier(),
        OptimalWithoutReplacementVerifier(),
        IIDStreamVerifier(),
        BestWithoutReplacementVerifier(),
        GumbelListVerifier(),
    )
}


def run(verifier, p, q, num_drafts: int, n: int, rng=None, *, confidence: float = 0.95) -> VerifierRun:
    """Draw ``n`` draft tuples from ``verifier.sampling`` (:func:`otbound.sample_drafts`), verify them,
    and return the sample with the Monte Carlo acceptance and its Wilson score interval.

    Parameters
    ----------
    verifier : Verifier or str
        A verifier or a name in :data:`VERIFIERS`.
    p, q : array_like, shape (V,)
        Target and draft laws.
    num_drafts : int
        K.
    n : int
        Number of draft tuples.
    rng : numpy Generator, seed or None
    confidence : float
        Level of the Wilson interval, in (0, 1).

    Returns
    -------
    VerifierRun

    Raises
    ------
    InvalidInputError
        An unknown verifier, bad laws, K or n.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.token.verifiers import run
    >>> r = run("rrs", np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5]), 2, 1000, rng=0)
    >>> r.num_samples, r.ci_low <= r.acceptance <= r.ci_high
    (1000, True)
    """
    if isinstance(verifier, str):
        if verifier not in VERIFIERS:
            raise InvalidInputError(f"unknown verifier {verifier!r}; expected one of {sorted(VERIFIERS)}")
        verifier = VERIFIERS[verifier]
    if not isinstance(verifier, Verifier):
        raise InvalidInputError(f"verifier must be a Verifier or a registered name, got {verifier!r}")
    n = check_positive_int(n, "n")
    if not 0.0 < confidence < 1.0:
        raise InvalidInputError(f"confidence must lie in (0, 1), got {confidence!r}")
    p, q = _check_laws(p, q)
    k = verifier._check_k(q, num_drafts)
    rng = np.random.default_rng(rng)
    drafts = sample_drafts(q, k, verifier.sampling, int(n), rng)
    s = verifier.sample(p, q, drafts, rng)
    m = float(s.accepted.mean())
    lo, hi = wilson_interval(m, int(n), confidence)
    return VerifierRun(drafts=drafts, sample=s, acceptance=m, ci_low=lo, ci_high=hi, confidence=confidence)


__all__ = [
    "VERIFIERS",
    "Verifier",
    "SequentialVerifier",
    "VerifierSample",
    "VerifierRun",
    "run",
    "support_tuples",
    "residual",
    "NaiveVerifier",
    "RRSVerifier",
    "RRSWithoutReplacementVerifier",
    "KSeqVerifier",
    "kseq_rho",
    "SpecHubVerifier",
    "GreedyVerifier",
    "ImportanceSamplingVerifier",
    "selected_law",
    "OptimalImportanceVerifier",
    "optimal_selection",
    "OptimalVerifier",
    "OptimalCoupling",
    "OneHotVerifier",
    "MembershipVerifier",
    "optimal_coupling",
    "OptimalWithoutReplacementVerifier",
    "TruncatedCoupling",
    "truncated_coupling",
    "truncation_size",
    "IIDStreamVerifier",
    "BestWithoutReplacementVerifier",
    "GumbelListVerifier",
]
