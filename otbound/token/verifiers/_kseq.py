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
``α = 1 − (1 − β(ρ*))^K`` exactly (the claim of theory.md §3; the tests check it to 1e-12).
"""

from __future__ import annotations

import numpy as np

from otbound.token.verifiers._base import SequentialVerifier, ratio_min1, residual


def _beta(p, q, rho):
    return float(np.minimum(p / rho, q).sum())


def _p_acc(beta, k):
    return float(-np.expm1(k * np.log1p(-beta))) if beta < 1.0 else 1.0


def kseq_rho(p: np.ndarray, q: np.ndarray, num_drafts: int) -> float:
    """ρ* of K-SEQ: the smallest ρ in [1, K] (to float64 resolution) with p_acc(ρ) ≤ ρ β(ρ)."""

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
    """SpecTr K-SEQ with ρ = ρ* (2310.15141)."""

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

    def _closed_form(self, p, q, aux, k):
        beta = aux["beta"]
        if beta >= 1.0:
            return 1.0
        rejected_law = (q - np.minimum(q, p / aux["rho"])) / (1.0 - beta)
        with np.errstate(divide="ignore"):  # log1p(-1) = -inf gives the exact 1 − 0^K = 1
            coincide = float(aux["residual"] @ -np.expm1(k * np.log1p(-np.minimum(rejected_law, 1.0))))
        return aux["p_acc"] + (1.0 - beta) ** k * coincide
