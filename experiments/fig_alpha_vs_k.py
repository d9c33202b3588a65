"""α* against K for the three draft laws on the real pair (Qwen2.5-Coder 0.5B drafting for 1.5B).

Traces (:func:`otbound.lm.collect_traces`): continuations sampled from the target at temperature T
on HumanEval and MT-Bench prompts; at every ``position_stride``-th position the laws p (target) and
q (draft) over the full vocabulary (V = 151,936), softmax(logits / T) in float64. Each cell is the
mean over positions of the exact α* (:func:`otbound.optimal_acceptance`) of that law, with its
95% interval cluster-robust over prompts (:func:`otbound.report.measure_laws`, :func:`otbound.report.aggregate`).

Usage: ``python experiments/fig_alpha_vs_k.py [--recompute] [--quick] [--traces DIR] [--out figures/]``
(``--recompute`` collects any missing trace with the real pair first; ``--quick`` uses a synthetic
V = 64 stand-in so that it runs offline in the tests).
"""

from __future__ import annotations

import sys

import _common
import numpy as np

NAME = "fig_alpha_vs_k"
LAWS = ("with_replacement", "without_replacement", "greedy")


def compute_for(args):
    def compute(params, checkpoint) -> dict:
        records = _common.real_records(args, params)
        rows = _common.measure_records(records, params, checkpoint, verifiers=[])
        cells = [
            dict(
                dataset=r["dataset"],
                temperature=r["temperature"],
                sampling=r["sampling"],
                num_drafts=r["num_drafts"],
                mean=r["acceptance"],
                ci=r["acceptance_ci"],
                positions=r["positions"],
                prompts=r["prompts"],
            )
            for r in rows
            if r["verifier"] == "optimal" and r["sampling"] in LAWS  # the figure's three random laws
        ]
        cells.sort(key=lambda c: (c["dataset"], c["temperature"], LAWS.index(c["sampling"]), c["num_drafts"]))
        return {"cells": cells, "source": "synthetic stand-in (quick mode)" if args.quick else "real pair traces"}

    return compute


def draw(results, out, formats) -> list:
    from otbound.report import plots

    cells = results["results"]["cells"]
    temps = sorted({c["temperature"] for c in cells})
    datasets = list(dict.fromkeys(c["dataset"] for c in cells))
    fig, axes = plots.figure(ncols=len(temps), sharey=True, height=2.5)
    colors = {"with_replacement": "C0", "without_replacement": "C1", "greedy": "C2"}
    styles = ["-o", "--s", ":^", "-.v"]
    for ax, t in zip(axes[0], temps):
        for law in LAWS:
            for ds, st in zip(datasets, styles):
                pts = sorted(
                    (c["num_drafts"], c["mean"], c["ci"])
                    for c in cells
                    if c["temperature"] == t and c["sampling"] == law and c["dataset"] == ds
                )
                if pts:
                    k, m, ci = map(np.array, zip(*pts))
                    ax.plot(k, m, st, color=colors[law], label=f"{law.replace('_', ' ')}, {ds}")
                    ax.fill_between(k, m - ci, m + ci, color=colors[law], alpha=0.15, lw=0)
        ax.set_title(f"T = {t:g}")
        ax.set_xticks(sorted({c["num_drafts"] for c in cells}))
        ax.set_xlabel("number of drafts K")
    axes[0, 0].set_ylabel("optimal acceptance α* (mean over positions)")
    axes[0, 0].legend(frameon=False, fontsize=5.5)
    return _common.save_real_pair_figure(fig, results, out, NAME, formats)


def table(results) -> str:
    cells = results["results"]["cells"]
    ks = sorted({c["num_drafts"] for c in cells})
    lines = [
        "| dataset | T | law | " + " | ".join(f"K = {k}" for k in ks) + " | positions |",
        "|---|---|---|" + "---|" * (len(ks) + 1),
    ]
    keys = dict.fromkeys((c["dataset"], c["temperature"], c["sampling"]) for c in cells)
    for ds, t, law in keys:
        row = {c["num_drafts"]: c for c in cells if (c["dataset"], c["temperature"], c["sampling"]) == (ds, t, law)}
        vals = [f"{row[k]['mean']:.4f} ± {row[k]['ci']:.4f}" if k in row else "—" for k in ks]
        lines.append(f"| {ds} | {t:g} | {law} | " + " | ".join(vals) + f" | {next(iter(row.values()))['positions']} |")
    return "\n".join(lines)


def main(argv=None) -> list:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    if args.quick:
        params = dict(_common.QUICK_TRACES, temperatures=[0.5, 1.0], position_stride=1, num_drafts=[1, 2, 4])
    else:
        params = dict(
            _common.REAL_TRACES, temperatures=[0.5, 1.0, 1.5], position_stride=4, num_drafts=[1, 2, 3, 4, 6, 8]
        )
    results = _common.load_or_compute(args, NAME, params, compute_for(args))
    return _common.finish(NAME, results, args, draw, table)


if __name__ == "__main__":
    main(sys.argv[1:])
