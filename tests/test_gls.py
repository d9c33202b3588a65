"""Gumbel-max list sampling (``gls``): its exact acceptance and conditional law against independent
computations (numerical integration of the exponential race, Monte Carlo of the algorithm run from
its own clocks), its bound and drafter invariance. The registry-wide tests of tests/test_verifiers.py
(exact marginal = p, statistical losslessness with asserted power, acceptance = enumeration ≤ α*)
run it too."""

import numpy as np
import pytest
import scipy.integrate
import scipy.stats
from conftest import ADVERSARIAL_PAIRS, pooled_g_test

from otbound import VERIFIERS, draft_joint, optimal_acceptance
from otbound.token.verifiers import GumbelListVerifier

GLS = VERIFIERS["gls"]


def _pairs(count, seed, vmax=7):
    r = np.random.default_rng(seed)
    out = []
    for i in range(count):
        v = int(r.integers(2, vmax + 1))
        a = [0.2, 1.0, 3.0][i % 3]
        p, q = r.dirichlet(np.full(v, a)), r.dirichlet(np.full(v, a))
        if i % 4 == 1:
            q[r.integers(v)] = 0.0
        if i % 4 == 2:
            p[r.integers(v)] = 0.0
        out.append((p / p.sum(), q / q.sum()))
    return out


def _race_integral(p, q):
    """P(argmin S/p = argmin S/q) for one list of Exp(1) clocks, by numerical integration over the
    winning clock s: x wins both races iff S_i > s·max(p_i/p_x, q_i/q_x) for every i ≠ x, so its
    term is ∫ e^{−s} Π_i e^{−s max(·)} ds, integrated over [0, 60/rate] (the rest is below e^{−60})."""
    total = 0.0
    for x in np.flatnonzero((p > 0) & (q > 0)):
        rate = 1.0 + np.delete(np.maximum(p / p[x], q / q[x]), x).sum()
        total += scipy.integrate.quad(lambda s, c=rate: np.exp(-s * c), 0, 60.0 / rate, epsabs=1e-15, epsrel=1e-13)[0]
    return total


@pytest.mark.parametrize("case", range(len(ADVERSARIAL_PAIRS) + 12))
def test_single_draft_acceptance_is_the_race_integral(case):
    p, q = ([*ADVERSARIAL_PAIRS.values()] + _pairs(12, 5))[case]
    assert GLS.acceptance(p, q, 1) == pytest.approx(_race_integral(p, q), abs=1e-12)


def test_single_draft_worked_example():
    """p = (.5, .3, .2), q = (.2, .3, .5): Σ_x 1/Σ_i max(p_i/p_x, q_i/q_x) = 1/(1 + 1.5 + 2.5)
    + 1/(5/3 + 1 + 5/3) + 1/(2.5 + 1.5 + 1) = 1/5 + 3/13 + 1/5 by hand."""
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    hand = 1 / 5 + 3 / 13 + 1 / 5
    assert GLS.acceptance(p, q, 1) == pytest.approx(hand, abs=1e-15)


def test_daliri_lower_bound():
    """K = 1: (1 − TV)/(1 + TV) ≤ α ≤ 1 − TV (the lower bound of Daliri et al. 2408.07978; the upper
    one is the coupling bound)."""
    for p, q in [*ADVERSARIAL_PAIRS.values()] + _pairs(40, 6, vmax=12):
        tv = 0.5 * np.abs(p - q).sum()
        acc = GLS.acceptance(p, q, 1)
        assert (1 - tv) / (1 + tv) - 1e-12 <= acc <= 1 - tv + 1e-12


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_acceptance_at_most_alpha_star(k):
    """α ≤ α* with replacement, on random and adversarial laws (V up to 40: the quadrature path)."""
    r = np.random.default_rng(7)
    wide = (r.dirichlet(np.full(40, 0.3)), r.dirichlet(np.full(40, 0.3)))
    cases = [*ADVERSARIAL_PAIRS.values()] + _pairs(10, 8) + [wide]
    for p, q in cases:
        assert GLS.acceptance(p, q, k) <= optimal_acceptance(p, q, k) + 1e-12


def _algorithm_joint(p, q, k, n, seed):
    """Counts of (drafts, Y) from the algorithm run on its own clocks (not the conditional clocks)."""
    drafts, y = GLS.draft_and_verify(p, q, k, n, rng=seed)
    v = p.size
    cell = np.ravel_multi_index(tuple(drafts.T), (v,) * k) * v + y
    return np.bincount(cell, minlength=v ** (k + 1)).astype(float)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_conditional_law_matches_the_algorithm(k):
    """Chi-square of (x̄, Y) counts of the algorithm from its clocks against Q(x̄)·law(Y | x̄):
    the conditional law (closed form at K = 1, quadrature at K ≥ 2) is the algorithm's."""
    r = np.random.default_rng(10 + k)
    p, q = r.dirichlet(np.ones(4)), r.dirichlet(np.ones(4))
    n = 400_000
    joint = draft_joint(q, k, "with_replacement").ravel()
    tuples = np.stack(np.unravel_index(np.arange(joint.size), (4,) * k), axis=1)
    expected = (joint[:, None] * GLS.conditional_law(p, q, tuples)).ravel() * n
    counts = _algorithm_joint(p, q, k, n, 100 + k)
    assert pooled_g_test(counts, expected, tv=None) > 1e-3  # no count where expected is 0: asserted


@pytest.mark.parametrize("k", [2, 3, 5])
def test_acceptance_matches_large_monte_carlo(k):
    """The quadrature acceptance against 10⁶ runs of the algorithm from its clocks: within 5 standard
    errors (≤ 0.0025), at V = 30 where enumeration is out of reach."""
    r = np.random.default_rng(20 + k)
    p, q = r.dirichlet(np.full(30, 0.5)), r.dirichlet(np.full(30, 0.5))
    exact = GLS.acceptance(p, q, k)
    n = 1_000_000
    hits = 0
    for seed in range(4):
        drafts, y = GLS.draft_and_verify(p, q, k, n // 4, rng=1000 * k + seed)
        hits += int((drafts == y[:, None]).any(axis=1).sum())
    se = np.sqrt(exact * (1 - exact) / n)
    assert abs(hits / n - exact) < 5 * se


def test_quadrature_agrees_with_enumeration_at_many_drafts():
    """K = 4 at V = 5: the quadrature acceptance equals the enumerated conditional laws' mass on the
    drafts, and the laws sum to p (both to 1e-12)."""
    r = np.random.default_rng(3)
    p, q = r.dirichlet(np.ones(5)), r.dirichlet(np.ones(5))
    assert GLS.lossless_error(p, q, 4) < 1e-12
    joint = draft_joint(q, 4, "with_replacement").ravel()
    tuples = np.stack(np.unravel_index(np.arange(joint.size), (5,) * 4), axis=1)
    laws = GLS.conditional_law(p, q, tuples)
    mask = np.zeros(laws.shape, dtype=bool)
    mask[np.arange(len(tuples))[:, None], tuples] = True
    assert float(joint @ np.where(mask, laws, 0).sum(1)) == pytest.approx(GLS.acceptance(p, q, 4), abs=1e-12)


def test_limit_in_k_is_target_mass_on_draft_support():
    """As K grows the acceptance tends to p(supp q) (every drafted token appears): at K = 200 on a
    4-token law it is within 1e-3 of it and increasing in K."""
    p, q = np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.5, 0.3, 0.2, 0.0])
    values = [GLS.acceptance(p, q, k) for k in (1, 4, 16, 200)]
    assert np.all(np.diff(values) > 0)
    assert values[-1] == pytest.approx(0.9, abs=1e-3)
    assert values[-1] <= optimal_acceptance(p, q, 200) + 1e-12


def test_drafter_invariance_of_the_algorithm():
    """The same seed gives the same output tokens whatever the draft law; the drafts do change."""
    p = np.array([0.5, 0.2, 0.2, 0.1])
    d1, y1 = GLS.draft_and_verify(p, [0.1, 0.2, 0.3, 0.4], 3, 2000, rng=4)
    d2, y2 = GLS.draft_and_verify(p, [0.7, 0.1, 0.1, 0.1], 3, 2000, rng=4)
    assert np.array_equal(y1, y2) and not np.array_equal(d1, d2)


def test_registered_and_declared():
    v = VERIFIERS["gls"]
    assert isinstance(v, GumbelListVerifier)
    assert v.lossless and v.sampling == "with_replacement" and v.max_drafts is None


@pytest.mark.parametrize("k", [2, 3])
def test_laws_exact_when_the_ratios_span_many_scales(k):
    """Tokens likely under p that q almost never drafts (p/q ~ 2e9): the quadrature's exponentials
    have rates from 1 to ~1e9 and the laws still sum to 1 and to p, to 1e-12."""
    p, q = np.array([1 - 1e-9, 5e-10, 5e-10]), np.array([5e-10, 5e-10, 1 - 1e-9])
    joint = draft_joint(q, k, "with_replacement").ravel()
    tuples = np.stack(np.unravel_index(np.arange(joint.size), (3,) * k), axis=1)
    laws = GLS.conditional_law(p, q, tuples)
    np.testing.assert_allclose(laws.sum(1), 1.0, atol=1e-12)
    np.testing.assert_allclose(joint @ laws, p, atol=1e-12)
    assert laws[0, 0] == pytest.approx(1.0, abs=1e-9)  # drafts all 0: the p-likely token, accepted
