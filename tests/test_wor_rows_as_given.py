"""α* without replacement of a single call (the branch and bound on the rows as given,
:mod:`otbound.token._search`) on rows long enough to take its long-row paths: bucket sums scattered
by torch, moment tables by bucket id or (ids far apart) by chain position, the grid every bucket may
need taken up front, a long opened bucket sampled toward its ends, near-tied buckets ordered by a
16-bit radix sort. Each against an independent reference: the token-by-token DP
(:func:`otbound.token._search._without_replacement_reference`), the sorted kernel that
``measure_laws`` reads, numpy's stable argsort and bincount, the Chernoff bound evaluated on the
whole grid.
"""

import numpy as np
import pytest

import otbound as ob
from otbound.token import LawBatch, _search, _wor

V = 12_000  # long enough for the scatter (4,096 tokens) and for a tied bucket of over 1,024 tokens


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _rows(kind, v, seed):
    rng = np.random.default_rng(seed)
    if kind == "ties":  # integer logits: a few dozen distinct ratios, buckets of thousands of tokens
        return _softmax(np.round(rng.standard_normal(v) * 2.5)), _softmax(np.round(rng.standard_normal(v) * 2.5))
    if kind == "p_zeros":  # a truncated target: ratio 0 far below the other ratios' bucket ids
        z = rng.standard_normal(v) * 2.0
        p, q = _softmax(z + rng.standard_normal(v)), _softmax(z)
        p[np.argsort(p)[: v // 2]] = 0.0
        return p / p.sum(), q
    if kind == "q_zeros_tiny":  # zeros in q and positive q below the clock floor (negligible: dropped)
        z = rng.standard_normal(v) * 2.0
        p, q = _softmax(z + rng.standard_normal(v)), _softmax(z)
        q[rng.random(v) < 0.2] = 0.0
        q[rng.choice(v, 5, replace=False)] = 1e-305
        return p, q / q.sum()
    if kind == "near_support":  # q on 5 tokens only: K = 4 drafts nearly exhaust it
        p = _softmax(rng.standard_normal(v) * 2.0)
        q = np.zeros(v)
        q[rng.choice(v, 5, replace=False)] = rng.dirichlet(np.ones(5))
        return p, q
    z = rng.standard_normal(v) * 2.0  # LM-like: the target the draft plus noise
    return _softmax(z + rng.standard_normal(v)), _softmax(z)


@pytest.mark.parametrize("kind", ["ties", "p_zeros", "q_zeros_tiny", "near_support", "lm"])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_single_call_on_long_rows_matches_the_reference_dp_and_the_sorted_kernel(kind, k):
    p, q = _rows(kind, V, seed=7 + k)
    got = ob.optimal_acceptance(p, q, k, "without_replacement")
    ref = float(np.clip(_search._without_replacement_reference(p[None], q[None], k, False)[0][0], 0, 1))
    assert got == pytest.approx(ref, abs=1e-12), (kind, k)
    batch = LawBatch(p[None], q[None])
    _ = batch.sorted  # the batched kernel's path (rows sorted by ratio)
    assert got == pytest.approx(float(batch.optimal_acceptance(k, "without_replacement")[0]), abs=1e-12)


def test_long_rows_take_the_long_row_paths(monkeypatch):
    """The rows of the test above exercise what they are meant to: a tied bucket of over 1,024 tokens
    opened and sampled toward its ends, the scatter by torch, moment tables by chain position when
    a ratio 0 puts the bucket ids far apart, and (K ≥ 3) one grid per row."""
    seen = {"ends": 0, "spread": 0, "scatter": 0, "grids": 0}
    samples, spread, into, make = (_search._samples_to_ends, _wor.KeySums.spread, _wor.KeySums.into,
                                   _wor.ClockMass.__init__)

    def ends(lo, hi, leaf):
        seen["ends"] += hi - lo - 1 >= _search._GEO_MIN
        return samples(lo, hi, leaf)

    def spy_spread(self, *a, **kw):
        seen["spread"] += 1
        return spread(self, *a, **kw)

    def spy_into(self, weights, out):
        seen["scatter"] += self.starts is None and self.size >= _wor._SCATTER_MIN
        return into(self, weights, out)

    def grid(self, k, t_end, grids=None):
        seen["grids"] += 1
        make(self, k, t_end, grids)

    monkeypatch.setattr(_search, "_samples_to_ends", ends)
    monkeypatch.setattr(_wor.KeySums, "spread", spy_spread)
    monkeypatch.setattr(_wor.KeySums, "into", spy_into)
    monkeypatch.setattr(_wor.ClockMass, "__init__", grid)
    for k in (2, 4):
        ob.optimal_acceptance(*_rows("ties", V, seed=7 + k), k, "without_replacement")
    assert seen["ends"] >= 2 and seen["scatter"] >= 4
    assert seen["grids"] == 1
    ob.optimal_acceptance(*_rows("p_zeros", V, seed=11), 3, "without_replacement")
    assert seen["spread"] == 1


def test_bucket_tokens_are_in_stable_ratio_order():
    """Tokens of near-tied buckets (ratios a few units in the last place apart, exact ties, p = −0.0
    beside 0.0) and of wide buckets come in the order of numpy's stable argsort of p/q, with their
    ratios."""
    rng = np.random.default_rng(3)
    v = 5_000
    q = rng.random(v) + 0.1
    base = np.where(rng.random(v) < 0.5, 1.0, 2.0 ** -0.5)  # two buckets
    ulps = rng.integers(0, 6, v)
    ratio = base * (1.0 + ulps * np.finfo(float).eps)
    p = ratio * q
    p[:40] = np.where(np.arange(40) % 2, 0.0, -0.0)  # ratio 0 and −0 tie
    b, top = _search._ratio_buckets(p, q, np.inf)
    for ids in (np.unique(b)[:1], np.unique(b)[1:2], np.unique(b)[2:3], np.unique(b)):
        toks, r = _search._bucket_tokens_by_ratio(b, ids, p, q, top + 1)
        sel = np.flatnonzero(np.isin(b, ids))
        want = sel[np.argsort(p[sel] / q[sel], kind="stable")]
        np.testing.assert_array_equal(toks, want)
        np.testing.assert_array_equal(r, p[want] / q[want])
    wide = rng.random(v)  # one bucket spanning far more than 2^16 units in the last place
    b, top = _search._ratio_buckets(wide, np.ones(v), np.inf)
    ids = np.unique(b)[-1:]
    sel = np.flatnonzero(b == ids[0])
    np.testing.assert_array_equal(_search._bucket_tokens(b, ids, wide, np.ones(v)),
                                  sel[np.argsort(wide[sel], kind="stable")])


def test_long_scatter_equals_bincount_bit_for_bit():
    rng = np.random.default_rng(5)
    v = 3 * _wor._SCATTER_MIN
    keys = rng.integers(0, 50, v)
    keys[: v // 2] = 7  # long runs of one key, as on tied rows
    w = rng.random(v) * 10.0 ** rng.integers(-12, 0, v)
    sums = _wor.KeySums(keys, 60)
    want = np.bincount(keys, w, 61)
    np.testing.assert_array_equal(sums(w), want)
    table = np.zeros((61, 3))
    sums.into(w, table[:, 1])  # a column of a table
    np.testing.assert_array_equal(table[:, 1], want)
    assert not table[:, [0, 2]].any()
    frozen = w.copy()
    frozen.flags.writeable = False  # read-only weights: np.bincount (torch would warn)
    np.testing.assert_array_equal(sums(frozen), want)


def _chernoff_on_the_grid(s_rest, q_cap, k):
    """The first t of the grid 2^{j/2} (t ≤ 1/q_cap) whose Chernoff bound on P[N < K] is ≤ e^{−40},
    evaluating the bound at every grid time."""
    t = 2.0 ** (np.arange(-4, 100) / 2.0)
    if q_cap > 0:
        t = t[t <= 1.0 / q_cap]
    mu = s_rest[:, None] * t[None, :] * (1.0 - 0.5 * q_cap * t[None, :])
    a = k - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        log_tail = -mu if a == 0 else np.where(mu > a, -mu + a * (1.0 + np.log(mu / a)), 0.0)
    ok = log_tail <= -_wor.TAIL
    return np.where(ok.any(axis=1), t[np.argmax(ok, axis=1)], np.inf)


@pytest.mark.parametrize("k", [3, 4, 8, 16])
def test_chernoff_horizons_equal_the_bound_on_the_whole_grid(k):
    """:func:`otbound.token._search._wor_horizons`' Chernoff times (one binary search per bucket
    against the least mean reaching e^{−40}) are the grid times where the bound first reaches it."""
    rng = np.random.default_rng(k)
    v, nb = 20_000, 60
    q = rng.dirichlet(np.ones(v))  # most mass outside the largest q's: the Chernoff time binds
    top = np.argsort(-q, kind="stable")[: 2 * k + 30]
    pos = rng.integers(0, nb + 1, top.size)
    inside = np.concatenate([[0.0], np.sort(rng.random(nb)) * (1 - q[top].sum())])
    out = 1.0 - inside
    t_cut = _search._wor_horizons(q, k, pos, np.arange(nb), top, out, inside)[1][1:]
    through = pos[:, None] <= np.arange(nb)[None, :]
    s_rest = np.maximum(inside[1:] - q[top] @ through, 0.0)
    has_k, kth = _search._kth_inside(pos, q[top], k, nb)
    want = np.minimum(np.where(has_k, (_wor.TAIL + np.log(k)) / np.where(has_k, kth, 1.0), np.inf),
                      _chernoff_on_the_grid(s_rest, float(q[top[-1]]), k))
    np.testing.assert_array_equal(t_cut, want[:-1])
    chernoff = _chernoff_on_the_grid(s_rest, float(q[top[-1]]), k)
    assert np.sum(np.isfinite(chernoff) & (chernoff == want)) > nb // 2  # the Chernoff times are tested


def test_samples_to_ends():
    s = _search._samples_to_ends(100, 5_100, 16)
    assert s[0] == 100 and np.all(np.diff(s) > 0) and s[-1] < 5_100
    assert {101, 102, 104, 5_099, 5_098, 5_096}.issubset(s.tolist())
    np.testing.assert_array_equal(_search._samples_to_ends(0, 500, 16), _search._samples(0, 500, 16))


def _moment_sums_by_orders(y, keys, length, limit, order):
    """Σ y^n per key, one bincount per order over the tokens still in the arrays (cut down to those
    above limit[n] at the checkpoints where under 1/3 of them remain, or stopped when none), the
    loop :func:`otbound.token._wor._moment_sums` documents."""
    out = np.zeros((length, order))
    w = y.copy()
    for n in range(1, order + 1):
        out[:, n - 1] = np.bincount(keys, w, length)
        if n == order:
            break
        if n >= 2 and n in limit and not _wor._mostly_above(y, limit[n]):
            keep = np.flatnonzero(y > limit[n])
            if keep.size == 0:
                break
            if 3 * keep.size < y.size:
                y, w, keys = y[keep], w[keep], keys[keep]
        w = w * y
    return out


@pytest.mark.parametrize("k", [3, 4, 8])
def test_chunked_moment_sums_equal_one_bincount_per_order_bit_for_bit(k):
    """Long rows by keys take their first orders chunk by chunk (every chunk's powers scattered while
    in cache): the same sums, bit for bit, as one bincount per order over the row."""
    rng = np.random.default_rng(k)
    v = 3 * _wor._CHUNK + 123
    ev = _wor.ClockMass(k, 200.0)
    y = np.minimum(rng.dirichlet(np.full(v, 0.5)) / ev.theta, 1.0)  # y = q/θ ≤ 1 (exact tokens: 0)
    y[y >= 1.0] = 0.0
    keys = np.sort(rng.integers(0, 300, v))[rng.permutation(v)]
    keys[: v // 3] = 5  # long runs of one key
    want = _moment_sums_by_orders(y, keys, 301, ev.limit, ev.order)
    got = np.zeros((301, ev.order))
    _wor._moment_sums(y.copy(), _wor.KeySums(keys, 300), ev.limit, got)
    np.testing.assert_array_equal(got, want)
    # the probe of every 64th token misleads: it finds none above the first checkpoints' limits while
    # half the others are (no cut there: every token goes on, listed again at the next checkpoint)
    fooled = y.copy()
    odd = np.arange(v) % 64 != 0
    fooled[odd] = np.where(rng.random(odd.sum()) < 0.5, 0.02, fooled[odd])
    fooled[~odd] = np.minimum(fooled[~odd], 1e-9)
    got = np.zeros((301, ev.order))
    _wor._moment_sums(fooled.copy(), _wor.KeySums(keys, 300), ev.limit, got)
    np.testing.assert_array_equal(got, _moment_sums_by_orders(fooled, keys, 301, ev.limit, ev.order))
    frozen = y.copy()
    frozen.flags.writeable = False  # no torch view of a read-only row: one bincount per order
    got = np.zeros((301, ev.order))
    _wor._moment_sums(frozen, _wor.KeySums(keys, 300), ev.limit, got)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("k", [3, 4, 8])
def test_short_moment_sums_by_order_key_bins_equal_one_bincount_per_order(k):
    """Below torch's scatter size the orders that share their tokens are summed by one bincount over
    (order, key) bins: the same sums, bit for bit, as one bincount per order (rows of few tokens,
    the tokens cut down at the checkpoints, a key without tokens, tiny and large y)."""
    rng = np.random.default_rng(10 + k)
    ev = _wor.ClockMass(k, 200.0)
    for v in (1, 7, 300, 3_000):
        y = np.minimum(rng.dirichlet(np.full(v, 0.3)) * v / 50.0, 1.0)
        y[rng.random(v) < 0.2] = 0.0  # exact tokens
        keys = rng.integers(0, 40, v)
        keys[keys == 7] = 8  # key 7 holds no token
        want = _moment_sums_by_orders(y, keys, 41, ev.limit, ev.order)
        got = np.zeros((41, ev.order))
        _wor._moment_sums(y.copy(), _wor.KeySums(keys, 40), ev.limit, got)
        np.testing.assert_array_equal(got, want)


def test_tokens_above_theta_from_the_group_maxima():
    """The tokens with q > θ found in the groups whose maximum exceeds θ are those of a pass over q
    (few groups above θ, many, none; a row whose length is not a multiple of the group size)."""
    rng = np.random.default_rng(9)
    for v in (10_000, 151_936):
        q = rng.dirichlet(np.full(v, 0.05))
        top, peak = _search._largest_and_peaks(q, 38)
        np.testing.assert_array_equal(top, _search._largest(q, 38))
        assert peak is not None
        for theta in (q.max(), np.sort(q)[-5], np.sort(q)[-200], np.sort(q)[-v // 4], 0.0):
            np.testing.assert_array_equal(_search._above(q, theta, peak), np.flatnonzero(q > theta))


def test_adversarial_pairs_padded_to_long_rows(adversarial_pair):
    """Each adversarial pair padded with 70,000 tokens of mass 0 under both laws (the long-row paths:
    torch's scatter, the chunked moments) gives the token-by-token DP's α* of the pair itself."""
    name, p, q = adversarial_pair
    pad = (np.pad(p, (0, 70_000)), np.pad(q, (0, 70_000)))
    for k in range(2, min(4, int(np.count_nonzero(q))) + 1):
        ref = float(np.clip(_search._without_replacement_reference(p[None], q[None], k, False)[0][0], 0, 1))
        assert ob.optimal_acceptance(*pad, k, "without_replacement") == pytest.approx(ref, abs=1e-12), (name, k)
