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

from otbound._backend import on_one_cpu_thread
from otbound._validation import InvalidInputError
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
    >>> from otbound import VERIFIERS, optimal_acceptance
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> [bool(VERIFIERS["kseq"].acceptance(p, q, k) >= (1 - np.exp(-1)) * optimal_acceptance(p, q, k)) for k in (1, 4)]
    [True, True]
    """

    name = "kseq"
    planned = True
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
        >>> rows = LawBatch(np.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]]), np.array([[0.2, 0.3, 0.5]] * 2))
        >>> KSeqVerifier().batch_acceptance(rows, 2).numpy().round(6).tolist()   # the second row: p = q
        [0.791355, 1.0]
        """
        return batch.memo(("kseq", num_drafts), lambda: _kseq_batch(batch.sorted, (num_drafts,))[0])

    @on_one_cpu_thread
    def batch_estimate(self, batch, num_drafts, mc_samples: int = 64, rng=None) -> dict:
        """As :meth:`otbound.token.Verifier.batch_estimate`, the Ks of ``num_drafts`` not yet computed
        on ``batch`` searched together: one search for ρ* over (K, row) pairs, whose rounds' fixed
        costs (a few dozen numpy calls each, most of the search's time at V = 151,936) are then
        shared by the Ks. The same values as one K at a time (each pair's arithmetic is its own)."""
        ks = []
        for k in num_drafts:
            try:
                ks.append(self.check_num_drafts(batch, k))
            except InvalidInputError:
                continue  # refused again, with its reason, below
        todo = sorted({k for k in ks if ("kseq", k) not in batch._memo})
        if len(todo) > 1:
            for k, values in zip(todo, _kseq_batch(batch.sorted, todo)):
                batch._memo[("kseq", k)] = values
        return super().batch_estimate(batch, num_drafts, mc_samples, rng)


_PROBES = 64  # bracket points evaluated at once per row and round of the search for ρ*


def _kseq_batch(srt, ks):
    """``1 − (1 − β(ρ*))^K`` per row (B,) on the batch's device for each K of ``ks`` (a list of (B,)
    tensors), ρ* the root of ``f(ρ) = p_acc(β(ρ)) − ρ β(ρ)`` on [1, K] at float64 resolution, the
    end with f ≤ 0 (as :func:`kseq_rho`), for every (K, row) pair at once.

    ``β(ρ) = Pc[n(ρ)]/ρ + Qs[n(ρ)]`` needs ``n(ρ) = #{r < ρ}`` (a binary search of the sorted row)
    only while a row's bracket holds a ratio: each round evaluates f at ``_PROBES`` − 1 points of
    every open bracket and keeps the sub-interval where f changes sign (6 bits per round instead
    of a halving's 1), until ``n(lo) = n(hi)``; inside that one ratio gap, where n is fixed, Newton's
    method on (B,) float64 arrays (:func:`_root_in_segment`) gives the float with computed
    ``f ≤ 0`` next to the sign change, the end :func:`kseq_rho`'s halvings keep up to the rounding
    of f (a few ulps of ρ*, ~1e-16 in α)."""
    import torch

    dev = srt.r.device
    b = srt.r.shape[0]
    pairs = len(ks) * b  # the search's rows: (K, row) pairs, K-major
    row_of = np.tile(np.arange(b), len(ks))  # (pairs,) each pair's row of the batch
    k_of = np.repeat(np.asarray(ks, dtype=np.float64), b)  # (pairs,) and its K (exact small integers)
    if dev.type == "cpu":  # the sorted rows read in place, one binary search per row
        r, prefix, rsuffix = srt.r.numpy(), srt.pc.numpy(), srt._qrs.numpy()  # (B, V), (B, V + 1) ×2

        def terms(rows, rho):
            """n(ρ), Pc[n(ρ)], Qs[n(ρ)] for ρ (len(rows), m) numpy at the given pairs, each (len(rows), m)."""
            at = row_of[rows]
            n = np.stack([np.searchsorted(r[i], x, "left") for i, x in zip(at, rho)])
            return n, prefix[at[:, None], n], rsuffix[at[:, None], srt.v - n]
    else:
        def terms(rows, rho):
            """n(ρ), Pc[n(ρ)], Qs[n(ρ)] for ρ (len(rows), m) numpy at the given pairs, each (len(rows), m)."""
            sel = torch.as_tensor(row_of[rows], device=dev)
            n = torch.searchsorted(srt.r[sel], torch.from_numpy(rho).to(dev).contiguous(), side="left")
            return (n.cpu().numpy(), torch.gather(srt.pc[sel], 1, n).cpu().numpy(),
                    torch.gather(srt._qrs[sel], 1, srt.v - n).cpu().numpy())

    below_one = np.nextafter(1.0, 0.0)  # min(β, this) = β wherever β < 1: no log1p(−1) to mask

    def f(rho, pc, qs, k):
        """f at ρ of pairs with K ``k`` (broadcasting with ρ)."""
        bt = pc / rho + qs
        p_acc = np.where(bt < 1.0, -np.expm1(k * np.log1p(-np.minimum(bt, below_one))), 1.0)
        return p_acc - rho * bt

    every = np.arange(pairs)
    lo, hi = np.ones(pairs), k_of.copy()  # (pairs,) each
    (n_lo, pc_lo, qs_lo), (n_hi, _, _) = (tuple(x[:, 0] for x in terms(every, end[:, None])) for end in (lo, hi))
    done = f(lo, pc_lo, qs_lo, k_of) <= 0.0  # ρ* = 1
    hi = np.where(done, lo, hi)
    steps = np.arange(1, _PROBES) / _PROBES  # (P − 1,)
    while True:
        rows = np.flatnonzero(~done & (n_lo != n_hi) & (hi > np.nextafter(lo, np.inf)))  # brackets holding a ratio
        if not rows.size:
            break
        x = lo[rows, None] + (hi - lo)[rows, None] * steps  # (o, P − 1), non-decreasing
        x = np.clip(x, lo[rows, None], hi[rows, None])
        n, pc, qs = terms(rows, x)
        nonpos = f(x, pc, qs, k_of[rows, None]) <= 0.0  # (o, P − 1)
        j = np.where(nonpos.any(1), nonpos.argmax(1), _PROBES - 1)  # the first probe with f ≤ 0 (P − 1: hi)
        below = j > 0  # the probe before it has f > 0: the new lo
        at = np.maximum(j - 1, 0)
        sub = rows[below]
        lo[sub], n_lo[sub], pc_lo[sub], qs_lo[sub] = (a[below, at[below]] for a in (x, n, pc, qs))
        inside = j < _PROBES - 1  # the probe with f ≤ 0: the new hi
        sub = rows[inside]
        hi[sub], n_hi[sub] = x[inside, j[inside]], n[inside, j[inside]]
    open_ = ~done & (hi > np.nextafter(lo, np.inf))
    if open_.any():  # one ratio gap each: n fixed at n(lo)
        hi[open_] = _root_in_segment(f, pc_lo[open_], qs_lo[open_], k_of[open_], lo[open_], hi[open_])
    rho = torch.from_numpy(hi.reshape(len(ks), b).T.copy()).to(dev)  # (B, len(ks)): ρ* of each row and K
    n = srt.count_below(rho)
    bt = srt.at(srt.pc, n) / rho + srt.qsuf(n)  # β(ρ*), (B, len(ks))
    k_col = torch.as_tensor(ks, dtype=torch.float64, device=dev).reshape(1, -1)  # (1, len(ks))
    alpha = torch.where(bt < 1.0, -torch.expm1(k_col * torch.log1p(-bt.clamp(max=1.0))), torch.ones_like(bt))
    return list(alpha.T)  # len(ks) × (B,)


def _root_in_segment(f, pc, qs, k, lo, hi):
    """The float ρ in [lo, hi] (each (m,)) with computed ``f(ρ) ≤ 0 < f(ρ⁻)`` (ρ⁻ the float below),
    where ``f(ρ) = p_acc(β) − ρ β``, ``β = pc/ρ + qs`` (fixed Pc[n], Qs[n] per row, K ``k`` (m,)) has
    ``f(lo) > 0 ≥ f(hi)``: safeguarded Newton steps (``f' = −K (1 − β)^(K−1) pc/ρ² − qs``; a
    halving where a step leaves the bracket), then single-ulp moves to the sign change."""
    lo, hi = lo.copy(), hi.copy()
    x = 0.5 * (lo + hi)
    groups = [(k == kv, int(kv) - 1) for kv in np.unique(k)]  # the pairs of each K: (1 − β)^(K−1) by an integer power
    lead = np.empty_like(x)  # (m,)
    for _ in range(60):
        fx = f(x, pc, qs, k)
        lo = np.where(fx > 0.0, x, lo)
        hi = np.where(fx > 0.0, hi, x)
        bt = pc / x + qs
        base = np.maximum(1.0 - bt, 0.0)
        for sel, power in groups:
            lead[sel] = base[sel] ** power
        slope = -k * lead * pc / (x * x) - qs  # f'(x) ≤ 0
        with np.errstate(divide="ignore", invalid="ignore"):
            step = np.where(slope < 0.0, fx / slope, 0.0)
        nxt = x - step
        nxt = np.where((nxt > lo) & (nxt < hi), nxt, 0.5 * (lo + hi))
        if np.all((np.abs(nxt - x) <= 4 * np.spacing(x)) | (hi <= np.nextafter(lo, np.inf))):
            break
        x = nxt
    rho = np.clip(x, lo, hi)
    for _ in range(64):  # up to the first float with f ≤ 0
        up = f(rho, pc, qs, k) > 0.0
        if not up.any():
            break
        rho = np.where(up, np.nextafter(rho, np.inf), rho)
    for _ in range(64):  # down while the float below also has f ≤ 0
        below = np.nextafter(rho, -np.inf)
        down = f(below, pc, qs, k) <= 0.0
        if not down.any():
            break
        rho = np.where(down, below, rho)
    return rho
