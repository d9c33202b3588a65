"""The real-pair grid of the engine audit: the audit's acceptance-only mode (``lossless_samples=0``)
and the resumable driver ``experiments/engine_grid.py`` (its cells stored as they complete, skipped
when stored intact with the same settings, the table assembled from the stored files only)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from otbound import InvalidInputError, content_key
from otbound.engine import Sampling, counter_metrics, load_engine_json, run_audit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import engine_grid  # noqa: E402


def test_negative_lossless_samples_are_refused_before_anything_starts(tmp_path):
    with pytest.raises(InvalidInputError, match="lossless samples >= 0"):
        run_audit(tmp_path / "o", synthetic=True, lossless_samples=-1, progress=False)
    assert not (tmp_path / "o").exists()


def test_acceptance_only_audit_skips_the_lossless_test_its_control_and_the_speed_baseline(tmp_path):
    from otbound.lm import llama_cpp_build

    llama_cpp_build(progress=False)
    out = tmp_path / "a"
    record = run_audit(out, synthetic=True, configs=[("draft-simple", 2, 0.0)], samplings=[Sampling.named("topk4")],
                       num_prompts=1, seeds_per_prompt=1, n_predict=8, lossless_samples=0,
                       speed_without_speculation=False, progress=False)
    conf = record["configurations"][0]
    assert conf["lossless"] is None and record["controls"] == {}
    assert "tokens_per_second_without_speculation" not in conf and conf["tokens_per_second"] > 0
    assert record["settings"]["speed_without_speculation"] is False
    assert record["settings"]["lossless_samples"] == 0 and record["settings"]["prompt_source"] is None
    # the acceptance part is complete: one request, its timings summing to the counters
    assert len(conf["requests"]) == 1 and conf["timings_match_counters"]
    assert conf["counters"]["drafts"] > 0 and conf["bound_mean_acceptance_length"] is not None
    assert load_engine_json(out / "engine.json")["sha256"] == record["sha256"]


# -- the driver, with the audit replaced by a recorder that writes what run_audit writes ----------

def _fake_audit(calls, interrupt_at=None, control_p=0.5):
    def fake(out, *, pair, configs, samplings, num_prompts, seeds_per_prompt, n_predict, lossless_samples,
             lossless_depth, n_probs, prompt_source, seed, speed_without_speculation, progress):
        calls.append((prompt_source, samplings[0].name, tuple(configs[0]), lossless_samples))
        if interrupt_at is not None and len(calls) == interrupt_at:
            raise KeyboardInterrupt
        spec_type, n_max, p_min = configs[0]
        drafts = 0.0 if spec_type == "ngram-simple" else 4.0
        # per draft: n_max tokens drafted, the first accepted every time, the second in half the drafts
        counters = {"drafts": drafts, "draft_tokens": drafts * n_max, "accepted_tokens": drafts * 1.5,
                    "accepted_per_pos": [drafts, drafts / 2] + [0.0] * (n_max - 2)}
        conf = {"config": {"spec_type": spec_type, "draft_max": n_max, "p_min": p_min,
                           "sampling": {"name": samplings[0].name, "params": samplings[0].params}},
                "counters": counters, **counter_metrics(counters), "lossless": None}
        controls = {}
        if lossless_samples:
            conf["lossless"] = {"p_value": 0.3, "samples": lossless_samples, "cells": 6, "detectable_tv": 0.1,
                                "empirical_tv": 0.05, "draft_tokens": 250, "draft_tokens_accepted": 200,
                                "lossless": True}
            controls = {samplings[0].name: {"p_value": control_p, "samples": lossless_samples, "cells": 6,
                                            "empirical_tv": 0.04}}
        record = {"settings": {"num_prompts": num_prompts, "seeds_per_prompt": seeds_per_prompt,
                               "n_predict": n_predict, "lossless_samples": lossless_samples,
                               "lossless_depth": lossless_depth, "n_probs": n_probs, "seed": seed,
                               "prompt_source": prompt_source, "speed_without_speculation": speed_without_speculation,
                               "samplings": [{"name": s.name, "params": s.params} for s in samplings]},
                  "configurations": [conf], "controls": controls}
        record["sha256"] = content_key(record)
        Path(out).mkdir(parents=True)
        (Path(out) / "engine.json").write_text(json.dumps(record))
        return record
    return fake


def _args(tmp_path, *extra):
    return engine_grid.parser().parse_args(["--quiet", "--figure", str(tmp_path / "grid.png"), *extra])


def test_the_grid_resumes_after_an_interruption_and_runs_every_cell_once(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_grid, "RESULTS", tmp_path)
    calls = []
    monkeypatch.setattr(engine_grid, "run_audit", _fake_audit(calls, interrupt_at=5))
    with pytest.raises(KeyboardInterrupt):
        engine_grid.run_grid(_args(tmp_path))
    assert len(list(tmp_path.glob("engine_grid_*.json"))) == 4  # the cells that completed, nothing partial
    assert not list(tmp_path.glob("*.partial"))
    monkeypatch.setattr(engine_grid, "run_audit", _fake_audit(calls))
    engine_grid.run_grid(_args(tmp_path))
    # 2 prompt sets x 3 samplings x 7 configurations, and one lossless cell per sampling setting
    assert len(calls) == 45 + 1 and len(set(calls)) == 45
    assert calls[4] == calls[5]  # the interrupted cell, run again; no completed one is
    assert sum(c[3] > 0 for c in calls[5:]) == 3 and {c[3] for c in calls[5:]} == {0, 150}
    assert {(c[0], c[2]) for c in calls if c[3]} == {("humaneval", engine_grid.LOSSLESS_CONFIG)}
    n = len(calls)
    engine_grid.run_grid(_args(tmp_path))
    assert len(calls) == n  # everything stored: nothing runs


def test_a_damaged_or_differently_configured_cell_is_run_again(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_grid, "RESULTS", tmp_path)
    calls = []
    monkeypatch.setattr(engine_grid, "run_audit", _fake_audit(calls))
    engine_grid.run_grid(_args(tmp_path, "--only", "lossless"))
    assert len(calls) == 3
    first = sorted(tmp_path.glob("engine_grid_lossless_*.json"))[0]
    record = json.loads(first.read_text())
    record["configurations"][0]["lossless"]["p_value"] = 0.9  # altered: the checksum no longer holds
    first.write_text(json.dumps(record))
    engine_grid.run_grid(_args(tmp_path, "--only", "lossless"))
    assert len(calls) == 4
    engine_grid.run_grid(_args(tmp_path, "--only", "lossless", "--lossless-samples", "400"))
    assert len(calls) == 7 and calls[-1][3] == 400
    engine_grid.run_grid(_args(tmp_path, "--only", "lossless", "--lossless-samples", "400", "--speed"))
    assert len(calls) == 10


def test_the_assembled_table_comes_from_the_stored_counters(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_grid, "RESULTS", tmp_path)
    calls = []
    monkeypatch.setattr(engine_grid, "run_audit", _fake_audit(calls, control_p=0.001))
    engine_grid.run_grid(_args(tmp_path))
    text = engine_grid.assemble(_args(tmp_path, "--table", str(tmp_path / "grid.md")))
    assert (tmp_path / "grid.png").stat().st_size > 0 and (tmp_path / "grid.md").read_text() == text
    rows = [line for line in text.splitlines() if line.startswith("| humaneval") or line.startswith("| mtbench")]
    assert len(rows) == 42
    # 4 drafts, 6 accepted tokens: mean acceptance length 1 + 6/4, acceptance rate 6 / (4 n_max)
    n8 = next(r for r in rows if r.startswith("| mtbench | qwen | draft-simple n8 p0.75 |"))
    assert "| 4 | 2.50 " in n8 and "| 0.19 |" in n8
    assert "no drafts" in next(r for r in rows if "ngram-simple" in r)
    lossless = [line for line in text.splitlines() if line.startswith("| default@") or line.startswith("| qwen")]
    assert len(lossless) == 3 and all("inconclusive (the control rejects)" in r for r in lossless)


def test_the_gap_to_the_bound_per_iteration():
    # accepted tokens minus sum_l prod_{j<=l} p_j: 2 - (0.5 + 0.25), 1 - (1 + 0.5), 0 - 0.2
    conf = {"iterations": [{"accepted": 2, "target_probs": [0.5, 0.5]},
                           {"accepted": 1, "target_probs": [1.0, 0.5]},
                           {"accepted": 0, "target_probs": [0.2]}]}
    gaps = engine_grid.bound_gaps(conf)
    assert gaps.tolist() == pytest.approx([1.25, -0.5, -0.2])
    m, lo, hi = engine_grid.gap_interval(gaps)
    # t interval with 2 degrees of freedom: t_0.975 = 4.302652729911275
    se = np.std([1.25, -0.5, -0.2], ddof=1) / np.sqrt(3)
    assert m == pytest.approx(0.55 / 3) and hi - m == pytest.approx(4.302652729911275 * se)
    assert engine_grid.bound_gaps({"iterations": []}).size == 0
    rows = [({"kind": "acceptance"}, {"configurations": [conf]}), ({"kind": "acceptance"}, {"configurations": [{}]})]
    mismatched = ({"kind": "acceptance"}, {"configurations": [dict(conf, reconstruction_matches_counters=False)]})
    pooled = engine_grid.pooled_gap(rows + [mismatched])  # a cell whose rebuilt drafts are not the engine's: left out
    assert pooled.startswith("Pooled over the 3 iterations of the 1 draft-simple cells whose rebuilt iterations "
                             "reproduce the counters: engine − bound 0.183")
