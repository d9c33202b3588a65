"""Recursive rejection sampling (RRS), with and without replacement.

**With replacement** (SpecInfer, Miao et al. 2305.09781): drafts i.i.d. from q; ``p_1 = p``; round i
accepts ``x_i`` w.p. ``min(1, p_i(x_i)/q(x_i))``, else ``p_{i+1} = norm((p_i − q)_+)``; if all K are
rejected, ``Y ~ p_{K+1}``. Exact acceptance by the recursion of Thomas et al. (Dynamic Delayed Tree
Expansion, Alg. 9; theory.md §3): with ``r_i = Σ min(p_i, q)``,
``P_rej = Π (1 − r_i)``, ``m = Π (1 − (q − p_i)_+/(1 − r_i))`` (the probability, given all rounds
rejected, that no draft equals t), ``α = (1 − P_rej) + P_rej Σ_t p_{K+1}(t)(1 − m(t))``.

**Without replacement** (Jeon et al. 2402.14160; Yang et al. 2401.06706): drafts drawn without
replacement (Gumbel-top-K); after rejecting ``x_i``: ``p_{i+1} = norm((p_i − q_i)_+)`` and
``q_{i+1} = norm(q_i with x_i zeroed)``. No closed form: exact acceptance by enumeration for small V.
Costs O(n·V·K) time (per-row residuals), processed in chunks of ``CHUNK_CELLS``.
"""

from __future__ import annotations

import numpy as np

from otbound.token.verifiers._base import SequentialVerifier, ratio_min1, residual


class RRSVerifier(SequentialVerifier):
    """SpecInfer recursive rejection sampling, drafts i.i.d. from q (2305.09781)."""

    name = "rrs"
    reference = "SpecInfer recursive rejection sampling (Miao et al. 2305.09781)"
    lossless = True
    sampling = "with_replacement"

    def _prepare(self, p, q, k):
        seq = [p]
        for _ in range(k):
            seq.append(residual(seq[-1], q))
        return np.stack(seq)  # p_1..p_{K+1}

    def _rounds(self, p, q, aux, drafts):
        k = drafts.shape[1]
        cols = np.arange(k)
        accept = ratio_min1(aux[cols, drafts], q[drafts])
        return drafts, accept, aux[k]

    def _closed_form(self, p, q, aux, k):
        p_rej, m = 1.0, np.ones_like(q)
        for i in range(k):
            excess = np.maximum(q - aux[i], 0.0)
            rej = excess.sum()  # 1 − r_i, summed directly for accuracy
            if rej <= 0.0:
                return 1.0  # round i accepts with certainty
            p_rej *= rej
            m *= 1.0 - excess / rej
        return (1.0 - p_rej) + p_rej * float(aux[k] @ (1.0 - m))


class RRSWithoutReplacementVerifier(SequentialVerifier):
    """Recursive rejection sampling with drafts without replacement (Jeon et al. 2402.14160)."""

    name = "rrs_wor"
    reference = "recursive rejection sampling without replacement (Jeon et al. 2402.14160)"
    lossless = True
    sampling = "without_replacement"

    def _rounds(self, p, q, aux, drafts):
        n, k = drafts.shape
        rows = np.arange(n)
        cur_p = np.broadcast_to(p, (n, p.size)).copy()
        cur_q = np.broadcast_to(q, (n, q.size)).copy()
        accept = np.empty((n, k))
        for i in range(k):
            x = drafts[:, i]
            accept[:, i] = ratio_min1(cur_p[rows, x], cur_q[rows, x])
            cur_p = residual(cur_p, cur_q)
            if i + 1 < k:
                cur_q[rows, x] = 0.0
                cur_q /= cur_q.sum(axis=1, keepdims=True)
        return drafts, accept, cur_p
