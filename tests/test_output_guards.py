"""Strict JSON in every file written (no NaN: null with its reason), size guards before allocating,
and the package's error (not a foreign exception) for settings and sample counts."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import otbound as ob
from otbound._io import finite_json, json_text


def _strict(text):
    def refuse(token):
        raise AssertionError(f"non-JSON constant {token}")

    return json.loads(text, parse_constant=refuse)


def test_json_text_is_strict_and_lists_what_it_nulled():
    nulled = []
    text = json_text({"rows": [{"e": float("nan"), "a": np.float64(0.5)}, {"e": -np.inf}]}, nulled=nulled)
    assert _strict(text) == {"rows": [{"e": None, "a": 0.5}, {"e": None}]}
    assert nulled == ["rows[0].e", "rows[1].e"]
    assert finite_json([np.arange(2), (1.0, float("inf"))]) == [[0, 1], [1.0, None]]


def test_report_with_a_zero_optimum_cell_is_strict_json_with_the_reason(tmp_path, capsys):
    """Top-1 target, top-1 draft at T = 0.05: on cells where the two top tokens differ α* = 0, and
    acceptance / α* is 0/0 — written as null with the reason, never NaN."""
    from otbound import compare

    out = tmp_path / "rep"
    compare.main(["--synthetic", "--top-k", "1", "--draft-top-k", "1", "--draft-temperature", "0.05",
                  "--instances", "2", "--mc-samples", "50", "--num-drafts", "2", "--temperature", "1.0",
                  "--out", str(out)])
    capsys.readouterr()
    body = _strict((out / "report.json").read_text())
    zero = [r for r in body["rows"] if r.get("optimal") == 0.0 and r["verifier"] != "optimal"]
    assert zero, "no cell with α* = 0: the test lost its subject"
    for r in zero:
        assert r["efficiency"] is None and "α* = 0" in r["efficiency_undefined"]
    for r in body["rows"]:
        if r.get("optimal"):
            assert r["efficiency"] == pytest.approx(r["acceptance"] / r["optimal"], rel=1e-12)


def test_conformance_report_is_strict_json(tmp_path):
    import otbound.conformance as oc
    from otbound import VERIFIERS

    res = oc.check_token_verifier(oc.token_law_adapter(VERIFIERS["rrs"]), vocab_size=3, num_drafts=2, instances=2)
    res.write(tmp_path)
    assert _strict((tmp_path / "report.json").read_text())["passed"] is True


def test_static_tree_of_twenty_levels_is_refused_before_building():
    from otbound.block import context_free_model, static_tree_bound
    from otbound.block._static_tree import MAX_STATIC_TREE_NODES

    p, q = context_free_model([0.5, 0.3, 0.2]), context_free_model([0.1, 0.6, 0.3])
    t0 = time.perf_counter()
    with pytest.raises(ob.InvalidInputError, match="2097150 nodes"):
        static_tree_bound(p, q, (2,) * 20)
    assert time.perf_counter() - t0 < 1.0
    # the largest tree within the limit is still built: a chain of that many levels is not, one of 17 binary is not
    assert 2 ** 17 - 2 <= MAX_STATIC_TREE_NODES < 2 ** 18 - 2
    assert static_tree_bound(p, q, (2, 1, 1)).value == pytest.approx(0.3 + 0.2 + 0.3 * 0.3 + 0.2 * 0.3 + 0.3 * 0.3 ** 2
                                                                     + 0.2 * 0.3 ** 2, abs=1e-12)


def test_tree_search_budget_is_refused_before_allocating():
    from otbound.plan import best_tree

    t0 = time.perf_counter()
    with pytest.raises(ob.InvalidInputError, match="6000000006 table cells"):
        best_tree({1: 0.5, 2: 0.7}, 10**9, 5)
    assert time.perf_counter() - t0 < 1.0


def test_settings_that_are_not_sampling_params_are_the_packages_error(tmp_path):
    from otbound.lm import load_traces

    with pytest.raises(ob.InvalidInputError, match=r"draft_settings must be an otbound.SamplingParams, got dict "
                                                   r"\(e.g. SamplingParams\(\*\*\{'top_k': 1\}\)\)"):
        next(load_traces(tmp_path, draft_settings={"top_k": 1}))
    with pytest.raises(ob.InvalidInputError, match="target_settings"):
        next(load_traces(tmp_path, target_settings=0.7))


@pytest.mark.parametrize("bad", [0, -3, 1.5])
def test_measure_laws_refuses_a_non_positive_sample_count(bad):
    from otbound.report import measure_laws

    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(4), 2), rng.dirichlet(np.ones(4), 2)
    with pytest.raises(ob.InvalidInputError, match="mc_samples"):
        measure_laws(p, q, (3,), verifiers=["rrs_wor"], mc_samples=bad)
