"""The moment sums of the clock integral's series tokens (:func:`otbound.token._wor._moment_sums`)."""

import numpy as np


def test_truncated_moment_sums_equal_the_full_series():
    """The moment sums per run with each token's series truncated (its arrays cut down to the tokens
    still needing terms once under 1/3 of them do, kept whole above) equal the untruncated sums
    Σ y^n, weighted as the power sums use them (c_{jn} x0^n), to 1e-13 relative: on a row whose
    fraction of tokens above the truncation limits falls from all through 1/2–1/3 (kept) to
    under 1/3 (cut), read by the strided probe (over 64 probes)."""
    from otbound.token._wor import _SERIES_SPAN, ClockMass, KeySums, _moment_sums

    rng = np.random.default_rng(41)
    v = 20_000
    y = np.exp(rng.uniform(np.log(1e-6), 0.0, v))  # log-uniform: the fraction above each limit falls slowly
    starts = np.concatenate([[0], np.sort(rng.choice(np.arange(1, v), 40, replace=False))])
    ev = ClockMass(3, 50.0)
    fractions = [float((y > ev.limit[n]).mean()) for n in sorted(ev.limit)]
    assert any(1 / 3 < f < 1 / 2 for f in fractions) and any(0 < f < 1 / 3 for f in fractions)
    got = np.zeros((starts.size + 1, ev.order))
    _moment_sums(y.copy(), KeySums.from_runs(starts, np.arange(starts.size), starts.size, v), ev.limit, got)
    powers = np.cumprod(np.repeat(y[:, None], ev.order, axis=1), axis=1)  # (v, N): every term
    full = np.add.reduceat(powers, starts, axis=0)  # (runs, N)
    weight = ev.coef.max(0) * (_SERIES_SPAN / ev.j_max) ** np.arange(1, ev.order + 1)
    err = np.abs(got[:-1] - full) @ weight
    assert np.all(err <= 1e-13 * (full @ weight)), err.max()
    assert not got[-1].any()  # the key past the runs holds nothing


def test_exact_token_recursion_equals_the_token_by_token_update(monkeypatch):
    """The exact tokens' positive recursion (:func:`otbound.token._wor._recursion`: cumulative sums
    down the tokens, in chunks) equals the plain update e_b ← e_b + ρ e_{b−1}, Σx ← Σx + x token by
    token, at the states asked (the start, −1, and tokens within and across chunk ends)."""
    import math

    from otbound.token import _wor

    monkeypatch.setattr(_wor, "_EXACT_CHUNK", 7)  # several chunks: the carries between them
    rng = np.random.default_rng(5)
    t = np.exp(np.linspace(-3.0, 4.0, 11))  # (T,) nodes
    q = rng.uniform(0.01, 0.5, 23)  # (n,) exact tokens: x = q t from 5e-4 to 27
    j_max = 3
    e_start = rng.uniform(0.0, 1e-3, (j_max, t.size))  # (J, T)
    sx_start = rng.uniform(0.0, 2.0, t.size)  # (T,)
    keep = np.array([-1, 0, 5, 6, 7, 13, 14, 20, 22])
    e, sx = _wor._recursion(t, q, e_start, sx_start, keep, j_max)
    assert e.shape == (j_max, keep.size, t.size) and sx.shape == (keep.size, t.size)
    cur_e, cur_sx = e_start.copy(), sx_start.copy()
    want_e, want_sx = {-1: cur_e.copy()}, {-1: cur_sx.copy()}
    for i, qi in enumerate(q):
        x = np.minimum(qi * t, _wor._X_CAP)
        rho = np.expm1(x) * math.exp(-_wor._X_CAP)
        for b in range(j_max - 1, 0, -1):  # e_b from the e_{b−1} before this token
            cur_e[b] = cur_e[b] + rho * cur_e[b - 1]
        cur_e[0] = cur_e[0] + rho
        cur_sx = cur_sx + x
        want_e[i], want_sx[i] = cur_e.copy(), cur_sx.copy()
    for j, k in enumerate(keep.tolist()):
        np.testing.assert_allclose(e[:, j], want_e[k], rtol=1e-14, atol=0)
        np.testing.assert_allclose(sx[j], want_sx[k], rtol=1e-14, atol=0)
