"""Verifier efficiency on the real pair, in the layout of Hu et al. (2502.18779) Table 1.

For each temperature T and number of drafts K: the optimum α* of each draft law, then each
verifier of that law with its mean acceptance over positions ± 95% CI half width and, in
parentheses, its efficiency = acceptance / α* of its own law (:func:`otbound.report.tables.main_table`).
Columns are the prompt datasets (HumanEval, MT-Bench). Per position (:func:`otbound.report.measure_laws`)
acceptance is exact where the verifier has a closed form (``nss``, ``rrs``, ``kseq``, ``spechub``,
``greedy``); ``rrs_wor`` has none at V = 151,936, so it is a Monte Carlo estimate (``mc_samples``
draft tuples per position). ``khisti_is`` (needs the |V|^K selection law), ``khisti_lp`` (an LP in
|V|²/2 selection weights) and ``ot`` (needs the V^(K+1) LP plan) refuse this vocabulary and are
reported as not run. Means over positions with 95% intervals cluster-robust over prompts
(:func:`otbound.report.aggregate`).

The same results draw the temperature sweep (``fig_temperature_sweep.py``).

Usage: ``python experiments/fig_verifier_table.py [--recompute] [--quick] [--traces DIR] [--out figures/]``.
"""

from __future__ import annotations

import sys

import _common
import numpy as np

NAME = "fig_verifier_table"
LAWS = ("with_replacement", "without_replacement", "greedy")
LAW_SHORT = {"with_replacement": "i.i.d.", "without_replacement": "w/o repl.", "greedy": "greedy"}


def params_for(args) -> dict:
    if args.quick:
        return dict(_common.QUICK_TRACES, temperatures=[0.5, 1.0], position_stride=1, num_drafts=[2, 3], mc_samples=64)
    return dict(
        _common.REAL_TRACES, temperatures=[0.5, 0.75, 1.0, 1.5], position_stride=4, num_drafts=[2, 4], mc_samples=64
    )


#: verifiers measured; ``khisti_is`` and ``khisti_lp`` refuse V = 151,936 (recorded as skipped), but run
#: in quick mode; ``ot`` runs at every V (exact acceptance α*)
VERIFIER_NAMES = ("nss", "rrs", "kseq", "khisti_is", "khisti_lp", "ot", "rrs_wor", "spechub", "greedy")


def compute_for(args):
    def compute(params, checkpoint) -> dict:
        records = _common.real_records(args, params)
        rows = _common.measure_records(records, params, checkpoint, verifiers=list(VERIFIER_NAMES))
        skipped = {r["verifier"]: r["skipped"] for r in rows if r["method"] == "skipped"}
        order = ("optimal",) + VERIFIER_NAMES
        rows = sorted(
            (r for r in rows if r["method"] != "skipped" and r["sampling"] in LAWS),
            key=lambda r: (
                r["temperature"],
                r["num_drafts"],
                LAWS.index(r["sampling"]),
                order.index(r["verifier"]),
                r["dataset"],
            ),
        )
        return {
            "rows": rows,
            "skipped": skipped,
            "source": "synthetic stand-in (quick mode)" if args.quick else "real pair traces",
        }

    return compute


def load(args) -> dict:
    return _common.load_or_compute(args, NAME, params_for(args), compute_for(args))


def tables(results) -> str:
    from otbound.report.tables import all_tables

    res = results["results"]
    notes = [
        f"Source: {res['source']}. Token-level acceptance α = P(emitted token ∈ drafts); "
        "cells: mean ± 95% CI half width over",
        "positions (cluster-robust over prompts), (efficiency = acceptance / α* of the verifier's own draft law).",
    ]
    notes += [f"Not run: `{name}` — {why}" for name, why in res["skipped"].items()]
    return "\n".join(notes) + "\n\n" + all_tables(res["rows"])


def draw(results, out, formats) -> list:
    """Acceptance of every verifier next to the optimum of its law, one panel per K (T = 1 or nearest)."""
    from otbound.report import plots

    rows = results["results"]["rows"]
    temps = sorted({r["temperature"] for r in rows})
    t = min(temps, key=lambda x: abs(x - 1.0))
    ks = sorted({r["num_drafts"] for r in rows})
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plots.figure(ncols=len(ks), sharey=True, height=2.6)
    for ax, k in zip(axes[0], ks):
        sel = [r for r in rows if r["num_drafts"] == k and r["temperature"] == t]
        names = [(law, v) for law in LAWS for v in dict.fromkeys(r["verifier"] for r in sel if r["sampling"] == law)]
        names.sort(key=lambda lv: (LAWS.index(lv[0]), lv[1] != "optimal"))
        width = 0.8 / len(datasets)
        for j, ds in enumerate(datasets):
            look = {(r["sampling"], r["verifier"]): r for r in sel if r["dataset"] == ds}
            x = np.arange(len(names)) + (j - (len(datasets) - 1) / 2) * width
            acc = [look[n]["acceptance"] if n in look else np.nan for n in names]
            ci = [look[n]["acceptance_ci"] if n in look else 0 for n in names]
            ax.bar(x, acc, width, yerr=ci, label=ds, color=f"C{j}", alpha=0.85, error_kw={"lw": 0.6})
        ax.set_xticks(
            np.arange(len(names)),
            [f"α* ({LAW_SHORT[law]})" if v == "optimal" else v for law, v in names],
            rotation=60,
            ha="right",
        )
        for i, (law, _v) in enumerate(names):
            if i and names[i - 1][0] != law:
                ax.axvline(i - 0.5, color="0.6", lw=0.6)
        ax.set_title(f"K = {k}, T = {t:g}")
    axes[0, 0].set_ylabel("acceptance α (mean over positions)")
    axes[0, 0].legend(frameon=True, loc="lower left", framealpha=0.9)
    return _common.save_real_pair_figure(fig, results, out, NAME, formats)


def main(argv=None) -> list:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    results = load(args)
    return _common.finish(NAME, results, args, draw, tables)


if __name__ == "__main__":
    main(sys.argv[1:])
