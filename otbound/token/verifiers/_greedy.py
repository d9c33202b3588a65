"""Verifiers for the greedy draft law: G = top-(K−1) tokens of q, last draft x ~ q' = q|_{V∖G}/(1−q(G)).

**Greedy-law optimal verifier** (docs/theory/token-verifiers.md, derived): accept the random draft x w.p.
``min(1, p(x)/q'(x))``; else ``Y ∝ p·1_G + (p − q')_+·1_{V∖G}``. Lossless; acceptance
``α*_greedy = p(G) + Σ_{x∉G} min(p(x), q'(x))`` (residual mass on G is always accepted, and the
residual off G lives where p > q' while only drafts with p < q' are rejected).

**SpecHub** (Sun, Zhou, Chen, Sun 2411.05289, EMNLP 2024; K = 2; algorithm as in the authors' code,
github.com/MasterGodzilla/Speculative_decoding_OT, EAGLE/eagle/model/utils.py). Hub ``a = argmax q``.
The draft model draws an *ordered* pair: ``(i, a)`` w.p. ``q(i)`` (first draft i ≠ a sampled from
q, the hub added second) or ``(a, i)`` w.p. ``q(a) q'(i)`` (first draft a, second from q'). As an
unordered pair this is exactly the greedy law {a, x}, x ~ q'. Verification, with
``p_1 = (p − q)_+``, ``Q_2(i) = q(a) q'(i)`` (both off a):

1. order (i, a): accept i w.p. ``min(1, p(i)/q(i))``; leftover draft mass ``r_1 = (q − p)_+``;
2. order (a, i): accept i w.p. ``min(1, p_1(i)/Q_2(i))``; leftover ``r_2 = (Q_2 − p_1)_+``;
3. hub: order (a, i) accepts a w.p. ``c_2 = min(1, p(a)/R_2)``, then order (i, a) w.p.
   ``c_1 = min(1, (p(a) − R_2)_+/R_1)`` (``R_j = Σ r_j``);
4. else ``Y ∝`` leftover target mass: ``(p_1 − Q_2)_+`` off a and ``(p(a) − R_1 − R_2)_+`` at a.

Here drafts come as greedy-law tuples ``(a, x)``; the order, which the algorithm uses but the tuple
does not record, is latent: SpecHub draws it from its conditional law given the pair,
P((x, a) | {a, x}) = q(x)/q'(x) = 1 − q(a). The result is exactly SpecHub's joint law of
(drafts, output). Acceptance (derived): the i-acceptances add to ``min(p, q + Q_2) = min(p, q')``
per token, a is accepted with ``min(p(a), R_1 + R_2)`` and the residual mass at a is a draft, and the
residual off a (where p > q') never meets a rejected draft (where p < q'), so
``α_SpecHub = p(a) + Σ_{x≠a} min(p(x), q'(x)) = α*_greedy`` at K = 2.

With K = 1 (no hub) SpecHub is single-draft speculative sampling, as is the greedy verifier.
"""

from __future__ import annotations

import numpy as np

from otbound.token.draft_laws import greedy_split
from otbound.token.verifiers._base import (
    SequentialVerifier,
    first_acceptance_law,
    first_acceptance_sample,
    ratio_min1,
    residual,
)


class GreedyVerifier(SequentialVerifier):
    """Optimal verifier for the greedy draft law (docs/theory/token-verifiers.md): reaches α*_greedy.

    Drafts are greedy-law tuples (G, x), G the K−1 top tokens of q and x ~ q' = q|_{V∖G}/(1 − q(G))
    (:func:`otbound.greedy_split`). Accept x w.p. ``min(1, p(x)/q'(x))``, else draw
    ``Y ∝ p·1_G + (p − q')_+·1_{V∖G}``. Lossless, with acceptance
    ``α = α*_greedy = p(G) + Σ_{x∉G} min(p(x), q'(x))``, the greedy law's bound.

    The instance in :data:`otbound.VERIFIERS` is ``"greedy"``.

    References
    ----------
    Hu et al., arXiv 2502.18779 (the greedy draft law and its bound); the verifier is derived in
    docs/theory/token-verifiers.md.

    Examples
    --------
    G = {2} and q' = (0.4, 0.6, 0) on p = (0.5, 0.3, 0.2), q = (0.2, 0.3, 0.5): x = 1 is accepted w.p.
    0.3/0.6, so α = p(G) + min(0.5, 0.4) + min(0.3, 0.6) = 0.9.

    >>> from otbound.token.verifiers import GreedyVerifier
    >>> GreedyVerifier().conditional_law([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [2, 1]).round(4).tolist()
    [0.1667, 0.5, 0.3333]
    """

    name = "greedy"
    planned = True  # and spechub, its subclass
    attains_optimum = True  # α = α*_greedy (module docstring); spechub too at K ≤ 2
    reference = "greedy-law optimal verifier (docs/theory/token-verifiers.md), α = α*_greedy"
    lossless = True
    sampling = "greedy"

    def _prepare(self, p, q, k):
        g, qp = greedy_split(q, k)
        in_g = np.zeros(q.size, dtype=bool)
        in_g[g] = True
        base = np.where(in_g, 0.0, qp)  # residual ∝ (p − base)_+ = p on G, (p − q')_+ off G
        return {"qp": qp, "in_g": in_g, "residual": residual(p, base)}

    def _rounds(self, p, q, aux, drafts):
        x = drafts[:, -1:]
        return x, ratio_min1(p[x], aux["qp"][x]), aux["residual"]


class SpecHubVerifier(GreedyVerifier):
    """SpecHub (2411.05289) for K = 2 on the greedy law; K = 1 is speculative sampling.

    The hub a = argmax q and a second draft x ~ q' (the greedy law at K = 2), verified in the
    latent draft order as in the authors' code (module docstring). Lossless, with acceptance
    ``α_SpecHub = p(a) + Σ_{x≠a} min(p(x), q'(x)) = α*_greedy`` at K = 2.

    The instance in :data:`otbound.VERIFIERS` is ``"spechub"`` (``max_drafts = 2``).

    Raises
    ------
    InvalidInputError
        From its methods, for K > 2.

    References
    ----------
    Sun, Zhou, Chen, Sun, "SpecHub: provable acceleration to multi-draft speculative decoding",
    arXiv 2411.05289 (EMNLP 2024).

    Examples
    --------
    The hub is a = 2 on q = (0.2, 0.3, 0.5), q' = (0.4, 0.6, 0): α = 0.2 + 0.4 + 0.3 = α*_greedy.

    >>> from otbound import VERIFIERS
    >>> VERIFIERS["spechub"].acceptance([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 2)
    0.9
    >>> VERIFIERS["spechub"].acceptance([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 3)
    Traceback (most recent call last):
    ...
    otbound._validation.InvalidInputError: verifier 'spechub' supports at most 2 drafts, got K = 3
    """

    name = "spechub"
    reference = "SpecHub (Sun et al. 2411.05289), K ≤ 2"
    lossless = True
    max_drafts = 2

    def _prepare(self, p, q, k):
        if k == 1:
            return super()._prepare(p, q, k)
        (a,), qp = greedy_split(q, 2)
        off = np.ones(q.size, dtype=bool)
        off[a] = False
        p1 = np.where(off, np.maximum(p - q, 0.0), 0.0)
        q2 = q[a] * qp
        r1 = np.where(off, np.maximum(q - p, 0.0), 0.0)
        r2 = np.maximum(q2 - p1, 0.0)
        big_r1, big_r2 = float(r1.sum()), float(r2.sum())
        c2 = min(1.0, p[a] / big_r2) if big_r2 > 0 else 1.0
        left_a = max(p[a] - big_r2, 0.0)
        c1 = min(1.0, left_a / big_r1) if big_r1 > 0 else 1.0
        left = np.maximum(p1 - q2, 0.0)
        left[a] = max(left_a - big_r1, 0.0)
        res = left / left.sum() if left.sum() > 0 else p
        return {"a": a, "first": 1.0 - q[a], "p1": p1, "q2": q2, "c1": c1, "c2": c2, "residual": res}

    def _order_rounds(self, p, q, aux, drafts):
        """Rounds (x then a) under both orders: accept arrays for (x, a) and for (a, x)."""
        n = drafts.shape[0]
        x = drafts[:, 1]
        tokens = np.stack([x, np.full(n, aux["a"])], axis=1)
        acc_xa = np.stack([ratio_min1(p[x], q[x]), np.full(n, aux["c1"])], axis=1)
        acc_ax = np.stack([ratio_min1(aux["p1"][x], aux["q2"][x]), np.full(n, aux["c2"])], axis=1)
        return tokens, acc_xa, acc_ax

    def _laws(self, p, q, aux, drafts):
        if drafts.shape[1] == 1:
            return super()._laws(p, q, aux, drafts)
        tokens, acc_xa, acc_ax = self._order_rounds(p, q, aux, drafts)
        res, v = aux["residual"], q.size
        w = aux["first"]
        return w * first_acceptance_law(tokens, acc_xa, res, v) + (1.0 - w) * first_acceptance_law(
            tokens, acc_ax, res, v
        )

    def _sample(self, p, q, aux, drafts, rng):
        if drafts.shape[1] == 1:
            return super()._sample(p, q, aux, drafts, rng)
        tokens, acc_xa, acc_ax = self._order_rounds(p, q, aux, drafts)
        x_first = rng.random(drafts.shape[0]) < aux["first"]  # latent order (x, a)
        accept = np.where(x_first[:, None], acc_xa, acc_ax)
        return first_acceptance_sample(tokens, accept, aux["residual"], rng)

