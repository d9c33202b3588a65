"""The drafting planner: which draft law, shape (K chains of length L, or a tree under a node
budget) and lossless verifier to deploy for a pair, at its sampling settings, on its hardware —
and how far each is from the optimum of its draft law.

From per-position acceptance measured on traces (:func:`measure_table`,
:func:`table_from_records` on a report's run folder, :func:`synthetic_table`), every candidate's
mean acceptance length is predicted along the traces with the verifier's exact per-node acceptance
(cluster-robust 95% interval), beside the bound of the same law and shape (the optimum ``α*`` at
every node); trees come from a Sequoia-style dynamic program under a node budget
(:func:`best_tree`); the speed-up over plain decoding from a cost model measured on the models
(:func:`measure_forward_costs`, :func:`measure_verify_costs`) or given (:class:`CostCurve`).
:func:`plan_draft_temperatures` adds the drafter's temperature as a dimension (the traces'
draft law rescaled, ``q^{1/τ}``, planned per τ, the best chosen over all).
``python -m otbound.plan`` writes ``plan.json``, ``plan.md`` and ``plan.png``
(docs/guide/planner.md).

Examples
--------
>>> from otbound.plan import synthetic_table, synthetic_cost_model, make_plan
>>> table = synthetic_table(num_traces=3, positions=6, max_drafts=2, verifiers=("rrs",), laws=("with_replacement",))
>>> plan = make_plan(table, synthetic_cost_model(), max_depth=3, budgets=(2, 4))
>>> best = plan.best()
>>> best.draft_law, best.verifier, 1 <= best.mean_acceptance_length <= best.bound_mean_acceptance_length
('with_replacement', 'rrs', True)
"""

from otbound.plan._acceptance import (
    DEFAULT_VERIFIERS,
    AcceptanceTable,
    measure_table,
    table_from_measurements,
    window_levels,
)
from otbound.plan._cost import (
    CostCurve,
    CostModel,
    UnstableTimingWarning,
    load_cost,
    machine_description,
    measure_forward_costs,
    measure_verify_costs,
)
from otbound.plan._engines import ENGINES, engine_configurations
from otbound.plan._plan import (
    DEFAULT_BUDGETS,
    Candidate,
    Plan,
    best_by_budget,
    chain_shape,
    evaluate,
    make_plan,
    pareto_front,
    plan_figure,
    plan_markdown,
    shape_label,
    tree_shape,
    write_plan,
)
from otbound.plan._search import best_tree, check_search_size, tree_nodes_of
from otbound.plan._sources import (
    load_run_traces,
    synthetic_cost_model,
    synthetic_laws,
    synthetic_table,
    table_from_records,
    trace_files,
)
from otbound.plan._temperature import (
    TemperaturePlan,
    check_temperatures,
    draft_law_at_temperature,
    plan_draft_temperatures,
    write_temperature_plans,
)

__all__ = [
    "ENGINES", "engine_configurations",
    "DEFAULT_BUDGETS", "DEFAULT_VERIFIERS", "AcceptanceTable", "Candidate", "CostCurve", "CostModel", "Plan",
    "UnstableTimingWarning", "best_by_budget", "best_tree", "chain_shape", "evaluate", "load_cost",
    "load_run_traces", "machine_description",
    "make_plan", "measure_forward_costs", "measure_table", "measure_verify_costs", "pareto_front", "plan_figure",
    "plan_markdown", "shape_label", "synthetic_cost_model", "synthetic_laws", "synthetic_table",
    "table_from_measurements", "table_from_records", "trace_files", "tree_nodes_of", "tree_shape",
    "window_levels",
    "write_plan",
    "TemperaturePlan", "draft_law_at_temperature", "plan_draft_temperatures",
    "check_search_size", "check_temperatures", "write_temperature_plans",
]
