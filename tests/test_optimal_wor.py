"""The verifier ``ot_wor_top`` (otbound/token/verifiers/_optimal_wor.py): the optimum over verifiers
that see drafts without replacement through ``S ∩ T`` (T: the top-m tokens of q), with an exact
residual.

* Small V, T holding all of q: exact conditional laws lossless (1e-12), acceptance = α* against
  the dual and the LP (1e-9), random, hypothesis and adversarial instances.
* Small V, truncated (T a strict subset): the lumped law μ(R) and the chance term c(R) against
  enumeration of the draft law (1e-12), exact laws lossless, acceptance = enumeration (1e-12) ≤ α*.
* V = 3,000: the moment path for small tokens against the token-by-token pass (1e-12); Q(T^c)
  against the reference clock integral :func:`otbound.token._wor.wor_prefix_mass` (1e-12).
* V = 1,500 statistics (fixed seeds, decision rule fixed in advance): N = 200,000 tuples, K ∈ {2, 4},
  the emitted tokens binned into 16 bins of ≈ equal p-mass along p/q and along token ids, a
  G-test (the conformance kit's) on each at level 5e-4 (df = 15): a 1% TV distortion has
  non-centrality λ ≥ N (2·0.01)² = 80, detected with probability ≥ 0.999 per binning
  (``test_power_of_the_binned_g_test``); the Monte Carlo acceptance must lie in its Wilson
  interval at level 1 − 1e-3 around the exact value.
* V = 151,936: the exact acceptance inside the Wilson interval of 20,000 verified tuples and at
  most α*.
* The selection-law structure the theory page relies on (the running-maximum law lies in the core
  of Q) and the counterexamples to the product-form samplers it reports.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import ADVERSARIAL_PAIRS, binned_gof_pvalue, lm_like_laws
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otbound import VERIFIERS, draft_joint, optimal_acceptance, optimal_acceptance_lp
from otbound._validation import InvalidInputError
from otbound.conformance import g_test, power
from otbound.token._wor import wor_prefix_mass
from otbound.token.logits import laws_from_logits
from otbound.token.verifiers import (
    OptimalWithoutReplacementVerifier,
    _optimal_wor,
    run,
    support_tuples,
    truncated_coupling,
)

ATOL = 1e-12
N = 200_000
ALPHA = 1e-3
BINS = 16
V_STAT = 1_500
WOR = "without_replacement"
ver = VERIFIERS["ot_wor_top"]


def _law(x):
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum()


def _enumerate(verifier, p, q, k):
    """(weights, tuples, exact laws, acceptance by enumeration)."""
    w, tuples = support_tuples(q, k, WOR)
    laws = verifier.conditional_law(p, q, tuples)
    mask = np.zeros(laws.shape, dtype=bool)
    mask[np.arange(len(tuples))[:, None], tuples] = True
    return w, tuples, laws, float(w @ np.where(mask, laws, 0.0).sum(axis=1))


def _check_optimal(p, q, k):
    w, tuples, laws, enumerated = _enumerate(ver, p, q, k)
    assert laws.min() >= 0.0
    np.testing.assert_allclose(laws.sum(axis=1), 1.0, atol=ATOL)
    np.testing.assert_allclose(w @ laws, p, atol=ATOL)
    assert abs(ver.acceptance(p, q, k) - enumerated) < ATOL
    assert abs(enumerated - optimal_acceptance(p, q, k, WOR)) < 1e-9
    assert abs(enumerated - optimal_acceptance_lp(p, draft_joint(q, k, WOR))) < 1e-9


LAW = st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1.0), st.floats(1e-12, 1e-6)), min_size=2, max_size=6).filter(
    lambda xs: sum(xs) > 0
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(LAW, LAW, st.integers(1, 4))
def test_exact_lossless_and_optimal_hypothesis(ps, qs, k):
    v = min(len(ps), len(qs))
    if sum(ps[:v]) == 0 or sum(qs[:v]) == 0 or sum(x > 0 for x in qs[:v]) < k:
        return
    _check_optimal(_law(ps[:v]), _law(qs[:v]), k)




@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_exact_lossless_and_optimal_adversarial(adversarial_pair, k):
    _, p, q = adversarial_pair
    if np.count_nonzero(q) < k:
        return
    _check_optimal(p, q, k)


def test_random_instances():
    r = np.random.default_rng(5)
    for i in range(24):
        v = int(r.integers(4, 8))
        a = [0.3, 1.0, 3.0][i % 3]
        _check_optimal(r.dirichlet(np.full(v, a)), r.dirichlet(np.full(v, a)), int(r.integers(2, min(v, 5))))


def _truncated_cases():
    r = np.random.default_rng(17)
    for i in range(10):
        v = int(r.integers(5, 8))
        k = int(r.integers(2, min(v - 1, 4) + 1))
        a = [0.3, 1.0, 3.0][i % 3]
        yield r.dirichlet(np.full(v, a)), r.dirichlet(np.full(v, a)), k
    yield ADVERSARIAL_PAIRS["near_deterministic"][0], _law([0.002, 0.004, 0.004, 0.49, 0.5]), 2
    yield _law([0.0, 0.1, 0.2, 0.3, 0.4, 0.0]), _law([0.3, 0.25, 0.2, 0.15, 0.1, 1e-9]), 3


@pytest.mark.parametrize("case", range(12))
def test_truncated_exact_against_enumeration(case):
    p, q, k = list(_truncated_cases())[case]
    small = OptimalWithoutReplacementVerifier(max_sets=2 ** (k + 1) + 1)  # m = K + 1 < the support
    w, tuples, laws, enumerated = _enumerate(small, p, q, k)
    np.testing.assert_allclose(w @ laws, p, atol=ATOL)
    np.testing.assert_allclose(laws.sum(axis=1), 1.0, atol=ATOL)
    assert abs(small.acceptance(p, q, k) - enumerated) < ATOL
    assert enumerated <= optimal_acceptance(p, q, k, WOR) + 1e-12
    c = truncated_coupling(p, q, k, small.max_sets)
    assert not c.covers and c.top.size == k + 1
    by_q = OptimalWithoutReplacementVerifier(max_sets=small.max_sets)
    by_q._prepare = lambda p, q, k: truncated_coupling(p, q, k, small.max_sets, rank="q")
    w2, _, laws_q, enumerated_q = _enumerate(by_q, p, q, k)
    np.testing.assert_allclose(w2 @ laws_q, p, atol=ATOL)
    assert abs(truncated_coupling(p, q, k, small.max_sets, rank="q").accepted - enumerated_q) < ATOL
    rows = c.rows(tuples)
    np.testing.assert_allclose(np.bincount(rows, weights=w, minlength=c.masks.size), c.mu, atol=ATOL)
    outside = np.ones(p.size, dtype=bool)
    outside[c.top] = False
    drafted_p = np.array([p[np.unique(t)][outside[np.unique(t)]].sum() for t in tuples])
    np.testing.assert_allclose(np.bincount(rows, weights=w * drafted_p, minlength=c.masks.size), c.chance, atol=ATOL)


@pytest.mark.parametrize("k", [2, 4])
def test_moment_path_and_reference_at_v_3000(monkeypatch, k):
    p, q = lm_like_laws(3000, 40 + k)
    c = truncated_coupling(p, q, k, 200)
    assert c.num_smooth > 1000  # the moment path carries most of T^c
    monkeypatch.setattr(_optimal_wor, "SMOOTH_X", -1.0)  # every token of T^c one by one
    d = truncated_coupling(p, q, k, 200)
    np.testing.assert_allclose(c.mu, d.mu, atol=ATOL)
    np.testing.assert_allclose(c.chance, d.chance, atol=ATOL)
    assert abs(c.accepted - d.accepted) < ATOL and d.num_smooth == 0
    rest = np.setdiff1d(np.arange(q.size), c.top)
    assert abs(c.mu[0] - wor_prefix_mass(q, rest, k)[-1]) < ATOL  # μ(∅) = Q(T^c)


def test_power_of_the_binned_g_test():
    assert power(N, BINS - 1, 0.01, ALPHA / 2) > 0.999  # the kit's lower bound against any 1% TV distortion


@pytest.mark.parametrize("k", [2, 4])
def test_statistically_lossless_at_v_1500(k):
    p, q = lm_like_laws(V_STAT, 11 + k)
    exact = ver.acceptance(p, q, k)
    assert exact <= optimal_acceptance(p, q, k, WOR) + 1e-12
    res = run(ver, p, q, k, N, 1234 + k, confidence=1 - ALPHA)
    assert binned_gof_pvalue(res.sample.tokens, p, p / q, bins=BINS) > ALPHA / 2
    assert binned_gof_pvalue(res.sample.tokens, p, np.arange(V_STAT), bins=BINS) > ALPHA / 2
    assert res.ci_low <= exact <= res.ci_high


def test_binned_g_test_rejects_a_one_percent_distortion():
    """The same check rejects this verifier's sample with 1% of the mass moved from the low-ratio
    half to the high-ratio half."""
    p, q = lm_like_laws(V_STAT, 13)
    res = run(ver, p, q, 2, N, 77)
    rng = np.random.default_rng(78)
    low = (p / q) <= np.median(p / q)
    move = low[res.sample.tokens] & (rng.random(N) < 0.01 / p[low].sum())
    hi = np.flatnonzero(~low)
    tokens = res.sample.tokens.copy()
    tokens[move] = rng.choice(hi, size=int(move.sum()), p=p[hi] / p[hi].sum())
    assert binned_gof_pvalue(tokens, p, p / q, bins=BINS) < ALPHA / 2


@pytest.mark.parametrize("k", [2, 4])
def test_full_vocabulary_acceptance(k):
    """V = 151,936, a peaked row: exact acceptance in the Wilson interval (level 1 − 1e-3) of 20,000
    verified tuples (6,000 at K = 4: drawing them costs ~3 s per 1,000), at most α*."""
    p, q = lm_like_laws(151_936, 100 + k, temperature=0.5)
    exact = ver.acceptance(p, q, k)
    assert exact <= optimal_acceptance(p, q, k, WOR) + 1e-12
    res = run(ver, p, q, k, 20_000 if k == 2 else 6_000, 99 + k, confidence=1 - ALPHA)
    assert res.ci_low <= exact <= res.ci_high


def test_bad_input():
    p, q = _law([0.5, 0.3, 0.2]), _law([0.2, 0.3, 0.5])
    with pytest.raises(InvalidInputError, match="max_sets"):
        OptimalWithoutReplacementVerifier(max_sets=0)
    with pytest.raises(InvalidInputError, match="max_sets"):
        OptimalWithoutReplacementVerifier(max_sets=6).acceptance(p, q, 2)
    with pytest.raises(InvalidInputError):
        ver.acceptance(p, _law([1.0, 0.0, 0.0]), 2)  # fewer than K tokens to draft


# -- the structure behind the theory page ----------------------------------------------------


def _set_masses(q, k):
    """Q(B) for every B ⊆ V (bitmask), by enumeration of the draft law and a zeta transform."""
    v = q.size
    joint = draft_joint(q, k, WOR)
    mass = np.zeros(1 << v)
    for idx in zip(*np.nonzero(joint)):
        mass[sum(1 << int(i) for i in set(idx))] += joint[idx]
    for i in range(v):
        has = np.flatnonzero(np.arange(1 << v) & (1 << i))
        mass[has] += mass[has ^ (1 << i)]
    return mass


def _running_max_law(p, q, mass):
    """m of ``M_j = P_j + g_j`` along the ratio order (g: running maxima of G toward h), by token."""
    with np.errstate(divide="ignore"):
        order = np.argsort(np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf), kind="stable")
    prefix = np.concatenate([[0], np.cumsum([1 << int(t) for t in order])])
    g = mass[prefix] - np.concatenate([[0.0], np.cumsum(p[order])])
    h = int(np.argmax(g))
    run_max = np.concatenate([np.maximum.accumulate(g[: h + 1]), np.maximum.accumulate(g[h:][::-1])[::-1][1:]])
    m = np.empty(p.size)
    m[order] = np.diff(np.concatenate([[0.0], np.cumsum(p[order])]) + run_max)
    return m, order[:h]


def test_running_maximum_law_is_an_optimal_selection_law():
    """m(B) ≥ Q(B) for all 2^V sets (m is the law of some rule "emit an element of S"), m ≥ p on
    H*, m ≤ p off it, m(H*) = Q(H*): selecting by m, accepting p/m on H*, is optimal (theory page)."""
    r = np.random.default_rng(3)
    for i in range(60):
        v = int(r.integers(3, 8))
        k = int(r.integers(2, min(v, 5)))
        a = [0.2, 0.5, 1.0, 3.0][i % 4]
        p, q = r.dirichlet(np.full(v, a)), r.dirichlet(np.full(v, a))
        mass = _set_masses(q, k)
        m, h_star = _running_max_law(p, q, mass)
        sums = np.array([m[[j for j in range(v) if b >> j & 1]].sum() for b in range(1 << v)])
        assert (sums >= mass - 1e-12).all()
        inside = np.zeros(v, dtype=bool)
        inside[h_star] = True
        assert (m[inside] >= p[inside] - 1e-12).all() and (m[~inside] <= p[~inside] + 1e-12).all()
        assert abs(m[inside].sum() - mass[sum(1 << int(t) for t in h_star)]) < 1e-12


def _coins(p, q, k, m, order_tokens, fallback_top):
    """Largest violation of the coin rule along ``order_tokens`` (a list of tokens): each drafted
    token, in that order, is selected with probability θ_j; with ``fallback_top`` the last drafted
    token in the order is selected when every coin before it failed; θ_j solved for m_j in turn."""
    joint = draft_joint(q, k, WOR)
    sets = {}
    for idx in zip(*np.nonzero(joint)):
        s = frozenset(int(i) for i in idx)
        sets[s] = sets.get(s, 0.0) + joint[idx]
    pos = {t: i for i, t in enumerate(order_tokens)}
    theta, worst = {}, 0.0
    for j in order_tokens[:-1] if fallback_top else order_tokens:
        free = forced = 0.0
        for s, w in sets.items():
            mine = [x for x in s if x in pos]
            if j not in mine:
                continue
            f = w * np.prod([1 - theta[x] for x in mine if pos[x] < pos[j]])
            if fallback_top and pos[j] == max(pos[x] for x in mine):
                forced += f
            else:
                free += f
        t = (m[j] - forced) / free if free > 0 else 0.0
        worst = max(worst, -t, t - 1)
        theta[j] = min(max(t, 0.0), 1.0)
    return worst


def test_product_form_coin_rules_fail_somewhere():
    """The samplers that would make m cheap to sample — independent coins along the ratio order,
    from either end, with the last drafted token as fallback — need a coin outside [0, 1] on some
    instances (the theory page's counterexample and a search)."""
    r = np.random.default_rng(1)
    failures = {"ascending": 0, "descending": 0}
    for i in range(80):
        v = int(r.integers(3, 7))
        k = int(r.integers(2, min(v, 4)))
        a = [0.2, 0.5, 1.0, 3.0][i % 4]
        p, q = r.dirichlet(np.full(v, a)), np.maximum(r.dirichlet(np.full(v, a)), 1e-4)
        q /= q.sum()
        mass = _set_masses(q, k)
        m, _ = _running_max_law(p, q, mass)
        with np.errstate(divide="ignore"):
            order = list(np.argsort(np.where(q > 0, p / q, np.inf), kind="stable"))
        failures["ascending"] += _coins(p, q, k, m, order, True) > 1e-9
        failures["descending"] += _coins(p, q, k, m, order[::-1], True) > 1e-9
    assert failures["ascending"] > 0 and failures["descending"] > 0, failures
    assert all(n < 80 for n in failures.values())


def test_exhaustive_sets_enumeration_is_consistent():
    """The helper's Q(B) equals the clock integral at a prefix (guards the structure tests above)."""
    q = _law([0.1, 0.2, 0.3, 0.4, 0.05])
    mass = _set_masses(q, 3)
    order = np.array([4, 0, 2, 1, 3])
    ref = wor_prefix_mass(q, order, 3)
    prefixes = np.cumsum([1 << int(t) for t in order])
    np.testing.assert_allclose(mass[prefixes], ref, atol=1e-12)


NO_COIN_ORDER = (np.array([0.06, 0.19, 0.72, 0.03]), np.array([0.35, 0.10, 0.40, 0.15]), 2)


def test_no_token_order_gives_a_coin_rule_for_the_running_maximum_law():
    """The theory page's counterexample (found by search): V = 4, K = 2 — for none of the 24 token
    orders do coins along the order (last drafted token as fallback) realise the running-maximum
    law, although that law is optimal and lies in the core of Q."""
    p, q, k = NO_COIN_ORDER
    mass = _set_masses(q, k)
    m, _ = _running_max_law(p, q, mass)
    sums = np.array([m[[j for j in range(4) if b >> j & 1]].sum() for b in range(16)])
    assert (sums >= mass - 1e-12).all()
    worst = [_coins(p, q, k, m, list(order), True) for order in itertools.permutations(range(4))]
    assert min(worst) > 0.04


# -- ot_wor_iid: ot on the i.i.d. draws rebuilt from the drafts ----------------------------

iid_ver = VERIFIERS["ot_wor_iid"]


def test_growth_strings_are_bell_many():
    assert [_optimal_wor._growth_strings(k).shape[0] for k in range(1, 9)] == [1, 2, 5, 15, 52, 203, 877, 4140]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_rebuilt_draws_are_exactly_iid(k):
    """Σ over the drafts' tuples of Q_wor(d) · P(rebuild = x | d) = Π q(x_j) for every x (1e-12)."""
    q = _law([0.4, 0.25, 0.2, 0.1, 0.05])
    w, tuples = support_tuples(q, k, WOR)
    weights, g = iid_ver._step_weights(q, tuples)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=ATOL)
    law = np.zeros((q.size,) * k)
    np.add.at(law, tuple(tuples[:, g].reshape(-1, k).T), (w[:, None] * weights).ravel())
    np.testing.assert_allclose(law, draft_joint(q, k, "with_replacement"), atol=ATOL)


def test_rebuild_sampler_matches_its_law():
    """The vectorised rebuild in ``sample`` draws each growth string with its probability
    (the kit's G-test at level 1e-3 over 200,000 rows of one tuple; df = 14 at K = 4)."""
    q = _law([0.4, 0.25, 0.2, 0.1, 0.05])
    drafts = np.array([[0, 2, 1, 4]])
    weights, g = iid_ver._step_weights(q, drafts)
    captured = {}

    class Spy:
        def sample(self, p, q, x, rng):
            captured["x"] = x
            return type("S", (), {"tokens": x[:, 0]})()

    spy = type(iid_ver)()
    spy._inner = Spy()
    spy._sample(q, q, None, np.repeat(drafts, N, axis=0), np.random.default_rng(5))
    strings = {tuple(row): i for i, row in enumerate(drafts[0][g])}
    obs = np.bincount([strings[tuple(r)] for r in captured["x"]], minlength=g.shape[0])
    assert g_test(obs, weights[0])[1] > ALPHA


def _check_iid(p, q, k):
    w, tuples, laws, enumerated = _enumerate(iid_ver, p, q, k)
    assert laws.min() >= 0.0
    np.testing.assert_allclose(laws.sum(axis=1), 1.0, atol=ATOL)
    np.testing.assert_allclose(w @ laws, p, atol=ATOL)
    assert abs(iid_ver.acceptance(p, q, k) - enumerated) < ATOL
    assert optimal_acceptance(p, q, k) - 1e-9 <= enumerated <= optimal_acceptance(p, q, k, WOR) + 1e-9


@pytest.mark.parametrize("k", [1, 2, 3])
def test_iid_stream_exact_adversarial(adversarial_pair, k):
    _, p, q = adversarial_pair
    if np.count_nonzero(q) < k:
        return
    _check_iid(p, q, k)


def test_iid_stream_exact_random():
    r = np.random.default_rng(8)
    for i in range(12):
        v = int(r.integers(3, 7))
        a = [0.3, 1.0, 3.0][i % 3]
        _check_iid(r.dirichlet(np.full(v, a)), r.dirichlet(np.full(v, a)), int(r.integers(2, min(v, 5))))


@pytest.mark.parametrize("k", [2, 4])
def test_iid_stream_statistically_lossless_at_v_1500(k):
    """Same decision rule and power as ``test_statistically_lossless_at_v_1500``; the accepted
    fraction's Wilson lower end must reach the i.i.d. optimum."""
    p, q = lm_like_laws(V_STAT, 21 + k)
    res = run(iid_ver, p, q, k, N, 4321 + k, confidence=1 - ALPHA)
    assert binned_gof_pvalue(res.sample.tokens, p, p / q, bins=BINS) > ALPHA / 2
    assert binned_gof_pvalue(res.sample.tokens, p, np.arange(V_STAT), bins=BINS) > ALPHA / 2
    assert res.ci_high >= optimal_acceptance(p, q, k)


# -- the hierarchical Luce rule: the optimal sampler's structure (small V) ----------------------


def _luce_coupling_laws(p, q, k, rule, tuples):
    """Exact laws of: select by the rule, accept p/m on H* (1 on C), residual (p − m)_+."""
    sel = rule.selection(tuples)
    keep = np.where(rule.h_star, np.minimum(1.0, p / np.where(rule.select > 0, rule.select, 1.0)), 1.0)
    resid = np.maximum(p - rule.select, 0.0)
    resid = resid / resid.sum() if resid.sum() > 0 else p
    laws = np.zeros((tuples.shape[0], p.size))
    np.add.at(laws, (np.repeat(np.arange(tuples.shape[0]), k), tuples.ravel()), (sel * keep[tuples]).ravel())
    return laws + (1.0 - laws.sum(axis=1, keepdims=True)) * resid


def _check_luce(p, q, k):
    rule = _optimal_wor.luce_rule(p, q, k)
    w, tuples = support_tuples(q, k, WOR)
    m = np.zeros(p.size)
    np.add.at(m, tuples.ravel(), (w[:, None] * rule.selection(tuples)).ravel())
    np.testing.assert_allclose(m, rule.select, atol=1e-12)
    laws = _luce_coupling_laws(p, q, k, rule, tuples)
    np.testing.assert_allclose(w @ laws, p, atol=1e-12)
    mask = np.zeros(laws.shape, dtype=bool)
    mask[np.arange(len(tuples))[:, None], tuples] = True
    accepted = float(w @ np.where(mask, laws, 0.0).sum(axis=1))
    assert abs(accepted - optimal_acceptance(p, q, k, WOR)) < 1e-9
    assert abs(accepted - optimal_acceptance_lp(p, draft_joint(q, k, WOR))) < 1e-9
    return rule


def test_hierarchical_luce_rule_is_an_optimal_sampler():
    """The running-maximum law is the selection law of a hierarchical Luce rule (highest segment
    holding a draft, then draft y with probability w_y / Σ w): selecting by it, accepting p/m on
    H*, gives α* (random instances, V ≤ 7, K ≤ 4; the theory page's theorem)."""
    r = np.random.default_rng(4)
    for i in range(30):
        v = int(r.integers(3, 8))
        a = [0.2, 0.5, 1.0, 3.0][i % 4]
        _check_luce(r.dirichlet(np.full(v, a)), r.dirichlet(np.full(v, a)), int(r.integers(2, min(v, 5))))


def test_hierarchical_luce_rule_adversarial(adversarial_pair):
    _, p, q = adversarial_pair
    if np.count_nonzero(q) < 2 or np.count_nonzero(q) < q.size:
        return  # the theorem's chain argument needs every K-set drafted with positive probability
    _check_luce(p, q, 2)


def test_luce_rule_on_the_coin_counterexample():
    """Where no coin rule along any order exists, the Luce rule does."""
    _check_luce(*NO_COIN_ORDER)


def test_tight_sets_form_a_chain():
    """With every K-set of positive probability, the sets B with m(B) = Q(B) are nested (the
    levels of the Luce rule; theory page)."""
    r = np.random.default_rng(9)
    for _ in range(20):
        v = int(r.integers(3, 7))
        k = int(r.integers(2, min(v, 4)))
        p, q = r.dirichlet(np.ones(v)), r.dirichlet(np.ones(v))
        mass = _set_masses(q, k)
        m, _ = _running_max_law(p, q, mass)
        sums = np.array([m[[j for j in range(v) if b >> j & 1]].sum() for b in range(1 << v)])
        tight = [b for b in range(1 << v) if abs(sums[b] - mass[b]) < 1e-12]
        for b1, b2 in itertools.combinations(tight, 2):
            assert (b1 & b2) in (b1, b2), (b1, b2)


def test_iid_stream_exact_acceptance_at_full_vocabulary():
    """K = 2, V = 151,936: the closed form inside the Wilson interval (level 1 − 1e-3) of 20,000
    verified tuples, between α* with replacement and α* without."""
    p, q = lm_like_laws(151_936, 300, temperature=0.5)
    exact = iid_ver.acceptance(p, q, 2)
    assert optimal_acceptance(p, q, 2) <= exact <= optimal_acceptance(p, q, 2, WOR) + 1e-12
    res = run(iid_ver, p, q, 2, 20_000, 301, confidence=1 - ALPHA)
    assert res.ci_low <= exact <= res.ci_high
    assert iid_ver.acceptance(p, q, 3) is None  # K ≥ 3: no closed form, too many tuples to enumerate


# -- ot_wor: the better of the two per (p, q, K) -----------------------------------------------


def test_best_of_both_exact_and_choice():
    """Truncated small instances (so that either side can win): exact laws lossless, acceptance =
    enumeration, the chosen side's value, at least the other side's (exact at K ≤ 2, the floor α*_wr
    at K = 3); both sides chosen somewhere."""
    r = np.random.default_rng(12)
    chosen = set()
    for i in range(16):
        v = int(r.integers(5, 8))
        k = [2, 3][i % 2]
        p, q = r.dirichlet(np.full(v, [0.3, 1.0][i % 2])), r.dirichlet(np.full(v, [0.3, 1.0][i % 2]))
        best = _optimal_wor.BestWithoutReplacementVerifier(max_sets=2 ** (k + 1) - 1)
        small = OptimalWithoutReplacementVerifier(max_sets=best._top.max_sets)
        w, tuples, laws, enumerated = _enumerate(best, p, q, k)
        np.testing.assert_allclose(w @ laws, p, atol=ATOL)
        assert abs(best.acceptance(p, q, k) - enumerated) < ATOL
        top_value = small.acceptance(p, q, k)
        iid_value = iid_ver.acceptance(p, q, k)
        rival = iid_value if k <= 2 else optimal_acceptance(p, q, k)
        side = "top" if top_value >= rival else "iid"
        chosen.add(side)
        assert abs(enumerated - (top_value if side == "top" else iid_value)) < 1e-12
        assert enumerated >= max(top_value, optimal_acceptance(p, q, k)) - 1e-12
    assert chosen == {"top", "iid"}


def test_top_tokens_equal_a_full_sort_ties_included():
    """The partition-based choice of T is the full lexsort's: by decreasing score, ties to the lower
    id, with ties straddling the m-th place (integer scores, many equal)."""
    r = np.random.default_rng(5)
    for trial in range(40):
        n = int(r.integers(1, 400))
        positive = np.sort(r.choice(10_000, size=n, replace=False))
        score = r.integers(0, 6, size=n).astype(float) if trial % 2 else r.random(n)
        for m in (1, 3, 15, 62, n, n + 5):
            want = positive[np.lexsort((positive, -score))[:m]]
            np.testing.assert_array_equal(_optimal_wor._top_tokens(positive, score, m), want)


def test_planner_measures_the_three_exactly_at_two_drafts():
    """The planner's acceptance table (:func:`otbound.plan.synthetic_table`) holds ``ot_wor_top``,
    ``ot_wor_iid`` and ``ot_wor`` when named (they are left out of its defaults for their cost per
    position), measured exactly at K ≤ 2 with the verifiers' own exact acceptance; ``ot_wor`` is the
    larger of the two per position and ≤ α*."""
    from otbound.plan import DEFAULT_VERIFIERS, synthetic_laws, synthetic_table

    assert not {"ot_wor", "ot_wor_top", "ot_wor_iid"} & set(DEFAULT_VERIFIERS)
    names = ("ot_wor_top", "ot_wor_iid", "ot_wor")
    table = synthetic_table(num_traces=2, positions=3, max_drafts=3, verifiers=names, laws=(WOR,))
    laws = synthetic_laws(2, 3)
    for name in names:
        assert sorted(table.acceptance[name]) == [1, 2] and table.methods[name][2] == "exact"
        for k in (1, 2):
            got = np.concatenate(table.acceptance[name][k])
            want = [VERIFIERS[name].acceptance(p, q, k) for ps, qs in laws for p, q in zip(ps, qs)]
            np.testing.assert_allclose(got, want, atol=1e-12)
    for k in (1, 2):
        best = np.concatenate(table.acceptance["ot_wor"][k])
        parts = np.maximum(*(np.concatenate(table.acceptance[n][k]) for n in names[:2]))
        np.testing.assert_allclose(best, parts, atol=1e-12)
        assert np.all(best <= np.concatenate(table.optimal[WOR][k]) + 1e-9)


LUCE_BASE = (np.array([0.1, 0.2, 0.3, 0.4]), np.full(4, 0.25))  # (p, q) of the four large tokens


def _two_small_tokens(eps, ratio=1.0):
    """The base instance with two tokens of one ratio p/q = ``ratio`` and q = ε, 2ε appended."""
    p, q = LUCE_BASE
    return (np.concatenate([p * (1 - 3 * eps * ratio), [ratio * eps, 2 * ratio * eps]]),
            np.concatenate([q * (1 - 3 * eps), [eps, 2 * eps]]))


@pytest.mark.parametrize("k,low,high", [(2, 1.1, 1.5), (3, 1.7, 2.3)])
def test_luce_weights_of_equal_ratio_tokens_differ_at_first_order_in_q(k, low, high):
    """The optimal sampler's weights are not a function of the ratio p/q (theory page: what stops an
    exact construction at full vocabulary): two tokens of one ratio, q = ε and 2ε, in one level have
    weights ``w_b / w_a = 1 + c ε + O(ε²)`` with c ≈ 1.17 (K = 2), 1.79 (K = 3) here, so far above the
    fixed point's tolerance (1e-14; the weights are unique up to scale within a level)."""
    slopes = []
    for eps in (1e-2, 1e-3):
        p, q = _two_small_tokens(eps)
        rule = _optimal_wor.luce_rule(p, q, k, tol=1e-14)
        assert rule.residual_error < 1e-12 and len(set(rule.level.tolist())) == 1  # one level
        slopes.append((rule.weight[5] / rule.weight[4] - 1.0) / eps)
    assert all(low < s < high for s in slopes), slopes
    assert abs(slopes[0] - slopes[1]) < 0.05 * slopes[1]  # first order: the slope settles as ε → 0


def _poisson_binomial_below(rates, t, k):
    """P[N(t) < K] for N(t) = Σ Bernoulli(1 − e^{−q t}), exactly (dynamic programme, float64)."""
    dist = np.zeros(k)
    dist[0] = 1.0
    for x in -np.expm1(-rates * t):
        dist[1:] = dist[1:] * (1 - x) + dist[:-1] * x
        dist[0] *= 1 - x
    return float(dist.sum())


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_clock_horizon_bounds_the_neglected_tail(k):
    """At the horizon t of :func:`_clock_horizon`, P[N(t) < K] ≤ e^{−tail} exactly (flat, peaked and
    mixed rates), and the horizon is finite wherever the rates allow K rings."""
    r = np.random.default_rng(k)
    mixed = np.concatenate([[0.5, 0.3], np.full(500, 4e-4)])
    for rates in (np.full(3000, 1 / 3000), r.dirichlet(np.full(2000, 0.2)), mixed):
        for tail in (10.0, 45.0):
            t = _optimal_wor._clock_horizon(rates, k, tail)
            assert np.isfinite(t)
            assert _poisson_binomial_below(rates, t, k) <= np.exp(-tail)
    assert _optimal_wor._clock_horizon(np.array([0.5, 0.5]), 4, 45.0) == np.inf  # two tokens never ring 4 times


@pytest.mark.parametrize("k", [2, 4])
def test_horizon_leaves_the_flat_row_coupling_unchanged(monkeypatch, k):
    """A flat row (V = 3,000, logits N(0, 0.3²)), where the horizon shortens the grid most: μ, c and the
    acceptance equal those computed to the old horizon alone, to 1e-12."""
    r = np.random.default_rng(40 + k)
    z = 0.3 * r.standard_normal(3000)
    p, q = laws_from_logits(z + 0.3 * r.standard_normal(3000), 1.0), laws_from_logits(z, 1.0)
    c = truncated_coupling(p, q, k, 200)
    monkeypatch.setattr(_optimal_wor, "_clock_horizon", lambda *a: np.inf)
    d = truncated_coupling(p, q, k, 200)
    assert c.num_smooth > d.num_smooth  # the shorter grid takes more tokens through their moments
    np.testing.assert_allclose(c.mu, d.mu, atol=ATOL)
    np.testing.assert_allclose(c.chance, d.chance, atol=ATOL)
    assert abs(c.accepted - d.accepted) < ATOL


def test_no_closed_form_luce_weights():
    """Closed forms in the token's own numbers (w = q, p, m/q) do not give the optimal Luce rule: on
    each of 30 random instances (V ≤ 6, K ≤ 3) the rule with those weights, on the optimal levels,
    misses the selection law m by more than 1e-6 (the fixed point itself reaches 1e-12)."""
    r = np.random.default_rng(0)
    for _ in range(30):
        v = int(r.integers(4, 7))
        k = int(r.integers(2, min(v - 1, 3) + 1))
        p, q = r.dirichlet(np.ones(v)), r.dirichlet(np.ones(v))
        rule = _optimal_wor.luce_rule(p, q, k)
        assert rule.residual_error < 1e-12
        tuples = np.array(list(itertools.permutations(range(v), k)))
        weights = draft_joint(q, k, WOR)[tuple(tuples.T)]
        errors = []
        for w in (rule.weight, q, p, rule.select / q):  # the fixed point first: the harness reproduces m
            trial = _optimal_wor.LuceRule(rule.level, w, rule.select, rule.h_star, rule.alpha, 0.0)
            sel = trial.selection(tuples)  # (n, K)
            law = np.zeros(v)
            np.add.at(law, tuples, weights[:, None] * sel)
            errors.append(np.abs(law - rule.select).max())
        assert errors[0] < 1e-12 and min(errors[1:]) > 1e-6, errors
