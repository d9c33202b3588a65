"""Where the time of a single ``otbound.optimal_acceptance`` call goes at V = 151,936: each step of
the call's CPU path timed alone on the same rows, alternated with one ``np.sort`` of the row's
ratios and with one pass over p and q (``p + q``), as multiples of the sort (medians over rows
and repeats, CPU time of the process).

    OMP_NUM_THREADS=1 python experiments/bench_public_steps.py [--family zipf_noise] [--rows 8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from bench_engine import FAMILIES, LM_VOCAB, rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="zipf_noise", choices=FAMILIES)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    import otbound as ob

    p, q = rows(args.family, args.rows, LM_VOCAB)
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


if __name__ == "__main__":
    main()
