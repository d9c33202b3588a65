"""Temperature sweep on the real pair: α* of each draft law and each verifier's acceptance against T.

Reads the results of ``fig_verifier_table.py`` (``data/results/fig_verifier_table.json``: every
temperature and K it measured); ``--recompute`` recomputes them (and collects any missing trace).
Temperature T is applied to both models' logits (softmax(logits/T), docs/theory/notation.md) and the
continuations are sampled from the target at the same T.

Usage: ``python experiments/fig_temperature_sweep.py [--recompute] [--quick] [--traces DIR] [--out figures/]``.
"""

from __future__ import annotations

import sys

import _common
import fig_verifier_table
import numpy as np

NAME = "fig_temperature_sweep"
COLORS = {"with_replacement": "C0", "without_replacement": "C1", "greedy": "C2"}
#: verifier -> (line style, marker); the colour is that of its draft law
STYLES = {
    "nss": (":", "x"),
    "rrs": ("--", "s"),
    "kseq": ("-.", "^"),
    "khisti_is": (":", "v"),
    "rrs_wor": ("--", "s"),
    "spechub": ("-.", "d"),
}


def curves(rows, k, dataset=None):
    """{(law, verifier): (temperatures, mean acceptance)} at K = k, pooled over datasets
    (position-weighted) unless one is named."""
    out = {}
    for (law, ver) in dict.fromkeys((r["sampling"], r["verifier"]) for r in rows if r["num_drafts"] == k):
        pts = {}
        for r in rows:
            if (
                r["num_drafts"] == k
                and r["sampling"] == law
                and r["verifier"] == ver
                and dataset in (None, r["dataset"])
            ):
                s, n = pts.get(r["temperature"], (0.0, 0))
                pts[r["temperature"]] = (s + r["acceptance"] * r["positions"], n + r["positions"])
        ts = sorted(pts)
        out[(law, ver)] = (np.array(ts), np.array([pts[t][0] / pts[t][1] for t in ts]))
    return out


def draw(results, out, formats) -> list:
    from otbound.report import plots

    rows = results["results"]["rows"]
    ks = sorted({r["num_drafts"] for r in rows})
    fig, axes = plots.figure(ncols=len(ks), sharey=True, height=2.7)
    for ax, k in zip(axes[0], ks):
        for (law, ver), (t, acc) in curves(rows, k).items():
            if ver == "optimal":
                ax.plot(t, acc, "-o", color=COLORS[law], lw=1.6, label=f"α*, {law.replace('_', ' ')}")
            elif ver not in ("greedy", "ot"):  # greedy and ot reach α* of their law exactly: drawn as the α* line
                ls, marker = STYLES.get(ver, ("--", "."))
                ax.plot(
                    t,
                    acc,
                    linestyle=ls,
                    marker=marker,
                    markerfacecolor="none",
                    color=COLORS[law],
                    lw=0.9,
                    label=f"{ver} ({law.replace('_', ' ')})",
                )
        ax.set_xlabel("temperature T (both models)")
        ax.set_title(f"K = {k} drafts, HumanEval + MT-Bench pooled")
    axes[0, 0].set_ylabel("acceptance α (mean over positions)")
    axes[0, 0].legend(frameon=False, fontsize=5.5, ncol=2)
    return _common.save_real_pair_figure(fig, results, out, NAME, formats)


def table(results) -> str:
    rows = results["results"]["rows"]
    temps = sorted({r["temperature"] for r in rows})
    lines = [
        "| K | law | verifier | " + " | ".join(f"T = {t:g}" for t in temps) + " |",
        "|---|---|---|" + "---|" * len(temps),
    ]
    for k in sorted({r["num_drafts"] for r in rows}):
        for (law, ver), (t, acc) in curves(rows, k).items():
            vals = dict(zip(t.tolist(), acc.tolist()))
            lines.append(
                f"| {k} | {law} | {ver} | " + " | ".join(f"{vals[x]:.4f}" if x in vals else "—" for x in temps) + " |"
            )
    return "\n".join(lines)


def main(argv=None) -> list:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    results = fig_verifier_table.load(args)
    return _common.finish(NAME, results, args, draw, table)


if __name__ == "__main__":
    main(sys.argv[1:])
