"""The single public calls' own paths (rows not sorted by ratio): each against an independent
reference and against the sorted kernel that ``measure_laws`` reads.

* RRS acceptance on rows not sorted sums ``h(μ) = Σ (p − μ q)_+`` directly; the reference is the
  verifier's definition (round i rejects with ``Σ (q − p_i)_+``, ``p_{i+1} = norm((p_i − q)_+)``).
* α* without replacement on rows as given (the branch and bound evaluates long token chains whole
  and bounds only the stretches it may keep); the reference is the token-by-token DP.
* The largest q of a long row from column maxima; the reference is a stable sort of −q.
* α* with replacement (ratio buckets), greedy and deterministic (the largest q) on numpy laws as
  given, checked on the way; the references are the prefix minimum over a stable sort (exact
  prefix sums where α* is tiny), the laws' definitions, the sorted kernel, and LawBatch's refusals
  and messages for bad laws.
"""

import numpy as np
import pytest

import otbound as ob
from otbound.token import LawBatch
from otbound.token._kernel import _AS_GIVEN_ROW, _SMALL_ROW
from otbound.token._search import _without_replacement_reference


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _rows(kind, v, seed):
    rng = np.random.default_rng(seed)
    if kind == "ties":  # integer logits: many exactly equal ratios
        return (_softmax(np.round(rng.standard_normal(v) * 2.5)), _softmax(np.round(rng.standard_normal(v) * 2.5)))
    if kind == "zeros":  # zeros in p and in q
        p, q = rng.dirichlet(np.ones(v)), rng.dirichlet(np.ones(v))
        p[rng.random(v) < 0.3] = 0.0
        q[rng.random(v) < 0.3] = 0.0
        q[np.argmax(p)] = 0.5  # q > 0 where p is largest
        return p / p.sum(), q / q.sum()
    z = rng.standard_normal(v) * 2.0
    return _softmax(z + rng.standard_normal(v)), _softmax(z)


def _rrs_reference(p, q, k):
    """1 − P(all K rounds reject), from the residual recursion of the verifier's definition."""
    reject, law = 1.0, p.copy()
    for _ in range(k):
        excess = np.maximum(q - law, 0.0)
        rej = excess.sum()
        reject *= rej
        if rej <= 0.0:
            return 1.0
        res = np.maximum(law - q, 0.0)
        law = res / res.sum()
    return 1.0 - reject


@pytest.mark.parametrize("kind", ["lm", "ties", "zeros"])
@pytest.mark.parametrize("v", [2, 7, 100, 3000])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_rrs_acceptance_of_unsorted_rows_matches_its_definition_and_the_sorted_kernel(kind, v, k):
    p, q = _rows(kind, v, seed=v + k)
    got = ob.VERIFIERS["rrs"].acceptance(p, q, k)  # one row: no sort
    assert got == pytest.approx(_rrs_reference(p, q, k), abs=1e-13)
    batch = LawBatch(p, q)
    _ = batch.sorted  # the measurement's path: the sorted prefix sums
    assert got == pytest.approx(float(ob.VERIFIERS["rrs"].batch_acceptance(batch, k)[0]), abs=1e-13)


def test_rrs_acceptance_of_a_batch_not_sorted_is_per_row():
    rows = [_rows("lm", 50, s) for s in range(3)]
    P, Q = np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
    got = ob.VERIFIERS["rrs"].acceptance(P, Q, 3)
    assert got.shape == (3,)
    np.testing.assert_allclose(got, [_rrs_reference(p, q, 3) for p, q in rows], atol=1e-13, rtol=0)


@pytest.mark.parametrize("kind", ["ties", "lm"])
@pytest.mark.parametrize("k", [2, 3])
def test_without_replacement_single_call_matches_the_reference_dp(kind, k):
    for seed in range(3):
        p, q = _rows(kind, 4000, seed)
        ref = _without_replacement_reference(p[None], q[None], k, False)[0][0]
        got = ob.optimal_acceptance(p, q, k, "without_replacement")
        assert got == pytest.approx(ref, abs=1e-12)
        batch = LawBatch(p, q)
        _ = batch.sorted  # the sorted kernel's value
        assert got == pytest.approx(float(batch.optimal_acceptance(k, "without_replacement")[0]), abs=1e-12)


@pytest.mark.parametrize("m", [1, 2, 4])
def test_top_tokens_are_the_first_of_a_stable_sort_of_minus_q(m):
    from otbound.token._kernel import top_tokens

    rng = np.random.default_rng(m)
    for _ in range(20):
        q = rng.integers(0, 4, size=int(rng.integers(m, 40))).astype(float)  # many ties, the largest tied too
        np.testing.assert_array_equal(top_tokens(q, m), np.argsort(-q, kind="stable")[:m])


@pytest.mark.parametrize("law", ["greedy", "deterministic"])
@pytest.mark.parametrize("kind", ["lm", "ties"])
def test_top_laws_single_call_matches_the_sorted_kernel(law, kind):
    for k in (1, 2, 3):
        p, q = _rows(kind, 500, k)
        batch = LawBatch(p, q)
        _ = batch.sorted  # the measurement's path (torch's top-k selection, the prefix sums)
        ref = float(batch.optimal_acceptance(k, law)[0])
        assert ob.optimal_acceptance(p, q, k, law) == pytest.approx(ref, abs=1e-14)


@pytest.mark.parametrize("kind", ["lm", "ties", "zeros"])
@pytest.mark.parametrize("v", [1, 2, 7, 100, 511, 512, 1023, 1024, 3000])
def test_with_replacement_single_call_matches_the_sorted_kernel_and_brute_force(kind, v):
    p, q = _rows(kind, v, seed=v) if v > 1 else (np.ones(1), np.ones(1))
    for k in (1, 2, 4):
        got = ob.optimal_acceptance(p, q, k)
        batch = LawBatch(p, q)
        _ = batch.sorted  # the measurement's path
        ref = float(batch.optimal_acceptance(k)[0])
        if v <= _AS_GIVEN_ROW:  # short rows sorted whole, prefix sums sequential as the kernel's: bit for bit
            assert got == ref
        if v <= _SMALL_ROW:  # and rows of LawBatch (not numpy float64 laws as given)
            assert ob.optimal_acceptance(p.tolist(), q.tolist(), k) == ref
        assert got == pytest.approx(ref, abs=1e-13)
        # independent: 1 + min over every prefix of the (ratio, index) order of p(H) − q(H)^K
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(q > 0, p / q, np.inf)
        order = np.argsort(r, kind="stable")
        brute = 1.0 + min(0.0, float((np.cumsum(p[order]) - np.cumsum(q[order]) ** k).min()))
        assert got == pytest.approx(min(max(brute, 0.0), 1.0), abs=1e-12)


def _top_rows(v, seed):
    """Long rows for the top-q selection: LM-like, integer levels (ties everywhere, the largest tied
    too), the largest entries in the tail past a multiple of 64, one flat row, a row of zeros but
    for a few entries."""
    rng = np.random.default_rng(seed)
    yield rng.dirichlet(np.ones(v) * 0.1)
    yield rng.integers(0, 5, size=v).astype(float)
    yield np.round(rng.standard_normal(v) * 2.5)
    tail = rng.random(v) * 0.5
    tail[-(v % 64 or 1) :] = 1.0 + np.arange(v % 64 or 1)  # the largest in the last, partial group
    yield tail
    yield np.ones(v)
    sparse = np.zeros(v)
    sparse[rng.choice(v, 5, replace=False)] = [3.0, 3.0, 1.0, 2.0, 3.0]
    yield sparse


@pytest.mark.parametrize("v", [4096, 5000, 151_936])
def test_top_tokens_of_long_rows_are_the_first_of_a_stable_sort_of_minus_q(v):
    from otbound.token._kernel import top_tokens

    for row in _top_rows(v, v):
        want = np.argsort(-row, kind="stable")
        for m in (2, 3, 4, 8, 9, 40):
            np.testing.assert_array_equal(top_tokens(row, m), want[:m])


def _top_law_reference(p, q, k, law):
    """α* of the greedy or deterministic law from its definition, G from a stable sort of −q."""
    order = np.argsort(-q, kind="stable")
    if law == "deterministic":
        return float(p[order[:k]].sum())
    g = order[: k - 1]
    rest = q.copy()
    rest[g] = 0.0
    rest = rest / rest.sum()
    return min(1.0, float(p[g].sum() + np.minimum(p, rest).sum()))


@pytest.mark.parametrize("law", ["greedy", "deterministic"])
@pytest.mark.parametrize("kind", ["lm", "ties", "zeros", "peaked_q", "tied_edge", "sum_one", "p_off_one",
                                  "q_off_one"])
@pytest.mark.parametrize("v", [2, 300, 5000])
def test_top_laws_single_call_of_long_rows_match_their_definition(law, kind, v):
    """Rows whose q sums to exactly 1 take the greedy law's path checked on its way (p
    renormalised through its sum), the others LawBatch's: both against the definition and the
    sorted kernel."""
    rng = np.random.default_rng(v)
    if kind == "peaked_q":  # q(G) > 1/2: q off G summed directly
        p, q = _rows("lm", v, seed=v)
        q = q.copy()
        q[rng.integers(v)] += 3.0
        q /= q.sum()
    elif kind == "tied_edge":  # the K-th and (K+1)-th largest q equal, among many
        p, q = _rows("lm", v, seed=v)
        q = np.floor(q * v / 4) + 1.0
        q[rng.choice(v, min(v, 6), replace=False)] = q.max() + 1.0
        q /= q.sum()
    elif kind in ("sum_one", "p_off_one", "q_off_one"):  # q summing to exactly 1 or off 1; p off 1
        p, q = _rows("ties", v, seed=v)
        q = q.copy()
        q[np.argmin(q)] += 1.0 - q.sum()
        if kind == "p_off_one":
            p = p * (1 + 7e-7)
        if kind == "q_off_one":
            q = q * (1 - 6e-7)
    else:
        p, q = _rows(kind, v, seed=v)
    for k in (1, 2, 3, 4, 8):
        if k > np.count_nonzero(q):  # both laws draw K distinct tokens of q > 0
            continue
        got = ob.optimal_acceptance(p, q, k, law)
        pn, qn = p / p.sum(), q / q.sum()  # the laws renormalised as LawBatch does (q summing to 1: as given)
        assert got == pytest.approx(_top_law_reference(pn, qn, k, law), abs=1e-14)
        batch = LawBatch(p, q)
        _ = batch.sorted  # the measurement's path (torch's top-k selection, the prefix sums)
        assert got == pytest.approx(float(batch.optimal_acceptance(k, law)[0]), abs=1e-14)


@pytest.mark.parametrize("law", ["greedy", "deterministic"])
def test_top_laws_single_call_of_adversarial_pairs_padded_to_a_long_row(adversarial_pair, law):
    _, p0, q0 = adversarial_pair
    v = 5000  # the pair's tokens first, then tokens of tiny equal mass in both laws
    p, q = np.full(v, 1e-9), np.full(v, 1e-9)
    p[: p0.size], q[: q0.size] = p0, q0
    p, q = p / p.sum(), q / q.sum()
    for k in (1, 2, 3):
        if k > np.count_nonzero(q):
            continue
        assert ob.optimal_acceptance(p, q, k, law) == pytest.approx(_top_law_reference(p, q, k, law), abs=1e-14)


def _with_replacement_brute(p, q, k):
    """1 + min over every prefix of the (ratio, index) order of p(H) − q(H)^K, clipped to [0, 1]."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(q > 0, p / q, np.inf)
    order = np.argsort(r, kind="stable")
    return min(max(1.0 + min(0.0, float((np.cumsum(p[order]) - np.cumsum(q[order]) ** k).min())), 0.0), 1.0)


@pytest.mark.parametrize("v", [600, 1024, 3000, 40_000])
def test_with_replacement_single_call_of_rows_with_signed_zeros_and_empty_tokens(v):
    """Tokens with p = −0.0 (ratio −0: the lowest bucket), p = q = 0 (0/0), q = 0 < p (inf) and
    q = −0.0: the bucket ids keep the division's sign bit, and every such token lands where the
    sorted order puts it."""
    rng = np.random.default_rng(v)
    for case in range(4):
        p, q = _rows("lm", v, seed=v + case)
        p, q = p.copy(), q.copy()
        low = np.argsort(p / q)[: v // 20]  # tokens of the lowest ratios: where a prefix minimum starts
        if case in (0, 3):
            p[low[::2]] = -0.0
        if case in (1, 3):
            both = rng.choice(v, v // 10, replace=False)
            p[both], q[both] = 0.0, 0.0
        if case in (2, 3):
            q[rng.choice(v, v // 10, replace=False)] = -0.0
        p, q = p / p.sum(), q / q.sum()
        for k in (1, 2, 4):
            got = ob.optimal_acceptance(p, q, k)
            assert got == pytest.approx(_with_replacement_brute(p, q, k), abs=1e-12)
            batch = LawBatch(p, q)
            _ = batch.sorted
            assert got == pytest.approx(float(batch.optimal_acceptance(k)[0]), abs=1e-13)


def _checked_error(p, q):
    """The message of the checked path's refusal of (p, q) (LawBatch, as_pair's checks)."""
    with pytest.raises(ob.InvalidInputError) as err:
        LawBatch(p, q)
    return str(err.value)


def _bad_laws(v):
    """Laws a long single call must refuse, each with the checked path's message; every change
    keeps the sums within the tolerance (a negative entry −1e-12 on a token whose mass moved to
    token 0), so that only the sign, NaN or infinity can refuse them, except the two sums off 1."""
    p, q = _rows("lm", v, seed=v)
    a = b = v // 2
    p[0], q[0] = p[0] + p[a], q[0] + q[a]
    p[a], q[a] = 1e-12, 1e-12
    for name, change in [
        ("negative p", lambda p, q: p.__setitem__(a, -1e-12)),
        ("negative p where q is -0.0", lambda p, q: (p.__setitem__(a, -1e-12), q.__setitem__(a, -0.0))),
        ("negative p where q is 0", lambda p, q: (p.__setitem__(a, -1e-12), q.__setitem__(a, 0.0))),
        ("negative p and q", lambda p, q: (p.__setitem__(a, -1e-12), q.__setitem__(a, -1e-12))),
        ("negative q", lambda p, q: q.__setitem__(b, -1e-12)),
        ("NaN p", lambda p, q: p.__setitem__(7, np.nan)),
        ("NaN q", lambda p, q: q.__setitem__(7, np.nan)),
        ("inf p", lambda p, q: p.__setitem__(7, np.inf)),
        ("inf q", lambda p, q: q.__setitem__(7, np.inf)),
        ("p sums to 1.01", lambda p, q: p.__setitem__(0, p[0] + 0.01)),
        ("q sums to 1 + 2e-6", lambda p, q: q.__setitem__(0, q[0] + 2e-6)),
    ]:
        bad_p, bad_q = p.copy(), q.copy()
        change(bad_p, bad_q)
        yield name, bad_p, bad_q


@pytest.mark.parametrize("law", ["with_replacement", "greedy", "deterministic"])
@pytest.mark.parametrize("v", [600, 1024, 5000])
def test_single_calls_checked_on_their_way_refuse_bad_laws_with_the_checked_message(v, law):
    for name, p, q in _bad_laws(v):
        if law != "with_replacement" and np.isfinite(q).all() and "sums" not in name:  # q summing to exactly 1
            for _ in range(2):
                q[0] += 1.0 - q.sum()
            assert q.sum() == 1.0
        want = _checked_error(p, q)
        for k in (1, 2, 4):
            with pytest.raises(ob.InvalidInputError) as err:
                ob.optimal_acceptance(p, q, k, law)
            assert str(err.value) == want, name
        # a bad row among good ones, and a bad law with a bad K: the law's error first, as before
        P, Q = np.stack([_rows("lm", v, 1)[0], p]), np.stack([_rows("lm", v, 1)[1], q])
        with pytest.raises(ob.InvalidInputError) as err:
            ob.optimal_acceptance(P, Q, 2, law)
        assert str(err.value) == _checked_error(P, Q), name
        with pytest.raises(ob.InvalidInputError) as err:
            ob.optimal_acceptance(p, q, 0, law)
        assert str(err.value) == want, name


@pytest.mark.parametrize("law", ["greedy", "deterministic"])
def test_top_laws_single_call_refuses_k_beyond_the_support_with_the_checked_message(law):
    p, q = _rows("zeros", 3000, seed=1)
    q = q.copy()
    top = np.argsort(-q)[:5]
    q[np.argsort(-q)[5:]] = 0.0  # five tokens of positive q
    q[top[0]] += 1.0 - q.sum()
    q[top[0]] += 1.0 - q.sum()
    assert q.sum() == 1.0 and np.count_nonzero(q) == 5
    assert ob.optimal_acceptance(p, q, 5, law) == pytest.approx(_top_law_reference(p, q, 5, law), abs=1e-14)
    batch = LawBatch(p, q)
    for k in (6, 3000, 4000):
        with pytest.raises(ob.InvalidInputError) as err:
            ob.optimal_acceptance(p, q, k, law)
        with pytest.raises(ob.InvalidInputError) as want:
            batch.check_num_drafts(k, law)
        assert str(err.value) == str(want.value)


@pytest.mark.parametrize("v", [600, 1024, 3000, 40_000])
def test_with_replacement_single_call_of_laws_off_one_and_batches(v):
    """Laws summing to 1 within the tolerance but not exactly (renormalised through their bucket
    sums), at the tolerance's edge (the checked path), batches of several shapes, other dtypes and
    layouts (the checked path): the values of the sorted kernel and of the brute force on the
    renormalised laws."""
    rng = np.random.default_rng(v)
    cases = []
    for kind in ("lm", "ties", "zeros"):
        p, q = _rows(kind, v, seed=v)
        for sp, sq in ((1 + 3e-7, 1 - 5e-7), (1 - 1e-6 + 1e-12, 1.0), (1.0, 1 + 1e-6 - 1e-12)):
            cases.append((p * sp, q * sq))
    for p, q in cases:
        pn, qn = p / p.sum(), q / q.sum()
        for k in (1, 2, 4, 64):  # Qc^K carries K times Qc's rounding: 1e-13 K
            got = ob.optimal_acceptance(p, q, k)
            batch = LawBatch(p, q)
            _ = batch.sorted
            assert got == pytest.approx(float(batch.optimal_acceptance(k)[0]), abs=1e-13 * k)
            assert got == pytest.approx(_with_replacement_brute(pn, qn, k), abs=1e-12 * k)  # its cumsum: V eps
    P = np.stack([c[0] for c in cases[:6]]).reshape(2, 3, v)
    Q = np.stack([c[1] for c in cases[:6]]).reshape(2, 3, v)
    got = ob.optimal_acceptance(P, Q, 2)
    assert got.shape == (2, 3)
    want = [[ob.optimal_acceptance(P[i, j], Q[i, j], 2) for j in range(3)] for i in range(2)]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)  # a row at the edge: all renormalised by LawBatch
    p, q = cases[0]
    strided = np.stack([p, rng.random(v)], 1)[:, 0]  # not contiguous
    for other in (p.astype(np.float32), p.tolist(), strided):
        want = LawBatch(other, q)
        _ = want.sorted
        assert ob.optimal_acceptance(other, q, 2) == pytest.approx(float(want.optimal_acceptance(2)[0]), abs=1e-13)


def _exact_prefix_sums(x):
    """Prefix sums of the float64 entries of x, each exact then rounded once (Fractions)."""
    from fractions import Fraction
    from itertools import accumulate

    return np.array([float(s) for s in accumulate(Fraction(v) for v in x.tolist())])


@pytest.mark.parametrize("v", [2000])
def test_with_replacement_single_call_of_adversarial_pairs_padded_to_a_long_row(adversarial_pair, v):
    """The pair's tokens, then tokens of tiny equal mass in both laws (α* may be ~1e-6: the checked
    path and a float64 cumsum are ~1e-13 off there); the reference's prefix sums exact."""
    _, p0, q0 = adversarial_pair
    p, q = np.full(v, 1e-9), np.full(v, 1e-9)
    p[: p0.size], q[: q0.size] = p0, q0
    p, q = p / p.sum(), q / q.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        order = np.argsort(np.where(q > 0, p / q, np.inf), kind="stable")
    pc, qc = _exact_prefix_sums(p[order]), _exact_prefix_sums(q[order])
    for k in (1, 2, 3, 8):
        want = min(max(1.0 + min(0.0, float((pc - qc**k).min())), 0.0), 1.0)
        assert ob.optimal_acceptance(p, q, k) == pytest.approx(want, abs=1e-14 * k)


@pytest.mark.parametrize("seed", range(6))
def test_single_calls_as_given_equal_the_checked_path_on_random_rows(seed):
    """Random long rows (LM-like, integer logits, zeros in p and q, a dominant q, sums off 1 within
    the tolerance), one call each: the paths checked on their way against LawBatch's (the laws
    renormalised first, the sorted kernel for with replacement)."""
    rng = np.random.default_rng(seed)
    for _ in range(5):
        v = int(rng.integers(600, 6000))
        kind = ["lm", "ties", "zeros"][int(rng.integers(3))]
        p, q = _rows(kind, v, seed=int(rng.integers(1 << 30)))
        p, q = p.copy(), q.copy()
        if rng.random() < 0.3:  # a dominant draft token: q(G) > 1/2
            q[int(rng.integers(v))] += float(rng.uniform(1, 5))
            q /= q.sum()
        if rng.random() < 0.5:  # sums off 1 within the tolerance
            p, q = p * (1 + rng.uniform(-9e-7, 9e-7)), q * (1 + rng.uniform(-9e-7, 9e-7))
        batch = LawBatch(p, q)
        _ = batch.sorted
        for k in (1, 2, 3, 8):
            if k > np.count_nonzero(q):
                continue
            for law in ("with_replacement", "greedy", "deterministic"):
                want = float(batch.optimal_acceptance(k, law)[0])
                assert ob.optimal_acceptance(p, q, k, law) == pytest.approx(want, abs=1e-13 * k), (kind, v, law, k)
