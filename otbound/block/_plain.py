"""Reference formulations of the block bounds over explicit draft tuples (implementation).

These are the textbook forms of docs/theory/block-bounds.md, kept as independent checks of :mod:`otbound.block._lp`
and as the baseline of ``experiments/bench_causal.py``:

* :func:`causal_lp_plain` — the causal LP with plan ``π(x̄, y_{1:n}, n)`` over every draft tuple
  ``x̄`` (ordered, or multisets of blocks weighted by their multinomial probability when
  ``exchangeable=True``), losslessness flow variables ``S(w)`` and HiGHS. Variables: for every
  tuple, every distinct prefix ``u`` of its blocks (root included) and every correction token ``y``.
* :func:`joint_ot_emd` — ``max E[max_k LCP(X^(k), Y)]`` by network simplex (POT ``ot.emd``) between
  multisets of K blocks and target blocks (exchangeability: a coupling of ordered tuples averages
  to one of multisets with the same value).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import scipy.sparse

from otbound._solvers import emd, solve_lp
from otbound._validation import InvalidInputError
from otbound.block._tree import BlockTree

MAX_PLAIN_VARIABLES = 30_000_000
MAX_EMD_ENTRIES = 60_000_000


def draft_tuples(tree: BlockTree, num_drafts: int, exchangeable: bool):
    """Draft tuples as leaf indices ``(T, K)`` and their probabilities (multisets: × multiplicity)."""
    q = tree.q_path[tree.level(tree.block_len)]
    support = np.flatnonzero(q > 0)
    k = int(num_drafts)
    if exchangeable:
        tuples = np.array(list(itertools.combinations_with_replacement(support.tolist(), k)), dtype=np.int64).reshape(
            -1, k
        )
        counts = np.array(
            [
                math.factorial(k) / np.prod([math.factorial(c) for c in np.unique(row, return_counts=True)[1]])
                for row in tuples
            ]
        )
    else:
        if support.size**k > MAX_PLAIN_VARIABLES:
            raise InvalidInputError(f"{support.size}^{k} ordered draft tuples: too many to enumerate")
        tuples = np.stack(np.unravel_index(np.arange(support.size**k), (support.size,) * k), 1)
        tuples = support[tuples]
        counts = np.ones(tuples.shape[0])
    return tuples, counts * np.prod(q[tuples], axis=1)


def causal_lp_plain(tree: BlockTree, num_drafts: int, *, exchangeable: bool = False) -> float:
    """U_causal by the LP of docs/theory/block-bounds.md over explicit draft tuples (reference / baseline)."""
    return causal_lp_tuples(tree, *draft_tuples(tree, num_drafts, exchangeable))


def causal_lp_tuples(tree: BlockTree, tuples: np.ndarray, probs: np.ndarray, selectable=None) -> float:
    """The causal LP for any law of draft tuples: ``tuples`` ``(T, K)`` leaf indices (blocks raveled
    over ``V^L``) with probabilities ``probs`` (a drafting scheme other than K i.i.d. blocks, e.g. a
    tree; the LP only reads the tuples and their law). ``selectable`` (mask over nodes): no other
    prefix may be accepted (the lower side of a truncation bracket, :mod:`otbound.block._truncate`)."""
    v, length = tree.vocab_size, tree.block_len
    nt, k = tuples.shape
    # node ids of every prefix of every block: (T, K, L+1); dedupe per tuple
    nodes = np.empty((nt, k, length + 1), dtype=np.int64)
    for d in range(length + 1):
        nodes[:, :, d] = tree.offsets[d] + tuples // v ** (length - d)
    flat = np.sort(nodes.reshape(nt, -1), axis=1)
    first = np.ones_like(flat, dtype=bool)
    first[:, 1:] = flat[:, 1:] != flat[:, :-1]
    tup_idx, col = np.nonzero(first)
    u = flat[tup_idx, col]
    npairs = u.size
    if npairs * v > MAX_PLAIN_VARIABLES:
        raise InvalidInputError(f"the plain causal LP would have {npairs * v} plan variables: too large")
    # extended trie (depth L+1): child of node u with token y
    ext_off = np.concatenate([tree.offsets, [tree.offsets[-1] + v ** (length + 1)]])
    du = tree.depth[u]
    w = (ext_off[du + 1] + (u - tree.offsets[du]) * v)[:, None] + np.arange(v)  # (npairs, V)
    nw = int(ext_off[-1])  # nodes incl. depth L+1
    n = tree.num_nodes  # S variables for nodes 1..n−1 (depth 1..L)
    npi = npairs * v
    # variables: π (npi) | S (n − 1)
    nvar = npi + n - 1
    pi_rows_tuple = np.repeat(tup_idx, v)
    w_flat = w.ravel()
    # rows 0..nt−1: tuple marginals; rows nt..nt+nw−2: flow at each extended non-root node
    flow_row = nt + w_flat - 1
    rows = [pi_rows_tuple, flow_row]
    cols = [np.arange(npi), np.arange(npi)]
    vals = [np.ones(npi), np.ones(npi)]
    s_nodes = np.arange(1, n)
    rows.append(nt + s_nodes - 1)  # + S(w) in its own flow row
    cols.append(npi + s_nodes - 1)
    vals.append(np.ones(s_nodes.size))
    # − p(w|par) S(par) in the flow row of every child w of a non-root node par (depth 1..L)
    par = np.repeat(s_nodes, v)
    dp = tree.depth[par]
    child = ext_off[dp + 1] + (par - tree.offsets[dp]) * v + np.tile(np.arange(v), s_nodes.size)
    rows.append(nt + child - 1)
    cols.append(npi + par - 1)
    vals.append(-tree.p_cond[par, np.tile(np.arange(v), s_nodes.size)])
    a_eq = scipy.sparse.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(nt + nw - 1, nvar)
    )
    b_eq = np.zeros(nt + nw - 1)
    b_eq[:nt] = probs
    b_eq[nt + np.arange(v)] = tree.p_cond[0]  # children of the root: S(∅) = 1
    cost = np.zeros(nvar)
    cost[:npi] = -np.repeat(tree.depth[u], v).astype(np.float64)  # τ = |u| for emission at u
    bounds = (0, None)
    if selectable is not None:  # emission at u accepts u: forbidden where u is not selectable
        bounds = np.zeros((nvar, 2))
        bounds[:, 1] = np.inf
        bounds[:npi][~np.repeat(np.asarray(selectable, dtype=bool)[u], v), 1] = 0.0
    return float(-solve_lp(cost, None, None, a_eq, b_eq, bounds, "plain causal LP").fun)


def lcp_matrix(tree: BlockTree) -> np.ndarray:
    """Longest common prefix length between every pair of blocks, ``(V^L, V^L)``."""
    digits = tree.leaf_prefixes()
    same = digits[:, None, :] == digits[None, :, :]
    return np.cumprod(same, axis=2).sum(axis=2)


def joint_ot_emd(tree: BlockTree, num_drafts: int, *, return_plan: bool = False):
    """U_joint by network simplex between multisets of K draft blocks and target blocks."""
    tuples, probs = draft_tuples(tree, num_drafts, exchangeable=True)
    value, plan = joint_ot_tuples(tree, tuples, probs)
    return (value, tuples, plan) if return_plan else value


def joint_ot_tuples(tree: BlockTree, tuples: np.ndarray, probs: np.ndarray):
    """``(U_joint, plan)`` for any law of draft tuples (``tuples`` ``(T, K)`` leaf indices, ``probs``)."""
    p = tree.p_path[tree.level(tree.block_len)]
    if tuples.shape[0] * p.size > MAX_EMD_ENTRIES:
        raise InvalidInputError(
            f"the joint OT cost matrix would have {tuples.shape[0] * p.size} entries: too large for ot.emd"
        )
    lcp = lcp_matrix(tree)
    reward = lcp[tuples[:, 0]]
    for j in range(1, tuples.shape[1]):
        reward = np.maximum(reward, lcp[tuples[:, j]])
    if tuples.shape[0] == 1:  # one tuple: the only coupling (POT's network simplex rejects one source)
        plan = (p / p.sum())[None]
    else:
        plan = emd(probs / probs.sum(), p / p.sum(), -reward.astype(np.float64))
    return float((plan * reward).sum()), plan
