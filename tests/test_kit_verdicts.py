"""The kit gives a verdict only after a completed, valid check: a verifier calling ``sys.exit``,
randomness the router cannot route (named in the error, every time), an invalid coin or law under
``--as-sampler``, a swallowed time limit or Ctrl-C never end in "lossless" or "NOT lossless".
And the intervals the kit, the report and the planner print, recomputed from their definitions."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

import otbound.conformance as oc
from otbound.conformance.__main__ import main

USER = textwrap.dedent('''
    import random
    import sys
    import time

    import numpy as np
    import torch

    import otbound.conformance as oc

    G = np.random.default_rng(0)          # made before any routed block


    def _residual(p, q, x, coin, draw):
        if coin(min(1.0, p[x] / q[x])):
            return x
        r = np.maximum(p - q, 0.0)
        return draw(r / r.sum())


    def exits(p, q, drafts, coin, draw):
        sys.exit(0)


    def routed_multinomial(p, q, drafts, coin, draw):
        with oc.route_randomness(coin, draw):
            return int(np.argmax(np.random.multinomial(1, p)))


    def routed_choices(p, q, drafts, coin, draw):
        with oc.route_randomness(coin, draw):
            return random.choices(range(len(p)), weights=p)[0]


    def generator_before(p, q, drafts, coin, draw):
        with oc.route_randomness(coin, draw):
            return int(G.choice(len(p), p=p))


    def local_generator_before(p, q, drafts, coin, draw):
        g = np.random.default_rng(1)
        with oc.route_randomness(coin, draw):
            return int(g.choice(len(p), p=p))


    def swallows_routing_error(p, q, drafts, coin, draw):
        with oc.route_randomness(coin, draw):
            try:
                return int(np.argmax(np.random.multinomial(1, p)))
            except Exception:
                return int(drafts[0])


    def random_sample_sampler(p, q, drafts, coin, draw):
        """Sampling p itself by inverse CDF on np.random.random_sample: lossless (routed)."""
        with oc.route_randomness(coin, draw):
            u = np.random.random_sample()
            c = np.cumsum(p)
            for i in range(len(p) - 1):
                if u < c[i]:
                    return i
            return len(p) - 1


    def nan_coin(p, q, drafts, coin, draw):
        if coin(float("nan")):
            return int(drafts[0])
        return draw(p)


    def double_draw(p, q, drafts, coin, draw):
        return draw(2 * p)


    def swallows_time_limit(p, q, drafts, coin, draw):
        while True:
            try:
                time.sleep(0.05)
            except BaseException:
                pass
''')


@pytest.fixture
def user(tmp_path):
    path = tmp_path / "user_verifiers.py"
    path.write_text(USER)
    return path


def _exit_2(argv, capsys):
    code = main(argv)
    err = capsys.readouterr()
    lines = err.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err.err, (code, err.err)
    return lines[0]


def _argv(user, fn, tmp_path, *extra):
    return [f"{user}:{fn}", "--level", "token", "--num-drafts", "1", "--instances", "2",
            "--out", str(tmp_path / "rep"), *extra]


def test_sys_exit_in_the_verifier_is_no_verdict(user, tmp_path, capsys):
    line = _exit_2(_argv(user, "exits", tmp_path), capsys)
    assert "raised SystemExit: 0" in line
    assert not (tmp_path / "rep" / "report.json").exists()


@pytest.mark.parametrize("fn, named", [
    ("routed_multinomial", "np.random.multinomial was called under route_randomness"),
    ("routed_choices", "random.choices was called under route_randomness"),
    ("generator_before", "numpy Generator (PCG64) (global 'G' of"),
    ("local_generator_before", "numpy Generator (PCG64) (variable 'g' of local_generator_before()"),
    ("swallows_routing_error", "np.random.multinomial was called under route_randomness: it cannot be routed "
                               "to coin / draw (the verifier caught this error"),
])
def test_unrouted_randomness_is_an_error_naming_the_call(user, tmp_path, capsys, fn, named):
    """Every time (three seeds), an error naming the call — never a verdict, never "not deterministic"."""
    for seed in ("0", "1", "2"):
        line = _exit_2(_argv(user, fn, tmp_path, "--seed", seed), capsys)
        assert named in line and "deterministic" not in line, line


def test_routed_random_sample_gives_the_right_verdict(user, tmp_path, capsys):
    """np.random.random_sample is a routed uniform: inverse-CDF sampling of p is lossless, exactly."""
    assert main(_argv(user, "random_sample_sampler", tmp_path)) == 0
    body = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert body["passed"] is True and body["lossless_error"] < 1e-12


@pytest.mark.parametrize("fn, match", [("nan_coin", "coin() got probability nan, outside [0, 1]"),
                                       ("double_draw", "draw() got a law summing to 2")])
def test_as_sampler_refuses_what_exact_mode_refuses(user, tmp_path, capsys, fn, match):
    exact = _exit_2(_argv(user, fn, tmp_path), capsys)
    sampled = _exit_2(_argv(user, fn, tmp_path, "--mode", "sample", "--as-sampler", "--samples", "50"), capsys)
    assert match in exact and match in sampled, (exact, sampled)


def test_a_verifier_swallowing_the_time_limit_is_stopped(user, tmp_path):
    """Run in its own process: the kit ends it (one line, exit 2) soon after the limit."""
    cmd = [sys.executable, "-m", "otbound.conformance", f"{user}:swallows_time_limit", "--level", "token",
           "--num-drafts", "1", "--instances", "1", "--time-limit", "1", "--out", str(tmp_path / "rep")]
    env = {"PYTHONPATH": str(Path(oc.__file__).parents[2]), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "did not finish within --time-limit 1 s" in lines[0] and "stopped" in lines[0]
    assert not (tmp_path / "rep" / "report.json").exists()


def test_ctrl_c_is_one_line_130_and_no_report(user, tmp_path, capsys, monkeypatch):
    import otbound.cli.conformance as cli

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "check_token_verifier", interrupted)
    code = main(_argv(user, "random_sample_sampler", tmp_path))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 130 and len(err) == 1 and "interrupted" in err[0]
    assert not (tmp_path / "rep" / "report.json").exists()


# --- a routed choice without replacement -------------------------------------------------------

@pytest.mark.parametrize("where", ["generator", "np.random"])
def test_routed_choice_without_replacement_is_the_successive_sampling_law(where):
    """``choice(3, size=2, replace=False, p)``: P(i, j) = p_i · p_j / (1 − p_i), exactly."""
    p = np.array([0.5, 0.3, 0.2])

    def pick(coin, draw):
        with oc.route_randomness(coin, draw) as rng:
            fn = rng.choice if where == "generator" else np.random.choice
            return tuple(int(x) for x in fn(3, size=2, replace=False, p=p))

    law = {}
    for prob, pair in oc.enumerate_outcomes(pick):
        law[pair] = law.get(pair, 0.0) + prob
    want = {(i, j): p[i] * p[j] / (1 - p[i]) for i in range(3) for j in range(3) if i != j}
    assert set(law) == set(want)
    for k, v in want.items():
        assert law[k] == pytest.approx(v, abs=1e-15), k


# --- intervals recomputed from their definitions -------------------------------------------------

def _cluster_half(x, groups, confidence=0.95):
    """t_{(1+c)/2, C−1} · sqrt(C/(C−1) · Σ_c (Σ_{t∈c} (x_t − x̄))² / N²), written out."""
    x = np.asarray(x, dtype=np.float64)
    groups = np.asarray(groups)
    labels = sorted(set(groups.tolist()))
    c, n, mean = len(labels), x.size, x.mean()
    sums = [float(np.sum(x[groups == g] - mean)) for g in labels]
    se = np.sqrt(c / (c - 1) * sum(s * s for s in sums) / n**2)
    return scipy.stats.t.ppf((1 + confidence) / 2, c - 1) * se


def test_engine_metrics_interval_from_its_definition():
    from otbound.report import engine_metrics

    tau = np.array([0, 3, 1, 3, 2, 2, 0, 1, 3])
    clusters = np.array([0, 0, 1, 1, 1, 2, 2, 3, 3])
    m = engine_metrics(tau, 3, 3, clusters=clusters)
    assert m["mean_acceptance_length_ci"] == pytest.approx(_cluster_half(tau, clusters), rel=1e-12)
    m = engine_metrics(tau, 3, 3)  # every call its own cluster: the t interval
    assert m["mean_acceptance_length_ci"] == pytest.approx(
        scipy.stats.t.ppf(0.975, tau.size - 1) * tau.std(ddof=1) / np.sqrt(tau.size), rel=1e-12)


def test_planner_candidate_interval_from_its_definition():
    from otbound.plan import CostCurve, CostModel, evaluate, synthetic_table, tree_shape, window_levels

    table = synthetic_table(num_traces=4, positions=7, max_drafts=2, verifiers=("rrs",), laws=("with_replacement",))
    cost = CostModel(CostCurve([1], [0.001]), CostCurve([1, 100], [0.01, 0.02]))
    shape = tree_shape([2, 1])
    c = evaluate(table, cost, "with_replacement", "rrs", shape)
    levels, clusters = window_levels(table, "rrs", "with_replacement", shape["branching"])
    x = 1.0 + levels.sum(axis=1)
    half = _cluster_half(x, clusters)
    assert c.mean_acceptance_length == pytest.approx(x.mean(), rel=1e-12)
    assert c.mean_acceptance_length_ci == pytest.approx(half, rel=1e-12)
    assert c.mean_acceptance_length_interval == pytest.approx([x.mean() - half, x.mean() + half], rel=1e-12)


def test_report_rows_intervals_from_their_definition():
    """aggregate(): acceptance ± its cluster-robust half-width over the prompts, gap likewise."""
    from otbound.report import aggregate

    rng = np.random.default_rng(4)
    results, accs, opts, groups = [], [], [], []
    for i in range(5):
        n = int(rng.integers(2, 7))
        opt = rng.uniform(0.5, 0.9, n)
        acc = opt * rng.uniform(0.8, 1.0, n)
        results.append({"dataset": "d", "temperature": 1.0, "prompt_id": str(i), "positions": n, "model_dtype": None,
                        "optimal": {"with_replacement": {2: opt.tolist()}},
                        "verifiers": {"v": {2: {"sampling": "with_replacement", "acceptance": acc.tolist(),
                                                "method": "exact", "mc_samples": None}}}, "skipped": {}})
        accs.append(acc)
        opts.append(opt)
        groups.append(np.full(n, i))
    acc, opt, g = np.concatenate(accs), np.concatenate(opts), np.concatenate(groups)
    row = next(r for r in aggregate(results) if r["verifier"] == "v")
    assert row["acceptance_ci"] == pytest.approx(_cluster_half(acc, g), rel=1e-12)
    assert row["optimal_ci"] == pytest.approx(_cluster_half(opt, g), rel=1e-12)
    assert row["gap_ci"] == pytest.approx(_cluster_half(acc - opt, g), rel=1e-12)


def test_kit_sample_mode_summary_interval_from_its_definition():
    """Summary line: mean efficiency ± 1.96 · sqrt(Σ_i (se_i / α*_i)²) / n over the instances."""
    from otbound import VERIFIERS

    res = oc.check_token_verifier(oc.token_sample_adapter(VERIFIERS["rrs"]), vocab_size=3, num_drafts=2,
                                  instances=3, mode="sample", batch=True, samples=400)
    kept = [r for r in res.instances if r.efficiency is not None]
    for r in kept:  # per instance: α̂ ± 1.96 sqrt(α̂(1 − α̂)/n), over α*
        assert r.acceptance_se == pytest.approx(np.sqrt(r.acceptance * (1 - r.acceptance) / 400), rel=1e-12)
    half = 1.959963984540054 * np.sqrt(sum((r.acceptance_se / r.optimal) ** 2 for r in kept)) / len(kept)
    line = res.efficiency_lines()[0]
    assert f"mean ± {half:.4f} at 95%" in line, line


def test_as_sampler_raises_a_routing_error_the_verifier_caught():
    """Python API, sample mode: the sampled coin/draw verifier swallowed the router's error."""

    def swallows(p, q, drafts, coin, draw):
        with oc.route_randomness(coin, draw):
            try:
                return int(np.argmax(np.random.multinomial(1, p)))
            except Exception:  # noqa: BLE001 — the defect under test
                return int(drafts[0])

    with pytest.raises(oc.ConformanceError, match="np.random.multinomial.*caught this error"):
        oc.check_token_verifier(oc.as_sampler(swallows), vocab_size=3, num_drafts=1, instances=1, mode="sample",
                                samples=20)
