"""``LawBatch(..., presort=True)``: the CPU check and ratio sort done row by row
(``otbound.token._kernel._check_sort_cpu``) give the laws, minima and sorted rows of the batch-wide
check followed by the sort, bit for bit, and refuse bad input with the batch-wide check's errors."""

import numpy as np
import pytest
import torch

from otbound._validation import InvalidInputError
from otbound.report import measure_laws
from otbound.token import LawBatch

_SORTED = ("order", "ps", "qs", "r", "pc", "qc", "_prs", "_qrs", "q_tot")


def _laws(rows, v, seed=0):
    """Rows of several kinds: Dirichlet, peaked, zeros in p and q (0/0 and x/0 ratios), rounded
    logits (near ties of equal ratios), each row off 1 by a few ulps (renormalised)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(v), rows)  # (rows, v)
    q = rng.dirichlet(np.full(v, 0.2), rows)  # (rows, v)
    if rows > 1:
        p[1, : v // 3] = 0.0
        q[1, v // 4 : v // 2] = 0.0
    if rows > 2:
        p[2] = np.exp(np.round(rng.standard_normal(v) * 2))
        q[2] = np.exp(np.round(rng.standard_normal(v) * 2))
    p /= p.sum(1, keepdims=True)
    q /= q.sum(1, keepdims=True)
    return torch.from_numpy(p * (1 + 3e-16)), torch.from_numpy(q * (1 - 2e-16))


def _same(a, b):
    assert torch.equal(a.p, b.p) and torch.equal(a.q, b.q)
    assert torch.equal(a.q_min, b.q_min)
    assert "sorted" in a.__dict__
    for name in _SORTED:
        assert torch.equal(getattr(a.sorted, name), getattr(b.sorted, name)), name


@pytest.mark.parametrize("rows,v", [(5, 1_300), (3, 512), (4, 37), (2, 2), (1, 1)])
def test_presort_matches_check_then_sort(rows, v):
    p, q = _laws(rows, v)
    _same(LawBatch(p, q, presort=True), LawBatch(p, q))


def test_presort_batch_shapes_and_numpy_draft():
    p, q = _laws(6, 700, seed=1)
    a, b = LawBatch(p.reshape(2, 3, 700), q.reshape(2, 3, 700), presort=True), LawBatch(p.reshape(2, 3, 700),
                                                                                        q.reshape(2, 3, 700))
    assert a.shape == b.shape == (2, 3)
    _same(a, b)
    a, b = LawBatch(p[0], q[0].numpy(), presort=True), LawBatch(p[0], q[0].numpy())
    assert a.shape == b.shape == ()
    _same(a, b)
    # a non-contiguous batch (whose batch-wide sums may round otherwise) takes the check as usual
    pt, qt = p.T.contiguous().T, q.T.contiguous().T
    _same(LawBatch(pt, qt, presort=True), LawBatch(pt, qt))
    _same(LawBatch(p.float(), q.float(), presort=True), LawBatch(p.float(), q.float()))


@pytest.mark.parametrize("law", ["p", "q"])
@pytest.mark.parametrize("bad", ["nan", "negative", "sum"])
def test_presort_refuses_as_the_check(law, bad):
    p, q = _laws(4, 300, seed=2)
    x = (p if law == "p" else q).clone()
    if bad == "nan":
        x[2, 7] = float("nan")
    elif bad == "negative":
        x[3, 5] = -1e-3
        x[3, 6] += 1e-3
    else:
        x[2] *= 1.01
    args = (x, q) if law == "p" else (p, x)
    with pytest.raises(InvalidInputError) as plain:
        LawBatch(*args)
    with pytest.raises(InvalidInputError) as fused:
        LawBatch(*args, presort=True)
    assert str(fused.value) == str(plain.value)


def test_measure_laws_unchanged_by_presort(monkeypatch):
    p, q = _laws(5, 400, seed=3)
    res = measure_laws(p, q, (2, 3), verifiers=["rrs", "rrs_wor", "kseq"])
    import otbound.token._kernel as kernel

    monkeypatch.setattr(kernel, "_check_sort_cpu", lambda p, q: None)  # the check, then the sort
    assert measure_laws(p, q, (2, 3), verifiers=["rrs", "rrs_wor", "kseq"]) == res
