"""The report layer: measurement of traces, aggregation and statistics, the synthetic and block
sections, tables and plots.

Measurements
    :func:`measure_laws`, :func:`measure_trace`, :func:`aggregate`, :func:`cluster_mean_ci` — α* per
    draft law and K, each verifier's acceptance (exact or Monte Carlo), mean ± 95% CI per
    (dataset, T, K), on the token layer's batched kernel (:class:`otbound.token.LawBatch`: one ratio
    sort per row for every law, K and closed-form verifier, torch on CPU or CUDA);
    :func:`run_real_report` does it all
    for a language-model pair, resumably, measuring each trace as it is sampled;
    :func:`first_run_notice` states what its first run costs (:data:`FIRST_RUN`, measured).
Paired statistics
    :func:`paired_differences`, :func:`paired_tables`, :func:`paired_figure` (its panels:
    :func:`paired_panels`, one per draft law of :func:`gap_laws`),
    :func:`max_gap_half_width` — each verifier's gap to α* and the difference between verifiers on
    the same positions, cluster-robust over prompts.
Synthetic section
    :func:`synthetic_pair`, :func:`synthetic_rows`, :func:`token_figure`.
Block section
    :func:`block_section`, :func:`block_markdown`.
End-to-end section
    :func:`measure_run` — each iteration of :func:`otbound.lm.speculative_sample` against the
    verifier's exact ``E[τ | drafts]``, ``E[τ | context]`` and the bounds at its context;
    :func:`end_to_end_rows`, :func:`end_to_end_markdown`, :func:`end_to_end_figure`,
    :func:`end_to_end_section` (``python -m otbound.compare --end-to-end``).
Sharded runs
    :func:`run_shards`, :class:`Shard`, :func:`make_executor` (``"local"``: this process,
    ``"ray"``: :class:`RayExecutor`), :func:`read_checkpoints` — every report section as
    checkpointed shards with a result independent of where they ran (:mod:`otbound.report._distributed`).
Engine metrics
    :func:`engine_metrics`, :func:`metrics_from_levels` — mean acceptance length, acceptance rate,
    per-position acceptance and acceptance-length histogram as vLLM / SGLang / TensorRT-LLM / EAGLE
    report them (docs/guide/metrics.md), in every block-level row.
Tables and plots
    :mod:`otbound.report.tables` (markdown tables, ``report.md``/``report.json``) and
    :mod:`otbound.report.plots` (figure style, PNG output).
"""

from otbound.report import plots, tables
from otbound.report._block import block_markdown, block_section
from otbound.report._distributed import (
    LocalExecutor,
    RayExecutor,
    Shard,
    make_executor,
    read_checkpoints,
    run_shards,
)
from otbound.report._end_to_end import (
    EndToEndRow,
    IterationMeasure,
    end_to_end_figure,
    end_to_end_markdown,
    end_to_end_rows,
    end_to_end_section,
    measure_run,
    tree_expected_accepted,
)
from otbound.report._measure import aggregate, cluster_mean_ci, measure_laws, measure_trace, stored_measurement
from otbound.report._metrics import METRIC_NAMES, engine_metrics, metrics_from_levels
from otbound.report._paired import (
    gap_laws,
    max_gap_half_width,
    paired_differences,
    paired_figure,
    paired_panels,
    paired_section,
    paired_tables,
)
from otbound.report._real import FIRST_RUN, first_run_notice, run_real_report
from otbound.report._synthetic import SYNTHETIC_FAMILIES, synthetic_pair, synthetic_rows, token_figure

__all__ = [
    "FIRST_RUN", "first_run_notice",
    "EndToEndRow", "IterationMeasure", "end_to_end_figure", "end_to_end_markdown", "end_to_end_rows",
    "end_to_end_section", "measure_run", "tree_expected_accepted",
    "LocalExecutor", "RayExecutor", "Shard", "make_executor", "read_checkpoints", "run_shards",
    "METRIC_NAMES", "engine_metrics", "metrics_from_levels",
    "SYNTHETIC_FAMILIES", "aggregate", "block_markdown", "block_section", "cluster_mean_ci", "gap_laws",
    "max_gap_half_width",
    "measure_laws", "measure_trace", "stored_measurement", "paired_differences", "paired_figure", "paired_panels",
    "paired_section", "paired_tables",
    "plots", "run_real_report", "synthetic_pair", "synthetic_rows", "tables", "token_figure",
]
