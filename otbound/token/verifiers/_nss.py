"""NSS / naive verification: ignore the drafts, sample ``Y ~ p``, accepted iff ``Y ∈ x̄``.

Lossless trivially. Acceptance ``α = Σ_t p(t) P(t ∈ x̄)``: for i.i.d. drafts
``Σ_t p(t)(1 − (1 − q(t))^K)`` (docs/theory/token-verifiers.md); for the other laws the inclusion probabilities of
:func:`otbound.token.draft_laws.inclusion_probabilities`. This is what deterministic top-k trees
(EAGLE-style, one-hot q) amount to.
"""

from __future__ import annotations

import numpy as np

from otbound._backend import on_accelerator
from otbound.token.draft_laws import draft_law, inclusion_probabilities
from otbound.token.verifiers._base import Verifier, draw


class NaiveVerifier(Verifier):
    """Naive speculative sampling (NSS): Y ~ p regardless of the drafts; works for any draft law.

    Lossless trivially; acceptance ``α = Σ_t p(t) P(t ∈ x̄)`` (for i.i.d. drafts
    ``Σ_t p(t)(1 − (1 − q(t))^K)``).

    Parameters
    ----------
    sampling : str or DraftLaw
        The draft law it is run on (a name of :data:`otbound.DRAFT_LAWS`).

    Raises
    ------
    InvalidInputError
        An unknown ``sampling``.

    References
    ----------
    Miao et al., "SpecInfer", arXiv 2305.09781 (naive multi-draft sampling); Sun et al.,
    "SpecTr", arXiv 2310.15141.

    Examples
    --------
    >>> from otbound.token.verifiers import NaiveVerifier
    >>> NaiveVerifier().conditional_law([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [2, 2]).tolist()  # drafts ignored
    [0.5, 0.3, 0.2]
    >>> round(NaiveVerifier("greedy").acceptance([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 2), 6)  # p(2) + p(1)·0.6
    0.58
    """

    name = "nss"
    reference = "naive speculative sampling: Y ~ p, accepted iff Y ∈ x̄"
    lossless = True

    def __init__(self, sampling: str = "with_replacement"):
        self.sampling = draft_law(sampling).name

    def _laws(self, p, q, aux, drafts):
        return np.broadcast_to(p, (drafts.shape[0], p.size)).copy()

    def _sample(self, p, q, aux, drafts, rng):
        return draw(p, rng.random(drafts.shape[0]))

    def _closed_form(self, p, q, aux, k):
        return float(p @ inclusion_probabilities(q, k, self.sampling))

    def batch_acceptance(self, batch, num_drafts):
        """``α = Σ_t p(t) P(t ∈ x̄)``: for i.i.d. drafts ``Σ_t p(t)(1 − (1 − q(t))^K)`` for every row
        at once (the sums for K = 1..4 from one pass over each row); for the other laws row by row from
        :func:`otbound.token.draft_laws.inclusion_probabilities`.

        Examples
        --------
        >>> import numpy as np
        >>> from otbound.token import LawBatch
        >>> from otbound.token.verifiers import NaiveVerifier
        >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
        >>> [round(float(x), 12) for x in (NaiveVerifier().batch_acceptance(LawBatch(p[None], q[None]), 3)[0],
        ...                                 p @ (1 - (1 - q) ** 3))]
        [0.6161, 0.6161]
        """
        if self.sampling != "with_replacement":
            return super().batch_acceptance(batch, num_drafts)
        return 1.0 - _missed_mass(batch, num_drafts)


_SHARED_K = 4  # the sums for K = 1..4 come from one pass over each row


def _missed_mass(batch, k):
    """``Σ_t p(t) (1 − q(t))^k`` per row, (B,), cached for every K up to ``max(k, 4)`` at once: the
    running product ``p (1 − q)^j`` one multiplication per K, each summed (one row at a time on the
    CPU, where the row's ``1 − q`` and product stay in cache; the whole batch on an accelerator)."""
    if ("nss_missed", k) not in batch._memo:
        torch = _torch()
        top = max(k, _SHARED_K)
        sums = torch.empty((top, batch.rows), dtype=torch.float64, device=batch.p.device)  # (top, B)
        if on_accelerator(batch.p):
            parts, miss, missed = [slice(None)], torch.empty_like(batch.q), torch.empty_like(batch.p)  # (B, V) each
        else:  # a row at a time through two scratch rows, reused (in cache)
            parts = [slice(i, i + 1) for i in range(batch.rows)]
            miss, missed = (torch.empty((1, batch.vocab), dtype=torch.float64) for _ in range(2))  # (1, V) each
        for rows in parts:
            torch.sub(1.0, batch.q[rows], out=miss)  # 1 − q
            torch.mul(batch.p[rows], miss, out=missed)  # p (1 − q)^j, j = 1, 2, ...
            for j in range(top):
                if j:
                    missed.mul_(miss)
                sums[j, rows] = missed.sum(1)
        for j in range(top):
            batch._memo[("nss_missed", j + 1)] = sums[j]
    return batch._memo[("nss_missed", k)]


def _torch():
    import torch

    return torch
