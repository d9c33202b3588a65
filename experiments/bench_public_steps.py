"""Where the time of a single ``otbound.optimal_acceptance`` call goes at V = 151,936: each step of
the call's CPU path timed alone on the same rows, alternated with one ``np.sort`` of the row's
ratios and with one pass over p and q (``p + q``), as multiples of the sort (medians over rows
and repeats, CPU time of the process).

    OMP_NUM_THREADS=1 python experiments/bench_public_steps.py [--family zipf_noise] [--rows 8]

``--phases`` times instead the work α* without replacement does before its search, inside the
whole call at K = 2 and K = 4: the checked batch, the largest q, the bucket ids with the bucket
sums of p and q, the bucket sums of u = q/(1 − q) at K = 2 or of the clock integral's moments at
K ≥ 3, each read from a profile of the calls (CPU time summed over rows and repeats, as multiples
of the ``np.sort`` of the row beside each call).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import numpy as np
from bench_engine import FAMILIES, LM_VOCAB, rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="zipf_noise", choices=FAMILIES)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--phases", action="store_true", help="the work before the search of α* without replacement")
    args = ap.parse_args(argv)
    import otbound as ob

    ob.retain_freed_memory()
    p, q = rows(args.family, args.rows, LM_VOCAB)
    if args.phases:
        return phases(p, q, args.rows, args.repeats)
    s = p[0].sum()
    # the bucket ids of α*_wor: the ratio's exponent and top 5 mantissa bits (32 buckets per octave)
    ids = [(np.bitwise_and(np.divide(p[i], q[i]).view(np.uint64), np.uint64(0x7FFF_FFFF_FFFF_FFFF))
            >> np.uint64(47)).view(np.int64) for i in range(args.rows)]
    free_ids = [(np.divide(p[i], q[i]).view(np.uint64) >> np.uint64(47)).view(np.int64) for i in range(args.rows)]
    steps = {
        "one pass over p and q (p + q)": lambda i: p[i] + q[i],
        "law checks: sum, min, renormalise (p and q)": lambda i: [(x.sum(), x.min(), x / s) for x in (p[i], q[i])],
        "ratio p/q and its bucket ids": lambda i: (np.bitwise_and(np.divide(p[i], q[i]).view(np.uint64),
                                                                  np.uint64(0x7FFF_FFFF_FFFF_FFFF)) >> np.uint64(47)),
        "two bincounts (bucket sums of p and q)": lambda i: [np.bincount((p[i].view(np.uint64) >> np.uint64(47))
                                                                         .view(np.int64) - 0, weights=x)
                                                             for x in (p[i], q[i])],
        "top-8 partition of q": lambda i: np.argpartition(q[i], LM_VOCAB - 8),
        "one bincount over the bucket ids": lambda i: np.bincount(ids[i], weights=p[i]),
        "u = q/(1 − q) (α*_wor K = 2)": lambda i: np.divide(q[i], np.subtract(1.0, q[i])),
        "q.min (with replacement's one check pass)": lambda i: q[i].min(),
        "p/q and its unmasked bucket ids (division, shift)": lambda i: np.right_shift(
            np.divide(p[i], q[i]).view(np.uint64), np.uint64(47)),
        "two bincounts over the unmasked ids (p and q)": lambda i: [np.bincount(free_ids[i], weights=x)
                                                                   for x in (p[i], q[i])],
        "top-3 column maxima of q (64 rows)": lambda i: q[i][: 64 * (LM_VOCAB // 64)].reshape(64, -1).max(0),
        "greedy's passes: q/c, min with p, its min and sum": lambda i: [
            (m.min(), m.sum()) for m in [np.minimum(p[i], np.divide(q[i], 0.9))]],
        "with_replacement K=2 (whole call)": lambda i: ob.optimal_acceptance(p[i], q[i], 2),
        "with_replacement K=4 (whole call)": lambda i: ob.optimal_acceptance(p[i], q[i], 4),
        "greedy K=4 (whole call)": lambda i: ob.optimal_acceptance(p[i], q[i], 4, "greedy"),
        "deterministic K=4 (whole call)": lambda i: ob.optimal_acceptance(p[i], q[i], 4, "deterministic"),
        "without_replacement K=2 (whole call)": lambda i: ob.optimal_acceptance(p[i], q[i], 2, "without_replacement"),
        "without_replacement K=4 (whole call)": lambda i: ob.optimal_acceptance(p[i], q[i], 4, "without_replacement"),
        "greedy K=2 (whole call)": lambda i: ob.optimal_acceptance(p[i], q[i], 2, "greedy"),
        "deterministic K=2 (whole call)": lambda i: ob.optimal_acceptance(p[i], q[i], 2, "deterministic"),
        "rrs acceptance K=2 (whole call)": lambda i: ob.VERIFIERS["rrs"].acceptance(p[i], q[i], 2),
    }
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, p / q, np.inf)
    out = {name: [] for name in steps}
    for _ in range(args.repeats):
        for i in range(args.rows):
            for name, fn in steps.items():
                fn(i)
                t0 = time.process_time()
                np.sort(ratio[i])
                t1 = time.process_time()
                fn(i)
                out[name].append((time.process_time() - t1) / (t1 - t0))
    for name, x in out.items():
        print(f"{name:55s} {statistics.median(x):6.2f}x np.sort", flush=True)
    return out


#: the work before the search of α* without replacement: (source file, function) -> its label
_BEFORE_SEARCH = {("_kernel.py", "__init__"): "the checked batch (LawBatch)",
                  ("_search.py", "_largest_and_peaks"): "the largest q",
                  ("_search.py", "_bucket_sums"): "bucket ids, bucket sums of p and q",
                  ("_wor.py", "bucket_features"): "bucket sums of u (K = 2) or of the moments (K >= 3)"}


def phases(p, q, n_rows: int, repeats: int) -> dict:
    """The pre-search work of α* without replacement at K = 2 and 4 (module docstring): the whole
    call timed plain, beside one ``np.sort`` of the row; the work before the search read from a
    cProfile of the same calls (the cumulative time of the functions of ``_BEFORE_SEARCH``, which
    none calling another; the profiler's own cost per Python call lands mostly in the search, but the
moment sums make enough calls to read about 15% higher than timed without it)."""
    import cProfile
    import os
    import pstats

    import otbound as ob

    init_line = ob.token.LawBatch.__init__.__code__.co_firstlineno
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, p / q, np.inf)
    results = {}
    for k in (2, 4):
        call = functools.partial(_wor_call, ob, p, q, k)
        for i in range(n_rows):
            call(i)  # warm
        sort_time = call_time = 0.0
        profile = cProfile.Profile(time.process_time)
        for rep in range(2 * repeats):
            for i in range(n_rows):
                t0 = time.process_time()
                np.sort(ratio[i])
                t1 = time.process_time()
                if rep < repeats:
                    call(i)
                    sort_time += t1 - t0
                    call_time += time.process_time() - t1
                else:
                    profile.runcall(call, i)
        spent = {}
        for (path, line, name), (_, _, _, cumulative, _) in pstats.Stats(profile).stats.items():
            label = _BEFORE_SEARCH.get((os.path.basename(path), name))
            if label and (name != "__init__" or line == init_line):
                spent[label] = spent.get(label, 0.0) + cumulative
        print(f"without_replacement K={k}: the whole call {call_time / sort_time:6.2f}x np.sort", flush=True)
        spent = {label: spent[label] for label in _BEFORE_SEARCH.values() if label in spent}
        for label, t in spent.items():
            print(f"  {label:53s} {t / sort_time:6.2f}x np.sort", flush=True)
        before = sum(spent.values())
        print(f"  {'all of the work before the search':53s} {before / sort_time:6.2f}x np.sort", flush=True)
        results[k] = {"call": call_time / sort_time, "before_search": before / sort_time,
                      **{label: t / sort_time for label, t in spent.items()}}
    return results


def _wor_call(ob, p, q, k, i):
    return ob.optimal_acceptance(p[i], q[i], k, "without_replacement")


if __name__ == "__main__":
    main()
