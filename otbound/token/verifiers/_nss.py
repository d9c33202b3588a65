"""NSS / naive verification: ignore the drafts, sample ``Y ~ p``, accepted iff ``Y ∈ x̄``.

Lossless trivially. Acceptance ``α = Σ_t p(t) P(t ∈ x̄)``: for i.i.d. drafts
``Σ_t p(t)(1 − (1 − q(t))^K)`` (docs/theory/token-verifiers.md); for the other laws the inclusion probabilities of
:func:`otbound.token.draft_laws.inclusion_probabilities`. This is what deterministic top-k trees
(EAGLE-style, one-hot q) amount to.
"""

from __future__ import annotations

import numpy as np

from otbound._validation import check_sampling
from otbound.token._kernel import power
from otbound.token.draft_laws import inclusion_probabilities
from otbound.token.verifiers._base import Verifier, draw


class NaiveVerifier(Verifier):
    """Naive speculative sampling (NSS): Y ~ p regardless of the drafts; works for any draft law.

    Lossless trivially; acceptance ``α = Σ_t p(t) P(t ∈ x̄)`` (for i.i.d. drafts
    ``Σ_t p(t)(1 − (1 − q(t))^K)``).

    Parameters
    ----------
    sampling : {"with_replacement", "without_replacement", "greedy", "deterministic"}
        The draft law it is run on (:data:`otbound.SAMPLINGS`).

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
    >>> import numpy as np
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> from otbound.token.verifiers import NaiveVerifier
    >>> v = NaiveVerifier()
    >>> round(v.acceptance(p, q, 2), 6)
    0.483
    >>> v.conditional_law(p, q, [2, 2]).tolist()  # the drafts are ignored
    [0.5, 0.3, 0.2]
    >>> round(NaiveVerifier("greedy").acceptance(p, q, 2), 6)
    0.58
    """

    name = "nss"
    reference = "naive speculative sampling: Y ~ p, accepted iff Y ∈ x̄"
    lossless = True

    def __init__(self, sampling: str = "with_replacement"):
        self.sampling = check_sampling(sampling)

    def _laws(self, p, q, aux, drafts):
        return np.broadcast_to(p, (drafts.shape[0], p.size)).copy()

    def _sample(self, p, q, aux, drafts, rng):
        return draw(p, rng.random(drafts.shape[0]))

    def _closed_form(self, p, q, aux, k):
        return float(p @ inclusion_probabilities(q, k, self.sampling))

    def batch_acceptance(self, batch, num_drafts):
        """``α = Σ_t p(t) P(t ∈ x̄)``: for i.i.d. drafts ``Σ_t p(t)(1 − (1 − q(t))^K)`` for every row
        at once (``p (1 − q)^K`` cached per K, each from K − 1); for the other laws row by row from
        :func:`otbound.token.draft_laws.inclusion_probabilities`.

        Examples
        --------
        >>> import numpy as np
        >>> from otbound.token import LawBatch
        >>> from otbound.token.verifiers import NaiveVerifier
        >>> b = LawBatch(np.array([[0.5, 0.3, 0.2]]), np.array([[0.2, 0.3, 0.5]]))
        >>> NaiveVerifier().batch_acceptance(b, 2).numpy().round(6)
        array([0.483])
        """
        if self.sampling != "with_replacement":
            return super().batch_acceptance(batch, num_drafts)
        return 1.0 - _missed_mass(batch, num_drafts).sum(1)


def _missed_mass(batch, k):
    """``p (1 − q)^k`` (B, V) of the batch, cached: each K one multiplication from K − 1 when cached
    (else by repeated squaring of ``1 − q``)."""
    if ("nss_missed", k - 1) in batch._memo:
        return batch.memo(("nss_missed", k), lambda: batch._memo[("nss_missed", k - 1)] * _miss(batch))
    return batch.memo(("nss_missed", k), lambda: batch.p * power(_miss(batch), k))


def _miss(batch):
    """``1 − q`` (B, V), cached."""
    return batch.memo("nss_miss", lambda: 1.0 - batch.q)
