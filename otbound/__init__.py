"""otbound: optimal-transport acceptance bounds and lossless verifiers for speculative decoding.

Token level (theory.md §1-3): :func:`optimal_acceptance` (dual / prefix form, any batch, numpy or
torch), :func:`optimal_acceptance_lp` (primal LP with plan), the draft laws, and the verifiers in
:data:`VERIFIERS`. Block level (§4): :func:`block_bound` and :data:`BLOCK_VERIFIERS`.
"""

from otbound._validation import LAW_ATOL, SAMPLINGS, InvalidInputError
from otbound.token.draft_laws import draft_joint, greedy_split, sample_drafts, subset_mass
from otbound.token.bounds import (
    TokenBound,
    optimal_acceptance,
    optimal_acceptance_brute_force,
    optimal_acceptance_lp,
    relaxation_bounds,
)

# --- verifiers (token level) ---
from otbound.token.verifiers import VERIFIERS, Verifier, VerifierRun, VerifierSample
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
# --- end block level ---

# --- objectives ---
from otbound import objectives
from otbound.objectives import DrafterObjective, expected_accepted_length
# --- end objectives ---

__version__ = "0.1.0"
