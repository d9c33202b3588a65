"""The synthetic block section of the report: rows, hierarchy, figure."""

import pytest

from otbound.block.verifiers import BLOCK_VERIFIERS
from otbound.report._block import block_markdown, block_section


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
                r = sel[name]
                if r["sampling"] == "with_replacement":
                    assert (r["causal_bound"], r["joint_bound"]) == (causal, joint)
                assert r["lossless"] is BLOCK_VERIFIERS[name].lossless
                if not r["lossless"]:  # spectr_gbv, hsd: may exceed U_causal
                    continue
                if r["causal_bound"] is not None:  # its own law's bound (K i.i.d.: the cell's; univer: exact only)
                    assert r["expected_accepted"] <= r["causal_bound"] + 1e-9 + 5 * r["stderr"]
            # UniVer runs on its own tree (m = K): at K = 1 a chain (block verification), and at K = 2, L = 1
            # (exact) the single-level optimum of its tree law, its own U_causal
            univer = sel["univer"]
            assert univer["sampling"] == "univer_tree"
            if k == 1:
                assert univer["expected_accepted"] == pytest.approx(sel["block"]["expected_accepted"], abs=1e-12)
            if (length, k) == (1, 2):
                assert univer["method"] == "exact"
                assert univer["expected_accepted"] == pytest.approx(univer["causal_bound"], abs=1e-9)
            assert sel["causal_optimal"]["expected_accepted"] == pytest.approx(
                causal, abs=1e-8 + 5 * sel["causal_optimal"]["stderr"]
            )
    assert {r["method"] for r in rows if r["kind"] == "verifier"} == {"exact", "monte_carlo"}
    assert len(fig.axes) == 2


def test_block_section_skips_univer_where_its_tree_cannot_be_drafted():
    """V = 2 and K = 3: UniVer needs 3 drafted tokens per node; the row says so instead of crashing."""
    rows, _ = block_section([3], [1], 2, 0, progress=False, verifiers=["univer", "block"])
    sel = {r["name"]: r for r in rows}
    assert sel["univer"]["method"] == "skipped" and sel["univer"]["expected_accepted"] is None
    assert "at least 3 draft tokens" in sel["univer"]["note"]
    assert sel["block"]["method"] == "exact"
    md = block_markdown(rows)
    assert "skipped: UniVer with branching 3" in md and "K i.i.d. blocks" in md


def test_block_markdown_marks_the_lossy_verifiers():
    """The report's block table has a lossless column: **no** on exactly spectr_gbv and hsd."""
    rows, _ = block_section([1], [2], 2, 0, progress=False, verifiers=["block", "spectr_gbv", "hsd"])
    assert {r["name"]: r["lossless"] for r in rows if r["kind"] == "verifier"} == {
        "block": True, "spectr_gbv": False, "hsd": False}
    md = block_markdown(rows)
    header = next(line for line in md.splitlines() if line.startswith("| name |"))
    col = [c.strip() for c in header.strip("|").split("|")].index("lossless")
    cells = {line.split(" | ")[0].strip("| "): line.split(" | ")[col] for line in md.splitlines()
             if line.startswith("| ") and " verifier " in line}
    assert cells == {"block": "yes", "spectr_gbv": "**no**", "hsd": "**no**"}
