"""α* by the dual prefix form == primal LP == brute force over all 2^V subsets, for every law."""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otbound as ob
from otbound.token.draft_laws import inclusion_probabilities

LAWS = ("with_replacement", "without_replacement", "greedy")
AGREE = 1e-9  # dual vs LP vs brute force (HiGHS tolerances 1e-10; quadrature < 1e-12)


def _softmax(z):
    """The law softmax(z) of a 1-D logit vector."""
    e = np.exp(z - z.max())
    return e / e.sum()


def _law(draw, v, kind):
    if kind == "dirichlet":
        alpha = draw(st.sampled_from([0.05, 0.3, 1.0, 10.0]))
        seed = draw(st.integers(0, 2**31 - 1))
        x = np.random.default_rng(seed).dirichlet(np.full(v, alpha))
    elif kind == "sparse":
        raw = draw(st.lists(st.sampled_from([0.0, 0.0, 1e-9, 0.1, 1.0, 3.0]), min_size=v, max_size=v))
        x = np.asarray(raw, dtype=float)
        if x.sum() == 0:
            x[0] = 1.0
    elif kind == "near_deterministic":
        x = np.full(v, 1e-7)
        x[draw(st.integers(0, v - 1))] = 1.0
    else:  # uniform
        x = np.ones(v)
    return x / x.sum()


@st.composite
def instances(draw, max_v=6, max_k=3):
    v = draw(st.integers(2, max_v))
    kinds = ["dirichlet", "sparse", "near_deterministic", "uniform"]
    p = _law(draw, v, draw(st.sampled_from(kinds)))
    q = _law(draw, v, draw(st.sampled_from(kinds)))
    if draw(st.booleans()) and v >= 4:  # disjoint supports
        low = np.arange(v) < v // 2
        p = np.where(low, 0.0, p)
        q = np.where(low, q, 0.0)
        p = p / p.sum() if p.sum() > 0 else (~low) / (~low).sum()
        q = q / q.sum() if q.sum() > 0 else low / low.sum()
    k = draw(st.integers(1, max_k))
    return p, q, k


def _supported(q, k, law):
    return law == "with_replacement" or np.count_nonzero(q > 0) >= k


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.sampled_from(LAWS))
def test_dual_equals_lp_equals_brute_force(inst, law):
    p, q, k = inst
    if not _supported(q, k, law):
        with pytest.raises(ob.InvalidInputError, match="support"):
            ob.optimal_acceptance(p, q, k, law)
        return
    joint = ob.draft_joint(q, k, law)
    dual = ob.optimal_acceptance(p, q, k, law, return_certificate=True)
    lp = ob.optimal_acceptance_lp(p, joint)
    brute = ob.optimal_acceptance_brute_force(p, joint)
    assert abs(dual.value - brute.value) < AGREE
    assert abs(lp - brute.value) < AGREE
    # the certificate is a real minimiser: 1 + p(H*) − Q(H*) reproduces α*
    h = dual.binding_set
    assert abs(1 + p[h].sum() - ob.subset_mass(q, h, k, law) - brute.value) < AGREE


@settings(max_examples=40, deadline=None)
@given(instances(max_v=5, max_k=3))
def test_lp_solvers_agree(inst):
    p, q, k = inst
    joint = ob.draft_joint(q, k, "with_replacement")
    ref = ob.optimal_acceptance_brute_force(p, joint).value
    for method in ("highs", "pot", "cvxpy"):
        assert abs(ob.optimal_acceptance_lp(p, joint, method=method) - ref) < AGREE, method


def test_pot_stopped_early_is_an_error_not_a_low_value():
    """ot.emd stops at its pivot limit with only a warning and a non-optimal plan; otbound raises."""
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(30)), rng.dirichlet(np.ones(30))
    joint = ob.draft_joint(q, 2)
    with pytest.raises(RuntimeError, match="max_iter=5"):
        ob.optimal_acceptance_lp(p, joint, method="pot", max_iter=5)
    assert abs(ob.optimal_acceptance_lp(p, joint, method="pot") - ob.optimal_acceptance(p, q, 2)) < AGREE


def test_lp_time_limit_stops_the_solve_and_is_scoped_to_its_block():
    """Under a time limit HiGHS stops with "Time limit reached": an error, never the feasible but
    non-optimal value it stopped at; the options are restored after the block (also on an error)."""
    from otbound import _solvers

    before = (dict(_solvers.HIGHS_OPTIONS), dict(_solvers.HIGHS_FALLBACK_OPTIONS))
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(30)), rng.dirichlet(np.ones(30))
    joint = ob.draft_joint(q, 3)  # 27,000 draft tuples: far beyond a microsecond of HiGHS
    with pytest.raises(RuntimeError, match="Time limit reached"):
        with ob.lp_time_limit(1e-6):
            assert _solvers.HIGHS_OPTIONS["time_limit"] == _solvers.HIGHS_FALLBACK_OPTIONS["time_limit"] == 1e-6
            ob.optimal_acceptance_lp(p, joint)
    assert (dict(_solvers.HIGHS_OPTIONS), dict(_solvers.HIGHS_FALLBACK_OPTIONS)) == before
    small = ob.draft_joint(q[:4] / q[:4].sum(), 2)
    with ob.lp_time_limit(60):
        value = ob.optimal_acceptance_lp(p[:4] / p[:4].sum(), small)
    assert abs(value - ob.optimal_acceptance(p[:4] / p[:4].sum(), q[:4] / q[:4].sum(), 2)) < AGREE
    for bad in (0, -1.0, float("inf"), float("nan"), "5", True):
        with pytest.raises(ob.InvalidInputError, match="seconds"):
            with ob.lp_time_limit(bad):
                pass
    assert (dict(_solvers.HIGHS_OPTIONS), dict(_solvers.HIGHS_FALLBACK_OPTIONS)) == before


@settings(max_examples=80, deadline=None)
@given(instances(max_v=7, max_k=4))
def test_prefix_theorem_without_replacement(inst):
    """Brute-force minimum over all subsets equals the minimum over ratio-sorted prefixes."""
    p, q, k = inst
    if np.count_nonzero(q > 0) < k:
        return
    joint = ob.draft_joint(q, k, "without_replacement")
    brute = ob.optimal_acceptance_brute_force(p, joint).value
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, p / q, np.inf)
    order = np.argsort(ratio, kind="stable")
    prefix_min = min(
        p[order[:m]].sum() - _enumerated_mass(joint, order[:m]) for m in range(p.size + 1)
    )
    assert abs(1 + min(0.0, prefix_min) - brute) < AGREE


def _enumerated_mass(joint, subset):
    inside = np.zeros(joint.shape[0], dtype=bool)
    inside[subset] = True
    mask = inside
    for _ in range(joint.ndim - 1):
        mask = np.logical_and.outer(mask, inside)
    return joint[mask].sum()


def test_lp_plan_is_a_coupling_with_the_optimal_acceptance():
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
    joint = ob.draft_joint(q, 2, "without_replacement")
    res = ob.optimal_acceptance_lp(p, joint, return_plan=True)
    plan = res.plan
    assert plan.shape == (4, 4, 4) and plan.min() >= 0
    np.testing.assert_allclose(plan.sum(axis=-1), joint, atol=1e-12)
    np.testing.assert_allclose(plan.sum(axis=(0, 1)), p, atol=1e-12)
    accepted = sum(plan[a, b, y] for a, b, y in itertools.product(range(4), repeat=3) if y in (a, b))
    assert abs(accepted - res.value) < 1e-12
    assert abs(res.value - ob.optimal_acceptance(p, q, 2, "without_replacement")) < AGREE
    # LP duals certify optimality: Σ Q u + Σ p v == α*, u + v >= 1 on every accepting pair
    assert isinstance(res.dual, ob.LPDual)
    u, v = res.dual.drafts, res.dual.tokens
    support = res.dual.support
    assert abs(joint[tuple(support.T)] @ u + p @ v - res.value) < 1e-8
    for a, tup in enumerate(support):
        for y in set(tup.tolist()):
            assert u[a] + v[y] >= 1 - 1e-8


@pytest.mark.parametrize("law", LAWS)
def test_single_draft_is_one_minus_tv(law):
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(9) * 0.5), rng.dirichlet(np.ones(9) * 0.5)
        assert abs(ob.optimal_acceptance(p, q, 1, law) - np.minimum(p, q).sum()) < 1e-12


def test_greedy_closed_form_and_known_vectors():
    p = np.array([0.3, 0.4, 0.3])
    q = np.array([0.6, 0.3, 0.1])
    # G = {a}; q' = [0, 3/4, 1/4]; α* = p(a) + min(.4, .75) + min(.3, .25) = 0.95
    assert abs(ob.optimal_acceptance(p, q, 2, "greedy") - 0.95) < 1e-15
    # i.i.d., K = 2: ratios a .5, b 4/3, c 3; H* = {a, b}: 1 + 0.7 − 0.9² = 0.89 (H = {a}: 0.94)
    res = ob.optimal_acceptance(p, q, 2, return_certificate=True)
    assert abs(res.value - 0.89) < 1e-15 and res.binding_set.tolist() == [True, True, False]
    assert ob.optimal_acceptance(p, p, 3) == 1.0


def test_more_drafts_never_hurt_and_without_replacement_dominates():
    rng = np.random.default_rng(1)
    for _ in range(30):
        p, q = rng.dirichlet(np.ones(12) * 0.3), rng.dirichlet(np.ones(12) * 0.3)
        wr = [ob.optimal_acceptance(p, q, k) for k in range(1, 6)]
        wor = [ob.optimal_acceptance(p, q, k, "without_replacement") for k in range(1, 6)]
        assert np.all(np.diff(wr) >= -1e-12) and np.all(np.diff(wor) >= -1e-12)
        # drawing without replacement is a (coarser) garbling-free improvement on i.i.d. drafts
        assert all(b >= a - 1e-9 for a, b in zip(wr, wor))


def test_relaxations_bracket_the_optimum():
    rng = np.random.default_rng(2)
    for law in LAWS:
        for _ in range(10):
            p, q = rng.dirichlet(np.ones(6) * 0.4), rng.dirichlet(np.ones(6) * 0.4)
            q = np.maximum(q, 1e-3)
            q /= q.sum()
            r = ob.relaxation_bounds(p, q, 3, law)
            a = ob.optimal_acceptance(p, q, 3, law)
            assert r.lower - 1e-12 <= a <= r.upper + 1e-12
    incl = inclusion_probabilities(q, 3, "without_replacement")
    joint = ob.draft_joint(q, 3, "without_replacement")
    marg = [sum(joint[t] for t in itertools.product(range(6), repeat=3) if y in t) for y in range(6)]
    np.testing.assert_allclose(incl, marg, atol=1e-12)


def test_wor_mass_near_complete_sets():
    """Q(H) when 1 − q(H) is tiny: the regime where naive quadrature returned 0 instead of 1."""
    q = np.array([0.5, 0.3, 0.2 - 1e-13, 1e-13])
    joint = ob.draft_joint(q, 2, "without_replacement")
    for h in ([0, 1, 2], [0, 1], [1, 2]):
        assert abs(ob.subset_mass(q, h, 2, "without_replacement") - _enumerated_mass(joint, h)) < 1e-12


@pytest.mark.parametrize("law", LAWS)
def test_batches_and_torch(law):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.ones(50) * 0.2, size=(2, 3))
    q = rng.dirichlet(np.ones(50) * 0.2, size=(2, 3))
    batch = ob.optimal_acceptance(p, q, 3, law)
    assert batch.shape == (2, 3)
    rows = [[ob.optimal_acceptance(p[i, j], q[i, j], 3, law) for j in range(3)] for i in range(2)]
    np.testing.assert_allclose(batch, rows, atol=1e-14)
    t = ob.optimal_acceptance(torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32), 3, law)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.shape == (2, 3)
    np.testing.assert_allclose(t.numpy(), batch, atol=1e-6)  # float32 inputs: rows renormalised


def _with_replacement_sorted(P, Q, k):
    """Plain O(V log V) reference: numpy's stable argsort by ratio, cumulative sums, min over prefixes."""
    with np.errstate(divide="ignore", invalid="ignore"):
        order = np.argsort(np.where(Q > 0, P / Q, np.inf), axis=1, kind="stable")
    cp = np.cumsum(np.take_along_axis(P, order, axis=1), axis=1)
    cq = np.cumsum(np.take_along_axis(Q, order, axis=1), axis=1)
    return 1.0 + np.minimum(0.0, np.min(cp - cq**k, axis=1))


def test_with_replacement_matches_plain_sort_at_lm_scale():
    rng = np.random.default_rng(7)
    z = rng.standard_normal((3, 151_936)) * 2.5
    def softmax(x):
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    p, q = softmax(z + rng.standard_normal(z.shape)), softmax(z)
    for k in (1, 2, 4, 8):
        np.testing.assert_allclose(ob.optimal_acceptance(p, q, k), _with_replacement_sorted(p, q, k), atol=1e-12)


@pytest.mark.parametrize(
    "p, q, k, law, message",
    [
        ([0.5, 0.6], [0.5, 0.5], 2, "with_replacement", "does not sum to 1"),
        ([1.2, -0.2], [0.5, 0.5], 2, "with_replacement", "negative"),
        ([np.nan, 1.0], [0.5, 0.5], 2, "with_replacement", "NaN"),
        ([0.5, 0.5], [0.2, 0.3, 0.5], 2, "with_replacement", "same shape"),
        ([0.5, 0.5], [0.5, 0.5], 0, "with_replacement", "at least 1"),
        ([0.5, 0.5], [0.5, 0.5], 2.0, "with_replacement", "integer"),
        ([0.3, 0.3, 0.4], [0.5, 0.5, 0.0], 3, "without_replacement", "exceeds the support"),
        ([0.3, 0.3, 0.4], [1.0, 0.0, 0.0], 2, "greedy", "exceeds the support"),
        ([0.5, 0.5], [0.5, 0.5], 2, "top_k", "unknown sampling"),
        ([], [], 1, "with_replacement", "empty"),
    ],
)
def test_bad_input_is_named(p, q, k, law, message):
    with pytest.raises(ob.InvalidInputError, match=message):
        ob.optimal_acceptance(np.asarray(p), np.asarray(q), k, law)


def test_bad_joint_law():
    with pytest.raises(ob.InvalidInputError, match="shape"):
        ob.optimal_acceptance_lp([0.5, 0.5], np.ones((3, 3)) / 9)
    with pytest.raises(ob.InvalidInputError, match="does not sum to 1"):
        ob.optimal_acceptance_lp([0.5, 0.5], np.ones((2, 2)))
    with pytest.raises(ob.InvalidInputError, match="V <= 20"):
        ob.optimal_acceptance_brute_force(np.ones(21) / 21, np.ones(21) / 21)


@pytest.mark.parametrize("q, k", [([0.4, 0.3, 0.2, 0.1], 2), ([0.97, 0.01, 0.01, 0.01], 3)])
def test_sampled_drafts_follow_their_law(q, k):
    """Chi-square of 3e5 sampled tuples against draft_joint (the peaked q exercises the fallback
    of the rejection sampler without replacement). Level 1e-3; up to 64 tuples: worst-case power
    ≥ 0.9998 against any 1%-TV distortion (asserted for the actual bins; 2e5 had 0.978)."""
    from conftest import pooled_g_test

    q = np.asarray(q)
    for law in LAWS:
        joint = ob.draft_joint(q, k, law).ravel()
        drafts = ob.sample_drafts(q, k, law, size=300_000, rng=11)
        counts = np.bincount(np.ravel_multi_index(drafts.T, (4,) * k), minlength=4**k)
        assert pooled_g_test(counts, joint, power=0.99) > 1e-3, law  # the kit's G-test, power asserted


@pytest.mark.parametrize("k", [2, 3, 4, 8, 16])
def test_fast_without_replacement_matches_reference_dp(k):
    """The fast clock-integral path against the token-by-token reference DP at V = 2,000."""
    from otbound.token._search import _without_replacement_reference, without_replacement

    rng = np.random.default_rng(k)
    z = rng.standard_normal((2, 2000)) * 2.0
    e = np.exp(z - z.max(1, keepdims=True))
    q = e / e.sum(1, keepdims=True)
    e = np.exp(z + rng.standard_normal(z.shape) - z.max(1, keepdims=True))
    p = e / e.sum(1, keepdims=True)
    fast, sets = without_replacement(p, q, k, True)
    ref, _ = _without_replacement_reference(p, q, k, False)
    np.testing.assert_allclose(fast, ref, atol=1e-12)
    # the fast path's certificate, rebuilt from its token chains, attains the value: 1 + p(H) − Q(H)
    for i in range(2):
        h = sets[i]
        assert abs(1 + p[i][h].sum() - ob.subset_mass(q[i], h, k, "without_replacement") - fast[i]) < 1e-10


@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_public_without_replacement_matches_reference_dp_on_adversarial_families(k):
    """The public α* without replacement against the token-by-token reference DP at V = 2,000 on
    near-deterministic, flat-topped, disjoint, Zipf and Dirichlet laws (within 1e-12): the families
    of experiments/bench_token_bounds.py, whose accuracy table checks each value against its certificate."""
    import importlib
    import sys
    from pathlib import Path

    from otbound.token._search import _without_replacement_reference

    experiments = str(Path(__file__).resolve().parents[1] / "experiments")
    sys.path.insert(0, experiments)
    try:
        bench = importlib.import_module("bench_token_bounds")
    finally:
        sys.path.remove(experiments)
    for name, p, q in bench.adversarial_families(2000, np.random.default_rng(8)):
        q = q / q.sum()
        ref, _ = _without_replacement_reference(p[None], q[None], k, False)
        value = ob.optimal_acceptance(p, q, k, "without_replacement")
        assert abs(value - ref[0]) < 1e-12, (name, k, value, ref[0])


@pytest.mark.parametrize("k", [3, 4])
def test_ratio_sorted_rows_give_the_same_value(k):
    """without_replacement_ratio_sorted (bucket sums and moments by runs of the sorted row, buckets as
    slices) against optimal_acceptance on the unsorted rows: V = 2,000 LM-like rows, many tied
    ratios, and a q whose negligible tokens below 1e-300 clock_law drops (that row is re-bucketed
    unsorted)."""
    from otbound.token._search import without_replacement_ratio_sorted

    rng = np.random.default_rng(20 + k)
    z = rng.standard_normal((3, 2000)) * 2.5
    q = np.exp(z - z.max(1, keepdims=True))
    p = q * np.exp(rng.standard_normal(z.shape))
    p[1] = q[1] * rng.integers(1, 4, 2000)  # many tied ratios
    q[2, :5] = 1e-310  # negligible: dropped by clock_law
    p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
    with np.errstate(divide="ignore", over="ignore"):
        order = np.argsort(np.where(q > 0, p / q, np.inf), axis=1, kind="stable")
    ps, qs = np.take_along_axis(p, order, 1), np.take_along_axis(q, order, 1)
    np.testing.assert_allclose(without_replacement_ratio_sorted(ps, qs, k),
                               ob.optimal_acceptance(p, q, k, "without_replacement"), rtol=0, atol=1e-12)
    with pytest.raises(ob.InvalidInputError, match="sorted by ratio"):
        without_replacement_ratio_sorted(p[:1], q[:1], k)  # not sorted


def test_key_sums_by_runs_equal_bincount():
    from otbound.token._wor import KeySums

    rng = np.random.default_rng(22)
    keys = np.sort(rng.integers(0, 50, 1000))
    w = rng.random(1000)
    sums = KeySums(keys, 60, keys_sorted=True)
    assert sums.starts is not None  # the runs path, not the bincount fallback
    np.testing.assert_allclose(sums(w), np.bincount(keys, weights=w, minlength=61), rtol=1e-13, atol=0)
    idx = np.flatnonzero(w > 0.5)
    np.testing.assert_allclose(sums.subset(idx)(w[idx]), np.bincount(keys[idx], weights=w[idx], minlength=61),
                               rtol=1e-13, atol=0)
    shuffled = rng.permutation(keys)  # claimed sorted but not: verified on the run starts, bincount instead
    unsorted = KeySums(shuffled, 60, keys_sorted=True)
    assert unsorted.starts is None
    np.testing.assert_array_equal(unsorted(w), np.bincount(shuffled, weights=w, minlength=61))
    np.testing.assert_array_equal(KeySums(np.zeros(0, dtype=np.int64), 5, True)(np.zeros(0)), np.zeros(6))


def test_shared_run_moments_equal_the_per_k_sums():
    """The run moments shared by the K of a ratio-sorted row (one pass at θ_c, rescaled, the tokens
    between θ_c and θ added) equal the direct per-K moment sums, weighted as the power sums use them
    (c_{jn} x0^n), to 1e-13 relative: reused at a larger and at a smaller θ ≥ θ_c, extended when the
    cut grows, rebuilt when θ falls below θ_c."""
    from otbound.token._search import RowRuns
    from otbound.token._wor import _SERIES_SPAN, ClockMass, KeySums

    rng = np.random.default_rng(23)
    v = 3000
    z = rng.standard_normal(v) * 3.0
    q = np.exp(z) / np.exp(z).sum()
    p = np.exp(z + rng.standard_normal(v))
    p /= p.sum()
    order = np.argsort(p / q, kind="stable")
    p, q = p[order], q[order]
    runs = RowRuns(p, q)
    n_runs = runs.starts.size
    shared = runs.moments
    thetas = []
    for k, t_end, n in ((3, 50.0, n_runs // 2), (4, 60.0, n_runs), (3, 20.0, n_runs // 3), (5, 2000.0, n_runs)):
        ev = ClockMass(k, t_end)
        sums = KeySums.from_runs(runs.starts[: n + 1], np.arange(min(n + 1, n_runs)), n, v)
        direct = ev.bucket_features(q, sums, n)
        got = ev.bucket_features(q, sums, n, moments=shared)
        assert got.shape == direct.shape == (n, ev.order)
        weight = ev.coef.max(0) * (_SERIES_SPAN / ev.j_max) ** np.arange(1, ev.order + 1)
        err = np.abs(np.cumsum(got, 0) - np.cumsum(direct, 0)) @ weight
        assert np.all(err <= 1e-13 * (1.0 + np.cumsum(direct, 0) @ weight)), (k, t_end, err.max())
        assert (q > ev.theta).any() and ((q > shared.theta_c) & (q <= ev.theta)).any()  # both kinds of token
        thetas.append(shared.theta_c)
    assert thetas[0] == thetas[1] == thetas[2] != thetas[3]  # reused, then rebuilt below θ_c


@pytest.mark.parametrize("k", [3, 4])
def test_rows_searched_in_lockstep_equal_rows_searched_alone(monkeypatch, k):
    """The rows of a ratio-sorted batch are searched in lockstep (one evaluation per round for all
    rows, the positions of rows whose grids have as many nodes stacked, each with its own nodes,
    weights and t_end): equal to each row searched alone to 1e-13, on rows whose horizons differ by
    orders of magnitude (peaked, near-deterministic, flat, LM-like, tied), and the stacked path runs."""
    from otbound.token import _search, _wor

    rng = np.random.default_rng(24)
    v = 2000

    rows = []
    for scale in (6.0, 6.0, 0.3, 0.3, 2.5, 2.5):
        z = rng.standard_normal(v) * scale
        rows.append((_softmax(z + rng.standard_normal(v)), _softmax(z)))
    d = np.full(v, 1e-9)
    d[0] = 1.0
    rows.append((_softmax(rng.standard_normal(v)), d / d.sum()))  # near-deterministic draft
    tied = np.round(rng.standard_normal((2, v)) * 2.5)
    rows.append((_softmax(tied[0]), _softmax(tied[1])))
    p, q = np.array([a for a, _ in rows]), np.array([b for _, b in rows])
    order = np.argsort(p / q, axis=1, kind="stable")
    ps, qs = np.take_along_axis(p, order, 1), np.take_along_axis(q, order, 1)
    t_ends, stacked = [], []
    make, stack = _wor.ClockMass.__init__, _wor._mass_stacked

    def counted(self, num_drafts, t_end, grids=None):
        make(self, num_drafts, t_end, grids)
        t_ends.append(self.t_end)

    def counted_stack(asks):
        stacked.append(len(asks))
        return stack(asks)

    monkeypatch.setattr(_wor.ClockMass, "__init__", counted)
    monkeypatch.setattr(_wor, "_mass_stacked", counted_stack)
    together = _search.without_replacement_ratio_sorted(ps, qs, k)
    assert stacked and max(stacked) >= 2
    assert max(t_ends) / min(t_ends) > 100  # horizons orders of magnitude apart
    alone = [_search.without_replacement_ratio_sorted(ps[i : i + 1], qs[i : i + 1], k)[0] for i in range(len(rows))]
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-13)
    np.testing.assert_allclose(together, ob.optimal_acceptance(p, q, k, "without_replacement"), rtol=0, atol=1e-12)


def test_largest_entries_by_group_maxima_equal_a_full_sort():
    """The largest q's of a row (found among the groups with the largest maxima) are those of a full
    sort, by decreasing q with equal q in index order, on random, tied and short rows."""
    from otbound.token._search import _largest

    rng = np.random.default_rng(25)
    for trial in range(60):
        v = int(rng.integers(10, 40_000))
        n = min(int(rng.integers(1, 70)), v)
        q = rng.random(v) if trial % 2 else np.round(rng.random(v) * 4) / 4  # many ties
        got = _largest(q, n)
        np.testing.assert_array_equal(q[got], np.sort(q)[::-1][:n])
        assert np.unique(got).size == n
        assert np.all(np.diff(got)[np.diff(q[got]) == 0] > 0)


def test_sampled_run_starts_equal_the_full_pass():
    """The runs of equal bucket id of a ratio-sorted row, found from every 16th position's id and the
    gaps where it changes, equal those of the ids of every position (:func:`_ratio_buckets`), on rows
    with many tied ratios, zeros in q (ratio inf, 0/0 last), one run per position, a single run,
    runs ending on and beside the sampled positions, and lengths 1 to 40,000; a row out of ratio
    order is refused, and each run's tokens are its positions."""
    from otbound.token._search import RowRuns, _ratio_buckets, _run_starts, _run_tokens

    rng = np.random.default_rng(26)
    cases = []
    for trial in range(40):
        v = int(rng.integers(1, 40_000)) if trial > 3 else (1, 2, 16, 17)[trial]
        q = rng.random(v) + 0.01
        kind = trial % 5
        if kind == 0:
            p = q * np.exp(rng.standard_normal(v) * 3.0)
        elif kind == 1:  # few distinct ratios: long tied runs
            p = q * rng.integers(1, 4, v)
        elif kind == 2:  # zeros in q: inf and 0/0 ratios
            p = rng.random(v)
            q[rng.random(v) < 0.3] = 0.0
            p[rng.random(v) < 0.1] = 0.0
        elif kind == 3:  # ratios 2^(j/32 + 1/64): one bucket per position
            p = q * 2.0 ** ((np.arange(v) + 0.5) / 32.0 - 20.0)
        else:  # one ratio
            p = 3.0 * q
        cases.append((p, q))
    steps = np.repeat(np.arange(40), np.tile([15, 16, 17, 1], 10))  # runs ending at, before, after samples
    q = np.full(steps.size, 0.5)
    cases.append((q * 2.0 ** (steps / 32.0 + 1.0 / 64.0), q))
    for p, q in cases:
        with np.errstate(divide="ignore", invalid="ignore"):
            order = np.argsort(np.where(q > 0, p / q, np.inf), kind="stable")
        p, q = p[order], q[order]
        b, _ = _ratio_buckets(p, q, np.inf)
        full = np.concatenate([[0], np.flatnonzero(b[1:] != b[:-1]) + 1])
        starts, at = _run_starts(p, q)
        np.testing.assert_array_equal(starts, full)
        np.testing.assert_array_equal(at, b[full])
        runs = RowRuns(p, q)
        np.testing.assert_array_equal(runs.b, b)
        for r in (0, starts.size // 2, starts.size - 1):
            with np.errstate(divide="ignore", invalid="ignore"):  # the last run may hold q = 0 (never opened)
                toks, ratio, pt, qt = _run_tokens(runs, r, p, q)
                np.testing.assert_array_equal(ratio, p[toks] / q[toks])
                np.testing.assert_array_equal(pt, p[toks])
                np.testing.assert_array_equal(qt, q[toks])
            np.testing.assert_array_equal(toks, np.flatnonzero(b == at[r]))
    p, q = cases[5]
    with pytest.raises(ob.InvalidInputError, match="sorted by ratio"):
        _run_starts(p, q)  # not sorted


@pytest.mark.parametrize("k", [2, 3, 4])
def test_stretch_bounds_never_exceed_f_inside_the_stretch(monkeypatch, k):
    """Every stretch bound of the search (p bounded by both lines, from the stretch's start and from
    its end, Q by the quadratic and by Q at the end) is at most f = p(H) − Q(H) at every prefix H
    of the stretch, Q(H) by the reference DP at every prefix of the ratio order (to 1e-12), on
    ratio-sorted rows: LM-like, peaked, flat, tied ratios, zeros in q, a near-deterministic draft;
    and the search's α* equals the reference's."""
    from otbound.token import _search
    from otbound.token._wor import wor_prefix_mass

    rng = np.random.default_rng(27)
    v = 2000

    rows = []
    for scale in (2.5, 6.0, 0.3):
        z = rng.standard_normal(v) * scale
        rows.append((_softmax(z + rng.standard_normal(v)), _softmax(z)))
    tied = np.round(rng.standard_normal((2, v)) * 2.5)
    rows.append((_softmax(tied[0]), _softmax(tied[1])))
    z = rng.standard_normal(v) * 2.5
    q = _softmax(z)
    q[rng.random(v) < 0.2] = 0.0
    rows.append((_softmax(z + rng.standard_normal(v)), q / q.sum()))
    d = np.full(v, 1e-9)
    d[0] = 1.0
    rows.append((_softmax(rng.standard_normal(v)), d / d.sum()))
    bounds = _search._bounds
    checked = 0
    for p, q in rows:
        with np.errstate(divide="ignore"):
            order = np.argsort(np.where(q > 0, p / q, np.inf), kind="stable")
        p, q = p[order], q[order]
        f_ref = np.concatenate([[0.0], np.cumsum(p) - wor_prefix_mass(q, np.arange(v), k)])  # (V + 1,) by length
        starts = np.append(_search.RowRuns(p, q).starts, v)
        seen = []

        def recorded(asks, answers, seen=seen):
            found = bounds(asks, answers)
            seen.append(([ask.parts for ask in asks], found))
            return found

        monkeypatch.setattr(_search, "_bounds", recorded)
        value = _search.without_replacement_ratio_sorted(p[None], q[None], k)[0]
        monkeypatch.setattr(_search, "_bounds", bounds)
        np.testing.assert_allclose(value, 1.0 + min(0.0, f_ref.min()), rtol=0, atol=1e-12)
        for (parts,), ((_, bound),) in seen:
            start = 0
            for ch, pts, nxt in parts:
                lengths = starts[:nxt.max() + 1] if ch.toks is None else ch.toks[0] + np.arange(ch.fp.size)
                for lo, hi, b in zip(pts, nxt, bound[start : start + pts.size]):
                    if hi > lo:
                        assert b <= f_ref[lengths[lo] : lengths[hi] + 1].min() + 1e-12, (k, lo, hi)
                        checked += 1
                start += pts.size
    assert checked > 200


def test_kth_largest_top_q_inside_each_prefix():
    """The k-th largest q of the top tokens inside each bucket-chain prefix H_m (for the clock
    integral's cut-off times), by a binary search over the prefixes' k-th smallest bucket
    positions, equals a direct count and sort per prefix, with tied positions, tokens above the
    cut (position nb), fewer top tokens than k, and k = 2..6."""
    from otbound.token._search import _kth_inside

    rng = np.random.default_rng(28)
    for trial in range(80):
        nb = int(rng.integers(1, 300))
        n_top = int(rng.integers(1, 70))
        k = int(rng.integers(2, 7))
        pos = rng.integers(0, nb + 1, n_top)  # nb: above the cut
        if trial % 3 == 0:
            pos = np.sort(pos)[::-1].copy()
        q_top = np.sort(rng.random(n_top))[::-1]
        if trial % 4 == 0:
            q_top = np.round(q_top * 4) / 4  # ties in q
        has_k, kth = _kth_inside(pos, q_top, k, nb)
        for m in range(nb):
            inside = np.sort(q_top[pos <= m])[::-1]
            assert has_k[m] == (inside.size >= k)
            if inside.size >= k:
                assert kth[m] == inside[k - 1]


@pytest.mark.parametrize("k", [3, 4])
def test_binding_sets_of_ratio_sorted_rows_are_prefixes_attaining_the_value(k):
    """On rows sorted by ratio, searched by runs, the binding set is a prefix of the row (bucket
    ends and tokens inside a bucket) whose p(H) − Q(H), Q by the reference DP, is α* − 1 (to 1e-12),
    on LM-like, tied and peaked rows."""
    from otbound.token._search import without_replacement
    from otbound.token._wor import wor_prefix_mass

    rng = np.random.default_rng(29)
    v = 2000
    rows = []
    for scale in (2.5, 6.0):
        z = rng.standard_normal(v) * scale
        rows.append((np.exp(z + rng.standard_normal(v)), np.exp(z)))
    tied = np.round(rng.standard_normal((2, v)) * 2.5)
    rows.append((np.exp(tied[0]), np.exp(tied[1])))
    p, q = np.array([a for a, _ in rows]), np.array([b for _, b in rows])
    p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
    order = np.argsort(p / q, axis=1, kind="stable")
    ps, qs = np.take_along_axis(p, order, 1), np.take_along_axis(q, order, 1)
    values, sets = without_replacement(ps, qs, k, True, ratio_sorted=True)
    for i in range(len(rows)):
        n = int(sets[i].sum())
        assert n > 0 and sets[i, :n].all()  # a prefix of the sorted row
        f = ps[i, :n].sum() - wor_prefix_mass(qs[i], np.arange(n), k)[-1]
        np.testing.assert_allclose(f, values[i] - 1.0, rtol=0, atol=1e-12)
        np.testing.assert_allclose(values[i], ob.optimal_acceptance(p[i], q[i], k, "without_replacement"),
                                   rtol=0, atol=1e-12)


def test_chain_moment_sums_by_blocks_equal_running_sums():
    """The moment sums along a token chain (low orders by blocks of tokens on long chains, by
    running sums on short ones; high orders over the few large tokens) equal base + the running
    sums of y^1..y^N at every position, to 1e-13 relative (sums of positive terms), on chains of
    1 to 5,000 tokens around the block and length thresholds, with zeros (exact tokens) and large y."""
    from otbound.token._wor import BlockSums, ClockMass, _ChainSums

    rng = np.random.default_rng(30)
    ev = ClockMass(3, 1e4)
    for n in (1, 2, 31, 32, 33, 2047, 2048, 2049, 2100, 5000):
        y = rng.random(n) ** 3 * 0.5
        y[rng.random(n) < 0.1] = 0.0  # exact tokens: no moments
        y[rng.random(n) < 0.05] = 1.0  # large y: every order
        base = rng.random(ev.order)
        sums = _ChainSums(base, y, ev.order, ev.limit)
        assert sums.low_sums.block == (1 if n <= BlockSums.SHORT else BlockSums.BLOCK)
        full = base + np.concatenate([np.zeros((1, ev.order)), np.cumsum(y[:, None] ** np.arange(1, ev.order + 1), 0)])
        idx = np.arange(n + 1)
        got = sums[idx]
        np.testing.assert_allclose(got, full, rtol=1e-13, atol=0)
        np.testing.assert_allclose(sums[idx[::-7]], full[::-7], rtol=1e-13, atol=0)  # any order of positions


def _plain_integrals(ev, feats, out, exact, out_next):
    """Q and the stretch-bound coefficients (D1, C2, C3) of :func:`otbound.token._wor._integrals`
    written as plain array expressions, one (npos, T) array per term (the reference for its in-place form)."""
    from otbound.token._wor import _X_CAP

    t, wt, t_end, t_lo, jm = ev.t[None, :], ev.wt[None, :], ev.t_end, ev.t_lo, ev.j_max
    psum, lam = ev._power_sums(feats)
    g = np.exp(-lam)
    e = [np.ones_like(g)]
    for a in range(1, jm + 1):  # Newton's identities: a e_a = Σ_j (−1)^{j−1} e_{a−j} P_j
        e.append(sum((-1) ** (j - 1) * e[a - j] * psum[:, j - 1] for j in range(1, a + 1)) / a)
    small = [g * sum(e[: m + 1]) for m in range(jm + 1)]  # P[N_small ≤ m]
    if exact is None:
        below = small
    else:
        _, e_ex, sx = exact
        with np.errstate(divide="ignore"):  # e'_b = 0 (fewer than b exact tokens): probability 0
            p_ex = [np.exp(-sx)] + [np.exp(np.log(e_ex[b - 1]) + b * _X_CAP - sx) for b in range(1, jm + 1)]
        below = [sum(p_ex[b] * small[m - b] for b in range(m + 1)) for m in range(jm + 1)]
    q_mass = np.clip(out * (wt * np.exp(-out[:, None] * t) * (1.0 - below[jm])).sum(1) + np.exp(-out * t_end), 0, 1)
    oe = out_next[:, None]
    decay = wt * np.exp(-oe * t)
    tail = np.exp(-out_next * t_end) * below[jm][:, -1] / out_next
    moments = [tail]
    for m in range(1, 4):
        moments.append(t_end**m * tail + m * moments[-1] / out_next)
    d1 = (decay * (1 - oe * t) * below[jm]).sum(1) + t_lo + moments[0]
    d1 = d1 + out * ((decay * t * (below[jm] - below[jm - 1])).sum(1) + t_lo**2 / 2 + moments[1])
    c2 = out * ((decay * t**2 * (below[jm - 1] - below[jm - 2])).sum(1) + t_lo**3 / 3 + moments[2])
    c3 = out * ((decay * t**3 * below[jm - 2]).sum(1) + t_lo**4 / 4 + moments[3])
    return q_mass, d1, c2, c3


@pytest.mark.parametrize("k", [3, 4, 5])
def test_clock_integrals_in_place_equal_the_plain_expressions(k):
    """Q(H) and the stretch-bound coefficients at every prefix of a ratio-sorted row, evaluated alone
    (:meth:`ClockMass.mass`) and stacked with a second row on another grid of as many nodes
    (:func:`otbound.token._wor.evaluate_many`), equal the plain expressions of the clock integral
    (Newton's identities, the exact tokens' law mixed in, the quadrature and its tails; sums in
    another order, the exact law always through logarithms) to rounding: Q to 1e-15 absolute (it
    is ≤ 1), D1, C2, C3 to 1e-13 relative or 1e-15 of their largest value; with exact tokens at every
    node (a peaked q), without any (a flat q), and with Σx above 700 (at K = 5 banded: exact only where large)."""
    from otbound.token import _wor

    rng = np.random.default_rng(41)
    v = 600
    rows = []
    for scale in (6.0, 0.3):  # many exact tokens; none
        z = rng.standard_normal(v) * scale
        rows.append(np.sort(_softmax(z)))
    checked = 0
    for q, t_end in ((rows[0], 2e3), (rows[1], 50.0), (rows[0], 1e8)):
        ev = _wor.ClockMass(k, t_end)
        twin = _wor.ClockMass(k, t_end * 1.001)  # another grid, as many nodes (stacked with ev's)
        assert twin.t.size == ev.t.size and not np.array_equal(twin.t, ev.t)
        exact = np.flatnonzero(ev.is_exact(q))
        ev.start(q[exact])
        chain = ev.chain_features(np.zeros(ev.order), q)  # moments after 0..v tokens (exact ones add none)
        pos = np.arange(1, v + 1)  # the prefixes of 1..v tokens
        feats = chain[pos]
        out = np.append(np.cumsum(q[::-1])[::-1], 0.0)[pos] + 1e-3  # q outside each prefix, kept > 0
        out_next = np.append(out[1:], out[-1] * 0.5)
        inside = 1.0 - out
        states = None
        if ev.has_exact:
            keep = np.searchsorted(exact, pos, side="left") - 1  # the last exact token in each prefix
            states = ev.run_exact(q[exact], ev.start(q[exact]), keep)
            if t_end > 1e5:
                assert states[2].max() > _wor._EXP_SAFE  # Σx > 700: the logarithm path
        want = _plain_integrals(ev, feats, out, states, out_next)
        alone = ev.mass(feats, out, inside, states, out_next)
        stacked = _wor.evaluate_many([(ev, (feats, out, inside, states, out_next)),
                                      (twin, (feats[:7], out[:7], inside[:7], None, out_next[:7]))])
        for got in (alone, stacked[0]):
            np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-15)  # Q ∈ [0, 1]
            for g, w in zip(got[1:], want[1:]):
                np.testing.assert_allclose(g, w, rtol=1e-13, atol=1e-15 * np.abs(w).max())
        checked += int(ev.has_exact)
    assert checked == 2
