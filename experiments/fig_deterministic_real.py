"""Deterministic against sampled drafts on the real pair, token level: at the same K, α* of drafting
the top K deterministically (what vLLM, EAGLE and SGLang do by default) against α* of K i.i.d. drafts,
K drafts without replacement and greedy drafts, each with its best lossless verifier, with and
without the truncation instruct models are served with (top-p 0.8, top-k 20).

The positions are those of one run of the main job on the full prompt sets, collected with its
logits stored::

    python -m otbound.compare --datasets humaneval mtbench --num-prompts 80 --max-new-tokens 16 \\
        --temperature 0.7 1.0 --num-drafts 2 3 4 --verifiers VERIFIERS --out /work/runs/det-plain

(Qwen2.5-Coder 0.5B drafting for 1.5B, the first 80 of the 164 HumanEval prompts and all 80 MT-Bench
prompts, 16 new tokens
sampled by the target at T, seed 0, float16 logits stored, ``VERIFIERS`` as :data:`VERIFIERS`
below). The untruncated setting is that run's own measurement (read back from its cache,
``<run>/measure``); the truncated one re-measures the same stored logits under
``SamplingParams(T, top_k=20, top_p=0.8)`` for both models (:func:`otbound.lm.load_traces` with
``target_settings`` / ``draft_settings``): the laws at every position are exactly the truncated
ones, the positions stay those the untruncated target sampled. Where the truncated draft keeps
fewer than K tokens the laws of distinct tokens draft its whole support (measured at K' = support,
:func:`otbound.report.measure_laws`); the table gives the count.

Stored in ``data/results/fig_deterministic_real.json`` (rows of :func:`otbound.report.aggregate`,
the paired differences of :func:`otbound.report.paired_differences` that involve a law's α* or a
deterministic verifier, per setting); the table (``.md``) and the figure (α* against K per law,
95% bands, one panel per setting and dataset) are drawn from there.

Usage::

    python experiments/fig_deterministic_real.py                       # from the stored result
    python experiments/fig_deterministic_real.py --from-run /work/runs/det-plain --wall-time-s S
    python experiments/fig_deterministic_real.py --quick               # tiny random pair (tests)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import _common

NAME = "fig_deterministic_real"
#: the default measurement set plus ot_wor_iid, the best verifier without replacement at full vocabulary
VERIFIERS = ["nss", "rrs", "rrs_wor", "kseq", "spechub", "greedy", "khisti_is", "khisti_lp", "ot", "onehot",
             "nss_deterministic", "ot_wor_iid"]
COMMAND = ("python -m otbound.compare --datasets humaneval mtbench --num-prompts 80 --max-new-tokens 16 "
           "--temperature 0.7 1.0 --num-drafts 2 3 4 --verifiers " + " ".join(VERIFIERS)
           + " --out /work/runs/det-plain")
SETTINGS = {"untruncated": {}, "top-p 0.8, top-k 20": {"top_p": 0.8, "top_k": 20}}
FULL = dict(command=COMMAND, pair=_common.REAL_PAIR, datasets=["humaneval", "mtbench"], num_prompts=80,
            max_new_tokens=16, temperatures=[0.7, 1.0], num_drafts=[2, 3, 4], seed=0, mc_samples=16,
            verifiers=VERIFIERS, settings=SETTINGS)
QUICK = dict(FULL, command=None, pair="tiny(V=12)", datasets=["quick-humaneval", "quick-mtbench"], num_prompts=2,
             max_new_tokens=4, num_drafts=[2, 3], settings={"untruncated": {}, "top-p 0.8, top-k 20": {
                 "top_p": 0.8, "top_k": 20}})
LAWS = ("deterministic", "without_replacement", "with_replacement", "greedy")
SHORT = {"deterministic": "det", "without_replacement": "wor", "with_replacement": "wr", "greedy": "greedy"}
#: a law's α* as named in the paired differences (otbound.report.paired_differences)
PAIRED = {"deterministic": "α*(deterministic)", "without_replacement": "α*(wor)", "with_replacement": "α*(wr)",
          "greedy": "α*(greedy)"}


def params_for(args) -> dict:
    return dict(QUICK if args.quick else FULL)


def _quick_run(args, params) -> Path:
    """A run folder of the tiny random pair (float32 logits stored), as the full mode's run."""
    import fig_real_full

    from otbound.lm import tiny_pair
    from otbound.report import run_real_report

    out = _common.results_dir(args) / f"{NAME}-run"
    datasets = fig_real_full._quick_datasets(out / "prompts", params)
    run_real_report(tiny_pair, datasets, params["num_prompts"], params["max_new_tokens"], params["temperatures"],
                    params["num_drafts"], out, verifiers=params["verifiers"], mc_samples=params["mc_samples"],
                    seed=params["seed"], store_logits="float32", progress=False)
    return out


def _keep_pair(row) -> bool:
    """The paired differences stored: between laws' α*, each verifier's gap, and every difference
    that involves a deterministic verifier."""
    det = {"onehot", "nss_deterministic"}
    return row["kind"] in ("laws", "gap") or bool({row["a"], row["b"]} & det)


def _prompt_ids(run: Path, params) -> dict:
    """``{dataset: ids of its first num_prompts prompts}``: the run's prompts (a folder may hold more traces)."""
    from otbound.lm import load_prompts

    out = {}
    for d in params["datasets"]:
        quick = run / "prompts" / f"{d}.jsonl"  # quick mode: the tiny pair's JSONL stand-ins
        out[d] = {p.id for p in load_prompts(quick if quick.exists() else d, params["num_prompts"])}
    return out


def measure_setting(run: Path, params, settings: dict, label: str) -> dict:
    """Rows and paired differences of one sampling setting over the run's stored traces."""
    from otbound import SamplingParams
    from otbound.lm import load_traces
    from otbound.report import aggregate, measure_trace, paired_differences

    results = []  # resumable through the measurement cache of the run (<run>/measure, keyed by content)
    prompt_ids = _prompt_ids(run, params)
    for t in params["temperatures"]:
        kw = {}
        if settings:
            sp = SamplingParams(temperature=t, **settings)
            kw = dict(target_settings=sp, draft_settings=sp)
        records = [r for r in load_traces(run / "traces", temperature=t, **kw) if r.prompt_id in prompt_ids[r.dataset]]
        for i, record in enumerate(records):
            results.append(measure_trace(record, params["num_drafts"], verifiers=params["verifiers"],
                                         mc_samples=params["mc_samples"], seed=params["seed"],
                                         cache_dir=run / "measure"))
            if i % 20 == 0:
                _common.log(f"{NAME}: {label}, T = {t}: {i + 1}/{len(records)} traces")
    rows = aggregate(results)
    paired = [r for r in paired_differences(results) if _keep_pair(r)]
    return {"rows": rows, "paired": paired}


def compute_for(args):
    from otbound import InvalidInputError

    def compute(params, checkpoint) -> dict:
        if args.quick:
            run, wall, how = _quick_run(args, params), None, "quick mode"
        elif args.from_run:
            run, wall = Path(args.from_run), args.wall_time_s
            how = "given with --wall-time-s (the collection run's own)"
            if not (run / "traces").is_dir():
                raise SystemExit(f"{NAME}: {run} has no traces/ folder (a run of otbound.compare with stored logits)")
        else:
            raise _common.MissingResultsError(
                f"{_common.results_dir(args) / (NAME + '.json')} is not stored (or was stored with other settings): "
                f"collect the run ({COMMAND}), then `python experiments/{NAME}.py --from-run RUN --wall-time-s S`")
        t0 = time.process_time()
        try:
            out = {label: measure_setting(run, params, s, label) for label, s in params["settings"].items()}
        except InvalidInputError as exc:
            raise SystemExit(f"{NAME}: {exc}") from exc
        return {"source": ("tiny random pair stand-in (quick mode; synthetic, not the real pair)" if args.quick
                           else f"real pair run, {params['pair']}"),
                "run_folder": str(run.resolve()), "collection_wall_time_s": wall, "wall_time_source": how,
                "measure_cpu_s": time.process_time() - t0, "settings": out}

    return compute


def load(args) -> dict:
    import argparse

    forced = argparse.Namespace(**dict(vars(args), recompute=args.recompute or bool(args.from_run)))
    return _common.load_or_compute(forced, NAME, params_for(args), compute_for(args))


def _row(rows, dataset, t, k, verifier, law=None):
    for r in rows:
        if (r["dataset"], r["temperature"], r["num_drafts"], r["verifier"]) == (dataset, t, k, verifier) and (
                law is None or r["sampling"] == law) and r["acceptance"] is not None:
            return r
    return None


def best_verifiers(rows, dataset, t, k) -> dict:
    """``{law: row}``: the lossless verifier of largest mean acceptance for each law."""
    out = {}
    for r in rows:
        if (r["dataset"], r["temperature"], r["num_drafts"]) != (dataset, t, k) or r["verifier"] == "optimal":
            continue
        if r["acceptance"] is None or not r.get("lossless"):
            continue
        law = r["sampling"]
        if law not in out or r["acceptance"] > out[law]["acceptance"]:
            out[law] = r
    return out


def _pair(paired, dataset, t, k, a, b):
    for r in paired:
        if (r["dataset"], r["temperature"], r["num_drafts"]) == (dataset, t, k) and {r["a"], r["b"]} == {a, b}:
            sign = 1 if r["a"] == a else -1
            return sign * r["difference"], r["difference_ci"]
    return None


def tables(results) -> str:
    res, params = results["results"], results["params"]
    f = "{:.4f} ± {:.4f}".format
    lines = [f"Source: {res['source']}. " + (f"Collection: `{params['command']}`." if params["command"] else ""),
             "",
             f"Prompts: {', '.join(params['datasets'])} ({params['num_prompts']} per dataset at most); "
             f"{params['max_new_tokens']} new tokens; seed {params['seed']}; {params['mc_samples']} Monte Carlo "
             "draft tuples per position where no exact acceptance exists (RRS without replacement at K ≥ 3). "
             "Mean over positions ± 95% half width, cluster-robust over prompts. Best verifier: the lossless "
             "verifier of largest mean acceptance for the law (efficiency = its acceptance / α*).", ""]
    for label, data in res["settings"].items():
        rows, paired = data["rows"], data["paired"]
        lines += [f"## {label}", "",
                  "| dataset | T | K | α*(det) | α*(wor) | α*(wr) | α*(greedy) | best det | best wor | best wr | "
                  "best greedy | capped |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        cells = sorted({(r["dataset"], r["temperature"], r["num_drafts"]) for r in rows})
        for d, t, k in cells:
            opt = {law: _row(rows, d, t, k, "optimal", law) for law in LAWS}
            best = best_verifiers(rows, d, t, k)
            cap = max((r.get("capped_positions") or 0) for r in opt.values() if r)
            cols = [f(opt[law]["acceptance"], opt[law]["acceptance_ci"]) if opt[law] else "—" for law in LAWS]
            cols += [f"{best[law]['verifier']} {best[law]['acceptance']:.4f} ({100 * best[law]['efficiency']:.1f}%)"
                     if law in best else "—" for law in LAWS]
            n = opt["deterministic"]["positions"] if opt["deterministic"] else 0
            lines.append(f"| {d} | {t:g} | {k} | " + " | ".join(cols) + f" | {cap} of {n} |")
        lines += ["", "Paired differences on the same positions (± 95% half width):", "",
                  "| dataset | T | K | α*(det) − α*(wor) | α*(det) − α*(wr) | α*(det) − α*(greedy) | "
                  "best det − best wor |", "|---|---|---|---|---|---|---|"]
        for d, t, k in cells:
            cols = []
            for other in ("without_replacement", "with_replacement", "greedy"):
                got = _pair(paired, d, t, k, PAIRED["deterministic"], PAIRED[other])
                cols.append(f(*got) if got else "—")
            best = best_verifiers(rows, d, t, k)
            got = None
            if "deterministic" in best and "without_replacement" in best:
                got = _pair(paired, d, t, k, best["deterministic"]["verifier"], best["without_replacement"]["verifier"])
            cols.append(f(*got) if got else "—")
            lines.append(f"| {d} | {t:g} | {k} | " + " | ".join(cols) + " |")
        lines.append("")
    return "\n".join(lines)


def draw(results, out, formats) -> list:
    """Per (setting, dataset) panel: the paired difference α*(law) − α*(det) against K for each sampled
    law, with its 95% band (both T); above zero, the sampled drafts accept more."""
    from otbound.report import plots

    res = results["results"]
    labels = list(res["settings"])
    datasets = sorted({r["dataset"] for data in res["settings"].values() for r in data["rows"]})
    fig, axes = plots.figure(ncols=len(datasets), nrows=len(labels), height=2.6)
    axes = [[a] for a in axes] if len(datasets) == 1 else axes
    for row_axes, label in zip(axes, labels):
        paired = res["settings"][label]["paired"]
        temps = sorted({r["temperature"] for r in paired})
        ks = sorted({r["num_drafts"] for r in paired})
        for ax, d in zip(row_axes, datasets):
            for law in LAWS[1:]:
                for t, style in zip(temps, ("--", "-")):
                    got = [_pair(paired, d, t, k, PAIRED[law], PAIRED["deterministic"]) for k in ks]
                    if any(g is None for g in got):
                        continue
                    m, h = [g[0] for g in got], [g[1] for g in got]
                    line, = ax.plot(ks, m, style, marker="o", ms=3, label=f"{SHORT[law]} − det, T={t:g}")
                    ax.fill_between(ks, [a - b for a, b in zip(m, h)], [a + b for a, b in zip(m, h)],
                                    color=line.get_color(), alpha=0.15)
            ax.axhline(0.0, color="black", lw=0.6)
            ax.set_xticks(ks)
            ax.set_title(f"{d}, {label}", fontsize=7)
            ax.set_xlabel("K")
            ax.set_ylabel("α*(law) − α*(det)")
    axes[0][-1].legend(fontsize=5, ncol=2)
    return _common.save_real_pair_figure(fig, results, out, NAME, formats)


def main(argv=None) -> list:
    ap = _common.parser(__doc__.splitlines()[0])
    _common.add_from_run(ap, "traces with stored logits")
    args = ap.parse_args(argv)
    _common.check_from_run(ap, args)
    results = load(args)
    return _common.finish(NAME, results, args, draw, tables)


if __name__ == "__main__":
    main(sys.argv[1:])
