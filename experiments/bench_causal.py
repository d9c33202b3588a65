"""Benchmark: exact causal block bound, trie LP vs the plain LP of docs/theory/block-bounds.md (same process).

    python experiments/bench_causal.py [--runs 5] [--plain-runs 3]

For each (V, L, K) (random Dirichlet target, draft = 20/80 mixture of the target and an
independent Dirichlet model) it times the public call ``otbound.block_bound(..., kind="causal",
method=...)`` (the draft trie built inside each call), as medians of several runs:

* ``lp``                 — the trie LP of the causal reduction (the default method);
* ``plain_exchangeable`` — the causal LP of docs/theory/block-bounds.md with the K drafts collapsed to multisets;
* ``plain``              — the causal LP of docs/theory/block-bounds.md over ordered draft tuples (the baseline).

It prints the values (they must agree to ~1e-9), the medians and the speed-up ratios against the
plain baseline. The plain LPs are skipped where their size is out of reach (V = 8: 2.6e5 ordered
tuples × ~56 plan entries each; V = 4, K = 3: 2.6e5 tuples), and that is printed too.
"""

from __future__ import annotations

import argparse
import statistics
import time

from otbound import block_bound, dirichlet_model, mixture_model

CASES = [
    (4, 3, 2, ("lp", "plain_exchangeable", "plain")),
    (8, 3, 2, ("lp",)),
    (3, 2, 3, ("lp", "plain_exchangeable", "plain")),
    (4, 3, 3, ("lp",)),
]


def solve(target, draft, v, length, k, method):
    return block_bound(target, draft, vocab_size=v, num_drafts=k, block_len=length, kind="causal",
                       method=method).value


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="timed runs of the trie LP (median reported)")
    ap.add_argument("--plain-runs", type=int, default=3, help="timed runs of each plain LP")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    for v, length, k, methods in CASES:
        target = dirichlet_model(v, seed=args.seed)
        draft = mixture_model(target, dirichlet_model(v, seed=args.seed + 1), 0.8)
        print(f"\nV={v} L={length} K={k}: trie of {sum(v**i for i in range(length + 1))} nodes")
        medians, values = {}, {}
        for method in methods:
            runs = args.runs if method == "lp" else args.plain_runs
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                values[method] = solve(target, draft, v, length, k, method)
                times.append(time.perf_counter() - t0)
            medians[method] = statistics.median(times)
            print(
                f"  {method:<20} U_causal = {values[method]:.12f}   median {medians[method]:8.3f} s over {runs} runs",
                flush=True,
            )
        for method in ("plain_exchangeable", "plain"):
            if method not in methods:
                print(f"  {method:<20} not run (size out of reach)")
        base = "plain" if "plain" in medians else ("plain_exchangeable" if "plain_exchangeable" in medians else None)
        if base:
            for method, t in medians.items():
                if method != base:
                    print(f"  speed-up {method} vs {base}: {medians[base] / t:.1f}x")
            spread = max(values.values()) - min(values.values())
            print(f"  max disagreement between methods: {spread:.2e}")


if __name__ == "__main__":
    main()
