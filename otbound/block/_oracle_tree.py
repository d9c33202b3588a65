"""The best deterministic draft tree at a node budget, and the schemes it bounds (implementation).

**Bound** (derived). A deterministic drafter proposes a fixed tree ``T`` of prefixes (a greedy
chain, a static or dynamic top-k tree — EAGLE, SGLang, DDTree); verified by walking the target's
own sample down ``T`` (traversal with one-hot draft laws, :mod:`otbound.block._static_tree`), node
``w`` is accepted exactly when the target's draw follows it, so ``E[τ] = Σ_{w ∈ T} p(w)`` with
``p(w)`` the target's probability of the whole prefix ``w``; no lossless verifier of a fixed tree
does better (each accepted node is a target draw). Path probabilities fall along a path,
``p(u·a) = p(u) p(a|u) ≤ p(u)``, so the ``B`` prefixes of largest ``p(w)`` (ties kept prefix-closed)
form a tree, and

    U_oracle(B) = max_{T tree, |T| = B} Σ_{w ∈ T} p(w) = the sum of the B largest p(w)

bounds every deterministic drafter with ``B`` nodes, whatever its draft model. It is built
best-first: a heap holds, for every expanded node, its next unexpanded child in decreasing
``p(·|u)``; popping the largest gives the nodes in decreasing ``p(w)``, so one run of budget ``B``
gives ``U_oracle(b)`` for every ``b ≤ B`` (the cumulative sums). Each popped node of depth below
``max_depth`` costs one call of the target. Checked against brute force over all trees of ``B``
nodes (``tests/test_oracle_tree.py``).

Pankratov & Alistarh (arXiv 2512.11718) predict that the best tree's expected acceptance grows
logarithmically in the budget; :func:`fit_log_growth` fits ``a + b log B`` to a curve.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np

from otbound._validation import InvalidInputError, check_positive_int
from otbound.block._static_tree import static_tree_bound
from otbound.block.bounds import block_bound
from otbound.block.models import as_block_model

#: the oracle keeps, per expanded node, its candidate children in decreasing probability, at most
#: ``budget`` of them: ``budget × min(budget, V)`` ids in all, at most this many
MAX_ORACLE_CELLS = 20_000_000


@dataclass
class OracleTreeBound:
    """The best deterministic tree of ``budget`` nodes: ``value = Σ_{w ∈ T} p(w)``.

    Returned by :func:`otbound.block.oracle_tree_bound`.

    Attributes
    ----------
    value : float
        U_oracle(B), the bound on E[τ] (bonus excluded) of every deterministic drafter with B nodes.
    curve : numpy.ndarray
        float64 ``(n,)``: ``curve[b − 1] = U_oracle(b)`` for ``b = 1..n`` (n = nodes found).
    nodes : list of tuple
        The tree's prefixes in decreasing ``p(w)``.
    probs : numpy.ndarray
        float64 ``(n,)``: ``p(w)`` of each node, non-increasing.
    levels : numpy.ndarray
        float64 ``(D,)``: ``Σ_{|w| = ℓ} p(w)`` per depth (P(τ ≥ ℓ) under traversal of the tree).
    budget : int
        B asked; ``len(nodes) < B`` when fewer prefixes have ``p(w) > 0`` (they would add nothing).

    References
    ----------
    Pankratov & Alistarh, arXiv 2512.11718 (the best tree at a budget and its growth); the bound is
    derived in :mod:`otbound.block._oracle_tree`.

    Examples
    --------
    >>> from otbound.block import context_free_model, oracle_tree_bound
    >>> b = oracle_tree_bound(context_free_model([0.6, 0.3, 0.1]), 3, max_depth=2)
    >>> b.nodes, b.probs.round(12).tolist()            # 0 (0.6), then 00 (0.36), then 1 (0.3)
    ([(0,), (0, 0), (1,)], [0.6, 0.36, 0.3])
    >>> round(b.value, 12), b.curve.round(12).tolist()
    (1.26, [0.6, 0.96, 1.26])
    """

    value: float
    curve: np.ndarray
    nodes: list
    probs: np.ndarray
    levels: np.ndarray
    budget: int


def _order(law: np.ndarray, allowed, keep: int, prefix: tuple) -> np.ndarray:
    """Candidate tokens of positive probability in decreasing ``law``, ties to the lower id, at most ``keep``."""
    if allowed is None:
        ids = np.arange(law.size)
    else:
        ids = np.asarray(list(allowed), dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= law.size or np.unique(ids).size != ids.size):
            raise InvalidInputError(f"candidates at prefix {list(prefix)} must be distinct token ids in "
                                    f"0..{law.size - 1}, got {ids.tolist()}")
    ids = ids[law[ids] > 0]
    if ids.size > keep:  # the keep largest (ties to the lower id), then sorted
        ids = ids[np.lexsort((ids, -law[ids]))[:keep]]
    return ids[np.lexsort((ids, -law[ids]))]


def oracle_tree_bound(target, budget: int, *, max_depth: int | None = None, vocab_size: int | None = None,
                      candidates=None) -> OracleTreeBound:
    """The best deterministic draft tree of ``budget`` nodes: ``U_oracle(B) = Σ`` of the B largest
    target path probabilities ``p(w)`` (module :mod:`otbound.block._oracle_tree`).

    Parameters
    ----------
    target : BlockModel or callable
        The target, ``prefix -> next-token law``.
    budget : int
        B, the number of tree nodes (root excluded).
    max_depth : int, optional
        Deepest node allowed (the drafter's depth; default: none, the tree may be a chain of B).
    vocab_size : int, optional
        Needed when ``target`` is a plain callable.
    candidates : callable, optional
        ``prefix -> token ids`` the tree may use as children of that prefix (default: every token);
        e.g. the children a stored draft tree holds, for the best subtree of it.

    Returns
    -------
    OracleTreeBound
        With the whole curve ``U_oracle(b)``, ``b ≤ B``.

    Raises
    ------
    otbound.InvalidInputError
        A budget or depth that is not a positive integer, or ``budget × min(budget, V)`` above
        :data:`MAX_ORACLE_CELLS` (the candidate lists the search keeps).

    References
    ----------
    Pankratov & Alistarh, arXiv 2512.11718.

    Examples
    --------
    A chain of one token beats branching when the target is confident:

    >>> from otbound.block import context_free_model, oracle_tree_bound
    >>> b = oracle_tree_bound(context_free_model([0.9, 0.1]), 2)
    >>> b.nodes, round(b.value, 12)
    ([(0,), (0, 0)], 1.71)
    """
    bud = check_positive_int(budget, "budget")
    depth = None if max_depth is None else check_positive_int(max_depth, "max_depth")
    v = vocab_size or getattr(target, "vocab_size", None)
    if v is None:
        raise InvalidInputError("pass the target as a BlockModel or give vocab_size")
    if bud * min(bud, int(v)) > MAX_ORACLE_CELLS:
        raise InvalidInputError(
            f"budget {bud} at V = {v} keeps {bud * min(bud, int(v))} candidate ids (limit "
            f"otbound.block.MAX_ORACLE_CELLS = {MAX_ORACLE_CELLS}): lower the budget"
        )
    if candidates is not None and not callable(candidates):
        raise InvalidInputError(f"candidates must be a callable prefix -> token ids, got {type(candidates).__name__}")
    target = as_block_model(target, int(v), "target")
    orders: dict = {}
    heap: list = []  # (−p(w), tie, prefix, rank among its parent's children)
    tie = itertools.count()

    def expand(prefix: tuple, prob: float):
        law = target(prefix)
        allowed = None if candidates is None else candidates(prefix)
        order = _order(law, allowed, bud, prefix)
        orders[prefix] = (order, law, prob)
        if order.size:
            heapq.heappush(heap, (-prob * float(law[order[0]]), next(tie), prefix + (int(order[0]),), 0))

    expand((), 1.0)
    nodes, probs = [], []
    while heap and len(nodes) < bud:
        neg, _, node, rank = heapq.heappop(heap)
        prob = -neg
        if prob <= 0:
            break
        nodes.append(node)
        probs.append(prob)
        parent = node[:-1]
        order, law, parent_prob = orders[parent]
        if rank + 1 < order.size:
            sib = int(order[rank + 1])
            heapq.heappush(heap, (-parent_prob * float(law[sib]), next(tie), parent + (sib,), rank + 1))
        if depth is None or len(node) < depth:
            expand(node, prob)
    p = np.array(probs, dtype=np.float64)
    levels = np.zeros(max((len(w) for w in nodes), default=0))
    for w, pw in zip(nodes, probs):
        levels[len(w) - 1] += pw
    curve = np.cumsum(p)
    return OracleTreeBound(float(curve[-1]) if p.size else 0.0, curve, nodes, p, levels, bud)


@dataclass
class LogGrowthFit:
    """Least-squares fit ``value ≈ a + b log B`` (natural log) of a curve in the budget.

    Returned by :func:`otbound.block.fit_log_growth`.

    Attributes
    ----------
    a, b : float
        Intercept and slope per unit of ``log B``.
    r2 : float
        Coefficient of determination of the fit (1: exactly logarithmic).
    max_residual : float
        Largest ``|value − a − b log B|``.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.block import fit_log_growth
    >>> f = fit_log_growth([1, 2, 4, 8], 0.5 + 0.25 * np.log([1, 2, 4, 8]))
    >>> round(f.a, 12), round(f.b, 12), round(f.r2, 12)
    (0.5, 0.25, 1.0)
    """

    a: float
    b: float
    r2: float
    max_residual: float


def fit_log_growth(budgets, values) -> LogGrowthFit:
    """Fit ``a + b log B`` to ``values`` at ``budgets`` by least squares (Pankratov & Alistarh,
    arXiv 2512.11718, predict logarithmic growth of the best tree's acceptance in the budget).

    Parameters
    ----------
    budgets : array_like of int
        At least two distinct positive budgets.
    values : array_like of float
        The curve at those budgets.

    Returns
    -------
    LogGrowthFit

    Raises
    ------
    otbound.InvalidInputError
        Mismatched lengths, fewer than two distinct budgets, non-positive budgets or non-finite values.

    Examples
    --------
    >>> from otbound.block import fit_log_growth
    >>> fit_log_growth([1, 2], [1.0, 2.0]).r2
    1.0
    """
    x = np.asarray(budgets, dtype=np.float64).ravel()
    y = np.asarray(values, dtype=np.float64).ravel()
    if x.size != y.size:
        raise InvalidInputError(f"{x.size} budgets but {y.size} values")
    if np.unique(x).size < 2 or not (x > 0).all() or not np.isfinite(y).all():
        raise InvalidInputError("the fit needs at least two distinct positive budgets and finite values")
    design = np.stack([np.ones_like(x), np.log(x)], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ np.array([a, b])
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / total if total > 0 else 1.0
    return LogGrowthFit(float(a), float(b), r2, float(np.abs(resid).max()))


@dataclass
class NodeBudgetComparison:
    """Deterministic and sampled drafting at the same node budgets.

    Returned by :func:`otbound.block.node_budget_comparison`. Every row is an upper bound on E[τ]
    (bonus excluded) attained by a lossless verifier: ``oracle`` by traversal of the target's own
    best tree (no drafter reaches it unless it knows the target), ``static`` by traversal of the
    draft's best static top-k tree with at most B nodes, ``sampled`` by the causal-optimal verifier
    of K i.i.d. draft blocks of L tokens with ``K·L ≤ B`` (the positions the target scores).

    Attributes
    ----------
    budgets : numpy.ndarray
        int64 ``(n,)``.
    oracle : numpy.ndarray
        ``U_oracle(B)``.
    static : numpy.ndarray
        The best ``U_static`` over branchings with at most B nodes (NaN where none fits).
    static_branching : list of tuple
        The branching attaining it (None where none fits).
    sampled : numpy.ndarray
        The best ``U_causal`` of K i.i.d. blocks with ``K·L ≤ B`` (NaN where none is allowed).
    sampled_shape : list of tuple
        ``(K, L)`` attaining it.
    fit : LogGrowthFit or None
        ``a + b log B`` fitted to ``oracle`` (None with fewer than two budgets).

    Examples
    --------
    >>> from otbound.block import context_free_model, node_budget_comparison
    >>> p, q = context_free_model([0.6, 0.4]), context_free_model([0.4, 0.6])
    >>> c = node_budget_comparison(p, q, [1, 3], max_depth=2)   # oracle at 3: nodes 0, 1, 00
    >>> c.oracle.round(12).tolist(), c.static.round(12).tolist(), c.static_branching
    ([0.6, 1.36], [0.4, 1.0], [(1,), (2,)])
    """

    budgets: np.ndarray
    oracle: np.ndarray
    static: np.ndarray
    static_branching: list
    sampled: np.ndarray
    sampled_shape: list
    fit: LogGrowthFit | None


def static_branchings(max_nodes: int, max_depth: int, max_width: int) -> list:
    """Every static-tree branching ``(b_1, …, b_L)`` with ``L ≤ max_depth``, ``b_ℓ ≤ max_width`` and at
    most ``max_nodes`` nodes (``b_1 + b_1 b_2 + …``), with its node count.

    Parameters
    ----------
    max_nodes, max_depth, max_width : int
        The node budget, the deepest level and the widest branching.

    Returns
    -------
    list of (tuple, int)
        ``(branching, nodes)`` pairs, in depth-first order.

    Raises
    ------
    otbound.InvalidInputError
        An argument that is not a positive integer.

    Examples
    --------
    >>> from otbound.block import static_branchings
    >>> static_branchings(3, 2, 2)
    [((1,), 1), ((1, 1), 2), ((1, 2), 3), ((2,), 2)]
    """
    top, deep, wide = (check_positive_int(x, n) for x, n in ((max_nodes, "max_nodes"), (max_depth, "max_depth"),
                                                              (max_width, "max_width")))
    out = []

    def rec(prefix, width_product, nodes):
        if prefix:
            out.append((tuple(prefix), nodes))
        if len(prefix) == deep:
            return
        for b in range(1, wide + 1):
            level = width_product * b
            if nodes + level > top:
                break
            rec(prefix + [b], level, nodes + level)

    rec([], 1, 0)
    return out


def node_budget_comparison(target, draft, budgets, *, max_depth: int, vocab_size: int | None = None,
                           sampled_max_block_len: int | None = None, sampled_max_drafts: int = 8,
                           max_branchings: int = 20_000) -> NodeBudgetComparison:
    """The oracle tree, the draft's best static top-k tree and the best sampled scheme at each budget.

    Parameters
    ----------
    target, draft : BlockModel or callable
        The models (prefix → next-token law).
    budgets : sequence of int
        Node budgets B.
    max_depth : int
        Deepest node of every tree (and longest block).
    vocab_size : int, optional
        Needed when the models are plain callables.
    sampled_max_block_len : int, optional
        Longest block L of the sampled schemes (default ``max_depth``; U_causal enumerates ``V^L``
        blocks, so keep ``V^L`` small).
    sampled_max_drafts : int
        Largest K of the sampled schemes.
    max_branchings : int
        Refuse budgets whose static branchings number more than this (they are enumerated).

    Returns
    -------
    NodeBudgetComparison

    Raises
    ------
    otbound.InvalidInputError
        Bad budgets or depths, or too many branchings to enumerate.

    References
    ----------
    Pankratov & Alistarh, arXiv 2512.11718 (the oracle and its growth); Weng et al. 2505.12398
    (traversal, attaining the static bound).

    Examples
    --------
    >>> from otbound.block import dirichlet_model, node_budget_comparison
    >>> p, q = dirichlet_model(3, seed=0), dirichlet_model(3, seed=1)
    >>> c = node_budget_comparison(p, q, [2, 4], max_depth=2)
    >>> bool((c.static <= c.oracle + 1e-12).all()), c.sampled_shape
    (True, [(1, 2), (2, 2)])
    """
    try:
        b_list = sorted({check_positive_int(b, "budget") for b in budgets})
    except TypeError:
        raise InvalidInputError(f"budgets must be a sequence of positive integers, got {budgets!r}") from None
    if not b_list:
        raise InvalidInputError("give at least one budget")
    depth = check_positive_int(max_depth, "max_depth")
    v = vocab_size or getattr(target, "vocab_size", None)
    if v is None:
        raise InvalidInputError("pass the target as a BlockModel or give vocab_size")
    target, draft = as_block_model(target, int(v), "target"), as_block_model(draft, int(v), "draft")
    top = b_list[-1]
    oracle = oracle_tree_bound(target, top, max_depth=depth)
    curve = np.concatenate([oracle.curve, np.full(max(0, top - oracle.curve.size), oracle.value)])
    shapes = static_branchings(top, depth, int(v))
    if len(shapes) > max_branchings:
        raise InvalidInputError(f"{len(shapes)} static branchings fit budget {top} at depth {depth} "
                                f"(max_branchings = {max_branchings}): lower the budget or the depth")
    static_values = []
    for br, nodes in shapes:
        try:
            static_values.append((static_tree_bound(target, draft, br).value, nodes, br))
        except InvalidInputError as exc:  # the draft has fewer tokens of positive probability than the branching
            if "the static tree needs" not in str(exc):
                raise
            continue
    lmax = depth if sampled_max_block_len is None else check_positive_int(sampled_max_block_len,
                                                                          "sampled_max_block_len")
    kmax = check_positive_int(sampled_max_drafts, "sampled_max_drafts")
    sampled_values = {}
    for k in range(1, kmax + 1):
        for length in range(1, min(lmax, depth) + 1):
            if k * length <= top:
                sampled_values[(k, length)] = block_bound(target, draft, vocab_size=int(v), num_drafts=k,
                                                          block_len=length, kind="causal").value
    st, st_b, sa, sa_s = [], [], [], []
    for b in b_list:
        fit_st = [(val, br) for val, nodes, br in static_values if nodes <= b]
        best = max(fit_st, key=lambda t: t[0], default=(np.nan, None))
        st.append(best[0])
        st_b.append(best[1])
        fit_sa = [(val, s) for s, val in sampled_values.items() if s[0] * s[1] <= b]
        best = max(fit_sa, key=lambda t: t[0], default=(np.nan, None))
        sa.append(best[0])
        sa_s.append(best[1])
    budgets_arr = np.array(b_list, dtype=np.int64)
    oracle_vals = curve[budgets_arr - 1]
    fit = fit_log_growth(budgets_arr, oracle_vals) if len(b_list) >= 2 else None
    return NodeBudgetComparison(budgets_arr, oracle_vals, np.array(st, dtype=np.float64), st_b,
                                np.array(sa, dtype=np.float64), sa_s, fit)
