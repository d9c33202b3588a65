"""Trace-collection throughput (positions/s) against plain step-by-step generation with per-step
scoring of both models, in the same process.

Baseline, per prompt: prefill both models, then per step one target decode step and one draft
decode step (KV caches), softmax at T of both, sample the next token from the target's law and
keep p and q on the CPU. otbound (:func:`otbound.lm.collect_traces`): target-only sampling batched
over prompts, then one teacher-forced forward per model for the whole batch, written to disk.

    python experiments/bench_traces.py                        # real offline Qwen pair if converted,
                                                              # else random weights of the same shapes
    python experiments/bench_traces.py --pair random --dtype bfloat16 --prompts 8 --max-new-tokens 32
    python experiments/bench_traces.py --device cuda --batch-size 64 --prompts 64   # GPU path

Prints the median over ``--repeats`` runs of each and the ratio of medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch

from otbound.lm import (
    OFFLINE_MODELS,
    PAIRS,
    Prompt,
    collect_traces,
    encode_prompt,
    forward,
    load_pair,
    load_prompts,
    random_pair,
    stop_token_ids,
)


def baseline(pair, encoded, temperature, max_new_tokens, seed) -> int:
    """Step-by-step generation scoring both models at every step; returns positions produced."""
    from transformers import DynamicCache

    gen = torch.Generator(device=pair.device).manual_seed(seed)
    stops = set(stop_token_ids(pair.tokenizer, pair.target)) if pair.tokenizer is not None else set()
    v = pair.vocab_size
    positions = 0
    for ids in encoded:
        x = torch.as_tensor([ids], device=pair.device)
        caches = [DynamicCache(config=m.config) for m in (pair.target, pair.draft)]
        lt, ld = (forward(m, x, cache=c, keep=1) for m, c in zip((pair.target, pair.draft), caches))
        ps, qs = [], []
        for _ in range(max_new_tokens):
            p = torch.softmax(lt[0, -1, :v].float() / temperature, -1)
            q = torch.softmax(ld[0, -1, :v].float() / temperature, -1)
            ps.append(p.cpu().numpy())
            qs.append(q.cpu().numpy())
            tok = torch.multinomial(p, 1, generator=gen).view(1, 1)
            positions += 1
            if int(tok) in stops:
                break
            lt, ld = (forward(m, tok, cache=c) for m, c in zip((pair.target, pair.draft), caches))
        np.stack(ps), np.stack(qs)
    return positions


def otbound_run(pair, prompts, temperature, max_new_tokens, batch_size, seed) -> tuple[int, float]:
    """``(positions, seconds)``: only ``collect_traces`` is timed; the positions are counted
    afterwards from the written traces."""
    from otbound.lm import load_traces

    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        collect_traces(pair, prompts, d, temperatures=(temperature,), max_new_tokens=max_new_tokens,
                       batch_size=batch_size, seed=seed, progress=False)
        _sync(pair)
        seconds = time.perf_counter() - t
        return sum(r.positions for r in load_traces(d)), seconds


def _sync(pair) -> None:
    if pair.device.type == "cuda":
        import torch

        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="auto", help="registered pair, 'random' (exact Qwen shapes, random "
                    "weights) or 'auto': the offline pair if already converted, else random")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16 (CUDA default), float16")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=None, help="prompts per batch (default: all prompts)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    name = args.pair
    if name == "auto":
        done = all(OFFLINE_MODELS[m].converted_dir.exists()
                   for m in PAIRS["qwen2.5-coder"])
        name = "qwen2.5-coder" if done else "random"
    t0 = time.perf_counter()
    if name == "random":
        pair = random_pair(device=args.device, dtype=args.dtype)
        rng = np.random.default_rng(0)
        lengths = rng.integers(40, 160, size=args.prompts)  # like chat-templated prompts
        prompts = [Prompt(f"r{i}", "random", "", tuple(rng.integers(0, pair.vocab_size, n).tolist()))
                   for i, n in enumerate(lengths)]
    else:
        pair = load_pair(name, device=args.device, dtype=args.dtype)
        half = (args.prompts + 1) // 2
        prompts = load_prompts("humaneval", half) + load_prompts("mtbench", args.prompts - half)
    print(f"pair {pair.name} on {pair.device} ({pair.dtype}), loaded in {time.perf_counter() - t0:.1f} s; "
          f"{len(prompts)} prompts, {args.max_new_tokens} new tokens, T = {args.temperature}, "
          f"batch {args.batch_size or len(prompts)}, {torch.get_num_threads()} threads")
    encoded = [encode_prompt(pair.tokenizer, p) for p in prompts]
    bs = args.batch_size or len(prompts)
    for m in (pair.target, pair.draft):  # warm-up: page the weights in, initialise kernels
        forward(m, torch.as_tensor([encoded[0]], device=pair.device), keep=1)
    rates = {"baseline": [], "otbound": []}
    for r in range(args.repeats):
        for label in ("baseline", "otbound"):
            if label == "baseline":
                _sync(pair)
                t = time.perf_counter()
                n = baseline(pair, encoded, args.temperature, args.max_new_tokens, seed=r)
                _sync(pair)
                dt = time.perf_counter() - t
            else:
                n, dt = otbound_run(pair, prompts, args.temperature, args.max_new_tokens, bs, seed=r)
            rates[label].append(n / dt)
            print(f"  run {r}: {label:8s} {n:5d} positions in {dt:7.2f} s = {n / dt:8.2f} positions/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"median positions/s: baseline {med['baseline']:.2f}, otbound {med['otbound']:.2f}; "
          f"ratio {med['otbound'] / med['baseline']:.2f}x")


if __name__ == "__main__":
    main()
