"""Sharded reports: checkpoints, resume after a killed driver, and the Ray engine on a local
two-worker cluster (a worker killed mid-shard) giving the report of a single-process run."""

import functools
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import report_bytes

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_thread")

from otbound import compare  # noqa: E402
from otbound._validation import InvalidInputError  # noqa: E402
from otbound.lm import random_pair  # noqa: E402
from otbound.report import (  # noqa: E402
    LocalExecutor,
    RayExecutor,
    Shard,
    make_executor,
    read_checkpoints,
    run_real_report,  # noqa: E402
    run_shards,
)

TESTS = Path(__file__).resolve().parent
V = 259
TINY = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)
SYNTH = ["--synthetic", "--instances", "2", "--num-drafts", "1", "2", "--temperature", "0.8", "1.0",
         "--vocab-size", "6", "--mc-samples", "500", "--block", "--block-drafts", "1", "2", "--block-lens", "1", "2",
         "--seed", "5"]


def tiny_pair():
    """The tiny random pair of test_lm with its byte-level tokenizer (importable by Ray workers)."""
    from test_lm import tiny_tokenizer

    pair = random_pair(TINY, TINY, vocab_size=V, device="cpu", dtype="float32", seed=3)
    pair.tokenizer = tiny_tokenizer()
    return pair


def tiny_pair_dying_once(marker):
    """The tiny pair; but the first process anywhere to load it kills itself (SIGKILL) after writing
    its pid to ``marker``: a worker process dying in the middle of its first shard."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return tiny_pair()
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture
def prompts_file(tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ["def f(", "hello", "x = 1", "abc", "zz"]))
    return data


def report_kwargs(data, out):
    return dict(datasets=[data], num_prompts=5, max_new_tokens=4, temperatures=(0.8, 1.1), num_drafts=(2,),
                out=out, progress=False, verifiers=["rrs", "kseq", "greedy"], mc_samples=16, prompts_per_shard=2,
                seed=7, store_logits="float32")  # a trace planted from another run is re-measured bit for bit


# ---------------------------------------------------------------------------------------------
# shards and checkpoints, in process


def square(x):
    return {"x": x, "square": x * x}


def test_checkpoints_are_reused_only_when_the_shard_matches(tmp_path):
    shards = [Shard(f"s{i}", square, {"x": i}) for i in range(3)]
    assert run_shards(shards, tmp_path, progress=False) == [square(i) for i in range(3)]
    stored = read_checkpoints(tmp_path)
    assert set(stored) == {"s0", "s1", "s2"} and stored["s1"]["result"] == square(1)

    class Forbidden(LocalExecutor):
        def map(self, shards, on_done):
            assert [s.id for s in shards] == ["s2"], "only the changed shard reruns"
            super().map(shards, on_done)

    changed = shards[:2] + [Shard("s2", square, {"x": 5})]
    assert run_shards(changed, tmp_path, Forbidden(), progress=False)[2] == square(5)
    assert run_shards(shards, None, progress=False) == [square(i) for i in range(3)]  # no folder, no checkpoints
    with pytest.raises(InvalidInputError, match="unique"):
        run_shards([shards[0], shards[0]], tmp_path, progress=False)
    with pytest.raises(InvalidInputError, match="unknown engine"):
        make_executor("spark")
    with pytest.raises(InvalidInputError, match="only meaningful"):
        make_executor("local", address="10.0.0.1:6379")


class DriverDies(LocalExecutor):
    """Runs ``n`` shards, then dies (as a killed driver would, after checkpointing them)."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def map(self, shards, on_done):
        super().map(shards[: self.n], on_done)
        raise KeyboardInterrupt


def test_a_restarted_driver_resumes_from_the_checkpoints(prompts_file, tmp_path):
    whole = run_real_report(tiny_pair, **report_kwargs(prompts_file, tmp_path / "whole"))
    kwargs = report_kwargs(prompts_file, tmp_path / "killed")
    with pytest.raises(KeyboardInterrupt):
        run_real_report(tiny_pair, engine=DriverDies(2), **kwargs)
    first = read_checkpoints(tmp_path / "killed")
    assert len(first) == 2
    # a worker killed between its traces' collection and their moves into place leaves a complete staging folder
    staged = tmp_path / "killed" / "traces-staging" / "done" / "real-mine-T1.1-2"
    src = tmp_path / "whole" / "traces" / "mine" / "T1.1" / "mine_5.safetensors"
    (staged / "mine" / "T1.1").mkdir(parents=True)
    (staged / "mine" / "T1.1" / src.name).write_bytes(src.read_bytes())
    again = run_real_report(tiny_pair, **kwargs)
    assert json.dumps(again) == json.dumps(whole)
    after = read_checkpoints(tmp_path / "killed")
    assert len(after) == 6 and all(after[i] == first[i] for i in first)  # finished shards were not rerun
    assert not (staged).exists()
    assert sum(len(c["result"]) for c in after.values()) == 10  # 5 prompts × 2 temperatures, each once


def test_local_ray_workers_import_this_otbound(monkeypatch):
    import otbound
    from otbound.report._distributed import worker_pythonpath

    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    first, *rest = worker_pythonpath().split(os.pathsep)
    assert Path(first) / "otbound" == Path(otbound.__file__).resolve().parent and rest == ["/somewhere/else"]


def test_engine_ray_without_ray_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(SystemExit) as exc:
        compare.main(["--synthetic", "--engine", "ray", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "otbound[ray]" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Ray: a local two-worker cluster


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    path = os.pathsep.join([str(TESTS.parent), str(TESTS)])  # workers import otbound and this module
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


def test_ray_synthetic_and_block_report_identical_to_local(ray_cluster, tmp_path):
    local = compare.main(SYNTH + ["--out", str(tmp_path / "local")])
    dist = compare.main(SYNTH + ["--out", str(tmp_path / "ray"), "--engine", "ray", "--workers", "2"])
    for name in ("report.json", "report.md"):
        assert report_bytes(dist / name) == report_bytes(local / name)
    workers = {c["worker"] for c in read_checkpoints(dist).values()}
    assert len(read_checkpoints(dist)) == 2 * 2 + 2 * 2 and len(workers) == 2  # 4 synthetic + 4 block cells


def test_ray_worker_killed_mid_shard(ray_cluster, prompts_file, tmp_path):
    local = run_real_report(tiny_pair, **report_kwargs(prompts_file, tmp_path / "local"))
    marker = tmp_path / "killed.pid"
    executor = RayExecutor(num_workers=2)
    rows = run_real_report(functools.partial(tiny_pair_dying_once, str(marker)), engine=executor,
                           **report_kwargs(prompts_file, tmp_path / "ray"))
    assert json.dumps(rows) == json.dumps(local)
    killed = int(marker.read_text())
    stored = read_checkpoints(tmp_path / "ray")
    assert len(stored) == 6 and all(c["worker"].split(":")[-1] != str(killed) for c in stored.values())
    assert sum(len(c["result"]) for c in stored.values()) == 10  # each (prompt, T) once
    assert killed not in executor.worker_pids()  # the killed actor was restarted in a new process
    with pytest.raises(InvalidInputError, match="cluster has 2"):
        RayExecutor(num_workers=3)
    with pytest.raises(InvalidInputError, match="not a loaded pair"):
        run_real_report(tiny_pair(), engine=executor, **report_kwargs(prompts_file, tmp_path / "loaded"))

    # an actor lost for good (no restart left): its shard goes to the other one
    ray_cluster.kill(executor.actors[0], no_restart=True)
    shards = [Shard(f"s{i}", square, {"x": i}) for i in range(4)]
    assert run_shards(shards, None, executor, progress=False) == [square(i) for i in range(4)]
    assert len(executor.actors) == 1
