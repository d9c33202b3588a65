"""Optimal verifier for i.i.d. drafts at full vocabulary: an optimal coupling sampled per draft tuple
without building the plan (derived here; the construction of Global Resolution, Thomas & Pal
2511.15898, was not readable offline — only its abstract — so this is an independent one).

Notation: K drafts i.i.d. from q, Φ(x) = x^K. Sort the tokens by ratio p/q ascending (q = 0 last)
and let ``Q_j``, ``P_j`` be the q and p mass of the first j (``j = 0..V``; the j-th token occupies
the interval ``[Q_{j−1}, Q_j)``). ``G_j = Φ(Q_j) − P_j``; α* = 1 − max_j G_j (the prefix theorem,
theory.md §2), attained at ``j = h`` (H* = the first h tokens, ``s = Q_h``).

**Level rules.** A partition of the sorted tokens into runs ("levels") ``(a, b]`` gives the rule:
*find the highest level holding a draft and emit a uniformly random draft of that level*
(copies counted). Given that the top draft lies in ``(a, b]`` — probability Φ(Q_b) − Φ(Q_a) — the
drafts inside the level are i.i.d. from q restricted to it, so the emitted token is y with
probability ``q_y / (Q_b − Q_a)``: the rule's selection law is ``m_y = q_y σ(a, b)`` with the
chord slope ``σ(a, b) = (Φ(Q_b) − Φ(Q_a)) / (Q_b − Q_a)``. Its cumulative ``M_j = Σ_{i≤j} m_i`` is
the chord polygon of Φ through the breakpoints. A random partition (independent of the drafts)
selects with the mixture law.

**The target selection law.** With ``g_j = max_{i ≤ j} G_i`` for ``j ≤ h`` and
``g_j = max_{i ≥ j} G_i`` for ``j ≥ h`` put ``M_j = P_j + g_j``. Then
(i) ``M_0 = 0``, ``M_h = Φ(s)``, ``M_V = 1``, ``M_j ≥ Φ(Q_j)`` with equality exactly at the
running-max records of G ("contact" boundaries); (ii) M is convex in Q: the slopes ``m_j/q_j``
are p/q inside a segment, and at a contact boundary j the token below has slope ≤ ΔΦ_j/q_j and the
token above ≥ ΔΦ_{j+1}/q_{j+1} (M ≥ Φ on both sides), non-decreasing as Φ is convex;
(iii) ``m ≥ p`` on H* and ``m ≤ p`` on the rest C (M − P is non-decreasing up to h, non-increasing
after).
Between two consecutive records ``u < v`` (a *segment*), M is a convex polyline lying between Φ and
Φ's chord over ``[Q_u, Q_v]``, equal at both ends. It is a mixture of chord polygons by peeling:
with lifts ``d_j = M_j − Φ(Q_j)`` and chord lifts ``c_j`` (chord minus Φ) at the interior boundaries,
``w = min_j d_j / c_j ∈ [0, 1]`` and ``M = w·chord + (1 − w)·M'`` where M' is again convex, ≥ Φ,
and touches Φ at the arg-min ``j*``; recurse on ``(u, j*]`` and ``(j*, v]`` (convexity keeps
``M' ≤`` its chords, so every w fits in the mass left). Unnormalised, a node's lifts are
``d − Σ_ancestors w·c``, three scalars per node (:meth:`OptimalCoupling.node`), and a node's absolute
stop probability is its w. Contact stretches are single-token levels. The random partition: each
segment's tree walked from its root, stopping at a node with probability w / (mass reaching it).
For a fixed partition the selection law is the increments of its chord polygon over all of
``[0, 1]``; averaged over the trees it is the increments of M, i.e. m.

**Verifier.** Select ``y`` by that random level rule; if y ∈ H* accept it with probability
``p_y / m_y`` (else reject), if y ∈ C accept it; on rejection emit ``Y ~ (p − m)_+ / (1 − α*)``
(mass on C only). Only the path of the top draft's token in its segment's tree is needed.

**Proof.** Lossless: the selection law is m; emitted-and-accepted is p on H* and m on C; the
residual adds ``p − m`` on C, total ``Σ_C (p − m) = p(C) − (1 − Φ(s)) = Φ(s) − P_h = 1 − α*``,
exactly the rejection probability ``Σ_{H*} (m − p) = Φ(s) − P_h``. Acceptance: every accepted
token is a draft; a rejection happens only when the top draft lies in H*, so all drafts lie in H*
while the residual lives on C — no residual token is a draft. Hence
``α = P_h + (1 − Φ(s)) = 1 + P_h − Φ(s) = α*``: the coupling is optimal. Checked in
``tests/test_optimal_verifier.py`` against the dual and the LP (1e-9) with the exact conditional laws
enumerated (lossless to 1e-12), by a binned chi-square at V = 1,500, and at V = 151,936.

**Cost** (one row): a sort of the V ratios, O(V) prefix sums and running maxima (the exact
acceptance needs nothing more), then per tuple the top draft's path in its segment's tree: each
node costs O(length of its segment), nodes are cached per (p, q, K). The top draft usually sits in a
short segment (path length 1), but segments can span most of H* and the peeling then splits off a
token or so per node, so a path can be O(segment) nodes long: O(L²) for a segment of L tokens.
``experiments/bench_optimal_verifier.py`` measures both (README); a decomposition with a cheap path
for long segments is open.

**Without replacement.** The construction does not carry over: it rests on Q(H) = Φ(q(H)), one
convex function of the q-mass, which makes the drafts inside the top draft's level i.i.d. from q
restricted to it (so a uniform draft of the level has law ∝ q, and the level rules' laws are the
chord polygons of Φ). Without replacement Q(H) depends on the individual q_i in H (exponential
clocks, :mod:`otbound.token._wor`), a uniform draft of a level is not ∝ q, and the feasible
selection laws are not mixtures of chord polygons of one Φ; the optimal verifier there remains the
small-V LP (``ot``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from otbound.token.verifiers._base import PreparedCache, Verifier, draw

CACHE_SIZE = 16


@dataclass
class OptimalCoupling:
    """The pieces of the optimal coupling for one (p, q, K), i.i.d. drafts (see module docstring).

    order: token ids sorted by p/q ascending; rank: inverse permutation (token → position).
    cum_q: Q_j, j = 0..V (float64, V + 1); phi: Φ(Q_j); lift: d_j = M_j − Φ(Q_j) ≥ 0.
    p_sorted, m_sorted: p and the selection law m in that order; records: sorted contact
    boundaries (segment ends); h: |H*|; alpha: α* = P_h + 1 − Φ(Q_h); accepted: Σ_{H*} p + Σ_C m
    (the construction's acceptance). Over tokens (built on first use): ``select`` = m,
    ``keep`` = acceptance probability of a selected token (p/m on H*, 1 on C), ``residual`` =
    (p − m)_+ normalised (p on C if that mass rounds to 0).
    """

    order: np.ndarray
    rank: np.ndarray
    cum_q: np.ndarray
    phi: np.ndarray
    lift: np.ndarray
    p_sorted: np.ndarray
    m_sorted: np.ndarray
    records: np.ndarray
    h: int
    alpha: float
    accepted: float
    nodes: dict = field(default_factory=dict, repr=False)

    def _by_token(self, sorted_values: np.ndarray) -> np.ndarray:
        out = np.empty(sorted_values.size)
        out[self.order] = sorted_values
        return out

    @cached_property
    def keep_sorted(self) -> np.ndarray:
        h, ps, ms = self.h, self.p_sorted, self.m_sorted
        keep = np.ones(ps.size)
        with np.errstate(divide="ignore", invalid="ignore"):
            keep[:h] = np.where(ms[:h] > 0, ps[:h] / np.where(ms[:h] > 0, ms[:h], 1.0), 0.0)
        return np.minimum(keep, 1.0)

    @cached_property
    def residual_sorted(self) -> np.ndarray:
        h, ps = self.h, self.p_sorted
        left = np.zeros(ps.size)
        left[h:] = ps[h:] - self.m_sorted[h:]
        if left.sum() <= 0:  # rejection has probability Φ(s) − P_h ≈ 0 (rounding): any law on C will do
            left[h:] = ps[h:]
        if left.sum() <= 0:
            left = ps.copy()
        return left / left.sum()

    @property
    def select(self) -> np.ndarray:
        return self._by_token(self.m_sorted)

    @property
    def keep(self) -> np.ndarray:
        return self._by_token(self.keep_sorted)

    @property
    def residual(self) -> np.ndarray:
        return self._by_token(self.residual_sorted)

    def node(self, u: int, v: int, peeled: tuple = (0.0, 0.0, 0.0)):
        """Peeling node for boundaries u < v: ``(w, j*, peeled')``, cached (j* = −1: a single token).

        ``peeled = (Ω, A, B)`` sums what the ancestors removed, ``Σ w·(chord − Φ)`` with each chord
        ``α + β Q``: the node's lifts are ``D_j = d_j + Ω Φ(Q_j) − A − B Q_j`` (O(1) memory per node;
        ``(0, 0, 0)`` at a segment root). ``peeled'`` is the children's.
        """
        key = (u, v)
        if key in self.nodes:
            return self.nodes[key]
        if v - u == 1:
            self.nodes[key] = (None, -1, peeled)
            return self.nodes[key]
        omega, big_a, big_b = peeled
        qs = self.cum_q[u + 1 : v]
        ph = self.phi[u + 1 : v]
        beta = (self.phi[v] - self.phi[u]) / (self.cum_q[v] - self.cum_q[u])
        alpha = self.phi[u] - beta * self.cum_q[u]
        c = alpha + beta * qs - ph
        d = self.lift[u + 1 : v] + omega * ph - big_a - big_b * qs
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(c > 0, d / np.where(c > 0, c, 1.0), np.inf)
        i = int(np.argmin(ratio))
        w = max(float(ratio[i]), 0.0) if np.isfinite(ratio[i]) else 0.0
        self.nodes[key] = (w, u + 1 + i, (omega + w, big_a + w * alpha, big_b + w * beta))
        return self.nodes[key]


def optimal_coupling(p: np.ndarray, q: np.ndarray, k: int) -> OptimalCoupling:
    """Build :class:`OptimalCoupling` for checked 1-D laws p, q and K i.i.d. drafts (O(V log V))."""
    v = q.size
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = p / q
    ratio[q == 0] = np.inf
    order = np.argsort(ratio, kind="quicksort")
    rank = np.empty(v, dtype=np.int64)
    rank[order] = np.arange(v)
    ps, qs = p[order], q[order]
    cum_q = np.empty(v + 1)
    cum_p = np.empty(v + 1)
    cum_q[0] = cum_p[0] = 0.0
    np.cumsum(qs, out=cum_q[1:])
    np.cumsum(ps, out=cum_p[1:])
    # tokens with q = 0 sort last: their boundaries carry Q = 1 exactly
    cum_q[v - np.count_nonzero(qs == 0) :] = 1.0
    np.minimum(cum_q, 1.0, out=cum_q)
    phi = cum_q**k
    g = phi - cum_p
    g[0], g[-1] = 0.0, 0.0
    h = int(np.argmax(g))
    run = np.empty(v + 1)
    np.maximum.accumulate(g[: h + 1], out=run[: h + 1])
    run[h:] = np.maximum.accumulate(g[h:][::-1])[::-1]
    lift = run - g  # ≥ 0 exactly in floating point: run ≥ g elementwise
    records = np.flatnonzero(lift == 0.0)
    m_sorted = np.diff(cum_p + run)  # increments of M_j = P_j + run_j
    m_sorted[:h] = np.maximum(m_sorted[:h], ps[:h])  # m ≥ p on H* (rounding only)
    m_sorted[h:] = np.clip(m_sorted[h:], 0.0, ps[h:])  # 0 ≤ m ≤ p on C (rounding only)
    alpha = float(min(1.0, cum_p[h] + 1.0 - phi[h]))
    accepted = float(cum_p[h] + m_sorted[h:].sum())
    return OptimalCoupling(order, rank, cum_q, phi, lift, ps, m_sorted, records, h, alpha, accepted)


def _level_weights(c: OptimalCoupling, top: int) -> list[tuple[int, int, float]]:
    """The levels (a, b] that can hold sorted position ``top`` with their probabilities: the path of
    ``top`` from its segment's root in the peeling tree, ``[(a, b, P(level = (a, b])), ...]``."""
    r = int(np.searchsorted(c.records, top, side="right"))
    u, v = int(c.records[r - 1]), int(c.records[r])
    out = []
    mass = 1.0
    peeled = (0.0, 0.0, 0.0)
    while True:
        w, j, peeled = c.node(u, v, peeled)
        if j < 0:
            out.append((u, v, mass))
            return out
        stop = min(w, mass)
        if stop > 0:
            out.append((u, v, stop))
        mass -= stop
        if mass <= 0:
            return out
        u, v = (u, j) if top < j else (j, v)


class OptimalVerifier(Verifier):
    """Optimal verifier for i.i.d. drafts at any V (module docstring): acceptance α*."""

    name = "ot_fast"
    sampling = "with_replacement"

    def __init__(self):
        self._cache = PreparedCache(CACHE_SIZE)

    def _prepare(self, p, q, k):
        return self._cache.get_or_build(p, q, k, lambda: optimal_coupling(p, q, k))

    def _closed_form(self, p, q, aux, k):
        return aux.accepted  # Σ_{H*} p + Σ_C m, summed from the construction (not from optimal_acceptance)

    def _levels(self, aux, drafts):
        """Sorted positions (n, K) and, per row, the top draft's levels padded to a common length:
        lower ends a, upper ends b (int (n, L)) and probabilities w (float (n, L), 0 as padding)."""
        pos = aux.rank[drafts]
        tops, inverse = np.unique(pos.max(axis=1), return_inverse=True)
        paths = [_level_weights(aux, int(t)) for t in tops]
        width = max(len(x) for x in paths)
        a = np.zeros((tops.size, width), dtype=np.int64)
        b = np.zeros((tops.size, width), dtype=np.int64)
        w = np.zeros((tops.size, width))
        for i, path in enumerate(paths):
            arr = np.array(path)
            a[i, : len(path)], b[i, : len(path)], w[i, : len(path)] = arr[:, 0], arr[:, 1], arr[:, 2]
        inverse = inverse.ravel()
        return pos, a[inverse], b[inverse], w[inverse]

    def _laws(self, p, q, aux, drafts):
        n, k = drafts.shape
        pos, a, b, w = self._levels(aux, drafts)
        inside = (pos[:, None, :] >= a[:, :, None]) & (pos[:, None, :] < b[:, :, None])  # (n, L, K)
        cnt = np.maximum(inside.sum(axis=2, keepdims=True), 1)
        share = (w[:, :, None] * inside / cnt).sum(axis=1)  # P(select draft column j | x̄), (n, K)
        law = np.zeros((n, q.size))
        np.add.at(law, (np.repeat(np.arange(n), k), drafts.ravel()), share.ravel())
        law *= aux.keep[None, :]
        law += np.maximum(1.0 - law.sum(axis=1), 0.0)[:, None] * aux.residual[None, :]
        return law

    def _sample(self, p, q, aux, drafts, rng):
        n, k = drafts.shape
        pos, a, b, w = self._levels(aux, drafts)
        last = (w > 0).sum(axis=1) - 1  # levels fill a prefix of each row; rounding never picks padding
        level = np.minimum((np.cumsum(w, axis=1) <= rng.random(n)[:, None]).sum(axis=1), last)
        rows = np.arange(n)
        a, b = a[rows, level], b[rows, level]
        inside = (pos >= a[:, None]) & (pos < b[:, None])
        pick = np.floor(rng.random(n) * inside.sum(axis=1)).astype(np.int64)  # pick-th draft inside
        col = np.argmax(np.cumsum(inside, axis=1) > pick[:, None], axis=1)
        out = drafts[rows, col].copy()
        rejected = rng.random(n) >= aux.keep_sorted[aux.rank[out]]
        if rejected.any():
            out[rejected] = aux.order[draw(aux.residual_sorted, rng.random(int(rejected.sum())))]
        return out
