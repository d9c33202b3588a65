"""Deterministic drafting as a draft law: the K most probable draft tokens, no randomness.

What serving engines do by default (vLLM drafts by argmax and verifies with a one-hot q; EAGLE,
Medusa and SGLang expand static top-k trees): the draft tuple is

    x̄ = G = (the K tokens of largest q, by decreasing q; ties to the lower index),

so its law is the point mass Q = δ_G and Q(H) = 1[G ⊆ H]. The optimum by the same dual as the
random laws (Hu et al. 2502.18779 Theorem 3.1)::

    α*_det = 1 + min_H [p(H) − 1[G ⊆ H]] = p(G),

attained at H* = G (any H ⊉ G gives 1 + p(H) ≥ 1; any H ⊇ G gives p(H) ≥ p(G)). Lossless
verifiers reach it (:mod:`otbound.token.verifiers._deterministic`): every emitted token is a draw
of p, accepted iff it lies in G. K must not exceed the support of q (the K drafts are distinct
tokens of positive draft mass; a truncated draft law with fewer survivors is an error naming it).
"""

from __future__ import annotations

import numpy as np

from otbound.token._topk import top_k_mask
from otbound.token.draft_laws import _top_tokens
from otbound.token.laws import DraftLaw


class Deterministic(DraftLaw):
    """x̄ = the K most probable tokens of q (decreasing q, ties to the lower index); Q(H) = 1[G ⊆ H]."""

    name = "deterministic"

    def sample(self, q, k, n, rng):
        return np.tile(_top_tokens(q, k), (n, 1))

    def joint(self, q, k):
        joint = np.zeros((q.size,) * k)
        joint[tuple(_top_tokens(q, k))] = 1.0
        return joint

    def subset_mass(self, q, mask, k):
        return float(mask[_top_tokens(q, k)].all())

    def inclusion(self, q, k):
        out = np.zeros(q.size)
        out[_top_tokens(q, k)] = 1.0
        return out

    def optimal_acceptance(self, P, Q, k, want_sets):
        g = top_k_mask(Q, k)
        values = np.where(g, P, 0.0).sum(axis=1)
        sets = (g & (values < 1.0)[:, None]) if want_sets else None  # H* = G where it binds
        return values, sets

    def coupling_law(self, q, k):
        out = np.zeros(q.size)  # the first draft is argmax q, a point mass
        out[_top_tokens(q, 1)] = 1.0
        return out

    def check_drafts(self, q, drafts, k):
        from otbound._validation import InvalidInputError

        g = _top_tokens(q, k)
        wrong = (drafts != g).any(axis=1)
        if wrong.any():
            r = int(np.flatnonzero(wrong)[0])
            raise InvalidInputError(
                f"drafts row {r} = {drafts[r].tolist()} is not the deterministic tuple: expected the top-{k} "
                f"tokens {g.tolist()} of q by decreasing q (ties to the lower index)"
            )
