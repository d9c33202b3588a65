"""Benchmark of the token-level bounds: the public calls against plain baselines, in one process.

Tables (every time is the median of ``--repeats`` (≥ 5) runs, per row; wall clock, with the CPU
time of the process alongside where it matters: on a shared machine wall time grows with the load,
which the header reports):

1. α* with replacement at V = 151,936, a batch of ``--rows`` rows: the public
   :func:`otbound.optimal_acceptance` (input checks included) against the plain sort-and-cumsum
   (:func:`plain_sort_alpha`), with the ratio, the cost of one ``np.sort`` of each row and of
   merely reading p and q; and the greedy law's public call against its per-row sort
   (:func:`otbound.greedy_split`). Values must agree to 1e-12.
2. α* without replacement at V = 151,936: the public call in ms per row (bucket branch and bound,
   closed form for K = 2, clock integral with moment sums for K ≥ 3) and its ratio to one
   ``np.sort`` of each row. Its agreement with the token-by-token reference DP (at V = 2,000, on
   the adversarial families of table 3 as well) is a test: tests/test_token_bounds.py.
3. Accuracy of the public calls: the dual against brute force over all 2^V subsets on
   ``--small-instances`` random small instances per law (V ≤ 8, K ≤ 4; zeros, near-deterministic
   laws, disjoint supports), and without replacement at V = 2,000 on adversarial families (K up to
   16) each value against its own certificate: ``1 + p(H*) − Q(H*)`` with ``Q(H*)`` by
   :func:`otbound.subset_mass` (the token-by-token DP).
4. The primal LP (HiGHS via ``optimal_acceptance_lp``, cvxpy, POT) against the dual for
   V = 50…400, K = 2, 3, on the explicit i.i.d. joint law. The joint law is passed collapsed to
   multisets (all mass of a multiset on its sorted tuple: tuples with the same token set have the
   same accepting pairs, so α* is unchanged and the LP shrinks from V^K to C(V+K−1, K) draft
   nodes). Cells whose LP would exceed ``--max-lp-nodes`` draft nodes (or POT's dense cost matrix
   ``--max-pot-entries``) are skipped and marked "cap": HiGHS took 361 s on V = 100, K = 3
   (171,700 nodes) here. LP values that miss the dual by more than 1e-9 are starred.

Families (synthetic; real-model rows come from the experiments that trace the Qwen pair):
``lm``: z ~ N(0, 2.5²) logits, q = softmax(z), p = softmax(z + N(0, 1)) (as in tests/test_token_bounds.py);
``zipf``: :func:`otbound.report.synthetic_pair` ("zipf", T = 1); ``dirichlet``: the same, "dirichlet".

Usage: ``python experiments/bench_token_bounds.py [--quick]``.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import otbound as ob  # noqa: E402
from otbound.report import synthetic_pair  # noqa: E402

LM_VOCAB = 151_936


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def family(name: str, rows: int, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(P, Q) of shape (rows, vocab) for one synthetic family."""
    rng = np.random.default_rng(seed)
    if name == "lm":
        z = rng.standard_normal((rows, vocab)) * 2.5
        return _softmax(z + rng.standard_normal(z.shape)), _softmax(z)
    pairs = [synthetic_pair(name, vocab, 1.0, rng) for _ in range(rows)]
    return np.stack([a for a, _ in pairs]), np.stack([b for _, b in pairs])


def median_time(fn, repeats: int, warm_up: bool = True, cpu: bool = False):
    """Median wall time of ``repeats`` calls (after one warm-up call) and the last result; with
    ``cpu`` also the median CPU time of this process (steadier than wall time on a shared machine)."""
    out = fn() if warm_up else None
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    if cpu:
        return statistics.median(walls), statistics.median(cpus), out
    return statistics.median(walls), out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def table(title: str, header: list[str], rows: list[list]) -> None:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    sys.stdout.flush()


def plain_sort_alpha(P, Q, k):
    """α* with replacement the plain way (the baseline): numpy's stable argsort of each row by p/q
    (q = 0 last), cumulative sums, ``1 + min(0, min_j P_j − Q_j^K)`` over the sorted prefixes."""
    with np.errstate(divide="ignore", invalid="ignore"):
        order = np.argsort(np.where(Q > 0, P / Q, np.inf), axis=1, kind="stable")
    cum_p = np.cumsum(np.take_along_axis(P, order, axis=1), axis=1)
    cum_q = np.cumsum(np.take_along_axis(Q, order, axis=1), axis=1)
    return 1.0 + np.minimum(0.0, (cum_p - cum_q**k).min(axis=1))


def _greedy_plain(P, Q, k):
    """The per-row greedy value through :func:`otbound.greedy_split` (full sort): the baseline."""
    out = np.empty(P.shape[0])
    for i in range(P.shape[0]):
        g, qp = ob.greedy_split(Q[i], k)
        in_g = np.zeros(P.shape[1], dtype=bool)
        in_g[g] = True
        out[i] = 1.0 + min(0.0, P[i, in_g].sum() + np.where(in_g, 0.0, np.minimum(P[i] - qp, 0.0)).sum())
    return out


def bench_with_replacement(args) -> None:
    rows = []
    for fam in args.families:
        P, Q = family(fam, args.rows, LM_VOCAB, seed=1)
        n = P.shape[0]
        t_read, _ = median_time(lambda: np.add(P, Q), args.repeats)
        t_np_sort, _ = median_time(lambda: np.sort(P, axis=1), args.repeats)
        for k in args.wr_drafts:
            t_plain, c_plain, ref = median_time(lambda: plain_sort_alpha(P, Q, k), args.repeats, cpu=True)
            t_api, c_api, val = median_time(lambda: ob.optimal_acceptance(P, Q, k), args.repeats, cpu=True)
            err = float(np.abs(val - ref).max())
            assert err < 1e-12, f"with replacement disagrees with the plain sort by {err}"
            ms = [x / n * 1e3 for x in (t_plain, t_api, c_plain, c_api, t_np_sort, t_read)]
            rows.append(
                [
                    fam,
                    k,
                    f"{ms[0]:.2f}",
                    f"{ms[1]:.3f}",
                    f"{t_plain / t_api:.1f}x",
                    f"{ms[2]:.2f} / {ms[3]:.3f}",
                    f"{ms[4]:.3f}",
                    f"{t_api / t_np_sort:.2f}x",
                    f"{ms[5]:.3f}",
                    f"{err:.0e}",
                ]
            )
    table(
        f"alpha* with replacement, V = {LM_VOCAB:,}, {args.rows} rows "
        f"(ms per row, median of {args.repeats}; wall clock, and CPU time)",
        [
            "family",
            "K",
            "plain sort",
            "optimal_acceptance",
            "speed-up",
            "CPU plain / public",
            "np.sort",
            "public / np.sort",
            "read p,q",
            "max |diff|",
        ],
        rows,
    )

    rows = []
    for fam in args.families:
        P, Q = family(fam, args.rows, LM_VOCAB, seed=2)
        n = P.shape[0]
        for k in args.wr_drafts:
            t_plain, ref = median_time(lambda: _greedy_plain(P, Q, k), max(1, args.repeats // 2 * 2 + 1))
            t_fast, val = median_time(lambda: ob.optimal_acceptance(P, Q, k, "greedy"), args.repeats)
            err = float(np.abs(val - ref).max())
            assert err < 1e-12, f"greedy disagrees with its plain version by {err}"
            rows.append([fam, k, f"{t_plain / n * 1e3:.2f}", f"{t_fast / n * 1e3:.3f}", f"{t_plain / t_fast:.1f}x",
                         f"{err:.0e}"])
    table(f"alpha* greedy law, V = {LM_VOCAB:,}, {args.rows} rows (ms per row)",
          ["family", "K", "sort (greedy_split)", "optimal_acceptance", "speed-up", "max |diff|"], rows)


def bench_without_replacement(args) -> None:
    rows = []
    for fam in args.families:
        P, Q = family(fam, args.wor_rows, LM_VOCAB, seed=3)
        n = P.shape[0]
        t_np_sort, _ = median_time(lambda: np.sort(P, axis=1), args.repeats)
        for k in args.wor_drafts:
            t_api, c_api, _ = median_time(
                lambda: ob.optimal_acceptance(P, Q, k, "without_replacement"), args.repeats, cpu=True
            )
            rows.append([fam, k, f"{t_api / n * 1e3:.2f}", f"{c_api / n * 1e3:.2f}", f"{t_np_sort / n * 1e3:.3f}",
                         f"{t_api / t_np_sort:.1f}x"])
    table(f"alpha* without replacement, V = {LM_VOCAB:,}, {args.wor_rows} rows (ms per row, median of {args.repeats})",
          ["family", "K", "optimal_acceptance (wall)", "(CPU)", "np.sort", "public / np.sort"], rows)


def _small_law(rng, v: int, kind: int) -> np.ndarray:
    if kind == 0:
        x = rng.dirichlet(np.full(v, rng.choice([0.05, 0.3, 1.0, 10.0])))
    elif kind == 1:
        x = rng.choice([0.0, 0.0, 1e-9, 0.1, 1.0, 3.0], v)
        x[0] += x.sum() == 0
    elif kind == 2:
        x = np.full(v, 1e-7)
        x[rng.integers(v)] = 1.0
    else:
        x = np.ones(v)
    return x / x.sum()


def adversarial_families(vocab: int, rng):
    """(name, p, q) of the hard cases for the without-replacement fast path."""
    z = rng.standard_normal(vocab) * 2.5
    yield "lm", _softmax(z + rng.standard_normal(vocab)), _softmax(z)
    for temp in (0.5, 2.0):
        yield f"zipf T={temp}", *synthetic_pair("zipf", vocab, temp, rng)
    yield "dirichlet", *synthetic_pair("dirichlet", vocab, 1.0, rng)
    q = np.full(vocab, 1e-3 / vocab)
    q[5] += 0.999
    yield "near-det. q", rng.dirichlet(np.ones(vocab)), q / q.sum()
    p = np.full(vocab, 1e-3 / vocab)
    p[7] += 0.999
    yield "near-det. p", p / p.sum(), rng.dirichlet(np.ones(vocab))
    q = np.full(vocab, 1e-9)
    q[: vocab // 10] = 1.0
    yield "flat top 10%", rng.dirichlet(np.ones(vocab)), q / q.sum()
    half = np.arange(vocab) < vocab // 2
    yield "disjoint", np.where(half, 0.0, 1.0) / (vocab - vocab // 2), np.where(half, rng.random(vocab), 0.0) / 1.0


def bench_accuracy(args) -> None:
    rng = np.random.default_rng(7)
    worst = {law: 0.0 for law in ob.SAMPLINGS}
    count = dict.fromkeys(ob.SAMPLINGS, 0)
    for _ in range(args.small_instances):
        v, k = int(rng.integers(2, 9)), int(rng.integers(1, 5))
        p, q = _small_law(rng, v, rng.integers(4)), _small_law(rng, v, rng.integers(4))
        if v >= 4 and rng.random() < 0.3:  # disjoint supports
            low = np.arange(v) < v // 2
            p, q = np.where(low, 0.0, p + 1e-3), np.where(low, q + 1e-3, 0.0)
            p, q = p / p.sum(), q / q.sum()
        for law in ob.SAMPLINGS:
            if law != "with_replacement" and np.count_nonzero(q > 0) < k:
                continue
            brute = ob.optimal_acceptance_brute_force(p, ob.draft_joint(q, k, law)).value
            worst[law] = max(worst[law], abs(ob.optimal_acceptance(p, q, k, law) - brute))
            count[law] += 1
    table(f"accuracy: dual vs brute force over all 2^V subsets (V <= 8, K <= 4, {args.small_instances} random draws)",
          ["law", "instances", "max |dual - brute|"], [[law, count[law], f"{worst[law]:.1e}"] for law in ob.SAMPLINGS])
    assert max(worst.values()) < 1e-10

    rows = []
    for name, p, q in adversarial_families(args.acc_vocab, np.random.default_rng(8)):
        q = q / q.sum()
        cells = [name]
        for k in args.acc_drafts:
            bound = ob.optimal_acceptance(p, q, k, "without_replacement", return_certificate=True)
            h = bound.binding_set
            attained = 1.0 + min(0.0, float(p[h].sum()) - ob.subset_mass(q, h, k, "without_replacement"))
            err = abs(bound.value - attained)
            assert err < 1e-10, f"{name}, K={k}: value vs its certificate {err}"
            cells.append(f"{err:.0e}")
        rows.append(cells)
    table(f"accuracy: without replacement at V = {args.acc_vocab:,}, |alpha* - (1 + p(H*) - Q(H*))| with Q(H*) "
          "by subset_mass (the token-by-token DP)", ["family"] + [f"K={k}" for k in args.acc_drafts], rows)


def collapsed_iid_joint(q: np.ndarray, k: int) -> np.ndarray:
    """The i.i.d. joint law with each multiset's mass on its sorted tuple (same α*, fewer nodes)."""
    v = q.size
    joint = ob.draft_joint(q, k, "with_replacement")
    idx = np.indices((v,) * k).reshape(k, -1)
    srt = np.sort(idx, axis=0)
    flat = np.ravel_multi_index(tuple(srt), (v,) * k)
    return np.bincount(flat, weights=joint.ravel(), minlength=v**k).reshape((v,) * k)


def bench_lp(args) -> None:
    rows = []
    errors = {"highs": 0.0, "cvxpy": 0.0, "pot": 0.0}
    for k in args.lp_drafts:
        for v in args.lp_vocab:
            nodes = math.comb(v + k - 1, k)
            rng = np.random.default_rng(100 * v + k)
            p, q = synthetic_pair("zipf", v, 1.0, rng)
            t_dual, dual = median_time(lambda: ob.optimal_acceptance(p, q, k), args.repeats)
            row = [v, k, f"{v**k:,}", f"{nodes:,}", f"{t_dual * 1e3:.3f}"]
            if nodes > args.max_lp_nodes:
                rows.append(row + ["cap"] * 6)
                continue
            joint = collapsed_iid_joint(q, k)
            for method in ("highs", "cvxpy", "pot"):
                if method == "pot" and nodes * v > args.max_pot_entries:
                    row += ["cap", "-"]
                    continue
                log(f"  LP V={v} K={k} {method} ...")
                solve = functools.partial(ob.optimal_acceptance_lp, p, joint, method=method)
                t_lp, val = median_time(solve, args.lp_repeats, warm_up=False)
                err = abs(val - dual)
                errors[method] = max(errors[method], err)
                row += [f"{t_lp * 1e3:.1f}" + ("*" if err > 1e-9 else ""), f"{t_lp / t_dual:.0f}x"]
            rows.append(row)
    table(f"primal LP vs dual, zipf pair, i.i.d. drafts (ms per instance; LP median of {args.lp_repeats}, dual of"
          f" {args.repeats}; cap: more than {args.max_lp_nodes:,} LP draft nodes; *: |LP - dual| > 1e-9)",
          ["V", "K", "tuples V^K", "LP draft nodes", "dual", "HiGHS", "/dual", "cvxpy", "/dual", "POT", "/dual"], rows)
    print("max |LP - dual|: " + ", ".join(f"{m} {e:.0e}" for m, e in errors.items())
          + " (cvxpy: HiGHS at 1e-10 feasibility tolerances; POT: network simplex, an error at 10^7 pivots)")
    assert errors["highs"] < 1e-9, "HiGHS disagrees with the dual"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lp-repeats", type=int, default=5)
    ap.add_argument("--rows", type=int, default=64, help="batch rows for the with-replacement table")
    ap.add_argument("--wor-rows", type=int, default=8)
    ap.add_argument("--families", nargs="+", default=["lm", "zipf", "dirichlet"])
    ap.add_argument("--wr-drafts", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument("--wor-drafts", nargs="+", type=int, default=[2, 3, 4, 8])
    ap.add_argument("--lp-vocab", nargs="+", type=int, default=[50, 100, 200, 400])
    ap.add_argument("--lp-drafts", nargs="+", type=int, default=[2, 3])
    ap.add_argument("--max-lp-nodes", type=int, default=100_000)
    ap.add_argument("--max-pot-entries", type=int, default=20_000_000)
    ap.add_argument("--small-instances", type=int, default=2000)
    ap.add_argument("--acc-vocab", type=int, default=2000)
    ap.add_argument("--acc-drafts", nargs="+", type=int, default=[2, 3, 4, 8, 16])
    ap.add_argument("--sections", nargs="+", default=["wr", "wor", "acc", "lp"], choices=["wr", "wor", "acc", "lp"])
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.wor_rows = 4, 2
        args.families, args.wr_drafts, args.wor_drafts = ["lm"], [2, 4], [2, 3]
        args.lp_vocab, args.lp_drafts, args.lp_repeats = [50, 100], [2], 5
        args.small_instances, args.acc_vocab, args.acc_drafts = 200, 300, [2, 3, 8]
    args.repeats = max(args.repeats, 5)
    print(f"bench_token_bounds: {'quick' if args.quick else 'full'} run, numpy {np.__version__}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (wall times grow with the load)")
    if "wr" in args.sections:
        bench_with_replacement(args)
    if "wor" in args.sections:
        bench_without_replacement(args)
    if "acc" in args.sections:
        bench_accuracy(args)
    if "lp" in args.sections:
        bench_lp(args)


if __name__ == "__main__":
    main()
