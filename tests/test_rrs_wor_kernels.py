"""RRS without replacement on the CPU: the window round of the crossing first drafts at K = 2
against the general rejection round of the whole row."""

import numpy as np
import pytest
import torch

from otbound.token import LawBatch
from otbound.token.verifiers import _rrs
from otbound.token.verifiers._rrs import _crossing_round, _reject

_DRAW_REJECTED = _rrs._draw_rejected  # the library's draw, before a test records its calls


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


def _torch_bisection(*args):
    """The rejected-draft search in torch, as the accelerator runs it (the reference of the test)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_rrs, "_bisect_rejected", _rrs._bisect_rejected_torch)
        return _DRAW_REJECTED(*args)


def test_rejected_draws_on_the_cpu_are_the_torch_search(monkeypatch):
    """Every draw of the Monte Carlo paths (horizon 6: up to four rejected drafts, so the removed
    mass is summed from one, two and more columns) is the torch search's position, on LM-like, tied and
    short rows."""
    calls = []
    draw = _rrs._draw_rejected

    def recording(*args, **kwargs):
        state = (args[0], *(x.clone() for x in args[1:8]))  # the removed drafts are written in place after
        pos = draw(*args, **kwargs)
        calls.append((state, pos))
        return pos

    monkeypatch.setattr(_rrs, "_draw_rejected", recording)
    rng = np.random.default_rng(22)
    for tied, v in ((False, 3_000), (True, 3_000), (False, 16)):  # V = 16: midpoints on rejected drafts
        p, q = _rows(rng, 4, v, tied)
        batch = LawBatch(p, q, seed=3)
        weights = _rrs._rrs_wor_paths(batch, 6, 48)
        assert len(weights) == 6 and weights[-1].shape == (4, 48)
    assert len(calls) == 15
    for args, pos in calls:
        assert pos.dtype == torch.int64 and pos.shape == (4, 48)
        assert torch.equal(pos, _torch_bisection(*args))
    assert len({int(x) for x in calls[4][1].flatten()}) > 20  # the draws spread over the row


def _reference_paths(batch, horizon, mc_samples):
    """The path weights with every search done afresh and the torch search of the draws."""
    from otbound.token.verifiers._rrs import rrs_thresholds

    srt = batch.sorted
    b, v = srt.r.shape
    f64 = torch.float64
    mu1, h1 = rrs_thresholds(batch, 1)
    shape = (b, mc_samples)
    mu, h, s = (x.expand(shape).contiguous() for x in (mu1, h1, srt.q_tot))
    removed_pos = torch.full((b, mc_samples, horizon), v + 1, dtype=torch.int64)
    removed_q = torch.zeros((b, mc_samples, horizon), dtype=f64)
    weight = torch.ones(shape, dtype=f64)
    out = []
    for i in range(horizon):
        rho = _reject(srt, mu, h, s, removed_q.sum(2))
        weight = weight * rho
        out.append(weight)
        if i == horizon - 1:
            break
        mu_next = mu + torch.where(h > 0, h / s, torch.zeros_like(h))
        u = torch.rand(shape, generator=batch.generator, dtype=f64) * rho
        pos = _torch_bisection(srt, mu, h, s, mu_next, removed_pos, removed_q, u)
        qx = torch.gather(srt.qs, 1, pos)
        removed_pos[:, :, i] = pos
        removed_q[:, :, i] = qx
        s = s - qx
        mu = mu_next
        h = srt.h(mu)
    return out


def test_paths_are_the_reference_paths():
    """The Monte Carlo path weights (each round's searches n(μ), n(μ_next) done once and shared by
    the round's ρ, the draw and the next h) equal those of every search done afresh, bit for bit:
    LM-like, tied and short rows, and rows where a draft token holds most of q (S falls near 0)."""
    from otbound.token.verifiers._rrs import _rrs_wor_paths

    rng = np.random.default_rng(23)
    sets = [_rows(rng, 3, 2_000, False), _rows(rng, 3, 2_000, True), _rows(rng, 3, 9, False)]
    p, q = _rows(rng, 3, 500, False)
    q[:, 7] += 50.0  # one token of q ≈ 0.98
    sets.append((p, q / q.sum(1, keepdims=True)))
    for p, q in sets:
        got = _rrs_wor_paths(LawBatch(p, q, seed=5), 5, 32)
        want = _reference_paths(LawBatch(p, q, seed=5), 5, 32)
        assert len(got) == 5
        for a, b in zip(got, want):
            assert torch.equal(a, b)


def test_crossing_threshold_is_the_product_comparison():
    """``S_2 < t`` (:func:`_product_threshold`) selects exactly the S_2 with ``gap · S_2 < h_2`` as
    rounded: random and tiny h_2 and gaps, S_2 at the threshold, next to it and at every float of a
    stretch around h_2/gap, zeros; gaps of 0 and inf fall back to the products."""
    from otbound.token.verifiers._rrs import _crossing, _product_threshold

    rng = np.random.default_rng(24)
    cases = [(float(h), float(g)) for h, g in zip(rng.random(200), rng.random(200) * 3)]
    cases += [(0.375, 0.75), (1e-300, 1e-3), (0.3, 1e-300), (5e-324, 0.5), (1e300, 1e-10), (0.25, 0.0), (0.25, np.inf)]
    for h, g in cases:
        t = _product_threshold(h, g)
        x0 = h / g if 0 < g < np.inf else 0.5
        near = [x0]
        for _ in range(6):
            near = [np.nextafter(near[0], -np.inf)] + near + [np.nextafter(near[-1], np.inf)]
        s2 = np.concatenate([rng.random(300), near, [0.0, 1.0] + ([t, np.nextafter(t, 0)] if t is not None else [])])
        with np.errstate(invalid="ignore", over="ignore"):
            want = np.flatnonzero(np.multiply(s2, g) < h)
        got = _crossing(torch.tensor([h], dtype=torch.float64), torch.tensor([g], dtype=torch.float64),
                        torch.from_numpy(s2))
        np.testing.assert_array_equal(got.numpy(), want)
        if 0 < g < np.inf and t is not None:
            assert t * g >= h and np.nextafter(t, -np.inf) * g < h
    for h, g in zip(rng.random(20_000).tolist(), (rng.random(20_000) * 3).tolist()):  # the threshold alone
        t = _product_threshold(h, g)
        assert t * g >= h and np.nextafter(t, -np.inf) * g < h
    assert _product_threshold(0.25, 0.0) is None and _product_threshold(0.25, np.inf) is None
