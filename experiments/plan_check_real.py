"""The planner's predictions against real decoding: for chain candidates of a plan made on a
pair's traces, run the end-to-end decoder (:func:`otbound.report.end_to_end_rows`, i.e.
:func:`otbound.lm.speculative_sample` on the same prompts and temperature) and put the measured
mean acceptance length and wall-clock speed-up beside the predicted ones, with their 95% intervals.

Usage (after ``python -m otbound.plan --collect ... --out RUN``)::

    PYTHONPATH=. nice python experiments/plan_check_real.py RUN --candidates rrs:1x3 greedy:3x2 rrs:2x2

``verifier:KxL``: ``K`` chains of length ``L`` verified by ``verifier`` (its own draft law). Writes
``RUN/check.json`` and ``RUN/check.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--candidates", nargs="+", required=True)
    ap.add_argument("--pair", default="qwen2.5-coder")
    ap.add_argument("--datasets", nargs="+", default=["humaneval", "mtbench"])
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)

    from otbound.lm import encode_prompt, load_pair, load_prompts
    from otbound.report import end_to_end_rows

    run = Path(args.run)
    plan = json.loads((run / "plan.json").read_text())
    temperature = plan["source"]["temperature"]
    pair = load_pair(args.pair, device=args.device)
    prompts = [encode_prompt(pair.tokenizer, p) for d in args.datasets for p in load_prompts(d, args.num_prompts)]
    rows = []
    for spec in args.candidates:
        name, shape = spec.split(":")
        k, length = (int(x) for x in shape.lower().split("x"))
        pred = next(c for c in plan["candidates"] if c["verifier"] == name and c["shape"]["kind"] == "chains"
                    and c["shape"]["num_drafts"] == k and c["shape"]["block_len"] == length)
        t0 = time.perf_counter()
        (row,) = end_to_end_rows(pair, prompts, verifiers=[name], num_drafts=(k,), block_lens=(length,),
                                 temperature=temperature, max_new_tokens=args.max_new_tokens, seed=args.seed,
                                 exact_context=False, bounds=False, progress=False)
        lo, hi = pred["mean_acceptance_length_interval"]
        m, h = row.mean_acceptance_length, row.mean_acceptance_length_ci
        rows.append({
            "verifier": name, "draft_law": pred["draft_law"], "num_drafts": k, "block_len": length,
            "predicted_mean_acceptance_length": pred["mean_acceptance_length"], "predicted_interval": [lo, hi],
            "bound_mean_acceptance_length": pred["bound_mean_acceptance_length"],
            "measured_mean_acceptance_length": m, "measured_interval": [m - h, m + h],
            "prediction_inside_measured_interval": bool(m - h <= pred["mean_acceptance_length"] <= m + h),
            "predicted_speedup": pred["predicted_speedup"], "measured_speedup": row.speedup,
            "measured_acceptance_rate": row.acceptance_rate, "predicted_acceptance_rate": pred["acceptance_rate"],
            "iterations": row.iterations, "seconds": round(time.perf_counter() - t0, 1)})
        print(json.dumps(rows[-1]), flush=True)
    (run / "check.json").write_text(json.dumps({"pair": pair.name, "temperature": temperature, "prompts": len(prompts),
                                                "max_new_tokens": args.max_new_tokens, "seed": args.seed,
                                                "rows": rows}, indent=1))
    lines = ["| verifier | law | K × L | predicted mean acceptance length (95%) | bound | measured (95%) | inside? "
             "| predicted speed-up | measured speed-up | iterations |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['verifier']} | {r['draft_law']} | {r['num_drafts']} × {r['block_len']} | "
            f"{r['predicted_mean_acceptance_length']:.3f} [{r['predicted_interval'][0]:.3f}, "
            f"{r['predicted_interval'][1]:.3f}] | {r['bound_mean_acceptance_length']:.3f} | "
            f"{r['measured_mean_acceptance_length']:.3f} [{r['measured_interval'][0]:.3f}, "
            f"{r['measured_interval'][1]:.3f}] | {'yes' if r['prediction_inside_measured_interval'] else 'no'} | "
            f"{r['predicted_speedup']:.2f} | {r['measured_speedup']:.2f} | {r['iterations']} |")
    (run / "check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
