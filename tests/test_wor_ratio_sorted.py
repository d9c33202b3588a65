"""α* without replacement at K = 3, 4 on a batch's rows sorted by ratio (the measurement's path:
:func:`otbound.token._search.without_replacement_ratio_sorted` in lockstep over the rows, their runs
and run moments built once and shared by K = 3 and K = 4) against two independent computations of
every row: the token-by-token reference DP (:func:`otbound.token._search._without_replacement_reference`)
and the branch and bound on the row as given (its own bucketing, moment sums and grid, one row at a
time). Rows of different kinds share each batch, so that one lockstep evaluation stacks rows with
and without exact tokens, on grids of different lengths.
"""

import numpy as np
import pytest

from otbound.token import LawBatch, _search

V = 6_000
KINDS = ("lm", "ties", "dominant_q", "dominant_p", "tiny_q", "q_zeros", "near_support")


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _row(kind, rng):
    z = rng.standard_normal(V) * 2.0
    p, q = _softmax(z + rng.standard_normal(V)), _softmax(z)  # LM-like: the target the draft plus noise
    if kind == "ties":  # integer logits: a few dozen distinct ratios, runs of hundreds of tokens
        p, q = (_softmax(np.round(rng.standard_normal(V) * 2.5)) for _ in range(2))
    elif kind == "dominant_q":  # the draft almost deterministic: the K − 1 largest q hold nearly all mass
        q = np.full(V, 1e-3 / (V - 1))
        q[17] = 1.0 - 1e-3
    elif kind == "dominant_p":  # the target on one token the draft rarely proposes
        p = np.full(V, 1e-2 / (V - 1))
        p[int(np.argmin(q))] = 1.0 - 1e-2
    elif kind == "tiny_q":  # positive q far below the others (ratios near the overflow) and some below 1e-300
        q[rng.choice(V, 40, replace=False)] = 1e-200
        q[rng.choice(V, 3, replace=False)] = 1e-305  # negligible: dropped by clock_law, the row re-bucketed
    elif kind == "q_zeros":  # tokens the draft never proposes: ratio inf, last in the order
        q[rng.random(V) < 0.3] = 0.0
    elif kind == "near_support":  # q on 5 tokens only: K = 4 drafts nearly exhaust it
        q = np.zeros(V)
        q[rng.choice(V, 5, replace=False)] = rng.dirichlet(np.ones(5))
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("seed", [0, 1])
def test_sorted_rows_in_lockstep_match_the_reference_dp_and_the_rows_as_given(seed):
    rng = np.random.default_rng(seed)
    rows = [_row(kind, rng) for kind in KINDS]
    P, Q = np.stack([p for p, _ in rows]), np.stack([q for _, q in rows])  # (B, V) each
    batch = LawBatch(P, Q)
    _ = batch.sorted  # the batched kernel's path: the rows sorted by ratio once
    got = {k: batch.optimal_acceptance(k, "without_replacement").numpy() for k in (3, 4)}
    runs = batch._memo["sorted_runs"]  # built by K = 3, read again by K = 4
    assert len(runs) == len(KINDS) and runs[0].moments.theta_c is not None
    for k in (3, 4):
        ref = np.clip(_search._without_replacement_reference(P, Q, k, False)[0], 0.0, 1.0)
        as_given = np.clip(_search.without_replacement(P, Q, k, False)[0], 0.0, 1.0)
        for kind, g, r, a in zip(KINDS, got[k], ref, as_given):
            assert abs(g - r) <= 1e-12, (kind, k, g, r)
            assert abs(g - a) <= 1e-12, (kind, k, g, a)
        assert np.ptp(ref) > 0.1  # the rows differ: not one value checked seven times


def test_sorted_rows_of_one_batch_do_not_depend_on_their_neighbours():
    """A row's value in lockstep with others equals its value searched alone on its sorted row
    (runs and moments of its own), K = 3 then K = 4, to the project's 1e-12."""
    rng = np.random.default_rng(5)
    rows = [_row(kind, rng) for kind in KINDS]
    P, Q = np.stack([p for p, _ in rows]), np.stack([q for _, q in rows])
    batch = LawBatch(P, Q)
    srt = batch.sorted
    ps, qs = srt.ps.numpy(), srt.qs.numpy()
    runs = _search.sorted_runs(ps, qs)
    together = {k: _search.without_replacement_ratio_sorted(ps, qs, k, runs) for k in (3, 4)}
    for i in range(len(KINDS)):
        alone_runs = _search.sorted_runs(ps[i : i + 1], qs[i : i + 1])
        for k in (3, 4):
            alone = _search.without_replacement_ratio_sorted(ps[i : i + 1], qs[i : i + 1], k, alone_runs)[0]
            assert abs(together[k][i] - alone) <= 1e-12, (KINDS[i], k)


def test_first_samples_of_an_opened_bucket():
    """On rows sorted by ratio a long opened bucket is first sampled toward both ends only when its
    ratios are tied (to 1e-9: one ratio broken by rounding); on rows as given every long bucket is;
    short buckets take the plain fan-out either way."""
    from types import SimpleNamespace

    def chain(ratios):
        return SimpleNamespace(fp=np.zeros(ratios.size + 1), r_step=np.concatenate([[0.0], ratios]),
                               ev=SimpleNamespace(leaf=16))

    m = 5_000
    tied = 0.75 * (1.0 + np.arange(m) * np.finfo(float).eps)  # one ratio, a few thousand ulps apart
    spread = np.linspace(0.75, 0.76, m)  # a bucket's width of distinct ratios
    ends, plain = _search._samples_to_ends(0, m, 16), _search._samples(0, m, 16)
    assert ends.size > plain.size + 10 and {1, 2, 4, m - 1, m - 2, m - 4} <= set(ends.tolist())
    sorted_rows, as_given = _search._first_samples(tied_only=True), _search._first_samples(tied_only=False)
    np.testing.assert_array_equal(sorted_rows(chain(tied)), ends)
    np.testing.assert_array_equal(sorted_rows(chain(spread)), plain)
    np.testing.assert_array_equal(as_given(chain(spread)), ends)
    np.testing.assert_array_equal(sorted_rows(chain(np.zeros(m))), ends)  # ratio 0 throughout: tied
    short = tied[:500]
    np.testing.assert_array_equal(sorted_rows(chain(short)), _search._samples(0, 500, 16))


def test_long_tied_runs_of_sorted_rows_are_sampled_toward_their_ends(monkeypatch):
    """A ``ties`` row (integer logits: runs of thousands of tokens of one ratio) searched on its sorted
    row opens such a run and samples it toward its ends; its value is the reference DP's."""
    rng = np.random.default_rng(12)
    v = 20_000
    p, q = (_softmax(np.round(rng.standard_normal(v) * 1.5)) for _ in range(2))
    seen = []
    ends = _search._samples_to_ends

    def spy(lo, hi, leaf):
        seen.append(hi - lo - 1)
        return ends(lo, hi, leaf)

    monkeypatch.setattr(_search, "_samples_to_ends", spy)
    batch = LawBatch(p[None], q[None])
    _ = batch.sorted
    for k in (3, 4):
        got = float(batch.optimal_acceptance(k, "without_replacement")[0])
        ref = float(np.clip(_search._without_replacement_reference(p[None], q[None], k, False)[0][0], 0, 1))
        assert abs(got - ref) <= 1e-12, (k, got, ref)
    assert seen and max(seen) >= _search._GEO_MIN  # a tied run of over 1,024 tokens opened


def test_rows_with_one_horizon_share_one_grid(monkeypatch):
    """Rows of one call whose quadrature horizons coincide (here: the same row three times, beside
    another) share one grid's arrays (read-only), and each such row's α* equals, bit for bit, its
    value searched alone on a grid of its own."""
    from otbound.token import _wor

    rng = np.random.default_rng(8)
    rows = [_row("lm", rng) for _ in range(2)]
    P, Q = np.stack([rows[0][0]] * 3 + [rows[1][0]]), np.stack([rows[0][1]] * 3 + [rows[1][1]])
    order = np.argsort(P / Q, axis=1, kind="stable")
    ps, qs = np.take_along_axis(P, order, 1), np.take_along_axis(Q, order, 1)
    grids = []
    make = _wor.ClockMass.__init__

    def spy(self, k, t_end, shared=None):
        make(self, k, t_end, shared)
        grids.append(self.t)

    monkeypatch.setattr(_wor.ClockMass, "__init__", spy)
    together = _search.without_replacement_ratio_sorted(ps, qs, 4)
    assert len(grids) == 4 and grids[0] is grids[1] is grids[2] and grids[3] is not grids[0]
    assert not grids[0].flags.writeable
    alone = _search.without_replacement_ratio_sorted(ps[:1], qs[:1], 4)[0]
    assert grids[4] is not grids[0]
    assert together[0] == together[1] == together[2] == alone
