"""Paired statistics on the same positions: each verifier's gap to α* of its law, and the
difference between any two verifiers (or two laws' α*), with cluster-robust intervals.

Every measurement of a (dataset, T, K) cell is taken on the same positions, so the comparison users
ask for — "how far is RRS from the optimum, and is K-SEQ better than RRS?" — is a mean of
per-position differences ``d_t = a_t − b_t``, not a difference of two means with their own
intervals: the position-to-position variation of α* (most of the spread) cancels. The interval is
:func:`otbound.report.cluster_mean_ci` on ``d_t`` with prompts as clusters (positions of one prompt
are correlated), the Monte Carlo noise of an estimated verifier included.

:func:`paired_differences` gives the rows, :func:`paired_tables` the markdown, :func:`paired_figure`
the figure: α* against K with interval bands, and each verifier's paired gap to α* on an axis
zoomed to the data.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np

from otbound.report import plots
from otbound.report._measure import cluster_mean_ci, trace_cells

LAW_SHORT = {"with_replacement": "wr", "without_replacement": "wor", "greedy": "greedy"}


def _series(group, k):
    """Per-position series of one cell: ``{"α*(law)": values, verifier: values}`` and their laws."""
    series, laws = {}, {}
    for s in group[0]["optimal"]:
        series[f"α*({LAW_SHORT.get(s, s)})"] = np.concatenate([r["optimal"][s][k] for r in group])
        laws[f"α*({LAW_SHORT.get(s, s)})"] = s
    names = sorted({n for r in group for n in r["verifiers"]})
    for n in names:
        entries = [r["verifiers"].get(n, {}).get(k) for r in group]
        if all(e is not None for e in entries):
            series[n] = np.concatenate([e["acceptance"] for e in entries])
            laws[n] = entries[0]["sampling"]
    return series, laws


def paired_differences(results, confidence: float = 0.95) -> list[dict]:
    """Rows ``{dataset, temperature, num_drafts, a, b, kind, difference, difference_ci, positions,
    prompts}`` from :func:`otbound.report.measure_trace` results: ``difference`` = mean of ``a_t − b_t``
    over the cell's positions and its cluster-robust half-width. ``kind``: ``"gap"`` (a verifier
    against α* of its own law, b = ``"α*(law)"``), ``"laws"`` (two laws' α*) or ``"verifiers"``
    (two verifiers, any laws)."""
    rows = []
    for dataset, temp, group, clusters, ks in trace_cells(results):
        for k in ks:
            series, laws = _series(group, k)
            bounds = [n for n in series if n.startswith("α*")]
            names = [n for n in series if not n.startswith("α*")]
            pairs = [(n, f"α*({LAW_SHORT.get(laws[n], laws[n])})", "gap") for n in names
                     if f"α*({LAW_SHORT.get(laws[n], laws[n])})" in series]
            pairs += [(a, b, "laws") for a, b in combinations(bounds, 2)]
            pairs += [(a, b, "verifiers") for a, b in combinations(names, 2)]
            for a, b, kind in pairs:
                m, h = cluster_mean_ci(series[a] - series[b], clusters, confidence)
                rows.append(dict(dataset=dataset, temperature=temp, num_drafts=k, a=a, b=b, kind=kind,
                                 difference=m, difference_ci=h, positions=int(clusters.size), prompts=len(group)))
    return rows


def paired_tables(pair_rows) -> str:
    """Markdown, one table per (T, K): paired gaps to α*, then law and verifier differences;
    columns = datasets; cells ``mean ± 95% half-width``."""
    out = []
    for t, k in sorted({(r["temperature"], r["num_drafts"]) for r in pair_rows}):
        sel = [r for r in pair_rows if r["temperature"] == t and r["num_drafts"] == k]
        datasets = list(dict.fromkeys(r["dataset"] for r in sel))
        lookup = {(r["a"], r["b"], r["dataset"]): r for r in sel}
        lines = [f"| paired, K = {k}, T = {t} | " + " | ".join(datasets) + " |", "|---" * (len(datasets) + 1) + "|"]
        for kind, label in (("gap", "gap to α*: {a} − {b}"), ("laws", "{a} − {b}"), ("verifiers", "{a} − {b}")):
            for a, b in dict.fromkeys((r["a"], r["b"]) for r in sel if r["kind"] == kind):
                cells = [f"{lookup[(a, b, d)]['difference']:+.4f} ± {lookup[(a, b, d)]['difference_ci']:.4f}"
                         if (a, b, d) in lookup else "—" for d in datasets]
                lines.append(f"| {label.format(a=a, b=b)} | " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def max_gap_half_width(pair_rows) -> float:
    """The largest 95% half-width of any paired gap to α* (the default job aims at ≤ 0.01)."""
    hs = [r["difference_ci"] for r in pair_rows if r["kind"] == "gap" and np.isfinite(r["difference_ci"])]
    return float(max(hs)) if hs else float("nan")


def paired_figure(rows, pair_rows, out, temperature=None):
    """Left: α* against K per law and dataset with 95% bands (integer K ticks). Right: each
    verifier's paired gap to α* of its law against K with 95% error bars, the axis zoomed to the
    data (a verifier more than 3× further below the bound than all others, typically nss, is named
    in the legend with its worst gap instead of squashing the rest). One temperature (default: the
    middle one); legends below the panels."""

    temps = sorted({r["temperature"] for r in rows})
    t = temps[len(temps) // 2] if temperature is None else temperature
    fig, axes = plots.figure(ncols=2, height=2.8)
    paired_panels(axes[0], rows, pair_rows, t)
    return plots.save(fig, Path(out) / "paired_gaps")[0]


#: where :func:`paired_panels` puts each panel's legend (keywords of ``Axes.legend``): below the panel
LEGEND_BELOW = dict(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)


def paired_panels(axes, rows, pair_rows, t, legend=LEGEND_BELOW) -> None:
    """The two panels of :func:`paired_figure` at temperature ``t``, drawn into ``axes`` (two Axes);
    ``legend``: keywords of each panel's ``Axes.legend`` (default: below the panel)."""
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    styles = {"with_replacement": "-o", "without_replacement": "--s", "greedy": ":^"}
    ks = sorted({r["num_drafts"] for r in rows})
    ax = axes[0]
    for i, d in enumerate(datasets):
        for law, style in styles.items():
            pts = sorted((r["num_drafts"], r["acceptance"], r["acceptance_ci"] or 0.0) for r in rows
                         if r["verifier"] == "optimal" and r["sampling"] == law and r["dataset"] == d
                         and r["temperature"] == t)
            if not pts:
                continue
            x, y, h = (np.array(v, dtype=float) for v in zip(*pts))
            (line,) = ax.plot(x, y, style, color=f"C{i}", label=f"{d}, {law.replace('_', ' ')}")
            ax.fill_between(x, y - h, y + h, color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xticks(ks)
    ax.set_xlabel("number of drafts K")
    ax.set_ylabel("optimal acceptance α* (95% band)")
    ax.set_title(f"OT bound, T = {t}")
    ax.legend(frameon=False, **legend)
    ax = axes[1]
    gaps = [r for r in pair_rows if r["kind"] == "gap" and r["temperature"] == t]
    names = list(dict.fromkeys(r["a"] for r in gaps))
    off_axis = _far_below(gaps, names)
    offsets = np.linspace(-0.25, 0.25, max(1, len(names) * len(datasets)))
    j = 0
    for i, d in enumerate(datasets):
        for n in names:
            pts = sorted((r["num_drafts"], r["difference"], r["difference_ci"]) for r in gaps
                         if r["a"] == n and r["dataset"] == d)
            if pts and n not in off_axis:
                x, y, h = (np.array(v, dtype=float) for v in zip(*pts))
                ax.errorbar(x + offsets[j], y, yerr=h, fmt="o" if i == 0 else "s", color=f"C{names.index(n)}",
                            capsize=2, label=f"{n} ({d})", alpha=1.0 if i == 0 else 0.6)
            j += 1
    if off_axis:  # a far worse verifier (typically nss) would squash the others onto one line
        worst = {n: min(r["difference"] for r in gaps if r["a"] == n) for n in off_axis}
        ax.plot([], [], " ", label="off axis: " + ", ".join(f"{n} (to {v:+.3f})" for n, v in worst.items()))
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xticks(ks)
    ax.set_xlabel("number of drafts K")
    ax.set_ylabel("acceptance − α* of its law (paired, 95%)")
    ax.set_title(f"verifiers' gap to the bound, T = {t}")
    ax.legend(frameon=False, **legend)


def _far_below(gaps, names):
    """Verifiers whose gaps lie more than 3× further below 0 than every other verifier's."""
    low = {n: min(r["difference"] - r["difference_ci"] for r in gaps if r["a"] == n) for n in names}
    out = []
    for n in sorted(low, key=low.get):
        rest = [v for m, v in low.items() if m != n and m not in out]
        if rest and low[n] < 3 * min(rest) and low[n] < 0 and min(rest) < 0:
            out.append(n)
        else:
            break
    return out


def paired_section(rows, out) -> tuple[float, Path, str]:
    """The real report's paired statistics from ``<out>/paired.json``: (largest paired-gap half-width,
    figure path, markdown section)."""
    import json

    pair_rows = json.loads((Path(out) / "paired.json").read_text())
    fig = paired_figure([r for r in rows if r["acceptance"] is not None], pair_rows, out)
    text = ("## Paired comparisons on the same positions\n\nMean per-position difference ± 95% half-width, "
            "cluster-robust over prompts: each verifier's gap to α* of its own law, the laws' α* against each "
            "other, and every two verifiers.\n\n" + paired_tables(pair_rows) + "\n")
    return max_gap_half_width(pair_rows), fig, text
