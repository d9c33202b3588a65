"""Lossless verifiers for deterministic drafting (x̄ = G, the top-K tokens of q), both optimal.

**One-hot rule** (``"onehot"``; what vLLM does with argmax drafts, recursive rejection sampling
with a one-hot draft law, SpecInfer 2305.09781 with q_i = δ_{x_i}): with p_1 = p and
p_{i+1} = norm((p_i − δ_{x_i})_+) = p restricted to V ∖ {x_1..x_i}, accept x_i with probability
``p_i(x_i) = p(x_i) / p(V ∖ {x_1..x_{i−1}})``; if all K reject, draw from p_{K+1} = p|_{V∖G}.
The output law is exactly p (each step is a draw of p_i split into "x_i" and "the rest"), and the
acceptance is ``p(G) = α*_det`` (docs/theory/token-bounds.md, the deterministic draft law).

**Membership** (``"nss_deterministic"``): Y ~ p, accepted iff Y ∈ G (naive verification on this
law): the same law and acceptance, in one draw.
"""

from __future__ import annotations

import numpy as np

from otbound.token._kernel import top_tokens
from otbound.token.verifiers._base import SequentialVerifier
from otbound.token.verifiers._nss import NaiveVerifier


class OneHotVerifier(SequentialVerifier):
    """The one-hot-q rule on deterministic drafts (module docstring): optimal, α = p(top-K(q)).

    Examples
    --------
    On p = (0.5, 0.3, 0.2), q = (0.1, 0.6, 0.3) the top-K(q) sets are {1}, {1, 2}, {0, 1, 2}:

    >>> from otbound import VERIFIERS
    >>> [round(VERIFIERS["onehot"].acceptance([0.5, 0.3, 0.2], [0.1, 0.6, 0.3], k), 12) for k in (1, 2, 3)]
    [0.3, 0.5, 1.0]
    """

    name = "onehot"
    planned = True
    attains_optimum = True  # α = p(top-K(q)) = α*_det (module docstring)
    sampling = "deterministic"
    reference = "one-hot-q recursive rejection on argmax drafts (vLLM; SpecInfer 2305.09781): α = p(top-K(q))"
    lossless = True

    def _prepare(self, p, q, k):
        g = top_tokens(q, k)
        rest = np.ones(q.size, dtype=bool)
        rest[g] = False
        tail = float(p[rest].sum())  # summed directly: no cancellation when G holds most of p
        # remaining mass before round i: p(x_i) + ... + p(x_K) + p(V ∖ G)
        remaining = tail + np.cumsum(p[g][::-1])[::-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            accept = np.where(remaining > 0, p[g] / np.where(remaining > 0, remaining, 1.0), 1.0)
        resid = np.where(rest, p, 0.0)
        resid = resid / tail if tail > 0 else p  # reached with probability tail only
        return {"g": g, "accept": np.minimum(accept, 1.0), "residual": resid}

    def _rounds(self, p, q, aux, drafts):
        accept = np.broadcast_to(aux["accept"], drafts.shape)
        return drafts, accept, aux["residual"]

    def _closed_form(self, p, q, aux, k):
        return float(p[aux["g"]].sum())


class MembershipVerifier(NaiveVerifier):
    """Y ~ p, accepted iff Y is one of the deterministic drafts: optimal, α = p(top-K(q)).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound import VERIFIERS
    >>> round(VERIFIERS["nss_deterministic"].acceptance([0.5, 0.3, 0.2], [0.1, 0.6, 0.3], 1), 12)
    0.3
    """

    name = "nss_deterministic"
    attains_optimum = True  # α = P(Y ∈ G) = p(top-K(q)) = α*_det

    def __init__(self):
        super().__init__("deterministic")
