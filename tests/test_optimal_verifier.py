"""The optimal verifier ``ot`` (otbound/token/verifiers/_optimal.py): exact losslessness and α* against
the LP at small V (random and adversarial instances, hypothesis), statistical losslessness at
V = 1,500, the construction's invariants and exact acceptance at V = 151,936.

Tolerances: conditional laws are exact to float64 rounding (checked to 1e-12); acceptance against
the dual and the LP to 1e-9 (the LP's feasibility tolerance is 1e-10).

Statistics (fixed seeds, decision rule fixed in advance): N = 200,000 draft tuples at V = 1,500,
K ∈ {2, 4}. The emitted tokens are binned into B = 16 bins of ≈ equal p-mass along the ratio order
p/q (the order the construction works in) and, separately, along token ids; the conformance kit's
G-test on each binning at level ALPHA/2 = 5e-4 (df = 15). Power: a distortion moving TV mass δ between bins
has non-centrality λ = N Σ d²/p ≥ N (2δ)² = 80 at δ = 1%, detected with probability ≥ 0.999 per
binning (``test_power_of_the_binned_g_test``: 0.9998). The Monte Carlo acceptance must bracket the exact
value in its Wilson interval at level 1 − 1e-3.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ADVERSARIAL_PAIRS, binned_gof_pvalue, lm_like_laws
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otbound import VERIFIERS, draft_joint, optimal_acceptance, optimal_acceptance_lp, sample_drafts
from otbound.conformance import power
from otbound.token.verifiers import _optimal, optimal_coupling, run, support_tuples
from otbound.token.verifiers._base import wilson_interval

ATOL = 1e-12
N = 200_000
ALPHA = 1e-3
BINS = 16
V_STAT = 1_500
ver = VERIFIERS["ot"]


def _check_exact(p, q, k):
    """Exact law lossless, acceptance = α* (dual, LP) and the closed form = enumeration."""
    w, tuples = support_tuples(q, k, "with_replacement")
    laws = ver.conditional_law(p, q, tuples)
    assert laws.min() >= 0.0
    np.testing.assert_allclose(laws.sum(axis=1), 1.0, atol=ATOL)
    np.testing.assert_allclose(w @ laws, p, atol=ATOL)
    mask = np.zeros(laws.shape, dtype=bool)
    mask[np.arange(len(tuples))[:, None], tuples] = True
    enumerated = float(w @ np.where(mask, laws, 0.0).sum(axis=1))
    star = optimal_acceptance(p, q, k)
    assert abs(enumerated - star) < 1e-9
    assert abs(enumerated - optimal_acceptance_lp(p, draft_joint(q, k))) < 1e-9
    assert abs(ver.acceptance(p, q, k) - enumerated) < ATOL


def _law(x):
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum()


LAW = st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1.0), st.floats(1e-12, 1e-6)), min_size=2, max_size=6).filter(
    lambda xs: sum(xs) > 0
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(LAW, LAW, st.integers(1, 3))
def test_exact_lossless_and_optimal_hypothesis(ps, qs, k):
    v = min(len(ps), len(qs))
    if sum(ps[:v]) == 0 or sum(qs[:v]) == 0:
        return
    _check_exact(_law(ps[:v]), _law(qs[:v]), k)




@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_exact_lossless_and_optimal_adversarial(adversarial_pair, k):
    _, p, q = adversarial_pair
    _check_exact(p, q, k)


def test_random_instances_larger_k():
    r = np.random.default_rng(5)
    for i in range(12):
        v = int(r.integers(3, 6))
        a = [0.3, 1.0, 3.0][i % 3]
        _check_exact(r.dirichlet(np.full(v, a)), r.dirichlet(np.full(v, a)), int(r.integers(3, 5)))


def test_needs_a_random_partition():
    """p = (.3, .7), q = (.5, .5), K = 2: α* = 1, the top draft's levels are the whole vocabulary
    with probability 0.2 and a singleton with 0.8 (the level-rule mixture of the docstring)."""
    p, q = ADVERSARIAL_PAIRS["needs_mixture"]
    c = optimal_coupling(p, q, 2)
    assert c.alpha == pytest.approx(1.0, abs=1e-15)
    drafts = np.array([[0, 1]])
    law = ver.conditional_law(p, q, drafts)[0]
    np.testing.assert_allclose(law, [0.1, 0.9], atol=ATOL)  # 0.2·(1/2) + 0.8·[top = 1]
    np.testing.assert_allclose(ver.conditional_law(p, q, np.array([[1, 1], [0, 0]])), [[0, 1], [1, 0]], atol=ATOL)


def test_power_of_the_binned_g_test():
    assert power(N, BINS - 1, 0.01, ALPHA / 2) > 0.999  # the kit's lower bound against any 1% TV distortion


@pytest.mark.parametrize("k", [2, 4])
def test_statistically_lossless_at_v_1500(k):
    p, q = lm_like_laws(V_STAT, 11 + k)
    exact = ver.acceptance(p, q, k)
    assert abs(exact - optimal_acceptance(p, q, k)) < 1e-12
    res = run(ver, p, q, k, N, 1234 + k, confidence=1 - ALPHA)
    assert np.bincount(res.sample.tokens, minlength=V_STAT)[p == 0].sum() == 0
    assert binned_gof_pvalue(res.sample.tokens, p, p / q, bins=BINS) > ALPHA / 2
    assert binned_gof_pvalue(res.sample.tokens, p, np.arange(V_STAT), bins=BINS) > ALPHA / 2
    assert res.ci_low <= exact <= res.ci_high


def test_binned_g_test_rejects_a_one_percent_distortion():
    """The same check rejects a sample with 1% of the mass moved from the low-ratio half to the
    high-ratio half (the shape a wrong thinning or residual would have)."""
    p, q = lm_like_laws(V_STAT, 13)
    res = run(ver, p, q, 2, N, 77)
    rng = np.random.default_rng(78)
    low = (p / q) <= np.median(p / q)
    move = low[res.sample.tokens] & (rng.random(N) < 0.01 / p[low].sum())
    hi = np.flatnonzero(~low)
    tokens = res.sample.tokens.copy()
    tokens[move] = rng.choice(hi, size=int(move.sum()), p=p[hi] / p[hi].sum())
    assert binned_gof_pvalue(tokens, p, p / q, bins=BINS) < ALPHA / 2


@pytest.mark.parametrize("k", [2, 4, 8])
def test_full_vocabulary_acceptance_and_invariants(k):
    """V = 151,936: acceptance = optimal_acceptance (1e-12); selection law m ≥ p on H*, ≤ p off it,
    total 1; H* has the dual's value; the lifts are ≥ 0 and vanish at the segment ends."""
    v = 151_936
    p, q = lm_like_laws(v, 100 + k)
    c = optimal_coupling(p, q, k)
    star = optimal_acceptance(p, q, k, return_certificate=True)
    assert abs(ver.acceptance(p, q, k) - star.value) < 1e-12
    assert abs(c.alpha - star.value) < 1e-12
    in_h = c.rank < c.h
    assert abs(1 + p[in_h].sum() - q[in_h].sum() ** k - star.value) < 1e-12
    assert (c.select[in_h] >= p[in_h]).all() and (c.select[~in_h] <= p[~in_h]).all()
    assert abs(c.select.sum() - 1.0) < 1e-12
    assert c.lift.min() >= 0.0 and (c.lift[c.records] == 0.0).all()
    assert c.residual is not None and abs(c.residual.sum() - 1.0) < 1e-12 and (c.residual[in_h] == 0).all()


def _tree_level(c, top, lam):
    """The level of sorted position ``top`` for the uniform ``lam`` by walking the peeling tree."""
    cum = 0.0
    for a, b, w in c.level_path(top):
        cum += w
        if lam < cum:
            return a, b
    return a, b


def _hull_cases():
    r = np.random.default_rng(21)
    for v, k in [(60, 2), (300, 4), (300, 8), (2_000, 8), (2_000, 3)]:
        p, q = lm_like_laws(v, 1000 + v + k)
        yield f"lm-{v}-{k}", p, q, k
    for name, (p, q) in sorted(ADVERSARIAL_PAIRS.items()):
        for k in (2, 8):
            yield f"{name}-{k}", p, q, k
    for i in range(6):
        v = int(r.integers(5, 60))
        yield f"dirichlet-{i}", r.dirichlet(np.full(v, 0.3)), r.dirichlet(np.full(v, 0.3)), int(r.integers(2, 9))


def test_hull_level_is_the_tree_level():
    """The hull form (module docstring) picks, for every uniform, the very level the peeling tree
    picks: every top position of H* (≤ 60 per instance) × 40 uniforms, LM-like, adversarial and
    Dirichlet instances, K = 2…8 (ties of a uniform with a cumulative tree weight have probability 0)."""
    r = np.random.default_rng(22)
    checked = 0
    for name, p, q, k in _hull_cases():
        c = optimal_coupling(p, q, k)
        tops = np.flatnonzero(np.diff(c.cum_q) > 0)  # positions a draft can occupy
        tops = tops if tops.size <= 60 else r.choice(tops, 60, replace=False)
        for top in tops:
            path = c.level_path(int(top))  # nested levels, each holding top, probabilities summing to 1
            assert abs(sum(w for _, _, w in path) - 1.0) < 1e-12 and all(w > 0 for _, _, w in path), (name, top)
            assert all(a <= top < b for a, b, _ in path), (name, top)
            assert all(a0 <= a1 and b1 <= b0 for (a0, b0, _), (a1, b1, _) in zip(path, path[1:])), (name, top)
            for lam in r.random(40):
                assert c.hull_level(int(top), 1.0 - lam) == _tree_level(c, int(top), lam), (name, top, lam)
                checked += 1
    assert checked > 10_000


@pytest.mark.parametrize("k", [3, 8])
def test_statistically_lossless_through_the_hull(monkeypatch, k):
    """The sampler with every level taken from the hull (never the tree): the same binned G-test
    as at V = 1,500 above (N = 200,000, power ≥ 0.999 against a 1% distortion), and the Monte Carlo
    acceptance brackets α*."""
    _force_hull(monkeypatch)
    p, q = lm_like_laws(V_STAT, 31 + k)
    c = optimal_coupling(p, q, k)
    assert np.diff(c.records).max() > 100  # long segments: the case the hull is for
    exact = ver.acceptance(p, q, k)
    res = run(ver, p, q, k, N, 4321 + k, confidence=1 - ALPHA)
    assert binned_gof_pvalue(res.sample.tokens, p, p / q, bins=BINS) > ALPHA / 2
    assert binned_gof_pvalue(res.sample.tokens, p, np.arange(V_STAT), bins=BINS) > ALPHA / 2
    assert res.ci_low <= exact <= res.ci_high


def test_full_vocabulary_k8_verifies_through_the_hull():
    """V = 151,936, K = 8: the top draft's segment spans most of the vocabulary (the tree path would
    take seconds per token), so each of 2,000 tuples gets its level from the hull; they emit draft
    tokens at rate α* within the Wilson interval (1 − 1e-3)."""
    p, q = lm_like_laws(151_936, 108)
    k = 8
    c = optimal_coupling(p, q, k)
    r = np.random.default_rng(9)
    drafts = sample_drafts(q, k, size=2_000, rng=r)
    segment = np.diff(c.records)[np.searchsorted(c.records, c.rank[drafts].max(axis=1), "right") - 1]
    assert np.median(segment) > 2_000 * _optimal.TREE_TOKENS_PER_TUPLE
    res = ver.sample(p, q, drafts, r)
    lo, hi = wilson_interval(float(res.accepted.mean()), drafts.shape[0], 1 - ALPHA)
    assert lo <= c.alpha <= hi


def _force_hull(monkeypatch):
    monkeypatch.setattr(_optimal, "TREE_MAX", 0)
    monkeypatch.setattr(_optimal, "TREE_TOKENS_PER_TUPLE", 0)


def test_exact_laws_through_the_hull_equal_the_tree(monkeypatch):
    """The conditional laws built from the entry masses (no tree) equal the tree's, to 1e-12, on
    the hull cases (30 drawn tuples each), and stay exactly lossless and optimal on the adversarial
    instances."""
    r = np.random.default_rng(23)
    cases = list(_hull_cases())
    drafts = {name: sample_drafts(q, k, size=30, rng=r) for name, p, q, k in cases}
    tree = {name: ver.conditional_law(p, q, drafts[name]) for name, p, q, k in cases}
    ver._cache.clear()
    _force_hull(monkeypatch)
    for name, p, q, _k in cases:
        np.testing.assert_allclose(ver.conditional_law(p, q, drafts[name]), tree[name], atol=ATOL, err_msg=name)
    for p, q in ADVERSARIAL_PAIRS.values():
        for k in (1, 2, 3):
            _check_exact(p, q, k)
    ver._cache.clear()
