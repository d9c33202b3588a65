"""The synthetic block section of the report: rows, hierarchy, figure."""

import pytest

from otbound.block.verifiers import BLOCK_VERIFIERS
from otbound.report._block import block_section


def test_block_section_rows_and_figure():
    rows, fig = block_section([1, 2], [1, 2], 3, 0, progress=False, max_exact_tuples=50, mc_samples=4000)
    keys = {"kind", "name", "num_drafts", "block_len", "expected_accepted", "method", "stderr"}
    assert all(keys <= set(r) for r in rows)
    assert len(rows) == 4 * (3 + len(BLOCK_VERIFIERS))
    for length in (1, 2):
        for k in (1, 2):
            sel = {r["name"]: r for r in rows if r["block_len"] == length and r["num_drafts"] == k}
            per_level, joint, causal = (sel[n]["expected_accepted"] for n in ("per_level", "joint", "causal"))
            assert causal <= joint + 1e-9 <= per_level + 2e-9 <= length + 3e-9
            for name in BLOCK_VERIFIERS:
                if name in ("spectr_gbv", "hsd"):  # not lossless: may exceed U_causal
                    continue
                r = sel[name]
                assert r["expected_accepted"] <= causal + 1e-9 + 5 * r["stderr"]
            assert sel["causal_optimal"]["expected_accepted"] == pytest.approx(
                causal, abs=1e-8 + 5 * sel["causal_optimal"]["stderr"]
            )
    assert {r["method"] for r in rows if r["kind"] == "verifier"} == {"exact", "monte_carlo"}
    assert len(fig.axes) == 2
