"""otbound: optimal-transport acceptance bounds and lossless verifiers for speculative decoding.

Token level (theory.md §1-3): :func:`optimal_acceptance` (dual / prefix form, any batch, numpy or
torch), :func:`optimal_acceptance_lp` (primal LP with plan), the draft laws, and the verifiers in
:data:`VERIFIERS`. Block level (§4): :func:`block_bound` and :data:`BLOCK_VERIFIERS`.
"""

from otbound._validation import LAW_ATOL, SAMPLINGS, InvalidInputError
from otbound.draft_laws import draft_joint, greedy_split, sample_drafts, subset_mass
from otbound.token_bounds import (
    TokenBound,
    optimal_acceptance,
    optimal_acceptance_brute_force,
    optimal_acceptance_lp,
    relaxation_bounds,
)

# --- verifiers (token level) ---
from otbound.verifiers import VERIFIERS, Verifier, VerifierRun, VerifierSample
# --- end verifiers ---

# --- block level ---
# --- end block level ---

# --- objectives ---
# --- end objectives ---

__version__ = "0.1.0"
