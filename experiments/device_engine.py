"""One-command accelerator check of the measurement engine and of streaming trace collection
(prepared for a lent GPU; the same code runs on the CPU in the tests with ``--quick``).

    python experiments/device_engine.py                      # CUDA, < 5 min, JSON to $OUT (or .)
    python experiments/device_engine.py --quick --device cpu # tiny shapes, seconds

1. **Agreement**: 8 rows of V = 151,936 (softmax of N(0, 2.5²) logits, the target's plus N(0, 1))
   measured on the device and on the CPU: largest difference of every exact value (contract 1e-9).
2. **Measurement throughput** of the public ``otbound.report.measure_laws`` on rows generated on
   the device (positions/s, medians of 3), for the default set (α* of three laws × K ∈ {2, 3, 4},
   every verifier) and for a set without α* without replacement at K ≥ 3 (the clock-integral
   branch and bound, which runs per row on the CPU).
3. **Trace collection** with randomly initialised models of the Qwen2.5-Coder shapes (0.5B
   drafting for 1.5B, bfloat16): positions/s of ``collect_traces`` alone, and streaming as
   ``run_real_report`` does it (measured on the device as sampled, ``store_logits="none"``),
   with the bytes each trace keeps per position for float32 / float16 / none (for none: tokens,
   metadata and the stored per-position measurements).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

LM_VOCAB = 151_936
KS = (2, 3, 4)
ENGINE_SET = ["nss", "rrs", "rrs_wor", "kseq", "spechub", "greedy"]
TINY = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)


def lm_rows(n, vocab, device, seed=0):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    z = torch.randn((n, vocab), generator=g, device=device, dtype=torch.float64) * 2.5
    q = torch.softmax(z, -1)
    p = torch.softmax(z + torch.randn(z.shape, generator=g, device=device, dtype=torch.float64), -1)
    return p, q


def sync(device):
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device, repeats=3):
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def agreement(device, vocab):
    from otbound.report import measure_laws

    p, q = lm_rows(8, vocab, device, seed=1)
    a = measure_laws(p, q, KS, verifiers=ENGINE_SET, mc_samples=8)
    b = measure_laws(p.cpu(), q.cpu(), KS, verifiers=ENGINE_SET, mc_samples=8)
    worst = 0.0
    for s in a["optimal"]:
        for k in a["optimal"][s]:
            worst = max(worst, float(np.max(np.abs(np.subtract(a["optimal"][s][k], b["optimal"][s][k])))))
    for n in a["verifiers"]:
        for k, entry in a["verifiers"][n].items():
            if entry["method"] == "exact":
                diff = np.subtract(entry["acceptance"], b["verifiers"][n][k]["acceptance"])
                worst = max(worst, float(np.max(np.abs(diff))))
    return {"rows": 8, "vocab": vocab, "max_abs_difference": worst, "within_1e-9": worst <= 1e-9}


def engine_throughput(device, vocab, rows):
    from otbound.report import measure_laws

    p, q = lm_rows(rows, vocab, device)
    full = timed(lambda: measure_laws(p, q, KS), device)
    fast = timed(lambda: (measure_laws(p, q, KS, samplings=("with_replacement", "greedy"), verifiers=ENGINE_SET[:2]),
                          measure_laws(p, q, (2,), samplings=("without_replacement",), verifiers=["rrs_wor"])), device)
    return {"rows": rows, "vocab": vocab, "default_set_positions_per_s": rows / full,
            "without_wor_k34_positions_per_s": rows / fast}


def collection(device, quick, prompts, new_tokens, batch):
    import torch

    from otbound.lm import Prompt, collect_traces, load_traces, random_pair
    from otbound.report import measure_trace

    t0 = time.perf_counter()
    if quick:
        pair = random_pair(TINY, TINY, vocab_size=259, device=device, dtype="float32")
    else:
        pair = random_pair(device=device, dtype="bfloat16")
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    lo, hi = (2, 9) if quick else (40, 160)
    ps = [Prompt(f"r{i}", "random", "", tuple(rng.integers(0, pair.vocab_size, int(n)).tolist()))
          for i, n in enumerate(rng.integers(lo, hi, size=prompts))]
    out = {"pair": pair.name, "model_dtype": str(pair.dtype), "load_s": load_s, "prompts": prompts,
           "max_new_tokens": new_tokens, "batch_size": batch, "bytes_per_position": {}}
    with tempfile.TemporaryDirectory() as d:
        for store in ("float32", "float16", "none"):
            # what run_real_report does while collecting
            measure_now = functools.partial(measure_trace, num_drafts=KS, verifiers=ENGINE_SET, mc_samples=16,
                                            cache_dir=Path(d) / store / "measure", reuse=False)
            t = time.perf_counter()
            paths = collect_traces(pair, ps, Path(d) / store / "traces", temperatures=(1.0,), max_new_tokens=new_tokens,
                                   batch_size=batch, seed=0, logits_dtype=store, progress=False,
                                   on_trace=measure_now if store == "none" else None)
            sync(device)
            dt = time.perf_counter() - t
            n = sum(r.positions for path in paths for r in load_traces(path))
            stored = [f for f in (Path(d) / store).rglob("*") if f.is_file()]
            out["bytes_per_position"][store] = sum(f.stat().st_size for f in stored) / n
            if store == "float32":
                out["collect_positions"], out["collect_positions_per_s"] = n, n / dt
            if store == "none":
                out["stream_measure_positions"], out["stream_measure_positions_per_s"] = n, n / dt
    if str(device).startswith("cuda"):
        out["peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (the tests run this on the CPU)")
    ap.add_argument("--rows", type=int, default=256, help="positions per engine call")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--out", default=None,
                    help="JSON file (default: $OUT/device_engine.json, else ./device_engine.json)")
    args = ap.parse_args(argv)
    import torch

    if args.quick:
        vocab, rows, prompts, new_tokens, batch = 2_000, 8, 3, 4, 2
    else:
        vocab, rows, prompts = LM_VOCAB, args.rows, args.prompts
        new_tokens, batch = args.max_new_tokens, args.batch_size
    result = {"device": args.device, "torch": torch.__version__, "python": platform.python_version(),
              "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None}
    t0 = time.perf_counter()
    for name, fn in (("agreement", lambda: agreement(args.device, vocab)),
                     ("engine", lambda: engine_throughput(args.device, vocab, rows)),
                     ("collection", lambda: collection(args.device, args.quick, prompts, new_tokens, batch))):
        t = time.perf_counter()
        result[name] = fn()
        result[name]["seconds"] = time.perf_counter() - t
        print(name, json.dumps(result[name]), flush=True)
    result["total_seconds"] = time.perf_counter() - t0
    path = Path(args.out) if args.out else Path(os.environ.get("OUT", ".")) / "device_engine.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
