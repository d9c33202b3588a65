"""The token layer (docs/theory/token-bounds.md and token-verifiers.md): draft laws, the optimal
acceptance α*(p, Q) and the token-level verifiers.

* :mod:`otbound.token.draft_laws` — the draft laws (with replacement, without replacement, greedy,
  deterministic, systematic), each one :class:`DraftLaw` object in :data:`DRAFT_LAWS` (its sampling,
  tuple law, subset masses, inclusion probabilities, α* kernel, label and style), keyed by the public
  ``sampling="..."`` names and found through :func:`draft_law`, through which the bounds, samplers,
  verifiers, measurements, planner and kit dispatch.
* :class:`LawBatch` — laws ``(..., V)`` in numpy or torch checked once and sorted once by ratio: the
  batched kernel (:mod:`otbound.token._kernel`) behind α* and every verifier's closed-form
  acceptance, on the caller's device.
* :mod:`otbound.token.bounds` — α* in dual/prefix form, primal LP, brute force, relaxations; the
  without-replacement integral in :mod:`otbound.token._wor`, its branch and bound in
  :mod:`otbound.token._search`.
* :mod:`otbound.token.logits` — sampling settings (:class:`SamplingParams`: temperature, top-k,
  top-p, min-p, repetition penalty), applied in one place: logits → laws.
* :func:`optimal_acceptance_limit`, :func:`drafts_for_certain_acceptance` — α* as K grows.
* :func:`best_draft_temperature`, :func:`draft_temperature_curve` — α* as a function of the draft
  temperature, and its best τ per position and per run.
* :mod:`otbound.token.verifiers` — lossless multi-draft verifiers, registry :data:`VERIFIERS`.

Modules form a DAG: ``_draft_law`` (the law object and its registry) → ``_systematic`` and
``_kernel``; ``_wor`` → ``_search`` → ``_kernel`` → ``draft_laws`` → ``bounds`` → ``verifiers`` (and
``_settings`` → ``logits``); no module imports one after it.
"""

from otbound.token._kernel import LawBatch
from otbound.token._limits import drafts_for_certain_acceptance, optimal_acceptance_limit
from otbound.token._settings import SamplingParams, describe_settings, settings_at
from otbound.token._temperature import DraftTemperature, best_draft_temperature, draft_temperature_curve
from otbound.token.bounds import (
    LPDual,
    Relaxation,
    TokenBound,
    optimal_acceptance,
    optimal_acceptance_brute_force,
    optimal_acceptance_lp,
    relaxation_bounds,
)
from otbound.token.draft_laws import (
    DRAFT_LAWS,
    DraftLaw,
    draft_joint,
    draft_law,
    greedy_split,
    inclusion_probabilities,
    sample_drafts,
    subset_mass,
)
from otbound.token.logits import laws_from_logits
from otbound.token.verifiers import VERIFIERS, Verifier, VerifierRun, VerifierSample

__all__ = [
    "drafts_for_certain_acceptance",
    "optimal_acceptance_limit",
    "DraftTemperature",
    "best_draft_temperature",
    "draft_temperature_curve",
    "DRAFT_LAWS",
    "DraftLaw",
    "LawBatch",
    "LPDual",
    "Relaxation",
    "SamplingParams",
    "TokenBound",
    "VERIFIERS",
    "Verifier",
    "VerifierRun",
    "VerifierSample",
    "describe_settings",
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
