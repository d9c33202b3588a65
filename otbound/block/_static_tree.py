"""Static top-k draft trees (EAGLE / Medusa / SGLang): deterministic drafting at block level.

The tree with branching ``b = (b_1, …, b_L)`` has, under every node ``u`` of depth ``d < L``, the
``b_{d+1}`` most probable draft tokens of ``q(·|u)`` as children (ties to the lower token id): a
fixed set ``T`` of ``b_1 + b_1 b_2 + … + b_1⋯b_L`` nodes, no randomness. A tree is passed as its
``b_1⋯b_L`` root-to-leaf paths, row ``i`` taking at depth ``d`` child number
``(i // (b_{d+2}⋯b_L)) mod b_{d+1}`` (children in draft-rank order).

**Bound** (derived): a lossless single-iteration verifier accepts a path of ``T`` and emits the
next token from the target, so node ``w`` is accepted with probability at most ``p(w)`` (the target
law of the prefix), and

    U_static(T) = Σ_{w ∈ T} p(w),   P(τ ≥ ℓ) ≤ Σ_{w ∈ T, |w| = ℓ} p(w)

— the target mass the tree covers. Traversal of the tree with one-hot draft laws attains it
(``BLOCK_VERIFIERS["static_tree"]``, :mod:`otbound.block.verifiers.static_tree`): at node ``u``
the children ``c_1..c_b`` are tested in rank order,
``c_j`` accepted with probability ``p(c_j|u) / p(V ∖ {c_1..c_{j−1}} | u)`` (the one-hot-q rule of
token-level deterministic drafting, recursively; Weng et al. 2505.12398's traversal with
``M_s = δ``), and if all reject the correction is drawn from ``p(·|u)`` without the children. The
emitted token at every step is then a draw of the target given the accepted prefix (lossless), and
the walk passes node ``w`` exactly when the target's own draw follows ``w`` (``P = p(w)``: the
bound). Checked against an independent LP (:func:`otbound.block._lp.solve_static_tree_lp`: select
a path of the tree, then verify it, every selection law allowed) on small trees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from otbound._validation import InvalidInputError, check_positive_int
from otbound.block.models import as_block_model
from otbound.token.draft_laws import top_tokens


def check_branching(branching, block_len: int | None = None) -> tuple:
    """``branching`` as a tuple of positive ints (length ``block_len`` if given)."""
    try:
        b = tuple(check_positive_int(x, "branching entry") for x in branching)
    except TypeError:
        raise InvalidInputError(f"branching must be a sequence of positive integers, got {branching!r}") from None
    if not b:
        raise InvalidInputError("branching must have at least one level")
    if block_len is not None and len(b) != block_len:
        raise InvalidInputError(f"branching {b} has {len(b)} levels, expected block_len = {block_len}")
    return b


#: largest static tree (nodes, the root excluded) built: each node costs a call of each model and
#: a row of the path table (a 20-level binary tree has 2,097,150 nodes: minutes and gigabytes)
MAX_STATIC_TREE_NODES = 200_000


def check_static_tree_size(branching) -> int:
    """The node count ``b_1 + b_1 b_2 + … + b_1⋯b_L`` of the tree, refused above
    :data:`MAX_STATIC_TREE_NODES` before anything is built.

    Examples
    --------
    >>> check_static_tree_size((2, 1))
    4
    >>> try:
    ...     check_static_tree_size((2,) * 20)
    ... except InvalidInputError as err:
    ...     print(str(err)[:58])
    branching (2, 2, 2, ...) of 20 levels: the static tree has
    """
    nodes, width = 0, 1
    for bd in branching:
        width *= int(bd)
        nodes += width
    if nodes > MAX_STATIC_TREE_NODES:
        shown = ", ".join(str(x) for x in branching[:3]) + (", ..." if len(branching) > 3 else "")
        raise InvalidInputError(
            f"branching ({shown}) of {len(branching)} levels: the static tree has {nodes} nodes, above the limit "
            f"of {MAX_STATIC_TREE_NODES} (each costs a call of each model and a row of the path table); "
            "use fewer levels or a smaller branching")
    return nodes


def _children(law: np.ndarray, b: int, where) -> np.ndarray:
    support = int(np.count_nonzero(law > 0))
    if b > support:
        raise InvalidInputError(
            f"the static tree needs {b} children at {where} but the draft law has only {support} tokens with q > 0 "
            "(a truncated draft law leaves fewer survivors than the branching): lower the branching"
        )
    return top_tokens(law, b)


def static_tree_paths(draft, branching, vocab_size: int | None = None) -> np.ndarray:
    """The root-to-leaf paths ``(b_1⋯b_L, L)`` of the static top-k tree of ``draft``.

    Examples
    --------
    >>> from otbound.block.models import context_free_model
    >>> static_tree_paths(context_free_model([0.1, 0.6, 0.3]), (2, 1)).tolist()
    [[1, 1], [2, 1]]
    """
    b = check_branching(branching)
    check_static_tree_size(b)
    draft = as_block_model(draft, vocab_size or draft.vocab_size, "draft")
    paths = np.zeros((1, 0), dtype=np.int64)
    for bd in b:
        kids = [_children(draft(tuple(row)), bd, f"prefix {tuple(row.tolist())}") for row in paths]
        paths = np.concatenate(
            [np.repeat(paths, bd, axis=0), np.concatenate(kids)[:, None]], axis=1
        )
    return paths


@dataclass
class StaticTreeBound:
    """U_static = Σ_{w ∈ T} p(w) (``value``) with ``levels[ℓ−1] = Σ_{|w| = ℓ} p(w)`` = P(τ ≥ ℓ)
    under the optimum, and the tree's paths.

    Returned by :func:`otbound.block.static_tree_bound`; p(w) is the target's probability of the
    node w's prefix, T the static top-k tree of the draft model (module docstring).

    Attributes
    ----------
    value : float
        U_static, the bound on E[τ] (bonus excluded).
    levels : numpy.ndarray
        float64 (L,), ``Σ_{|w| = ℓ} p(w)`` per depth ℓ.
    branching : tuple of int
        ``(b_1, …, b_L)``.
    paths : numpy.ndarray
        int64 ``(b_1⋯b_L, L)``, the root-to-leaf paths (:func:`otbound.block.static_tree_paths`).

    References
    ----------
    Weng et al., "Traversal verification for speculative tree decoding", arXiv 2505.12398 (the
    traversal that attains it, with one-hot draft laws); the bound is derived in the module
    docstring.

    Examples
    --------
    >>> from otbound.block import context_free_model, static_tree_bound
    >>> p, q = context_free_model([0.5, 0.3, 0.2]), context_free_model([0.1, 0.6, 0.3])
    >>> b = static_tree_bound(p, q, (2, 1))
    >>> round(b.value, 12), b.branching, b.paths.tolist()
    (0.65, (2, 1), [[1, 1], [2, 1]])
    >>> bool(abs(b.value - b.levels.sum()) < 1e-15)
    True
    """

    value: float
    levels: np.ndarray
    branching: tuple
    paths: np.ndarray


def static_tree_bound(target, draft, branching, *, vocab_size: int | None = None) -> StaticTreeBound:
    """The exact bound of the static top-k tree: the target mass it covers, Σ_{w ∈ T} p(w).

    Parameters
    ----------
    target, draft : BlockModel or callable
        The models (prefix → next-token law).
    branching : sequence of int
        ``(b_1, …, b_L)``: children per node at each depth, by draft rank.
    vocab_size : int, optional
        Needed when the models are plain callables.

    Returns
    -------
    StaticTreeBound

    Raises
    ------
    InvalidInputError
        A node whose draft law has fewer tokens of positive probability than its branching; a tree
        of more than :data:`MAX_STATIC_TREE_NODES` nodes (refused before any model call).

    Examples
    --------
    >>> from otbound.block.models import context_free_model
    >>> p, q = context_free_model([0.5, 0.3, 0.2]), context_free_model([0.1, 0.6, 0.3])
    >>> b = static_tree_bound(p, q, (2, 1))   # nodes 1, 2, then 11, 21: 0.3 + 0.2 + 0.09 + 0.06
    >>> round(b.value, 12), b.levels.round(12).tolist()
    (0.65, [0.5, 0.15])
    """
    b = check_branching(branching)
    check_static_tree_size(b)
    v = vocab_size or getattr(target, "vocab_size", None)
    if v is None:
        raise InvalidInputError("pass the target as a BlockModel or give vocab_size")
    target, draft = as_block_model(target, v, "target"), as_block_model(draft, v, "draft")
    paths = static_tree_paths(draft, b)
    levels = np.zeros(len(b))
    for d in range(1, len(b) + 1):
        for node in {tuple(row[:d]) for row in paths.tolist()}:
            levels[d - 1] += _path_probability(target, node)
    return StaticTreeBound(float(levels.sum()), levels, b, paths)


def _path_probability(target, node) -> float:
    prob = 1.0
    for i, tok in enumerate(node):
        prob *= float(target(node[:i])[tok])
    return prob
