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
