"""Engine-matched metrics (docs/guide/metrics.md) and the planner (``otbound.plan``)."""

import json

import numpy as np
import pytest

import otbound as ob
from otbound.report import engine_metrics, metrics_from_levels


def test_engine_metrics_by_hand():
    """vLLM's counters on 5 calls of a depth-3 chain: accepted 0, 3, 1, 3, 2 of 3 drafted each."""
    tau = [0, 3, 1, 3, 2]
    m = engine_metrics(tau, 3, 3)
    assert m["mean_acceptance_length"] == pytest.approx(1 + 9 / 5)  # 1 + num_accepted / num_drafts
    assert m["acceptance_rate"] == pytest.approx(9 / 15)  # num_accepted / num_draft_tokens
    # num_accepted_tokens_per_pos = [4, 3, 2] over num_drafts = 5
    assert m["per_position_acceptance"] == pytest.approx([4 / 5, 3 / 5, 2 / 5])
    # acceptance lengths 1, 4, 2, 4, 3
    assert m["acceptance_length_histogram"] == pytest.approx([1 / 5, 1 / 5, 1 / 5, 2 / 5])
    assert m["target_calls"] == 5 and m["mean_acceptance_length_ci"] > 0
    # drafted tokens per call vary (tree nodes): the rate is a ratio of sums
    m = engine_metrics([1, 2], [2, 6], 2)
    assert m["acceptance_rate"] == pytest.approx(3 / 8)


def test_metrics_from_levels_is_the_law_of_the_samples():
    rng = np.random.default_rng(0)
    tau = rng.integers(0, 5, size=200)
    m = engine_metrics(tau, 4, 4)
    lv = metrics_from_levels(m["per_position_acceptance"], 4)
    for key in ("mean_acceptance_length", "acceptance_rate", "acceptance_length_histogram"):
        assert lv[key] == pytest.approx(m[key], abs=1e-12)
    assert sum(m["acceptance_length_histogram"]) == pytest.approx(1.0)
    assert m["mean_acceptance_length"] == pytest.approx(1 + tau.mean())


def test_engine_metrics_bad_input():
    with pytest.raises(ob.InvalidInputError, match="0..2"):
        engine_metrics([3], 2, 2)
    with pytest.raises(ob.InvalidInputError, match="at least one"):
        engine_metrics([], 2, 2)
    with pytest.raises(ob.InvalidInputError, match="> 0"):
        engine_metrics([1], 0, 2)
    with pytest.raises(ob.InvalidInputError, match="non-increasing"):
        metrics_from_levels([0.2, 0.5], 2)


def test_block_section_rows_carry_engine_metrics():
    from otbound.report import block_section

    rows, _ = block_section([2], [2], vocab_size=3, seed=0, verifiers=["block", "univer"], progress=False)
    for r in rows:
        if r["method"] == "skipped":
            assert r["mean_acceptance_length"] is None
            continue
        assert r["mean_acceptance_length"] == pytest.approx(1 + r["expected_accepted"])
        nodes = 2 + 4 if r["name"] == "univer" else 4  # its own tree: m + m^2 nodes; else K·L
        assert r["acceptance_rate"] == pytest.approx(r["expected_accepted"] / nodes)
    causal = next(r for r in rows if r["name"] == "causal")
    assert sum(causal["per_position_acceptance"]) == pytest.approx(causal["expected_accepted"])
    assert sum(causal["acceptance_length_histogram"]) == pytest.approx(1.0)


def test_end_to_end_rows_carry_engine_metrics():
    from otbound.lm import tiny_pair, tiny_prompts
    from otbound.report import end_to_end_rows

    pair = tiny_pair(6, seed=0)
    (row,) = end_to_end_rows(pair, tiny_prompts(pair, 2, seed=0), verifiers=["rrs"], num_drafts=(2,), block_lens=(2,),
                             max_new_tokens=6, progress=False, bounds=False)
    assert row.mean_acceptance_length == pytest.approx(1 + row.mean_accepted)
    assert row.mean_acceptance_length_ci == pytest.approx(row.accepted_ci)
    assert len(row.per_position_acceptance) == 2 and len(row.acceptance_length_histogram) == 3
    assert sum(row.acceptance_length_histogram) == pytest.approx(1.0)
    # 2 chains of 2: 2 to 4 tree nodes per call
    assert row.mean_accepted / 4 - 1e-12 <= row.acceptance_rate <= row.mean_accepted / 2 + 1e-12
    json.dumps(row.as_dict())


# --- the planner ------------------------------------------------------------------------------

from otbound.plan import (  # noqa: E402
    CostCurve,
    CostModel,
    best_tree,
    chain_shape,
    evaluate,
    make_plan,
    measure_table,
    synthetic_table,
    tree_nodes_of,
    window_levels,
)

UNIT_COST = CostModel(CostCurve([1], [0.001]), CostCurve([1, 100], [0.01, 0.02]))


@pytest.fixture(scope="module")
def small_table():
    return synthetic_table(num_traces=4, positions=8, max_drafts=2, verifiers=("rrs", "kseq", "spechub", "ot"),
                           laws=("with_replacement", "greedy"))


def _constant_laws(p, q, traces=3, positions=6):
    return [(np.tile(p, (positions, 1)), np.tile(q, (positions, 1))) for _ in range(traces)]


@pytest.mark.parametrize("length", [1, 2, 4])
def test_single_chain_on_context_free_laws_is_one_plus_geometric_sum(length):
    """One draft verified token by token on context-independent laws: 1 + Σ_{l≤L} α^l with
    α = 1 − TV(p, q), exactly (1e-12), for every verifier (all reduce to speculative sampling at
    K = 1) and for the bound."""
    p = np.array([0.5, 0.3, 0.15, 0.05])
    q = np.array([0.25, 0.25, 0.25, 0.25])
    alpha = 1 - 0.5 * np.abs(p - q).sum()
    expected = 1 + sum(alpha**ell for ell in range(1, length + 1))
    table = measure_table(_constant_laws(p, q), max_drafts=1, verifiers=("rrs", "kseq", "ot", "greedy"))
    for name in table.acceptance:
        c = evaluate(table, UNIT_COST, table.sampling[name], name, chain_shape(1, length))
        assert c.mean_acceptance_length == pytest.approx(expected, abs=1e-12), name
        assert c.bound_mean_acceptance_length == pytest.approx(expected, abs=1e-12)
        assert c.per_position_acceptance == pytest.approx([alpha**ell for ell in range(1, length + 1)], abs=1e-12)
        assert c.acceptance_rate == pytest.approx((expected - 1) / length, abs=1e-12)


def test_every_candidate_between_one_and_its_bound(small_table):
    plan = make_plan(small_table, UNIT_COST, max_depth=4, budgets=(1, 3, 6, 10))
    assert plan.candidates and plan.optimum
    for c in plan.candidates:
        assert 1.0 <= c.mean_acceptance_length <= c.bound_mean_acceptance_length + 1e-9, c
        lo, hi = c.mean_acceptance_length_interval
        assert lo <= c.mean_acceptance_length <= hi
        assert c.predicted_speedup <= c.bound_speedup + 1e-9
        assert c.shape["nodes"] == tree_nodes_of(c.shape["branching"])
    # the optimum verifier attains α* with i.i.d. drafts: its candidates equal their bounds
    for c in plan.candidates:
        if c.verifier == "ot":
            assert c.mean_acceptance_length == pytest.approx(c.bound_mean_acceptance_length, abs=1e-9)
    # every budget searched has a tree within it
    for n in (1, 3, 6, 10):
        assert any(n in c.searched and c.shape["nodes"] <= n for c in plan.candidates)


def test_prediction_is_the_product_along_the_trace(small_table):
    """Shape (2, 1) at window t: α_V(p_t, q_t, 2) + α_V(p_t, ...)·α_V(p_{t+1}, q_{t+1}, 1), averaged."""
    levels, clusters = window_levels(small_table, "rrs", "with_replacement", (2, 1))
    a2, a1 = small_table.acceptance["rrs"][2], small_table.acceptance["rrs"][1]
    want = np.concatenate([a2[c][:-1] + a2[c][:-1] * a1[c][1:] for c in range(4)])
    np.testing.assert_allclose(levels.sum(axis=1), want, rtol=0, atol=1e-15)
    assert np.bincount(clusters).tolist() == [7, 7, 7, 7]


def test_tree_search_against_brute_force():
    """The dynamic program's value is the best over every uniform tree within the budget."""
    import itertools

    rng = np.random.default_rng(1)
    for _ in range(20):
        a = dict(zip([1, 2, 3], np.sort(rng.uniform(0.2, 0.95, 3)), strict=True))
        budget, depth = int(rng.integers(1, 15)), int(rng.integers(1, 4))
        best = 0.0
        for length in range(1, depth + 1):
            for b in itertools.product([1, 2, 3], repeat=length):
                if tree_nodes_of(b) <= budget:
                    best = max(best, sum(np.prod([a[x] for x in b[:ell]]) for ell in range(1, length + 1)))
        shape, value = best_tree(a, budget, depth)
        assert value == pytest.approx(best, abs=1e-12)
        assert tree_nodes_of(shape) <= budget
        assert sum(np.prod([a[x] for x in shape[:ell]]) for ell in range(1, len(shape) + 1)) == pytest.approx(value)


def test_cost_model_is_what_it_says():
    cm = CostModel(CostCurve([1, 11], [0.002, 0.004]), CostCurve([1, 11], [0.02, 0.03]), verify={"rrs": {2: 0.001,
                                                                                                         1: 0.0005}})
    # (2, 1): draft forwards on 1 then 2 nodes, target on 1 + 4 tokens, rrs at depth 1 always and depth 2 w.p. 0.5
    secs = cm.iteration_seconds((2, 1), [0.5, 0.3], "rrs")
    assert secs == pytest.approx(0.002 + 0.0022 + 0.024 + 0.001 + 0.5 * 0.0005)
    assert cm.speedup((2, 1), [0.5, 0.3], "rrs") == pytest.approx(1.8 * 0.02 / secs)
    with pytest.raises(ob.InvalidInputError, match="positive"):
        CostCurve([1, 2], [0.01, 0.0])
    with pytest.raises(ob.InvalidInputError, match="positive"):
        CostCurve.parse("1:-0.5")
    with pytest.raises(ob.InvalidInputError, match="n:seconds"):
        CostCurve.parse("fast")


def test_bad_plan_input(small_table):
    with pytest.raises(ob.InvalidInputError, match="at least one node"):
        make_plan(small_table, UNIT_COST, budgets=(0, 4))
    with pytest.raises(ob.InvalidInputError, match="longest trace"):
        make_plan(small_table, UNIT_COST, max_depth=9)
    with pytest.raises(ob.InvalidInputError, match="deeper than the traces"):
        window_levels(small_table, "rrs", "with_replacement", (1,) * 9)
    with pytest.raises(ob.InvalidInputError, match="at least one node"):
        best_tree({1: 0.5}, 0, 3)
    with pytest.raises(ob.InvalidInputError, match="not measured"):
        window_levels(small_table, "spechub", "greedy", (3,))


# --- the command line -------------------------------------------------------------------------

def _write_trace(folder, prompt_id, temperature=1.0, pair="toy", positions=6, logits=True, seed=0, vocab=8):
    from otbound.lm._store import write_atomic

    rng = np.random.default_rng(seed)
    path = folder / "traces" / "toy" / f"T{temperature}" / f"{prompt_id}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {"tokens": np.arange(2 + positions, dtype=np.int32) % vocab}
    if logits:
        tensors.update(target_logits=rng.normal(size=(positions, vocab)).astype(np.float32),
                       draft_logits=rng.normal(size=(positions, vocab)).astype(np.float32))
    meta = {"format": "otbound-trace-1", "prompt_id": prompt_id, "dataset": "toy", "temperature": temperature,
            "prompt_length": 2, "pair": pair, "sources": {}, "model_dtype": "float32", "vocab_size": vocab}
    write_atomic(path, tensors, meta)


def _cli(argv, capsys):
    from otbound.plan.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    return exc.value.code, err


COST = ["--draft-cost", "1:0.001,64:0.002", "--target-cost", "1:0.01,64:0.02"]


def test_cli_plans_a_run_folder(tmp_path):
    from otbound.plan.__main__ import main

    for i in range(3):
        _write_trace(tmp_path / "run", f"p{i}", seed=i)
    out = tmp_path / "plan"
    paths = main([str(tmp_path / "run"), *COST, "--max-drafts", "2", "--max-depth", "3", "--budgets", "2", "4",
                  "--verifiers", "rrs", "greedy", "--out", str(out), "--quiet"])
    body = json.loads(paths["json"].read_text())
    assert body["source"]["traces"] == 3 and body["source"]["positions"] == 18
    keys = {"draft_law", "shape", "verifier", "mean_acceptance_length", "mean_acceptance_length_interval",
            "bound_mean_acceptance_length", "predicted_speedup"}
    assert body["candidates"] and all(keys <= set(c) for c in body["candidates"])
    assert {c["verifier"] for c in body["candidates"]} == {"rrs", "greedy"}
    assert (out / "plan.md").read_text().startswith("# Drafting plan") and (out / "plan.png").exists()
    assert body["cost_model"]["target"]["seconds"] == [0.01, 0.02]
    # a stored cost model (as --device writes it, with its checksum) gives the same plan
    (tmp_path / "cost.json").write_text(json.dumps(dict(body["cost_model"], sha256=ob.content_key(body["cost_model"]))))
    again = main([str(tmp_path / "run"), "--cost", str(tmp_path / "cost.json"), "--max-drafts", "2", "--max-depth", "3",
                  "--budgets", "2", "4", "--verifiers", "rrs", "greedy", "--out", str(tmp_path / "plan2"), "--quiet"])
    body2 = json.loads(again["json"].read_text())
    for k in ("draft", "target"):
        assert body2["cost_model"][k]["sizes"] == body["cost_model"][k]["sizes"]
        assert body2["cost_model"][k]["seconds"] == body["cost_model"][k]["seconds"]
    assert [c["mean_acceptance_length"] for c in body2["candidates"]] == [
        c["mean_acceptance_length"] for c in body["candidates"]]


@pytest.mark.parametrize("case, match", [
    ("empty", "holds no traces"),
    ("mixed", "mixes traces of 2 different pairs"),
    ("temperatures", "mixes temperatures"),
    ("no_logits", "without logits"),
    ("budget", "at least one node"),
    ("deep", "deeper than the traces allow"),
    ("cost", "positive"),
    ("no_cost", "a cost model is needed"),
])
def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, case, match):
    run = tmp_path / "run"
    run.mkdir()
    args = [str(run), *COST, "--max-depth", "2"]
    if case != "empty":
        _write_trace(run, "a", logits=case != "no_logits")
    if case == "mixed":
        _write_trace(run, "b", pair="other")
    if case == "temperatures":
        _write_trace(run, "c", temperature=0.5)
    if case == "budget":
        args += ["--budgets", "0"]
    if case == "deep":
        args += ["--max-depth", "7"]
    if case == "cost":
        args = [str(run), "--draft-cost", "1:0.001", "--target-cost", "1:0,8:0.01"]
    if case == "no_cost":
        args = [str(run)]
    out = tmp_path / "plan"
    code, err = _cli(args + ["--out", str(out), "--quiet"], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and match in err, err
    assert not out.exists()


def test_cli_synthetic_runs(tmp_path):
    from otbound.plan.__main__ import main

    paths = main(["--synthetic", "--max-drafts", "2", "--max-depth", "3", "--verifiers", "rrs", "kseq", "greedy",
                  "--out", str(tmp_path), "--quiet"])
    body = json.loads(paths["json"].read_text())
    assert all(1 <= c["mean_acceptance_length"] <= c["bound_mean_acceptance_length"] + 1e-9
               for c in body["candidates"])
    assert body["sha256"]


@pytest.mark.filterwarnings("ignore::otbound.plan.UnstableTimingWarning")  # a loaded test machine: expected
def test_forward_costs_measured_on_a_model():
    """On the tiny Qwen2 pair: one positive median per size, and the fitted curve through them."""
    from otbound.lm import tiny_pair
    from otbound.plan import machine_description, measure_forward_costs

    pair = tiny_pair(12, seed=0)
    curve = measure_forward_costs(pair.target, vocab_size=12, device="cpu", sizes=(1, 4, 16), context=8, repeats=2)
    assert curve.sizes == [1, 4, 16] and all(s > 0 for s in curve.seconds)
    assert curve(4) == curve.fitted[1] and curve.source == "measured"
    assert np.all(np.diff(curve.fitted) >= 0)  # the fit is non-decreasing ...
    assert sum(curve.fitted) == pytest.approx(sum(curve.seconds))  # ... and pools the medians it levels
    desc = machine_description("cpu")
    assert desc["device"] == "cpu" and desc["cpus"] >= 1 and "torch" in desc


def test_per_row_coupling_verifiers_are_planned_when_named():
    """``ot_wor_top`` (a coupling per position: ~0.24 s per position and K at full vocabulary) is
    not in the default set, and is measured when named."""
    from otbound.plan import DEFAULT_VERIFIERS, synthetic_table

    assert "ot_wor_top" not in DEFAULT_VERIFIERS and "rrs_wor" in DEFAULT_VERIFIERS
    t = synthetic_table(num_traces=1, positions=3, max_drafts=2, verifiers=("ot_wor_top",),
                        laws=("without_replacement",))
    assert sorted(t.acceptance["ot_wor_top"]) == [1, 2]
    opt = t.optimal["without_replacement"]
    for m in (1, 2):  # it reaches the law's optimum when the top tokens hold all of q (V = 16 here)
        assert np.allclose(t.acceptance["ot_wor_top"][m][0], opt[m][0], atol=1e-9)


def test_stored_report_measurements_are_reused(tmp_path, monkeypatch):
    """A report's measurement cache (``<run>/measure``) gives the same table as measuring afresh,
    and only what it lacks (K = 1 here, and the verifier it did not measure) is measured."""
    import otbound.report as rep
    from otbound.lm import Prompt, collect_traces, tiny_pair
    from otbound.plan import load_run_traces, table_from_records
    from otbound.report import measure_trace, stored_measurement

    pair = tiny_pair()
    prompts = [Prompt(f"t/{i}", "tiny", "", (1 + i, 2, 3)) for i in range(2)]
    collect_traces(pair, prompts, tmp_path / "traces", max_new_tokens=6, progress=False)
    records = load_run_traces(tmp_path)
    for r in records:
        assert stored_measurement(r, tmp_path / "measure") is None
        measure_trace(r, (2, 3), verifiers=["rrs", "kseq"], cache_dir=tmp_path / "measure")
    calls = []
    original = rep.measure_laws

    def counting(p, q, ks, **kw):
        calls.append((list(ks), list(kw.get("verifiers") or [])))
        return original(p, q, ks, **kw)

    monkeypatch.setattr(rep, "measure_laws", counting)
    kw = dict(max_drafts=3, verifiers=("rrs", "kseq", "ot"))
    reused = table_from_records(records, cache_dir=tmp_path / "measure", **kw)
    assert sorted(calls) == sorted([([1], ["rrs", "kseq", "ot"]), ([2], ["ot"]), ([3], ["ot"])] * 2)
    fresh = table_from_records(records, **kw)
    assert reused.source["stored_measurements"]["traces"] == 2
    for name in ("rrs", "kseq", "ot"):
        for m in (1, 2, 3):
            for a, b in zip(reused.acceptance[name][m], fresh.acceptance[name][m], strict=True):
                assert np.allclose(a, b, rtol=0, atol=1e-12)
    for law in ob.SAMPLINGS:
        for m in (1, 2, 3):
            for a, b in zip(reused.optimal[law][m], fresh.optimal[law][m], strict=True):
                assert np.allclose(a, b, rtol=0, atol=1e-12)
