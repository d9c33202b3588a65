"""The main job's rate (a maintainers' harness: it wraps the job's private functions with timers, so
it lives beside the asv suite, not among the experiments, which use the public API only):
``python -m otbound.compare`` run in this process with timers around its parts, printing positions
per second and the fraction of the wall and CPU time spent in

* **load**: loading the pair (``otbound.lm.load_pair``);
* **forward**: the models' forward passes (llama.cpp's ``llama_decode`` through
  ``LlamaCppModel._decode``; transformers' ``Qwen2ForCausalLM.forward``);
* **measurement**: ``otbound.report.measure_trace`` (every α* and verifier at every position);
* **I/O**: the trace files (``otbound.lm._store``: the logits' conversion to the stored dtype, the
  safetensors writes and reads) and the report's files (JSON, Markdown, figures);
* the rest (sampling, softmax, the aggregation, the interpreter's start-up work).

Timers wrap the functions themselves (no profiler: its overhead would inflate the Python-heavy
measurement), a nested call of the same kind counted once. Any argument after ``--`` goes to
``python -m otbound.compare`` unchanged. ``--tiny`` runs on a tiny pair written here instead of a
registered one: ``--backend llama.cpp`` a tiny GGUF pair (V = 264, ``write_tiny_gguf_pair``),
``--backend transformers`` a tiny random Qwen2 pair with a byte tokenizer (V = 259), both
saved under ``--out``.

    python benchmarks/main_job.py --tiny --backend transformers --out /tmp/mj-tf -- --num-prompts 4
    python benchmarks/main_job.py --tiny --backend llama.cpp --out /tmp/mj-ll -- --num-prompts 4
    # [real pair]
    python benchmarks/main_job.py --backend llama.cpp --out /tmp/mj-real -- --num-prompts 1 --max-new-tokens 16
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path

KINDS = ("load", "forward", "measurement", "io")


class Timers:
    """Wall and CPU seconds (of the process: llama.cpp's threads included) per kind; a call inside
    another call of the same kind is not counted again."""

    def __init__(self):
        self.seconds = dict.fromkeys(KINDS, 0.0)
        self.cpu = dict.fromkeys(KINDS, 0.0)
        self.calls = dict.fromkeys(KINDS, 0)
        self._depth = dict.fromkeys(KINDS, 0)

    def wrap(self, kind, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self._depth[kind] += 1
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth[kind] -= 1
                if not self._depth[kind]:
                    self.seconds[kind] += time.perf_counter() - t0
                    self.cpu[kind] += time.process_time() - c0
                    self.calls[kind] += 1
        return timed


@contextlib.contextmanager
def patched(timers: Timers, backend: str):
    """The job's functions wrapped by ``timers`` (restored on exit)."""
    import otbound.compare  # noqa: F401  (its modules imported, so that their names can be wrapped)
    import otbound.lm._store as store
    import otbound.report._real as real
    from otbound.report import plots

    targets = [(real, "load_pair", "load"), (real, "measure_trace", "measurement"), (store, "write_atomic", "io"),
               (store, "read", "io"), (store, "to_store", "io"), (plots, "save", "io")]
    # the report's text files: every otbound module holding write_text_atomic by name
    targets += [(mod, "write_text_atomic", "io") for name, mod in list(sys.modules.items())
                if name.startswith("otbound") and hasattr(mod, "write_text_atomic")]
    if backend == "llama.cpp":
        from otbound.lm._llama_backend import LlamaCppModel

        targets.append((LlamaCppModel, "_decode", "forward"))
    else:
        from transformers.models.qwen2.modeling_qwen2 import Qwen2ForCausalLM

        targets.append((Qwen2ForCausalLM, "forward", "forward"))
    saved = []
    for owner, name, kind in targets:
        if hasattr(owner, name):
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, timers.wrap(kind, getattr(owner, name)))
    try:
        yield
    finally:
        for owner, name, fn in reversed(saved):
            setattr(owner, name, fn)


def tiny_pair_args(backend: str, folder: Path) -> list:
    """``--pair`` and ``--datasets`` of a tiny pair written under ``folder``."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    words = ["def", "return", "print", "the", "value", "list", "for", "in", "x", "y", "sum", "hello", "range"]
    data = folder / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": " ".join(rng.choice(words, size=int(rng.integers(3, 12))))}) + "\n"
                            for _ in range(64)))
    if backend == "llama.cpp":
        from otbound.lm._tiny_gguf import write_tiny_gguf_pair

        g = write_tiny_gguf_pair(folder / "gguf", seed=7)
        return ["--pair", f"{g.draft},{g.target}", "--datasets", str(data)]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' tiny byte tokenizer
    from test_lm import tiny_tokenizer

    from otbound.lm._models import random_pair

    shape = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=64)
    pair = random_pair(shape, shape, vocab_size=259, device="cpu", dtype="float32", seed=3)
    tok = tiny_tokenizer()
    paths = []
    for name, model in (("draft", pair.draft), ("target", pair.target)):
        model.generation_config.eos_token_id = tok.eos_token_id
        model.save_pretrained(folder / name)
        tok.save_pretrained(folder / name)
        paths.append(str(folder / name))
    return ["--pair", ",".join(paths), "--datasets", str(data)]


def positions(out: Path) -> int:
    """Sampled positions of the run's traces (their continuations)."""
    from otbound.lm import load_traces

    return sum(r.positions for r in load_traces(out / "traces"))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("transformers", "llama.cpp"), default="transformers")
    ap.add_argument("--tiny", action="store_true", help="a tiny pair written under --out instead of a registered one")
    ap.add_argument("--out", required=True, help="folder of the run (emptied first)")
    args = ap.parse_args(own)
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    job = ["--backend", args.backend, "--out", str(out / "report")]
    if args.tiny:
        job += tiny_pair_args(args.backend, out / "pair")
    job += rest
    from otbound import compare

    timers = Timers()
    t0, c0 = time.perf_counter(), time.process_time()
    with patched(timers, args.backend):
        compare.main(job)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = positions(out / "report")
    rest_s = wall - sum(timers.seconds.values())
    res = {"command": "python -m otbound.compare " + " ".join(job), "positions": n, "wall_s": wall,
           "positions_per_s": n / wall,
           "positions_per_s_after_load": n / (wall - timers.seconds["load"]),
           **{f"{k}_s": v for k, v in timers.seconds.items()}, "rest_s": rest_s,
           **{f"{k}_fraction": v / wall for k, v in timers.seconds.items()}, "rest_fraction": rest_s / wall,
           "cpu_s": cpu, **{f"{k}_cpu_s": v for k, v in timers.cpu.items()},
           "rest_cpu_s": cpu - sum(timers.cpu.values()),
           **{f"{k}_cpu_fraction": v / cpu for k, v in timers.cpu.items()},
           "rest_cpu_fraction": (cpu - sum(timers.cpu.values())) / cpu,
           "load_average": os.getloadavg(), "calls": timers.calls}
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
