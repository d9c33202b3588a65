"""Token-level multi-draft verifiers (theory.md §3), each with its exact conditional law.

:data:`VERIFIERS` maps a name to a ready verifier object; every verifier declares ``lossless``
(tested: ``Σ_x̄ Q(x̄) law(·|x̄) = p`` exactly, :meth:`Verifier.lossless_error`) and ``reference``:

ot_wor_top        without_replacement yes      the optimum seen through the top-m tokens of q, exact residual
                                               (any V; α = α* when those tokens hold all of q)
ot_wor_iid        without_replacement yes      ot on K i.i.d. draws rebuilt from the drafts, α ≥ α* with
                                               replacement (any V; exact acceptance at K ≤ 2)
================= =================== ======== ==============================================
``NaiveVerifier(sampling)`` and ``OptimalVerifier(sampling)`` build the same verifiers for another
draft law. :func:`run` draws drafts, verifies them and reports the Monte Carlo acceptance with a CI.
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
