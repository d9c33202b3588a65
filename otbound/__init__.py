"""otbound: optimal-transport acceptance bounds and lossless verifiers for speculative decoding.

Token level (theory.md §1-3, :mod:`otbound.token`): :func:`optimal_acceptance` (dual / prefix form,
any batch, numpy or torch), :func:`optimal_acceptance_lp` (primal LP with plan), the draft laws, and
the verifiers in :data:`VERIFIERS`. Block level (§4, :mod:`otbound.block`): :func:`block_bound` and
:data:`BLOCK_VERIFIERS`. Drafter objectives (:mod:`otbound.objectives`, torch; imported on first
use). Language models (:mod:`otbound.lm`) and the report (:mod:`otbound.report`) are imported
explicitly. ``import otbound`` does not import torch.
"""

from otbound._validation import LAW_ATOL, SAMPLINGS, InvalidInputError

# --- end verifiers ---
# --- block level ---
from otbound.block.bounds import BlockBound, BlockBracket, block_bound, block_bound_bracket
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
from otbound.token import SamplingParams
from otbound.token.bounds import (
    TokenBound,
    optimal_acceptance,
    optimal_acceptance_brute_force,
    optimal_acceptance_lp,
    relaxation_bounds,
)
from otbound.token.draft_laws import draft_joint, greedy_split, sample_drafts, subset_mass
from otbound.token.laws import DRAFT_LAWS, DraftLaw, draft_law
from otbound.token.logits import laws_from_logits

# --- verifiers (token level) ---
from otbound.token.verifiers import VERIFIERS, Verifier, VerifierRun, VerifierSample

# --- end block level ---

# --- imported on first use: the objectives (torch, so that ``import otbound`` does not import torch)
# and the modules' names before the layer folders (``otbound.verifiers`` is ``otbound.token.verifiers``) ---
_LAZY = {
    "objectives": ("otbound.objectives", None),
    "DrafterObjective": ("otbound.objectives", "DrafterObjective"),
    "expected_accepted_length": ("otbound.objectives", "expected_accepted_length"),
    "draft_laws": ("otbound.token.draft_laws", None),
    "token_bounds": ("otbound.token.bounds", None),
    "verifiers": ("otbound.token.verifiers", None),
    "block_models": ("otbound.block.models", None),
    "block_bounds": ("otbound.block.bounds", None),
    "block_verifiers": ("otbound.block.verifiers", None),
    "reports": ("otbound.report.tables", None),
    "plots": ("otbound.report.plots", None),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        return module if attr is None else getattr(module, attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
# --- end lazy ---

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
    "SamplingParams",
    "TokenBound",
    "Verifier",
    "VerifierRun",
    "VerifierSample",
    "block_bound",
    "block_bound_bracket",
    "context_free_model",
    "dirichlet_model",
    "draft_joint",
    "draft_law",
    "expected_accepted_length",
    "greedy_split",
    "laws_from_logits",
    "mixture_model",
    "objectives",
    "optimal_acceptance",
    "optimal_acceptance_brute_force",
    "optimal_acceptance_lp",
    "prefix_law",
    "relaxation_bounds",
    "sample_blocks",
    "sample_drafts",
    "sequence_probability",
    "shifted_model",
    "subset_mass",
    "tabulated_model",
    "zipf_model",
]
