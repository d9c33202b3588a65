"""The sorted rows' sums answered from marks (the CPU path keeps a mark every ``_CHUNK`` positions
and the block offsets instead of the full (B, V + 1) sums): every point, column range and window
equals the full blocked sums of ``SortedRows._prefix`` bit for bit (signed zeros included), on
random, tied, tiny-q and truncated rows, at V below, at and across multiples of the block."""

import numpy as np
import pytest
import torch

from otbound._backend import accelerator_paths
from otbound.token import _kernel
from otbound.token._kernel import SortedRows

SUMS = ("pc", "qc", "_prs", "_qrs")
VOCABS = (1, 5, 8, 100, 511, 512, 513, 1000, 1023, 1024, 1025, 1536, 4097, 9000)


def laws(v, kind, rows=3):
    rng = np.random.default_rng([v, len(kind)])
    p, q = rng.dirichlet(np.full(v, 0.3), rows), rng.dirichlet(np.full(v, 0.3), rows)
    if kind == "ties":  # few distinct ratios
        p, q = np.round(p * 50) + 1, np.round(q * 50) + 1
    elif kind == "tiny_q":
        q[:, ::3] *= 1e-200
    elif kind == "truncated":  # zeros in q, and p = −0 where q > 0
        q[:, rng.random(v) < 0.6] = 0.0
        q[:, 0] = 1.0
        p[:, : v // 3] = -0.0
    return torch.from_numpy(p / p.sum(1, keepdims=True)), torch.from_numpy(q / q.sum(1, keepdims=True))


def full_sums(srt, name):
    """The full sums as the accelerator path builds them: one blocked prefix of the batch."""
    x = srt.ps if name in ("pc", "_prs") else srt.qs
    return SortedRows._prefix(x.flip(1) if name.startswith("_") else x)


def bits(x):
    return np.asarray(x, dtype=np.float64).view(np.int64)


@pytest.fixture(autouse=True)
def every_sum_marked(monkeypatch):
    monkeypatch.setattr(_kernel, "_FULL_SUMS", ())


@pytest.mark.parametrize("kind", ["random", "ties", "tiny_q", "truncated"])
@pytest.mark.parametrize("v", VOCABS)
def test_points_columns_and_windows_equal_the_full_sums(v, kind):
    p, q = laws(v, kind)
    srt = SortedRows(p, q)
    assert srt._marks is not None and not any(name in srt.__dict__ for name in SUMS)  # nothing summed whole
    rng = np.random.default_rng(v)
    for name in SUMS:
        full = full_sums(srt, name).numpy()  # (B, V + 1)
        every = torch.arange(v + 1).repeat(p.shape[0], 1)
        np.testing.assert_array_equal(bits(srt._at(name, every)), bits(full))
        np.testing.assert_array_equal(bits(srt.columns(name, 0, v + 1)), bits(full))
        lo, hi = sorted(rng.integers(0, v + 2, 2))
        np.testing.assert_array_equal(bits(srt.columns(name, lo, hi)), bits(full[:, lo:hi]))
        for width in (1, 7, 64):
            if width > v + 1:
                continue
            lo = rng.integers(0, v + 2 - width, 25)
            rows = rng.integers(0, p.shape[0], 25)
            want = full[rows[:, None], lo[:, None] + np.arange(width)]
            np.testing.assert_array_equal(bits(srt.windows(name, rows, lo, width)), bits(want))
        one = srt.row(1)  # a row's view answers from its own marks
        np.testing.assert_array_equal(bits(one._at(name, every[:1])), bits(full[1:2]))
    np.testing.assert_array_equal(bits(srt.q_tot[:, 0]), bits(full_sums(srt, "qc").numpy()[:, -1]))
    assert not any(name in srt.__dict__ for name in SUMS)  # the queries built no full sums


def test_the_full_sums_built_on_first_use_are_the_accelerators():
    p, q = laws(3000, "random")
    srt = SortedRows(p, q)
    for name in SUMS:
        np.testing.assert_array_equal(bits(getattr(srt, name)), bits(full_sums(srt, name)))
        assert name in srt.__dict__  # now read by every query
    with accelerator_paths():
        acc = SortedRows(p, q)
    for name in SUMS:
        np.testing.assert_array_equal(bits(getattr(srt, name)), bits(getattr(acc, name)))


def test_torch_cumsum_starts_from_plus_zero():
    """Why each mark is a torch sum: ``torch.cumsum`` of −0 entries gives +0 (its sum starts at
    +0), ``np.cumsum`` gives −0 (it starts at the first entry)."""
    x = np.array([-0.0, -0.0, 1.0])
    assert bits(torch.cumsum(torch.from_numpy(x), 0)[:1]) != bits(np.cumsum(x)[:1])
