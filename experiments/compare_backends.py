"""The two language-model backends side by side on the same prompts, seeds and tokens.

1. llama.cpp (:func:`otbound.lm.load_pair` with ``backend="llama.cpp"``): traces of the first
   ``--num-prompts`` prompts of each dataset (``collect_traces``, float32 logits), timed: load
   seconds, positions per second of the collection, peak RSS of this process, disk of the GGUF
   files and of the llama.cpp build.
2. With ``--transformers`` (needs ~13 GB of memory for the pair in float32): the transformers pair
   scores the **same tokens** (teacher-forced over each llama.cpp trace's prompt + continuation), so
   the two backends' laws are compared at the same positions of the same tokens: total variation
   distance of the target laws and of the draft laws (median, 90th percentile, max; misaligned
   positions or tokenisation would read ~1), and the effect on the report's quantities: α* per draft
   law and K, and each verifier's gap to α* (:func:`otbound.report.measure_laws` on both backends'
   laws, mean over positions, and the largest per-position difference).

Writes ``<out>/backends.json`` and prints a markdown table. Runs in a fresh process per backend
measurement would be cleaner for RSS; here the llama.cpp figures are taken before transformers loads.
It also measures the planner's forward-cost curves on llama.cpp (``otbound.plan.measure_forward_costs``).

    python experiments/compare_backends.py --num-prompts 3 --max-new-tokens 32 --out backends
    python experiments/compare_backends.py --num-prompts 20 --transformers --out backends   # ~13 GB
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


def _disk_gib(path: Path) -> float:
    path = Path(path)
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files) / 2**30


def _tv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return 0.5 * np.abs(a - b).sum(axis=-1)


def _quantiles(x) -> dict:
    x = np.asarray(x, dtype=np.float64)
    return {"median": float(np.median(x)), "p90": float(np.quantile(x, 0.9)), "max": float(x.max()),
            "positions": int(x.size)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="qwen2.5-coder")
    ap.add_argument("--datasets", nargs="+", default=["humaneval", "mtbench"])
    ap.add_argument("--num-prompts", type=int, default=3, help="prompts per dataset")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads per model (default: half the CPUs)")
    ap.add_argument("--transformers", action="store_true",
                    help="also score the same tokens with the transformers pair (float32, ~13 GB) and compare laws")
    ap.add_argument("--num-drafts", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--cost-sizes", type=int, nargs="+", default=[1, 4, 16, 32],
                    help="new-token counts of the forward-cost curves")
    ap.add_argument("--out", default="backends")
    args = ap.parse_args(argv)

    from otbound.lm import (
        OFFLINE_MODELS,
        PAIRS,
        collect_traces,
        ensure_gguf,
        llama_cpp_build,
        load_pair,
        load_prompts,
        load_traces,
    )

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"command": " ".join(["python", "experiments/compare_backends.py", *(argv or sys.argv[1:])]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "pair": args.pair}

    t0 = time.perf_counter()
    build = llama_cpp_build()
    result["llama_cpp_build_seconds"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    ggufs = [ensure_gguf(OFFLINE_MODELS[m]) for m in PAIRS[args.pair]]
    result["gguf_seconds"] = round(time.perf_counter() - t0, 1)
    result["disk_gib"] = {"gguf": round(sum(_disk_gib(g) for g in ggufs), 3),
                          "llama_cpp_build": round(_disk_gib(build.root), 3)}
    t0 = time.perf_counter()
    pair = load_pair(args.pair, backend="llama.cpp", threads=args.threads)
    result["llama_cpp_load_seconds"] = round(time.perf_counter() - t0, 1)
    prompts = [p for d in args.datasets for p in load_prompts(d, args.num_prompts)]
    t0 = time.perf_counter()
    paths = collect_traces(pair, prompts, out / "traces-llama.cpp", temperatures=[args.temperature],
                           max_new_tokens=args.max_new_tokens, seed=args.seed, logits_dtype="float32")
    seconds = time.perf_counter() - t0
    records = [next(load_traces(p)) for p in paths]
    n = sum(r.positions for r in records)
    result["llama_cpp"] = {"positions": n, "seconds": round(seconds, 1),
                           "positions_per_second": round(n / seconds, 2), "peak_rss_gib": round(_peak_rss_gib(), 2),
                           "threads": args.threads, "backend_info": pair.backend_info}
    from otbound.plan import measure_forward_costs

    result["llama_cpp"]["forward_seconds"] = {  # the planner's cost curves, on llama.cpp's kernels
        role: measure_forward_costs(model, vocab_size=pair.vocab_size, device="cpu", sizes=args.cost_sizes,
                                    context=128, repeats=3).as_dict()
        for role, model in (("draft", pair.draft), ("target", pair.target))}
    pair.draft.close()
    pair.target.close()
    del pair

    if args.transformers:
        import torch

        from otbound.lm import forward
        from otbound.report import measure_laws
        from otbound.token import laws_from_logits

        t0 = time.perf_counter()
        hf = load_pair(args.pair, device="cpu", dtype="float32")
        result["transformers_load_seconds"] = round(time.perf_counter() - t0, 1)
        tv_p, tv_q, t_forward = [], [], 0.0
        laws = {"llama.cpp": ([], []), "transformers": ([], [])}
        for r in records:
            prompt, cont = r.tokens[:r.prompt_length].tolist(), r.continuation.tolist()
            t0 = time.perf_counter()
            ids = torch.tensor([prompt + cont[:-1]])  # row t scores cont[t] after prompt + cont[:t]
            rows = slice(len(prompt) - 1, len(prompt) - 1 + len(cont))
            lt = forward(hf.target, ids)[0, rows, :hf.vocab_size].float()
            ld = forward(hf.draft, ids)[0, rows, :hf.vocab_size].float()
            t_forward += time.perf_counter() - t0

            p_h = laws_from_logits(lt.numpy(), args.temperature)
            q_h = laws_from_logits(ld.numpy(), args.temperature)
            tv_p += _tv(r.p, p_h).tolist()
            tv_q += _tv(r.q, q_h).tolist()
            laws["llama.cpp"][0].append(r.p)
            laws["llama.cpp"][1].append(r.q)
            laws["transformers"][0].append(p_h)
            laws["transformers"][1].append(q_h)
        result["transformers"] = {"teacher_forced_positions_per_second": round(n / t_forward, 2),
                                  "peak_rss_gib": round(_peak_rss_gib(), 2)}
        result["total_variation"] = {"target": _quantiles(tv_p), "draft": _quantiles(tv_q)}
        measured = {}
        for backend, (ps, qs) in laws.items():
            measured[backend] = measure_laws(np.concatenate(ps), np.concatenate(qs), args.num_drafts, seed=args.seed)
        effect = {}
        a, b = measured["llama.cpp"], measured["transformers"]
        for sampling, per_k in a["optimal"].items():
            for k, vals in per_k.items():
                x, y = np.asarray(vals), np.asarray(b["optimal"][sampling][k])
                effect[f"alpha*/{sampling}/K={k}"] = {"llama.cpp": float(x.mean()), "transformers": float(y.mean()),
                                                      "max_abs_position_diff": float(np.abs(x - y).max())}
        for name, per_k in a["verifiers"].items():
            for k, cell in per_k.items():
                opt_a = np.asarray(a["optimal"][cell["sampling"]][k])
                opt_b = np.asarray(b["optimal"][cell["sampling"]][k])
                gap_a = float((opt_a - np.asarray(cell["acceptance"])).mean())
                gap_b = float((opt_b - np.asarray(b["verifiers"][name][k]["acceptance"])).mean())
                effect[f"gap/{name}/K={k}"] = {"llama.cpp": gap_a, "transformers": gap_b, "method": cell["method"]}
        result["effect"] = effect
        del hf
        torch.cuda.empty_cache() if torch.cuda.is_available() else None

    (out / "backends.json").write_text(json.dumps(result, indent=1))
    lc = result["llama_cpp"]
    print(f"| backend | load s | positions/s | peak RSS GiB | disk GiB |\n|---|---|---|---|---|\n"
          f"| llama.cpp | {result['llama_cpp_load_seconds']} | {lc['positions_per_second']} | {lc['peak_rss_gib']} | "
          f"{result['disk_gib']['gguf'] + result['disk_gib']['llama_cpp_build']:.2f} |")
    if "total_variation" in result:
        tv = result["total_variation"]
        print(f"target TV median {tv['target']['median']:.4g} (p90 {tv['target']['p90']:.4g}, max "
              f"{tv['target']['max']:.4g}); draft TV median {tv['draft']['median']:.4g}")
    print(f"wrote {out / 'backends.json'}")
    return result


if __name__ == "__main__":
    main()
