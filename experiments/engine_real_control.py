"""The speculation-off control of the engine audit on the real pair, on its own: llama-server with the
target alone, its short continuations G-tested against the laws read back as plain decoding computes
them (:func:`otbound.engine.enumerate_cells`, :func:`otbound.engine.lossless_test`).

    python experiments/engine_real_control.py --seed 1 --samples 400 --out data/results/engine_real_control_seed1.json

The same requests (prompt, sampling, seeds) as the control of ``python -m otbound.engine --pair
qwen2.5-coder --sampling qwen --num-prompts 1 --lossless-depth 3 --n-probs 20 --seed S
--lossless-samples N``: the first HumanEval prompt, Qwen's recommended sampling, continuations of
three tokens, one hashed seed each (label ``control qwen seed=S``). Writes the test with its
reference laws and every continuation (tokens and the laws the engine reported while sampling), and
a checksum.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--n-probs", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from otbound import content_key
    from otbound.engine import LlamaServer, Sampling, ServerLaws, enumerate_cells, lossless_test
    from otbound.lm import OFFLINE_MODELS, PAIRS, ensure_gguf, llama_cpp_build, load_prompts

    build = llama_cpp_build(progress=True)
    target = ensure_gguf(OFFLINE_MODELS[PAIRS["qwen2.5-coder"][1]], progress=True)
    text = load_prompts("humaneval", 1)[0].text
    sampling = Sampling.named("qwen")
    t0 = time.time()
    with LlamaServer(build.binary("llama-server"), target, ctx_size=4096) as srv:
        body = json.dumps({"content": text, "add_special": False}).encode()
        req = urllib.request.Request(srv.url + "/tokenize", body,
                                     headers={"Content-Type": "application/json"})
        prompt = [int(t) for t in json.loads(urllib.request.urlopen(req, timeout=60).read())["tokens"]]
        laws = ServerLaws(srv.url)
        cells = enumerate_cells(laws, prompt, sampling, args.depth, args.n_probs)
        res = lossless_test(srv.url, laws, prompt, sampling, depth=args.depth, samples=args.samples, n=args.n_probs,
                            cells=cells, label=f"control {sampling.name} seed={args.seed}")
        server = srv.command
    keys = ("p_value", "samples", "cells", "empirical_tv", "detectable_tv", "numerics_tv", "reported_vs_reference_tv")
    print({k: res[k] for k in keys})
    body = {"format": "otbound-engine-control/1", "command": " ".join(["python", *sys.argv]), "server": server,
            "prompt": prompt, "sampling": sampling.params, "control": res, "seconds": round(time.time() - t0, 1),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}
    body = json.loads(json.dumps(body))
    body["sha256"] = content_key(body)
    Path(args.out).write_text(json.dumps(body, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
