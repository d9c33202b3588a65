"""The draft temperature as a knob on stored traces: per position and per run, the temperature τ at
which the drafter should sample to maximise α*(p, softmax(z_q/τ), K) (τ = 0: deterministic top-K
drafting), beside α* at the traces' own temperature and at τ = 0, and the mean α* curve in τ.

The traces are those of a run of the main job with its logits stored (``<run>/traces``, read with
:func:`otbound.lm.load_traces`): p is the target's law at the traces' settings, z_q the draft's
stored logits. On the real pair::

    python -m otbound.compare --datasets humaneval mtbench --num-prompts 20 --max-new-tokens 32 \\
        --temperature 0.7 1.0 --num-drafts 1 2 4 --out /work/runs/main
    python experiments/draft_temperature_real.py --traces /work/runs/main/traces --temperature 1.0 \\
        --num-drafts 1 2 4 --out draft_temperature_real.json

:func:`otbound.best_draft_temperature` (grid of ``--grid`` temperatures in ``--bounds``, bounded
Brent refinement to ``xatol = 1e-4`` in log τ, both ends). ``--tiny`` runs the same on traces of
:func:`otbound.lm.tiny_pair` collected into a temporary folder (seconds; the figures mean nothing
about real models).
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


def measure(traces, num_drafts, *, temperature=None, sampling="with_replacement", bounds=(0.05, 5.0), grid=25,
            max_positions=None) -> dict:
    """Per K: the per-position best τ (quartiles, share deterministic / uniform), the mean α* there,
    the per-run best τ and its mean α*, the mean α* at the traces' temperature and at τ = 0, and the
    mean curve on the grid."""
    import otbound as ob
    from otbound.lm import load_traces
    from otbound.report import cluster_mean_ci

    records = list(load_traces(traces, temperature=temperature))
    if not records:
        raise SystemExit(f"no traces under {traces}")
    temps = sorted({float(r.temperature) for r in records})
    if len(temps) > 1:
        raise SystemExit(f"traces at several temperatures {temps}: choose one with --temperature")
    P, Z, clusters = [], [], []
    from gls_real import positions

    for rec in records:
        ts = positions(rec.positions, max_positions)
        P.append(rec.p[ts])
        Z.append(np.asarray(rec.draft_logits[ts], dtype=np.float64))
        clusters += [f"{rec.dataset}/{rec.prompt_id}"] * ts.size
    P, Z = np.concatenate(P), np.concatenate(Z)
    out = {}
    for k in num_drafts:
        res = ob.best_draft_temperature(P, Z, k, sampling, bounds=bounds, grid=grid)
        own = ob.draft_temperature_curve(P, Z, k, [temps[0]], sampling)[:, 0]
        taus = np.asarray(res.temperature)
        finite = taus[np.isfinite(taus) & (taus > 0)]
        row = {
            "best_per_position": dict(zip(("mean", "ci"), cluster_mean_ci(res.acceptance, clusters))),
            "at_trace_temperature": dict(zip(("mean", "ci"), cluster_mean_ci(own, clusters))),
            "deterministic": dict(zip(("mean", "ci"), cluster_mean_ci(res.deterministic, clusters))),
            "run_temperature": res.run_temperature, "run_acceptance": res.run_acceptance,
            "share_deterministic": float(np.mean(taus == 0.0)), "share_uniform": float(np.mean(np.isinf(taus))),
            "tau_quartiles": np.quantile(finite, [0.25, 0.5, 0.75]).tolist() if finite.size else None,
            "curve": {"temperatures": res.temperatures.tolist(), "mean_alpha_star": res.curve.mean(0).tolist()},
        }
        out[str(k)] = row
        print(f"draft_temperature_real: T = {temps[0]:g}, K = {k} done ({len(clusters)} positions)", file=sys.stderr,
              flush=True)
    return {"positions": len(clusters), "traces": len(records), "trace_temperature": temps[0],
            "vocab_size": int(P.shape[1]), "sampling": sampling, "bounds": list(bounds), "grid": grid, "by_k": out}


def table(res: dict) -> str:
    t = res["trace_temperature"]
    lines = [f"| K | α* at τ = {t:g} | α* at τ = 0 | best τ per position: α* | τ quartiles | share τ = 0 "
             "| best τ per run | its α* |", "|---|---|---|---|---|---|---|---|"]
    for k, r in res["by_k"].items():
        q = "—" if r["tau_quartiles"] is None else " / ".join(f"{x:.2f}" for x in r["tau_quartiles"])
        lines.append(f"| {k} | {r['at_trace_temperature']['mean']:.4f} ± {r['at_trace_temperature']['ci']:.4f} "
                     f"| {r['deterministic']['mean']:.4f} | {r['best_per_position']['mean']:.4f} | {q} "
                     f"| {r['share_deterministic']:.2f} | {r['run_temperature']:.3f} | {r['run_acceptance']:.4f} |")
    return "\n".join(lines)


def draw(runs: list, path) -> None:
    """Mean α* against the draft temperature τ (log axis), one panel per run, one line per K; marked:
    the per-run best τ and the traces' own temperature; dashed: the mean of the per-position best."""
    from otbound.report import plots

    fig, axes = plots.figure(ncols=len(runs), height=2.4)
    for ax, res in zip(axes.ravel(), runs):
        for i, (k, r) in enumerate(res["by_k"].items()):
            c = f"C{i}"
            ax.plot(r["curve"]["temperatures"], r["curve"]["mean_alpha_star"], color=c, label=f"K = {k}")
            ax.plot([r["run_temperature"]], [r["run_acceptance"]], "v", color=c, ms=5)
            ax.axhline(r["best_per_position"]["mean"], color=c, ls="--", lw=0.8)
            ax.axhline(r["deterministic"]["mean"], color=c, ls=":", lw=0.8)
        ax.axvline(res["trace_temperature"], color="k", lw=0.6, alpha=0.5)
        ax.set_xscale("log")
        ax.set_xlabel("draft temperature τ")
        ax.set_title(f"T = {res['trace_temperature']:g}, {res['positions']} positions")
    axes.ravel()[0].set_ylabel("mean α*")
    axes.ravel()[-1].legend(loc="lower left")
    plots.save(fig, Path(path).with_suffix(""), ("png",))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--traces", help="a trace file or folder (e.g. <run>/traces)")
    src.add_argument("--tiny", action="store_true", help="traces of the tiny random pair (seconds)")
    ap.add_argument("--num-drafts", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--temperature", type=float, nargs="+", default=None,
                    help="only the traces of these temperatures (several: one result per temperature, under 'runs')")
    ap.add_argument("--sampling", default="with_replacement", choices=("with_replacement", "without_replacement"))
    ap.add_argument("--bounds", type=float, nargs=2, default=[0.05, 5.0])
    ap.add_argument("--grid", type=int, default=25)
    ap.add_argument("--max-positions", type=int, default=None,
                    help="positions per trace, evenly spaced (default all)")
    ap.add_argument("--out", default=None, help="write the result here (JSON)")
    ap.add_argument("--figure", default=None, help="draw the figure here (PNG)")
    args = ap.parse_args(argv)
    if args.max_positions is not None and args.max_positions < 1:
        ap.error("--max-positions must be positive")
    start = time.time()
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # gls_real: the tiny traces, the positions
    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            import gls_real

            traces = gls_real.tiny_traces(Path(tmp))
        else:
            traces = Path(args.traces)
        runs = [measure(traces, args.num_drafts, temperature=t, sampling=args.sampling, bounds=tuple(args.bounds),
                        grid=args.grid, max_positions=args.max_positions) for t in (args.temperature or [None])]
    res = runs[0] if len(runs) == 1 else {"runs": runs}
    from otbound import content_key

    res["sha256"] = content_key(runs)  # checksum of the measured values (otbound.content_key of 'runs' as a list)
    res.update(command="python experiments/draft_temperature_real.py " + " ".join(sys.argv[1:] if argv is None
                                                                                  else argv),
               pair="tiny(V=16)" if args.tiny else str(args.traces), wall_s=round(time.time() - start, 1),
               date=time.strftime("%Y-%m-%d"), machine=f"{platform.machine()}, {os.cpu_count()} CPUs")
    print("\n\n".join(table(r) for r in runs))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    if args.figure:
        from otbound.report import plots

        plots.use_file_backend()
        draw(runs, args.figure)
    return res


if __name__ == "__main__":
    main()
