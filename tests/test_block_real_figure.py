"""experiments/fig_block_real.py in quick mode (tiny pair): stored results, their numbers and the table."""

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
fig = importlib.import_module("fig_block_real")

#: HiGHS optima at feasibility tolerance 1e-10
LP_ATOL = 1e-8


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("block_real")
    paths = fig.main(["--quick", "--out", str(out), "--formats", "png"])
    return out, paths, json.loads((out / "fig_block_real.json").read_text())


def test_files_and_configuration(quick):
    out, paths, stored = quick
    assert {Path(p).name for p in paths} == {"fig_block_real.png", "fig_block_real.md"}
    assert stored["params"] == fig.QUICK and stored["meta"]["sha256"]
    res = stored["results"]
    assert set(res["tree_files"]) and all(v for v in res["tree_files"].values())  # tensor checksums per file
    assert res["variant_settings"][1][0]["top_p"] == 0.8 and res["variant_settings"][1][1]["top_k"] == 20
    assert res["variant_settings"][3][0] == {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": None,
                                             "repetition_penalty": None}
    assert {(r["temperature"], r["variant"]) for r in res["rows"]} == {
        (1.0, "plain"), (1.0, "top-k 20, top-p 0.8"), (0.7, "plain"), (0.7, "top-k 20, top-p 0.8")}
    cells = 2 * len(fig.QUICK["variants"]) * len(fig.QUICK["block_lens"])  # datasets × variants × L
    assert len([r for r in res["rows"] if r["law"] == "iid"]) == cells * len(fig.QUICK["num_drafts"])
    assert 0 < len([r for r in res["rows"] if r["law"] == "greedy"]) <= cells * (len(fig.QUICK["num_drafts"]) - 1)
    assert (out / "fig_block_real.md").read_text().count("\n| quick-") == len(res["rows"])


def test_numbers(quick):
    out, _, stored = quick
    params = stored["params"]
    positions = fig.load_positions(stored, out)
    assert len(positions) == 4
    for pos in positions:
        for var in pos["variants"]:
            for law in fig.LAWS:
                for key, b in var[law].items():
                    if b is None:  # greedy, undefined at this position
                        assert law == "greedy"
                        continue
                    length, k = int(key[1]), int(key[3])
                    assert -LP_ATOL <= b["lower"] <= b["upper"] + LP_ATOL <= length + 2 * LP_ATOL
                    want = fig.bracket_width(k, length, params) if law == "iid" else params["width"]
                    assert b["width"] == want
            for length in params["block_lens"]:
                values = {b: var["static"][str(list(b))] for b in fig.branchings(params["width"], length)}
                for b, v in values.items():
                    assert 0 <= v <= length + 1e-12
                    for c, w in values.items():  # a tree inside another covers less target mass
                        if all(x <= y for x, y in zip(b, c)):
                            assert v <= w + 1e-12
    for row in stored["results"]["rows"]:
        assert row["best_nodes"] <= row["budget"] and fig.nodes(row["chains_branching"]) == row["budget"]
        assert row["static_best"] >= row["static_chains"] - 1e-12
        assert row["lower"] <= row["upper"] + LP_ATOL and 0 < row["positions"] <= row["positions_in_cell"]
        np.testing.assert_allclose(row["best_minus_lower"], row["static_best"] - row["lower"], atol=1e-12)
        assert row["verdict"] == fig.verdict(row)


def test_branchings_and_budget():
    assert fig.branchings(2, 2) == [(2, 2), (2, 1), (1, 1)]
    assert [fig.nodes(b) for b in [(4, 1, 1, 1), (2, 2, 1), (1, 1)]] == [16, 10, 2]
    assert fig.bracket_width(4, 4, fig.FULL) == 2 and fig.bracket_width(2, 4, fig.FULL) == 3
    assert fig.verdict({"best_minus_upper": 0.1, "best_minus_upper_ci": 0.05, "best_minus_lower": 0.2,
                        "best_minus_lower_ci": 0.05}) == "static"
    assert fig.verdict({"best_minus_upper": -0.3, "best_minus_upper_ci": 0.05, "best_minus_lower": -0.2,
                        "best_minus_lower_ci": 0.05, "law": "greedy"}) == "greedy"
    assert fig.verdict({"best_minus_upper": -0.3, "best_minus_upper_ci": 0.05, "best_minus_lower": 0.1,
                        "best_minus_lower_ci": 0.05}) == "open"


def test_time_limit_is_scoped_to_the_call():
    from otbound import _solvers

    before = (dict(_solvers.HIGHS_OPTIONS), dict(_solvers.HIGHS_FALLBACK_OPTIONS))
    assert fig._limited(lambda: _solvers.HIGHS_OPTIONS["time_limit"]) == (fig.LP_TIME_LIMIT_S, None)
    got, why = fig._limited(lambda: (_ for _ in ()).throw(RuntimeError("HiGHS failed")))
    assert got is None and "HiGHS failed" in why
    assert (dict(_solvers.HIGHS_OPTIONS), dict(_solvers.HIGHS_FALLBACK_OPTIONS)) == before
