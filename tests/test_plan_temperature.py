"""The planner's draft-temperature dimension: the rescaled draft law, one plan per temperature, and
the best chosen over all of them."""

import numpy as np
import pytest

from otbound import InvalidInputError, optimal_acceptance
from otbound.plan import (
    draft_law_at_temperature,
    make_plan,
    measure_table,
    plan_draft_temperatures,
    synthetic_cost_model,
    synthetic_laws,
)


def test_rescaled_law():
    """q^{1/τ} normalised, zeros kept; τ = 1 is the law itself; matches softmax(log q / τ)."""
    r = np.random.default_rng(0)
    q = r.dirichlet(np.ones(7), size=3)
    q[:, 2] = 0.0
    q /= q.sum(1, keepdims=True)
    np.testing.assert_allclose(draft_law_at_temperature(q, 1.0), q, atol=1e-15)
    for tau in (0.3, 2.0):
        with np.errstate(divide="ignore"):
            z = np.log(q) / tau
        e = np.exp(z - z.max(1, keepdims=True))
        np.testing.assert_allclose(draft_law_at_temperature(q, tau), e / e.sum(1, keepdims=True), atol=1e-14)
    assert np.all(draft_law_at_temperature(q, 0.5)[:, 2] == 0.0)
    for bad in (0.0, -1.0, np.inf, np.nan):
        with pytest.raises(InvalidInputError, match="positive and finite"):
            draft_law_at_temperature(q, bad)
    for bad_q in ([np.nan, 1.0], [-0.5, 1.5], [0.0, 0.0]):
        with pytest.raises(InvalidInputError, match="^q "):
            draft_law_at_temperature(np.array(bad_q), 0.7)
    # τ so small that log q / τ overflows float64: the greedy limit, one-hot or uniform over tied maxima
    assert draft_law_at_temperature(np.array([0.3, 0.7, 0.0]), 1e-310).tolist() == [0.0, 1.0, 0.0]
    assert draft_law_at_temperature(np.array([0.4, 0.2, 0.4]), 1e-310).tolist() == [0.5, 0.0, 0.5]


def test_plan_per_temperature_and_best():
    """Each temperature's plan is the plain planner's on the rescaled laws (same best speed-up), its
    table's α* is that of the rescaled law, and the best over temperatures is the maximum."""
    laws = synthetic_laws(num_traces=3, positions=8)
    cost = synthetic_cost_model()
    opts = dict(max_depth=3, budgets=(2, 4))
    taus = (0.5, 1.0, 2.0)
    tp = plan_draft_temperatures(laws, cost, taus, max_drafts=2, verifiers=("rrs",), laws=("with_replacement",),
                                 **opts)
    speedups = [p.best().predicted_speedup for p in tp.plans]
    assert tp.best_temperature == taus[int(np.argmax(speedups))]
    assert tp.best.predicted_speedup == max(speedups)
    scaled = [(p, draft_law_at_temperature(q, 2.0)) for p, q in laws]
    table = measure_table(scaled, max_drafts=2, verifiers=("rrs",), laws=["with_replacement"])
    np.testing.assert_allclose(table.optimal["with_replacement"][2][0],
                               optimal_acceptance(scaled[0][0], scaled[0][1], 2), atol=1e-12)
    plain = make_plan(table, cost, laws=["with_replacement"], **opts)
    assert plain.best().predicted_speedup == pytest.approx(tp.plans[2].best().predicted_speedup, abs=1e-12)
    assert tp.plans[2].source["draft_temperature_scale"] == 2.0
    assert [row["temperature"] for row in tp.summary()] == list(taus)


def test_bad_temperatures():
    laws = synthetic_laws(num_traces=2, positions=4)
    for taus, match in [((), "at least one"), ((1.0, 1.0), "distinct"), ((0.0,), "positive")]:
        with pytest.raises(InvalidInputError, match=match):
            plan_draft_temperatures(laws, synthetic_cost_model(), taus, max_drafts=1)
    with pytest.raises(InvalidInputError, match="only the sampled laws"):
        plan_draft_temperatures(laws, synthetic_cost_model(), (1.0,), max_drafts=1, laws=("deterministic",))


def test_command_line(tmp_path, capsys):
    """``--draft-temperatures``: temperatures.json with each temperature's best and the best over all;
    a bad temperature or no sampled law exits 2 with one line, before any work."""
    import json

    from otbound.plan.__main__ import main

    out = tmp_path / "plan"
    main(["--synthetic", "--max-drafts", "2", "--max-depth", "2", "--budgets", "2", "--laws", "with_replacement",
          "--verifiers", "rrs", "--draft-temperatures", "0.5", "1.0", "--out", str(out), "--quiet"])
    body = json.loads((out / "temperatures.json").read_text())
    rows = body["per_temperature"]
    assert [r["temperature"] for r in rows] == [0.5, 1.0]
    assert body["best"]["predicted_speedup"] == max(r["predicted_speedup"] for r in rows)
    plain = json.loads((out / "plan.json").read_text())
    best_plain = max(c["predicted_speedup"] for c in plain["candidates"])
    assert rows[1]["predicted_speedup"] == pytest.approx(best_plain, abs=1e-12)  # τ = 1: the traces' own law
    for extra in (["--draft-temperatures", "0"], ["--laws", "deterministic", "--draft-temperatures", "1.0"]):
        with pytest.raises(SystemExit) as exc:
            main(["--synthetic", "--out", str(tmp_path / "bad"), "--quiet", *extra])
        assert exc.value.code == 2
    assert not (tmp_path / "bad" / "plan.json").exists()
