"""The full-dataset comparison on the real pair: every HumanEval and MT-Bench prompt, in the layout of Hu et al.
(2502.18779) Table 1, and α* against K with each verifier's paired gap to it.

The run is exactly::

    python -m otbound.compare --datasets humaneval mtbench --num-prompts 164 --max-new-tokens 64 \\
        --temperature 0.7 1.0 --num-drafts 2 3 4 8 --store-logits none --out /work/runs/full

(Qwen2.5-Coder 0.5B drafting for 1.5B, all 164 HumanEval and all 80 MT-Bench prompts, 64 new tokens,
T ∈ {0.7, 1.0}, K ∈ {2, 3, 4, 8}, seed 0, 16 Monte Carlo draft tuples per position where a verifier
has no exact acceptance, default verifier set, model dtype ``auto``). Its rows
(:func:`otbound.report.aggregate`: means over positions, 95% intervals cluster-robust over prompts)
and paired differences (:func:`otbound.report.paired_differences`) are stored with the
configuration and the wall time in ``data/results/fig_real_full.json``; the table (``.md``) and the
figure are drawn from there:

* table: one per draft law; rows = (dataset, T); columns = for each K, α* of the law, then each of
  its verifiers: acceptance ± 95% half width (efficiency = acceptance / α*) and the paired gap to α*
  on the same positions (:func:`otbound.report.tables.paper_tables`); then every paired difference
  between laws and verifiers (:func:`otbound.report.paired_tables`);
* figure: per temperature, α* against K with 95% bands, and each verifier's paired gap to α* on an
  axis zoomed to the data (:func:`otbound.report.paired_panels`).

Usage::

    python experiments/fig_real_full.py                     # table + figure from the stored result
    python experiments/fig_real_full.py --from-run /work/runs/full --wall-time-s 5400
                                                            # store a finished run (no recomputation)
    python experiments/fig_real_full.py --recompute [--run-dir DIR]
                                                            # run it (resumable in DIR, default
                                                            # <otbound cache>/runs/fig_real_full), then store

``--from-run`` reads ``rows.json`` and ``paired.json`` of the run folder and checks them (and the
run's ``report.json`` settings, where present) against the configuration above before storing;
``--wall-time-s`` is the run's wall time in seconds (required with it). With ``--recompute`` the wall
time is measured in this process (a resumed run counts only its last part; the result says so).
``--quick``: the same pipeline on the tiny random pair (no tokenizer: random token ids stand in for
the first two prompts of each dataset), 4 new tokens, K ∈ {2, 3}; for the tests.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import _common

NAME = "fig_real_full"
#: the README's figure: the T = 1 panels of this one (with a JSON sidecar naming what it shows)
MAIN_JOB = "main_job"
COMMAND = ("python -m otbound.compare --datasets humaneval mtbench --num-prompts 164 --max-new-tokens 64 "
           "--temperature 0.7 1.0 --num-drafts 2 3 4 8 --store-logits none --out /work/runs/full")
#: the run's configuration: the command above with compare's defaults filled in
FULL = dict(command=COMMAND, pair=_common.REAL_PAIR, datasets=["humaneval", "mtbench"], num_prompts=164,
            max_new_tokens=64, temperatures=[0.7, 1.0], num_drafts=[2, 3, 4, 8], seed=0, store_logits="none",
            mc_samples=16, verifiers=None, dtype="auto", prompts_per_shard=8)
#: the verifiers that run at V = 151,936 (the rest refuse it); quick mode measures only these
REAL_VERIFIERS = ["nss", "rrs", "kseq", "spechub", "ot", "rrs_wor", "greedy"]
QUICK = dict(FULL, command=None, pair="tiny(V=12)", datasets=["quick-humaneval", "quick-mtbench"], num_prompts=2,
             max_new_tokens=4, num_drafts=[2, 3], verifiers=REAL_VERIFIERS)


def params_for(args) -> dict:
    return dict(QUICK if args.quick else FULL)


def run_dir(args) -> Path:
    if args.run_dir:
        return Path(args.run_dir)
    if args.quick:
        return _common.results_dir(args) / f"{NAME}-run"
    from otbound.lm import cache_root

    return cache_root() / "runs" / NAME


def _quick_datasets(folder: Path, params) -> list[Path]:
    """JSONL prompt files for the tiny pair: the first prompts of each shipped set, with random token
    ids over its 12-token vocabulary in place of a tokenisation (the tiny pair has no tokenizer)."""
    from otbound.lm import load_prompts, tiny_pair, tiny_prompts

    folder.mkdir(parents=True, exist_ok=True)
    n, paths = params["num_prompts"], []
    for i, name in enumerate(params["datasets"]):
        shipped = load_prompts(name.removeprefix("quick-"), n)
        ids = tiny_prompts(tiny_pair(), n, seed=i)
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"id": p.id, "prompt": p.text, "token_ids": t}) + "\n"
                                for p, t in zip(shipped, ids)))
        paths.append(path)
    return paths


def recompute(args, params) -> dict:
    """:func:`otbound.report.run_real_report` with ``params`` into :func:`run_dir` (resumable), timed."""
    from otbound.report import run_real_report

    out = run_dir(args)
    if args.quick:
        from otbound.lm import tiny_pair

        pair, datasets = tiny_pair, _quick_datasets(out / "prompts", params)
    else:
        pair, datasets = params["pair"], params["datasets"]
    resumed = (out / "shards").is_dir() and any((out / "shards").iterdir())
    t0 = time.perf_counter()
    run_real_report(pair, datasets, params["num_prompts"], params["max_new_tokens"], params["temperatures"],
                    params["num_drafts"], out, verifiers=params["verifiers"], mc_samples=params["mc_samples"],
                    seed=params["seed"], store_logits=params["store_logits"], dtype=params["dtype"],
                    device=args.device, prompts_per_shard=params["prompts_per_shard"])
    wall = time.perf_counter() - t0
    how = "measured by --recompute in this process" + (" (resumed: earlier parts not counted)" if resumed else "")
    return import_run(out, params, wall, how, quick=args.quick)


def _expected_prompts(params, quick: bool, folder: Path) -> dict:
    from otbound.lm import load_prompts

    sources = {d: folder / "prompts" / f"{d}.jsonl" if quick else d for d in params["datasets"]}
    return {d: len(load_prompts(src, params["num_prompts"])) for d, src in sources.items()}


def import_run(folder, params, wall_time_s: float, wall_time_source: str, *, quick: bool = False) -> dict:
    """The results of a finished run folder (``rows.json``, ``paired.json``; ``report.json`` if present),
    checked against ``params``: :class:`otbound.InvalidInputError` names the first mismatch."""
    from otbound import InvalidInputError

    folder = Path(folder)
    try:
        rows = json.loads((folder / "rows.json").read_text())
        paired = json.loads((folder / "paired.json").read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"{folder} is not a finished run of otbound.compare / run_real_report: {exc}") from exc
    if not (isinstance(wall_time_s, (int, float)) and wall_time_s > 0):
        raise InvalidInputError(f"the run's wall time must be a positive number of seconds, got {wall_time_s!r}")

    def check(what, got, want):
        if got != want:
            raise InvalidInputError(f"{folder}: {what} is {got!r}, but {NAME} stores the run with {want!r}")

    measured = [r for r in rows if r["acceptance"] is not None]
    check("the datasets", sorted({r["dataset"] for r in rows}), sorted(params["datasets"]))
    check("the temperatures", sorted({r["temperature"] for r in rows}), sorted(params["temperatures"]))
    check("K", sorted({r["num_drafts"] for r in rows}), sorted(params["num_drafts"]))
    check("the prompts per dataset", {d: max(r["prompts"] for r in rows if r["dataset"] == d) for d in
                                      params["datasets"]}, _expected_prompts(params, quick, folder))
    mc = sorted({r["mc_samples"] for r in measured if r["mc_samples"]})
    check("the Monte Carlo draft tuples", mc, [params["mc_samples"]] if mc else [])
    check("the paired cells", sorted({(r["dataset"], r["temperature"], r["num_drafts"]) for r in paired}),
          sorted({(r["dataset"], r["temperature"], r["num_drafts"]) for r in rows}))
    report = folder / "report.json"
    settings = "not checked (no report.json)"
    if report.exists():
        meta = json.loads(report.read_text())["meta"]
        check("the pair", meta.get("pair"), params["pair"])
        check("the prompts per dataset option", meta.get("prompts per dataset"), params["num_prompts"])
        check("the new tokens", meta.get("new tokens"), params["max_new_tokens"])
        check("the seed", meta.get("seed"), params["seed"])
        check("the K option", meta.get("settings", {}).get("num_drafts"), params["num_drafts"])
        check("the temperature option", meta.get("settings", {}).get("temperatures"), params["temperatures"])
        settings = "checked against report.json"
    import torch
    import transformers

    dtypes = sorted({str(r.get("model_dtype")) for r in rows})
    return {
        "source": ("tiny random pair stand-in (quick mode; synthetic, not the real pair)" if quick
                   else f"real pair run, {params['pair']}"),
        "run_folder": str(folder.resolve()),
        "run_settings": settings,
        "wall_time_s": float(wall_time_s),
        "wall_time_source": wall_time_source,
        "prompts": {d: max(r["prompts"] for r in rows if r["dataset"] == d) for d in params["datasets"]},
        "positions": {f"{r['dataset']}, T = {r['temperature']}": r["positions"] for r in rows},
        "model_dtype": dtypes[0] if len(dtypes) == 1 else dtypes,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "rows": rows,
        "paired": paired,
    }


def compute_for(args):
    from otbound import InvalidInputError

    def compute(params, checkpoint) -> dict:
        if args.from_run:
            try:
                return import_run(args.from_run, params, args.wall_time_s, "given with --wall-time-s (the run's own)",
                                  quick=args.quick)
            except InvalidInputError as exc:
                raise SystemExit(f"{NAME}: {exc}") from exc
        if args.recompute or args.quick:
            return recompute(args, params)
        raise _common.MissingResultsError(
            f"{_common.results_dir(args) / (NAME + '.json')} is not stored (or was stored with other settings): "
            f"store the finished run with `python experiments/{NAME}.py --from-run RUN_FOLDER --wall-time-s SECONDS`, "
            "or "
            f"recompute it with --recompute (the Qwen pair, ≈1.5 h on 2 cores; run: {COMMAND})")

    return compute


def load(args) -> dict:
    forced = argparse.Namespace(**dict(vars(args), recompute=args.recompute or bool(args.from_run)))
    return _common.load_or_compute(forced, NAME, params_for(args), compute_for(args))


def _skipped(rows) -> dict:
    """``{verifier: "K = 3, 4: reason"}`` for verifiers that refused some cell."""
    out: dict = {}
    for r in rows:
        if r["acceptance"] is None:
            out.setdefault(r["verifier"], {}).setdefault(r["skipped"], set()).add(r["num_drafts"])
    return {v: "; ".join(f"K = {', '.join(map(str, sorted(ks)))}: {why}" for why, ks in reasons.items())
            for v, reasons in out.items()}


def tables(results) -> str:
    from otbound.report import paired_tables
    from otbound.report.tables import paper_tables

    res, params = results["results"], results["params"]
    wall = res["wall_time_s"]
    notes = [
        f"Source: {res['source']}. " + (f"Command: `{params['command']}`." if params["command"] else ""),
        "",
        f"Prompts: {', '.join(f'{d} {n}' for d, n in res['prompts'].items())}; {params['max_new_tokens']} new tokens; "
        f"T ∈ {{{', '.join(map(str, params['temperatures']))}}}; K ∈ {{{', '.join(map(str, params['num_drafts']))}}}; "
        f"seed {params['seed']}; model dtype {res['model_dtype']}; {params['mc_samples']} Monte Carlo draft tuples "
        f"per position where no exact acceptance exists. Wall time {wall:.0f} s ({wall / 3600:.2f} h; "
        f"{res['wall_time_source']}).",
        "",
        "Token-level acceptance α = P(emitted token ∈ drafts). Cells: mean over positions ± 95% half width "
        "(cluster-robust over prompts); for a verifier, (efficiency = acceptance / α* of its draft law) and the "
        "paired gap to α* on the same positions ± 95% half width. †: Monte Carlo estimate "
        f"({params['mc_samples']} draft tuples per position); every other cell is exact.",
    ]
    notes += [""] + [f"- not run: `{name}` — {why}" for name, why in _skipped(res["rows"]).items()]
    return ("\n".join(notes) + "\n\n" + paper_tables(res["rows"]) + "\n\n## Paired differences on the same "
            "positions\n\n" + paired_tables(res["paired"]))


def draw(results, out, formats) -> list:
    """Each verifier's paired gap to α* of its law against K (:func:`otbound.report.paired_panels`):
    one row of panels (one per draft law) per temperature in ``fig_real_full``, and the T = 1 row
    alone as the README's ``main_job`` figure, with ``main_job.json`` naming the verifiers and laws
    it shows (checked against the package's registries by the tests)."""
    from otbound.report import gap_laws, paired_panels, plots

    rows = [r for r in results["results"]["rows"] if r["acceptance"] is not None]
    paired = results["results"]["paired"]
    temps = sorted({r["temperature"] for r in rows})
    ncols = max(len(gap_laws(rows, paired, t)) for t in temps)
    fig, axes = plots.figure(ncols=ncols, nrows=len(temps), height=2.8, sharey="row")
    for ax_row, t in zip(axes, temps):
        paired_panels(ax_row, rows, paired, t)
    paths = _common.save_real_pair_figure(fig, results, out, NAME, formats)
    t = 1.0 if 1.0 in temps else temps[-1]
    laws = gap_laws(rows, paired, t)
    fig, axes = plots.figure(ncols=len(laws), height=2.8, sharey=True)
    shown = paired_panels(axes[0], rows, paired, t)
    paths += _common.save_real_pair_figure(fig, results, out, MAIN_JOB, ("png",))
    sidecar = Path(out) / f"{MAIN_JOB}.json"
    _common.write_json(sidecar, {
        "figure": f"{MAIN_JOB}.png", "drawn_by": "experiments/fig_real_full.py", "source": results["results"]["source"],
        "results_created": results["meta"]["created"], "command": results["params"]["command"],
        "temperature": t, "draft_laws": laws, "verifiers": shown,
        "prompts": results["results"]["prompts"], "wall_time_s": results["results"]["wall_time_s"]})
    return paths + [sidecar]


def main(argv=None) -> list:
    ap = _common.parser(__doc__.splitlines()[0])
    _common.add_from_run(ap, "rows.json, paired.json")
    ap.add_argument("--run-dir", default=None,
                    help="run folder of --recompute (default: <otbound cache>/runs/fig_real_full; quick: next to "
                         "the results)")
    args = ap.parse_args(argv)
    _common.check_from_run(ap, args)
    results = load(args)
    return _common.finish(NAME, results, args, draw, tables)


if __name__ == "__main__":
    main(sys.argv[1:])
