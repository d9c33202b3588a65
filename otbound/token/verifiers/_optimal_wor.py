"""Verifiers for drafts without replacement at full vocabulary (derived here).

* ``ot_wor_top`` (:class:`OptimalWithoutReplacementVerifier`): the optimum over verifiers that see
  the drafts through their top-m tokens, with an exact residual: lossless by construction, exact
  acceptance; α = α* when those tokens hold all of q (this docstring, below).
* ``ot_wor_iid`` (:class:`IIDStreamVerifier`): ``ot`` on K i.i.d. draws rebuilt exactly from the
  ordered drafts: α ≥ α* with replacement, at ``ot``'s cost.
* ``ot_wor`` (:class:`BestWithoutReplacementVerifier`): the better of the two per (p, q, K).
* :func:`luce_rule` (small V): the optimal sampler's structure, a hierarchical Luce rule.

docs/theory/optimal-without-replacement.md has the derivations and proofs.

Notation: K drafts without replacement from q (sequential draws, equivalently exponential clocks
``T_i ~ Exp(q_i)``, the drafted set S = the first K tokens to ring; :mod:`otbound.token._wor`);
target p; ``Q(B) = P(S ⊆ B)``; α* = 1 − max_B [Q(B) − p(B)] (docs/theory/token-bounds.md).

**Truncation.** Let T be the m tokens with q > 0 of largest ``min(p_y, 1 − (1 − q_y)^K)`` (a
token's acceptance can exceed neither its p nor about its chance of being drafted; ties: lower id)
and ``T^c`` the rest. The verifier sees the drafts only through ``R = S ∩ T``. It solves the
transport problem of the lumped law ``μ(R) = P(S ∩ T = R)`` (``|R| ≤ K``) against p on T — an
acceptance LP (a bipartite max-flow: variables ``π(R, y)``, ``y ∈ R``; ``Σ_y π(R, y) ≤ μ(R)``,
``Σ_R π(R, y) ≤ p_y``) — and emits, given R,

    Y = y ∈ R with probability π(R, y) / μ(R), else a draw from the residual ρ = r / Z,
    r_y = p_y − Σ_R π(R, y) (y ∈ T),  r_z = p_z (z ∈ T^c),  Z = Σ r.

**Lossless by construction**: ``Σ_R μ(R) law(·|R) = Σ_R π(R, ·) + (Σ_R lf(R)) ρ`` with the
leftover ``lf(R) = μ(R) − Σ_y π(R, y)``, ``Σ_R lf(R) = 1 − Σ π = Z``, so the output law is p, for
any feasible π (the LP's plan is repaired to exact feasibility: clipped at 0, rows scaled to μ,
columns to p).

**Exact acceptance** (a residual token that is a draft counts as accepted):

    α = Σ π + (1/Z) [ Σ_R lf(R) r(R) + Σ_R (lf(R)/μ(R)) c(R) ],   c(R) = E[p(S ∩ T^c); S ∩ T = R],

the last term being the chance that a residual token of ``T^c`` was drafted. When T holds every
token with q > 0 (small V), ``T^c`` is never drafted, R = S, and the verifier is the optimal one:
α = α*. Otherwise α ≤ α* with a gap that shrinks as m grows (docs/results).

**The lumped law by clocks** (derived). For ``A ⊆ T`` put ``B = A ∪ T^c`` and ``o = q(T ∖ A)``.
Then ``μ(R) = Σ_{A ⊆ R} (−1)^{|R ∖ A|} Q(A ∪ T^c)`` (Möbius inversion over the sets of size ≤ K,
which are closed under subsets), and

    Q(B) = 1 − ∫_0^∞ o e^{−o t} P[N_B(t) < K] dt,   N_B(t) = Σ_{i ∈ B} Bernoulli(1 − e^{−q_i t}).

For c(R), Möbius-invert ``F(A) = E[p(S ∩ T^c); S ⊆ B] = Σ_{z ∈ T^c} p_z [Q(B) − Q(B ∖ z)]``.
``Q(B ∖ z)`` is the same integral with rate ``o + q_z`` over ``N_{B∖z}``, and
``e^{−q_z t} P[N_{B∖z} = j] = P[N_B = j, z unrung]``; so, with ``P_j = P[N_B(t) = j]``,
``U_j = Σ_z p_z P[N_B = j, z unrung]`` and ``D_j = Σ_z p_z q_z P[N_B = j, z unrung]`` (sums over
the tokens of ``T^c`` with q > 0),

    F(A) = ∫_0^∞ e^{−o t} Σ_{j<K} ( D_j − o [p(T^c) P_j − U_j] ) dt.

All three are carried on one grid by a forward pass over the tokens of ``T^c``, then over the
≤ K tokens of each A (sets by increasing size, each from its parent; tokens of T carry no weight).
The pass over ``T^c`` treats the tokens with ``q_z t_hi ≤ SMOOTH_X`` together through their
moments: with ``ρ_z = e^{q_z t} − 1``, ``Π (e^{−q_z t} + (1 − e^{−q_z t}) x) =
e^{−t Σ q_z} exp(Σ_k (−1)^{k+1} S_k x^k / k)``, ``S_k = Σ ρ_z^k``, and the weighted sums (weights
``w_z`` = ``p_z`` for U, ``p_z q_z`` for D) are that product times ``Σ_k (−x)^k Σ_z w_z ρ_z^k``;
``ρ^k = Σ_n k! S(n, k) x^n / n!`` (Stirling numbers of the second kind) turns every sum into
moments of ``y_z = q_z t_hi ≤ SMOOTH_X``, truncated when the terms fall below 1e-17. The other
tokens are added one by one: ``P_j ← e P_j + (1 − e) P_{j−1}``, ``W_j ← e W_j + (1 − e) W_{j−1} +
w_z e P_j`` (e = ``e^{−q_z t}``, old P on the right).

Grid (as the reference :func:`otbound.token._wor.wor_prefix_mass`): Gauss–Legendre in ln t,
panels of width ``PANEL_WIDTH`` with ``PANEL_NODES`` nodes, from ``t_lo = ((K+1)! 1e-17)^{1/(K+1)}``
(below it ``P[N < K] = 1`` to ``(t s)^K / K!``; the parts ``1 − e^{−o t_lo}`` of Q and
``e^{−o t_lo} Σ_z p_z (1 − e^{−q_z t_lo})`` of F are added in closed form) to
``t_hi = (TAIL + ln max(1, w / min o)) / min o``, ``w = Σ_{z ∈ T^c} q_z p_z`` (the neglected tails
are below ``(2 + w/o) e^{−o t_hi} ≤ 3 e^{−TAIL}``), or earlier, at the time ``t*`` when ``T^c``
alone has rung K times but with probability ``P[N_{T^c}(t*) < K] ≤ e^{−TAIL} / (2 + w / min o)``
(the integrands are at most ``(o + w) e^{−o t} P[N_{T^c}(t) < K]``, which decreases in t;
:func:`_clock_horizon`: a Chernoff bound). On flat rows, where ``min o`` is tiny, ``t*`` is the
shorter by orders of magnitude, and with it the grid and the tokens taken one by one. Checked against
enumeration of the draft law (``tests/test_optimal_wor.py``: μ, c and the acceptance to 1e-12).

**Why a truncation.** The exact optimum has a selection-law form: every optimal coupling selects
with a law m in the core of the belief function Q (``m(B) ≥ Q(B)``, the laws of rules "emit an
element of S"), with m ≥ p on H*, m ≤ p on ``C = V ∖ H*`` and ``m(H*) = Q(H*)``. The law
``M_j = P_j + g_j`` of the i.i.d. construction (:mod:`otbound.token.verifiers._optimal`; g the
running maxima of ``G_j = Q(H_j) − P_j`` toward h along the ratio order) is such a law without
replacement too (checked over all ``2^V`` sets at V ≤ 7), and it is the selection law of a
*hierarchical Luce rule* — the highest level (between nested tight sets) holding a draft, then its
draft y with probability ``w_y / Σ w`` (:func:`luce_rule`; proof on the theory page). That sampler
costs O(K) per tuple; what is missing at full vocabulary is the weights: a Plackett–Luce maximum
likelihood under the without-replacement set law, O(V · grid²) clock integrals per iteration.
The chord-polygon peeling of the i.i.d. case needs ``Q(H) = Φ(q(H))``, and product-form coin rules
fail (docs/theory/optimal-without-replacement.md gives the counterexamples).

Cost: the pass over ``T^c`` (O(V · moments) plus the large tokens of ``T^c`` one by one), the sets
(``Σ_{j ≤ K} C(m, j)`` of them, ``MAX_SETS`` by default; their states on the grid one array operation
per set size, from the parents', with the (m, K) layout and the LP's matrix cached), and one LP over
them (HiGHS), cached per (p, q, K): 22–53 ms at V = 151,936, K ≤ 4; per tuple a lookup of R and an
O(m) draw (``experiments/bench_optimal_wor.py``).

References: Jeon et al. 2402.14160 (drafts without replacement); Hu et al. 2502.18779 (the gap of
RRS without replacement); SpecTr, Sun et al. 2310.15141 (the acceptance LP).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import scipy.sparse

from otbound._solvers import solve_lp
from otbound._validation import InvalidInputError, check_positive_int
from otbound.token._wor import clock_law
from otbound.token.draft_laws import draft_joint
from otbound.token.verifiers._base import PreparedCache, Verifier, draw
from otbound.token.verifiers._optimal import OptimalVerifier

#: largest number of sets R = S ∩ T (|R| ≤ K) the truncation may hold; m is the largest with Σ_{j≤K} C(m, j) ≤ it
MAX_SETS = 2_500
MAX_TOP = 62  # the sets are int64 bitmasks over T
TAIL = 45.0  # tails neglected beyond (2 + 45) e^{−45} ≈ 1e-18
PANEL_WIDTH = 0.5
PANEL_NODES = 8
SMOOTH_X = 0.5  # tokens of T^c with q t_hi ≤ this enter through their moments
_SERIES_TOL = 1e-17
CACHE_SIZE = 16


def truncation_size(num_drafts: int, max_sets: int = MAX_SETS) -> int:
    """m, the number of top tokens T of q that :func:`truncated_coupling` (and so ``ot_wor_top``)
    sees the drafts through, for K drafts without replacement and a budget of ``max_sets`` sets.

    The largest ``m ≤ 62`` (the sets are 64-bit masks over T) with ``Σ_{j ≤ K} C(m, j) ≤ max_sets``
    (the sets ``R = S ∩ T``, ``|R| ≤ K``, the acceptance LP ranges over), and at least K + 1.
    Fewer tokens are taken where q has fewer positive entries.

    Parameters
    ----------
    num_drafts : int
        K.
    max_sets : int
        The budget of sets R (default 2,500, the verifiers' default).

    Returns
    -------
    int
        m.

    Examples
    --------
    >>> from otbound.token.verifiers import truncation_size
    >>> truncation_size(2), truncation_size(4), truncation_size(8)
    (62, 15, 11)
    >>> truncation_size(4, max_sets=100), truncation_size(4, max_sets=1)   # at least K + 1
    (7, 5)
    """
    k = int(num_drafts)
    m = k + 1
    while m < MAX_TOP and sum(math.comb(m + 1, j) for j in range(k + 1)) <= max_sets:
        m += 1
    return m


def _clock_horizon(q_rest: np.ndarray, k: int, tail: float) -> float:
    """A time t with ``P[N(t) < K] ≤ e^{−tail}`` for ``N(t) = Σ_z Bernoulli(1 − e^{−q_z t})`` over the
    rates ``q_rest`` (inf if the bound below never gets there).

    For any rank j, with c the j-th largest rate, the j − 1 larger tokens each ring with probability
    at least ``1 − e^{−c t}`` and the others (sum ``s_c``) at least ``q_z (1 − e^{−c t}) / c``
    (``(1 − e^{−x})/x`` decreases), so ``λ(t) = E N(t) ≥ (1 − e^{−c t}) (j − 1 + s_c / c)``; and
    ``P[N ≤ K − 1] ≤ e^{−λ} (e λ / (K − 1))^{K−1}`` for λ > K − 1 (Chernoff), decreasing in λ; at K = 1
    ``P[N = 0] = e^{−t Σ q}`` exactly. So t is the smallest over j ∈ {1, 8, 64, 512, 4096} of the
    solutions of ``λ(t) = λ*``, λ* the root of ``λ − (K − 1)(1 + ln(λ / (K − 1))) = tail`` (a
    contracting fixed point from above)."""
    if q_rest.size == 0:
        return math.inf
    total = float(q_rest.sum())
    if k == 1:
        return tail / total * (1.0 + 1e-9)  # on the safe side of the rounding
    lam = tail + 2.0 * k
    for _ in range(100):  # λ ← tail + (K − 1)(1 + ln(λ / (K − 1))): slope (K − 1)/λ < 1, decreasing to λ*
        lam = tail + (k - 1) * (1.0 + math.log(lam / (k - 1)))
    lam *= 1.0 + 1e-9  # on the safe side of the root
    ranks = [j for j in (1, 8, 64, 512, 4096) if j <= q_rest.size]
    largest = np.sort(np.partition(q_rest, q_rest.size - ranks[-1])[q_rest.size - ranks[-1] :])[::-1]
    best = math.inf
    for j in ranks:
        c = float(largest[j - 1])
        reach = (j - 1) + (total - float(largest[: j - 1].sum())) / c  # λ(∞) of the bound
        if reach > lam:
            best = min(best, -math.log1p(-lam / reach) / c)
    return best


def _grid(k: int, t_hi: float) -> tuple[np.ndarray, np.ndarray, float]:
    t_lo = (math.factorial(k + 1) * 1e-17) ** (1.0 / (k + 1))
    x_lo, x_hi = math.log(t_lo), math.log(max(t_hi, 2.0 * t_lo))
    n_panels = max(1, math.ceil((x_hi - x_lo) / PANEL_WIDTH))
    gx, gw = np.polynomial.legendre.leggauss(PANEL_NODES)
    edges = np.linspace(x_lo, x_hi, n_panels + 1)
    half = 0.5 * (edges[1:] - edges[:-1])
    mid = 0.5 * (edges[1:] + edges[:-1])
    t = np.exp((mid[:, None] + half[:, None] * gx[None, :]).ravel())
    return t, (half[:, None] * gw[None, :]).ravel() * t, t_lo


@lru_cache(maxsize=None)
def _stirling(k_max: int, order: int) -> np.ndarray:
    """a[k, n − 1] = k! S(n, k) / n!: the Taylor coefficients of (e^x − 1)^k, k = 0..k_max, n = 1..order."""
    base = np.array([1.0 / math.factorial(n) for n in range(1, order + 1)])
    out = np.zeros((k_max + 1, order))
    power = np.zeros(order + 1)
    power[0] = 1.0
    for k in range(1, k_max + 1):
        power = np.convolve(power, np.concatenate([[0.0], base]))[: order + 1]
        out[k] = power[1:]
    return out


def _smooth_state(q_s, weights, t, t_hi, k):
    """P_j and the weighted sums W^(w)_j = Σ_z w_z P[N = j, z has not rung] (one per weight row),
    j < K, on the grid, for the smooth tokens ``q_s`` together (module docstring: moments)."""
    jm = k - 1
    p_state = np.zeros((k, t.size))
    p_state[0] = 1.0
    sums = [np.zeros((k, t.size)) for _ in weights]
    if q_s.size == 0:
        return p_state, sums
    y = q_s * t_hi  # ≤ SMOOTH_X
    ymax = float(y.max())
    order, span = 1, max(jm, 1) * ymax  # remainder of (e^x − 1)^k after n terms ≤ (k x)^(n+1) e^(k x) / (n+1)!
    while order < 200 and span ** (order + 1) * math.exp(span) / math.factorial(order + 1) > _SERIES_TOL:
        order += 1
    a = _stirling(max(jm, 1), order)  # (jm + 1, order); row 0 unused
    moments = np.empty((1 + len(weights), order))  # Σ y^n, then Σ w y^n per weight row, n = 1..order
    power = y.copy()
    for n in range(order):  # one pass per order, O(V) memory
        moments[0, n] = power.sum()
        for i, w in enumerate(weights):
            moments[1 + i, n] = w @ power
        power *= y
    tau_n = (t / t_hi)[None, :] ** np.arange(1, order + 1)[:, None]  # (order, T)
    s_k = (a * moments[0][None, :]) @ tau_n  # S_k(t) = Σ ρ^k
    # exp of h(x) = Σ_{k=1}^{jm} (−1)^{k+1} S_k x^k / k: n f_n = Σ_k k h_k f_{n−k} (f_n: elementary symmetric of ρ)
    f = [np.ones(t.size)]
    for n in range(1, jm + 1):
        acc = np.zeros(t.size)
        for kk in range(1, n + 1):
            acc += (-1.0) ** (kk + 1) * s_k[kk] * f[n - kk]
        f.append(acc / n)
    scale = np.exp(-t * q_s.sum())
    for j in range(k):
        p_state[j] = scale * f[j]
    for i, (w, out) in enumerate(zip(weights, sums)):
        w_k = (a * moments[1 + i][None, :]) @ tau_n  # Σ w ρ^k
        w_k[0] = w.sum()
        for j in range(k):  # coefficient of x^j in G(x) Σ_k (−x)^k Σ w ρ^k
            out[j] = scale * sum(f[j - kk] * (-1.0) ** kk * w_k[kk] for kk in range(j + 1))
    return np.maximum(p_state, 0.0), [np.maximum(x, 0.0) for x in sums]


def _add_tokens(state: np.ndarray, q_z, weights, t) -> np.ndarray:
    """Add the tokens ``q_z`` of T^c one by one to ``state`` = (P, U, D) (3, K, T):
    ``P_j ← e P_j + (1 − e) P_{j−1}``, ``W_j ← e W_j + (1 − e) W_{j−1} + w_z e P_j`` (e = e^{−q_z t}, old
    P on the right; w_z = ``weights[0][z]`` for U, ``weights[1][z]`` for D)."""
    state = state.copy()
    for qz, wu, wd in zip(q_z, weights[0], weights[1]):
        e = np.exp(-qz * t)  # (T,)
        lift = e * state[0]  # (K, T): e P
        new = e * state
        new[:, 1:] -= np.expm1(-qz * t) * state[:, :-1]
        new[1] += wu * lift
        new[2] += wd * lift
        state = new
    return state


@dataclass
class TruncatedCoupling:
    """The pieces of the truncated optimal coupling for one (p, q, K) (module docstring).

    top: the tokens T (int64 (m,), by decreasing ranking score, ties to the lower id); masks: the sets R as bitmasks
    over T, sorted (int64 (n_sets,)); mu: μ(R); chance: c(R) = E[p(S ∩ T^c); S ∩ T = R]; flow: π(R, y) over T (float64
    (n_sets, m)); residual: ρ over the vocabulary (V,); accepted: the exact acceptance; lp_value: Σ π; slot: token →
    position in T (−1 outside); covers: T holds every token with q > 0; num_smooth: the tokens of T^c that entered the
    clock pass through their moments.

    Given R = S ∩ T the verifier emits y ∈ R w.p. ``π(R, y)/μ(R)``, else a draw from the residual
    ``ρ = r/Z``, ``r_y = p_y − Σ_R π(R, y)`` on T and ``p_z`` off T; its exact acceptance is
    ``α = Σ π + (1/Z) [Σ_R lf(R) r(R) + Σ_R (lf(R)/μ(R)) c(R)]``, ``lf(R) = μ(R) − Σ_y π(R, y)``;
    α = α* when ``covers``. Built by :func:`truncated_coupling`.

    References
    ----------
    Those of :func:`truncated_coupling`: Jeon et al. 2402.14160, Sun et al. 2310.15141, Hu et al.
    2502.18779.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.token.verifiers import truncated_coupling
    >>> c = truncated_coupling(np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5]), 2)
    >>> c.top.tolist(), c.covers, round(float(c.mu.sum()), 6), round(c.accepted, 6)   # covers: α*_wor
    ([0, 1, 2], True, 1.0, 0.985714)
    """

    top: np.ndarray
    masks: np.ndarray
    mu: np.ndarray
    chance: np.ndarray
    flow: np.ndarray
    residual: np.ndarray
    accepted: float
    lp_value: float
    slot: np.ndarray

    covers: bool = False  # T holds every token with q > 0: the coupling is optimal (α = α*)
    num_smooth: int = 0  # tokens of T^c that entered through their moments

    def rows(self, drafts: np.ndarray) -> np.ndarray:
        """Index of R = S ∩ T for each draft row (int (n, K) → int (n,))."""
        pos = self.slot[drafts]
        bits = np.where(pos >= 0, np.left_shift(np.int64(1), np.maximum(pos, 0)), 0)
        mask = np.bitwise_or.reduce(bits, axis=1)
        return np.searchsorted(self.masks, mask)

    def shares(self, rows: np.ndarray) -> np.ndarray:
        """π(R, y) / μ(R) over T for the given set indices (n, m); rows with μ = 0 select nothing."""
        mu = self.mu[rows]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(mu[:, None] > 0, self.flow[rows] / np.where(mu > 0, mu, 1.0)[:, None], 0.0)
        return np.minimum(out, 1.0)


@dataclass(frozen=True)
class _Layout:
    """The sets R ⊆ range(m), |R| ≤ K, and everything about them that depends on (m, K) only (cached).

    masks: bitmasks, sorted (n_sets,); members: per set its members (tuples, in mask order); member: bool (n_sets, m);
    padded: int (n_sets, K), members then −1; levels: per size j = 1..K, (sets, parent, token): the mask-order index of
    each set of size j, the position of its parent (the set without its last member) among the sets of size j − 1,
    and that last member; moebius: per bit, (sets holding it, the same sets without it); src, dst: the LP's edges
    (set, member); a_ub: the LP's constraint matrix.
    """

    masks: np.ndarray
    members: list
    member: np.ndarray
    padded: np.ndarray
    levels: tuple
    moebius: tuple
    src: np.ndarray
    dst: np.ndarray
    a_ub: object


@lru_cache(maxsize=32)
def _layout(m: int, k: int) -> _Layout:
    by_size = [list(itertools.combinations(range(m), j)) for j in range(min(k, m) + 1)]
    combos = [c for level in by_size for c in level]
    masks = np.array([sum(1 << i for i in c) for c in combos], dtype=np.int64)
    order = np.argsort(masks)
    where = np.empty(order.size, dtype=np.int64)
    where[order] = np.arange(order.size)  # combos index → mask-order index
    masks = masks[order]
    members = [combos[i] for i in order]
    n_sets = masks.size
    member = np.zeros((n_sets, m), dtype=bool)
    padded = np.full((n_sets, max(k, 1)), -1, dtype=np.int64)
    for a, c in enumerate(members):
        member[a, list(c)] = True
        padded[a, : len(c)] = c
    levels, start = [], 1
    for j in range(1, len(by_size)):
        pos = {c: i for i, c in enumerate(by_size[j - 1])}
        parent = np.array([pos[c[:-1]] for c in by_size[j]], dtype=np.int64)
        token = np.array([c[-1] for c in by_size[j]], dtype=np.int64)
        levels.append((where[start : start + len(by_size[j])], parent, token))
        start += len(by_size[j])
    moebius = []
    for i in range(m):
        has = np.flatnonzero(masks & (np.int64(1) << i))
        moebius.append((has, np.searchsorted(masks, masks[has] ^ (np.int64(1) << i))))
    src, dst = np.nonzero(member)  # edges (set, member), set-major
    ne = src.size
    a_ub = scipy.sparse.vstack(
        [
            scipy.sparse.csr_matrix((np.ones(ne), (src, np.arange(ne))), shape=(n_sets, ne)),
            scipy.sparse.csr_matrix((np.ones(ne), (dst, np.arange(ne))), shape=(m, ne)),
        ]
    ).tocsr()
    return _Layout(masks, members, member, padded, tuple(levels), tuple(moebius), src, dst, a_ub)


def _top_tokens(positive: np.ndarray, score: np.ndarray, m_max: int) -> np.ndarray:
    """The ``m_max`` entries of ``positive`` with the largest ``score``, by decreasing score, ties to
    the lower id (the order of ``lexsort((positive, −score))``, found among the candidates that reach
    the ``m_max``-th largest score only)."""
    if positive.size > m_max:
        threshold = np.partition(score, positive.size - m_max)[positive.size - m_max]
        keep = score >= threshold
        positive, score = positive[keep], score[keep]
    return positive[np.lexsort((positive, -score))[:m_max]]


def truncated_coupling(
    p: np.ndarray, q: np.ndarray, k: int, max_sets: int = MAX_SETS, rank: str = "contribution"
) -> TruncatedCoupling:
    """Build :class:`TruncatedCoupling` for checked 1-D laws p, q and K drafts without replacement.

    The T^c pass, the sets' Q and F values by clocks, Möbius inversion, the LP and the exact
    acceptance (module docstring). ``rank``: T is the m tokens of q > 0 with the largest
    ``min(p, 1 − (1 − q)^K)`` ("contribution", the default) or the largest q ("q").

    ``μ(R) = Σ_{A ⊆ R} (−1)^{|R ∖ A|} Q(A ∪ T^c)`` with
    ``Q(B) = 1 − ∫_0^∞ o e^{−o t} P[N_B(t) < K] dt`` (``o = q(T ∖ A)``), c(R) likewise from
    ``F(A) = E[p(S ∩ T^c); S ⊆ A ∪ T^c]``; then the acceptance LP over the sets R.

    Parameters
    ----------
    p, q : numpy.ndarray, shape (V,)
        Target and draft laws, already checked (float64, summing to 1).
    k : int
        K, the number of drafts without replacement.
    max_sets : int
        The most sets R (``|R| ≤ K``) the truncation may hold: m = :func:`truncation_size` (K, max_sets).
    rank : {"contribution", "q"}
        How T is chosen.

    Returns
    -------
    TruncatedCoupling
        The sets, μ, c, the plan, the residual and the exact acceptance.

    Raises
    ------
    InvalidInputError
        An unknown ``rank``, or denormal q entries the clock integrals cannot take.

    References
    ----------
    Jeon et al., "Recursive speculative decoding", arXiv 2402.14160 (drafts without replacement);
    Sun et al., "SpecTr", arXiv 2310.15141 (the acceptance LP); Hu et al., arXiv 2502.18779 (α*).

    Examples
    --------
    >>> import numpy as np
    >>> import otbound as ob
    >>> from otbound.token.verifiers import truncated_coupling
    >>> rng = np.random.default_rng(0)
    >>> p, q = rng.dirichlet(np.ones(200)), rng.dirichlet(np.ones(200))
    >>> c = truncated_coupling(p, q, 2, max_sets=100)
    >>> c.top.size, c.covers, round(float(c.mu.sum()), 9)
    (13, False, 1.0)
    >>> c.accepted <= ob.optimal_acceptance(p, q, 2, "without_replacement")
    True
    """
    if rank not in ("contribution", "q"):
        raise InvalidInputError(f"rank must be 'contribution' or 'q', got {rank!r}")
    # the bound's own treatment of denormal q: negligible ones (≤ 1e-16 of the draft law) dropped,
    # the others refused (InvalidInputError), as for optimal_acceptance without replacement
    q = clock_law(q, k)
    v = q.size
    positive = np.flatnonzero(q > 0)
    m_max = truncation_size(k, max_sets)
    with np.errstate(divide="ignore"):  # q = 1: log1p(−1) = −inf, score min(p, 1)
        score = q[positive] if rank == "q" else np.minimum(p[positive], -np.expm1(k * np.log1p(-q[positive])))
    top = _top_tokens(positive, score, m_max)  # the m largest scores (ties: lower id)
    m = top.size
    covers = positive.size == m
    in_top = np.zeros(v, dtype=bool)
    in_top[top] = True
    rest = np.flatnonzero(~in_top & (q > 0))
    q_top = q[top]
    lay = _layout(m, k)
    masks, n_sets = lay.masks, lay.masks.size
    out = np.where(lay.member, 0.0, q_top[None, :]).sum(axis=1)  # o_A = q(T ∖ A), summed directly (n_sets,)
    positive_out = out[out > 0]
    min_out = float(positive_out.min()) if positive_out.size else 1.0
    # tails beyond t_hi: below (2 + TAIL) e^{−TAIL} once scaled by max(1, w / min o)
    w_rest = float(q[~in_top] @ p[~in_top])
    t_hi = (TAIL + max(0.0, math.log(max(w_rest, 1e-300) / min_out))) / min_out
    q_rest, p_rest = q[rest], p[rest]
    # or earlier, where T^c alone has rung K times but with probability below e^{−TAIL} / (2 + w / min o)
    t_hi = min(t_hi, _clock_horizon(q_rest, k, TAIL + math.log(2.0 + w_rest / min_out)))
    t, wt, t_lo = _grid(k, t_hi)
    c_rest = q_rest * p_rest
    p_out = float(p_rest.sum())
    smooth = q_rest * t_hi <= SMOOTH_X
    p_state, (u_state, d_state) = _smooth_state(q_rest[smooth], [p_rest[smooth], c_rest[smooth]], t, t_hi, k)
    state = _add_tokens(np.stack([p_state, u_state, d_state]), q_rest[~smooth], (p_rest[~smooth], c_rest[~smooth]),
                        t)  # (3, K, T)
    head = float(p_rest @ -np.expm1(-q_rest * t_lo))  # Σ_z p_z (1 − e^{−q_z t_lo})
    # Σ_{j<K} of (P, U, D) for every set, by increasing size, each set's state from its parent's
    # (the set without its last member; tokens of T carry no weight): sums (n_sets, 3, T)
    sums = np.empty((n_sets, 3, t.size))
    level = state[None]  # (1, 3, K, T): the empty set
    sums[0] = state.sum(axis=1)  # the empty set has mask 0: index 0
    e_top = np.exp(-np.outer(q_top, t))  # (m, T)
    pi_top = -np.expm1(-np.outer(q_top, t))  # (m, T)
    for j, (sets, parent, token) in enumerate(lay.levels, start=1):
        e, pi = e_top[token][:, None, :], pi_top[token][:, None, :]  # (n_j, 1, T)
        if j < k:
            x = level[parent]  # (n_j, 3, K, T)
            level = e[:, :, None, :] * x
            level[:, :, 1:] += pi[:, :, None, :] * x[:, :, :-1]
            sums[sets] = level.sum(axis=2)
        else:  # the last size: only Σ_{j<K} is needed, from the parent's Σ_{j<K} and Σ_{j<K−1}
            below = level[:, :, : k - 1].sum(axis=2)  # (n_{K−1}, 3, T)
            whole = below + level[:, :, k - 1]
            sums[sets] = e * whole[parent] + pi * below[parent]
    ps, us, ds = sums[:, 0], sums[:, 1], sums[:, 2]  # (n_sets, T)
    live = out > 0.0  # else B holds every token with q > 0: S ⊆ B surely; T^c is then never drafted
    o = np.where(live, out, 1.0)
    decay = wt[None, :] * np.exp(-o[:, None] * t[None, :])  # (n_sets, T)
    lo = np.exp(-o * t_lo)
    q_val = np.where(live, lo - np.einsum("st,st->s", decay, o[:, None] * ps), 1.0)
    f_val = np.where(live, lo * head + np.einsum("st,st->s", decay, ds - o[:, None] * (p_out * ps - us)), 0.0)
    # Möbius inversion over the family (closed under subsets): f[R] = Σ_{A ⊆ R} (−1)^{|R∖A|} g[A]
    mu, chance = q_val.copy(), f_val.copy()
    for has, parent in lay.moebius:
        mu[has] -= mu[parent]
        chance[has] -= chance[parent]
    mu = np.maximum(mu, 0.0)
    chance = np.clip(chance, 0.0, None)
    flow = _lp_flow(lay, mu, p[top])
    colsum = flow.sum(axis=0)
    r = p.copy()
    r[top] = np.maximum(p[top] - colsum, 0.0)
    z = float(r.sum())
    lp_value = float(flow.sum())
    lf = np.maximum(mu - flow.sum(axis=1), 0.0)
    if z > 0:
        residual = r / z
        r_top = r[top]
        member_r = np.where(lay.member, r_top[None, :], 0.0).sum(axis=1)  # r(R) (n_sets,)
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(mu > 0, lf / np.where(mu > 0, mu, 1.0), 0.0)
        accepted = lp_value + (float(lf @ member_r) + float(frac @ chance)) / z
    else:  # nothing is ever rejected (Σ π = 1 to rounding): any law will do
        residual = p.copy()
        accepted = lp_value
    slot = np.full(v, -1, dtype=np.int64)
    slot[top] = np.arange(m)
    return TruncatedCoupling(top, masks, mu, chance, flow, residual, float(min(1.0, accepted)), lp_value, slot,
                             covers, int(smooth.sum()))


def _lp_flow(lay: _Layout, mu, p_top):
    """The acceptance LP over the sets R (module docstring), repaired to exact feasibility."""
    flow = np.zeros(lay.member.shape)  # (n_sets, m)
    ne = lay.src.size
    if ne == 0:
        return flow
    res = solve_lp(-np.ones(ne), lay.a_ub, np.concatenate([mu, p_top]), None, None, (0, None),
                   "truncated acceptance LP")
    flow[lay.src, lay.dst] = np.maximum(res.x, 0.0)  # each edge once
    rs = flow.sum(axis=1)
    flow *= np.where(rs > mu, mu / np.where(rs > 0, rs, 1.0), 1.0)[:, None]
    cs = flow.sum(axis=0)
    flow *= np.where(cs > p_top, p_top / np.where(cs > 0, cs, 1.0), 1.0)[None, :]
    return flow


class OptimalWithoutReplacementVerifier(Verifier):
    """The optimum over verifiers that see the drafts through ``S ∩ T``, T the top-m tokens of q, for
    drafts without replacement, with an exact residual (module docstring); α = α* when T holds
    every token with q > 0.

    Parameters
    ----------
    max_sets : int
        Bound on ``Σ_{j ≤ K} C(m, j)``, the number of sets ``R = S ∩ T`` (default ``MAX_SETS``):
        m = :func:`truncation_size` (K, max_sets).

    Examples
    --------
    On a toy the truncation covers, α = α*_wor (0.985714; the table on
    :class:`otbound.token.verifiers.Verifier`):

    >>> import numpy as np
    >>> from otbound import VERIFIERS
    >>> ver, p, q = VERIFIERS["ot_wor_top"], np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> round(ver.acceptance(p, q, 2), 6), ver.sample(p, q, np.array([[2, 1], [0, 1]]), rng=0).tokens.shape
    (0.985714, (2,))
    """

    name = "ot_wor_top"
    synthetic_max_drafts = 2
    sampling = "without_replacement"
    in_default_measurement = False  # 22-65 ms of set-up per row at V = 151,936 (the LP over top-m sets)
    reference = "the optimal coupling without replacement seen through the top-m tokens of q, exact residual"
    lossless = True

    def __init__(self, max_sets: int = MAX_SETS):
        self.max_sets = check_positive_int(max_sets, "max_sets")
        self._cache = PreparedCache(CACHE_SIZE)

    def _prepare(self, p, q, k):
        if sum(math.comb(k + 1, j) for j in range(k + 1)) > self.max_sets:
            raise InvalidInputError(
                f"max_sets = {self.max_sets} is below the {2 ** (k + 1) - 1} sets that m = K + 1 = {k + 1} needs"
            )
        return self._cache.get_or_build(p, q, k, lambda: truncated_coupling(p, q, k, self.max_sets))

    def _closed_form(self, p, q, aux, k):
        return aux.accepted

    def _laws(self, p, q, aux, drafts):
        rows = aux.rows(drafts)
        share = aux.shares(rows)  # (n, m)
        law = np.zeros((drafts.shape[0], q.size))
        law[:, aux.top] = share
        law += np.maximum(1.0 - share.sum(axis=1), 0.0)[:, None] * aux.residual[None, :]
        return law

    def _sample(self, p, q, aux, drafts, rng):
        n = drafts.shape[0]
        share = aux.shares(aux.rows(drafts))  # (n, m)
        u = rng.random(n)
        cum = np.cumsum(share, axis=1)
        pick = (cum <= u[:, None]).sum(axis=1)  # first column whose cumulative share exceeds u
        out = np.empty(n, dtype=np.int64)
        chosen = pick < share.shape[1]
        out[chosen] = aux.top[pick[chosen]]
        rejected = ~chosen
        if rejected.any():
            out[rejected] = draw(aux.residual, rng.random(int(rejected.sum())))
        return out


@lru_cache(maxsize=None)
def _growth_strings(k: int) -> np.ndarray:
    """All restricted growth strings of length K (g_0 = 0, g_s ≤ 1 + max_{r<s} g_r): int (B_K, K)."""
    out = [[0]]
    for _ in range(k - 1):
        out = [g + [j] for g in out for j in range(max(g) + 2)]
    return np.array(out, dtype=np.int64).reshape(-1, k)


class IIDStreamVerifier(Verifier):
    """Drafts without replacement verified by the i.i.d. optimum: the verifier rebuilds K i.i.d.
    draws from q out of the ordered drafts and runs ``ot`` on them (derived).

    The K drafts without replacement ``d_1..d_K`` are the first K distinct tokens of an i.i.d.
    stream from q. Given them, rebuild the stream's first K draws ``X_1..X_K``: ``X_1 = d_1``; after
    i distinct tokens have appeared, the next draw repeats ``d_j`` (j ≤ i) with probability
    ``q(d_j)``, else it is ``d_{i+1}`` (probability ``1 − q(d_1..d_i)``). The law of ``X_1..X_K`` is
    then exactly i.i.d. q: for a sequence with distinct values ``e_1..e_r`` in order of appearance,
    the drafts' probability ``Π_i q(e_i)/(1 − q(e_1..e_{i−1}))`` times the rebuild's
    ``Π_{repeats} q(x) · Π_{i<r} (1 − q(e_1..e_i))`` is ``Π_j q(x_j)``. So ``Y = ot(X)`` is
    lossless, and every ``X_j`` is a draft, so ``P(Y ∈ drafts) ≥ α*`` with replacement (the i.i.d.
    optimum; a residual token may be a later draft too). Exact conditional law: the sum over the
    rebuilt sequences (restricted growth strings, Bell(K) of them: 15 at K = 4, 4,140 at K = 8) of
    their probability times ``ot``'s exact law. Cost per tuple: ``ot``'s plus O(K²).

    Exact acceptance: at K ≤ 2 in closed form (derived): ``ot`` rejects only when its drafts
    lie in H* and emits the residual ρ on C, so a residual token is a draft only if it is a draft
    not rebuilt, i.e. ``X = (a, a)`` (probability ``q_a²``), rejected with probability
    ``1 − keep_a``, and the second draft ``d_2 ~ q / (1 − q_a)`` off a equals it:
    ``α = α*_wr + Σ_a q_a² (1 − keep_a) Σ_z ρ_z q_z / (1 − q_a)`` (``α = α*`` at K = 1). At K ≥ 3
    by enumeration at small V, else None (:func:`otbound.optimal_acceptance` with
    ``sampling="with_replacement"`` is then a lower bound).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound import VERIFIERS, optimal_acceptance
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> ver = VERIFIERS["ot_wor_iid"]
    >>> bool(ver.acceptance(p, q, 2) >= optimal_acceptance(p, q, 2) - 1e-12)
    True
    """

    name = "ot_wor_iid"
    monte_carlo = "K ≥ 3 beyond the enumeration limit (V^K tuples)"
    synthetic_max_drafts = 2
    sampling = "without_replacement"
    in_default_measurement = False  # the coupling per row and K, and Monte Carlo at K >= 3: ~70 ms per position
    reference = "the optimal i.i.d. coupling (ot) on K i.i.d. draws rebuilt from drafts without replacement"
    lossless = True

    def __init__(self):
        self._inner = OptimalVerifier()

    def _closed_form(self, p, q, aux, k):
        if k > 2:
            return None
        c = self._inner._prepare(p, q, k)
        if k == 1:
            return c.accepted
        keep, rho = c.keep, c.residual
        others = 1.0 - q  # Σ_{z ≠ a} q_z, summed directly for the one token that may exceed 1/2
        big = int(np.argmax(q))
        others[big] = np.delete(q, big).sum()
        # the second draft given X = (a, a) is q_z / Σ_{z≠a} q_z off a; ρ_a = 0 wherever 1 − keep_a > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            hit = np.where(others > 0, np.minimum(1.0, float(rho @ q) / np.where(others > 0, others, 1.0)), 0.0)
        return c.accepted + float(np.sum(q**2 * (1.0 - keep) * hit))

    @staticmethod
    def _step_weights(q, drafts):
        """Per row and growth string, the rebuild's probability (n, B_K)."""
        n, k = drafts.shape
        g = _growth_strings(k)  # (B, K)
        qd = q[drafts]  # (n, K)
        seen = np.concatenate([np.zeros((n, 1)), np.cumsum(qd, axis=1)], axis=1)  # q(d_1..d_i), i = 0..K
        w = np.ones((n, g.shape[0]))
        top = np.zeros(g.shape[0], dtype=np.int64)
        for s in range(1, k):
            new = g[:, s] > top
            w *= np.where(new[None, :], np.maximum(1.0 - seen[:, top + 1], 0.0), qd[:, g[:, s]])
            top = np.maximum(top, g[:, s])
        return w, g

    def _laws(self, p, q, aux, drafts):
        n, k = drafts.shape
        w, g = self._step_weights(q, drafts)
        rebuilt = drafts[:, g].reshape(-1, k)  # (n·B, K)
        laws = self._inner.conditional_law(p, q, rebuilt).reshape(n, g.shape[0], q.size)
        return np.einsum("nb,nbv->nv", w, laws)

    def _sample(self, p, q, aux, drafts, rng):
        n, k = drafts.shape
        qd = q[drafts]
        cum = np.cumsum(qd, axis=1)
        x = np.empty_like(drafts)
        x[:, 0] = drafts[:, 0]
        count = np.ones(n, dtype=np.int64)  # distinct tokens seen
        rows = np.arange(n)
        for s in range(1, k):
            u = rng.random(n)
            j = (cum <= u[:, None]).sum(axis=1)  # first j with u < q(d_1..d_{j+1})
            repeat = j < count
            x[:, s] = np.where(repeat, drafts[rows, np.minimum(j, k - 1)], drafts[rows, np.minimum(count, k - 1)])
            count += ~repeat
        return self._inner.sample(p, q, x, rng).tokens


@dataclass
class LuceRule:
    """The hierarchical Luce rule that realises the running-maximum selection law (small V).

    level: per token, the index of its segment between consecutive records (higher = later in the
    ratio order; −1 for q = 0); weight: per token, its Luce weight within its segment (normalised to
    sum 1 per segment); select: the target law m by token; h_star: bool mask of H*; alpha: α*;
    residual_error: the largest |Luce selection law − m| reached.
    """

    level: np.ndarray
    weight: np.ndarray
    select: np.ndarray
    h_star: np.ndarray
    alpha: float
    residual_error: float

    def selection(self, drafts: np.ndarray) -> np.ndarray:
        """P(select draft column j | drafts), int (n, K) → (n, K): the highest level holding a draft,
        then draft y of it with probability w_y / Σ w over the level's drafts (copies once)."""
        lv = self.level[drafts]
        top = lv.max(axis=1, keepdims=True)
        first = np.ones(drafts.shape, dtype=bool)
        for j in range(1, drafts.shape[1]):
            first[:, j] = (drafts[:, :j] != drafts[:, j : j + 1]).all(axis=1)
        w = np.where((lv == top) & first, self.weight[drafts], 0.0)
        return w / w.sum(axis=1, keepdims=True)


def luce_rule(p, q, k: int, *, tol: float = 1e-13, max_iter: int = 200_000) -> LuceRule:
    """The hierarchical Luce rule for drafts without replacement at small V (derived; theory page).

    The running-maximum law ``m`` (``M_j = P_j + g_j`` along the ratio order) is realised by: find the
    highest segment between consecutive records of g holding a draft, emit its draft y with
    probability ``w_y / Σ_{drafts x of the segment} w_x``. The weights maximise the concave
    Plackett–Luce log-likelihood ``Σ_y m_y log w_y − Σ_D μ(D) log w(D)`` of each segment's sets
    ``D = S ∩ segment`` (given that the segment is the highest one drafted), whose stationarity
    condition is exactly "the Luce selection law is m"; found by the minorise–maximise iteration
    ``w_y ← m_y / Σ_{D ∋ y} μ(D) / w(D)`` (Hunter 2004) until the selection law is within ``tol``.
    The set law is enumerated (``draft_joint``): small V only.

    Examples
    --------
    >>> import numpy as np
    >>> rule = luce_rule(np.array([0.3, 0.7]), np.array([0.5, 0.5]), 2)
    >>> round(rule.alpha, 12), rule.residual_error < 1e-12
    (1.0, True)
    """

    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    v = q.size
    joint = draft_joint(q, k, "without_replacement")
    sets: dict = {}
    for idx in zip(*np.nonzero(joint)):
        key = frozenset(int(i) for i in idx)
        sets[key] = sets.get(key, 0.0) + float(joint[idx])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf)
    order = np.argsort(ratio, kind="stable")
    rank = np.empty(v, dtype=np.int64)
    rank[order] = np.arange(v)
    top_mass = np.zeros(v + 1)
    for s, w in sets.items():
        top_mass[max(rank[list(s)]) + 1] += w
    cum_q = np.cumsum(top_mass)  # Q(H_j)
    cum_p = np.concatenate([[0.0], np.cumsum(p[order])])
    g = cum_q - cum_p
    g[0] = g[-1] = 0.0
    h = int(np.argmax(g))
    run = np.empty(v + 1)
    run[: h + 1] = np.maximum.accumulate(g[: h + 1])
    run[h:] = np.maximum.accumulate(g[h:][::-1])[::-1]
    m_sorted = np.diff(cum_p + run)
    records = np.flatnonzero(run - g <= 1e-15)
    level = np.full(v, -1, dtype=np.int64)
    weight = np.zeros(v)
    select = np.empty(v)
    select[order] = m_sorted
    worst = 0.0
    for li, (a, b) in enumerate(zip(records[:-1], records[1:])):
        tokens = order[a:b]
        level[tokens] = li
        local = {int(t): i for i, t in enumerate(tokens)}
        rows, masses = [], []
        for s, w in sets.items():
            pos = rank[list(s)]
            if a <= pos.max() < b:
                rows.append([local[int(t)] for t in s if a <= rank[t] < b])
                masses.append(w)
        inc = np.zeros((len(rows), tokens.size))
        for r, cols in enumerate(rows):
            inc[r, cols] = 1.0
        mass = np.array(masses)
        target = select[tokens]
        w = np.ones(tokens.size)
        for _ in range(max_iter):
            share = inc * (w / (inc @ w)[:, None])
            law = mass @ share
            err = float(np.abs(law - target).max()) if tokens.size else 0.0
            if err <= tol:
                break
            den = inc.T @ (mass / (inc @ w))
            w = np.where(den > 0, target / np.where(den > 0, den, 1.0), w)
            w /= w.sum()
        worst = max(worst, err)
        weight[tokens] = w
    h_star = np.zeros(v, dtype=bool)
    h_star[order[:h]] = True
    alpha = float(min(1.0, cum_p[h] + 1.0 - cum_q[h]))
    return LuceRule(level, weight, select, h_star, alpha, worst)


class BestWithoutReplacementVerifier(Verifier):
    """Per (p, q, K), the better of ``ot_wor_top`` and ``ot_wor_iid`` (drafts without replacement).

    The choice depends on (p, q, K) only, so the verifier is lossless as both are. It compares the
    exact acceptance of ``ot_wor_top`` with that of ``ot_wor_iid`` (exact at K ≤ 2) or, at K ≥ 3,
    with its proven floor α* with replacement; so its acceptance is at least the larger of
    ``α(ot_wor_top)`` and ``α*_wr``, and exact except where ``ot_wor_iid`` is chosen at K ≥ 3 (then
    by enumeration at small V, else None). Costs the set-up of ``ot_wor_top`` per (p, q, K).

    Parameters
    ----------
    max_sets : int
        As for :class:`OptimalWithoutReplacementVerifier`.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound import VERIFIERS, optimal_acceptance
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> bool(abs(VERIFIERS["ot_wor"].acceptance(p, q, 2) - optimal_acceptance(p, q, 2, "without_replacement")) < 1e-12)
    True
    """

    name = "ot_wor"
    monte_carlo = "K ≥ 3 beyond the enumeration limit (V^K tuples), as ot_wor_iid"
    synthetic_max_drafts = 2
    sampling = "without_replacement"
    reference = "per (p, q, K) the better of ot_wor_top and ot_wor_iid (drafts without replacement)"
    lossless = True
    in_default_measurement = False  # pays ot_wor_top's set-up per row

    def __init__(self, max_sets: int = MAX_SETS):
        self._top = OptimalWithoutReplacementVerifier(max_sets)
        self._iid = IIDStreamVerifier()
        self._cache = PreparedCache(CACHE_SIZE)

    def _prepare(self, p, q, k):
        return self._cache.get_or_build(p, q, k, lambda: self._choose(p, q, k))

    def _choose(self, p, q, k):
        """``(verifier, its prepared state, exact acceptance or None)``."""
        top_aux = self._top._prepare(p, q, k)
        iid_value = self._iid._closed_form(p, q, None, k)
        rival = iid_value if iid_value is not None else self._iid._inner._prepare(p, q, k).accepted
        if top_aux.accepted >= rival:
            return self._top, top_aux, top_aux.accepted
        return self._iid, None, iid_value

    def _closed_form(self, p, q, aux, k):
        return aux[2]

    def _laws(self, p, q, aux, drafts):
        return aux[0]._laws(p, q, aux[1], drafts)

    def _sample(self, p, q, aux, drafts, rng):
        return aux[0]._sample(p, q, aux[1], drafts, rng)
