"""Two versions of ``otbound.report.measure_laws(P, Q, (2, 3, 4))`` in one process: this checkout's
and another checkout's (``--against PATH``, e.g. a ``git worktree`` of an earlier commit), called
alternately on the row families of ``experiments/bench_engine.py`` (16 rows at V = 151,936).

Separate benchmark runs on a shared machine drift by ±20% between runs; calls alternated within one
process see the same machine. Per family it prints the median CPU time per position of each
version and the median (and quartiles) of the per-pair ratio this / other, and checks that both
give the same values: the largest difference of any α\\* or acceptance (the Monte Carlo included,
same seed), which must be at most ``--tol`` (default 1e-12; exit 1 otherwise).

Both packages are imported under the name ``otbound``: each version's modules are kept apart and
put back in ``sys.modules`` before each of its calls (functions resolve their globals in their own
modules).

``--call wor_sorted`` times α\\* without replacement at K = 3, 4 alone instead (``measure_laws``'
largest share), as ``bench_engine.py --profile`` does: each call on a fresh
:class:`otbound.token.LawBatch` whose rows are already sorted by ratio (untimed), so that the rows'
runs and the search are timed, values compared the same way.

    python experiments/bench_versions.py --against ../otbound-before     # ~3 min
    python experiments/bench_versions.py --against ../otbound-before --call wor_sorted
    python experiments/bench_versions.py --against . --quick              # tiny, for the tests
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from bench_engine import FAMILIES, KS, LM_VOCAB, rows


def _own(name: str) -> bool:
    return name == "otbound" or name.startswith("otbound.")


def _drop():
    for name in [k for k in sys.modules if _own(k)]:
        del sys.modules[name]


def _load(repo: Path):
    """``(otbound, otbound.report, modules)`` imported from ``repo``, its modules removed from
    ``sys.modules`` afterwards (so that the next version imports its own). The one loader of the
    version benchmarks (this script and ``bench_public.py``)."""
    _drop()
    sys.path.insert(0, str(repo))
    try:
        import otbound
        import otbound.report as report
    finally:
        sys.path.remove(str(repo))
    if not Path(otbound.__file__).resolve().is_relative_to(repo):
        raise SystemExit(f"otbound imported from {otbound.__file__}, not from {repo}")
    modules = {k: v for k, v in sys.modules.items() if _own(k)}
    _drop()
    return otbound, report, modules


def _values(res: dict) -> np.ndarray:
    """Every α* and acceptance of a ``measure_laws`` result, in a fixed order."""
    out = [res["optimal"][s][k] for s in sorted(res["optimal"]) for k in sorted(res["optimal"][s])]
    out += [res["verifiers"][n][k]["acceptance"] for n in sorted(res["verifiers"]) for k in sorted(res["verifiers"][n])]
    return np.array(out, dtype=np.float64)


def _largest_difference(a: np.ndarray, b: np.ndarray) -> float:
    """max |a − b| (0 where equal, infinities and NaN included; inf where the shapes or NaNs differ)."""
    if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
        return math.inf
    with np.errstate(invalid="ignore"):
        d = np.where((a == b) | np.isnan(a), 0.0, np.abs(a - b))
    return float(d.max()) if d.size else 0.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", required=True, help="the other checkout (a folder holding otbound/)")
    ap.add_argument("--pairs", type=int, default=10, help="alternated pairs of calls per family")
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--tol", type=float, default=1e-12, help="largest allowed difference of a value")
    ap.add_argument("--quick", action="store_true", help="V = 2,000, 4 rows, 2 pairs (for the tests)")
    ap.add_argument("--call", choices=("measure_laws", "wor_sorted"), default="measure_laws",
                    help="what is timed: measure_laws(P, Q, (2, 3, 4)), or alpha* without replacement at K = 3, 4 "
                         "on the sorted rows")
    args = ap.parse_args(argv)
    here, other = Path(__file__).resolve().parents[1], Path(args.against).resolve()
    if not (other / "otbound" / "__init__.py").is_file():
        ap.exit(2, f"bench_versions: no otbound/ package in {other}\n")
    import torch

    before = {k: v for k, v in sys.modules.items() if _own(k)}  # the caller's otbound, put back at the end
    try:
        versions = {"this": _load(here), "other": _load(other)}
        return _compare(versions, args, torch)
    finally:
        _drop()
        sys.modules.update(before)


def _compare(versions, args, torch):
    """The alternated calls and the value check of :func:`main`."""
    sys.modules.update(versions["this"][2])
    sys.modules["otbound"].retain_freed_memory()
    vocab, n, pairs = (LM_VOCAB, 16, args.pairs) if not args.quick else (2_000, 4, 2)

    def call(name, p, q):
        _, report, modules = versions[name]
        sys.modules.update(modules)
        if args.call == "wor_sorted":
            batch = modules["otbound.token"].LawBatch(p, q)
            _ = batch.sorted  # the shared sort, not timed
            t0 = time.process_time()
            res = np.concatenate([batch.optimal_acceptance(k, "without_replacement").numpy() for k in (3, 4)])
            return time.process_time() - t0, res
        fn = report.measure_laws
        t0 = time.process_time()
        res = fn(p, q, KS)
        return time.process_time() - t0, res

    out, worst = {}, 0.0
    for fam in args.families:
        p, q = (torch.from_numpy(x) for x in rows(fam, n, vocab))
        (_, a), (_, b) = call("this", p, q), call("other", p, q)  # warm-up, and the values
        values = (lambda res: res) if args.call == "wor_sorted" else _values  # α*, or every value reported
        diff = _largest_difference(values(a), values(b))
        worst = max(worst, diff)
        times = {"this": [], "other": []}
        for i in range(pairs):
            for name in (("this", "other") if i % 2 == 0 else ("other", "this")):
                times[name].append(call(name, p, q)[0])
        ratio = [t / o for t, o in zip(times["this"], times["other"])]
        r = out[fam] = {"this_ms": 1e3 * statistics.median(times["this"]) / n,
                        "other_ms": 1e3 * statistics.median(times["other"]) / n,
                        "ratio": statistics.median(ratio), "ratio_q1": float(np.quantile(ratio, 0.25)),
                        "ratio_q3": float(np.quantile(ratio, 0.75)), "max_diff": diff,
                        "values": values(a).tolist()}  # this version's values (wor_sorted: K = 3 rows, then K = 4)
        print(f"{fam:10s} V={vocab}: this {r['this_ms']:.1f} ms/position, other {r['other_ms']:.1f} | this/other "
              f"{r['ratio']:.3f} (quartiles {r['ratio_q1']:.3f}-{r['ratio_q3']:.3f}) | largest value difference "
              f"{diff:.1e}", flush=True)
    out["max_diff"], out["tol"] = worst, args.tol
    return out


if __name__ == "__main__":
    res = main()
    sys.exit(0 if res["max_diff"] <= res["tol"] else 1)
