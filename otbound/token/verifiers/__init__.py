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
================= =================== ======== =====================================================

``ot_wor_top`` has an exact residual and reaches α* when the top-m tokens hold all of q;
``ot_wor_iid`` reaches at least α* with replacement (exact acceptance at K ≤ 2); the deterministic
verifiers reach α* = p(top-K(q)). ``NaiveVerifier(sampling)`` and ``OptimalVerifier(sampling)``
build the same verifiers for another draft law. :func:`run` draws drafts, verifies them and reports
the Monte Carlo acceptance with a CI.
"""

from otbound.token.verifiers._base import (
    SequentialVerifier,
    Verifier,
    VerifierRun,
    VerifierSample,
    run,
    support_tuples,
)
from otbound.token.verifiers._deterministic import MembershipVerifier, OneHotVerifier
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
    IIDStreamVerifier,
    OptimalWithoutReplacementVerifier,
    TruncatedCoupling,
    truncated_coupling,
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
    )
}

__all__ = [
    "VERIFIERS",
    "Verifier",
    "SequentialVerifier",
    "VerifierSample",
    "VerifierRun",
    "run",
    "support_tuples",
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
    "IIDStreamVerifier",
]
