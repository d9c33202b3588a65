"""Bad input, damaged files and concurrent runs: clear refusals, never a wrong number or file.

* CLI: every flag is checked before any work (exit 2, one line, nothing written).
* Ambiguous arguments: ``subset_mass`` ids vs masks.
* Size guards: refused by an estimate, before allocating (timed).
* Output folder: lock naming its holder, stale lock taken over, atomic writes with unique names.
* Stored artefacts: a trace (flipped byte, edited metadata, truncation, another pair mixed in), the
  measurement cache (re-collected trace, damaged JSON), the converted model folder, the results
  JSON of experiments/_common.py.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import otbound as ob
from otbound import compare
from otbound._integrity import LOCK_NAME, CorruptFileError, FolderLockedError, output_lock

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# CLI

BAD_FLAGS = {
    "negative temperature": ["--synthetic", "--temperature", "-1"],
    "nan temperature": ["--synthetic", "--temperature", "nan"],
    "zero mc samples": ["--synthetic", "--mc-samples", "0"],
    "zero instances": ["--synthetic", "--instances", "0"],
    "zero vocabulary": ["--synthetic", "--vocab-size", "0"],
    "negative seed": ["--synthetic", "--seed", "-1"],
    "non-integer K": ["--synthetic", "--num-drafts", "2.5"],
    "K above the vocabulary": ["--synthetic", "--vocab-size", "4", "--num-drafts", "5"],
    "zero block length": ["--synthetic", "--block", "--block-lens", "0"],
    "block LP too large": ["--synthetic", "--block", "--block-vocab", "9", "--block-lens", "5"],
    "one-token block vocabulary": ["--synthetic", "--block", "--block-vocab", "1"],
    "unknown dataset": ["--datasets", "no-such-set"],
    "unknown pair": ["--pair", "no-such-pair"],
    "zero prompts": ["--num-prompts", "0"],
    "zero new tokens": ["--max-new-tokens", "0"],
}


@pytest.mark.parametrize("argv", BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_every_bad_flag_exits_2_with_one_line_before_any_work(argv, tmp_path, capsys):
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as exit_info:
        compare.main([*argv, "--out", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m otbound.compare: error: ")
    assert not out.exists()  # nothing was written


def test_a_file_as_out_is_refused(tmp_path, capsys):
    target = tmp_path / "a-file"
    target.write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        compare.main(["--synthetic", "--out", str(target)])
    assert exit_info.value.code == 2 and "existing file" in capsys.readouterr().err
    assert target.read_text() == "mine"


def test_cli_subprocess_exit_code_and_message(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "otbound.compare", "--synthetic", "--temperature", "-1", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert run.returncode == 2
    assert (
        run.stderr.strip()
        == "python -m otbound.compare: error: argument --temperature: must be a finite temperature > 0, got '-1'"
    )


def test_report_records_effective_settings_and_its_values_follow_from_its_rows(tmp_path):
    argv = [
        "--synthetic",
        "--vocab-size",
        "5",
        "--instances",
        "2",
        "--num-drafts",
        "1",
        "2",
        "--temperature",
        "1.0",
        "--out",
        str(tmp_path),
    ]
    compare.main([*argv, "--mc-samples", "300"])
    report = json.loads((tmp_path / "report.json").read_text())
    settings = report["meta"]["settings"]
    assert settings == {"num_drafts": [1, 2], "temperatures": [1.0], "mc_samples": 300, "seed": 0}
    optimal = {
        (r["dataset"], r["num_drafts"], r["sampling"]): r["acceptance"]
        for r in report["rows"]
        if r["verifier"] == "optimal"
    }
    for r in report["rows"]:
        # efficiency = acceptance / α* of the verifier's own law (recomputed from the rows; 1e-12)
        assert r["efficiency"] == pytest.approx(
            r["acceptance"] / optimal[(r["dataset"], r["num_drafts"], r["sampling"])], abs=1e-12
        )
        assert r["acceptance"] <= r["optimal"] + (1e-12 if r["method"] == "exact" else 5 * 0.5 / np.sqrt(300))
    compare.main(argv)  # no --mc-samples: the default actually used is recorded, not None
    assert json.loads((tmp_path / "report.json").read_text())["meta"]["settings"]["mc_samples"] == 20_000


# ---------------------------------------------------------------------------------------------
# ambiguous arguments


def test_subset_mass_takes_masks_or_distinct_integer_ids():
    q = np.array([0.5, 0.3, 0.2])
    for law in ob.SAMPLINGS:
        by_mask = ob.subset_mass(q, np.array([True, False, True]), 2, law)
        assert ob.subset_mass(q, [0, 2], 2, law) == by_mask == ob.subset_mass(q, [2, 0], 2, law)
    for bad, what in (
        ([1, 0, 0], "repeats"),
        ([0.0, 1.0], "integer"),
        ([3], "outside"),
        ([-1], "outside"),
        ([True, False], "shape"),
        ([[0, 1]], "1-D"),
    ):
        with pytest.raises(ob.InvalidInputError, match=what):
            ob.subset_mass(q, bad, 2)


# ---------------------------------------------------------------------------------------------
# size guards: refused by an estimate, before anything large is built


def test_size_guards_refuse_before_allocating():
    from otbound.block._tree import build_tree

    target = ob.dirichlet_model(2, seed=0)
    t0 = time.perf_counter()
    with pytest.raises(ob.InvalidInputError, match="MAX_TREE_CELLS"):  # V^L overflows int64 at L = 70
        build_tree(target, target, 70)
    with pytest.raises(ob.InvalidInputError, match="MAX_SPLIT_VARIABLES"):
        ob.block_bound(
            ob.dirichlet_model(6, seed=0),
            ob.dirichlet_model(6, seed=1),
            vocab_size=6,
            num_drafts=2,
            block_len=5,
            kind="causal",
        )
    big = ob.dirichlet_model(12, seed=0)
    with pytest.raises(ob.InvalidInputError, match="MAX_EXACT_TUPLES"):  # before the 12^7 prefix law
        ob.BLOCK_VERIFIERS["token"].acceptance(big, big, vocab_size=12, num_drafts=2, block_len=7)
    assert time.perf_counter() - t0 < 5.0


# ---------------------------------------------------------------------------------------------
# output folder: lock and atomic writes


def test_second_run_on_a_folder_is_refused_naming_the_holder(tmp_path, capsys):
    with output_lock(tmp_path):
        holder = json.loads((tmp_path / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(FolderLockedError, match=f"pid {os.getpid()} on host"):
            with output_lock(tmp_path):
                pass
        with pytest.raises(SystemExit) as exc:
            compare.main(["--synthetic", "--out", str(tmp_path)])
        err = capsys.readouterr().err.splitlines()
        assert exc.value.code == 2, "a locked folder is a failure the user caused: exit status 2"
        assert len(err) == 1 and err[0].startswith("python -m otbound.compare: error: ")
        assert f"pid {os.getpid()}" in err[0]
    assert not (tmp_path / LOCK_NAME).exists()


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": "x"}))
    with output_lock(tmp_path):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


def _hammer(path, tag, n):
    from otbound.report.tables import write_report

    for i in range(n):
        write_report(path, f"writer {tag}", [], meta={"i": i, "pad": "x" * 20_000})


def test_concurrent_report_writers_never_leave_an_unparsable_report(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_hammer, args=(tmp_path, t, 60)) for t in "ab"]
    for w in writers:
        w.start()
    reads = 0
    while any(w.is_alive() for w in writers):
        if (tmp_path / "report.json").exists():
            json.loads((tmp_path / "report.json").read_text())  # always a whole report
            reads += 1
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert reads > 0
    assert json.loads((tmp_path / "report.json").read_text())["title"] in ("writer a", "writer b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md"]  # no temporary left


# ---------------------------------------------------------------------------------------------
# stored artefacts


def _flip_byte_in(path: Path, needle_offset_from_end: int = 100):
    data = bytearray(path.read_bytes())
    data[-needle_offset_from_end] ^= 0x01
    path.write_bytes(bytes(data))


def test_results_json_of_experiments_checked_on_load(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "experiments"))
    import _common

    args = _common.parser("t").parse_args(["--results", str(tmp_path)])
    calls = []

    def compute(params, cp):
        calls.append(1)
        return {"value": 0.123456789}

    first = _common.load_or_compute(args, "demo", {"a": 1}, compute)
    _common._COMPUTED.clear()
    assert _common.load_or_compute(args, "demo", {"a": 1}, compute)["results"] == first["results"] and len(calls) == 1
    path = tmp_path / "demo.json"
    path.write_text(path.read_text().replace("0.123456789", "0.123456788"))  # one digit changed
    _common._COMPUTED.clear()
    assert (
        _common.load_or_compute(args, "demo", {"a": 1}, compute)["results"] == {"value": 0.123456789}
        and len(calls) == 2
    )
    path.write_text(path.read_text()[:40])  # truncated
    _common._COMPUTED.clear()
    assert (
        _common.load_or_compute(args, "demo", {"a": 1}, compute)["results"] == {"value": 0.123456789}
        and len(calls) == 3
    )


def test_committed_results_carry_valid_checksums():
    sys.path.insert(0, str(ROOT / "experiments"))
    import _common

    for path in sorted((ROOT / "data" / "results").glob("fig_*.json")):
        stored = json.loads(path.read_text())
        assert stored["meta"]["sha256"] == _common._results_key(stored), path


def test_corrupt_file_error_is_an_invalid_input_error():
    assert issubclass(CorruptFileError, ob.InvalidInputError)


@pytest.fixture(scope="module")
def tiny_pair():
    torch = pytest.importorskip("torch")
    from test_lm import TINY, V, tiny_tokenizer

    torch.set_num_threads(1)
    pair = ob_lm().random_pair(TINY, TINY, vocab_size=V, device="cpu", dtype="float32", seed=3)
    pair.tokenizer = tiny_tokenizer()
    return pair


def ob_lm():
    import otbound.lm

    return otbound.lm


def test_damaged_traces_are_detected_and_recollected(tiny_pair, tmp_path, capsys):
    from test_lm import toy_prompts

    lm = ob_lm()
    prompts = toy_prompts(3)
    paths = lm.collect_traces(tiny_pair, prompts, tmp_path, max_new_tokens=4, progress=False)
    original = [p.read_bytes() for p in paths]
    from otbound.lm import _store

    # a flipped byte in the stored logits: refused on load, never a silently different α*
    _flip_byte_in(paths[0])
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        list(lm.load_traces(paths[0]))
    # edited metadata (temperature) with the tensors intact
    tensors, meta = _store.read(paths[1])
    meta.pop("sha256")
    meta["temperature"] = 0.5
    from safetensors.numpy import save_file

    save_file(
        tensors,
        str(paths[1]),
        metadata={
            "otbound": json.dumps(
                dict(meta, sha256=_store.tensor_digests(tensors), meta_sha256="0" * 64), sort_keys=True
            )
        },
    )
    with pytest.raises(CorruptFileError, match="metadata"):
        list(lm.load_traces(paths[1]))
    # a truncated file
    paths[2].write_bytes(original[2][: len(original[2]) // 2])
    with pytest.raises(CorruptFileError, match="unreadable"):
        list(lm.load_traces(paths[2]))
    capsys.readouterr()
    again = lm.collect_traces(tiny_pair, prompts, tmp_path, max_new_tokens=4, progress=False)
    err = capsys.readouterr().err
    assert again == paths and err.count("re-collecting it") == 3
    assert len(list(lm.load_traces(tmp_path))) == 3  # all intact again


def test_trace_of_another_pair_is_not_mixed_in(tiny_pair, tmp_path):
    from test_lm import TINY, V, toy_prompts

    lm = ob_lm()
    other = lm.random_pair(TINY, TINY, vocab_size=V, device="cpu", dtype="float32", seed=4)
    other.tokenizer = tiny_pair.tokenizer
    prompts = toy_prompts(2)
    mine = lm.collect_traces(tiny_pair, prompts, tmp_path / "a", max_new_tokens=3, progress=False)
    theirs = lm.collect_traces(other, prompts, tmp_path / "b", max_new_tokens=3, progress=False)
    mine[1].write_bytes(theirs[1].read_bytes())  # copied in by hand: no model needs loading to resume

    def never():
        raise AssertionError("no model should be loaded")

    with pytest.raises(ob.InvalidInputError, match="mixes runs of different pairs"):
        lm.collect_traces(never, prompts, tmp_path / "a", max_new_tokens=3, progress=False)


def test_measurement_cache_is_keyed_by_trace_content(tiny_pair, tmp_path, capsys):
    from test_lm import toy_prompts

    from otbound.report import measure_trace

    lm = ob_lm()
    prompts = toy_prompts(1)
    kwargs = dict(num_drafts=(2,), verifiers=["rrs"], mc_samples=8, cache_dir=tmp_path / "measure")
    (first,) = lm.load_traces(
        lm.collect_traces(tiny_pair, prompts, tmp_path / "t", max_new_tokens=4, seed=0, progress=False)[0]
    )
    cached = measure_trace(first, **kwargs)
    # the trace is re-collected with another seed at the same path: the old measurement must not come back
    import shutil

    shutil.rmtree(tmp_path / "t")
    (second,) = lm.load_traces(
        lm.collect_traces(tiny_pair, prompts, tmp_path / "t", max_new_tokens=4, seed=1, progress=False)[0]
    )
    assert not np.array_equal(second.tokens, first.tokens)
    fresh = measure_trace(second, num_drafts=(2,), verifiers=["rrs"], mc_samples=8)
    again = measure_trace(second, **kwargs)
    assert again["optimal"] == fresh["optimal"] != cached["optimal"]
    # a damaged cache file is measured again (with a message), not trusted
    (cache_file,) = (tmp_path / "measure").rglob("*.json")
    text = cache_file.read_text()
    digit = next(i for i, c in enumerate(text) if c.isdigit() and text[i - 1] == ".")
    cache_file.write_text(text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1 :])
    capsys.readouterr()
    assert measure_trace(second, **kwargs)["optimal"] == fresh["optimal"]
    assert "damaged" in capsys.readouterr().err
    cache_file.write_text("{")
    assert measure_trace(second, **kwargs)["optimal"] == fresh["optimal"]


def test_converted_model_folder_is_checked_fast_on_load_and_fully_on_verify(tmp_path, monkeypatch):
    """A tiny fake converted folder: its marker's manifest is checked (sizes/times on every load,
    SHA-256 with verify), and the traces' source records the digest of the files themselves."""
    from otbound._integrity import folder_manifest
    from otbound.lm import _offline

    monkeypatch.setenv("OTBOUND_CACHE", str(tmp_path))
    model = _offline.OfflineModel("fake", "fake.gguf", (), 3, "ab" * 32, "test")
    folder = model.converted_dir
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights-0123456789")
    (folder / "config.json").write_text("{}")
    marker = folder / _offline._MARKER
    marker.write_text(json.dumps({"sha256": model.sha256}))  # the old marker: no manifest, not trusted
    assert "no manifest" in _offline.converted_problem(model)
    marker.write_text(
        json.dumps({"sha256": model.sha256, "files": folder_manifest(folder, exclude=(_offline._MARKER,))})
    )
    assert _offline.converted_problem(model) is None and _offline.converted_problem(model, full=True) is None
    digest = _offline.converted_digest(model)
    stat = (folder / "model.safetensors").stat()
    (folder / "model.safetensors").write_bytes(b"weights-0123456788")  # same size, one byte changed
    os.utime(folder / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with the old time
    assert _offline.converted_problem(model) is None  # the fast check alone cannot see it ...
    assert "SHA-256 differs" in _offline.converted_problem(model, full=True)  # ... the full one does
    (folder / "model.safetensors").write_bytes(b"weights-0123456788")  # touched now: fast check falls back to full
    assert "SHA-256 differs" in _offline.converted_problem(model)
    (folder / "model.safetensors").write_bytes(b"short")
    assert "bytes, recorded" in _offline.converted_problem(model)
    (folder / "extra.bin").write_bytes(b"")
    assert "unexpected" in _offline.converted_problem(model)
    assert digest == _offline.converted_digest(model)  # recorded at conversion, not recomputed
