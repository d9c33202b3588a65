"""llama.cpp's multi-draft example (``llama-speculative``) run as shipped on the tiny GGUF pair: the law of
its output against the target's exact law and against the port of its verification.

    python experiments/llama_speculative_tiny.py [--samples 1000] [--out data/results/engine_multidraft_tiny.json]

Per setting, ``--samples`` runs of the binary (one seed each, two emitted tokens, stochastic
verification, end of text ignored) on :func:`otbound.lm.write_tiny_gguf_pair` (seed 0, 264 tokens),
prompt "Hello wor": the first token is sampled from the target before any draft, the second is the
first verified one. Its histogram over (first, second) is G-tested against the target's exact law and
against the law of the line-for-line port (:func:`otbound.engine.speculative_output_test`), both
computed by an independent float64 forward of the pair. Settings: one draft sequence (the shipped
binary) at full vocabulary and under top-k 4; three draft sequences with ``--draft-p-split 0.05``,
which the shipped binary cannot run (its draft sequences need the unified KV cache: failed decodes,
then an abort), so it runs on the binary rebuilt with that one-line change
(:func:`otbound.engine.build_llama_speculative_kvu`), at full vocabulary and under top-k 4; and the
shipped binary at three sequences, for its failures. The example exits without flushing llama.cpp's
asynchronous logger, whose debug lines are where its tokens are read: a shim preloaded into it
flushes the logger at exit (:func:`otbound.engine.build_log_flush_shim`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FULL = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
TOPK4 = {"temperature": 1.0, "top_k": 4, "top_p": 1.0, "min_p": 0.0}
PROMPT = "Hello wor"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--out", default=str(ROOT / "data" / "results" / "engine_multidraft_tiny.json"))
    args = ap.parse_args(argv)
    from otbound import content_key
    from otbound.engine import (
        LlamaServer,
        build_llama_speculative_kvu,
        build_log_flush_shim,
        run_llama_speculative,
        speculative_output_test,
    )
    from otbound.lm import llama_cpp_build, write_tiny_gguf_pair

    build = llama_cpp_build(progress=True)
    shipped = build.binary("llama-speculative")
    with tempfile.TemporaryDirectory(prefix="otbound-llama-speculative-") as tmp:
        pair = write_tiny_gguf_pair(Path(tmp) / "pair", seed=0)
        kvu = build_llama_speculative_kvu(build, Path(tmp) / "kvu")
        shim = build_log_flush_shim(build, Path(tmp) / "kvu")
        with LlamaServer(build.binary("llama-server"), pair.target, ctx_size=512) as srv:
            req = urllib.request.Request(srv.url + "/tokenize", data=json.dumps(
                {"content": PROMPT, "add_special": True, "parse_special": True}).encode(),
                headers={"Content-Type": "application/json"})
            ids = json.loads(urllib.request.urlopen(req, timeout=30).read())["tokens"]
        settings = [("shipped", shipped, 1, FULL), ("shipped", shipped, 1, TOPK4),
                    ("unified KV", kvu, 3, FULL), ("unified KV", kvu, 3, TOPK4)]
        results = []
        t0 = time.time()
        for name, exe, k, sampling in settings:
            res = speculative_output_test(exe, pair, PROMPT, ids, num_seqs=k, p_split=0.05, n_max=3,
                                          sampling=sampling, samples=args.samples, flush_shim=shim)
            res["binary"] = name
            results.append(res)
            print(f"{name:10s} K={k} {sampling}: vs target p={res['vs_target']['p_value']:.3g} "
                  f"(TV {res['vs_target']['empirical_tv']:.3f}), vs port p={res['vs_port']['p_value']:.3g}, "
                  f"port-target TV {res['port_vs_target_tv']:.3f}, failed {res['runs_with_failed_decodes']} "
                  f"[{time.time() - t0:.0f} s]", flush=True)
        failures = [run_llama_speculative(shipped, pair.target, pair.draft, PROMPT, num_seqs=3, p_split=0.05,
                                          n_max=3, sampling=TOPK4, seed=s, n_predict=8, flush_shim=shim)
                    for s in range(1, 21)]
        shipped_multi = {"runs": len(failures), "with_failed_decodes": sum(f["failed_decodes"] > 0 for f in failures),
                         "nonzero_exit": sum(f["returncode"] != 0 for f in failures),
                         "exit_codes": sorted({f["returncode"] for f in failures}), "command": failures[0]["command"]}
        print("shipped, 3 sequences:", {k: v for k, v in shipped_multi.items() if k != "command"})
    body = {"format": "otbound-llama-speculative-tiny/1", "prompt": PROMPT, "prompt_ids": ids,
            "pair": {"generator": "write_tiny_gguf_pair", "seed": 0, "vocab_size": pair.config.vocab_size},
            "engine": {"llama_cpp_python": build.describe().get("llama_cpp_python"), "build": str(build.root)},
            "settings": results, "shipped_multiple_sequences": shipped_multi,
            "machine": {"platform": platform.platform(), "python": platform.python_version()},
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "seconds": round(time.time() - t0, 1)}
    body["sha256"] = content_key(body)
    Path(args.out).write_text(json.dumps(body, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
