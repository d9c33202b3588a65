"""K-SEQ (SpecTr, Sun et al. 2310.15141, Algorithm "K-SEQ"), drafts i.i.d. from q.

With ``β(ρ) = Σ_x min(p(x)/ρ, q(x))`` and ``p_acc(ρ) = 1 − (1 − β(ρ))^K``: round i accepts ``x_i``
w.p. ``min(1, p(x_i)/(ρ q(x_i)))``; if all K reject, ``Y ∝ (p − γ min(p/ρ, q))_+`` with
``γ = p_acc/β``. The first-accepted token has law ``γ min(p/ρ, q)``, so the scheme is lossless iff
``γ ≤ ρ``, i.e. ``p_acc(ρ) ≤ ρ β(ρ)``. ``ρ*`` is the root of ``f(ρ) = p_acc(ρ) − ρ β(ρ)`` on
``[1, K]`` (f is non-increasing, ``f(1) ≥ 0 ≥ f(K)``); bisection to float64 resolution keeps the
end with ``f ≤ 0`` so the residual is non-negative. Guarantee (SpecTr): ``α ≥ (1 − 1/e) α*``.

Exact acceptance (derived): rounds reject independently given the drafts, so given all K rejected
the drafts are i.i.d. with law ``(q − min(q, p/ρ))/(1 − β)`` and

    α = p_acc + (1 − β)^K Σ_t r(t) [1 − (1 − (q(t) − min(q(t), p(t)/ρ))/(1 − β))^K],

r the residual. At the exact root γ = ρ, the residual is ``∝ (p − ρq)_+``, supported where
``p > ρq``, while a draft can only be rejected where ``p < ρq``: the coincidence term vanishes and
``α = 1 − (1 − β(ρ*))^K`` exactly (the claim of docs/theory/token-verifiers.md; the tests check it to 1e-12). At the
float64 root the coincidence term is at most ``|p_acc(ρ*) − ρ* β(ρ*)|`` (~1e-16: it carries the
factor ``1 − γ/ρ*`` and a mass ``≤ ρ* β``), so the acceptance is computed as ``1 − (1 − β(ρ*))^K``
for the whole batch: ``β(ρ) = Pc[n(ρ)]/ρ + Qs[n(ρ)]`` from the ratio-sorted prefix sums
(:mod:`otbound.token._kernel`), ρ* by the same bisection as :func:`kseq_rho`, for every row at once.
"""

from __future__ import annotations

import numpy as np

from otbound.token.verifiers._base import SequentialVerifier, ratio_min1, residual


def _beta(p, q, rho):
    return float(np.minimum(p / rho, q).sum())


def _p_acc(beta, k):
    return float(-np.expm1(k * np.log1p(-beta))) if beta < 1.0 else 1.0


def kseq_rho(p: np.ndarray, q: np.ndarray, num_drafts: int) -> float:
    """ρ* of K-SEQ: the smallest ρ in [1, K] (to float64 resolution) with p_acc(ρ) ≤ ρ β(ρ).

    ``β(ρ) = Σ_x min(p(x)/ρ, q(x))``, ``p_acc(ρ) = 1 − (1 − β(ρ))^K``; ρ* is the root of the
    non-increasing ``f(ρ) = p_acc(ρ) − ρ β(ρ)`` on [1, K], found by bisection keeping the end with
    ``f ≤ 0`` (so the K-SEQ residual is non-negative).

    Parameters
    ----------
    p, q : numpy.ndarray, shape (V,)
        Target and draft laws, already checked (float64, summing to 1; no validation here).
    num_drafts : int
        K ≥ 1.

    Returns
    -------
    float
        ρ* ∈ [1, K] (1 at K = 1).

    References
    ----------
    Sun et al., "SpecTr: fast speculative decoding via optimal transport", arXiv 2310.15141
    (K-SEQ).

    Examples
    --------
    >>> import numpy as np
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> from otbound.token.verifiers import kseq_rho
    >>> round(kseq_rho(p, q, 2), 6), kseq_rho(p, q, 1)
    (1.456776, 1.0)
    """

    def f(rho):
        b = _beta(p, q, rho)
        return _p_acc(b, num_drafts) - rho * b

    lo, hi = 1.0, float(num_drafts)
    if f(lo) <= 0.0:
        return lo
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            return hi
        if f(mid) > 0.0:
            lo = mid
        else:
            hi = mid


class KSeqVerifier(SequentialVerifier):
    """SpecTr K-SEQ with ρ = ρ* (2310.15141).

    Drafts i.i.d. from q; round i accepts x_i w.p. ``min(1, p(x_i)/(ρ* q(x_i)))``; if all K reject,
    ``Y ∝ (p − γ min(p/ρ*, q))_+`` with ``γ = p_acc/β`` (ρ* from :func:`kseq_rho`). Lossless, with
    acceptance ``α = 1 − (1 − β(ρ*))^K ≥ (1 − 1/e) α*``.

    The instance in :data:`otbound.VERIFIERS` is ``"kseq"``.

    References
    ----------
    Sun et al., "SpecTr: fast speculative decoding via optimal transport", arXiv 2310.15141.

    Examples
    --------
    >>> import numpy as np
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> import otbound as ob
    >>> from otbound.token.verifiers import KSeqVerifier
    >>> v = KSeqVerifier()
    >>> round(v.acceptance(p, q, 2), 6), round(ob.optimal_acceptance(p, q, 2), 6)
    (0.791355, 0.86)
    >>> v.lossless_error(p, q, 2) < 1e-15
    True
    """

    name = "kseq"
    reference = "SpecTr K-SEQ at ρ* (Sun et al. 2310.15141)"
    lossless = True
    sampling = "with_replacement"

    def _prepare(self, p, q, k):
        rho = kseq_rho(p, q, k)
        beta = _beta(p, q, rho)
        p_acc = _p_acc(beta, k)
        gamma = p_acc / beta if beta > 0 else 0.0
        return {"rho": rho, "beta": beta, "p_acc": p_acc, "residual": residual(p, gamma * np.minimum(p / rho, q))}

    def _rounds(self, p, q, aux, drafts):
        accept = ratio_min1(p[drafts], aux["rho"] * q[drafts])
        return drafts, accept, aux["residual"]

    def batch_acceptance(self, batch, num_drafts):
        """``α = 1 − (1 − β(ρ*))^K`` per row, ρ* by a batched bisection (module docstring).

        Examples
        --------
        >>> import numpy as np
        >>> from otbound.token import LawBatch
        >>> from otbound.token.verifiers import KSeqVerifier
        >>> b = LawBatch(np.array([[0.5, 0.3, 0.2]]), np.array([[0.2, 0.3, 0.5]]))
        >>> KSeqVerifier().batch_acceptance(b, 2).numpy().round(6)
        array([0.791355])
        """
        return batch.memo(("kseq", num_drafts), lambda: _kseq_batch(batch.sorted, num_drafts))


def _kseq_batch(srt, k):
    """``1 − (1 − β(ρ*))^K`` per row (B,) on the batch's device, ρ* by the bisection of
    :func:`kseq_rho` for every row at once.

    ``β(ρ) = Pc[n(ρ)]/ρ + Qs[n(ρ)]`` needs ``n(ρ) = #{r < ρ}`` (a binary search of the sorted row)
    only while a row's bracket holds a ratio: once ``n(lo) = n(hi)``, n is the same at every
    midpoint, and the remaining halvings (most of the ≈ 52) are arithmetic on (B,) float64 arrays
    (numpy, as :func:`kseq_rho`), with no search and no (B, V) access: Newton's method inside the
    bracket (:func:`_root_in_segment`) to the float64 root, the same end with f ≤ 0 as the
    halvings would give up to the rounding of f (a few ulps of ρ*, ~1e-16 in α)."""
    import torch

    dev = srt.r.device

    if dev.type == "cpu":  # the sorted rows read in place, one binary search per row
        r, prefix, rsuffix = srt.r.numpy(), srt.pc.numpy(), srt._qrs.numpy()  # (B, V), (B, V + 1) ×2
        rows = np.arange(r.shape[0])

        def terms(rho):
            """n(ρ), Pc[n(ρ)], Qs[n(ρ)] for ρ (B,) numpy, as (B,) numpy arrays."""
            n = np.array([np.searchsorted(r[i], rho[i], "left") for i in rows], dtype=np.int64)
            return n, prefix[rows, n], rsuffix[rows, srt.v - n]
    else:
        def terms(rho):
            """n(ρ), Pc[n(ρ)], Qs[n(ρ)] for ρ (B,) numpy, as (B,) numpy arrays."""
            n = srt.count_below(torch.from_numpy(rho).to(dev).reshape(-1, 1))  # (B, 1)
            return n[:, 0].cpu().numpy(), srt.at(srt.pc, n)[:, 0].cpu().numpy(), srt.qsuf(n)[:, 0].cpu().numpy()

    below_one = np.nextafter(1.0, 0.0)  # min(β, this) = β wherever β < 1: no log1p(−1) to mask

    def f(rho, pc, qs):
        bt = pc / rho + qs
        p_acc = np.where(bt < 1.0, -np.expm1(k * np.log1p(-np.minimum(bt, below_one))), 1.0)
        return p_acc - rho * bt

    b = srt.r.shape[0]
    lo, hi = np.ones(b), np.full(b, float(k))  # (B,) each
    lo_terms, hi_terms = terms(lo), terms(hi)  # (n, Pc[n], Qs[n]) at each end
    done = f(lo, *lo_terms[1:]) <= 0.0
    hi = np.where(done, lo, hi)
    hi_terms = tuple(np.where(done, a, c) for a, c in zip(lo_terms, hi_terms))
    while not done.all() and not (lo_terms[0] == hi_terms[0])[~done].all():  # some bracket holds a ratio
        mid = 0.5 * (lo + hi)
        done = done | (mid <= lo) | (mid >= hi)
        fixed = lo_terms[0] == hi_terms[0]  # no ratio in [lo, hi): n(mid) = n(lo)
        mid_terms = tuple(np.where(fixed, a, c) for a, c in zip(lo_terms, terms(mid)))
        pos = f(mid, *mid_terms[1:]) > 0.0
        to_lo, to_hi = ~done & pos, ~done & ~pos
        lo = np.where(to_lo, mid, lo)
        hi = np.where(to_hi, mid, hi)
        lo_terms = tuple(np.where(to_lo, a, c) for a, c in zip(mid_terms, lo_terms))
        hi_terms = tuple(np.where(to_hi, a, c) for a, c in zip(mid_terms, hi_terms))
    pc, qs = lo_terms[1], lo_terms[2]  # every open bracket's Pc[n], Qs[n] from here on
    open_ = ~done
    if open_.any():
        hi[open_] = _root_in_segment(f, pc[open_], qs[open_], k, lo[open_], hi[open_])
    rho = torch.from_numpy(hi).to(dev).reshape(-1, 1)  # (B, 1)
    n = srt.count_below(rho)
    bt = srt.at(srt.pc, n) / rho + srt.qsuf(n)  # β(ρ*), (B, 1)
    return torch.where(bt < 1.0, -torch.expm1(k * torch.log1p(-bt.clamp(max=1.0))), torch.ones_like(bt))[:, 0]


def _root_in_segment(f, pc, qs, k, lo, hi):
    """The float ρ in [lo, hi] (each (B,)) with computed ``f(ρ) ≤ 0 < f(ρ⁻)`` (ρ⁻ the float below),
    where ``f(ρ) = p_acc(β) − ρ β``, ``β = pc/ρ + qs`` (fixed Pc[n], Qs[n] per row) has
    ``f(lo) > 0 ≥ f(hi)``: safeguarded Newton steps (``f' = −K (1 − β)^(K−1) pc/ρ² − qs``; a
    halving where a step leaves the bracket), then single-ulp moves to the sign change."""
    lo, hi = lo.copy(), hi.copy()
    x = 0.5 * (lo + hi)
    for _ in range(60):
        fx = f(x, pc, qs)
        lo = np.where(fx > 0.0, x, lo)
        hi = np.where(fx > 0.0, hi, x)
        bt = pc / x + qs
        slope = -k * np.maximum(1.0 - bt, 0.0) ** (k - 1) * pc / (x * x) - qs  # f'(x) ≤ 0
        with np.errstate(divide="ignore", invalid="ignore"):
            step = np.where(slope < 0.0, fx / slope, 0.0)
        nxt = x - step
        nxt = np.where((nxt > lo) & (nxt < hi), nxt, 0.5 * (lo + hi))
        if np.all((np.abs(nxt - x) <= 4 * np.spacing(x)) | (hi <= np.nextafter(lo, np.inf))):
            break
        x = nxt
    rho = np.clip(x, lo, hi)
    for _ in range(64):  # up to the first float with f ≤ 0
        up = f(rho, pc, qs) > 0.0
        if not up.any():
            break
        rho = np.where(up, np.nextafter(rho, np.inf), rho)
    for _ in range(64):  # down while the float below also has f ≤ 0
        below = np.nextafter(rho, -np.inf)
        down = f(below, pc, qs) <= 0.0
        if not down.any():
            break
        rho = np.where(down, below, rho)
    return rho
