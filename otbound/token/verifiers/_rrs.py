"""Recursive rejection sampling (RRS), with and without replacement.

**With replacement** (SpecInfer, Miao et al. 2305.09781): drafts i.i.d. from q; ``p_1 = p``; round i
accepts ``x_i`` w.p. ``min(1, p_i(x_i)/q(x_i))``, else ``p_{i+1} = norm((p_i − q)_+)``; if all K are
rejected, ``Y ~ p_{K+1}``.

Exact acceptance (derived; the recursion of Thomas et al., Dynamic Delayed Tree Expansion, Alg. 9,
is the independent check of the tests): with ``h(μ) = Σ (p − μ q)_+`` the residuals are
``p_i = (p − μ_i q)_+ / h(μ_i)`` with ``μ_1 = 0``, ``μ_{i+1} = μ_i + h(μ_i)`` (induction:
``(p_i − q)_+ = (p − μ_i q − h(μ_i) q)_+ / h(μ_i)``). Round i rejects with probability
``Σ (q − p_i)_+ = h(μ_{i+1})/h(μ_i)``, so all K rounds reject with probability ``h(μ_{K+1})``; the
final residual lives where ``r = p/q > μ_{K+1}`` while a rejected draft of round i has
``r < μ_{i+1} ≤ μ_{K+1}``, so no residual token is a draft and

    α = 1 − h(μ_{K+1}),

K binary searches per row on the ratio-sorted prefix sums (:mod:`otbound.token._kernel`).

**Without replacement** (Jeon et al. 2402.14160; Yang et al. 2401.06706): drafts drawn without
replacement (Gumbel-top-K); after rejecting ``x_i``: ``p_{i+1} = norm((p_i − q_i)_+)`` and
``q_{i+1} = norm(q_i with x_i zeroed)``. Costs O(n·V·K) time (per-row residuals), processed in
chunks of ``CHUNK_CELLS``.

Acceptance (derived): after rejecting ``x_1..x_{i−1}`` the target residual is
``(p − μ_i q)_+/h(μ_i)`` and the draft law ``q/S_i`` off the rejected tokens R
(``S_i = 1 − Σ q(x_j)``, summed directly), with ``μ_{i+1} = μ_i + h(μ_i)/S_i`` (the same induction
as with replacement, the draft law rescaled by ``1/S_i``). Rejected tokens have ``r < μ_i`` and carry
no residual mass, so ``α = 1 − P(all K rejected)`` and round i rejects with

    ρ_i = (Qc[n(μ_{i+1})] − q(R))/S_i − Σ_{μ_i ≤ r < μ_{i+1}} (p − μ_i q)/h(μ_i)
        = 1 − Qs[n(μ_{i+1})]/S_i − Σ_{μ_i ≤ r < μ_{i+1}} (p − μ_i q)/h(μ_i)

(prefix and suffix sums of the ratio-sorted row; the second form, used, keeps its accuracy when
``S_i`` is tiny, as R lies below ``n(μ_i)``). K ≤ 2: exact, summing ρ_2 over every first draft
x_1 with its round-1 rejection weight ``(q − p)_+(x_1)`` (a vector over the sorted row). K ≥ 3: exact by enumeration
of the draft tuples for small V; otherwise :meth:`RRSWithoutReplacementVerifier.batch_estimate`
gives a Rao–Blackwellised Monte Carlo estimate with ``mc_samples`` paths per position: the rejected
drafts ``x_1..x_{K−1}`` are drawn from their conditional law given rejection (inverse CDF by
binary search on the prefix sums) and the path's weight is ``Π ρ_i`` (the last round exactly), an
unbiased estimate of P(all rejected) with far less variance than counting accepted samples. One
set of paths of max K rounds serves every K ≥ 3: K's estimate uses the paths' first K rounds (a
draft's law does not depend on how many drafts follow it; the estimates of different K are
correlated).
"""

from __future__ import annotations

import math

import numpy as np

from otbound._backend import on_accelerator
from otbound.token._kernel import greedy_split_rows
from otbound.token.verifiers._base import SequentialVerifier, ratio_min1, residual


def _torch():
    import torch

    return torch


def rrs_thresholds(batch, k: int):
    """``(μ_{k}, h(μ_{k}))`` of the RRS recursion (module docstring), each (B, 1), cached per batch:
    μ_1 = 0, μ_{i+1} = μ_i + h(μ_i)."""
    if k == 1:
        torch = _torch()
        mu = torch.zeros(batch.rows, 1, dtype=torch.float64, device=batch.p.device)
        return batch.memo(("rrs_mu", 1), lambda: (mu, batch.sorted.h(mu)))

    def build():
        mu, h = rrs_thresholds(batch, k - 1)
        mu = mu + h
        return mu, batch.sorted.h(mu)

    return batch.memo(("rrs_mu", k), build)


class RRSVerifier(SequentialVerifier):
    """SpecInfer recursive rejection sampling, drafts i.i.d. from q (2305.09781).

    ``p_1 = p``; round i accepts x_i w.p. ``min(1, p_i(x_i)/q(x_i))``, else
    ``p_{i+1} = norm((p_i − q)_+)``; if all K reject, ``Y ~ p_{K+1}``. Lossless, with acceptance
    ``α = 1 − h(μ_{K+1})``, ``h(μ) = Σ (p − μ q)_+``, ``μ_1 = 0``, ``μ_{i+1} = μ_i + h(μ_i)``
    (module docstring). The instance in :data:`otbound.VERIFIERS` is ``"rrs"``.

    References
    ----------
    Miao et al., "SpecInfer", arXiv 2305.09781.

    Examples
    --------
    >>> import numpy as np
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> from otbound.token.verifiers import RRSVerifier
    >>> v = RRSVerifier()
    >>> round(v.acceptance(p, q, 2), 6)
    0.76
    >>> v.conditional_law(p, q, [2, 2]).round(6).tolist()  # 2 rejected twice: Y ~ p_3
    [0.6, 0.0, 0.4]
    """

    name = "rrs"
    planned = True
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

    def batch_acceptance(self, batch, num_drafts):
        """``α = 1 − h(μ_{K+1})`` per row (module docstring), (B,) float64 on the batch's device.

        Examples
        --------
        >>> import numpy as np
        >>> from otbound.token import LawBatch
        >>> from otbound.token.verifiers import RRSVerifier
        >>> b = LawBatch(np.array([[0.5, 0.3, 0.2]]), np.array([[0.2, 0.3, 0.5]]))
        >>> RRSVerifier().batch_acceptance(b, 2).numpy().round(6)
        array([0.76])
        """
        if not on_accelerator(batch.p) and "sorted" not in batch.__dict__:
            # rows not sorted (a single call): h(μ) summed directly, one pass per round, no sort
            return _rrs_unsorted(batch, num_drafts + 1)  # numpy only: no torch threads to pin
        return 1.0 - rrs_thresholds(batch, num_drafts + 1)[1][:, 0]


def _rrs_unsorted(batch, k: int):
    """``1 − h(μ_k)`` per row, (B,) float64 CPU tensor, by the recursion of :func:`rrs_thresholds` with
    ``h(μ) = Σ (p − μ q)_+`` summed directly over each row (k − 1 passes, no ratio sort); the same
    values as the sorted prefix sums' to float64 summation (≤ 1e-15 on the benchmark's rows). One
    row at a time through one (V,) buffer (it stays in cache)."""
    torch = _torch()
    P, Q = batch.numpy_rows()  # (B, V) each
    out = np.empty(batch.rows)  # (B,)
    buf = np.empty(batch.vocab)  # (V,)
    for i in range(batch.rows):
        p, q = P[i], Q[i]
        mu, h = 0.0, float(p.sum())  # h(0) = Σ p (p ≥ 0)
        for _ in range(k - 1):
            mu += h
            np.multiply(q, -mu, out=buf)
            buf += p
            np.maximum(buf, 0.0, out=buf)
            h = float(buf.sum())
        out[i] = 1.0 - h
    return torch.from_numpy(out)


class RRSWithoutReplacementVerifier(SequentialVerifier):
    """Recursive rejection sampling with drafts without replacement (Jeon et al. 2402.14160).

    After rejecting x_i: ``p_{i+1} = norm((p_i − q_i)_+)`` and ``q_{i+1} = norm(q_i with x_i
    zeroed)``; round i accepts x_i w.p. ``min(1, p_i(x_i)/q_i(x_i))``. Lossless; acceptance exact in
    closed form for K ≤ 2, by enumeration for small V, else estimated (module docstring). The
    instance in :data:`otbound.VERIFIERS` is ``"rrs_wor"``.

    References
    ----------
    Jeon et al., "Recursive speculative decoding", arXiv 2402.14160; Yang et al., "Multi-candidate
    speculative decoding", arXiv 2401.06706.

    Examples
    --------
    >>> import numpy as np
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> from otbound.token.verifiers import RRSWithoutReplacementVerifier
    >>> v = RRSWithoutReplacementVerifier()
    >>> round(v.acceptance(p, q, 2), 6), round(v.acceptance(p, q, 3), 6)
    (0.82, 1.0)
    >>> v.lossless_error(p, q, 2) < 1e-15
    True
    """

    name = "rrs_wor"
    monte_carlo = "K ≥ 3 beyond the enumeration limit (V^K tuples): Rao–Blackwellised paths"
    planned = True
    synthetic_max_drafts = 2
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

    def batch_acceptance(self, batch, num_drafts):
        """Exact acceptance per row: K = 1, 2 in closed form on the sorted rows (module docstring),
        K ≥ 3 by enumeration where V is small (else None: :meth:`batch_estimate`).

        Examples
        --------
        >>> import numpy as np
        >>> from otbound.token import LawBatch
        >>> from otbound.token.verifiers import RRSWithoutReplacementVerifier
        >>> b = LawBatch(np.array([[0.5, 0.3, 0.2]]), np.array([[0.2, 0.3, 0.5]]))
        >>> RRSWithoutReplacementVerifier().batch_acceptance(b, 2).numpy().round(6)
        array([0.82])
        """
        if num_drafts <= 2:
            return batch.memo(("rrs_wor", num_drafts), lambda: _rrs_wor_exact(batch, num_drafts))
        return super().batch_acceptance(batch, num_drafts)

    def batch_estimate(self, batch, num_drafts, mc_samples: int = 64, rng=None) -> dict:
        """As :meth:`Verifier.batch_estimate`, with the Rao–Blackwellised Monte Carlo of the module
        docstring (``mc_samples`` paths per position, the batch's torch generator; one set of paths
        of max K rounds for every K ≥ 3) where no exact value is computable.

        Examples
        --------
        >>> import numpy as np
        >>> from otbound.token import LawBatch
        >>> from otbound.token.verifiers import RRSWithoutReplacementVerifier
        >>> rng = np.random.default_rng(0)
        >>> p, q = rng.dirichlet(np.ones(400), 2), rng.dirichlet(np.ones(400), 2)
        >>> res = RRSWithoutReplacementVerifier().batch_estimate(LawBatch(p, q), (2, 3), mc_samples=16)
        >>> res[2][1], res[3][1], tuple(res[3][0].shape)
        ('exact', 'monte_carlo', (2,))
        """
        out, todo = self._exact_estimates(batch, num_drafts)
        if todo:
            horizon = max(todo)
            weights = batch.memo(("rrs_wor_paths", int(mc_samples), horizon),
                                 lambda: _rrs_wor_paths(batch, horizon, int(mc_samples)))
            for k in todo:
                out[k] = ((1.0 - weights[k - 1].mean(1)).clamp(0.0, 1.0), "monte_carlo")
        return out


def _rrs_wor_exact(batch, k):
    """α of RRS without replacement for K = 1, 2 (module docstring), (B,). K = 2 goes one row at a
    time on the CPU (a row's first-draft arrays stay in cache), the whole batch at once on an
    accelerator."""
    torch = _torch()
    srt = batch.sorted
    mu1, h1 = rrs_thresholds(batch, 1)
    if k == 1:
        return 1.0 - _reject(srt, mu1, h1, torch.ones_like(mu1), torch.zeros_like(mu1))[:, 0]
    mu2 = mu1 + h1  # (B, 1)
    h2 = srt.h(mu2)  # (B, 1)
    n_mu2 = srt.count_below(mu2)  # (B, 1)
    top = greedy_split_rows(batch, 1)[2]  # (B, 1): the largest q per row
    if on_accelerator(srt.r):
        return 1.0 - _rejected_twice(srt, h1, mu2, h2, n_mu2, top)
    scalars = _first_draft_scalars(srt, mu2, h2, n_mu2)  # every row's at once; the sums row by row
    return 1.0 - torch.cat([_rejected_twice(srt.row(i), h1[i : i + 1], mu2[i : i + 1], h2[i : i + 1],
                                            n_mu2[i : i + 1], top[i : i + 1], tuple(x[i : i + 1] for x in scalars))
                            for i in range(batch.rows)])


def _rejected_twice(srt, h1, mu2, h2, n_mu2, top, scalars=None):
    """P(both drafts rejected) at K = 2, (B,): Σ over first drafts x_1 of their round-1 rejection
    weight ``(q − p/h_1)_+(x_1)`` times ρ_2 (:func:`_reject_first_drafts`); rows (B, ·) of ``srt``
    and their μ_2, h_2 = h(μ_2), n(μ_2), h_1 and largest q, each (B, 1). ``S_2 = Σ_{x ≠ x_1} q``
    is ``q_tot − q(x_1)`` wherever ``q(x_1) ≤ 1/2`` (then S_2 ≥ 1/2: one rounding); a token of
    q > 1/2 (one per row at most) has its S_2 as the other tokens' mass summed directly (exact in
    relative terms however small) and its term by the general round (:func:`_reject`). ``scalars``:
    the rows' :func:`_first_draft_scalars` if the caller has them."""
    torch = _torch()
    n1 = int(n_mu2.max()) if n_mu2.numel() else 0  # first drafts that can be rejected: r < μ_2
    qx = srt.qs[:, :n1]  # (B, n1), a view
    w1 = torch.addcdiv(qx, srt.ps[:, :n1], h1, value=-1.0).clamp_min_(0.0)  # rejection weights, (B, n1)
    s2 = torch.rsub(qx, srt.q_tot)  # (B, n1)
    if not bool((top > 0.5).any()):
        floor = srt.q_tot - top  # (B, 1) ≤ q_tot − q(x_1) for every x_1, as rounded (q(x_1) ≤ top)
        return _reject_first_drafts(srt, mu2, h2, s2, qx, w1, n_mu2, floor, scalars)
    if w1.shape[0] > 1:  # an accelerator's batch: S_2 of every first draft summed directly
        s2 = srt.qsuf_range(1, n1 + 1).add_(srt.qc[:, :n1])  # Σ_{x ≠ x_1} q, (B, n1) (a fresh array)
        return _reject_first_drafts(srt, mu2, h2, s2, qx, w1, n_mu2, scalars=scalars)
    # one row whose token of q > 1/2 (at most one) is taken out of the sums: every other S_2 > 1/2;
    # its own S_2 summed directly and its ρ_2 by the general round
    big = torch.nonzero(qx[0] > 0.5)[:, 0]  # (0 or 1,)
    w_big = w1[0, big].clone()
    w1[0, big] = 0.0
    s2[0, big] = 1.0  # no term, no crossing
    rest = _reject_first_drafts(srt, mu2, h2, s2, qx, w1, n_mu2, scalars=scalars)
    if not big.numel():
        return rest
    s_big = srt.qc[0, big] + srt._qrs[0, srt.v - 1 - big]  # Σ_{x ≠ big} q, summed directly
    rho = _reject(srt, mu2, h2, s_big[None], qx[:, big], n_mu2)[0]
    return rest + (w_big * rho).sum()


def _rrs_wor_paths(batch, horizon, mc_samples):
    """Path weights ``Π_{i ≤ K} ρ_i`` for K = 1..horizon (a list of (B, mc_samples) tensors) of the
    Rao–Blackwellised Monte Carlo (module docstring), drawn with the batch's generator."""
    torch = _torch()
    srt = batch.sorted
    b, v = srt.r.shape
    dev = srt.r.device
    f64 = torch.float64
    mu1, h1 = rrs_thresholds(batch, 1)
    shape = (b, mc_samples)
    mu = mu1.expand(shape).contiguous()
    h = h1.expand(shape).contiguous()
    s = srt.q_tot.expand(shape).contiguous()
    removed_pos = torch.full((b, mc_samples, horizon), v + 1, dtype=torch.int64, device=dev)
    removed_q = torch.zeros((b, mc_samples, horizon), dtype=f64, device=dev)
    weight = torch.ones(shape, dtype=f64, device=dev)
    out = []
    n_mu = srt.count_below(mu)  # (B, mc_samples) n(μ), each round's n(μ_next) the next round's
    for i in range(horizon):
        # μ_next as the draw forms it; where h > 0 and S > 0 it is _reject's μ + h/S, where h = 0 both
        # are μ, and where S ≤ 0 (h > 0) the round's ρ is 0 whatever n(μ_next): one search serves both
        mu_next = mu + torch.where(h > 0, h / s, torch.zeros_like(h))
        n_next = srt.count_below(mu_next)  # (B, mc_samples)
        q_rem = removed_q.sum(2)
        rho = _reject(srt, mu, h, s, q_rem, n_mu, n_next)
        weight = weight * rho
        out.append(weight)
        if i == horizon - 1:
            break
        u = torch.rand(shape, generator=batch.generator, dtype=f64, device=dev) * rho
        pos = _draw_rejected(srt, mu, h, s, mu_next, removed_pos, removed_q, u, n_mu, n_next)
        qx = torch.gather(srt.qs, 1, pos)
        removed_pos[:, :, i] = pos
        removed_q[:, :, i] = qx
        s = s - qx
        mu, n_mu = mu_next, n_next
        h = srt.h(mu, n_mu)
    return out


def _first_draft_scalars(srt, mu2, h2, n_mu2):
    """``(live, d, tail, gap)`` per row, each (B, 1), of :func:`_reject_first_drafts`: h_2 > 0, the
    band term D = Σ_{μ_2 ≤ r < μ_2 + h_2} (p − μ_2 q)/h_2, Qs[n(μ_2 + h_2)] and r_next − μ_2 (r_next
    the first ratio at or above μ_2 + h_2, inf past the last)."""
    torch = _torch()
    live = h2 > 0  # (B, 1)
    safe_h = torch.where(live, h2, torch.ones_like(h2))
    base = srt.count_below(mu2 + h2)  # (B, 1)
    q_hi, q_lo = srt.at(srt.qc, base), srt.at(srt.qc, n_mu2)
    d = ((srt.at(srt.pc, base) - srt.at(srt.pc, n_mu2)) - mu2 * (q_hi - q_lo)) / safe_h  # (B, 1)
    # Qc[n] − q(x_1) = S_2 − Qs[n] (x_1 lies below n): no cancellation when S_2 is tiny
    tail = srt.qsuf(base)  # (B, 1)
    v = srt.r.shape[1]
    r_next = torch.gather(srt.r, 1, base.clamp(max=v - 1)).masked_fill_(base >= v, math.inf)  # (B, 1)
    return live, d, tail, r_next - mu2


def _reject_first_drafts(srt, mu2, h2, s2, qx, w1, n_mu2, s2_floor=None, scalars=None):
    """``Σ_{x_1} w1(x_1) ρ_2(x_1)`` per row, (B,): ρ_2 of every first draft x_1 (states (B, m):
    S_2 = s2, q(x_1) = qx, weights w1; μ_2, h_2 and n(μ_2) per row, (B, 1)).

    μ_3 = μ_2 + h_2/S_2 ≥ μ_2 + h_2, and for most first drafts (q(x_1) tiny, S_2 ≈ 1) no ratio lies in
    [μ_2 + h_2, μ_3): then n(μ_3) is the row's n(μ_2 + h_2) and :func:`_reject` reduces to
    ``ρ_2 = 1 − Qs[n]/S_2 − D`` with Qs[n] and D per row, so the sum is two reductions,
    ``(1 − D) Σ w1 − Qs[n] Σ w1/S_2`` (the clamp of each ρ_2 to [0, 1] left out: it would move the
    sum by rounding errors only). In a row with first drafts whose μ_3 does cross a ratio (found
    from the smallest S_2: μ_3 > r_next ⟺ h_2 > (r_next − μ_2) S_2, monotone in S_2), those drafts'
    terms are swapped for the general round (:func:`_reject`; on the CPU :func:`_crossing_round`,
    the same values) where their S_2 ≥ 1/2, so that every term is at
    most 2 w1 and the swap costs no accuracy; else the row sums ρ_2 draft by draft. ``s2_floor``
    (B, 1): a lower bound of each row's S_2 known to the caller (default: their minimum);
    ``scalars``: the rows' :func:`_first_draft_scalars` if the caller has them.
    """
    torch = _torch()
    live, d, tail, gap = _first_draft_scalars(srt, mu2, h2, n_mu2) if scalars is None else scalars  # (B, 1) each
    total = w1.sum(1, keepdim=True) * (1.0 - d) - tail * torch.div(w1, s2).sum(1, keepdim=True)  # (B, 1)
    if s2.shape[1]:  # μ_3 > r_next ⟺ h_2/S_2 > r_next − μ_2 (S_2 > 0 for every drawable first draft)
        floor = s2.amin(1, keepdim=True) if s2_floor is None else s2_floor  # (B, 1): ≤ every S_2 of the row
        crossing = (h2 > gap * floor) & live
        for row in torch.nonzero(crossing[:, 0]).flatten().tolist():
            far = _crossing(h2[row], gap[row], s2[row])  # (f,) the drafts whose μ_3 crosses
            if not far.numel():  # the floor of S_2 is a bound: no draft crosses after all
                continue
            if not on_accelerator(far):  # numpy on the row's memory, a window of it per draft
                s_far = torch.from_numpy(s2[row].numpy().take(far.numpy()))  # (f,)
                general = torch.from_numpy(_crossing_round(srt, row, float(mu2[row, 0]), float(h2[row, 0]),
                                                           int(n_mu2[row, 0]), s_far.numpy()))  # (f,)
            else:
                s_far = s2[row, far]  # (f,)
                mu3 = mu2[row] + h2[row] / s_far  # (f,) as _reject forms μ + h/S
                lo = int(n_mu2[row, 0])  # n(μ_3) lies in [n(μ_2), n(max μ_3)]: searched in that window only
                hi = int(torch.searchsorted(srt.r[row], mu3.max().reshape(1), side="left")[0])
                n3 = torch.searchsorted(srt.r[row, lo:hi], mu3, side="left") + lo  # (f,)
                general = _reject(srt.row(row), mu2[row : row + 1], h2[row : row + 1], s_far[None],
                                  qx[row : row + 1, far], n_mu2[row : row + 1], n3[None])[0]  # (f,)
            if bool((s_far >= 0.5).all()):  # swap their terms of the sums for ρ_2 itself (all terms ≤ 2 w1)
                shortcut = torch.div(tail[row], s_far).neg_().add_(1.0).sub_(d[row])  # (f,) as summed above
                total[row] += (torch.index_select(w1[row], 0, far) * general.sub_(shortcut)).sum()
            else:  # a tiny S_2 (w1/S_2 large): the row summed draft by draft
                rho = torch.div(tail[row], s2[row]).neg_().add_(1.0).sub_(d[row]).clamp_(0.0, 1.0)  # (m,)
                rho[far] = general
                total[row] = (w1[row] * rho).sum()
    return torch.where(live, total, torch.zeros_like(total))[:, 0]


def _crossing(h2, gap, s2):
    """The first drafts of one row whose μ_3 crosses r_next: the increasing positions (f,) int64 where
    ``h_2 > gap · S_2`` (``h2``, ``gap`` (1,) tensors, ``S_2 = s2`` (m,)). On the CPU by numpy on the
    row's memory, elsewhere by torch; the same drafts either way. On the CPU the product is not
    formed: for 0 < gap < inf the rounded ``gap · x`` is non-decreasing in x,
    so ``h_2 > gap · S_2`` ⟺ ``S_2 < t`` with t the smallest float where ``gap · t ≥ h_2``
    (:func:`_product_threshold`), one comparison and ``flatnonzero`` (a third of the time of torch's
    ``nonzero``)."""
    torch = _torch()
    if on_accelerator(s2):
        return torch.nonzero(h2 > gap * s2)[:, 0]
    g, h = float(gap), float(h2)
    t = _product_threshold(h, g)
    if t is not None:
        return torch.from_numpy(np.flatnonzero(np.less(s2.numpy(), t)))
    with np.errstate(invalid="ignore", over="ignore"):  # inf · 0 = NaN, never below h_2: as torch compares it
        prod = np.multiply(s2.numpy(), g)  # (m,) gap · S_2
    return torch.from_numpy(np.flatnonzero(np.less(prod, h)))


def _product_threshold(h, g):
    """The smallest float t with ``g · t ≥ h`` as rounded (``g · x < h`` ⟺ ``x < t``, as the rounded
    product is non-decreasing in x), for finite ``0 < g`` and finite h; None otherwise, or if the
    steps from ``h/g`` do not settle (the caller then compares the products)."""
    if not (0.0 < g < math.inf and math.isfinite(h)):
        return None
    t = h / g
    for _ in range(8):  # down until g · t < h: then t's successor is the first candidate
        if not t * g >= h:
            break
        t = math.nextafter(t, -math.inf)
    else:
        return None
    for _ in range(8):  # up to the first t with g · t ≥ h
        t = math.nextafter(t, math.inf)
        if t * g >= h:
            return t
    return None


def _crossing_round(srt, row, mu2, h2, n_mu2, s_far):
    """ρ_2 of a row's crossing first drafts (f,) float64, on the CPU: :func:`_reject` in the state
    (μ_2, h_2 > 0, S_2 = ``s_far`` (f,), numpy) with n(μ_2) = ``n_mu2``. Every n(μ_3) lies in the short
    window of the sorted row between n(min μ_3) and n(max μ_3) (searched there alone), so the
    round's per-position terms Qs[n] and the band ``((Pc[n] − Pc[n(μ_2)]) − μ_2 (Qc[n] − Qc[n(μ_2)]))/h_2``
    are formed once per window position and gathered per draft: the same float64 operations as
    :func:`_reject`, bit for bit (its gathers from the whole row cost more than the round itself)."""
    r = srt.r[row].numpy()  # (V,)
    with np.errstate(divide="ignore", invalid="ignore"):  # S_2 = 0 (no ρ_2: 0, as _reject has it)
        mu3 = mu2 + h2 / s_far  # (f,) as _reject forms μ + h/S
        hi = int(np.searchsorted(r, mu3.max(), side="left"))  # n(max μ_3)
        j0 = int(np.searchsorted(r[n_mu2:hi], mu3.min(), side="left")) + n_mu2  # n(min μ_3)
        k = np.searchsorted(r[j0:hi], mu3, side="left")  # (f,) n(μ_3) − j0
        pc, qc = srt.pc[row].numpy()[j0 : hi + 1], srt.qc[row].numpy()[j0 : hi + 1]  # (hi − j0 + 1,) each
        q_suf = srt.row(row).qsuf_range(j0, hi + 1)[0].numpy()  # (hi − j0 + 1,) Qs[n], n = j0..hi
        band = (pc - float(srt.pc[row, n_mu2])) - mu2 * (qc - float(srt.qc[row, n_mu2]))  # (hi − j0 + 1,)
        band /= h2
        rho = np.subtract(1.0, q_suf.take(k) / s_far) - band.take(k)  # (f,)
        np.minimum(np.maximum(rho, 0.0, out=rho), 1.0, out=rho)  # clamped to [0, 1]
        return np.where(s_far > 0, rho, 0.0)


def _reject(srt, mu, h, s, q_removed, n0=None, n1=None):
    """ρ = P(reject) of a round in state (μ, h = h(μ), S, q-mass of the rejected drafts); all (B, m).
    ``n0``, ``n1``: n(μ) and n(μ + h/S) if already known."""
    torch = _torch()
    live = (h > 0) & (s > 0)
    safe_h = torch.where(live, h, torch.ones_like(h))
    safe_s = torch.where(live, s, torch.ones_like(s))
    n0 = srt.count_below(mu) if n0 is None else n0
    n1 = srt.count_below(mu + h / safe_s) if n1 is None else n1
    q_lo, q_hi = srt.at(srt.qc, n0), srt.at(srt.qc, n1)
    band = (srt.at(srt.pc, n1) - srt.at(srt.pc, n0)) - mu * (q_hi - q_lo)
    # the rejected tokens R all lie below n(μ) ≤ n1, so Qc[n1] − q(R) = S − Qs[n1]: computed so, no
    # cancellation when S is tiny (S itself is summed directly by the callers)
    rho = 1.0 - srt.qsuf(n1) / safe_s - band / safe_h
    return torch.where(live, rho.clamp(0.0, 1.0), torch.zeros_like(rho))


def _draw_rejected(srt, mu, h, s, mu_next, removed_pos, removed_q, u, n0=None, hi=None):
    """Sorted position (B, m) of a draft drawn from the rejected-draft law of the state (each (B, m);
    the rejected drafts' positions and q ``removed_pos``, ``removed_q`` (B, m, H), unset columns at
    position V + 1), by binary search for ``u`` in its cumulative weight
    ``W(n) = (Qc[n] − q(R ∩ [0, n)))/S − D(n)/h`` on [0, n(μ_next)); ``n0``, ``hi``: n(μ) and
    n(μ_next) if already known. On the CPU the search runs in numpy on the flattened paths
    (:func:`_bisect_rejected`), elsewhere in torch; the same float64 operations and comparisons
    either way."""
    torch = _torch()
    n0 = srt.count_below(mu) if n0 is None else n0
    hi = srt.count_below(mu_next) if hi is None else hi
    pc0, qc0 = srt.at(srt.pc, n0), srt.at(srt.qc, n0)
    safe_h = torch.where(h > 0, h, torch.ones_like(h))
    search = _bisect_rejected_torch if on_accelerator(hi) else _bisect_rejected
    return search(srt, mu, s, n0, hi, pc0, qc0, safe_h, removed_pos, removed_q, u)


def _bisect_rejected_torch(srt, mu, s, n0, hi, pc0, qc0, safe_h, removed_pos, removed_q, u):
    """The binary search of :func:`_draw_rejected` in torch, (B, m) int64 (on an accelerator)."""
    torch = _torch()
    lo = torch.zeros_like(n0)

    def cum(m):
        qm, pm = srt.at(srt.qc, m), srt.at(srt.pc, m)
        rem = (removed_q * (removed_pos < m.unsqueeze(2))).sum(2)
        d = torch.where(m > n0, (pm - pc0) - mu * (qm - qc0), torch.zeros_like(qm))
        return (qm - rem) / s - d / safe_h

    while bool((hi - lo > 1).any()):
        mid = (lo + hi) // 2
        below = cum(mid) <= u
        lo = torch.where(below, mid, lo)
        hi = torch.where(below, hi, mid)
    return lo


def _bisect_rejected(srt, mu, s, n0, hi, pc0, qc0, safe_h, removed_pos, removed_q, u):
    """The binary search of :func:`_draw_rejected` on the CPU, (B, m) int64: numpy on the paths
    flattened to (B·m,), the positions read from the flattened prefix sums (a numpy operation on
    10³ entries costs a quarter of torch's). The same midpoints, float64 operations and
    comparisons as the torch loop, so the same draws: the rejected drafts' q below a midpoint are
    summed as torch sums them (where at most two columns are set, any order gives the same sum;
    else by torch's own sum over the H columns)."""
    torch = _torch()
    b, m = hi.shape
    width = srt.pc.shape[1]  # V + 1
    # positions as offsets into the flattened sums: row i's position n is i (V + 1) + n (midpoints,
    # comparisons and differences of positions of one row unchanged)
    base = np.repeat(np.arange(b, dtype=np.int64) * width, m)  # (B·m,) each path's row start
    pc, qc = srt.pc.reshape(-1).numpy(), srt.qc.reshape(-1).numpy()  # (B·(V + 1),) each
    mu, s, pc0, qc0, safe_h, u = (x.reshape(-1).numpy() for x in (mu, s, pc0, qc0, safe_h, u))  # (B·m,) each
    n0 = n0.reshape(-1).numpy() + base  # (B·m,)
    lo = base.copy()  # (B·m,)
    hi = hi.reshape(-1).numpy() + base  # (B·m,)
    set_cols = np.flatnonzero((removed_pos <= srt.v).any(1).any(0).numpy())  # (·,) columns holding a draft
    cols = int(set_cols[-1]) + 1 if set_cols.size else 0
    pos = removed_pos.reshape(b * m, -1).numpy() + base[:, None]  # (B·m, H)
    rq = removed_q.reshape(b * m, -1).numpy()  # (B·m, H)

    def removed_below(n):  # (B·m,) q(R ∩ [0, n)) as torch's sum over the H columns forms it
        if cols == 0:
            return None
        if cols <= 2:
            rem = rq[:, 0] * (pos[:, 0] < n)
            if cols == 2:
                rem += rq[:, 1] * (pos[:, 1] < n)
            return rem
        return torch.from_numpy(rq * (pos < n[:, None])).sum(1).numpy()

    while (hi - lo > 1).any():
        mid = (lo + hi) // 2  # (B·m,) (2 · row start + lo + hi)//2 = row start + the row's midpoint
        qm, pm = qc.take(mid), pc.take(mid)  # (B·m,) each
        rem = removed_below(mid)
        d = np.where(mid > n0, (pm - pc0) - mu * (qm - qc0), 0.0)  # (B·m,)
        w = ((qm if rem is None else qm - rem) / s) - d / safe_h  # (B·m,) W(mid)
        below = w <= u
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return torch.from_numpy((lo - base).reshape(b, m))
