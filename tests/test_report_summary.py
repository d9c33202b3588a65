"""The report opens with its findings: the summary of report.md / report.json recomputed here from the
report's own rows (the verifier named closest to each law's optimum has the smallest gap, the law named
best the largest α*), Monte Carlo cells marked, what was not measured listed with its reason, and the
run's versions, machine and wall time recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from otbound.report import tables
from otbound.token.verifiers import VERIFIERS

ROOT = Path(__file__).resolve().parents[1]
KS = (2, 4)
TEMPS = (0.7, 1.0)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    cmd = [sys.executable, "-m", "otbound.compare", "--synthetic", "--out", str(out), "--num-drafts",
           *map(str, KS), "--temperature", *map(str, TEMPS), "--instances", "6", "--mc-samples", "400"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=out)
    elapsed = time.monotonic() - t0
    report = json.loads((out / "report.json").read_text())
    return report, (out / "report.md").read_text(), elapsed


def _table_cells(md: str, k: int, t: float) -> dict:
    """{(row label, column): cell} of the main table for (K, T) in report.md."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| K = {k}, T = {t} |"))
    head = [c.strip() for c in lines[start].strip("|").split("|")][1:]
    cells = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        parts = [c.strip() for c in line.strip("|").split("|")]
        cells.update({(parts[0], col): cell for col, cell in zip(head, parts[1:])})
    return cells


def _summary_cell(md: str, heading: str, row: str, k: int) -> str:
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    head = [c.strip() for c in lines[start].strip("|").split("|")]
    for line in lines[start + 2:]:
        parts = [c.strip() for c in line.strip("|").split("|")]
        if parts[0] == row:
            return parts[head.index(f"K = {k}")]
    raise AssertionError(f"no row {row!r} under {heading!r}")


def test_summary_opens_the_report(synthetic):
    _, md, _ = synthetic
    order = [md.index(h) for h in ("## Summary", "## Run", "## Not measured", "## Tables")]
    assert order == sorted(order)
    assert md.splitlines()[2] == "## Summary"


def test_closest_verifier_has_the_smallest_gap(synthetic):
    report, md, _ = synthetic
    rows = [r for r in report["rows"] if r["acceptance"] is not None]
    checked = 0
    for law in {r["sampling"] for r in rows}:
        for k in KS:
            mine = [r for r in rows if r["sampling"] == law and r["num_drafts"] == k and r["verifier"] != "optimal"
                    and r["lossless"]]
            if not mine:
                continue
            # recomputed here: mean over the cells of acceptance − α* (the paired gap's mean is exactly this)
            gaps = {v: np.mean([r["acceptance"] - r["optimal"] for r in mine if r["verifier"] == v])
                    for v in {r["verifier"] for r in mine}}
            best = max(gaps.values())
            leaders = sorted(v for v, g in gaps.items() if g >= best - 1e-9)
            entry = next(c for c in report["summary"]["closest"] if c["sampling"] == law and c["num_drafts"] == k)
            named = [e["verifier"] for e in entry["ranking"] if e["gap"] >= entry["ranking"][0]["gap"] - 1e-9]
            assert sorted(named) == leaders, (law, k)
            assert entry["ranking"][0]["gap"] == pytest.approx(best, abs=1e-12)
            cell = _summary_cell(md, "| draft law |", law, k)
            assert cell.startswith(f"**{', '.join(leaders)}** {round(best, 4) + 0.0:+.4f} ± "), cell
            runner = [g for v, g in gaps.items() if v not in leaders]
            if runner:
                assert "; next " in cell and f"{round(max(runner), 4) + 0.0:+.4f}" in cell.split("; next ")[1]
            checked += 1
    assert checked >= 6


def test_best_law_has_the_largest_optimum(synthetic):
    report, md, _ = synthetic
    opt = [r for r in report["rows"] if r["verifier"] == "optimal"]
    for t in TEMPS:
        for k in KS:
            means = {law: np.mean([r["acceptance"] for r in opt if r["temperature"] == t and r["num_drafts"] == k
                                   and r["sampling"] == law]) for law in {r["sampling"] for r in opt}}
            best = max(means, key=means.get)
            entry = next(b for b in report["summary"]["best_law"] if b["temperature"] == t and b["num_drafts"] == k)
            assert entry["ranking"][0]["sampling"] == best
            assert entry["ranking"][0]["optimal"] == pytest.approx(means[best], abs=1e-12)
            cell = _summary_cell(md, "| T |", f"{t:g}", k)
            assert cell.startswith(f"**{best}** {means[best]:.4f} ± ")


def test_monte_carlo_cells_are_marked(synthetic):
    report, md, _ = synthetic
    rows = [r for r in report["rows"] if r["acceptance"] is not None]
    mc = [r for r in rows if r["method"] == "monte_carlo"]
    assert any(r["verifier"] == "rrs_wor" and r["num_drafts"] == 4 for r in mc)
    for r in rows:
        label = f"**optimal ({r['sampling']})**" if r["verifier"] == "optimal" else f"{r['verifier']} ({r['sampling']})"
        cell = _table_cells(md, r["num_drafts"], r["temperature"])[(label, r["dataset"])]
        assert (tables.MC_MARK in cell) == (r["method"] == "monte_carlo"), (label, cell)


def test_skipped_verifiers_are_listed_with_their_reason(synthetic):
    report, md, _ = synthetic
    section = md.split("## Not measured")[1].split("## Tables")[0]
    expected = [(name, k) for name, v in VERIFIERS.items() for k in KS if v.max_drafts and k > v.max_drafts]
    assert expected
    for name, k in expected:
        assert f"- {name} at K={k}: verifier '{name}' supports at most" in section
        assert not [r for r in report["rows"] if r["verifier"] == name and r["num_drafts"] == k]
    assert len(report["skipped"]) == len(set(report["skipped"])) >= len(expected)


def test_versions_machine_and_wall_time(synthetic):
    report, md, elapsed = synthetic
    env = report["environment"]
    assert env["versions"]["numpy"] == np.__version__
    assert env["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert env["machine"]["cores"] == os.cpu_count()
    assert env["machine"]["cpu"]
    assert 0 < env["wall time (s)"] <= elapsed
    assert f"- machine: {env['machine']['cpu']}, {os.cpu_count()} cores" in md
    assert f"numpy {np.__version__}" in md and "- wall time: " in md


def test_real_report_rows(tmp_path):
    """The trace report's rows (tiny pair): paired gaps from the rows, skipped rows' reasons listed."""
    from otbound.lm import tiny_pair
    from otbound.report import run_real_report

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}", "token_ids": [i, 2]}) + "\n" for i in range(3)))
    rows = run_real_report(tiny_pair(8), datasets=[data], num_prompts=3, max_new_tokens=4, temperatures=(1.0,),
                           num_drafts=(2, 3), out=tmp_path / "run", progress=False,
                           verifiers=["rrs", "kseq", "spechub"], samplings=("with_replacement", "greedy"),
                           store_logits="none")
    tables.write_report(tmp_path / "rep", "demo", rows)
    md = (tmp_path / "rep" / "report.md").read_text()
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    skipped = [r for r in rows if r["acceptance"] is None]
    assert [(r["verifier"], r["num_drafts"]) for r in skipped] == [("spechub", 3)]
    assert f"- spechub at K = 3 (prompts, T = 1): {skipped[0]['skipped']}" in md
    for k in (2, 3):
        mine = [r for r in rows if r["num_drafts"] == k and r["sampling"] == "with_replacement"
                and r["verifier"] != "optimal"]
        best = max(mine, key=lambda r: r["gap"])
        entry = next(c for c in report["summary"]["closest"]
                     if c["sampling"] == "with_replacement" and c["num_drafts"] == k)
        assert entry["ranking"][0]["verifier"] == best["verifier"]
        assert entry["ranking"][0]["gap_ci"] == pytest.approx(best["gap_ci"], abs=1e-12)  # the paired interval
