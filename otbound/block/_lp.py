"""Exact joint-OT and causal block bounds by one sparse LP over the trie (derived; implementation).

**Reduction** (derived for otbound; checked against the plain LPs of :mod:`otbound.block._plain`
and, for the joint bound, against network simplex in the tests). Both block bounds depend on the K
i.i.d. draft blocks only through the block ``x`` the verifier (or the coupling) *selects* — for the
causal bound the draft whose prefix is accepted, for the joint bound the draft realising
``max_k LCP``. Let ``r`` be the law of the selected block.

1. **Which ``r`` are possible.** ``r`` is the law of a (randomised) choice among K i.i.d. draws of
   ``q`` iff ``r(A) ≤ 1 − (1 − q(A))^K`` for every set ``A`` of blocks (supply–demand theorem; the
   right side is the probability that some draw lies in ``A``). These ``r`` are produced
   recursively: the best of ``k`` draws is a choice between the best of the first ``k − 1`` (law
   ``r_{k−1}``) and the independent ``k``-th draw (law ``q``), so with ``keep_k(y, x)`` the mass of
   the pair (best-so-far ``y``, new draw ``x``) that keeps ``y``::

       r_k(z) = q(z) + Σ_x keep_k(z, x) − Σ_y keep_k(y, z),   0 ≤ keep_k(y, x) ≤ r_{k−1}(y) q(x),

   ``r_1 = q`` (every vertex of the polytope, "best under a fixed ranking", is reached this way and
   every such rule is a choice among K draws, so the description is exact). Size ``(K−1)·V^{2L}``.
2. **Given ``r``, the single-draft problem.** With ``R(w) = Σ_{x ⪰ w} r(x)`` and ``M(w)`` the
   probability that node ``w`` lies on the selected (accepted / matched) prefix,
   ``E[τ] = Σ_{w ≠ ∅} M(w)`` and the best ``M`` is the componentwise largest feasible one:

   * joint OT:  ``M(w) = min(p(w), R(w))`` (for K = 1 the per-level value Σ min(p, q));
   * causal:    ``M(w) = min(R(w), p(w_last | parent) · M(parent))``, ``M(∅) = 1`` — exactly block
     verification's value (Sun et al. 2403.10444) for a single draft of law ``r``; the losslessness
     flow of docs/theory/block-bounds.md holds with ``S(w) = M(w)`` and correction mass
     ``R(u·y) = p(y|u) M(u) − M(u·y) ≥ 0``.

   As an LP: maximise ``Σ t_w`` with ``t_w ≤ R(w)`` and ``t_w ≤ p(w)`` (joint) or
   ``t_w ≤ p(w|parent) t_parent`` (causal). Hence ``U = max_r Σ_w M_r(w)``, one LP whose size does
   not grow with the ``V^{LK}`` draft tuples.

The causal optimum is attained by an explicit lossless verifier: choose a draft with the ``keep``
rule, then run block verification on it with the selected-block law ``r`` as the draft model (see
``BLOCK_VERIFIERS["causal_optimal"]``).

``selectable`` (a boolean mask over nodes) forbids selecting the other nodes (``t_w = 0``): the
lower side of a truncated bracket. Tolerances: HiGHS primal/dual feasibility ``1e-10``; the value is
an LP optimum to ~``1e-9`` (tests compare independent formulations at ``1e-8``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse

from otbound._solvers import solve_lp
from otbound._validation import InvalidInputError
from otbound.block._tree import BlockTree

# (K − 1)·V^{2L} split variables at most
MAX_SPLIT_VARIABLES = 2_000_000  # ≈ 0.4 GB at LP_BYTES_PER_VARIABLE (20 M needed several times this machine's memory)
LP_BYTES_PER_VARIABLE = 200  # estimate: sparse entries (3 per split variable, index + value), HiGHS's copies


@dataclass
class SelectionLP:
    """Solution of the r-form LP: value, selected-block law r, accepted-through law M, keep splits."""

    value: float
    selected_law: np.ndarray = field(repr=False)
    through: np.ndarray = field(repr=False)
    keep: list = field(repr=False)


class _Builder:
    """COO accumulator for ``A_ub x ≤ b_ub`` and ``A_eq x = b_eq``."""

    def __init__(self):
        self.parts = {"ub": ([], [], [], []), "eq": ([], [], [], [])}

    def add(self, kind, rows, cols, vals, rhs):
        """Rows are local 0..m−1 (numbered within this call); ``rhs`` has length m."""
        r, c, v, b = self.parts[kind]
        offset = sum(len(x) for x in b)
        r.append(np.asarray(rows, dtype=np.int64) + offset)
        c.append(np.asarray(cols, dtype=np.int64))
        v.append(np.asarray(vals, dtype=np.float64))
        b.append(np.asarray(rhs, dtype=np.float64))

    def matrices(self, nvar):
        out = []
        for kind in ("ub", "eq"):
            r, c, v, b = self.parts[kind]
            if not b:
                out += [None, None]
                continue
            rhs = np.concatenate(b)
            a = scipy.sparse.csr_matrix(
                (np.concatenate(v), (np.concatenate(r), np.concatenate(c))), shape=(rhs.size, nvar)
            )
            out += [a, rhs]
        return out


def solve_selection_lp(
    tree: BlockTree, num_drafts: int, kind: str, selectable: np.ndarray | None = None
) -> SelectionLP:
    """``U_joint`` (``kind="joint"``) or ``U_causal`` (``kind="causal"``) for K i.i.d. draft blocks."""
    if kind not in ("joint", "causal"):
        raise InvalidInputError(f"unknown block LP kind {kind!r}")
    v, length, k = int(tree.vocab_size), int(tree.block_len), int(num_drafts)
    n = tree.num_nodes
    nl = v**length
    if (k - 1) * nl * nl > MAX_SPLIT_VARIABLES:
        raise InvalidInputError(
            f"the exact block LP needs (K − 1)·V^(2L) = {(k - 1) * nl * nl} split variables (V = {v}, L = {length}, "
            f"K = {k}), about {(k - 1) * nl * nl * LP_BYTES_PER_VARIABLE / 1e9:.1f} GB; the limit "
            f"otbound.block._lp.MAX_SPLIT_VARIABLES = {MAX_SPLIT_VARIABLES} (raise it if the memory is there); "
            "or use block_bound_bracket with a smaller top_m"
        )
    q = tree.q_path[tree.level(length)]
    edge = tree.edge_prob()
    m = n - 1  # non-root nodes, variable j ↔ node j + 1
    # variable blocks: t (m) | R (m) | keep_k (nl²) for k = 2..K | r_k (nl) for k = 2..K−1
    t0, r0 = 0, m
    keep0 = [2 * m + (kk - 2) * nl * nl for kk in range(2, k + 1)]
    rk0 = {kk: 2 * m + (k - 1) * nl * nl + (kk - 2) * nl for kk in range(2, k)}
    nvar = 2 * m + (k - 1) * nl * nl + max(k - 2, 0) * nl

    lower = np.zeros(nvar)
    upper = np.full(nvar, np.inf)
    nodes = np.arange(1, n)
    if kind == "joint":
        upper[t0 : t0 + m] = tree.p_path[1:]
    else:
        upper[t0 : t0 + m] = np.where(tree.depth[1:] == 1, edge[1:], np.inf)
    if selectable is not None:
        upper[t0 : t0 + m][~np.asarray(selectable, dtype=bool)[1:]] = 0.0

    b = _Builder()
    # t_w − R_w ≤ 0
    idx = np.arange(m)
    b.add("ub", np.repeat(idx, 2), np.stack([t0 + idx, r0 + idx], 1).ravel(), np.tile([1.0, -1.0], m), np.zeros(m))
    # causal: t_w − p(w|parent) t_parent ≤ 0 for depth ≥ 2
    if kind == "causal":
        deep = nodes[tree.depth[1:] >= 2]
        rows = np.arange(deep.size)
        b.add(
            "ub",
            np.repeat(rows, 2),
            np.stack([t0 + deep - 1, t0 + tree.parent[deep] - 1], 1).ravel(),
            np.stack([np.ones(deep.size), -edge[deep]], 1).ravel(),
            np.zeros(deep.size),
        )
    # tree: R(w) − Σ_children R(c) = 0 for internal non-root nodes
    internal = nodes[tree.depth[1:] < length]
    if internal.size:
        kids = (
            tree.offsets[tree.depth[internal] + 1][:, None]
            + (internal - tree.offsets[tree.depth[internal]])[:, None] * v
            + np.arange(v)
        )
        rows = np.repeat(np.arange(internal.size), v + 1)
        cols = np.concatenate([(r0 + internal - 1)[:, None], r0 + kids - 1], 1).ravel()
        vals = np.tile(np.concatenate([[1.0], -np.ones(v)]), internal.size)
        b.add("eq", rows, cols, vals, np.zeros(internal.size))

    leaves = np.arange(tree.offsets[length], n)
    if k == 1:
        lower[r0 + leaves - 1] = upper[r0 + leaves - 1] = q
    for kk in range(2, k + 1):
        base = keep0[kk - 2]
        pair = np.arange(nl * nl)
        y, x = np.divmod(pair, nl)
        # r_kk(z) − Σ_x keep(z, x) + Σ_y keep(y, z) = q(z), with r_K(z) = R(leaf z)
        target = (r0 + leaves - 1) if kk == k else (rk0[kk] + np.arange(nl))
        rows = np.concatenate([np.arange(nl), y, x])
        cols = np.concatenate([target, base + pair, base + pair])
        vals = np.concatenate([np.ones(nl), -np.ones(nl * nl), np.ones(nl * nl)])
        b.add("eq", rows, cols, vals, q)
        if kk == 2:
            upper[base : base + nl * nl] = np.outer(q, q).ravel()
        else:  # keep(y, x) − q(x) r_{kk−1}(y) ≤ 0
            b.add(
                "ub",
                np.repeat(pair, 2),
                np.stack([base + pair, rk0[kk - 1] + y], 1).ravel(),
                np.stack([np.ones(pair.size), -q[x]], 1).ravel(),
                np.zeros(pair.size),
            )

    a_ub, b_ub, a_eq, b_eq = b.matrices(nvar)
    cost = np.zeros(nvar)
    cost[t0 : t0 + m] = -1.0
    res = solve_lp(cost, a_ub, b_ub, a_eq, b_eq, np.stack([lower, upper], 1), f"{kind} block LP")
    sol = res.x
    through = np.concatenate([[1.0], sol[t0 : t0 + m]])
    selected = np.maximum(sol[r0 + leaves - 1], 0.0)
    keep = [np.maximum(sol[keep0[kk - 2] : keep0[kk - 2] + nl * nl], 0.0).reshape(nl, nl) for kk in range(2, k + 1)]
    return SelectionLP(value=float(-res.fun), selected_law=selected, through=through, keep=keep)


def solve_static_tree_lp(target, paths) -> float:
    """Best ``E[τ]`` of a select-then-verify verifier on a fixed draft tree, by LP (derived; the
    independent check of :func:`otbound.block._static_tree.static_tree_bound`).

    The tree is the set of prefixes of ``paths`` (rows of token ids, one per leaf). A verifier
    selects a leaf ``ℓ`` with any law ``r`` (possibly depending on the target's randomness: every
    ``r`` on the leaves is allowed) and runs block verification on its path; with
    ``R(w) = Σ_{ℓ under w} r(ℓ)`` the probability ``t_w`` that node ``w`` is accepted satisfies
    ``t_w ≤ R(w)`` and ``t_w ≤ p(w_last | parent) t_parent`` (``t_∅ = 1``), the causal form of
    docs/theory/block-bounds.md for one selected block. Maximise ``Σ_w t_w`` over ``t ≥ 0`` and ``r ≥ 0``,
    ``Σ r = 1``. Nothing here uses the coverage formula Σ p(w). HiGHS tolerance 1e-10.
    """
    paths = [tuple(int(t) for t in row) for row in np.asarray(paths)]
    nodes = sorted({row[:d] for row in paths for d in range(1, len(row) + 1)}, key=lambda w: (len(w), w))
    index = {w: i for i, w in enumerate(nodes)}
    leaves = sorted(set(paths))
    m, n_leaf = len(nodes), len(leaves)
    nvar = m + n_leaf  # t (m) | r (leaves)
    b = _Builder()
    for i, w in enumerate(nodes):
        under = [m + j for j, leaf in enumerate(leaves) if leaf[: len(w)] == w]
        b.add("ub", [0] * (1 + len(under)), [i] + under, [1.0] + [-1.0] * len(under), [0.0])
        edge = float(np.asarray(target(w[:-1]))[w[-1]])
        if len(w) == 1:
            b.add("ub", [0], [i], [1.0], [edge])
        else:
            b.add("ub", [0, 0], [i, index[w[:-1]]], [1.0, -edge], [0.0])
    b.add("eq", [0] * n_leaf, list(range(m, nvar)), [1.0] * n_leaf, [1.0])
    a_ub, b_ub, a_eq, b_eq = b.matrices(nvar)
    cost = np.zeros(nvar)
    cost[:m] = -1.0
    bounds = np.stack([np.zeros(nvar), np.full(nvar, np.inf)], 1)
    res = solve_lp(cost, a_ub, b_ub, a_eq, b_eq, bounds, "static tree LP")
    return float(-res.fun)
