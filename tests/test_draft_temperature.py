"""The draft temperature as a knob: the α* curve in τ, its ends, and the best τ per position and per
run against a dense grid and closed forms."""

import numpy as np
import pytest

from otbound import (
    InvalidInputError,
    best_draft_temperature,
    draft_temperature_curve,
    optimal_acceptance,
)


def _rows(seed, b, v, scale=3.0):
    r = np.random.default_rng(seed)
    zp = r.standard_normal((b, v)) * scale
    zq = zp + r.standard_normal((b, v)) * scale / 2
    p = np.exp(zp - zp.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True), zq


def test_worked_example_neither_dominates():
    """q = (.4, .3, .3), p = (.9, .05, .05): deterministic 0.90 against sampled 0.50 at τ = 1; a cold
    τ makes q_τ = p (α* = 1), and with the laws swapped a hot one does."""
    p, q = np.array([0.9, 0.05, 0.05]), np.array([0.4, 0.3, 0.3])
    curve = draft_temperature_curve(p, np.log(q), 1, [0.0, 1.0])
    np.testing.assert_allclose(curve, [0.9, 0.5], atol=1e-15)
    # the knob beats both: q_τ ∝ q^{1/τ} equals p when (4/3)^{1/τ} = 18
    best = best_draft_temperature(p, np.log(q), 1)
    assert best.deterministic == pytest.approx(0.9, abs=1e-15)
    assert best.temperature == pytest.approx(np.log(4 / 3) / np.log(18), rel=1e-3)
    assert best.acceptance == pytest.approx(1.0, abs=1e-6)
    swapped = best_draft_temperature(q, np.log(p), 1)
    assert swapped.deterministic == pytest.approx(0.4, abs=1e-15)
    # q_τ ∝ p^{1/τ} equals (.4, .3, .3) when 18^{1/τ} = 4/3
    assert swapped.temperature == pytest.approx(np.log(18) / np.log(4 / 3), rel=1e-3)
    assert swapped.acceptance == pytest.approx(1.0, abs=1e-6)


def test_curve_single_draft_is_one_minus_tv():
    """K = 1 with replacement: α*(τ) = Σ min(p, softmax(z/τ)) computed here directly."""
    p, z = _rows(1, 4, 30)
    taus = [0.3, 1.0, 2.5]
    curve = draft_temperature_curve(p, z, 1, taus)
    for j, tau in enumerate(taus):
        e = np.exp((z - z.max(1, keepdims=True)) / tau)
        q = e / e.sum(1, keepdims=True)
        np.testing.assert_allclose(curve[:, j], np.minimum(p, q).sum(1), atol=1e-12)


@pytest.mark.parametrize("sampling", ["with_replacement", "without_replacement"])
def test_ends(sampling):
    """τ = 0: p(top-K(z)); τ = ∞: α* of the uniform law over the finite logits; a very cold τ
    approaches the τ = 0 end at K = 1 (and without replacement at every K)."""
    p, z = _rows(2, 3, 12)
    z[:, 0] = -np.inf
    k = 3
    ends = draft_temperature_curve(p, z, k, [0.0, np.inf], sampling)
    top = np.argsort(-z, axis=1)[:, :k]
    np.testing.assert_allclose(ends[:, 0], np.take_along_axis(p, top, 1).sum(1), atol=1e-15)
    uni = np.where(np.isfinite(z), 1.0, 0.0)
    np.testing.assert_allclose(ends[:, 1], optimal_acceptance(p, uni / uni.sum(1, keepdims=True), k, sampling),
                               atol=1e-15)
    cold = draft_temperature_curve(p, z, 1 if sampling == "with_replacement" else k, [1e-4, 0.0], sampling)
    np.testing.assert_allclose(cold[:, 0], cold[:, 1], atol=1e-9)


@pytest.mark.parametrize("k, sampling", [(1, "with_replacement"), (2, "with_replacement"), (4, "with_replacement"),
                                         (2, "without_replacement")])
def test_best_against_a_dense_grid(k, sampling):
    """Per position and per run, the returned τ's value is the curve at that τ, at least the best of
    a 2001-point grid over the same bounds (to 1e-9) and of both ends."""
    p, z = _rows(10 + k, 6, 40)
    res = best_draft_temperature(p, z, k, sampling, bounds=(0.05, 20.0))
    dense_taus = np.geomspace(0.05, 20.0, 2001)
    dense = draft_temperature_curve(p, z, k, dense_taus, sampling)
    ends = draft_temperature_curve(p, z, k, [0.0, np.inf], sampling)
    again = np.array([draft_temperature_curve(p[r], z[r], k, [res.temperature[r]], sampling)[0] for r in range(6)])
    np.testing.assert_allclose(res.acceptance, again, atol=1e-15)
    assert np.all(res.acceptance >= dense.max(1) - 1e-9)
    assert np.all(res.acceptance >= ends.max(1) - 1e-15)
    run_dense = max(dense.mean(0).max(), ends.mean(0).max())
    assert res.run_acceptance >= run_dense - 1e-9
    run_again = draft_temperature_curve(p, z, k, [res.run_temperature], sampling).mean()
    assert res.run_acceptance == pytest.approx(run_again, abs=1e-15)
    assert res.run_acceptance <= res.acceptance.mean() + 1e-15  # one τ for all positions can do no better


def test_more_drafts_flatten_the_curve():
    """α* grows with K at every τ (a K-draft law holds a (K−1)-draft law)."""
    p, z = _rows(3, 2, 20)
    taus = [0.0, 0.5, 1.0, 4.0, np.inf]
    c = [draft_temperature_curve(p, z, k, taus) for k in (1, 2, 4)]
    assert np.all(c[1][:, 1:] >= c[0][:, 1:] - 1e-12) and np.all(c[2][:, 1:] >= c[1][:, 1:] - 1e-12)


def test_bad_input():
    p, z = np.array([0.5, 0.5]), np.array([0.0, 1.0])
    for kwargs, match in [
        (dict(bounds=(0.0, 1.0)), "0 < lo < hi"),
        (dict(bounds=(2.0, 1.0)), "0 < lo < hi"),
        (dict(grid=2), "at least 3"),
        (dict(xatol=0.0), "xatol"),
    ]:
        with pytest.raises(InvalidInputError, match=match):
            best_draft_temperature(p, z, 1, **kwargs)
    with pytest.raises(InvalidInputError, match="sampled draft law"):
        best_draft_temperature(p, z, 1, "greedy")
    with pytest.raises(InvalidInputError, match="temperatures must be"):
        draft_temperature_curve(p, z, 1, [-1.0])
    with pytest.raises(InvalidInputError, match="same shape"):
        draft_temperature_curve(p, z[:1], 1, [1.0])
    with pytest.raises(InvalidInputError, match="finite logit"):
        draft_temperature_curve(p, np.array([0.0, -np.inf]), 2, [1.0], "without_replacement")
    with pytest.raises(InvalidInputError, match="finite or -inf"):
        draft_temperature_curve(p, np.array([0.0, np.nan]), 1, [1.0])
