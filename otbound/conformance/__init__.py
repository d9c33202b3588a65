"""Conformance kit: check anyone's verifier for losslessness and its distance to the optimum.

Bring a verifier, get its exact output law, its lossless error, a minimal counterexample if it has
one, and its acceptance against α* (token level) or ``E[τ]`` against U_causal / U_joint (block level):

* :func:`check_token_verifier` — ``verify(p, q, drafts, coin, draw) -> token`` (exact mode) or
  ``verify(p, q, drafts, rng) -> token`` (sample mode, G-test with power ≥ 0.99 against a 1%
  distortion);
* :func:`check_block_verifier` — ``verify(target, draft, blocks, coin, draw) -> emitted tokens``
  (exact) or ``verify(target, draft, blocks, rng)`` (sample); ``drafting=`` a
  :class:`DraftingScheme` (e.g. :func:`top_k_tree`) bounds it by the law of the trees it drafts;
* :func:`route_randomness` — run unmodified torch / numpy engine code in exact mode (its
  ``torch.rand`` comparisons, ``torch.multinomial``, ``Categorical.sample``, ``rng.choice`` routed to
  ``coin`` / ``draw``; :func:`exponential_race` for the argmax of an exponential race);
* :func:`check_drafter_invariance` — a drafting-and-verification procedure's output does not depend
  on the draft law given its randomness (two draft laws on the same seeded stream);
* :func:`enumerate_outcomes` — the exact law of any function of ``coin`` / ``draw``;
* :mod:`otbound.conformance.adapters` — the installed transformers' ``_speculative_sampling`` and
  the package's own verifiers; :mod:`otbound.conformance.examples` (SpecInfer RRS written against
  ``coin`` / ``draw``, and defective verifiers);
* CLI: ``python -m otbound.conformance MODULE:FUNCTION --level token|block --num-drafts K``
  (exit 0 lossless, 1 not lossless, 2 usage or contract error).

User guide: ``docs/guide/conformance.md``.
"""

from otbound.conformance._adapters import (
    as_sampler,
    block_adapter,
    block_sample_adapter,
    token_law_adapter,
    token_sample_adapter,
)
from otbound.conformance._block import check_block_verifier
from otbound.conformance._drafting import DraftingScheme, as_drafting, top_k_tree
from otbound.conformance._instances import BlockInstance, TokenInstance, block_instances, token_instances
from otbound.conformance._invariance import InvarianceCounterexample, InvarianceResult, check_drafter_invariance
from otbound.conformance._result import ConformanceResult, Counterexample, InstanceReport
from otbound.conformance._routing import LazyUniform, RoutedGenerator, exponential_race, route_randomness
from otbound.conformance._stats import degrees_of_freedom, g_test, power, samples_for_power
from otbound.conformance._token import check_token_verifier
from otbound.conformance._tree import ConformanceError, enumerate_outcomes, violations_reraised

__all__ = [
    "as_drafting",
    "as_sampler",
    "BlockInstance",
    "ConformanceError",
    "ConformanceResult",
    "Counterexample",
    "DraftingScheme",
    "InstanceReport",
    "InvarianceCounterexample",
    "InvarianceResult",
    "LazyUniform",
    "RoutedGenerator",
    "TokenInstance",
    "block_adapter",
    "block_instances",
    "block_sample_adapter",
    "check_block_verifier",
    "check_drafter_invariance",
    "check_token_verifier",
    "enumerate_outcomes",
    "exponential_race",
    "power",
    "degrees_of_freedom",
    "g_test",
    "route_randomness",
    "samples_for_power",
    "token_instances",
    "token_law_adapter",
    "token_sample_adapter",
    "top_k_tree",
    "violations_reraised",
]
