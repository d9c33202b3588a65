"""Paired statistics on the same positions: each verifier's gap to α* of its law, and the
difference between any two verifiers (or two laws' α*), with cluster-robust intervals.

Every measurement of a (dataset, T, K) cell is taken on the same positions, so the comparison users
ask for — "how far is RRS from the optimum, and is K-SEQ better than RRS?" — is a mean of
per-position differences ``d_t = a_t − b_t``, not a difference of two means with their own
intervals: the position-to-position variation of α* (most of the spread) cancels. The interval is
:func:`otbound.report.cluster_mean_ci` on ``d_t`` with prompts as clusters (positions of one prompt
are correlated), the Monte Carlo noise of an estimated verifier included.

:func:`paired_differences` gives the rows, :func:`paired_tables` the markdown, :func:`paired_figure`
the figure: each verifier's paired gap to α* of its own law against K, one panel per draft law.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import matplotlib.lines
import numpy as np

from otbound.report import plots
from otbound.report._measure import cluster_mean_ci, trace_cells
from otbound.token.draft_laws import DRAFT_LAWS, SAMPLINGS

#: each draft law's short name in column headers (``α*(wr)``)
LAW_SHORT = {name: law.short for name, law in DRAFT_LAWS.items()}


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
    (two verifiers, any laws).

    Parameters
    ----------
    results : iterable of dict
        Results of :func:`otbound.report.measure_trace`, as measured or as read back from JSON (K
        keys as strings); a (dataset, temperature) cell's traces are its clusters.
    confidence : float
        Coverage of every interval (:func:`otbound.report.cluster_mean_ci`).

    Returns
    -------
    list of dict
        The rows, per cell and K: the gaps, then the laws' and the verifiers' differences.

    Raises
    ------
    KeyError
        A result lacking a field of :func:`otbound.report.measure_trace`'s results.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.lm import TraceRecord
    >>> from otbound.report import measure_trace, paired_differences
    >>> target = np.log([[0.5, 0.3, 0.2], [0.6, 0.2, 0.2]])
    >>> draft = np.log([[0.2, 0.3, 0.5], [0.3, 0.4, 0.3]])
    >>> records = [TraceRecord(f"p{i}", "demo", 1.0, np.array([1, 0, 2]), 1, t, draft)
    ...            for i, t in enumerate((target, target[::-1]))]
    >>> results = [measure_trace(r, (2,), verifiers=["rrs", "kseq"], samplings=("with_replacement",))
    ...            for r in records]
    >>> pair_rows = paired_differences(results)
    >>> for r in pair_rows:
    ...     print(r["kind"], r["a"], "−", r["b"], round(r["difference"], 4), round(r["difference_ci"], 4))
    gap kseq − α*(wr) -0.0772 0.0068
    gap rrs − α*(wr) -0.11 0.0
    verifiers kseq − rrs 0.0328 0.0068
    """
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
    columns = datasets; cells ``mean ± 95% half-width``.

    Parameters
    ----------
    pair_rows : list of dict
        Rows of :func:`paired_differences`.

    Returns
    -------
    str
        The tables, separated by blank lines.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.lm import TraceRecord
    >>> from otbound.report import measure_trace, paired_differences, paired_tables
    >>> target = np.log([[0.5, 0.3, 0.2], [0.6, 0.2, 0.2]])
    >>> draft = np.log([[0.2, 0.3, 0.5], [0.3, 0.4, 0.3]])
    >>> records = [TraceRecord(f"p{i}", "demo", 1.0, np.array([1, 0, 2]), 1, t, draft)
    ...            for i, t in enumerate((target, target[::-1]))]
    >>> results = [measure_trace(r, (2,), verifiers=["rrs", "kseq"], samplings=("with_replacement",))
    ...            for r in records]
    >>> pair_rows = paired_differences(results)
    >>> print(paired_tables(pair_rows))
    | paired, K = 2, T = 1.0 | demo |
    |---|---|
    | gap to α*: kseq − α*(wr) | -0.0772 ± 0.0068 |
    | gap to α*: rrs − α*(wr) | -0.1100 ± 0.0000 |
    | kseq − rrs | +0.0328 ± 0.0068 |
    """
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
    """The largest 95% half-width of any paired gap to α* (the default job aims at ≤ 0.01).

    Parameters
    ----------
    pair_rows : list of dict
        Rows of :func:`paired_differences` (only ``kind == "gap"`` rows with a finite half-width count).

    Returns
    -------
    float
        NaN when there is no such row.

    Examples
    --------
    >>> from otbound.report import max_gap_half_width
    >>> rows = [{"kind": "gap", "difference_ci": 0.004}, {"kind": "gap", "difference_ci": 0.007},
    ...         {"kind": "verifiers", "difference_ci": 0.02}, {"kind": "gap", "difference_ci": float("nan")}]
    >>> max_gap_half_width(rows)
    0.007
    >>> max_gap_half_width([])
    nan
    """
    hs = [r["difference_ci"] for r in pair_rows if r["kind"] == "gap" and np.isfinite(r["difference_ci"])]
    return float(max(hs)) if hs else float("nan")


def paired_figure(rows, pair_rows, out, temperature=None):
    """One message: how far each verifier stays below the optimum α* of its own draft law, and how
    that changes with K. One panel per draft law (shared y axis), each verifier's paired gap to α*
    (acceptance − α* on the same positions, 95% error bars, cluster-robust) against K, in its colour
    (:func:`otbound.report.plots.color`) and named at the end of its line; datasets told apart by
    marker. A verifier more than 3× further below the bound than all others (typically nss) is
    named under its panel with its worst gap instead of squashing the rest. One temperature
    (default: the middle one).

    Parameters
    ----------
    rows : list of dict
        Rows of :func:`otbound.report.aggregate` (with an acceptance).
    pair_rows : list of dict
        Rows of :func:`paired_differences` of the same results.
    out : str or pathlib.Path
        Folder the figure is written to, as ``paired_gaps.png``.
    temperature : float, optional
        The temperature shown.

    Returns
    -------
    pathlib.Path
        ``out / "paired_gaps.png"``, written.

    Examples
    --------
    >>> import tempfile
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> from otbound.lm import TraceRecord
    >>> from otbound.report import measure_trace, aggregate, paired_differences, paired_figure
    >>> target = np.log([[0.5, 0.3, 0.2], [0.6, 0.2, 0.2]])
    >>> draft = np.log([[0.2, 0.3, 0.5], [0.3, 0.4, 0.3]])
    >>> records = [TraceRecord(f"p{i}", "demo", 1.0, np.array([1, 0, 2]), 1, t, draft)
    ...            for i, t in enumerate((target, target[::-1]))]
    >>> results = [measure_trace(r, (2,), verifiers=["rrs", "kseq"], samplings=("with_replacement",))
    ...            for r in records]
    >>> pair_rows = paired_differences(results)
    >>> with tempfile.TemporaryDirectory() as out:
    ...     path = paired_figure(aggregate(results), pair_rows, out)
    ...     print(path.name, path.exists())
    paired_gaps.png True
    """

    temps = sorted({r["temperature"] for r in rows})
    t = temps[len(temps) // 2] if temperature is None else temperature
    laws = gap_laws(rows, pair_rows, t)
    fig, axes = plots.figure(ncols=max(1, len(laws)), height=2.8, sharey=True)
    paired_panels(axes[0], rows, pair_rows, t)
    return plots.save(fig, Path(out) / "paired_gaps")[0]


def _law_of(rows):
    """{verifier: its draft law} from the rows (the registry's for a name the rows do not carry)."""
    from otbound.token.verifiers import VERIFIERS

    law = {n: v.sampling for n, v in VERIFIERS.items()}
    law.update({r["verifier"]: r["sampling"] for r in rows if r.get("sampling") and r["verifier"] != "optimal"})
    return law


def gap_laws(rows, pair_rows, t) -> list:
    """The draft laws that have at least one verifier's paired gap at temperature ``t``, in the order
    of :data:`otbound.SAMPLINGS`: the panels of :func:`paired_panels`.

    Examples
    --------
    >>> from otbound.report import gap_laws
    >>> pairs = [dict(kind="gap", a=name, temperature=1.0) for name in ("greedy", "rrs", "rrs_wor")]
    >>> gap_laws([], pairs, 1.0)      # the verifiers' laws from the registry when the rows do not say
    ['with_replacement', 'without_replacement', 'greedy']
    >>> gap_laws([], pairs, 0.7)
    []
    """
    law = _law_of(rows)
    present = {law.get(r["a"]) for r in pair_rows if r["kind"] == "gap" and r["temperature"] == t}
    return [s for s in SAMPLINGS if s in present]


def paired_panels(axes, rows, pair_rows, t) -> list:
    """The panels of :func:`paired_figure` at temperature ``t``, one per law of :func:`gap_laws`,
    drawn into ``axes`` (as many Axes, sharing their y axis); returns the verifier names drawn.

    Parameters
    ----------
    axes : sequence of matplotlib.axes.Axes
        One panel per law of :func:`gap_laws`.
    rows : list of dict
        Rows of :func:`otbound.report.aggregate` (with an acceptance).
    pair_rows : list of dict
        Rows of :func:`paired_differences` of the same results.
    t : float
        The temperature drawn.

    Returns
    -------
    list of str
        The verifiers shown (named on the panels, on the axis or below it).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> import numpy as np
    >>> from otbound.lm import TraceRecord
    >>> from otbound.report import measure_trace, aggregate, paired_differences, paired_panels
    >>> target = np.log([[0.5, 0.3, 0.2], [0.6, 0.2, 0.2]])
    >>> draft = np.log([[0.2, 0.3, 0.5], [0.3, 0.4, 0.3]])
    >>> records = [TraceRecord(f"p{i}", "demo", 1.0, np.array([1, 0, 2]), 1, t, draft)
    ...            for i, t in enumerate((target, target[::-1]))]
    >>> results = [measure_trace(r, (2,), verifiers=["rrs", "kseq"], samplings=("with_replacement",))
    ...            for r in records]
    >>> pair_rows = paired_differences(results)
    >>> fig, axes = plt.subplots(1, 1, squeeze=False)
    >>> paired_panels(axes[0], aggregate(results), pair_rows, 1.0)
    ['kseq', 'rrs']
    >>> axes[0, 0].get_title()
    'with replacement, T = 1'
    >>> plt.close(fig)
    """
    law = _law_of(rows)
    laws = gap_laws(rows, pair_rows, t)
    gaps = [r for r in pair_rows if r["kind"] == "gap" and r["temperature"] == t]
    datasets = list(dict.fromkeys(r["dataset"] for r in gaps))
    ks = sorted({r["num_drafts"] for r in gaps})
    shown, drawn, off = [], {}, {}
    for s in laws:
        mine = [r for r in gaps if law.get(r["a"]) == s]
        names = sorted(dict.fromkeys(r["a"] for r in mine))
        off[s] = _far_below(mine, names)
        drawn[s] = [n for n in names if n not in off[s]]
        shown += names
    on_axis = [r for r in gaps if r["a"] in {n for s in laws for n in drawn[s]}]
    lo = min((r["difference"] - r["difference_ci"] for r in on_axis), default=-0.01)
    hi = max((r["difference"] + r["difference_ci"] for r in on_axis), default=0.0)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    pad = 0.08 * ((hi - lo) or 0.01)
    shift = 0.06 * (ks[-1] - ks[0] if len(ks) > 1 else 1.0)
    for ax, s in zip(axes, laws):
        ends = []
        for n in drawn[s]:
            last = []
            for i, d in enumerate(datasets):
                pts = sorted((r["num_drafts"], r["difference"], r["difference_ci"]) for r in gaps
                             if r["a"] == n and r["dataset"] == d)
                if not pts:
                    continue
                x, y, h = (np.array(v, dtype=float) for v in zip(*pts))
                c = plots.color(n)
                ax.errorbar(x + (i - (len(datasets) - 1) / 2) * shift, y, yerr=h, fmt="-" + plots.marker(i),
                            color=c, mfc=c if i == 0 else "white", capsize=2, linewidth=0.9)
                last.append(y[-1])
            ends.append((n, float(np.mean(last)), plots.color(n)))
        ax.axhline(0.0, color="black", linewidth=0.6)
        plots.integer_ticks(ax, ks)
        ax.set_xlim(ks[0] - 3 * shift, ks[-1] + 3 * shift)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xlabel("number of drafts K")
        ax.set_title(f"{s.replace('_', ' ')}, T = {t:g}")
        plots.label_ends(ax, ends)
        if off[s]:  # a far worse verifier (typically nss) would squash the others onto one line
            worst = ", ".join(f"{n} (down to {min(r['difference'] for r in gaps if r['a'] == n):+.3f})"
                              for n in off[s])
            ax.text(0.02, 0.02, f"off axis: {worst}", transform=ax.transAxes, fontsize=6.5, va="bottom")
    axes[0].set_ylabel("acceptance − α* of its law\n(paired, 95% interval)")
    if len(datasets) > 1:  # datasets by marker: one small legend for the whole figure
        handles = [matplotlib.lines.Line2D([], [], color="0.3", marker=plots.marker(i), linestyle="",
                                           mfc="0.3" if i == 0 else "white") for i in range(len(datasets))]
        axes[0].figure.legend(handles, datasets, loc="outside upper center", ncol=len(datasets), frameon=False)
    return shown


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
    figure path, markdown section).

    Parameters
    ----------
    rows : list of dict
        Rows of :func:`otbound.report.aggregate` (as in ``<out>/rows.json``).
    out : str or pathlib.Path
        The report folder: ``paired.json`` is read from it, ``paired_gaps.png`` written to it.

    Returns
    -------
    max_half_width : float
        :func:`max_gap_half_width` of the stored rows.
    figure : pathlib.Path
        The figure of :func:`paired_figure`.
    markdown : str
        The section: a heading, its legend and :func:`paired_tables`.

    Raises
    ------
    FileNotFoundError
        ``<out>/paired.json`` does not exist.

    Examples
    --------
    >>> import json
    >>> import tempfile
    >>> from pathlib import Path
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np
    >>> from otbound.lm import TraceRecord
    >>> from otbound.report import measure_trace, aggregate, paired_differences, paired_section
    >>> target = np.log([[0.5, 0.3, 0.2], [0.6, 0.2, 0.2]])
    >>> draft = np.log([[0.2, 0.3, 0.5], [0.3, 0.4, 0.3]])
    >>> records = [TraceRecord(f"p{i}", "demo", 1.0, np.array([1, 0, 2]), 1, t, draft)
    ...            for i, t in enumerate((target, target[::-1]))]
    >>> results = [measure_trace(r, (2,), verifiers=["rrs", "kseq"], samplings=("with_replacement",))
    ...            for r in records]
    >>> pair_rows = paired_differences(results)
    >>> with tempfile.TemporaryDirectory() as out:
    ...     _ = Path(out, "paired.json").write_text(json.dumps(pair_rows))
    ...     half, fig, text = paired_section(aggregate(results), out)
    ...     print(round(half, 4), fig.name, text.splitlines()[0])
    0.0068 paired_gaps.png ## Paired comparisons on the same positions
    """
    import json

    pair_rows = json.loads((Path(out) / "paired.json").read_text())
    fig = paired_figure([r for r in rows if r["acceptance"] is not None], pair_rows, out)
    text = ("## Paired comparisons on the same positions\n\nMean per-position difference ± 95% half-width, "
            "cluster-robust over prompts: each verifier's gap to α* of its own law, the laws' α* against each "
            "other, and every two verifiers.\n\n" + paired_tables(pair_rows) + "\n")
    return max_gap_half_width(pair_rows), fig, text
