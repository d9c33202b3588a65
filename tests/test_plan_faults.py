"""The planner under misuse and faults: one line and exit 2 (Ctrl-C: 130), never a traceback; a
failing rerun leaves the previous plan byte for byte; stored cost models refused when edited; the
speed-ups recomputed by hand where verification costs something; the machine's load recorded."""

from __future__ import annotations

import errno
import json
import pathlib
import time

import numpy as np
import pytest

import otbound as ob
from otbound._integrity import CorruptFileError, output_lock
from otbound.plan import (
    CostCurve,
    CostModel,
    chain_shape,
    evaluate,
    load_cost,
    synthetic_table,
    tree_shape,
    window_levels,
)
from otbound.plan._cost import UNSTABLE_SPREAD, timing_stability

SMALL = ["--synthetic", "--max-drafts", "2", "--max-depth", "2", "--budgets", "2", "4", "--verifiers", "rrs",
         "--laws", "with_replacement", "--quiet"]


def _cli(argv, capsys):
    from otbound.plan.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code, capsys.readouterr().err.strip()


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(pathlib.Path(folder).iterdir())}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished plan: its files' bytes, to compare after failing reruns."""
    from otbound.plan.__main__ import main

    out = tmp_path_factory.mktemp("plan")
    main([*SMALL, "--out", str(out)])
    return out, _snapshot(out)


def _rerun_fails_and_keeps(finished, tmp_path, capsys, argv, code=2):
    out, before = finished
    work = tmp_path / "plan"
    work.mkdir()
    for name, data in before.items():
        (work / name).write_bytes(data)
    got, err = _cli([*SMALL, "--out", str(work), *argv], capsys)
    assert got == code and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert _snapshot(work) == before  # nothing replaced, no temporary file left beside
    return err


def test_finished_plan_has_its_three_files(finished):
    assert sorted(finished[1]) == ["plan.json", "plan.md", "plan.png"]


def test_rerun_with_no_candidate_keeps_the_previous_plan(finished, tmp_path, capsys):
    """The rerun's verifier draws from another law than the one planned: no candidate at all."""
    err = _rerun_fails_and_keeps(finished, tmp_path, capsys, ["--laws", "greedy"])
    assert "no candidate" in err


def test_full_disk_keeps_the_previous_plan(finished, tmp_path, capsys, monkeypatch):
    real = pathlib.Path.write_text

    def full(self, *a, **k):
        if self.name.startswith(".plan"):  # the plan's temporary files
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    err = _rerun_fails_and_keeps(finished, tmp_path, capsys, [])
    assert "No space left on device" in err


def test_ctrl_c_while_writing_is_one_line_130_and_leaves_no_partial_file(finished, tmp_path, capsys, monkeypatch):
    """Interrupted while the figure is written: the JSON and Markdown already rendered under their
    temporary names are removed, the previous plan stays."""
    from otbound.report import plots

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "save", interrupted)
    err = _rerun_fails_and_keeps(finished, tmp_path, capsys, [], code=130)
    assert "interrupted" in err


def test_ctrl_c_before_anything_is_written(tmp_path, capsys, monkeypatch):
    from otbound import plan as pl

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pl, "make_plan", interrupted)
    out = tmp_path / "fresh"
    code, err = _cli([*SMALL, "--out", str(out)], capsys)
    assert code == 130 and len(err.splitlines()) == 1
    assert not out.exists()  # the folder this run created is removed again


@pytest.mark.parametrize("argv, match", [
    (["--seed", "-1"], "--seed must be ≥ 0"),
    (["--mc-samples", "0"], "--mc-samples must be ≥ 1"),
    (["--budgets", "1000000000"], "1000000000"),
    (["--cost", "c.json", "--draft-cost", "1:1", "--target-cost", "1:1"], "not both"),
])
def test_bad_flags_are_one_line_and_write_nothing(tmp_path, capsys, argv, match):
    out = tmp_path / "plan"
    t0 = time.perf_counter()
    code, err = _cli([*SMALL, "--out", str(out), *argv], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and match in err, err
    assert time.perf_counter() - t0 < 10  # refused up front (a budget of 10⁹ would allocate ~96 GB)
    assert not out.exists()


def test_out_naming_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "plan.md"
    target.write_text("mine")
    code, err = _cli([*SMALL, "--out", str(target)], capsys)
    assert code == 2 and "is a file" in err and len(err.splitlines()) == 1
    assert target.read_text() == "mine"


def test_second_run_on_a_held_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "plan"
    with output_lock(out):
        code, err = _cli([*SMALL, "--out", str(out)], capsys)
    assert code == 2 and "in use by another otbound run" in err and len(err.splitlines()) == 1
    assert list(out.iterdir()) == []


# --- stored cost models ------------------------------------------------------------------------

def _cost_body():
    cm = CostModel(CostCurve([1, 4, 16], [0.002, 0.0025, 0.004], "measured (toy draft)"),
                   CostCurve([1, 4, 16], [0.02, 0.021, 0.03], "measured (toy target)"), machine={"device": "cpu"})
    return cm.as_dict()


def _store(path, body, checksum=True):
    plain = json.loads(json.dumps(body))
    path.write_text(json.dumps(dict(plain, sha256=ob.content_key(plain)) if checksum else plain))
    return path


def test_stored_cost_model_reads_back_and_edits_are_refused(tmp_path):
    body = _cost_body()
    draft, target, machine = load_cost(_store(tmp_path / "cost.json", body))
    assert draft.seconds == [0.002, 0.0025, 0.004] and target(16) == 0.03 and machine == {"device": "cpu"}
    edited = json.loads((tmp_path / "cost.json").read_text())
    edited["target"]["seconds"][0] = 0.04  # plain decoding made slower: every speed-up larger
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        load_cost(tmp_path / "edited.json")
    # the checksum recomputed by the editor: the stored fit no longer matches the seconds
    edited.pop("sha256")
    with pytest.raises(CorruptFileError, match="fitted field"):
        load_cost(_store(tmp_path / "resealed.json", edited))
    with pytest.raises(CorruptFileError, match="no sha256"):
        load_cost(_store(tmp_path / "bare.json", body, checksum=False))
    (tmp_path / "junk.json").write_text("{")
    with pytest.raises(ob.InvalidInputError, match="not a readable cost.json"):
        load_cost(tmp_path / "junk.json")


def test_edited_cost_json_on_the_command_line_is_one_line(tmp_path, capsys):
    body = _cost_body()
    body["target"]["seconds"][0] = 0.04
    path = _store(tmp_path / "cost.json", body)
    text = json.loads(path.read_text())
    text["target"]["seconds"][0] = 0.05
    path.write_text(json.dumps(text))
    run = tmp_path / "run"
    run.mkdir()
    code, err = _cli([str(run), "--cost", str(path), "--out", str(tmp_path / "plan")], capsys)
    assert code == 2 and "checksum mismatch" in err and len(err.splitlines()) == 1


# --- speed-ups where verification costs something -----------------------------------------------

def test_speedups_recomputed_by_hand_with_verification_costs():
    """predicted speed-up = (1 + Σ_ℓ P(τ ≥ ℓ)) · c_p(1) / (Σ_d c_q(n_{d−1}) + c_p(N + 1) + Σ_d P(τ ≥ d − 1) c_V(b_d)),
    the bound's speed-up the same with α*'s levels and the verifier's own verification costs."""
    table = synthetic_table(num_traces=3, positions=6, max_drafts=2, verifiers=("rrs",), laws=("with_replacement",))
    c_q = {1: 0.003, 2: 0.004}  # constant-by-segment curves evaluated at the points given
    c_p = {1: 0.02, 4: 0.026, 5: 0.028}
    c_v = {1: 0.002, 2: 0.005}
    cost = CostModel(CostCurve(list(c_q), list(c_q.values())), CostCurve(list(c_p), list(c_p.values())),
                     verify={"rrs": c_v})
    for shape, widths in ((tree_shape([2, 1]), (1, 2)), (chain_shape(1, 3), (1, 1, 1))):
        b = shape["branching"]
        cand = evaluate(table, cost, "with_replacement", "rrs", shape)
        for levels, speed in ((window_levels(table, "rrs", "with_replacement", b)[0], cand.predicted_speedup),
                              (window_levels(table, None, "with_replacement", b)[0], cand.bound_speedup)):
            lv = levels.mean(axis=0)
            reach = [1.0, *lv[:-1]]
            secs = (sum(c_q[w] for w in widths) + c_p[shape["nodes"] + 1]
                    + sum(r * c_v[bd] for r, bd in zip(reach, b, strict=True)))
            assert speed == pytest.approx((1 + lv.sum()) * c_p[1] / secs, rel=1e-12)
        lo, hi = cand.mean_acceptance_length_interval
        assert cand.predicted_speedup_interval == pytest.approx(
            [cand.predicted_speedup * lo / cand.mean_acceptance_length,
             cand.predicted_speedup * hi / cand.mean_acceptance_length], rel=1e-12)
        assert cand.predicted_speedup <= cand.bound_speedup + 1e-12


# --- the machine's load while measuring ---------------------------------------------------------

def test_timing_stability_by_hand():
    times = [[0.010, 0.011, 0.012], [0.020, 0.020, 0.021]]
    t = timing_stability(times, 0.3, 0.5, 8)
    assert t["relative_spread"] == pytest.approx([0.002 / 0.011, 0.001 / 0.020], abs=1e-6)
    assert t["unstable"] is None and (t["load_before"], t["load_after"], t["cpus"]) == (0.3, 0.5, 8)
    wide = timing_stability([[1.0, 1.0 + 2 * UNSTABLE_SPREAD, 1.0]], 0.1, 0.1, 8)
    assert "spread" in wide["unstable"]
    assert timing_stability([[1.0, 1.0]], 0.1, 0.1, 8)["unstable"] is None
    assert "load average reached 8.50 on 8 CPUs" in timing_stability([[1.0, 1.0]], 0.1, 8.5, 8)["unstable"]


def test_forward_costs_record_the_load_and_warn_when_loaded(monkeypatch):
    import os

    from otbound.lm import tiny_pair
    from otbound.plan import UnstableTimingWarning, measure_forward_costs

    pair = tiny_pair(12, seed=0)
    loads = iter([(3.0, 0, 0), (500.0, 0, 0)])
    monkeypatch.setattr(os, "getloadavg", lambda: next(loads))
    with pytest.warns(UnstableTimingWarning, match="load average reached 500.00"):
        curve = measure_forward_costs(pair.target, vocab_size=12, device="cpu", sizes=(1, 4), context=8, repeats=3)
    t = curve.timing
    assert (t["load_before"], t["load_after"], t["cpus"]) == (3.0, 500.0, os.cpu_count())
    assert len(t["relative_spread"]) == 2 and all(s >= 0 for s in t["relative_spread"])
    assert curve.as_dict()["timing"] == t  # stored with the cost model
    assert np.isfinite(curve.seconds).all()


def test_unstable_timings_are_stated_in_plan_md():
    from otbound.plan import make_plan, plan_markdown

    table = synthetic_table(num_traces=2, positions=4, max_drafts=1, verifiers=("rrs",), laws=("with_replacement",))
    loaded = timing_stability([[0.01, 0.01]], 0.2, 9.0, 4)
    cost = CostModel(CostCurve([1], [0.001]), CostCurve([1, 8], [0.01, 0.02], "measured (toy target)", loaded))
    text = plan_markdown(make_plan(table, cost, max_depth=2, budgets=(2,)))
    assert "**Unstable timings** of the target forward curve: the load average reached 9.00 on 4 CPUs" in text
    assert "of the draft forward curve" not in text
