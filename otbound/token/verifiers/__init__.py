"""Token-level multi-draft verifiers (docs/theory/token-verifiers.md), each with its exact
conditional law.

:data:`VERIFIERS` maps a name to a ready verifier object; every verifier declares ``lossless``
(tested: ``Σ_x̄ Q(x̄) law(·|x̄) = p`` exactly, :meth:`Verifier.lossless_error`) and ``reference``:

ot_wor            without_replacement yes      per (p, q, K) the better of ot_wor_top and ot_wor_iid
================= =================== ======== ==============================================
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
    BestWithoutReplacementVerifier,
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
        BestWithoutReplacementVerifier(),
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
    "BestWithoutReplacementVerifier",
]
