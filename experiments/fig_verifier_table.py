"""Verifier efficiency on the real pair, in the layout of Hu et al. (2502.18779) Table 1.

For each temperature T and number of drafts K: the optimum α* of each draft law, then each
verifier of that law with its mean acceptance over positions ± 95% CI half width and, in
parentheses, its efficiency = acceptance / α* of its own law (:func:`otbound.report.tables.main_table`).
Columns are the prompt datasets (HumanEval, MT-Bench). Per position (:func:`otbound.report.measure_laws`)
acceptance is exact where the verifier has a closed form (``nss``, ``rrs``, ``kseq``, ``spechub``,
``greedy``, ``ot``, ``ot_wor_top``; ``ot_wor_iid`` at K ≤ 2; ``ot_wor`` at K ≤ 2 and where it
chooses ``ot_wor_top``); the others (``rrs_wor``, ``ot_wor_iid`` and ``ot_wor`` at K ≥ 3) are Monte
Carlo estimates (``mc_samples`` draft tuples per position). ``khisti_is`` (needs the |V|^K
selection law) and ``khisti_lp`` (an LP in |V|²/2 selection weights) refuse this vocabulary and are
reported as not run. Means over positions with 95% intervals cluster-robust over prompts
(:func:`otbound.report.aggregate`). The table notes list the verifiers the stored results hold.

The same results draw the temperature sweep (``fig_temperature_sweep.py``).

Usage: ``python experiments/fig_verifier_table.py [--recompute] [--quick] [--traces DIR] [--out figures/]``;
``--as-stored --traces DIR`` measures every trace under DIR as stored (its prompts, temperatures
and length, no models needed; e.g. a ``python -m otbound.compare`` run's ``traces`` folder) instead
of the figure's own trace set, into ``fig_verifier_table_stored`` (results and figure).
"""

from __future__ import annotations

import sys

import _common
import numpy as np

NAME = "fig_verifier_table"
STORED_NAME = "fig_verifier_table_stored"  # --as-stored: results and figure under this name
LAWS = ("with_replacement", "without_replacement", "greedy")
LAW_SHORT = {"with_replacement": "i.i.d.", "without_replacement": "w/o repl.", "greedy": "greedy"}


def stored_records(args) -> list:
    """Every trace under ``--traces`` as stored (``--as-stored``)."""
    from otbound.lm import load_traces

    if not args.traces:
        raise SystemExit("fig_verifier_table: --as-stored needs --traces DIR")
    return list(load_traces(args.traces))


def params_for(args, records=None) -> dict:
    if records is not None:  # --as-stored: the traces' own prompts, temperatures and length
        return dict(
            traces=str(args.traces),
            datasets=sorted({r.dataset for r in records}),
            prompts=len({(r.dataset, r.prompt_id) for r in records}),
            positions=int(sum(r.positions for r in records)),
            temperatures=sorted({float(r.temperature) for r in records}),
            position_stride=4,
            num_drafts=[2, 4],
            mc_samples=64,
            seed=0,
            measure="otbound.lm.measure_laws + aggregate",
        )
    if args.quick:
        return dict(_common.QUICK_TRACES, temperatures=[0.5, 1.0], position_stride=1, num_drafts=[2, 3], mc_samples=64)
    return dict(
        _common.REAL_TRACES, temperatures=[0.5, 0.75, 1.0, 1.5], position_stride=4, num_drafts=[2, 4], mc_samples=64
    )


#: verifiers measured; ``khisti_is`` and ``khisti_lp`` refuse V = 151,936 (recorded as skipped), but run
#: in quick mode; ``ot`` runs at every V (exact acceptance α*); the optimal verifiers without
#: replacement (``ot_wor_top`` the top-m truncation, ``ot_wor_iid`` the i.i.d. rebuild, ``ot_wor`` the
#: better of the two) pay a coupling per position (tens of ms)
VERIFIER_NAMES = ("nss", "rrs", "kseq", "khisti_is", "khisti_lp", "ot", "rrs_wor", "ot_wor_top", "ot_wor_iid", "ot_wor",
                  "spechub", "greedy")


def compute_for(args, stored=None):
    def compute(params, checkpoint) -> dict:
        records = stored if stored is not None else _common.real_records(args, params)
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
            "source": "synthetic stand-in (quick mode)" if args.quick else (
                f"real pair traces as stored in {args.traces}" if stored is not None else "real pair traces"),
        }

    return compute


def load(args) -> dict:
    stored = stored_records(args) if getattr(args, "as_stored", False) else None
    name = STORED_NAME if stored is not None else NAME
    return _common.load_or_compute(args, name, params_for(args, stored), compute_for(args, stored))


def tables(results) -> str:
    from otbound.report.tables import all_tables

    res = results["results"]
    notes = [
        f"Source: {res['source']}. Token-level acceptance α = P(emitted token ∈ drafts); "
        "cells: mean ± 95% CI half width over",
        "positions (cluster-robust over prompts), (efficiency = acceptance / α* of the verifier's own draft law).",
    ]
    notes += [f"Not run: `{name}` — {why}" for name, why in res["skipped"].items()]
    measured = [n for n in VERIFIER_NAMES if any(r["verifier"] == n for r in res["rows"])]
    notes.append("Verifiers in these results: " + ", ".join(f"`{n}`" for n in measured) + ".")
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
    name = STORED_NAME if "as stored" in results["results"]["source"] else NAME
    return _common.save_real_pair_figure(fig, results, out, name, formats)


def main(argv=None) -> list:
    ap = _common.parser(__doc__.splitlines()[0])
    ap.add_argument("--as-stored", action="store_true",
                    help="measure every trace under --traces as stored, into fig_verifier_table_stored")
    args = ap.parse_args(argv)
    results = load(args)
    return _common.finish(STORED_NAME if args.as_stored else NAME, results, args, draw, tables)


if __name__ == "__main__":
    main(sys.argv[1:])
