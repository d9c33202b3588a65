"""The draft temperature as a dimension of the plan: the same traces planned with the drafter
sampling at several temperatures, the best (temperature, law, shape, verifier) chosen together.

A trace stores the draft law ``q`` at its temperature T₀; the drafter at temperature ``τ·T₀``
(``τ`` relative) has the law ``q_τ ∝ q^{1/τ}`` (tokens of zero mass stay at zero: top-k / top-p
masks are kept). For each ``τ`` the table is measured on ``(p, q_τ)`` along the traces
(:func:`otbound.plan.measure_table`) and planned (:func:`otbound.plan.make_plan`); the target's law
``p``, the cost model and the shapes do not change with the drafter's temperature, so the
candidates of all temperatures compete on one speed-up scale. ``τ → 0`` is deterministic drafting,
planned as the draft law ``"deterministic"`` (it needs no temperature). The per-position optimum
over a continuum of τ is :func:`otbound.best_draft_temperature`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from otbound._validation import InvalidInputError, as_law
from otbound.plan._acceptance import DEFAULT_VERIFIERS, measure_table
from otbound.plan._plan import make_plan, shape_label
from otbound.token import SamplingParams
from otbound.token.draft_laws import DRAFT_LAWS, draft_law


def draft_law_at_temperature(q, tau: float) -> np.ndarray:
    """``q^{1/τ}`` normalised along the last axis (τ relative to the law's own temperature), float64:
    the law of the logits ``log q`` at temperature τ under :class:`otbound.SamplingParams` (the
    settings' path; ``log 0 = −inf`` stays at mass 0, and a τ small enough to overflow ``log q / τ``
    gives its exact greedy limit).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.plan import draft_law_at_temperature
    >>> draft_law_at_temperature(np.array([0.5, 0.25, 0.25, 0.0]), 0.5).round(6).tolist()
    [0.666667, 0.166667, 0.166667, 0.0]
    """
    tau = float(tau)
    if not (np.isfinite(tau) and tau > 0):
        raise InvalidInputError(f"a draft temperature must be positive and finite, got {tau!r}")
    as_law(q, "q")  # a law along the last axis (checked, not renormalised: q's own masses are raised to 1/τ)
    with np.errstate(divide="ignore"):
        return SamplingParams(tau).laws(np.log(np.asarray(q, dtype=np.float64)))


@dataclass
class TemperaturePlan:
    """Output of :func:`plan_draft_temperatures`.

    Attributes
    ----------
    temperatures : list of float
        The relative draft temperatures planned.
    plans : list of otbound.plan.Plan
        One plan per temperature.
    best_temperature : float
        The temperature of the candidate of highest predicted speed-up over all plans.
    best : otbound.plan.Candidate
        That candidate.

    Examples
    --------
    >>> from otbound.plan import plan_draft_temperatures, synthetic_laws, synthetic_cost_model
    >>> tp = plan_draft_temperatures(synthetic_laws(num_traces=2, positions=5), synthetic_cost_model(), (0.7, 1.0),
    ...                              max_drafts=1, verifiers=("rrs",), laws=("with_replacement",), max_depth=2,
    ...                              budgets=(2,))
    >>> [row["temperature"] for row in tp.summary()]
    [0.7, 1.0]
    >>> tp.best.predicted_speedup == max(plan.best().predicted_speedup for plan in tp.plans)
    True
    """

    temperatures: list
    plans: list
    best_temperature: float
    best: object

    def summary(self) -> list[dict]:
        """Per temperature: its best candidate's law, shape, verifier, mean acceptance length,
        bound and predicted speed-up."""
        out = []
        for tau, plan in zip(self.temperatures, self.plans):
            c = plan.best()
            out.append({"temperature": tau, "draft_law": c.draft_law, "shape": shape_label(c.shape),
                        "verifier": c.verifier, "mean_acceptance_length": c.mean_acceptance_length,
                        "bound_mean_acceptance_length": c.bound_mean_acceptance_length,
                        "predicted_speedup": c.predicted_speedup})  # fmt: skip
        return out


def check_temperatures(temperatures, laws, *, sampled_only: bool = False) -> list[float]:
    """The temperatures as floats, refused (``InvalidInputError``) unless distinct, positive and
    finite, and ``laws`` hold a sampled law (``sampled_only``: nothing but sampled laws)."""
    taus = [float(t) for t in temperatures]
    if not taus:
        raise InvalidInputError("give at least one draft temperature")
    if any(not (np.isfinite(t) and t > 0) for t in taus) or len(set(taus)) != len(taus):
        raise InvalidInputError(f"draft temperatures must be distinct, positive and finite, got {taus}")
    sampled = [s for s in laws if draft_law(s).temperature]
    if sampled_only and len(sampled) != len(list(laws)):
        raise InvalidInputError(f"only the sampled laws have a temperature, got {list(laws)}: plan the deterministic "
                                "law (τ → 0) with make_plan")
    if not sampled:
        tempered = " or ".join(name for name, law in DRAFT_LAWS.items() if law.temperature)
        raise InvalidInputError(f"draft temperatures apply to the sampled laws: include {tempered}")
    return taus


def plan_draft_temperatures(laws_per_trace, cost, temperatures=(0.5, 0.75, 1.0, 1.5), *, max_drafts: int,
                            verifiers=DEFAULT_VERIFIERS, laws=("with_replacement", "without_replacement"),
                            mc_samples: int = 16, seed: int = 0, source=None, **plan_options) -> TemperaturePlan:
    """Plan the traces at each relative draft temperature and choose the best over all (module
    docstring).

    Parameters
    ----------
    laws_per_trace : list of (p, q)
        Per trace, target and draft laws (positions × V) at the traces' temperature.
    cost : otbound.plan.CostModel
    temperatures : sequence of float
        Relative draft temperatures τ > 0 (1.0: the traces' own draft law).
    max_drafts, verifiers, laws, mc_samples, seed, source
        As :func:`otbound.plan.measure_table` (``laws``: sampled laws; ``"deterministic"`` is
        temperature-free and planned by the plain planner).
    **plan_options
        Passed to :func:`otbound.plan.make_plan` (``max_depth``, ``budgets``, ...).

    Returns
    -------
    TemperaturePlan

    Raises
    ------
    InvalidInputError
        No temperature, a temperature ≤ 0, a repeated one, or what :func:`measure_table` and
        :func:`make_plan` refuse.

    Examples
    --------
    >>> from otbound.plan import plan_draft_temperatures, synthetic_laws, synthetic_cost_model
    >>> laws = synthetic_laws(num_traces=3, positions=6)
    >>> tp = plan_draft_temperatures(laws, synthetic_cost_model(), (0.5, 1.0), max_drafts=2, verifiers=("rrs",),
    ...                              laws=("with_replacement",), max_depth=3, budgets=(2, 4))
    >>> tp.best_temperature in (0.5, 1.0), len(tp.plans)
    (True, 2)
    """
    taus = check_temperatures(temperatures, laws, sampled_only=True)
    plans = []
    for tau in taus:
        scaled = [(p, draft_law_at_temperature(q, tau)) for p, q in laws_per_trace]
        src = dict(source or {}, draft_temperature_scale=tau)
        table = measure_table(scaled, max_drafts=max_drafts, verifiers=verifiers, laws=list(laws),
                              mc_samples=mc_samples, seed=seed, source=src)
        plans.append(make_plan(table, cost, laws=list(laws), **plan_options))
    i = int(np.argmax([p.best().predicted_speedup for p in plans]))
    return TemperaturePlan(taus, plans, taus[i], plans[i].best())


def write_temperature_plans(tp: TemperaturePlan, out) -> Path:
    """``<out>/temperatures.json``: per temperature its best candidate (:meth:`TemperaturePlan.summary`)
    and the best over all (atomically). Returns the path."""
    import json

    from otbound._io import write_text_atomic

    body = {"temperatures": tp.temperatures, "best_temperature": tp.best_temperature,
            "best": tp.best.as_dict(), "per_temperature": tp.summary()}
    path = Path(out) / "temperatures.json"
    write_text_atomic(path, json.dumps(json.loads(json.dumps(body, default=float)), indent=1) + "\n")
    return path
