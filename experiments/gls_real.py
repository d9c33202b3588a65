"""Gumbel-max list sampling on stored traces: its exact acceptance at every position beside α* of its
draft law (K i.i.d. drafts), SpecInfer's RRS and the optimal verifier ``ot``, with cluster-robust
95% intervals (one cluster per trace) and the paired gaps to α*.

The traces are those of a run of the main job with its logits stored (``<run>/traces``, read with
:func:`otbound.lm.load_traces`; the laws at the traces' own temperature), e.g. on the real pair::

    python -m otbound.compare --datasets humaneval mtbench --num-prompts 20 --max-new-tokens 32 \\
        --temperature 1.0 --num-drafts 1 2 4 --out /work/runs/main
    python experiments/gls_real.py --traces /work/runs/main/traces --num-drafts 1 2 4 --out gls_real.json

GLS's acceptance is exact: closed form at K = 1 (0.2 s per position at V = 151,936), a quadrature
in the clock time at K ≥ 2 (about 400 evaluations of O(V) each: 25–35 s per position and K at
V = 151,936 on the project's loaded 2-core machine; ``--max-positions`` caps the positions per
trace, evenly spaced). ``--mc-samples N`` replaces it at K ≥ 2 by the accepted fraction of N draft
tuples drawn and verified per position (Monte Carlo, standard error ≤ 0.5/√N per position; the
interval of the mean over positions then covers both sources of variation, and ``mc_se`` states
the Monte Carlo part of the mean's error alone, √(Σ a(1 − a)/N)/n over the n positions).
``--temperature 0.7 1.0`` gives one result per temperature (under ``runs``), ``--figure`` draws
them. ``--tiny`` runs the same on traces of :func:`otbound.lm.tiny_pair` collected into a
temporary folder (seconds; the figures mean nothing about real models).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

VERIFIERS = ("gls", "rrs", "ot")


def tiny_traces(folder: Path, prompts: int = 4, new_tokens: int = 6) -> Path:
    """Traces of the tiny random pair in ``folder`` (for tests and a dry run)."""
    from otbound.lm import Prompt, collect_traces, tiny_pair, tiny_prompts

    pair = tiny_pair(vocab_size=16)
    ids = tiny_prompts(pair, prompts)
    collect_traces(pair, [Prompt(f"tiny/{i}", "tiny", "", tuple(x)) for i, x in enumerate(ids)], folder,
                   max_new_tokens=new_tokens, progress=False)
    return folder


def positions(n: int, cap: int | None) -> np.ndarray:
    """Continuation indices of a trace of ``n`` positions: all, or ``cap`` of them evenly spaced
    (first and last included) so that early and late positions weigh alike.

    Examples
    --------
    >>> positions(5, None).tolist(), positions(32, 4).tolist(), positions(3, 8).tolist()
    ([0, 1, 2, 3, 4], [0, 10, 21, 31], [0, 1, 2])
    """
    if cap is None or cap >= n:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, cap).round().astype(np.int64))


def _gls_acceptance(p, q, k, mc_samples, rng):
    import otbound as ob

    gls = ob.VERIFIERS["gls"]
    if k == 1 or not mc_samples:
        return gls.acceptance(p, q, k)
    drafts = ob.sample_drafts(q, k, "with_replacement", mc_samples, rng)
    return float(gls.sample(p, q, drafts, rng).accepted.mean())


def measure(traces, num_drafts, *, temperature=None, max_positions=None, mc_samples=None, seed=0) -> dict:
    """Per K: mean and 95% cluster-robust half-width of α*(with replacement) and of each verifier's
    exact acceptance, and each verifier's paired gap to α*."""
    import otbound as ob
    from otbound.lm import load_traces
    from otbound.report import cluster_mean_ci

    rows = {k: {name: [] for name in ("alpha_star", *VERIFIERS)} for k in num_drafts}
    rng = np.random.default_rng(seed)
    clusters = []
    records = list(load_traces(traces, temperature=temperature))
    if not records:
        raise SystemExit(f"no traces under {traces}")
    for i, rec in enumerate(records):
        for t in positions(rec.positions, max_positions):
            p, q = rec.p[t], rec.q[t]
            clusters.append(f"{rec.dataset}/{rec.prompt_id}")
            for k in num_drafts:
                rows[k]["alpha_star"].append(ob.optimal_acceptance(p, q, k))
                for name in VERIFIERS:
                    rows[k][name].append(_gls_acceptance(p, q, k, mc_samples, rng) if name == "gls"
                                         else ob.VERIFIERS[name].acceptance(p, q, k))
        print(f"gls_real: {i + 1}/{len(records)} traces, {len(clusters)} positions", file=sys.stderr, flush=True)
    out = {}
    for k, cols in rows.items():
        star = np.asarray(cols["alpha_star"])
        entry = {}
        for name, vals in cols.items():
            vals = np.asarray(vals)
            mean, half = cluster_mean_ci(vals, clusters)
            entry[name] = {"mean": mean, "ci": half}
            if name != "alpha_star":
                gap, gap_half = cluster_mean_ci(vals - star, clusters)
                entry[name].update(gap=gap, gap_ci=gap_half, max_over_alpha_star=float((vals - star).max()))
        if mc_samples and k > 1:  # the Monte Carlo part alone: √(Σ a(1 − a)/N) / n over the n positions
            a = np.asarray(cols["gls"])
            entry["gls"]["mc_se"] = float(np.sqrt((a * (1 - a)).sum() / mc_samples) / a.size)
        out[str(k)] = entry
    return {"positions": len(clusters), "traces": len(records), "by_k": out,
            "gls_method": "exact" if not mc_samples else f"exact at K = 1, Monte Carlo ({mc_samples} tuples) at K ≥ 2",
            "vocab_size": int(records[0].p.shape[1]), "temperature": float(records[0].temperature)}


def table(res: dict) -> str:
    lines = ["| K | α* (wr) | " + " | ".join(VERIFIERS) + " |", "|---|---|" + "---|" * len(VERIFIERS)]
    for k, e in res["by_k"].items():
        cells = [f"{e['alpha_star']['mean']:.4f} ± {e['alpha_star']['ci']:.4f}"]
        cells += [f"{e[n]['mean']:.4f} (gap {e[n]['gap']:+.4f} ± {e[n]['gap_ci']:.4f})" for n in VERIFIERS]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def draw(runs: list, path) -> None:
    """Mean acceptance against K, one panel per run (temperature): α* of the K i.i.d. drafts' law
    and each verifier, with the 95% cluster-robust intervals."""
    from otbound.report import plots

    fig, axes = plots.figure(ncols=len(runs), height=2.4)
    for ax, res in zip(axes.ravel(), runs):
        ks = [int(k) for k in res["by_k"]]
        for j, name in enumerate(("alpha_star", *VERIFIERS)):
            mean = np.array([res["by_k"][str(k)][name]["mean"] for k in ks])
            ci = np.array([res["by_k"][str(k)][name]["ci"] for k in ks])
            shift = (j - 1.5) * 0.04  # side by side at each K
            ax.errorbar(np.array(ks) * (1 + shift), mean, yerr=ci, marker="o" if name != "alpha_star" else "_",
                        ms=4 if name != "alpha_star" else 10, capsize=2, lw=1,
                        color="k" if name == "alpha_star" else plots.color(name),
                        label="α* (K i.i.d. drafts)" if name == "alpha_star" else name)
        ax.set_xscale("log", base=2)
        plots.integer_ticks(ax, ks)
        ax.set_xlabel("drafts K")
        ax.set_title(f"T = {res['temperature']:g}, {res['positions']} positions of {res['traces']} traces")
    axes.ravel()[0].set_ylabel("mean acceptance")
    axes.ravel()[-1].legend(loc="lower right")
    plots.save(fig, Path(path).with_suffix(""), ("png",))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--traces", help="a trace file or folder (e.g. <run>/traces)")
    src.add_argument("--tiny", action="store_true", help="traces of the tiny random pair (seconds)")
    ap.add_argument("--num-drafts", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--temperature", type=float, nargs="+", default=None,
                    help="only the traces of these temperatures (several: one result per temperature, under 'runs')")
    ap.add_argument("--max-positions", type=int, default=None,
                    help="positions per trace, evenly spaced (default all)")
    ap.add_argument("--mc-samples", type=int, default=None, help="GLS at K ≥ 2 by Monte Carlo (tuples per position)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the result here (JSON)")
    ap.add_argument("--figure", default=None, help="draw the figure here (PNG)")
    args = ap.parse_args(argv)
    for name in ("max_positions", "mc_samples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    start = time.time()
    temps = args.temperature or [None]
    with tempfile.TemporaryDirectory() as tmp:
        traces = tiny_traces(Path(tmp)) if args.tiny else Path(args.traces)
        runs = [measure(traces, args.num_drafts, temperature=t, max_positions=args.max_positions,
                        mc_samples=args.mc_samples, seed=args.seed) for t in temps]
    res = runs[0] if len(runs) == 1 else {"runs": runs}
    from otbound import content_key

    res["sha256"] = content_key(runs)  # checksum of the measured values (otbound.content_key of 'runs' as a list)
    res.update(command="python experiments/gls_real.py " + " ".join(sys.argv[1:] if argv is None else argv),
               pair="tiny(V=16)" if args.tiny else str(args.traces), wall_s=round(time.time() - start, 1),
               date=time.strftime("%Y-%m-%d"), machine=f"{platform.machine()}, {os.cpu_count()} CPUs")
    print("\n\n".join(f"T = {r['temperature']:g}\n" + table(r) for r in runs))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    if args.figure:
        from otbound.report import plots

        plots.use_file_backend()
        draw(runs, args.figure)
    return res


if __name__ == "__main__":
    main()
