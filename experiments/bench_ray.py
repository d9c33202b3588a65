"""Scaling of the sharded real-model report: the local engine (this process) against Ray with 1
and 2 local workers, in the same process, on a random pair (no download).

Each run is a fresh output folder (traces collected and every position measured); the Ray actors
are started and have loaded the pair in a warm-up run first, so the figures compare the work, not
Ray's start-up (printed separately). Prints the median over ``--repeats`` runs of each engine and
the ratio of medians against the local engine, and checks that every engine's rows are identical.

    python experiments/bench_ray.py                      # tiny pair, 16 prompts, 2 temperatures
    python experiments/bench_ray.py --hidden 128 --prompts 32 --repeats 5
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=32, help="hidden size of both random models (2 layers)")
    ap.add_argument("--vocab", type=int, default=259)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompts-per-shard", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args(argv)

    import torch

    from otbound.lm import random_pair
    from otbound.report import RayExecutor, run_real_report

    torch.set_num_threads(1)  # as each Ray actor (num_cpus=1)
    shape = dict(num_hidden_layers=2, hidden_size=args.hidden, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=2 * args.hidden)
    pair = functools.partial(random_pair, shape, shape, vocab_size=args.vocab, device="cpu", dtype="float32", seed=0)
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    rng = np.random.default_rng(0)
    data = work / "bench.jsonl"
    lines = [{"prompt": f"p{i}", "token_ids": rng.integers(0, 256, int(rng.integers(4, 16))).tolist()}
             for i in range(args.prompts)]
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    kwargs = dict(datasets=[data], num_prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                  temperatures=(0.7, 1.0), num_drafts=(2,), verifiers=["rrs", "kseq", "spechub", "greedy"],
                  mc_samples=16,
                  prompts_per_shard=args.prompts_per_shard, progress=False)
    runs = iter(range(10**6))

    def timed(engine):
        t0 = time.perf_counter()
        rows = run_real_report(pair, engine=engine, out=work / f"run{next(runs)}", **kwargs)
        return time.perf_counter() - t0, json.dumps(rows)

    engines = {"local": "local"}
    t0 = time.perf_counter()
    executors = {n: RayExecutor(num_workers=n, num_cpus=max(args.workers)) for n in args.workers}
    print(f"Ray start: {time.perf_counter() - t0:.1f} s")
    engines.update({f"ray, {n} worker{'s' * (n > 1)}": ex for n, ex in executors.items()})
    for name, engine in engines.items():  # warm-up: actors started, pair loaded
        t0 = time.perf_counter()
        timed(engine)
        print(f"warm-up {name}: {time.perf_counter() - t0:.1f} s")
    times, reports = {name: [] for name in engines}, {}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            seconds, report = timed(engine)
            times[name].append(seconds)
            reports.setdefault(name, report)
    assert len(set(reports.values())) == 1, "engines disagree"
    print(f"\n{args.prompts} prompts x 2 temperatures, {args.max_new_tokens} new tokens, "
          f"{args.prompts_per_shard} prompts per shard, hidden {args.hidden}, V = {args.vocab}; {os.cpu_count()} CPUs; "
          f"median of {args.repeats}\n")
    base = statistics.median(times["local"])
    print("| engine | median s | runs (s) | speed-up vs local |\n|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.1f} | {', '.join(f'{t:.1f}' for t in ts)} | {base / med:.2f}× |")
    print("\nrows identical across engines: yes")


if __name__ == "__main__":
    main()
