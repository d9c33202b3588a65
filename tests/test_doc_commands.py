"""The documentation's commands and code run as written.

Every ``python -m otbound.X ...`` and ``python experiments/X.py ...`` line of a shell block of the pages
(docs/**/*.md, README.md) is parsed by that command's own argument parser (its ``main`` runs up to its
``parse_args``), so a renamed or removed flag fails here. Commands that need the real Qwen pair are
marked ``[real pair]`` (a visible comment above them in the block, applying down to the next comment;
this test checks that exactly those commands are marked); the others that are cheap run as written, in an
empty folder, with the exit status the page states (0 unless a comment above says ``exit status N``). The
python blocks (not in doctest form: those run through pytest's ``--doctest-glob``) run page by page,
except those marked ``[real pair]``. With ``OTBOUND_REAL_DOCS=1`` and the pair converted in the cache,
the marked commands run too (the main job takes half an hour: never by default).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
PAGES = [p for p in PAGES if "_build" not in p.parts]
MARK = "[real pair]"
SHELL = ("bash", "sh", "shell", "console")


def _blocks(lang):
    """(page, line, text) of every fenced block of one of the languages ``lang``."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
            if m.group(1) in lang:
                out.append((page.relative_to(ROOT).as_posix(), text[: m.start()].count("\n") + 1, m.group(2)))
    return out


def _commands(block: str):
    """(command tokens, the comment lines above it) of a shell block: continuations joined, ``&&``
    split, prompts dropped; a comment applies to every command below it up to the next comment."""
    out, comments, fresh = [], [], True
    for line in block.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("#"):
            comments = comments + [line] if fresh else [line]
            fresh = True
            continue
        fresh = False
        if line.startswith("$ "):
            line = line[2:]
        tokens = shlex.split(line, comments=True)
        if not tokens:
            continue
        seg = []
        for t in tokens + ["&&"]:
            if t == "&&":
                if seg:
                    out.append((seg, list(comments)))
                seg = []
            else:
                seg.append(t)
    return out


def _target(tokens):
    """("module", name, args) / ("script", path, args) for a python command of ours, else None."""
    tokens = list(tokens)
    while tokens and tokens[0] in ("flock", "nice", "/usr/bin/time", "env"):
        head = tokens.pop(0)
        if head == "flock":
            tokens.pop(0)  # the lock file
        while tokens and (tokens[0].startswith("-") or "=" in tokens[0]):
            if tokens.pop(0) == "-n":
                tokens.pop(0)
    if len(tokens) < 2 or tokens[0] not in ("python", "python3"):
        return None
    if tokens[1] == "-m" and tokens[2].startswith("otbound."):
        return "module", tokens[2], tokens[3:]
    if tokens[1].startswith("experiments/") and tokens[1].endswith(".py"):
        return "script", tokens[1], tokens[2:]
    return None


def _all_commands():
    out = []
    for page, line, block in _blocks(SHELL):
        for tokens, comments in _commands(block):
            target = _target(tokens)
            if target is not None:
                out.append(pytest.param(page, target, any(MARK in c for c in comments), comments,
                                        id=f"{page}:{line}:{' '.join(tokens[:4])}"))
    return out


COMMANDS = _all_commands()


class _Parsed(BaseException):
    """Raised once the command's parser accepted the arguments (stops before any work)."""


def _parse(kind, name, args, monkeypatch):
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, argv=None, namespace=None):
        original(self, argv, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    if kind == "module":
        try:
            module = importlib.import_module(f"{name}.__main__")
        except ModuleNotFoundError:
            module = importlib.import_module(name)
    else:
        monkeypatch.syspath_prepend(str(ROOT / "experiments"))
        module = importlib.import_module(Path(name).stem)
    try:
        module.main(list(args))
    except _Parsed:
        return
    except SystemExit as exc:  # --help exits 0; a bad flag exits 2
        assert exc.code in (0, None), f"{name} {' '.join(args)}: exit status {exc.code}"
        return
    raise AssertionError(f"{name} ran without parsing its arguments")


def _needs_pair(kind, name, args) -> bool:
    if "--help" in args or "-h" in args:
        return False
    if kind == "module":
        if name == "otbound.compare":
            return "--synthetic" not in args and not ("--end-to-end" in args and "--e2e-pair" not in args)
        return name == "otbound.plan" and "--synthetic" not in args
    stem = Path(name).stem
    return ("real" in stem or stem in ("plan_positional_check", "truncation_mismatch", "compare_backends")
            or "--from-run" in args or "--pair" in args
            or (stem == "make_figures" and "--recompute" in args))


def _cheap(kind, name, args) -> bool:
    if "--help" in args:
        return True
    if name == "otbound.conformance":
        return "sample" not in args  # exact mode: seconds; sample mode: about a minute
    return name == "otbound.plan" and "--synthetic" in args


@pytest.mark.parametrize("page, target, marked, comments", COMMANDS)
def test_command_parses(page, target, marked, comments, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    _parse(*target, monkeypatch)


@pytest.mark.parametrize("page, target, marked, comments", COMMANDS)
def test_real_pair_commands_are_marked(page, target, marked, comments):
    assert marked == _needs_pair(*target), f"{page}: mark the block {MARK!r} exactly when it needs the real pair"


def _files_from_page(page: str, args, folder: Path) -> None:
    """Write the FILE.py of a ``FILE.py:FUNC`` argument from the page's python block defining FUNC."""
    text = (ROOT / page).read_text()
    for a in args:
        m = re.fullmatch(r"([\w/]+\.py):(\w+)", a)
        if m and not (ROOT / m.group(1)).exists():  # the first python block after the file is named
            after = text[text.index(f"`{m.group(1)}`"):]
            code = re.search(r"^```python\n(.*?)^```", after, re.S | re.M).group(1)
            assert f"def {m.group(2)}(" in code, f"{page}: no block defining {m.group(2)} after {m.group(1)}"
            (folder / m.group(1)).write_text(code)


@pytest.mark.parametrize("page, target, marked, comments",
                         [c for c in COMMANDS if not c.values[2] and _cheap(*c.values[1])])
def test_cheap_command_runs(page, target, marked, comments, tmp_path):
    kind, name, args = target
    _files_from_page(page, args, tmp_path)
    expected = next((int(m.group(1)) for c in comments for m in [re.search(r"exit status (\d+)", c)] if m), 0)
    cmd = [sys.executable, "-m", name, *args] if kind == "module" else [sys.executable, str(ROOT / name), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == expected, (proc.returncode, proc.stderr[-2000:])


def _pair_converted() -> bool:
    from otbound.lm import OFFLINE_MODELS, PAIRS
    from otbound.lm._offline import converted_problem

    return all(converted_problem(OFFLINE_MODELS[m]) is None for m in PAIRS["qwen2.5-coder"])


@pytest.mark.realmodel
@pytest.mark.parametrize("page, target, marked, comments", [c for c in COMMANDS if c.values[2]])
def test_real_pair_command_runs(page, target, marked, comments, tmp_path):
    if os.environ.get("OTBOUND_REAL_DOCS") != "1" or not _pair_converted():
        pytest.skip("needs OTBOUND_REAL_DOCS=1 and the real pair converted in the cache")
    kind, name, args = target
    cmd = [sys.executable, "-m", name, *args] if kind == "module" else [sys.executable, str(ROOT / name), *args]
    subprocess.run(cmd, cwd=ROOT, check=True)


PYTHON_PAGES = sorted({p for p, _, b in _blocks(("python",)) if ">>>" not in b})


@pytest.mark.parametrize("page", PYTHON_PAGES)
def test_python_blocks_run(page, tmp_path, monkeypatch):
    """The page's python blocks in order, in one namespace (later blocks use earlier names)."""
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__doc_page__"}
    for _, line, code in [b for b in _blocks(("python",)) if b[0] == page and ">>>" not in b[2]]:
        compiled = compile(code, f"{page}:{line}", "exec")  # every block is valid python
        if MARK in code:
            continue
        exec(compiled, namespace)
