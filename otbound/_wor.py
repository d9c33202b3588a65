"""Q(H) for drafts drawn without replacement, by exponential clocks (theory.md §2, derived).

Give token i a clock T_i ~ Exp(q_i); the order in which the clocks ring is a sequential draw without
replacement from q. The first K drafts all lie in H iff the K-th ring inside H comes before the
first ring outside H, whose time is Exp(1 − s), s = q(H). Hence

    Q(H) = ∫_0^∞ (1 − s) e^{−(1−s) t} P[N_H(t) ≥ K] dt,   N_H(t) = Σ_{i∈H} Bernoulli(1 − e^{−q_i t}),

with Q(H) = 1[#{i ∈ H : q_i > 0} ≥ K] when H holds all of q's mass (s = 1).

Quadrature: x = ln t on [ln t_lo, ln t_hi] in Gauss–Legendre panels of width ``PANEL_WIDTH`` with
``PANEL_NODES`` nodes each. t_lo = ((K+1)! · 1e-17)^{1/(K+1)} bounds the neglected head by 1e-17
(P[N ≥ K] ≤ (ts)^K / K!), and t_hi = 40 / min(1 − s) bounds the neglected tail by e^{−40}. The
Poisson-binomial law of N_H(t), truncated at K (an absorbing state "≥ K"), is updated one token at
a time on the fixed grid, so all nested prefixes H_1 ⊂ H_2 ⊂ … cost one pass. The mass outside H
is summed directly (never as 1 − s) so that near-complete sets keep full relative accuracy.
Measured error against exact enumeration: below 1e-12 (tests/test_token_bounds.py).
"""

from __future__ import annotations

import math

import numpy as np

PANEL_WIDTH = 0.5
PANEL_NODES = 8


def _grid(num_drafts: int, min_out: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes t_j and weights ω_j (for ∫ f(t) dt = Σ ω_j f(t_j)) on the log-t panels."""
    t_lo = (math.factorial(num_drafts + 1) * 1e-17) ** (1.0 / (num_drafts + 1))
    t_hi = 40.0 / max(min_out, 1e-300)
    x_lo, x_hi = math.log(t_lo), math.log(t_hi)
    n_panels = max(1, math.ceil((x_hi - x_lo) / PANEL_WIDTH))
    gx, gw = np.polynomial.legendre.leggauss(PANEL_NODES)
    edges = np.linspace(x_lo, x_hi, n_panels + 1)
    half = 0.5 * (edges[1:] - edges[:-1])
    mid = 0.5 * (edges[1:] + edges[:-1])
    x = (mid[:, None] + half[:, None] * gx[None, :]).ravel()
    w = (half[:, None] * gw[None, :]).ravel()
    t = np.exp(x)
    return t, w * t


def wor_prefix_mass(q: np.ndarray, order: np.ndarray, num_drafts: int) -> np.ndarray:
    """Q(H_m) for the nested prefixes H_m = {order[0..m-1]}, m = 1..len(order) (checked input)."""
    q = np.asarray(q, dtype=np.float64)
    order = np.asarray(order, dtype=np.int64)
    k = int(num_drafts)
    qo = q[order]
    in_order = np.zeros(q.size, dtype=bool)
    in_order[order] = True
    rest = float(q[~in_order].sum())
    # mass outside H_m, summed from the tail so that it is accurate when tiny
    out = rest + np.concatenate([np.cumsum(qo[::-1])[::-1][1:], [0.0]])
    positive_count = np.cumsum(qo > 0)
    result = np.zeros(order.size)
    pos_out = out[out > 0]
    if pos_out.size == 0:
        result[:] = (positive_count >= k).astype(np.float64)
        return result
    t, wt = _grid(k, float(pos_out.min()))
    state = np.zeros((k + 1, t.size))  # P(N = 0..K-1), and P(N >= K) in the last row
    state[0] = 1.0
    for m in range(order.size):
        qi = qo[m]
        if qi > 0:
            pi = -np.expm1(-qi * t)
            moved = state[:k] * pi
            state[:k] -= moved
            state[1:] += moved
        if positive_count[m] < k:
            continue
        o = out[m]
        if o == 0.0:
            result[m] = 1.0
        else:
            result[m] = float(np.dot(wt * o * np.exp(-o * t), state[k]))
    return np.minimum(result, 1.0)


def wor_exclusion_mass(q: np.ndarray, num_drafts: int) -> np.ndarray:
    """Q(V ∖ {y}) for every token y: the probability that y is not among the K drafts.

    One clock pass per token with q_y > 0: O(V²) — for moderate vocabularies.
    """
    q = np.asarray(q, dtype=np.float64)
    out = np.ones(q.size)
    everyone = np.arange(q.size)
    for y in np.flatnonzero(q > 0):
        out[y] = wor_prefix_mass(q, everyone[everyone != y], num_drafts)[-1]
    return out
