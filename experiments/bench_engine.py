"""Per-position cost of the batched measurement engine against one ``np.sort`` per row and against
the per-row measurement it replaced, in the same process (medians of several runs).

The default set of :func:`otbound.report.measure_laws`: α* for the three draft laws × K ∈ {2, 3, 4}
and every verifier (nss, rrs, rrs_wor, kseq, spechub, greedy on the engine; khisti_is, khisti_lp
and ot refuse V = 151,936 at once in both). Rows shaped like a real pair at V = 151,936:

* ``lm``: z ~ N(0, 2.5²), q = softmax(z), p = softmax(z + N(0, 1)) (as bench_token_bounds.py);
* ``zipf``: Zipf-like logits −1.1·ln(rank) with a random permutation and Gumbel noise, the target
  the draft's logits plus N(0, 0.5²) at T = 1 (a peaked head and a long flat tail).

The per-row baseline is the code ``measure_laws`` ran before the engine:
:func:`otbound.optimal_acceptance` per (law, K) on the batch and ``verifier.acceptance_or_estimate``
per row (Monte Carlo with 64 draft tuples where there is no exact value: rrs_wor here). Both run
in one process after the engine's first call has set glibc to keep freed memory
(``otbound.report._engine._retain_freed_memory``), so neither pays fresh page faults per call.
The engine's α* without replacement at K = 3, 4 is also timed alone, on rows sorted beforehand.

    python experiments/bench_engine.py                 # ~3 min on 2 busy cores
    python experiments/bench_engine.py --quick         # tiny, for the tests
    python experiments/bench_engine.py --device cuda   # the engine on a GPU (baselines on the CPU)
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time

import numpy as np

LM_VOCAB = 151_936
KS = (2, 3, 4)


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rows(family: str, n: int, vocab: int, seed: int):
    rng = np.random.default_rng(seed)
    if family == "lm":
        z = rng.standard_normal((n, vocab)) * 2.5
        return _softmax(z + rng.standard_normal(z.shape)), _softmax(z)
    ranks = np.argsort(rng.random((n, vocab)), axis=1) + 1
    z = -1.1 * np.log(ranks) + rng.gumbel(size=(n, vocab))
    return _softmax(z + 0.5 * rng.standard_normal(z.shape)), _softmax(z)


def median_time(fn, repeats: int):
    """Median wall and median CPU time of this process over ``repeats`` calls after a warm-up (CPU
    time is the steadier figure on a shared machine)."""
    fn()  # warm-up
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return np.array([statistics.median(walls), statistics.median(cpus)])


def sort_rows(r):
    return [np.sort(x) for x in r]


def engine(measure_batch, p, q):
    measure_batch(p, q, KS)
    if p.device.type == "cuda":
        import torch

        torch.cuda.synchronize()


def wor_k34(ps, qs):
    """The engine's α* without replacement at K = 3, 4: the clock integral on rows already sorted by ratio."""
    from otbound.token.bounds import without_replacement_ratio_sorted

    return [without_replacement_ratio_sorted(ps, qs, k) for k in (3, 4)]


def ratio_sorted(p, q):
    with np.errstate(divide="ignore", invalid="ignore"):
        order = np.argsort(np.where(q > 0, p / q, np.inf), axis=1, kind="stable")
    return np.take_along_axis(p, order, 1), np.take_along_axis(q, order, 1)


def legacy_measure(p, q, mc_samples=64, seed=0):
    """What measure_laws computed before the engine: α* per (law, K), verifiers row by row."""
    import otbound as ob
    from otbound.token.verifiers import VERIFIERS

    rng = np.random.default_rng(seed)
    for s in ("with_replacement", "without_replacement", "greedy"):
        for k in KS:
            ob.optimal_acceptance(p, q, k, s)
    for v in VERIFIERS.values():
        for k in KS:
            for a, b in zip(p, q):
                try:
                    v.acceptance_or_estimate(a, b, k, mc_samples, rng)
                except ob.InvalidInputError:
                    pass


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="V = 2,000, few rows and runs (for the tests)")
    ap.add_argument("--rows", type=int, default=16, help="positions per engine call")
    ap.add_argument("--legacy-rows", type=int, default=2, help="positions for the per-row baseline (slow)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    import torch

    from otbound.report._engine import measure_batch

    torch.set_num_threads(args.threads)
    vocab, repeats, n = (LM_VOCAB, args.repeats, args.rows) if not args.quick else (2_000, 2, 4)
    legacy_rows = args.legacy_rows if not args.quick else 1
    out = {"vocab": vocab, "rows": n, "repeats": repeats, "device": args.device, "threads": args.threads,
           "torch": torch.__version__, "families": {}}
    for fam in ("lm", "zipf"):
        p, q = rows(fam, n, vocab, seed=0)
        t_sort = median_time(functools.partial(sort_rows, p / q), repeats) / n
        pt, qt = torch.from_numpy(p).to(args.device), torch.from_numpy(q).to(args.device)
        t_engine = median_time(functools.partial(engine, measure_batch, pt, qt), repeats) / n
        t_wor = median_time(functools.partial(wor_k34, *ratio_sorted(p, q)), repeats) / n
        legacy = functools.partial(legacy_measure, p[:legacy_rows], q[:legacy_rows])
        t_legacy = median_time(legacy, max(1, repeats // 2)) / legacy_rows
        res = {}
        for i, clock in enumerate(("wall", "cpu")):
            res[clock] = {"np_sort_ms": 1e3 * t_sort[i], "engine_ms": 1e3 * t_engine[i],
                          "legacy_ms": 1e3 * t_legacy[i],
                          "wor_k34_ms": 1e3 * t_wor[i], "engine_over_sort": t_engine[i] / t_sort[i],
                          "engine_without_wor_k34_over_sort": (t_engine[i] - t_wor[i]) / t_sort[i],
                          "legacy_over_engine": t_legacy[i] / t_engine[i]}
            r = res[clock]
            print(f"{fam:5s} V={vocab} ({clock:4s}): np.sort {r['np_sort_ms']:.2f} ms/row | engine "
                  f"{r['engine_ms']:.1f} ms/position = {r['engine_over_sort']:.1f}x np.sort | per-row measure "
                  f"{r['legacy_ms']:.0f} ms/position: engine {r['legacy_over_engine']:.1f}x faster | of the engine, "
                  f"alpha*_wor K=3,4 (clock integral on the sorted rows) {r['wor_k34_ms']:.1f} ms, the rest "
                  f"{r['engine_without_wor_k34_over_sort']:.1f}x np.sort", flush=True)
        out["families"][fam] = res
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
