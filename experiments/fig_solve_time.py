"""Solve time of α* against V and K: primal LP (HiGHS, cvxpy, POT), max-flow, and the dual prefix form.

Instances: the ``zipf`` synthetic pair of :func:`otbound.report.synthetic_pair` (target logits
−1.1·log rank, draft = target + N(0, 1) noise, T = 1) over V tokens; K drafts i.i.d. from q.
Methods (each returns α*; all are checked against the dual on every instance):

* ``dual`` — :func:`otbound.optimal_acceptance` (prefix theorem, O(V log V)), from (p, q);
* ``highs`` / ``cvxpy`` / ``pot`` — :func:`otbound.optimal_acceptance_lp` on the explicit joint law
  ``draft_joint(q, K)`` (V^K tuples; the joint is built outside the timed call);
* ``maxflow`` — :func:`maxflow_acceptance`: ``scipy.sparse.csgraph.maximum_flow`` (Dinic) on the
  network source → x̄ (capacity Q(x̄)) → y ∈ x̄ (unbounded) → sink (capacity p(y)).

Timing: wall clock (``time.perf_counter``) of one call; the cell value is the median over
``instances × repeats`` calls (one call per instance when a call takes more than ``SLOW_S`` = 1 s).
A method is dropped for larger V once a median exceeds ``budget_s``, and the LP methods are only
run while V^K ≤ ``max_tuples``. The machine's load average is stored with the results: medians
taken on a shared machine are inflated, by about the same factor for every method.

Usage: ``python experiments/fig_solve_time.py [--recompute] [--quick] [--out figures/]``.
"""

from __future__ import annotations

import sys
import time

import _common
import numpy as np

NAME = "fig_solve_time"
METHODS = ("dual", "maxflow", "highs", "pot", "cvxpy")
LABELS = {
    "dual": "dual (prefix form)",
    "maxflow": "max-flow (scipy, Dinic)",
    "highs": "LP, HiGHS",
    "pot": "LP, POT network simplex",
    "cvxpy": "LP, cvxpy",
}

#: scipy's maximum_flow wraps int64 capacities modulo 2^32 (scipy 1.17: a capacity 2^40 + 5 carries a
#: flow of 5), so capacities must fit in int32: the scale is 2^30 and the total capacity out of the
#: source (≈ 2^30) stays below 2^31.
MAXFLOW_SCALE = 2**30
SLOW_S = 1.0


def maxflow_acceptance(p, draft_joint) -> tuple[float, float]:
    """α* by an integer max-flow; returns ``(value, error_bound)``.

    Capacities Q(x̄)·2^30 and p(y)·2^30 are rounded to the nearest integer (edges x̄ → y get 2^30,
    more than any flow through x̄ can be). Each rounding moves a cut by at most 2^-31, so
    ``|value − α*| ≤ error_bound = (#tuples + V)·2^-31`` (about 3e-5 at 65 536 tuples).
    """
    import scipy.sparse
    from scipy.sparse.csgraph import maximum_flow

    p = np.asarray(p, dtype=np.float64)
    joint = np.asarray(draft_joint, dtype=np.float64)
    joint = joint / joint.sum()
    v = p.size
    # the support tuples x̄ and one edge x̄ → y per distinct token y of x̄ (built here, independently
    # of the library's LP)
    support = np.flatnonzero(joint.ravel() > 0)
    tuples = np.stack(np.unravel_index(support, joint.shape), axis=1)  # (n, K)
    first = np.ones(tuples.shape, dtype=bool)  # a token's first occurrence in its tuple
    for j in range(1, tuples.shape[1]):
        first[:, j] = (tuples[:, j, None] != tuples[:, :j]).all(axis=1)
    src = np.broadcast_to(np.arange(support.size)[:, None], tuples.shape)[first]
    dst = tuples[first]
    n = support.size
    sink = n + v + 1
    s = MAXFLOW_SCALE
    rows = np.concatenate([np.zeros(n, np.int64), 1 + src, 1 + n + np.arange(v)])
    cols = np.concatenate([1 + np.arange(n), 1 + n + dst, np.full(v, sink)])
    cap = np.concatenate([np.rint(joint.ravel()[support] * s), np.full(src.size, s), np.rint(p * s)]).astype(np.int32)
    graph = scipy.sparse.csr_array((cap, (rows, cols)), shape=(sink + 1, sink + 1))
    flow = maximum_flow(graph, 0, sink, method="dinic").flow_value
    return float(flow) / s, (n + v) / (2.0 * s)


def _instance(v, k, seed):
    from otbound.report import synthetic_pair

    return synthetic_pair("zipf", v, 1.0, np.random.default_rng([seed, v, k]))


def _solver(method):
    from otbound import optimal_acceptance, optimal_acceptance_lp

    if method == "dual":
        return lambda p, q, joint, k: optimal_acceptance(p, q, k)
    if method == "maxflow":
        return lambda p, q, joint, k: maxflow_acceptance(p, joint)[0]
    return lambda p, q, joint, k: optimal_acceptance_lp(p, joint, method=method)


def compute(params, checkpoint) -> dict:
    from tqdm import tqdm

    from otbound import draft_joint

    cells = []
    dropped: dict[str, int] = {}
    p0, q0 = _instance(4, 2, params["seed"])
    for method in METHODS:  # untimed warm-up: imports and first-call set-up stay out of the medians
        _solver(method)(p0, q0, draft_joint(q0, 2), 2)
    jobs = [(k, v) for k in params["num_drafts"] for v in params["vocab_sizes"]]
    for k, v in tqdm(jobs, desc="solve-time cells", file=sys.stderr):
        key = f"K={k},V={v}"
        cell = checkpoint.get(key)
        if cell is None:
            cell = {
                "num_drafts": k,
                "vocab_size": v,
                "tuples": v**k,
                "median_s": {},
                "max_abs_diff_vs_dual": {},
                "runs": {},
            }
            pairs = [_instance(v, k, params["seed"] + i) for i in range(params["instances"])]
            explicit = v**k <= params["max_tuples"]
            joints = [draft_joint(q, k) if explicit else None for _, q in pairs]
            ref = [None] * len(pairs)
            for method in METHODS:
                if method != "dual" and (not explicit or dropped.get(f"{method},{k}", 1 << 62) <= v):
                    continue
                if method == "pot" and v ** (k + 1) > params["max_pot_cells"]:
                    continue  # POT's dense cost matrix has V^K × V cells
                if method == "maxflow":
                    cell["maxflow_error_bound"] = (v**k + v) / (2.0 * MAXFLOW_SCALE)
                solve = _solver(method)
                times, diffs = [], []
                for i, ((p, q), joint) in enumerate(zip(pairs, joints)):
                    for _ in range(params["repeats"]):
                        t0 = time.perf_counter()
                        val = float(solve(p, q, joint, k))
                        times.append(time.perf_counter() - t0)
                        if times[-1] > SLOW_S:
                            break  # a slow solve is timed once per instance
                    if method == "dual":
                        ref[i] = val
                    diffs.append(abs(val - ref[i]))
                med = float(np.median(times))
                cell["median_s"][method] = med
                cell["runs"][method] = len(times)
                cell["max_abs_diff_vs_dual"][method] = float(max(diffs))
                if med > params["budget_s"]:
                    dropped[f"{method},{k}"] = v
            checkpoint.put(key, cell)
        else:
            for method, med in cell["median_s"].items():
                if med > params["budget_s"]:
                    dropped[f"{method},{k}"] = v
        cells.append(cell)
    return {"cells": cells}


#: a method's value counts as agreeing with the dual within this (max-flow: its rounding bound instead)
AGREEMENT_TOL = 1e-6


def inaccurate(cell, method) -> bool:
    """True when ``method`` missed α* on some instance of ``cell`` (beyond its tolerance)."""
    tol = cell.get("maxflow_error_bound", 0.0) if method == "maxflow" else AGREEMENT_TOL
    return cell["max_abs_diff_vs_dual"].get(method, 0.0) > tol


def table(results) -> str:
    """Markdown (Global Resolution 2511.15898 runtime-table layout): rows (K, V), columns methods, median ms."""
    cells = results["results"]["cells"]
    methods = [m for m in METHODS if any(m in c["median_s"] for c in cells)]
    lines = [
        "| K | V | V^K tuples | " + " | ".join(LABELS[m] for m in methods) + " |",
        "|---|---|---|" + "---|" * len(methods),
    ]
    for c in cells:
        row = [
            f"{1e3 * c['median_s'][m]:.3g}" + (" †" if inaccurate(c, m) else "") if m in c["median_s"] else "—"
            for m in methods
        ]
        lines.append(f"| {c['num_drafts']} | {c['vocab_size']} | {c['tuples']:.3g} | " + " | ".join(row) + " |")
    lines.append("")
    lines.append(
        "Median wall time per solve in milliseconds; — = not run (V^K too large or the method exceeded its time "
        f"budget); † = the value missed α* (dual) by more than {AGREEMENT_TOL:g} on some instance (max-flow: by more "
        "than its rounding bound)."
    )
    return "\n".join(lines)


def draw(results, out, formats) -> list:
    from otbound.report import plots

    cells = results["results"]["cells"]
    ks = sorted({c["num_drafts"] for c in cells})
    fig, axes = plots.figure(ncols=len(ks), sharey=True, height=2.6)
    markers = {"dual": "o-", "maxflow": "s--", "highs": "^-", "pot": "v-.", "cvxpy": "d:"}
    for ax, k in zip(axes[0], ks):
        for m in METHODS:
            pts = [(c["vocab_size"], c["median_s"][m]) for c in cells if c["num_drafts"] == k and m in c["median_s"]]
            if pts:
                line = ax.loglog(*zip(*pts), markers[m], label=LABELS[m])[0]
                bad = [
                    (c["vocab_size"], c["median_s"][m])
                    for c in cells
                    if c["num_drafts"] == k and m in c["median_s"] and inaccurate(c, m)
                ]
                if bad:
                    ax.loglog(*zip(*bad), "x", color=line.get_color(), markersize=9, label=f"{LABELS[m]}: wrong value")
        ax.set_xlabel("vocabulary size V")
        ax.set_title(f"K = {k} i.i.d. drafts")
    axes[0, 0].set_ylabel("median solve time (s)")
    axes[0, 0].legend(frameon=False, fontsize=6)
    return plots.save(fig, f"{out}/{NAME}", formats=formats)


def main(argv=None) -> list:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    if args.quick:
        params = dict(
            vocab_sizes=[4, 8, 16],
            num_drafts=[2, 3],
            instances=1,
            repeats=2,
            max_tuples=4096,
            max_pot_cells=1e6,
            budget_s=5.0,
            seed=0,
        )
    else:
        params = dict(
            vocab_sizes=[4, 8, 16, 32, 64, 128, 256, 1024, 8192, 32768, 151936],
            num_drafts=[2, 3, 4],
            instances=3,
            repeats=5,
            max_tuples=70_000,
            max_pot_cells=2e7,
            budget_s=20.0,
            seed=0,
        )
    results = _common.load_or_compute(args, NAME, params, compute)
    return _common.finish(NAME, results, args, draw, table)


if __name__ == "__main__":
    main(sys.argv[1:])
