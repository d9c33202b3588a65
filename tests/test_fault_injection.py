"""Fault injection: SIGKILL a report at random points (fixed seed), then let it finish.

After every kill the folder holds no report or a complete one equal to the uninterrupted run's, and
the finished rerun equals an uninterrupted run bit for bit (report.json, report.md and the figure
for the synthetic report; rows.json for the real-model report on a tiny random pair, which resumes
from the traces and measurements the killed runs left). The lock left by a killed run is taken over.
Runs are forked from this process (no interpreter start-up per run) and killed with SIGKILL.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import report_bytes

from otbound import compare

SYNTHETIC = [
    "--synthetic",
    "--vocab-size",
    "6",
    "--instances",
    "3",
    "--num-drafts",
    "1",
    "2",
    "3",
    "--temperature",
    "0.7",
    "1.0",
    "--mc-samples",
    "500",
    "--out",
]
FORK = multiprocessing.get_context("fork")


def synthetic_report(out: Path) -> None:
    compare.main([*SYNTHETIC, str(out)])


@functools.cache
def tiny_pair():
    """Built once in the test process, before forking (the children inherit it)."""
    import torch
    from test_lm import TINY, V, tiny_tokenizer

    from otbound.lm import random_pair

    torch.set_num_threads(1)
    pair = random_pair(TINY, TINY, vocab_size=V, device="cpu", dtype="float32", seed=3)
    pair.tokenizer = tiny_tokenizer()
    return pair


def tiny_model_report(out: Path) -> None:
    from otbound.report import run_real_report

    pair = tiny_pair()
    data = out.parent / "prompts.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ["def f(", "hello", "x = 1", "abc"]))
    run_real_report(
        pair,
        datasets=[data],
        num_prompts=4,
        max_new_tokens=4,
        temperatures=(0.8, 1.0),
        num_drafts=(2,),
        out=out,
        progress=False,
        verifiers=["rrs"],
        mc_samples=8,
        batch_size=2,
        store_logits="float32",  # re-measured bit for bit below after the measurement cache is deleted
    )


def _run(target, out: Path) -> float:
    t0 = time.perf_counter()
    proc = FORK.Process(target=target, args=(out,))
    proc.start()
    proc.join(600)
    assert proc.exitcode == 0
    return time.perf_counter() - t0


def _kill_at(target, out: Path, delay: float) -> None:
    proc = FORK.Process(target=target, args=(out,))
    proc.start()
    time.sleep(delay)
    proc.kill()  # SIGKILL: no cleanup of any kind runs
    proc.join()
    assert proc.exitcode in (-signal.SIGKILL, 0)


def _kill_then_finish(target, tmp_path, files, kills=3, seed=0):
    reference = tmp_path / "reference"
    seconds = _run(target, reference)
    expected = {name: report_bytes(reference / name) for name in files}
    rng = np.random.default_rng(seed)
    out = tmp_path / "killed"
    for delay in np.sort(rng.uniform(0.1, 1.0, kills)) * seconds:
        _kill_at(target, out, float(delay))
        for name, data in expected.items():  # absent, or whole and equal: never a mix of two runs
            assert not (out / name).exists() or report_bytes(out / name) == data, (name, delay)
    _run(target, out)  # takes over the dead run's lock, resumes, finishes
    for name, data in expected.items():
        assert report_bytes(out / name) == data, name


def test_killed_synthetic_report_resumes_bit_for_bit(tmp_path):
    _kill_then_finish(synthetic_report, tmp_path, ["report.json", "report.md", "token_bounds.png"])


def test_killed_tiny_model_report_resumes_bit_for_bit(tmp_path):
    pytest.importorskip("torch")
    tiny_pair()
    _kill_then_finish(tiny_model_report, tmp_path, ["rows.json"])
    # a kill between the two trace writes of one batch (too narrow a window to hit by timing)
    out = tmp_path / "killed"
    expected = (out / "rows.json").read_bytes()
    traces = sorted((out / "traces").rglob("*.safetensors"))
    traces[0].unlink()
    for done in ("measure", "shards"):  # the shard checkpoints too: the shard is recomputed from its traces
        shutil.rmtree(out / done)
    (out / "rows.json").unlink()
    _run(tiny_model_report, out)
    assert (out / "rows.json").read_bytes() == expected
