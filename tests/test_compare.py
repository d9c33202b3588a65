"""The synthetic report end to end: files written, every verifier at or below its law's optimum."""

import json

import numpy as np

from otbound import compare


def test_synthetic_report(tmp_path):
    out = compare.main(
        [
            "--synthetic",
            "--out",
            str(tmp_path),
            "--instances",
            "2",
            "--num-drafts",
            "1",
            "2",
            "--temperature",
            "1.0",
            "--vocab-size",
            "8",
            "--mc-samples",
            "4000",
        ]
    )
    report = json.loads((out / "report.json").read_text())
    rows = report["rows"]
    assert (out / "report.md").read_text().startswith("# otbound")
    assert (out / "token_bounds.png").stat().st_size > 10_000
    keys = {"dataset", "temperature", "num_drafts", "sampling", "verifier", "acceptance", "optimal", "positions"}
    assert all(keys <= set(r) for r in rows)
    verifiers = {r["verifier"] for r in rows}
    assert {"optimal", "rrs", "kseq", "rrs_wor", "spechub", "greedy", "ot", "nss", "khisti_is"} <= verifiers
    for r in rows:
        # exact acceptances never exceed the bound; Monte Carlo ones within 5 standard errors
        slack = 1e-9 if r["method"] == "exact" else 5 * np.sqrt(0.25 / 4000)
        assert r["acceptance"] <= r["optimal"] + slack, r
        if r["num_drafts"] == 1 and r["verifier"] not in ("optimal", "nss", "gls"):
            # K = 1: every verifier with a rejection step reaches 1 − TV (gls, drafter-invariant, has none)
            assert abs(r["acceptance"] - r["optimal"]) < 1e-9
