"""Benchmark: the optimal verifier ``ot`` against a max-flow on the same instances (same process).

    python experiments/bench_optimal_verifier.py [--runs 5] [--instances 4] [--topk 10]

Instances: LM-like pairs at V = 151,936 (logits N(0, 2.5²) with 50 boosted tokens; the draft's
logits add N(0, 1) noise; temperature T, both laws softmax(logits / T)), K ∈ {2, 4, 8}. Times are
process CPU times (one thread; the machine is shared, so wall clock would measure the load), medians
of ``--runs`` runs and, across instances, their median and max:

* ``setup``  — :func:`otbound.token.verifiers.optimal_coupling` (sort by p/q, prefix sums, running
  maxima): what every verified token pays, and all the exact acceptance needs;
* ``verify`` — the public ``sample`` on one drafted tuple with an empty cache: input checks,
  setup and the top draft's level from the hull (docs/theory/optimal-verifier.md), i.e. the
  per-token cost in decoding (fresh p, q every token); ``torch API`` is the same with torch CPU
  inputs (converted to numpy); ``segment`` is the length of the top draft's segment;
* ``law`` — the exact conditional law of that tuple (``conditional_law``, set-up cached): the
  entry masses of its drafts' positions from the hull (the tree's path took seconds at K = 8);
* ``tree`` — the previous sampler's cost for the same tuple: setup plus the top draft's path in its
  segment's peeling tree, ``OptimalCoupling.level_path`` (one run; O(segment²) — seconds at K = 8,
  so only for ``--tree-ks``), and ``depth``, the length of that path;
* ``maxflow`` — networkx maximum flow on the multiset graph (source → multiset of K drafts →
  token → sink) of the top-``topk`` truncation of the same instance (top tokens of q, both laws
  renormalised), the exact optimal plan of that truncated instance; printed beside ``ot``
  on the same truncated instance, with the ratio and both values (they must agree to 1e-9).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import networkx as nx  # noqa: E402
import numpy as np  # noqa: E402

from otbound import VERIFIERS, optimal_acceptance, sample_drafts  # noqa: E402
from otbound.token import laws_from_logits  # noqa: E402
from otbound.token.verifiers import optimal_coupling  # noqa: E402

V = 151_936


def lm_pair(seed: int, temperature: float, v: int = V):
    r = np.random.default_rng(seed)
    z = r.standard_normal(v) * 2.5
    z[:50] += 8 * r.random(50)

    return laws_from_logits(z, temperature), laws_from_logits(z + r.standard_normal(v), temperature)


def median_time(fn, runs, *args):
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn(*args)
        times.append(time.process_time() - t0)
    return statistics.median(times)


def maxflow_value(p, q, k):
    """α* of (p, q, K) by a max-flow over multisets of drafts (networkx preflow-push)."""
    g = nx.DiGraph()
    v = q.size
    for ms in itertools.combinations_with_replacement(range(v), k):
        counts = np.bincount(ms, minlength=v)
        mass = math.factorial(k) / np.prod([math.factorial(c) for c in counts]) * float(np.prod(q[list(ms)]))
        if mass <= 0:
            continue
        g.add_edge("s", ms, capacity=mass)
        for y in set(ms):
            g.add_edge(ms, y)
    for y in range(v):
        g.add_edge(y, "t", capacity=float(p[y]))
    return nx.maximum_flow_value(g, "s", "t")


def verify_one(p, q, k, drafts):
    """The previous sampler: setup and the top draft's path in the peeling tree (its length)."""
    c = optimal_coupling(p, q, k)
    top = int(c.rank[drafts].max())
    return len(c.level_path(top))


def verify_public(p, q, drafts, rng):
    """One verification through the public API with an empty cache (a fresh p, q)."""
    ver = VERIFIERS["ot"]
    ver.clear_cache()
    ver.sample(p, q, drafts, rng)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--topk", type=int, default=10)
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--maxflow-ks", type=int, nargs="*", default=[2, 4], help="K for the max-flow comparison "
                    "(K = 8 at top-10 is 24,310 multisets: minutes in networkx)")
    ap.add_argument("--tree-ks", type=int, nargs="*", default=[2, 4], help="K at which the previous tree-path "
                    "sampler is timed too (K = 8 takes seconds per instance)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    ver = VERIFIERS["ot"]
    rng = np.random.default_rng(0)
    print(f"Top-{args.topk} truncation of the same instances: max-flow (whole plan) vs ot (setup + one tuple)")
    print(f"{'K':>2} {'multisets':>9} {'maxflow ms':>11} {'ot ms':>11} {'ratio':>8} {'|Δvalue|':>9}")
    for k in args.maxflow_ks:
        mf, fast, diff = [], [], 0.0
        for i in range(args.instances):
            p, q = lm_pair(100 * k + i, args.temperature)
            top = np.argsort(-q)[: args.topk]
            pk, qk = p[top] / p[top].sum(), q[top] / q[top].sum()
            drafts = sample_drafts(qk, k, size=1, rng=rng)
            mf.append(median_time(maxflow_value, args.runs, pk, qk, k))
            fast.append(median_time(verify_one, args.runs, pk, qk, k, drafts))
            diff = max(diff, abs(maxflow_value(pk, qk, k) - ver.acceptance(pk, qk, k)))
        n_ms = math.comb(args.topk + k - 1, k)
        a, b = statistics.median(mf), statistics.median(fast)
        print(f"{k:>2} {n_ms:>9} {1e3 * a:11.2f} {1e3 * b:11.3f} {a / b:7.0f}× {diff:9.1e}")

    print(f"\nV = {V}, T = {args.temperature}, {args.instances} instances, medians of {args.runs} runs (ms; "
          "median (max) over instances)")
    print(f"{'K':>2} {'setup':>16} {'verify':>16} {'torch API':>16} {'law':>16} {'segment':>15} {'tree':>18} "
          f"{'depth':>12} {'tree/verify':>11} {'|α−α*|':>8}")
    for k in args.ks:
        setup, verify, via_torch, law, segment, tree, depth, err = [], [], [], [], [], [], [], 0.0
        for i in range(args.instances):
            p, q = lm_pair(100 * k + i, args.temperature)
            drafts = sample_drafts(q, k, size=1, rng=rng)
            setup.append(median_time(optimal_coupling, args.runs, p, q, k))
            verify.append(median_time(verify_public, args.runs, p, q, drafts, rng))
            pt, qt, dt = torch.from_numpy(p), torch.from_numpy(q), torch.from_numpy(drafts)
            via_torch.append(median_time(verify_public, args.runs, pt, qt, dt, rng))
            ver.conditional_law(p, q, drafts)  # set-up cached
            law.append(median_time(ver.conditional_law, args.runs, p, q, drafts))
            c = optimal_coupling(p, q, k)
            u, v = c.segment(int(c.rank[drafts].max()))
            segment.append(v - u)
            if k in args.tree_ks:
                t0 = time.process_time()
                depth.append(verify_one(p, q, k, drafts))
                tree.append(time.process_time() - t0)
            err = max(err, abs(ver.acceptance(p, q, k) - optimal_acceptance(p, q, k)))

        def fmt(xs):
            return f"{1e3 * statistics.median(xs):7.2f} (max {1e3 * max(xs):6.1f})" if xs else "—"

        tree_cols = f"{'—':>18} {'—':>12} {'—':>11}"
        if tree:
            ratio = statistics.median(tree) / statistics.median(verify)
            tree_cols = f"{fmt(tree):>18} {statistics.median(depth):5.0f} (max {max(depth)}) {ratio:10.1f}×"
        print(f"{k:>2} {fmt(setup):>16} {fmt(verify):>16} {fmt(via_torch):>16} {fmt(law):>16} "
              f"{statistics.median(segment):7.0f} ({max(segment)}) {tree_cols} {err:8.1e}")


if __name__ == "__main__":
    main()
