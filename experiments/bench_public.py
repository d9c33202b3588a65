"""The public single call ``otbound.optimal_acceptance(p, q, K, sampling)`` of this checkout against
another checkout's (``--against PATH``, e.g. ``git worktree add /tmp/base a6e5102``), in one process,
called alternately row by row, each time beside one ``np.sort`` of the same row's ratios p/q.

Per row family of ``experiments/bench_engine.py`` (``--vocab`` 151,936 by default; ``--small``
runs V = 2, 10, 100, 1,000 instead, where the per-call overhead dominates), per draft law and K,
it prints the median CPU time per call of each version, each as a multiple of the median
``np.sort`` of a row (the same rows, the same process), the median of the per-call ratio
this / other, and the largest difference of the two versions' values (exit 1 above ``--tol``,
default 1e-12). ``--measure`` also times ``otbound.report.measure_laws(P, Q)`` with its default set
on the whole batch (per position, against the np.sort of a row) and prints the largest difference
of the exact values both versions report (α* and the verifiers measured exactly; Monte Carlo
estimates left out), without failing on it: at ``a6e5102`` the with-replacement α* of ``ties``
rows reads up to 1.1e-11 away (its sequential prefix sums; this checkout's are within 1e-14 of a
long-double reference).

Separate runs on a shared machine drift by ±20%; calls alternated within one process see the same
machine (the technique of ``experiments/bench_versions.py``, whose loader this reuses). A law the
other checkout lacks is timed for this checkout alone.

    OMP_NUM_THREADS=1 python experiments/bench_public.py --against /tmp/base              # ~3 min
    OMP_NUM_THREADS=1 python experiments/bench_public.py --against /tmp/base --small
    python experiments/bench_public.py --against . --quick                                # tiny
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from bench_engine import FAMILIES, KS, LM_VOCAB, rows
from bench_versions import _drop, _largest_difference, _load, _own

CALLS = (("with_replacement", 2), ("with_replacement", 4), ("without_replacement", 2),
         ("without_replacement", 4), ("greedy", 2), ("greedy", 4), ("deterministic", 2), ("deterministic", 4))
SMALL_VOCABS = (2, 10, 100, 1_000)


def _timed(fn, *args):
    t0 = time.process_time()
    out = fn(*args)
    return time.process_time() - t0, out


def _sort_row(r):
    return np.sort(r)


def compare(versions, p, q, law, k, repeats):
    """Alternated single calls on every row of (p, q) (B, V): medians and the value check."""
    have = {name for name, (ob, _, _) in versions.items() if law in ob.DRAFT_LAWS}
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, p / q, np.inf)
    times = {name: [] for name in versions}
    t_sort, ratios, vals = [], [], {name: [] for name in versions}
    for i in range(p.shape[0]):
        for name in have:  # warm-up, and the values
            ob, _, modules = versions[name]
            sys.modules.update(modules)
            vals[name].append(ob.optimal_acceptance(p[i], q[i], k, law))
        for j in range(repeats):
            t_sort.append(_timed(_sort_row, ratio[i])[0])
            pair = {}
            for name in (("this", "other") if (i + j) % 2 == 0 else ("other", "this")):
                if name in have:
                    ob, _, modules = versions[name]
                    sys.modules.update(modules)
                    pair[name] = _timed(ob.optimal_acceptance, p[i], q[i], k, law)[0]
                    times[name].append(pair[name])
            if len(pair) == 2:
                ratios.append(pair["this"] / pair["other"])
    sort = statistics.median(t_sort)
    out = {"sort_us": 1e6 * sort, "this_us": 1e6 * statistics.median(times["this"])}
    out["this_x_sort"] = out["this_us"] / out["sort_us"]
    if len(have) == 2:
        out["other_us"] = 1e6 * statistics.median(times["other"])
        out["other_x_sort"] = out["other_us"] / out["sort_us"]
        out["ratio"] = statistics.median(ratios)
        out["max_diff"] = _largest_difference(np.array(vals["this"]), np.array(vals["other"]))
    return out


def _exact_measurements(res) -> dict:
    """The exact values of a ``measure_laws`` result: α* per (law, K) and each verifier's acceptance
    per K where its method is "exact" (Monte Carlo estimates left out: their paths may differ)."""
    out = {("optimal", s, k): v for s, d in res["optimal"].items() for k, v in d.items()}
    out.update({("verifier", n, k): e["acceptance"] for n, d in res["verifiers"].items() for k, e in d.items()
                if e["method"] == "exact"})
    return out


def compare_measure(versions, p, q, repeats):
    """``measure_laws(P, Q)`` with its default set, alternated, per position; np.sort of a row; the
    largest difference of the exact values both versions report."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, p / q, np.inf)
    times = {name: [] for name in versions}
    t_sort, ratios = [], []
    exact = {}
    for name in versions:  # warm-up
        _, report, modules = versions[name]
        sys.modules.update(modules)
        exact[name] = _exact_measurements(report.measure_laws(p, q))
    shared = exact["this"].keys() & exact["other"].keys()
    diff = max((_largest_difference(np.array(exact["this"][key]), np.array(exact["other"][key])) for key in shared),
               default=0.0)
    for j in range(repeats):
        t_sort.append(_timed(lambda: [np.sort(r) for r in ratio])[0] / p.shape[0])
        pair = {}
        for name in (("this", "other") if j % 2 == 0 else ("other", "this")):
            _, report, modules = versions[name]
            sys.modules.update(modules)
            pair[name] = _timed(report.measure_laws, p, q)[0] / p.shape[0]
            times[name].append(pair[name])
        ratios.append(pair["this"] / pair["other"])
    sort = statistics.median(t_sort)
    this, other = statistics.median(times["this"]), statistics.median(times["other"])
    return {"sort_us": 1e6 * sort, "this_us": 1e6 * this, "this_x_sort": this / sort, "other_us": 1e6 * other,
            "other_x_sort": other / sort, "ratio": statistics.median(ratios), "max_diff": diff, "compared": len(shared)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", required=True, help="the other checkout (a folder holding otbound/)")
    ap.add_argument("--rows", type=int, default=16, help="rows per family (one call each per repeat)")
    ap.add_argument("--repeats", type=int, default=3, help="alternated pairs of calls per row")
    ap.add_argument("--vocab", type=int, default=LM_VOCAB)
    ap.add_argument("--small", action="store_true", help=f"V = {SMALL_VOCABS} instead of --vocab")
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--calls", nargs="+", default=[f"{s}:{k}" for s, k in CALLS], help="law:K pairs")
    ap.add_argument("--measure", action="store_true", help="also measure_laws on the batch")
    ap.add_argument("--tol", type=float, default=1e-12, help="largest allowed difference of a value")
    ap.add_argument("--quick", action="store_true", help="V = 200, 2 rows, 1 repeat (for the tests)")
    args = ap.parse_args(argv)
    here, other = Path(__file__).resolve().parents[1], Path(args.against).resolve()
    if not (other / "otbound" / "__init__.py").is_file():
        ap.exit(2, f"bench_public: no otbound/ package in {other}\n")
    calls = [(c.split(":")[0], int(c.split(":")[1])) for c in args.calls]
    vocabs = SMALL_VOCABS if args.small else (args.vocab,)
    n, repeats = (args.rows, args.repeats) if not args.quick else (2, 1)
    if args.quick:
        vocabs = (200,)
    before = {k: v for k, v in sys.modules.items() if _own(k)}
    try:
        versions = {"this": _load(here), "other": _load(other)}
        worst, out = 0.0, {}
        for vocab in vocabs:
            for fam in args.families:
                p, q = rows(fam, n, vocab)
                for law, k in calls:
                    if law != "with_replacement" and k > vocab:
                        continue
                    r = out[(vocab, fam, law, k)] = compare(versions, p, q, law, k, repeats)
                    line = (f"V={vocab:<7d} {fam:10s} {law:19s} K={k}: np.sort {r['sort_us']:8.1f} us | this "
                            f"{r['this_us']:9.1f} us = {r['this_x_sort']:6.2f}x")
                    if "ratio" in r:
                        worst = max(worst, r["max_diff"])
                        line += (f" | other {r['other_us']:9.1f} us = {r['other_x_sort']:6.2f}x | this/other "
                                 f"{r['ratio']:.3f} | diff {r['max_diff']:.0e}")
                    print(line, flush=True)
                if args.measure and vocab >= max(KS):  # the default K = 2, 3, 4: a6e5102 refuses K above V
                    r = out[(vocab, fam, "measure_laws", 0)] = compare_measure(versions, p, q, repeats)
                    print(f"V={vocab:<7d} {fam:10s} measure_laws (default) per position: np.sort {r['sort_us']:8.1f}"
                          f" us | this {r['this_x_sort']:6.2f}x | other {r['other_x_sort']:6.2f}x | this/other "
                          f"{r['ratio']:.3f} | diff {r['max_diff']:.0e} ({r['compared']} exact quantities)", flush=True)
        out["max_diff"], out["tol"] = worst, args.tol
        return out
    finally:
        _drop()
        sys.modules.update(before)


if __name__ == "__main__":
    res = main()
    sys.exit(0 if res["max_diff"] <= res["tol"] else 1)
