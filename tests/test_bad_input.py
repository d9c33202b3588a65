"""Bad input and faults as a user meets them: every case ends with a clear one-line error (exit
status 2 at the command line) or the right result — never a traceback, a silent wrong number or a
mixed folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import otbound as ob
from otbound.cli import compare
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
    lines = [ln for ln in err.strip().split("\n") if ln.strip() and "%|" not in ln]  # (progress bars left out)
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


# ---------------------------------------------------------------------------------------------
# prompt files


BAD_PROMPT_FILES = {
    "empty": b"",
    "blank lines only": b"\n  \n",
    "malformed": b'{"prompt": "a"}\n{"prompt": \n',
    "not utf-8": '{"prompt": "caf\u00e9"}\n'.encode("latin-1"),
    "empty prompt": b'{"prompt": "  "}\n',
    "not an object": b'["prompt"]\n',
    "duplicate ids": b'{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n',
    "negative token id": b'{"prompt": "x", "token_ids": [1, -2]}\n',
    "boolean token id": b'{"prompt": "x", "token_ids": [true]}\n',
}


@pytest.mark.parametrize("case", BAD_PROMPT_FILES)
def test_bad_prompt_file_is_one_line_naming_the_file(tmp_path, capsys, case):
    data = tmp_path / "bad.jsonl"
    data.write_bytes(BAD_PROMPT_FILES[case])
    with pytest.raises(ob.InvalidInputError, match="bad.jsonl"):
        ob.lm.load_prompts(data)
    with pytest.raises(SystemExit) as exc:
        compare.main(["--datasets", str(data), "--out", str(tmp_path / "r")])
    assert exc.value.code == 2
    assert "bad.jsonl" in _one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "r").exists(), "nothing is written before the inputs are checked"


def test_token_ids_outside_the_vocabulary_are_refused_by_name(tmp_path):
    from otbound.report import run_real_report

    data = tmp_path / "ids.jsonl"
    data.write_text(json.dumps({"id": "ok", "prompt": "x", "token_ids": [1, 2]}) + "\n"
                    + json.dumps({"id": "big", "prompt": "x", "token_ids": [3, 8]}) + "\n")
    with pytest.raises(ob.InvalidInputError, match=r"'big'.*token id 8, outside the vocabulary 0..7"):
        run_real_report(tiny8, datasets=[data], num_prompts=2, max_new_tokens=2, temperatures=(1.0,),
                        num_drafts=(2,), out=tmp_path / "r", progress=False, verifiers=["rrs"], mc_samples=4)


# ---------------------------------------------------------------------------------------------
# models, devices, dtypes, Ray


def test_nonexistent_model_path_is_refused_without_the_hub(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    def no_hub(*a, **k):
        raise AssertionError("the hub was asked for a local path")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_hub)
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ob.lm.ModelUnavailableError, match="does not exist"):
        ob.lm.load_pair((missing, missing), device="cpu", progress=False)
    with pytest.raises(SystemExit) as exc:
        compare.main(["--pair", f"{missing},{missing}", "--out", str(tmp_path / "r")])
    assert exc.value.code == 2 and "does not exist" in _one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize("flags,needle", [
    (["--device", "tpu"], "device"),
    (["--device", "cuda"], "CUDA"),
    (["--dtype", "float8"], "dtype"),
    (["--dtype", "int8"], "dtype"),
])
@pytest.mark.parametrize("mode", [SYNTH, []], ids=["synthetic", "trace report"])
def test_unknown_device_or_dtype_is_refused_in_every_mode(tmp_path, capsys, flags, needle, mode):
    if needle == "CUDA" and __import__("torch").cuda.is_available():
        pytest.skip("a CUDA machine: CUDA asked for is available")
    with pytest.raises(SystemExit) as exc:
        compare.main([*mode, *flags, "--out", str(tmp_path / "r")])
    assert exc.value.code == 2 and needle in _one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flags,needle", [
    (["--verifiers", "rrs", "no_such_verifier"], "unknown verifier(s) no_such_verifier"),
    ([*SYNTH, "--verifiers", "rrs"], "applies to the language-model report"),
])
def test_verifier_selection_is_checked_before_any_work(tmp_path, capsys, flags, needle):
    with pytest.raises(SystemExit) as exc:
        compare.main([*flags, "--out", str(tmp_path / "r")])
    assert exc.value.code == 2 and needle in _one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "r").exists()


def test_unreachable_ray_cluster_fails_fast_with_one_line(tmp_path, capsys):
    import socket
    import time

    pytest.importorskip("ray")
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as exc:
        compare.main([*SYNTH, "--engine", "ray", "--address", f"127.0.0.1:{port}", "--out", str(tmp_path / "r")])
    assert time.perf_counter() - t0 < 10
    assert exc.value.code == 2 and f"127.0.0.1:{port}" in _one_line_error(capsys.readouterr().err)


# ---------------------------------------------------------------------------------------------
# a finished report survives a failing rerun; the report files are written as a pair


@pytest.fixture
def finished(tmp_path):
    out = tmp_path / "r"
    compare.main([*SYNTH, "--out", str(out)])
    return out, {n: (out / n).read_bytes() for n in ("report.md", "report.json")}


@pytest.mark.parametrize("argv", [
    ["--datasets", "BAD", "--pair", "qwen2.5-coder"],  # bad dataset file (written by the test)
    ["--pair", "no-such-pair"],
    [*SYNTH, "--num-drafts", "9"],  # more drafts than the vocabulary
    [*SYNTH, "--device", "tpu"],
], ids=["bad dataset", "unknown pair", "impossible setting", "unknown device"])
def test_failing_rerun_leaves_the_finished_report(finished, capsys, argv):
    out, before = finished
    bad = out.parent / "bad.jsonl"
    bad.write_text("{not json\n")
    argv = [str(bad) if a == "BAD" else a for a in argv]
    with pytest.raises(SystemExit) as exc:
        compare.main([*argv, "--out", str(out)])
    assert exc.value.code == 2
    _one_line_error(capsys.readouterr().err)
    assert {n: (out / n).read_bytes() for n in before} == before


def test_failure_inside_the_run_leaves_the_finished_report(finished, capsys, monkeypatch):
    out, before = finished

    def fails(*a, **k):
        raise ob.InvalidInputError("a failure half way")

    monkeypatch.setattr(compare, "synthetic_rows", fails)
    with pytest.raises(SystemExit) as exc:
        compare.main([*SYNTH, "--seed", "3", "--out", str(out)])
    assert exc.value.code == 2 and "half way" in _one_line_error(capsys.readouterr().err)
    assert {n: (out / n).read_bytes() for n in before} == before


def test_full_disk_never_leaves_a_report_md_without_its_json(finished, monkeypatch):
    """The second of the two report files fails to write (no space left): both old files stay."""
    import errno

    from otbound.report import tables

    out, before = finished
    real = Path.write_text

    def full_disk(self, text, *a, **k):
        if self.name.startswith(".report.tmp-") and self.suffix == ".md":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError):
        tables.write_report(out, "new", [])
    assert {n: (out / n).read_bytes() for n in before} == before
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".report")) == []


def test_ctrl_c_is_one_line_and_keeps_the_checkpoints(tmp_path, capsys, monkeypatch):
    from otbound.report import _synthetic

    out = tmp_path / "r"
    real = _synthetic.synthetic_cell
    calls = []

    def interrupted(**kw):
        calls.append(kw["family"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(**kw)

    monkeypatch.setattr(_synthetic, "synthetic_cell", interrupted)
    with pytest.raises(SystemExit) as exc:
        compare.main([*SYNTH, "--out", str(out)])
    assert exc.value.code == 130 and "interrupted" in _one_line_error(capsys.readouterr().err)
    assert len(read_checkpoints(out)) == 1  # the shard finished before Ctrl-C is kept
    assert not (out / ".otbound.lock").exists()


def test_earlier_modes_files_do_not_stay_beside_a_new_report(finished):
    out, _ = finished
    for name in ("rows.json", "paired.json", "paired_gaps.png", "end_to_end.png"):  # as other modes leave them
        (out / name).write_text("[]")
    compare.main([*SYNTH, "--out", str(out)])
    for name in ("rows.json", "paired.json", "paired_gaps.png", "end_to_end.png"):
        assert not (out / name).exists(), name
    assert (out / "token_bounds.png").exists()


def test_end_to_end_default_temperature_is_one(tmp_path):
    compare.main(["--end-to-end", "--e2e-verifiers", "rrs", "--e2e-prompts", "1", "--e2e-tokens", "2",
                  "--out", str(tmp_path)])
    meta = json.loads((tmp_path / "report.json").read_text())["meta"]
    assert meta["settings"]["e2e_temperature"] == 1.0


# ---------------------------------------------------------------------------------------------
# number of drafts far beyond the vocabulary


def _alpha_wr_by_complements(p, q, k):
    """α* for K i.i.d. drafts, 1 + min_H [p(H) − q(H)^K] over all subsets (small V), with
    q(H)^K = exp(K·log1p(−q(V∖H))) from the complement summed directly (no 1 − q(H) cancellation)."""
    import itertools

    v = p.size
    best = 0.0
    for r in range(v + 1):
        for h in itertools.combinations(range(v), r):
            rest = np.delete(q, h).sum()
            best = min(best, p[list(h)].sum() - (np.exp(k * np.log1p(-rest)) if rest < 1 else 0.0))
    return 1.0 + best


def test_alpha_star_at_the_largest_accepted_k_is_exact():
    rng = np.random.default_rng(5)
    for _ in range(3):
        p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.full(6, 0.3))
        for k in (1_000, ob._validation.MAX_NUM_DRAFTS):
            assert ob.optimal_acceptance(p, q, k) == pytest.approx(_alpha_wr_by_complements(p, q, k), abs=1e-9)


@pytest.mark.parametrize("k", [ob._validation.MAX_NUM_DRAFTS + 1, 10**6, 10**15, 10**30])
def test_more_drafts_than_resolvable_are_refused_at_once(k, tmp_path, capsys):
    import time

    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    t0 = time.perf_counter()
    with pytest.raises(ob.InvalidInputError, match="exceeds 65536"):
        ob.optimal_acceptance(p, q, k)
    for verifier in ob.VERIFIERS.values():
        with pytest.raises(ob.InvalidInputError, match="exceeds 65536"):
            verifier.acceptance(p, q, k)
    from otbound.report import measure_laws

    with pytest.raises(ob.InvalidInputError, match="exceeds 65536"):
        measure_laws(p[None], q[None], (k,))
    assert time.perf_counter() - t0 < 5, "refused before any work"
    with pytest.raises(SystemExit) as exc:
        compare.main(["--num-drafts", str(k), "--out", str(tmp_path / "r")])
    assert exc.value.code == 2 and "65536" in _one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize("bad, needle", [
    (np.array([0.25, -0.25, 0.5, 0.5]), "q has a negative entry -0.25 at index (1,)"),
    (np.array([0.25, np.nan, 0.5, 0.25]), "q has a NaN or infinite entry at index (1,)"),
])
@pytest.mark.parametrize("law", ["with_replacement", "greedy", "without_replacement"])
def test_bad_entry_message_is_the_same_for_numpy_and_torch_laws(bad, needle, law):
    """A bad entry is named with Python numbers (not ``np.int64(1)``), and numpy and torch laws get
    the same words."""
    import torch

    p = np.full(4, 0.25)
    for pp, qq in ((p, bad), (torch.tensor(p), torch.tensor(bad))):
        with pytest.raises(ob.InvalidInputError) as err:
            ob.optimal_acceptance(pp, qq, 2, law)
        assert str(err.value) == needle
