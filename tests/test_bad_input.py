"""Bad input and faults as a user meets them: every case ends with a clear one-line error (exit
status 2 at the command line) or the right result — never a traceback, a silent wrong number or a
mixed folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import otbound as ob
from otbound import compare
from otbound.report import Shard, read_checkpoints, run_shards

SYNTH = ["--synthetic", "--vocab-size", "5", "--instances", "2", "--num-drafts", "1", "2", "--temperature", "1.0",
         "--mc-samples", "200"]


def square(x):
    return {"x": x, "square": [float(x * x), 0.5]}


LOADS = []


def tiny8():
    LOADS.append(1)
    return ob.lm.tiny_pair(8)


def _cli(argv, tmp_path):
    """``python -m otbound.compare ARGV`` in a subprocess: (exit status, stdout, stderr)."""
    r = subprocess.run([sys.executable, "-m", "otbound.compare", *argv], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1], timeout=600)
    return r.returncode, r.stdout, r.stderr


def _one_line_error(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# shard checkpoints carry a checksum


@pytest.mark.parametrize("damage", ["edited digit", "truncated", "not utf-8", "not json", "no checksum"])
def test_damaged_checkpoint_is_recomputed_not_reused(tmp_path, capsys, damage):
    shards = [Shard(f"s{i}", square, {"x": i}) for i in range(3)]
    want = run_shards(shards, tmp_path, progress=False)
    path = tmp_path / "shards" / "s2.json"
    text = path.read_text()
    if damage == "edited digit":
        assert '"square": [4.0' in text
        path.write_text(text.replace('"square": [4.0', '"square": [5.0'))
    elif damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "not utf-8":
        path.write_bytes(b"\xff\xfe" + text.encode()[2:])
    elif damage == "not json":
        path.write_text("garbage")
    else:
        stored = json.loads(text)
        del stored["sha256"]
        path.write_text(json.dumps(stored))
    ran = []

    class Counting(ob.report.LocalExecutor):
        def map(self, todo, on_done):
            ran.extend(s.id for s in todo)
            super().map(todo, on_done)

    assert run_shards(shards, tmp_path, Counting(), progress=False) == want
    assert ran == ["s2"], "only the damaged shard is recomputed"
    assert "s2.json" in capsys.readouterr().err
    assert read_checkpoints(tmp_path)["s2"]["result"] == want[2]  # rewritten intact


def test_edited_checkpoint_does_not_change_the_report(tmp_path):
    compare.main([*SYNTH, "--out", str(tmp_path)])
    before = json.loads((tmp_path / "report.json").read_text())["rows"]
    (shard,) = sorted((tmp_path / "shards").glob("synthetic-dirichlet-*.json"))
    stored = json.loads(shard.read_text())
    stored["result"]["rows"][0]["acceptance"] += 0.001  # a verifier shown above its bound, if reused
    shard.write_text(json.dumps(stored))
    compare.main([*SYNTH, "--out", str(tmp_path)])
    assert json.loads((tmp_path / "report.json").read_text())["rows"] == before


def test_copied_output_folder_reuses_its_checkpoints(tmp_path):
    """The fingerprint holds no absolute path: a folder copied elsewhere recomputes nothing."""
    from otbound.report import run_real_report

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}", "token_ids": [i, 2]}) + "\n" for i in range(2)))
    kw = dict(datasets=[data], num_prompts=2, max_new_tokens=3, temperatures=(1.0,), num_drafts=(2,),
              progress=False, verifiers=["rrs"], mc_samples=4, store_logits="none")
    rows = run_real_report(tiny8, out=tmp_path / "a", **kw)
    loads = len(LOADS)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "a")

    class Nothing(ob.report.LocalExecutor):
        def map(self, todo, on_done):
            assert not todo, [s.id for s in todo]

    assert run_real_report(tiny8, out=tmp_path / "b", engine=Nothing(), **kw) == rows
    assert len(LOADS) == loads, "no model loaded"
