"""Deterministic drafting: the K largest entries of each row (ties to the lower index, numpy and
torch) and the deterministic law's optimum α*_det = p(top-K(q)) over batches.

What serving engines do by default (vLLM drafts by argmax and verifies with a one-hot q; EAGLE,
Medusa and SGLang expand static top-k trees): the draft tuple is

    x̄ = G = (the K tokens of largest q, by decreasing q; ties to the lower index),

so its law is the point mass Q = δ_G and Q(H) = 1[G ⊆ H]. The optimum by the same dual as the
random laws (Hu et al. 2502.18779 Theorem 3.1)::

    α*_det = 1 + min_H [p(H) − 1[G ⊆ H]] = p(G),

attained at H* = G (any H ⊉ G gives 1 + p(H) ≥ 1; any H ⊇ G gives p(H) ≥ p(G)). The law itself
is :class:`otbound.token.draft_laws.Deterministic`; lossless verifiers reach it
(:mod:`otbound.token.verifiers._deterministic`): every emitted token is a draw of p, accepted iff
it lies in G. K must not exceed the support of q (the K drafts are distinct
tokens of positive draft mass; a truncated draft law with fewer survivors is an error naming it).
"""

from __future__ import annotations

import numpy as np


def top_k_mask(Q: np.ndarray, k: int) -> np.ndarray:
    """Boolean (..., V) mask of the K largest entries of every row, ties to the lower index
    (O(V) per row: a partition for the K-th value, then the first of the tied tokens by index).

    Examples
    --------
    >>> top_k_mask(np.array([[0.2, 0.4, 0.2, 0.2]]), 2).tolist()
    [[True, True, False, False]]
    """
    Q = np.asarray(Q)
    v = Q.shape[-1]
    kth = np.partition(Q, v - k, axis=-1)[..., v - k : v - k + 1]
    above = Q > kth
    tied = Q == kth
    need = k - above.sum(axis=-1, keepdims=True)
    return above | (tied & (np.cumsum(tied, axis=-1) <= need))


def top_k_mask_torch(Q, k: int):
    """:func:`top_k_mask` for a torch tensor (..., V), on its device."""
    import torch

    kth = torch.topk(Q, k, dim=-1).values[..., -1:]
    above = Q > kth
    tied = Q == kth
    need = k - above.sum(dim=-1, keepdim=True)
    return above | (tied & (torch.cumsum(tied.to(torch.int64), dim=-1) <= need))


def deterministic_acceptance(P, Q, k: int):
    """α*_det = p(top-K(q)) per row, numpy or torch (..., V) (float64; the engine's batched path).

    Examples
    --------
    >>> float(deterministic_acceptance(np.array([0.5, 0.3, 0.2]), np.array([0.1, 0.6, 0.3]), 2))
    0.5
    """
    if hasattr(P, "detach"):
        return (P * top_k_mask_torch(Q, k)).sum(dim=-1)
    return np.where(top_k_mask(Q, k), P, 0.0).sum(axis=-1)
