"""otbound: optimal-transport acceptance bounds and lossless verifiers for speculative decoding.

Token level (docs/theory/token-bounds.md and token-verifiers.md, :mod:`otbound.token`):
:func:`optimal_acceptance` (dual / prefix form, any batch, numpy or torch),
:func:`optimal_acceptance_lp` (primal LP with plan and :class:`LPDual`), the draft laws, and the
verifiers in :data:`VERIFIERS`. Block level (docs/theory/block-bounds.md, :mod:`otbound.block`):
:func:`block_bound` (typed certificates) and :data:`BLOCK_VERIFIERS`. Every verifier of either
layer declares ``lossless``, ``reference`` and ``sampling``. Sampling settings:
:class:`SamplingParams`. Drafter objectives (:mod:`otbound.objectives`, torch; imported on first
use). Language models (:mod:`otbound.lm`), the report (:mod:`otbound.report`), the planner
(:mod:`otbound.plan`) and the conformance kit (:mod:`otbound.conformance`) are imported explicitly.
Stored artefacts: :func:`write_text_atomic` (an atomic write) and :func:`content_key` (the
SHA-256 of a configuration, the key of every cache). LP solves: :func:`lp_time_limit`.
``import otbound`` does not import torch.
"""

from otbound._backend import retain_freed_memory
from otbound._integrity import content_key
from otbound._io import write_text_atomic
from otbound._solvers import lp_time_limit
from otbound._validation import LAW_ATOL, InvalidInputError
from otbound.block.bounds import (
    BlockBound,
    BlockBracket,
    JointPlanCertificate,
    PerLevelCertificate,
    SelectionCertificate,
    block_bound,
    block_bound_bracket,
)
from otbound.block.models import (
    BlockModel,
    context_free_model,
    dirichlet_model,
    mixture_model,
    prefix_law,
    sample_blocks,
    sequence_probability,
    shifted_model,
    tabulated_model,
    zipf_model,
)
from otbound.block.verifiers import BLOCK_VERIFIERS, BlockSample
from otbound.token import (
    DraftTemperature,
    SamplingParams,
    best_draft_temperature,
    draft_temperature_curve,
    drafts_for_certain_acceptance,
    optimal_acceptance_limit,
)
from otbound.token.bounds import (
    LPDual,
    TokenBound,
    optimal_acceptance,
    optimal_acceptance_brute_force,
    optimal_acceptance_lp,
    relaxation_bounds,
)
from otbound.token.draft_laws import (
    DRAFT_LAWS,
    SAMPLINGS,
    DraftLaw,
    draft_joint,
    draft_law,
    greedy_split,
    sample_drafts,
    subset_mass,
)
from otbound.token.logits import laws_from_logits
from otbound.token.verifiers import VERIFIERS, Verifier, VerifierRun, VerifierSample

#: the drafter objectives need torch: imported on first use so that ``import otbound`` does not
_OBJECTIVES = {"objectives": None, "DrafterObjective": "DrafterObjective",
               "expected_accepted_length": "expected_accepted_length"}


def __getattr__(name):
    if name in _OBJECTIVES:
        import importlib

        module = importlib.import_module("otbound.objectives")
        return module if _OBJECTIVES[name] is None else getattr(module, _OBJECTIVES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "BLOCK_VERIFIERS",
    "DRAFT_LAWS",
    "DraftLaw",
    "LAW_ATOL",
    "SAMPLINGS",
    "VERIFIERS",
    "BlockBound",
    "BlockBracket",
    "BlockModel",
    "BlockSample",
    "DrafterObjective",
    "InvalidInputError",
    "JointPlanCertificate",
    "LPDual",
    "PerLevelCertificate",
    "SamplingParams",
    "SelectionCertificate",
    "TokenBound",
    "Verifier",
    "VerifierRun",
    "VerifierSample",
    "block_bound",
    "block_bound_bracket",
    "content_key",
    "context_free_model",
    "dirichlet_model",
    "draft_joint",
    "draft_law",
    "expected_accepted_length",
    "greedy_split",
    "laws_from_logits",
    "lp_time_limit",
    "mixture_model",
    "objectives",
    "optimal_acceptance",
    "best_draft_temperature",
    "draft_temperature_curve",
    "DraftTemperature",
    "drafts_for_certain_acceptance",
    "optimal_acceptance_limit",
    "optimal_acceptance_brute_force",
    "optimal_acceptance_lp",
    "prefix_law",
    "relaxation_bounds",
    "retain_freed_memory",
    "sample_blocks",
    "sample_drafts",
    "sequence_probability",
    "shifted_model",
    "subset_mass",
    "tabulated_model",
    "write_text_atomic",
    "zipf_model",
]
