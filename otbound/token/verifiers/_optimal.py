"""Optimal verifier for i.i.d. drafts at full vocabulary: an optimal coupling sampled per draft tuple
without building the plan (derived for otbound; an independent construction, since Global
Resolution, Thomas & Pal 2511.15898, was readable only as an abstract).

The construction, its hull form and the proof that it is lossless with acceptance exactly α* are in
the documentation: ``docs/theory/optimal-verifier.md`` (notation: tokens sorted by p/q, prefix masses
``Q_j``, ``P_j``, ``Φ(x) = x^K``, ``G_j = Φ(Q_j) − P_j``, H* the first h tokens, the selection law m
with cumulative ``M_j``, level rules, segments between contact records). Measured costs:
``docs/results/benchmarks.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from otbound.token.draft_laws import draft_law
from otbound.token.verifiers._base import PreparedCache, Verifier, draw
from otbound.token.verifiers._ot import MAX_PLAN_CELLS, plan, plan_laws

CACHE_SIZE = 16
TREE_MAX = 64  # segments this short always use the tree (at most 64 nodes of ≤ 64 tokens)
TREE_TOKENS_PER_TUPLE = 16  # longer ones use it when they hold a tuple per 16 of their tokens


@dataclass
class OptimalCoupling:
    """The pieces of the optimal coupling for one (p, q, K), i.i.d. drafts (docs/theory/optimal-verifier.md).

    order: token ids sorted by p/q ascending; cum_q, cum_p: Q_j, P_j, j = 0..V (float64, V + 1);
    phi: Φ(Q_j); run: the running maxima g_j of G; lift: d_j = M_j − Φ(Q_j) = g_j − G_j ≥ 0;
    p_sorted: p in that order; records: sorted contact boundaries (segment ends); h: the size of H*;
    alpha: α* = P_h + 1 − Φ(Q_h). Built on first use (a verification needs none of them for the
    tuple it verifies): ``rank`` (token → position), ``m_sorted`` (the selection law m in sorted
    order), ``accepted`` (Σ_{H*} p + Σ_C m, the construction's acceptance) and, over tokens,
    ``select`` = m, ``keep`` = acceptance probability of a selected token (p/m on H*, 1 on C),
    ``residual`` = (p − m)_+ normalised (p on C if that mass rounds to 0).

    With ``G_j = Φ(Q_j) − P_j`` and ``h = argmax_j G_j``, ``α* = P_h + 1 − Φ(Q_h)``: the dual
    ``1 + min_H [p(H) − Q(H)]`` at the prefix H* of the first h sorted tokens. Built by
    :func:`optimal_coupling`; the construction and its proof are in docs/theory/optimal-verifier.md.

    References
    ----------
    Hu et al., arXiv 2502.18779, Theorem 3.1 (α* and its dual); Sun et al., "SpecTr",
    arXiv 2310.15141 (the optimal-transport coupling of the drafts and the target). Thomas & Pal,
    "Global Resolution", arXiv 2511.15898, build an optimal verifier for the same problem (only its
    abstract was read; this construction is independent).

    Examples
    --------
    >>> import numpy as np
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> from otbound.token.verifiers import optimal_coupling
    >>> c = optimal_coupling(p, q, 2)
    >>> c.order.tolist(), c.h, round(c.alpha, 6), round(c.accepted, 6)
    ([2, 1, 0], 2, 0.86, 0.86)
    >>> c.select.round(6).tolist()  # the selection law m
    [0.36, 0.39, 0.25]
    """

    order: np.ndarray
    cum_q: np.ndarray
    cum_p: np.ndarray
    phi: np.ndarray
    run: np.ndarray
    lift: np.ndarray
    p_sorted: np.ndarray
    records: np.ndarray
    h: int
    alpha: float
    nodes: dict = field(default_factory=dict, repr=False)

    def _by_token(self, sorted_values: np.ndarray) -> np.ndarray:
        out = np.empty(sorted_values.size)
        out[self.order] = sorted_values
        return out

    @cached_property
    def rank(self) -> np.ndarray:
        rank = np.empty(self.order.size, dtype=np.int64)
        rank[self.order] = np.arange(self.order.size)
        return rank

    @cached_property
    def m_sorted(self) -> np.ndarray:
        h, ps = self.h, self.p_sorted
        m = np.diff(self.cum_p + self.run)  # increments of M_j = P_j + g_j
        m[:h] = np.maximum(m[:h], ps[:h])  # m ≥ p on H* (rounding only)
        m[h:] = np.clip(m[h:], 0.0, ps[h:])  # 0 ≤ m ≤ p on C (rounding only)
        return m

    @cached_property
    def accepted(self) -> float:
        return float(self.cum_p[self.h] + self.m_sorted[self.h :].sum())

    def keep_at(self, positions: np.ndarray) -> np.ndarray:
        """Acceptance probability of a selected token at sorted ``positions``: p/m on H*, 1 on C
        (m from the prefix sums, without building ``m_sorted``)."""
        positions = np.asarray(positions)
        m = (self.cum_p[positions + 1] + self.run[positions + 1]) - (self.cum_p[positions] + self.run[positions])
        ps = self.p_sorted[positions]
        m = np.maximum(m, ps)  # m ≥ p on H* (rounding only)
        with np.errstate(divide="ignore", invalid="ignore"):
            keep = np.where(m > 0, ps / np.where(m > 0, m, 1.0), 0.0)
        return np.where(positions < self.h, np.minimum(keep, 1.0), 1.0)

    @cached_property
    def keep_sorted(self) -> np.ndarray:
        return self.keep_at(np.arange(self.p_sorted.size))

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

    def segment(self, top: int) -> tuple[int, int]:
        """The contact boundaries ``u ≤ top < v`` of the segment holding sorted position ``top``."""
        r = int(np.searchsorted(self.records, top, side="right"))
        return int(self.records[r - 1]), int(self.records[r])

    def hull_level(self, top: int, mass: float) -> tuple[int, int]:
        """The level ``(a, b]`` holding sorted position ``top`` when the peeling has ``mass`` ν left
        (``ν = 1 − λ``, λ the uniform that walks the tree): the edge of the lower convex hull of the
        points ``(Q_j, M_j − νΦ(Q_j))``, ``u ≤ j ≤ v``, over the gap ``(Q_top, Q_top+1)``.

        Found by alternating tangents between the boundaries left of the gap (``u..top``) and right
        of it (``top+1..v``): ``b`` = tangent point from ``a`` on the right, ``a`` = tangent point from
        ``b`` on the left, each search restricted to the side of the last tangent point where the edge
        must lie (docs/theory/optimal-verifier.md, "Hull form"), until ``a`` repeats: ``a`` decreases after the first
        round, so this ends; 1–4 rounds measured. O(v − u) per round, no tree.
        """
        u, v = self.segment(top)
        qs = self.cum_q[u : v + 1]
        g = self.lift[u : v + 1] + (1.0 - mass) * self.phi[u : v + 1]  # = M − νΦ (lift = M − Φ)
        t = top - u
        a, right_from, left_to = 0, t + 1, t + 1
        while True:
            # candidates strictly wider than the pivot (boundaries of zero q-width carry no slope)
            lo = max(right_from, t + 1 + int(np.searchsorted(qs[t + 1 :], qs[a], side="right")))
            if lo > qs.size - 1:  # (a, v] has no q-mass: the top draft has probability 0 here
                return u + a, v
            b = lo + int(np.argmin((g[lo:] - g[a]) / (qs[lo:] - qs[a])))
            hi = min(left_to, int(np.searchsorted(qs[: t + 1], qs[b], side="left")))
            a_next = int(np.argmax((g[b] - g[:hi]) / (qs[b] - qs[:hi])))  # hi ≥ 1: Q_u < Q_b
            if a_next == a:
                return u + a, u + b
            a, right_from, left_to = a_next, b, a_next + 1

    def _pierce(self, a: int, b: int, y: int, top: int) -> float:
        """``max_{y < j ≤ top} γ_j / c_j`` over the chord ``(a, b)``: the mass ν at which the first
        boundary in ``(y, top]`` would reach the chord of ``M − νΦ`` (−inf if none can)."""
        qa, qb = self.cum_q[a], self.cum_q[b]
        t = (self.cum_q[y + 1 : top + 1] - qa) / (qb - qa)
        c = (1.0 - t) * self.phi[a] + t * self.phi[b] - self.phi[y + 1 : top + 1]
        gap = (1.0 - t) * self.lift[a] + t * self.lift[b] - self.lift[y + 1 : top + 1]  # γ − c (γ: M's gap)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(c > 0, 1.0 + gap / np.where(c > 0, c, 1.0), -np.inf)
        return float(ratio.max()) if ratio.size else -np.inf

    def entry_mass(self, top: int, y: int, start: float = 1.0) -> float:
        """``θ = sup{ν : the level of top at ν starts after y}`` for ``u ≤ y < top``: the level of the
        top draft holds position y exactly when ``ν > θ`` (given θ ≤ ``start``).

        Iterated from above: with ``(a, b)`` the level at ν (``a ≤ y``), no boundary of ``(y, top]``
        joins the hull before it reaches the chord ``(a, b)`` (every later edge lies below that chord),
        so ``θ ≤`` :meth:`_pierce` ``(a, b)``; the iteration stops where the pierce value is the
        current ν, i.e. where a boundary of ``(y, top]`` touches the current edge: that is θ. ν
        decreases strictly and the edge changes each round, so it ends (≈ 7 rounds measured at
        V = 151,936)."""
        nu = start
        while nu > 0.0:
            a, b = self.hull_level(top, nu)
            if a > y:
                return nu
            nxt = self._pierce(a, b, y, top)
            if not nxt < nu:
                return nu
            nu = max(nxt, 0.0)
        return 0.0

    def column_shares(self, pos: np.ndarray) -> np.ndarray:
        """``P(the level rule selects draft column j | drafts)`` for one tuple at sorted positions
        ``pos`` (K,), without the tree: the level's left end sweeps the drafts' distinct positions
        ``y_1 < … < y_m = top`` of the segment at the masses :meth:`entry_mass` ``θ_1 ≥ … ≥ θ_m = 0``;
        for ``ν ∈ (θ_i, θ_{i−1}]`` (``θ_0 = 1``) the level holds the columns at ``pos ≥ y_i``, each
        selected with probability 1 / (their number)."""
        top = int(pos.max())
        u, _ = self.segment(top)
        ys = np.unique(pos[pos >= u])
        out = np.zeros(pos.size)
        upper = 1.0
        for i, y in enumerate(ys):
            lower = 0.0 if i == ys.size - 1 else self.entry_mass(top, int(y), upper)
            inside = pos >= y
            out[inside] += (upper - lower) / inside.sum()
            upper = lower
        return out

    def level_path(self, top: int) -> list[tuple[int, int, float]]:
        """The levels ``(a, b]`` that can hold sorted position ``top``, with their probabilities: the
        path of ``top`` from its segment's root in the peeling tree (docs/theory/optimal-verifier.md),
        ``[(a, b, P(level = (a, b])), ...]`` in the order the uniform λ walks them (the
        probabilities sum to 1). The verifier reads it for short segments; for long ones
        :meth:`hull_level` finds the level at one λ in O(segment) without the tree (O(segment²) at
        worst, its length is the tree's depth).

        Examples
        --------
        >>> import numpy as np
        >>> from otbound.token.verifiers import optimal_coupling
        >>> p, q = np.array([0.25, 0.32, 0.15, 0.02, 0.26]), np.array([0.29, 0.44, 0.21, 0.02, 0.04])
        >>> c = optimal_coupling(p, q, 2)
        >>> [(a, b, round(w, 4)) for a, b, w in c.level_path(0)]   # three levels deep
        [(0, 3, 0.252), (0, 2, 0.728), (0, 1, 0.02)]
        >>> c.level_path(4)   # a segment of one token: one level
        [(4, 5, 1.0)]
        """
        r = int(np.searchsorted(self.records, top, side="right"))
        u, v = int(self.records[r - 1]), int(self.records[r])
        out = []
        mass = 1.0
        peeled = (0.0, 0.0, 0.0)
        while True:
            w, j, peeled = self.node(u, v, peeled)
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
    """Build :class:`OptimalCoupling` for checked 1-D laws p, q and K i.i.d. drafts: a sort of the
    ratios, two prefix sums and two running maxima (O(V log V)).

    Tokens sorted by p/q ascending (q = 0 last), ``Q_j``, ``P_j`` their prefix masses,
    ``G_j = Q_j^K − P_j``, ``h = argmax_j G_j`` and ``α* = P_h + 1 − Q_h^K``
    (docs/theory/optimal-verifier.md).

    Parameters
    ----------
    p, q : numpy.ndarray, shape (V,)
        Target and draft laws, already checked (float64, summing to 1; no validation here).
    k : int
        K ≥ 1, the number of i.i.d. drafts.

    Returns
    -------
    OptimalCoupling
        The sorted prefix sums, running maxima, contact records, h and α*.

    References
    ----------
    Hu et al., arXiv 2502.18779, Theorem 3.1 (the prefix form of α*).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.token.verifiers import optimal_coupling
    >>> c = optimal_coupling(np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5]), 2)
    >>> c.cum_q.tolist(), c.cum_p.tolist(), c.h   # tokens by p/q: 2, 1, 0
    ([0.0, 0.5, 0.8, 1.0], [0.0, 0.2, 0.5, 1.0], 2)
    >>> round(float(c.cum_p[c.h] + 1 - c.cum_q[c.h] ** 2), 12), round(c.alpha, 12)   # P_h + 1 − Q_h^K = α*
    (0.86, 0.86)
    """
    v = q.size
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = p / q
    ratio[q == 0] = np.inf
    order = np.argsort(ratio, kind="quicksort")
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
    alpha = float(min(1.0, cum_p[h] + 1.0 - phi[h]))
    return OptimalCoupling(order, cum_q, cum_p, phi, run, lift, ps, records, h, alpha)


class OptimalVerifier(Verifier):
    """The optimal (optimal-transport) verifier ``ot``: lossless, acceptance ``α*`` of its draft law.

    One verifier, one name, whatever the vocabulary size. With i.i.d. drafts
    (``sampling="with_replacement"``, the registry's) it samples the optimal coupling of the module
    docstring per draft tuple, at any V (V = 151,936 included); for another draft law
    (``"without_replacement"``, ``"greedy"``) it samples ``Y ~ π*(· | x̄)`` from the LP-optimal plan
    of :func:`otbound.optimal_acceptance_lp` (:mod:`otbound.token.verifiers._ot`), which needs
    ``|V|^(K+1) ≤ max_plan_cells`` and is exact to the solver's tolerance (~1e-9). Named ``ot``,
    the optimal-transport coupling of SpecTr's OTM (2310.15141), because ``"optimal"`` already names
    the bound α* in the reports' rows, and because the name should tell what the verifier does, not
    how large a vocabulary its implementation can take.

    Parameters
    ----------
    sampling : str
        The draft law (:data:`otbound.SAMPLINGS`), default ``"with_replacement"``.
    max_plan_cells : int
        The largest LP plan ``|V|^(K+1)`` the other draft laws may build.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound import VERIFIERS, optimal_acceptance
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> ot = VERIFIERS["ot"]
    >>> ot.lossless, abs(ot.acceptance(p, q, 2) - optimal_acceptance(p, q, 2)) < 1e-12
    (True, True)
    >>> wor = OptimalVerifier("without_replacement")  # the LP plan: exact to the solver's tolerance
    >>> abs(wor.acceptance(p, q, 2) - optimal_acceptance(p, q, 2, "without_replacement")) < 1e-9
    True
    """

    name = "ot"
    planned = True
    reference = "optimal-transport verifier: α = α* (SpecTr OTM 2310.15141; coupling derived here)"
    lossless = True

    def __init__(self, sampling: str = "with_replacement", max_plan_cells: int = MAX_PLAN_CELLS):
        self.sampling = draft_law(sampling).name
        self.max_plan_cells = int(max_plan_cells)
        self._cache = PreparedCache(CACHE_SIZE)

    def _prepare(self, p, q, k):
        if self.sampling != "with_replacement":
            return self._cache.get_or_build(p, q, k, lambda: plan(p, q, k, self.sampling, self.max_plan_cells))
        return self._cache.get_or_build(p, q, k, lambda: optimal_coupling(p, q, k))

    def batch_acceptance(self, batch, num_drafts):
        """``α = α*`` of its draft law (the proof in the module docstring), from the batched kernel:
        no coupling is built to compute it.

        Examples
        --------
        >>> import numpy as np
        >>> from otbound import VERIFIERS
        >>> from otbound.token import LawBatch
        >>> P = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
        >>> VERIFIERS["ot"].batch_acceptance(LawBatch(P, P[::-1]), 1).numpy().round(6).tolist()  # Σ min(p, q)
        [0.4, 0.4]
        """
        if self.sampling != "with_replacement":
            return super().batch_acceptance(batch, num_drafts)  # the LP plan per row: small V only
        return batch.optimal_acceptance(num_drafts, "with_replacement")

    def _closed_form(self, p, q, aux, k):
        if not isinstance(aux, OptimalCoupling):
            return None  # the plan's acceptance: by enumeration of its rows
        return aux.accepted  # Σ_{H*} p + Σ_C m, summed from the construction (not from optimal_acceptance)

    @staticmethod
    def _paths(aux, tops):
        """Per row, the levels that can hold sorted position ``tops[i]`` (its path in the peeling tree),
        padded to a common length: lower ends a, upper ends b (int (n, L)) and probabilities w
        (float (n, L), 0 as padding)."""
        uniq, inverse = np.unique(tops, return_inverse=True)
        paths = [aux.level_path(int(t)) for t in uniq]
        width = max(len(x) for x in paths)
        a = np.zeros((uniq.size, width), dtype=np.int64)
        b = np.zeros((uniq.size, width), dtype=np.int64)
        w = np.zeros((uniq.size, width))
        for i, path in enumerate(paths):
            arr = np.array(path)
            a[i, : len(path)], b[i, : len(path)], w[i, : len(path)] = arr[:, 0], arr[:, 1], arr[:, 2]
        inverse = inverse.ravel()
        return a[inverse], b[inverse], w[inverse]

    @staticmethod
    def _by_tree(aux, tops):
        """Rows whose levels come from the cached tree: segments up to ``TREE_MAX`` tokens, or
        holding at least one tuple per ``TREE_TOKENS_PER_TUPLE`` of their tokens (the tree's worst
        case, O(segment²) once, is then shared); the others use the hull, O(segment) per tuple."""
        r = np.searchsorted(aux.records, tops, side="right")
        length = aux.records[r] - aux.records[r - 1]
        shared = np.bincount(r, minlength=aux.records.size)[r]
        return (length <= TREE_MAX) | (shared * TREE_TOKENS_PER_TUPLE >= length)

    @classmethod
    def _levels_at(cls, aux, tops, lam):
        """The level ``(a, b]`` of each row for its uniform ``lam``: the tree walked with λ, or equally
        (docs/theory/optimal-verifier.md) :meth:`OptimalCoupling.hull_level` at ``ν = 1 − λ``."""
        by_tree = cls._by_tree(aux, tops)
        a = np.empty(tops.size, dtype=np.int64)
        b = np.empty(tops.size, dtype=np.int64)
        rows = np.flatnonzero(by_tree)
        if rows.size:
            pa, pb, pw = cls._paths(aux, tops[rows])
            last = (pw > 0).sum(axis=1) - 1  # levels fill a prefix of each row; rounding never picks padding
            level = np.minimum((np.cumsum(pw, axis=1) <= lam[rows, None]).sum(axis=1), last)
            a[rows], b[rows] = pa[np.arange(rows.size), level], pb[np.arange(rows.size), level]
        for i in np.flatnonzero(~by_tree):
            a[i], b[i] = aux.hull_level(int(tops[i]), 1.0 - float(lam[i]))
        return a, b

    def _laws(self, p, q, aux, drafts):
        if not isinstance(aux, OptimalCoupling):
            return plan_laws(aux, drafts)
        n, k = drafts.shape
        pos = aux.rank[drafts]
        share = np.empty((n, k))  # P(select draft column j | x̄)
        by_tree = self._by_tree(aux, pos.max(axis=1))
        rows = np.flatnonzero(by_tree)
        if rows.size:
            a, b, w = self._paths(aux, pos[rows].max(axis=1))
            inside = (pos[rows, None, :] >= a[:, :, None]) & (pos[rows, None, :] < b[:, :, None])  # (n, L, K)
            cnt = np.maximum(inside.sum(axis=2, keepdims=True), 1)
            share[rows] = (w[:, :, None] * inside / cnt).sum(axis=1)
        for i in np.flatnonzero(~by_tree):
            share[i] = aux.column_shares(pos[i])
        law = np.zeros((n, q.size))
        np.add.at(law, (np.repeat(np.arange(n), k), drafts.ravel()), share.ravel())
        law *= aux.keep[None, :]
        law += np.maximum(1.0 - law.sum(axis=1), 0.0)[:, None] * aux.residual[None, :]
        return law

    def _sample(self, p, q, aux, drafts, rng):
        if not isinstance(aux, OptimalCoupling):
            return draw(plan_laws(aux, drafts), rng.random(drafts.shape[0]))
        n, k = drafts.shape
        pos = aux.rank[drafts]
        a, b = self._levels_at(aux, pos.max(axis=1), rng.random(n))
        rows = np.arange(n)
        inside = (pos >= a[:, None]) & (pos < b[:, None])
        pick = np.floor(rng.random(n) * inside.sum(axis=1)).astype(np.int64)  # pick-th draft inside
        col = np.argmax(np.cumsum(inside, axis=1) > pick[:, None], axis=1)
        out = drafts[rows, col].copy()
        rejected = rng.random(n) >= aux.keep_at(pos[rows, col])
        if rejected.any():
            out[rejected] = aux.order[draw(aux.residual_sorted, rng.random(int(rejected.sum())))]
        return out
