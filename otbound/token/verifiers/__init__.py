"""Token-level multi-draft verifiers (theory.md §3), each lossless, each with its exact conditional law.

:data:`VERIFIERS` maps a name to a ready verifier object:

========== =================== ==============================================================
name       draft law           algorithm
========== =================== ==============================================================
nss        with_replacement    naive: Y ~ p, accepted iff Y ∈ x̄
rrs        with_replacement    SpecInfer recursive rejection sampling (2305.09781)
rrs_wor    without_replacement RRS without replacement (Jeon et al. 2402.14160)
kseq       with_replacement    SpecTr K-SEQ at ρ* (2310.15141)
spechub    greedy (K ≤ 2)      SpecHub (2411.05289)
greedy     greedy              greedy-law optimal verifier (theory.md §3), α = α*_greedy
khisti_is  with_replacement    IS draft selection + speculative sampling (2410.18234)
khisti_lp  with_replacement    the same with LP-optimal selection weights, K ≤ 2 (2410.18234)
ot         with_replacement    sample from the LP-optimal plan π*(·|x̄), α = α* (small V)
ot_fast    with_replacement    an optimal coupling sampled per tuple without the plan, α = α* (any V)
ot_wor_top without_replacement the optimum seen through the top-m tokens of q, exact residual
                               (any V; α = α* when those tokens hold all of q)
ot_wor_iid without_replacement ot_fast on K i.i.d. draws rebuilt from the drafts, α ≥ α* with
                               replacement (any V; exact acceptance at K ≤ 2)
ot_wor     without_replacement per (p, q, K) the better of ot_wor_top and ot_wor_iid (any V)
========== =================== ==============================================================

``NaiveVerifier(sampling)`` and ``OTVerifier(sampling)`` build the same verifiers for another draft
law. :func:`run` draws drafts, verifies them and reports the Monte Carlo acceptance with a CI.
"""

from otbound.token.verifiers._base import (
    SequentialVerifier,
    Verifier,
    VerifierRun,
    VerifierSample,
    run,
    support_tuples,
)
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
from otbound.token.verifiers._ot import OTVerifier
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
        OTVerifier(),
        OptimalVerifier(),
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
    "OTVerifier",
    "OptimalVerifier",
    "OptimalCoupling",
    "optimal_coupling",
    "OptimalWithoutReplacementVerifier",
    "TruncatedCoupling",
    "truncated_coupling",
    "IIDStreamVerifier",
    "BestWithoutReplacementVerifier",
]
