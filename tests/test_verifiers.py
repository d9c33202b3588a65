"""Token-level verifiers: losslessness (exact and statistical), acceptance values, known results.

Statistics (decision rule fixed in advance). A statistical check draws N = 200 000 draft tuples at a
fixed seed and runs the conformance kit's G-test of the emitted tokens against p (bins with
expected count < 5 pooled; a token with p = 0 must never appear; :func:`conftest.pooled_g_test`),
and compares the Monte Carlo acceptance with the exact one by a Wilson interval at confidence
1 − ALPHA. Per stage ALPHA = 1e-3.
Two-stage rule (:func:`confirmed`): a check that fails is repeated once on an independent fresh
sample and the test fails only if that fails too. Per test (≤ 2 checks per stage): false alarm
≤ (2·ALPHA)² = 4e-6, ≤ 1e-3 over the ~250 statistical tests. Power against any 1%-TV distortion:
its non-centrality is λ = N Σ d²/p ≥ N · 4e-4 (minimum over d with Σ|d| = 0.02, Σ d = 0); every
test computes its worst-case power for its actual bins and sample size (the kit's lower bound
:func:`otbound.conformance.power`) and asserts ≥ 0.995 per stage, so ≥ 0.99 for the two-stage rule
(N = 200 000: up to 19 degrees of freedom, per-stage power ≥ 0.9995 up to 15; the V = 300 test has
about 205 bins and draws N = 400 000: per stage ≥ 0.9989). Checked empirically on a worst-case
distorted sampler, which is rejected at both stages.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.stats
from conftest import gof_pvalue, pooled_g_test

from otbound import VERIFIERS, InvalidInputError, draft_joint, optimal_acceptance, optimal_acceptance_lp, sample_drafts
from otbound.conformance import power
from otbound.token.verifiers import NaiveVerifier, OptimalVerifier, kseq_rho, run

N = 200_000
ALPHA = 1e-3
SECOND_STAGE = 1_000_003  # seed offset of the confirmation sample
EXACT_ATOL = 1e-12
NAMES = sorted(VERIFIERS)


def _law(x):
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum()


def _cases():
    r = np.random.default_rng(20240611)
    p_zero = r.dirichlet(np.ones(6))
    p_zero[[1, 4]] = 0.0
    q_zero = r.dirichlet(np.ones(6))
    q_zero[[0, 2]] = 0.0
    same = r.dirichlet(np.ones(5))
    return {
        "dirichlet": (r.dirichlet(np.ones(6)), r.dirichlet(np.ones(6))),
        "dirichlet_sparse": (r.dirichlet(np.full(8, 0.3)), r.dirichlet(np.full(8, 0.3))),
        "disjoint": (_law([0.5, 0.3, 0.2, 0, 0, 0]), _law([0, 0, 0, 0.2, 0.3, 0.5])),
        "zeros_in_q": (r.dirichlet(np.ones(6)), _law(q_zero)),
        "zeros_in_p": (_law(p_zero), r.dirichlet(np.ones(6))),
        "near_deterministic": (_law([0.998, 0.001, 0.001, 0, 0]), _law([0.002, 0.004, 0.004, 0.49, 0.5])),
        "peaked_both": (_law([0.99, 0.004, 0.003, 0.003]), _law([0.97, 0.01, 0.01, 0.01])),
        "uniform": (np.full(8, 1 / 8), r.dirichlet(np.ones(8))),
        "identical": (same, same.copy()),
    }


CASES = _cases()


def _ks_for(verifier, q):
    """Draft counts to test: 1..3, limited by what the law allows (support, max_drafts)."""
    ks = [1, 2, 3]
    if verifier.sampling != "with_replacement":
        ks = [k for k in ks if k <= np.count_nonzero(q)]
    if verifier.max_drafts is not None:
        ks = [k for k in ks if k <= verifier.max_drafts]
    return ks


GRID = [
    pytest.param(name, case, k, id=f"{name}-{case}-K{k}")
    for name in NAMES
    for case in CASES
    for k in _ks_for(VERIFIERS[name], CASES[case][1])
]


def _enumerate(q, k, sampling):
    """Support tuples of the draft law and their probabilities, straight from draft_joint."""
    joint = draft_joint(q, k, sampling)
    idx = np.argwhere(joint > 0)
    return joint[tuple(idx.T)], idx


def _mass_on_drafts(laws, tuples):
    mask = np.zeros(laws.shape, dtype=bool)
    mask[np.arange(len(tuples))[:, None], tuples] = True
    return np.where(mask, laws, 0.0).sum(axis=1)


def confirmed(check, seed):
    """Two-stage rule: ``check(seed)`` returns (ok, detail); if not ok, it must pass on an
    independent fresh sample. Returns (ok, details of both stages)."""
    ok, detail = check(seed)
    if ok:
        return True, detail
    ok2, detail2 = check(seed + SECOND_STAGE)
    return ok2, (detail, detail2)


def _lossless_check(name, p, q, k, n=N):
    def check(seed):
        res = run(name, p, q, k, n, seed, confidence=1 - ALPHA)
        pv = gof_pvalue(res.sample.tokens, p)
        exact = VERIFIERS[name].acceptance(p, q, k)
        return pv > ALPHA and res.ci_low <= exact <= res.ci_high, (pv, exact, res.ci_low, res.ci_high)

    return check


# ---------------------------------------------------------------------------------------------
# losslessness


@pytest.mark.parametrize("name, case, k", GRID)
def test_exact_marginal_is_p(name, case, k):
    """Σ_x̄ Q(x̄) law(·|x̄) = p to 1e-12, and every conditional law is a law."""
    p, q = CASES[case]
    v = VERIFIERS[name]
    w, tuples = _enumerate(q, k, v.sampling)
    laws = v.conditional_law(p, q, tuples)
    assert laws.min() >= 0.0
    np.testing.assert_allclose(laws.sum(axis=1), 1.0, atol=EXACT_ATOL)
    np.testing.assert_allclose(w @ laws, p, atol=EXACT_ATOL)


@pytest.mark.parametrize("name, case, k", GRID)
def test_sampler_lossless_and_acceptance_matches(name, case, k):
    """Chi-square of N emitted tokens against p; MC acceptance brackets the exact acceptance."""
    p, q = CASES[case]
    assert VERIFIERS[name].acceptance(p, q, k) is not None
    seed = NAMES.index(name) * 1000 + list(CASES).index(case) * 10 + k
    ok, detail = confirmed(_lossless_check(name, p, q, k), seed)
    assert ok, detail


JOINT_CASES = ["dirichlet", "zeros_in_q", "near_deterministic"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", JOINT_CASES)
def test_sampler_matches_conditional_law(name, case):
    """Joint counts of (x̄, Y) against Q(x̄)·law(Y|x̄): the sampler draws the exact conditional law."""
    p, q = CASES[case]
    v = VERIFIERS[name]
    k = 2
    w, tuples = _enumerate(q, k, v.sampling)
    laws = v.conditional_law(p, q, tuples)
    vv = q.size
    position = np.full(vv**k, -1)
    position[np.ravel_multi_index(tuple(tuples.T), (vv,) * k)] = np.arange(len(tuples))
    expected = (w[:, None] * laws).ravel() * N

    def check(seed):
        rng = np.random.default_rng(seed)
        drafts = sample_drafts(q, k, v.sampling, N, rng)
        tokens = v.sample(p, q, drafts, rng).tokens
        rows = position[np.ravel_multi_index(tuple(drafts.T), (vv,) * k)]
        counts = np.bincount(rows * vv + tokens, minlength=len(tuples) * vv).astype(float)
        pv = pooled_g_test(counts, expected, tv=None)  # never an impossible (drafts, token) pair: asserted
        return pv > ALPHA, pv

    ok, detail = confirmed(check, 7 + NAMES.index(name))
    assert ok, detail


def test_g_test_power_bound():
    """Worst-case per-stage power of the G-test against any 1%-TV distortion at N, ALPHA (the kit's
    bound, checked against the noncentral chi-square it states)."""
    for df in range(1, 16):
        assert power(N, df, 0.01, ALPHA) > 0.9999
        want = scipy.stats.ncx2.sf(scipy.stats.chi2.isf(ALPHA, df), df, N * 4e-4)
        assert power(N, df, 0.01, ALPHA) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("case", ["uniform", "dirichlet"])
def test_g_test_rejects_one_percent_distortion(case):
    """A deliberately 1%-distorted RRS (worst-case shape: 0.01 of mass moved from one half of p to
    the other, proportionally to p) is rejected at N, ALPHA — the test above has power."""
    p, q = CASES[case]
    order = np.argsort(-p)
    b = np.zeros(p.size, dtype=bool)
    b[order[1::2]] = True  # alternate tokens by size: p(B) ≈ 1/2
    pa = np.where(b, 0.0, p)
    for seed in (99, 99 + SECOND_STAGE):  # rejected at both stages
        tokens = run("rrs", p, q, 2, N, seed).sample.tokens
        rng = np.random.default_rng(seed + 1)
        move = b[tokens] & (rng.random(N) < 0.01 / p[b].sum())
        distorted = tokens.copy()
        distorted[move] = rng.choice(p.size, size=int(move.sum()), p=pa / pa.sum())
        assert gof_pvalue(distorted, p) < ALPHA


def test_large_vocabulary_lossless():
    """V = 300, heavy-tailed laws: G-test (pooled tail, ~205 bins, N = 400 000) and exact acceptance
    within the CI."""
    r = np.random.default_rng(3)
    v = 300
    p = r.dirichlet(np.full(v, 0.2))
    q = r.dirichlet(np.full(v, 0.2))
    q[np.argsort(-p)[:5]] = 0.0  # some of p's top tokens cannot be drafted
    q /= q.sum()
    for name in ["nss", "rrs", "rrs_wor", "kseq", "spechub", "greedy", "khisti_is"]:
        ok, detail = confirmed(_lossless_check(name, p, q, 2, 2 * N), 11)  # ~205 bins: power 0.9989 per stage
        assert ok, (name, detail)


# ---------------------------------------------------------------------------------------------
# acceptance values


def _random_pairs(count, seed, vmax=7):
    r = np.random.default_rng(seed)
    out = []
    for i in range(count):
        v = int(r.integers(2, vmax + 1))
        a = [0.2, 1.0, 3.0][i % 3]
        p, q = r.dirichlet(np.full(v, a)), r.dirichlet(np.full(v, a))
        if i % 4 == 1:
            q[r.integers(v)] = 0.0
            q /= q.sum()
        if i % 4 == 2:
            p[r.integers(v)] = 0.0
            p /= p.sum()
        out.append((p, q))
    return out


PAIRS = _random_pairs(24, 1)


@pytest.mark.parametrize(
    "verifier",
    [VERIFIERS[n] for n in NAMES]
    + [NaiveVerifier("without_replacement"), NaiveVerifier("greedy"), OptimalVerifier("greedy")],
    ids=lambda v: f"{v.name}-{v.sampling}",
)
def test_acceptance_equals_enumeration_and_at_most_optimal(verifier):
    """acceptance() (closed form / recursion / enumeration) = Σ_x̄ Q(x̄) Σ_{y∈x̄} law(y|x̄) to 1e-12,
    and never exceeds α* of the verifier's draft law (+1e-9)."""
    for p, q in PAIRS:
        for k in _ks_for(verifier, q):
            w, tuples = _enumerate(q, k, verifier.sampling)
            enum = float(w @ _mass_on_drafts(verifier.conditional_law(p, q, tuples), tuples))
            acc = verifier.acceptance(p, q, k)
            assert abs(acc - enum) < EXACT_ATOL, (verifier.name, k, acc, enum)
            assert acc <= optimal_acceptance(p, q, k, verifier.sampling) + 1e-9


def test_acceptance_at_most_optimal_larger_vocabularies():
    r = np.random.default_rng(2)
    for _ in range(15):
        v = int(r.integers(10, 200))
        p, q = r.dirichlet(np.full(v, 0.3)), r.dirichlet(np.full(v, 0.3))
        for name in ["nss", "rrs", "kseq", "greedy", "spechub", "khisti_is"]:
            ver = VERIFIERS[name]
            for k in _ks_for(ver, q)[:2]:
                acc = ver.acceptance(p, q, k)
                assert acc <= optimal_acceptance(p, q, k, ver.sampling) + 1e-9, (name, k)


def test_single_draft_is_speculative_sampling():
    """K = 1: every verifier of a random draft but NSS and GLS reaches 1 − TV = Σ min(p, q); NSS gets
    Σ p q; the deterministic draft (argmax q, the lowest index among ties) is accepted with
    p(argmax q); GLS (no rejection step) gets P(argmin S/p = argmin S/q) (tests/test_gls.py)."""
    for p, q in PAIRS + list(CASES.values()):
        for name in NAMES:
            if name == "gls":
                continue
            if VERIFIERS[name].sampling == "deterministic":
                expected = float(p[np.argmax(q)])
            else:
                expected = float(p @ q) if name == "nss" else float(np.minimum(p, q).sum())
            assert abs(VERIFIERS[name].acceptance(p, q, 1) - expected) < 1e-9, name


def test_extreme_cases():
    """Disjoint supports: nothing is ever accepted. p = q: RRS, RRS-wor, K-SEQ, IS and OT accept always."""
    p, q = CASES["disjoint"]
    for name in NAMES:
        for k in _ks_for(VERIFIERS[name], q):
            assert VERIFIERS[name].acceptance(p, q, k) == pytest.approx(0.0, abs=1e-12)
    p, q = CASES["identical"]
    for name in ["rrs", "rrs_wor", "kseq", "khisti_is", "ot"]:
        assert VERIFIERS[name].acceptance(p, q, 3) == pytest.approx(1.0, abs=1e-9)


def test_rrs_exact_recursion_matches_independent_formula():
    """Thomas et al. Alg. 9 (used by rrs.acceptance) against a brute-force sum over draft tuples
    computed here from the algorithm's definition, not from the package's conditional law."""
    for p, q in PAIRS[:12]:
        for k in (1, 2, 3):
            seq = [p]
            for _ in range(k):
                d = np.maximum(seq[-1] - q, 0.0)
                seq.append(d / d.sum() if d.sum() > 0 else seq[-1])
            total = 0.0
            for tup in itertools.product(np.flatnonzero(q > 0), repeat=k):
                prob = np.prod(q[list(tup)])
                alive, acc = 1.0, 0.0
                for i, x in enumerate(tup):
                    a = min(1.0, seq[i][x] / q[x])
                    acc += alive * a
                    alive *= 1 - a
                acc += alive * seq[k][list(set(tup))].sum()
                total += prob * acc
            assert abs(VERIFIERS["rrs"].acceptance(p, q, k) - total) < 1e-12


def test_rrs_wor_worked_example():
    """docs/theory/token-verifiers.md: p = [.3,.4,.3], q = [.6,.3,.1]; reject a → p' = [0,1/3,2/3], q' = [0,3/4,1/4];
    accept b w.p. 4/9. Given drafts (a, b): law = ½δ_a + ½(4/9 δ_b + 5/9 δ_c)."""
    p, q = np.array([0.3, 0.4, 0.3]), np.array([0.6, 0.3, 0.1])
    law = VERIFIERS["rrs_wor"].conditional_law(p, q, [0, 1])
    np.testing.assert_allclose(law, [0.5, 2 / 9, 5 / 18], atol=1e-15)

    def check(seed):
        s = VERIFIERS["rrs_wor"].sample(p, q, np.tile([0, 1], (N, 1)), seed)
        after_a = s.tokens != 0  # a rejected
        n_b, n_rej = int((s.tokens[after_a] == 1).sum()), int(after_a.sum())
        ci = scipy.stats.binomtest(n_b, n_rej).proportion_ci(1 - ALPHA)
        return ci.low <= 4 / 9 <= ci.high, (n_b / n_rej, ci)

    ok, detail = confirmed(check, 3)
    assert ok, detail


def test_kseq_acceptance_is_one_minus_one_minus_beta_pow_k():
    """Claim of docs/theory/token-verifiers.md (derived): at ρ*, α_KSEQ = 1 − (1 − β(ρ*))^K exactly (residual
    draws never coincide with a rejected draft). The acceptance here is the exact value including coincidences."""
    r = np.random.default_rng(4)
    for i in range(200):
        v = int(r.integers(2, 50))
        a = [0.1, 0.5, 2.0][i % 3]
        p, q = r.dirichlet(np.full(v, a)), r.dirichlet(np.full(v, a))
        for k in (1, 2, 3, 5, 8):
            rho = kseq_rho(p, q, k)
            assert 1.0 <= rho <= k
            beta = np.minimum(p / rho, q).sum()
            assert abs(VERIFIERS["kseq"].acceptance(p, q, k) - (1 - (1 - beta) ** k)) < 1e-12


def test_kseq_guarantee():
    """SpecTr: α_KSEQ ≥ (1 − 1/e) α* for i.i.d. drafts."""
    r = np.random.default_rng(5)
    worst = np.inf
    for i in range(200):
        v = int(r.integers(2, 60))
        a = [0.05, 0.3, 1.0, 5.0][i % 4]
        p, q = r.dirichlet(np.full(v, a)), r.dirichlet(np.full(v, a))
        for k in (2, 3, 4, 8, 16):
            star = optimal_acceptance(p, q, k)
            acc = VERIFIERS["kseq"].acceptance(p, q, k)
            assert acc >= (1 - 1 / np.e) * star - 1e-12
            if star > 0:
                worst = min(worst, acc / star)
    assert worst < 1.0  # K-SEQ is not optimal in general


def test_greedy_reaches_alpha_star_greedy():
    """Greedy verifier = closed form α*_greedy = optimal_acceptance(greedy) = LP on the greedy joint."""
    for p, q in PAIRS:
        for k in _ks_for(VERIFIERS["greedy"], q):
            acc = VERIFIERS["greedy"].acceptance(p, q, k)
            assert abs(acc - optimal_acceptance(p, q, k, "greedy")) < 1e-12
            assert abs(acc - optimal_acceptance_lp(p, draft_joint(q, k, "greedy"))) < 1e-8


def test_spechub_reaches_alpha_star_greedy():
    """Derived claim (docs/theory/token-verifiers.md): SpecHub attains α*_greedy at K = 2 — its acceptance, computed
    by enumeration of its exact conditional laws, equals the greedy-law optimum."""
    r = np.random.default_rng(6)
    for i in range(100):
        v = int(r.integers(2, 9))
        a = [0.2, 1.0, 4.0][i % 3]
        p, q = r.dirichlet(np.full(v, a)), r.dirichlet(np.full(v, a))
        w, tuples = _enumerate(q, 2, "greedy")
        enum = float(w @ _mass_on_drafts(VERIFIERS["spechub"].conditional_law(p, q, tuples), tuples))
        assert abs(enum - optimal_acceptance(p, q, 2, "greedy")) < 1e-12


def test_optimal_importance_selection_reaches_alpha_star_at_two_drafts():
    """Khisti et al.'s canonical decomposition: with LP-optimal selection weights, IS + speculative
    sampling attains α* for K = 2 i.i.d. drafts (plain IS weights do not: see khisti_is)."""
    rng = np.random.default_rng(11)
    cases = [
        (np.array([0.5, 0.5, 0.0]), np.array([0.0, 0.5, 0.5])),
        (np.array([1.0, 0.0, 0.0]), np.array([0.2, 0.3, 0.5])),
        (np.array([1 / 3] * 3), np.array([1 / 3, 0.05, 0.95 - 1 / 3])),
    ]
    cases += [
        (rng.dirichlet(np.full(v, c)), rng.dirichlet(np.full(v, c))) for v in (2, 4, 6, 9) for c in (0.2, 1.0, 5.0)
    ]
    gaps = []
    for p, q in cases:
        best = optimal_acceptance(p, q, 2)
        assert VERIFIERS["khisti_lp"].acceptance(p, q, 2) == pytest.approx(best, abs=1e-8)
        gaps.append(best - VERIFIERS["khisti_is"].acceptance(p, q, 2))
    assert max(gaps) > 0.01  # the plain weights leave a real gap on some of these instances
    with pytest.raises(InvalidInputError, match="at most 2 drafts"):
        VERIFIERS["khisti_lp"].acceptance(cases[3][0], cases[3][1], 3)


@pytest.mark.parametrize("sampling", ["with_replacement", "without_replacement", "greedy"])
def test_ot_reaches_alpha_star(sampling):
    ver = VERIFIERS["ot"] if sampling == "with_replacement" else OptimalVerifier(sampling)
    for p, q in PAIRS:
        for k in _ks_for(ver, q):
            assert abs(ver.acceptance(p, q, k) - optimal_acceptance(p, q, k, sampling)) < 1e-8
