"""With-replacement α* on the CPU reads its block bounds from the batch's cached contiguous columns
(``otbound.token._kernel._block_columns``), shared by every K: against the full evaluation of
``1 + min(0, min_j Pc[j] − Qc[j]^K)`` over the prefixes with ratio ≤ K, for several K on one batch
(prefix counts m with and without a partial last block) and K asked in either order."""

import numpy as np
import pytest
import torch

from otbound.token import LawBatch
from otbound.token import _kernel as kernel


def _rows(rows, v, seed):
    """LM-like rows: a Zipf head, the target the draft's logits plus noise (few open blocks)."""
    rng = np.random.default_rng(seed)
    z = -1.1 * np.log(np.argsort(rng.random((rows, v)), axis=1) + 1.0)  # (rows, v)
    p, q = np.exp(z + rng.standard_normal((rows, v))), np.exp(z)
    return torch.from_numpy(p / p.sum(1, keepdims=True)), torch.from_numpy(q / q.sum(1, keepdims=True))


def _full(batch, k):
    """α* with replacement from every prefix with ratio ≤ K (no block bounds)."""
    srt = batch.sorted
    m = min(srt.prefix_limit(torch.full((batch.rows,), float(k), dtype=torch.float64)), srt.pc.shape[1])
    f = srt.pc[:, :m] - kernel.power(srt.qc[:, :m], k)  # (B, m)
    return (1.0 + f.min(1).values.clamp(max=0.0)).clamp(0.0, 1.0)


@pytest.mark.parametrize("ks", [(2, 3, 4, 6), (6, 4, 3, 2)])
def test_block_bounds_from_cached_columns(ks):
    p, q = _rows(5, 3_000, seed=4)
    batch = LawBatch(p, q)
    ms = set()
    for k in ks:
        srt = batch.sorted
        m = min(srt.prefix_limit(torch.full((batch.rows,), float(k), dtype=torch.float64)), srt.pc.shape[1])
        assert m > 4 * kernel._BOUND_BLOCK  # the block bounds are used
        ms.add(m % kernel._BOUND_BLOCK == 0)
        got = batch.optimal_acceptance(k, "with_replacement")
        assert torch.equal(got, _full(batch, k)), k
    assert ("block_columns", kernel._BOUND_BLOCK) in batch._memo
    assert False in ms  # a partial last block among the K


def test_block_bounds_with_a_full_last_block(monkeypatch):
    """m a multiple of the block width: no partial block appended."""
    p, q = _rows(3, 2_000, seed=5)
    batch = LawBatch(p, q)
    srt = batch.sorted
    m = min(srt.prefix_limit(torch.full((batch.rows,), 3.0, dtype=torch.float64)), srt.pc.shape[1])
    monkeypatch.setattr(kernel, "_BOUND_BLOCK", 8 if m % 8 == 0 else next(w for w in (7, 5, 3, 2) if m % w == 0))
    assert torch.equal(batch.optimal_acceptance(3, "with_replacement"), _full(batch, 3))
