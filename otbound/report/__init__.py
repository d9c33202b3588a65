"""The report layer: measurement of traces, aggregation and statistics, the synthetic and block
sections, tables and plots.

Measurements
    :func:`measure_laws`, :func:`measure_trace`, :func:`aggregate`, :func:`cluster_mean_ci` — α* per
    draft law and K, each verifier's acceptance (exact or Monte Carlo), mean ± 95% CI per
    (dataset, T, K); :func:`run_real_report` does it all for a language-model pair, resumably.
Synthetic section
    :func:`synthetic_pair`, :func:`synthetic_rows`, :func:`token_figure`.
Block section
    :func:`block_section`, :func:`block_markdown`.
Tables and plots
    :mod:`otbound.report.tables` (markdown tables, ``report.md``/``report.json``) and
    :mod:`otbound.report.plots` (figure style, PNG output).
"""

from otbound.report import plots, tables
from otbound.report._block import block_markdown, block_section
from otbound.report._measure import aggregate, cluster_mean_ci, measure_laws, measure_trace
from otbound.report._real import run_real_report
from otbound.report._synthetic import SYNTHETIC_FAMILIES, synthetic_pair, synthetic_rows, token_figure

__all__ = [
    "SYNTHETIC_FAMILIES", "aggregate", "block_markdown", "block_section", "cluster_mean_ci", "measure_laws",
    "measure_trace", "plots", "run_real_report", "synthetic_pair", "synthetic_rows", "tables", "token_figure",
]
