"""RRS without replacement on the CPU: the window round of the crossing first drafts at K = 2
against the general rejection round of the whole row."""

import numpy as np
import torch

from otbound.token import LawBatch
from otbound.token.verifiers._rrs import _crossing_round, _reject


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _rows(rng, n, v, tied):
    z = rng.normal(size=(n, v)) * 2.5
    if tied:  # integer logits: many exactly equal ratios
        return _softmax(np.round(z + rng.normal(size=z.shape))), _softmax(np.round(z))
    return _softmax(z + rng.normal(size=z.shape)), _softmax(z)


def test_crossing_round_is_the_general_round():
    """ρ_2 of :func:`_crossing_round` equals :func:`_reject` (which searches n(μ_3) in the whole row)
    bit for bit: states whose μ_3 = μ_2 + h_2/S_2 spread over many ratios, land exactly on a ratio
    (μ_2 and μ_2 + h_2 ratios of the row, S_2 = 1), lie past the last finite ratio, or have S_2 = 0."""
    rng = np.random.default_rng(21)
    on_a_ratio = 0
    for tied in (False, True):
        p, q = _rows(rng, 3, 4_000, tied)
        q[0, :5] = 0.0  # infinite ratios at the end of row 0
        q[0] /= q[0].sum()
        srt = LawBatch(p, q).sorted
        for row in range(p.shape[0]):
            r = srt.r[row].numpy()
            finite = np.flatnonzero(np.isfinite(r))
            for a, b in ((len(finite) // 3, len(finite) // 2), (10, len(finite) - 1), (len(finite) // 2,) * 2):
                mu2 = float(r[a])
                h2 = float(r[b] - r[a]) or 1e-3
                n_mu2 = int(np.searchsorted(r, mu2, side="left"))
                s = np.concatenate([rng.uniform(0.05, 1.0, 3_000), [1.0, 1.0, 0.0, 1e-300, 0.5]])  # (f,)
                on_a_ratio += int(np.isin(mu2 + h2 / s[s > 0], r).sum())
                got = _crossing_round(srt, row, mu2, h2, n_mu2, s)
                f64 = torch.float64
                state = (torch.tensor([[mu2]], dtype=f64), torch.tensor([[h2]], dtype=f64), torch.from_numpy(s)[None])
                want = _reject(srt.row(row), *state, torch.zeros(1, s.size, dtype=f64), torch.tensor([[n_mu2]]))[0]
                np.testing.assert_array_equal(got, want.numpy())
                assert got.dtype == np.float64 and got.shape == s.shape
    assert on_a_ratio  # the ties of μ_3 with a ratio were exercised
