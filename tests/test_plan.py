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
