"""The experiments scripts of Gumbel-max list sampling and of the draft temperature, run on traces of
the tiny random pair (the real pair's runs are commands in their docstrings)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def _load(name, monkeypatch):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gls_real_on_tiny_traces(tmp_path, monkeypatch):
    out = tmp_path / "gls.json"
    res = _load("gls_real", monkeypatch).main(["--tiny", "--num-drafts", "1", "2", "--out", str(out)])
    assert json.loads(out.read_text())["by_k"] == json.loads(json.dumps(res["by_k"]))
    assert res["positions"] == 4 * 6 and res["traces"] == 4
    for k, e in res["by_k"].items():
        assert e["gls"]["max_over_alpha_star"] <= 1e-12  # below α* of its law at every position
        assert e["ot"]["gap"] == pytest.approx(0.0, abs=1e-9)  # the optimal verifier attains it
        if k == "1":
            assert e["rrs"]["gap"] == pytest.approx(0.0, abs=1e-12)
            assert e["gls"]["gap"] < 0  # no rejection step: below 1 − TV


def test_gls_real_monte_carlo_brackets_the_exact_value(tmp_path, monkeypatch):
    """--mc-samples: the Monte Carlo mean at K = 2 within 5 standard errors (0.5/√(N·positions)) of
    the exact one on the same traces."""
    mod = _load("gls_real", monkeypatch)
    exact = mod.main(["--tiny", "--num-drafts", "2"])["by_k"]["2"]["gls"]["mean"]
    res = mod.main(["--tiny", "--num-drafts", "2", "--mc-samples", "4000", "--seed", "3"])
    assert res["gls_method"].startswith("exact at K = 1, Monte Carlo")
    assert abs(res["by_k"]["2"]["gls"]["mean"] - exact) < 5 * 0.5 / np.sqrt(4000 * res["positions"])
    # the Monte Carlo part of the error, √(Σ a(1 − a)/N)/n, at most its worst case 0.5/√(N n)
    se = res["by_k"]["2"]["gls"]["mc_se"]
    assert 0 < se <= 0.5 / np.sqrt(4000 * res["positions"]) + 1e-15 and "mc_se" not in res["by_k"]["2"]["rrs"]


def test_gls_real_positions_figure_and_bad_input(tmp_path, monkeypatch, capsys):
    mod = _load("gls_real", monkeypatch)
    assert mod.positions(32, 4).tolist() == [0, 10, 21, 31]   # evenly spaced, both ends
    assert mod.positions(2, 5).tolist() == [0, 1]
    fig = tmp_path / "gls.png"
    res = mod.main(["--tiny", "--num-drafts", "1", "--max-positions", "2", "--temperature", "1.0",
                    "--figure", str(fig)])
    assert res["positions"] == 4 * 2 and fig.stat().st_size > 1000
    with pytest.raises(SystemExit) as exc:
        mod.main(["--tiny", "--mc-samples", "0"])
    assert exc.value.code == 2 and "--mc-samples must be positive" in capsys.readouterr().err


def test_draft_temperature_real_on_tiny_traces(tmp_path, monkeypatch):
    out = tmp_path / "temp.json"
    res = _load("draft_temperature_real", monkeypatch).main(["--tiny", "--num-drafts", "1", "2", "--grid", "9",
                                                             "--out", str(out)])
    assert json.loads(out.read_text())["trace_temperature"] == 1.0
    for r in res["by_k"].values():
        best = r["best_per_position"]["mean"]
        assert best >= r["at_trace_temperature"]["mean"] - 1e-9 and best >= r["deterministic"]["mean"] - 1e-12
        assert r["run_acceptance"] <= best + 1e-12
        assert r["run_acceptance"] >= max(r["curve"]["mean_alpha_star"]) - 1e-12


def test_draft_temperature_real_several_temperatures_and_figure(tmp_path, monkeypatch):
    """Two runs under 'runs' (the tiny traces hold one temperature: the same values twice), evenly
    spaced positions, and the figure."""
    mod = _load("draft_temperature_real", monkeypatch)
    one = mod.main(["--tiny", "--num-drafts", "1", "--grid", "5", "--max-positions", "3"])
    fig = tmp_path / "temp.png"
    two = mod.main(["--tiny", "--num-drafts", "1", "--grid", "5", "--max-positions", "3", "--temperature", "1.0",
                    "1.0", "--figure", str(fig)])
    assert one["positions"] == 4 * 3 and [r["by_k"] for r in two["runs"]] == [one["by_k"]] * 2
    assert fig.stat().st_size > 1000
