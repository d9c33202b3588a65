"""The token layer (theory.md §1-3): draft laws, the optimal acceptance α*(p, Q) and the token-level
verifiers.

* :mod:`otbound.token.draft_laws` — the three draft laws (with replacement, without replacement,
  greedy): sampling, joint law, subset masses; :mod:`otbound.token.laws` — the same laws as
  :class:`DraftLaw` objects in :data:`DRAFT_LAWS` (with their α* routine), keyed by the public
  ``sampling="..."`` names, through which the bounds, samplers and verifiers dispatch.
* :mod:`otbound.token.bounds` — α* in dual/prefix form, primal LP, brute force, relaxations; the
  without-replacement integral in :mod:`otbound.token._wor`.
* :mod:`otbound.token.logits` — sampling settings (:class:`SamplingParams`: temperature, top-k,
  top-p, min-p, repetition penalty), applied in one place: logits → laws.
* :mod:`otbound.token.verifiers` — lossless multi-draft verifiers, registry :data:`VERIFIERS`.
"""

from otbound.token._settings import SamplingParams, describe_settings, settings_at
from otbound.token._topk import deterministic_acceptance
from otbound.token.bounds import (
    Relaxation,
    TokenBound,
    optimal_acceptance,
    optimal_acceptance_brute_force,
    optimal_acceptance_lp,
    relaxation_bounds,
)
from otbound.token.draft_laws import draft_joint, greedy_split, inclusion_probabilities, sample_drafts, subset_mass
from otbound.token.laws import DRAFT_LAWS, DraftLaw, draft_law
from otbound.token.logits import laws_from_logits
from otbound.token.verifiers import VERIFIERS, Verifier, VerifierRun, VerifierSample

__all__ = [
    "DRAFT_LAWS",
    "DraftLaw",
    "Relaxation",
    "SamplingParams",
    "TokenBound",
    "VERIFIERS",
    "Verifier",
    "VerifierRun",
    "VerifierSample",
    "describe_settings",
    "deterministic_acceptance",
    "draft_joint",
    "draft_law",
    "greedy_split",
    "inclusion_probabilities",
    "laws_from_logits",
    "optimal_acceptance",
    "optimal_acceptance_brute_force",
    "optimal_acceptance_lp",
    "relaxation_bounds",
    "sample_drafts",
    "settings_at",
    "subset_mass",
]
