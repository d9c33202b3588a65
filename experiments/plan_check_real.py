"""The planner's predictions against real decoding: for candidates of a plan (chains and trees, several
verifiers and draft laws) decode the traces' prompts end to end (:func:`otbound.lm.speculative_sample`,
a planned tree through :class:`otbound.block.verifiers.TreeShapeVerifier`) and put the measured mean acceptance
length and wall-clock speed-up beside the predicted ones, with 95% intervals.

Usage (the run folder holds the traces the plan was made on; ``cost.json`` of ``python -m
otbound.plan ... --device cpu``)::

    flock /tmp/otbound-real.lock nice python experiments/plan_check_real.py RUN --cost PLAN/cost.json \\
        --temperature 1.0 --num-prompts 20 --max-new-tokens 12 \\
        --candidates rrs:1x4 ot:3x3 kseq:2x2 rrs_wor:tree:2-2-1 greedy:tree:3-2-1 greedy:1x2

``verifier:KxL``: ``K`` chains of length ``L``; ``verifier:tree:b1-b2-...``: the uniform tree (draft
laws with distinct drafts only, :class:`otbound.block.verifiers.TreeShapeVerifier`); each verifier with its own
draft law.

Per prompt (the first ``--num-prompts`` of each dataset in the run folder, datasets alternating), in
one process: plain target sampling, then every candidate (the order rotated per prompt), each with
seed ``[seed, prompt]``. Measured: the mean acceptance length (``τ + 1`` per target call, every
iteration; cluster-robust 95% interval over prompts) and the speed-up (plain seconds per token over
the candidate's, both excluding the first iteration, which holds the prompt's prefill; 95% interval
by a paired cluster bootstrap over prompts). Predicted: the planner's ``evaluate`` on the same
prompts' traces, on the windows that start where the decoder runs (positions below
``--max-new-tokens``), with the verification costs measured here and the forward costs of
``--cost``. The load average is recorded around every cell. ``--budget-seconds`` stops starting new
prompts (every candidate runs on every prompt started); finished prompts are kept in a checkpoint
next to the results, so a rerun resumes.

Results: ``data/results/plan_check_real.json`` (configuration, per-prompt cells, rows, SHA-256);
``--tiny`` runs on the tiny random pair and its traces (``RUN`` collected with ``otbound.lm.tiny_pair``)
for trying the script.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402


def parse_candidate(spec: str):
    """``"rrs:2x3"`` → ``("rrs", chain_shape(2, 3))``; ``"rrs_wor:tree:2-2-1"`` → a tree shape."""
    from otbound.plan import chain_shape, tree_shape

    parts = spec.split(":")
    if len(parts) == 2 and "x" in parts[1].lower():
        k, length = (int(x) for x in parts[1].lower().split("x"))
        return parts[0], chain_shape(k, length)
    if len(parts) == 3 and parts[1] == "tree":
        return parts[0], tree_shape([int(x) for x in parts[2].split("-")])
    raise SystemExit(f"plan_check_real.py: error: candidate {spec!r} is neither verifier:KxL nor verifier:tree:b1-b2")


def truncated(table, positions: int):
    """The table on each trace's first ``positions`` positions."""
    cut = lambda arrays: [a[:positions] for a in arrays]  # noqa: E731
    return replace(table, lengths=[min(n, positions) for n in table.lengths],
                   optimal={law: {m: cut(v) for m, v in d.items()} for law, d in table.optimal.items()},
                   acceptance={n: {m: cut(v) for m, v in d.items()} for n, d in table.acceptance.items()})


def subset(table, keep):
    """The table on the traces ``keep`` (indices)."""
    pick = lambda arrays: [arrays[i] for i in keep]  # noqa: E731
    return replace(table, clusters=pick(table.clusters), lengths=pick(table.lengths),
                   optimal={law: {m: pick(v) for m, v in d.items()} for law, d in table.optimal.items()},
                   acceptance={n: {m: pick(v) for m, v in d.items()} for n, d in table.acceptance.items()})


def cached_table(chosen, max_drafts, names, path):
    """The acceptance table of the chosen traces, kept in ``path`` (pickle, keyed by the traces'
    files and the verifiers) so a rerun under the real-model lock does not recompute it."""
    import pickle

    from otbound import content_key
    from otbound import plan as pl

    key = content_key({"traces": [str(r.path) for r in chosen], "max_drafts": max_drafts, "verifiers": names})
    if path is not None and Path(path).exists():
        stored = pickle.loads(Path(path).read_bytes())
        if stored.get("key") == key:
            return stored["table"]
    table = pl.table_from_records(chosen, max_drafts=max_drafts, verifiers=names, progress=False)
    if path is not None:
        Path(path).write_bytes(pickle.dumps({"key": key, "table": table}))
    return table


def decoder_layout_speedup(cost, shape, levels, verifier) -> float:
    """The predicted speed-up with the decoder's own batch layout instead of a tree-attention forward:
    :func:`otbound.lm.speculative_sample` runs ``R = Π b_d`` rows, ``L`` draft forwards of ``R`` rows and
    one target forward of ``R·(L + 1)`` tokens (rows sharing a prefix are recomputed)."""
    b = shape["branching"]
    rows, length = int(np.prod(b)), len(b)
    levels = np.asarray(levels, dtype=np.float64)
    reach = np.concatenate([[1.0], levels[:-1]])
    per = cost.verify.get(verifier, {})
    secs = (length * cost.draft(rows) + cost.target(rows * (length + 1))
            + float(sum(r * per.get(int(x), 0.0) for r, x in zip(reach, b))))
    return (1.0 + float(levels.sum())) * cost.target(1) / secs


def decoder_verifier(name: str, shape: dict):
    from otbound.block.verifiers import TreeShapeVerifier

    return name if shape["kind"] == "chains" else TreeShapeVerifier(name, shape["branching"])


def decode_cell(pair, prompt, verifier, shape, temperature, max_new_tokens, seed, dtype_note):
    from otbound.lm import speculative_sample

    if verifier is None:
        run = speculative_sample(pair, prompt, block_len=0, temperature=temperature, max_new_tokens=max_new_tokens,
                                 seed=seed)
    else:
        b = shape["branching"]
        run = speculative_sample(pair, prompt, verifier=decoder_verifier(verifier, shape), num_drafts=b[0],
                                 block_len=len(b), temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    its = run.iterations
    steady = its[1:]
    return {"tau": [int(it.num_accepted) for it in its],
            "steady_seconds": float(sum(it.draft_seconds + it.target_seconds + it.verify_seconds for it in steady)),
            "steady_tokens": int(sum(it.num_kept for it in steady)),
            "draft_seconds": float(sum(it.draft_seconds for it in steady)),
            "target_seconds": float(sum(it.target_seconds for it in steady)),
            "verify_seconds": float(sum(it.verify_seconds for it in steady)),
            "tokens": len(run.tokens), "seconds": float(run.seconds), "load": round(os.getloadavg()[0], 2),
            "model_dtype": dtype_note}


def bootstrap_ratio(plain_s, plain_n, cand_s, cand_n, reps: int = 4000, seed: int = 0):
    """Speed-up ``(Σ plain_s / Σ plain_n) / (Σ cand_s / Σ cand_n)`` and its paired cluster-bootstrap
    95% interval over prompts."""
    plain_s, plain_n, cand_s, cand_n = (np.asarray(x, dtype=np.float64) for x in (plain_s, plain_n, cand_s, cand_n))
    point = (plain_s.sum() / plain_n.sum()) / (cand_s.sum() / cand_n.sum())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, plain_s.size, size=(reps, plain_s.size))
    boot = (plain_s[idx].sum(1) / plain_n[idx].sum(1)) / (cand_s[idx].sum(1) / cand_n[idx].sum(1))
    return float(point), [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="run folder with the traces (traces/)")
    ap.add_argument("--candidates", nargs="+", required=True)
    ap.add_argument("--cost", help="cost.json of the plan (forward costs); default: the plan's synthetic curves")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--num-prompts", type=int, default=20, help="prompts per dataset")
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--budget-seconds", type=float, default=None, help="start no new prompt after this")
    ap.add_argument("--tiny", action="store_true", help="the tiny random pair (trying the script)")
    ap.add_argument("--table-cache", default=None, help="pickle keeping the acceptance table between runs")
    ap.add_argument("--table-only", action="store_true", help="measure the acceptance table (no models) and stop")
    ap.add_argument("--results", default=str(_common.RESULTS / "plan_check_real.json"))
    ap.add_argument("--figure", default=str(_common.FIGURES / "plan_check_real.png"))
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    from otbound import plan as pl
    from otbound.report import cluster_mean_ci

    cands = [parse_candidate(s) for s in args.candidates]
    records = pl.load_run_traces(args.run, temperature=args.temperature)
    by_ds: dict = {}
    for r in sorted(records, key=lambda r: (r.dataset, len(r.prompt_id), r.prompt_id)):
        by_ds.setdefault(r.dataset, []).append(r)
    chosen = [r for group in zip(*[v[: args.num_prompts] for v in by_ds.values()]) for r in group]
    names = sorted({n for n, _ in cands})
    max_b = max(max(s["branching"]) for _, s in cands)
    depth = max(len(s["branching"]) for _, s in cands)
    table = cached_table(chosen, max_b, names, args.table_cache)
    if args.table_only:
        print(f"acceptance table of {len(chosen)} traces in {args.table_cache}")
        return None
    if args.cost:
        draft, target, machine = pl.load_cost(args.cost)  # checked: its SHA-256 and its fitted fields
        cost = pl.CostModel(draft, target, machine=machine)
    else:
        cost = pl.synthetic_cost_model()
    r0 = chosen[0]
    ps, qs = r0.laws_at(slice(0, min(5, r0.positions)))
    cost.verify = pl.measure_verify_costs({n: table.drafts_measured(n) for n in names}, list(zip(ps, qs)))

    params = {"run": str(args.run), "candidates": args.candidates, "temperature": args.temperature,
              "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
              "device": args.device, "tiny": args.tiny, "prompts": [f"{r.dataset}/{r.prompt_id}" for r in chosen]}
    cp = _common.Checkpoint(Path(args.results), params)
    load_before = os.getloadavg()[0]
    if args.tiny:
        from otbound.lm import tiny_pair

        pair, dtype_note = tiny_pair(), "float32 (tiny pair)"
    else:
        from otbound.lm import load_pair

        dtype_note = r0.meta.get("model_dtype") or "auto"
        pair = load_pair(r0.meta.get("pair") or "qwen2.5-coder", device=args.device, dtype=dtype_note)
    prompt_of = lambda r: [int(t) for t in r.tokens[: r.prompt_length]]  # noqa: E731
    decode_cell(pair, prompt_of(chosen[0]), None, None, args.temperature, 3, [args.seed, 10**6], dtype_note)  # warm-up
    cells = [(None, None)] + cands
    t_decode = time.perf_counter()
    for j, rec in enumerate(chosen):
        if cp.get(str(j)) is not None:
            continue
        if args.budget_seconds is not None and time.perf_counter() - t_decode > args.budget_seconds:
            print(f"budget reached after {j} prompts", flush=True)
            break
        order = list(range(len(cells)))
        order = order[j % len(order):] + order[: j % len(order)]
        out = {}
        for i in order:
            name, shape = cells[i]
            key = "plain" if name is None else args.candidates[i - 1]
            out[key] = decode_cell(pair, prompt_of(rec), name, shape, args.temperature, args.max_new_tokens,
                                   [args.seed, j], dtype_note)
        cp.put(str(j), out)
        print(f"prompt {j + 1}/{len(chosen)} {rec.dataset}/{rec.prompt_id}: "
              + ", ".join(f"{k} {np.mean(v['tau']) + 1:.2f}" for k, v in out.items() if k != "plain")
              + f" ({time.perf_counter() - t_start:.0f} s, load {os.getloadavg()[0]:.1f})", flush=True)
    done = [cp.get(str(j)) for j in range(len(chosen)) if cp.get(str(j)) is not None]
    done_idx = [j for j in range(len(chosen)) if cp.get(str(j)) is not None]
    if not done:
        raise SystemExit("plan_check_real.py: error: no prompt decoded (raise --budget-seconds)")
    sub_table = subset(table, done_idx)
    sub_window = truncated(sub_table, args.max_new_tokens + depth - 1)
    rows = []
    for spec, (name, shape) in zip(args.candidates, cands):
        law = table.sampling[name]
        pred = pl.evaluate(sub_window, cost, law, name, shape)
        full = pl.evaluate(sub_table, cost, law, name, shape)
        tau = np.concatenate([np.asarray(c[spec]["tau"], dtype=np.float64) for c in done])
        clusters = np.concatenate([np.full(len(c[spec]["tau"]), j) for j, c in enumerate(done)])
        mal, half = cluster_mean_ci(tau + 1.0, clusters)
        speed, speed_ci = bootstrap_ratio([c["plain"]["steady_seconds"] for c in done],
                                          [c["plain"]["steady_tokens"] for c in done],
                                          [c[spec]["steady_seconds"] for c in done],
                                          [c[spec]["steady_tokens"] for c in done])
        rows.append({
            "candidate": spec, "verifier": name, "draft_law": law, "shape": shape,
            "predicted_mean_acceptance_length": pred.mean_acceptance_length,
            "predicted_interval": pred.mean_acceptance_length_interval,
            "predicted_all_positions": full.mean_acceptance_length,
            "bound_mean_acceptance_length": pred.bound_mean_acceptance_length,
            "measured_mean_acceptance_length": mal, "measured_interval": [mal - half, mal + half],
            "difference": mal - pred.mean_acceptance_length,
            "prediction_inside_measured_interval": bool(mal - half <= pred.mean_acceptance_length <= mal + half),
            "iterations": int(tau.size), "predicted_speedup": pred.predicted_speedup,
            "predicted_speedup_interval": pred.predicted_speedup_interval,
            "predicted_speedup_decoder_layout": decoder_layout_speedup(cost, shape, pred.per_position_acceptance, name),
            "measured_speedup": speed, "measured_speedup_interval": speed_ci,
            "measured_seconds_per_iteration": {
                part: float(sum(c[spec][f"{part}_seconds"] for c in done)
                            / max(sum(len(c[spec]["tau"]) - 1 for c in done), 1))
                for part in ("draft", "target", "verify")},
            "predicted_seconds_per_iteration": pred.iteration_seconds,
            "load": [float(min(c[spec]["load"] for c in done)), float(max(c[spec]["load"] for c in done))]})
    plain_spt = sum(c["plain"]["steady_seconds"] for c in done) / max(sum(c["plain"]["steady_tokens"] for c in done), 1)
    results = {"prompts_decoded": len(done), "plain_seconds_per_token": plain_spt,
               "predicted_plain_seconds_per_token": float(cost.target(1)), "rows": rows, "cells": done,
               "pair": getattr(pair, "name", "tiny"), "model_dtype": dtype_note,
               "traces": table.source, "cost_machine": cost.machine}
    stored = {"meta": {"load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                       "script": "experiments/plan_check_real.py",
                       "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "seconds": round(time.perf_counter() - t_start, 1),
                       "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "command": " ".join(sys.argv)},
              "params": params, "results": results}
    stored["meta"]["sha256"] = _common._results_key(stored)
    _common.write_json(Path(args.results), stored)
    if len(done) == len(chosen):
        cp.done()
    figure(stored, args.figure)
    print(markdown(stored))
    return stored


def figure(stored: dict, path) -> None:
    """Predicted against measured mean acceptance length (left) and speed-up (right), 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = stored["results"]["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, (pk, pi, mk, mi, title) in zip(axes, [
            ("predicted_mean_acceptance_length", "predicted_interval", "measured_mean_acceptance_length",
             "measured_interval", "mean acceptance length"),
            ("predicted_speedup", "predicted_speedup_interval", "measured_speedup", "measured_speedup_interval",
             "speed-up over plain decoding")]):
        for r in rows:
            x, y = r[pk], r[mk]
            xerr = [[x - r[pi][0]], [r[pi][1] - x]]
            yerr = [[y - r[mi][0]], [r[mi][1] - y]]
            ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", capsize=3, label=r["candidate"])
        lo = min(min(r[pi][0], r[mi][0]) for r in rows)
        hi = max(max(r[pi][1], r[mi][1]) for r in rows)
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        ax.set_xlabel(f"predicted {title}")
        ax.set_ylabel(f"measured {title}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    meta = stored["meta"]
    fig.suptitle(f"planner vs end-to-end decoding, {stored['results']['prompts_decoded']} prompts "
                 f"({meta['created'][:10]}, load {meta['load_average_1min'][0]}–{meta['load_average_1min'][1]})",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def markdown(stored: dict) -> str:
    """The comparison table of a results file."""
    lines = ["| candidate | law | predicted mean acceptance length (95%) | bound | measured (95%) | measured − "
             "predicted | iterations | predicted speed-up (decoder's layout) | measured speed-up (95%) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in stored["results"]["rows"]:
        lo, hi = r["predicted_interval"]
        mlo, mhi = r["measured_interval"]
        slo, shi = r["measured_speedup_interval"]
        lines.append(f"| {r['candidate']} | {r['draft_law']} | {r['predicted_mean_acceptance_length']:.3f} "
                     f"[{lo:.3f}, {hi:.3f}] | {r['bound_mean_acceptance_length']:.3f} | "
                     f"{r['measured_mean_acceptance_length']:.3f} [{mlo:.3f}, {mhi:.3f}] | {r['difference']:+.3f} | "
                     f"{r['iterations']} | {r['predicted_speedup']:.2f} "
                     f"({r['predicted_speedup_decoder_layout']:.2f}) | "
                     f"{r['measured_speedup']:.2f} "
                     f"[{slo:.2f}, {shi:.2f}] |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
