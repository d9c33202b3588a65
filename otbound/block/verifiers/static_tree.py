"""Traversal verification of a static top-k draft tree (deterministic drafting at block level):
lossless and optimal, E[τ] = U_static = Σ_{w ∈ T} p(w). The tree, the rule and the proof:
:mod:`otbound.block._static_tree`.
"""

from __future__ import annotations

import numpy as np

from otbound._validation import InvalidInputError, check_positive_int
from otbound.block._static_tree import _children, check_branching, static_tree_bound, static_tree_paths
from otbound.block.verifiers._base import BlockVerifier, DraftLawBounds


class StaticTreeTraversal(BlockVerifier):
    """Traversal verification of a static top-k tree (module docstring): lossless, attains
    U_static. ``branching`` ``(b_1..b_L)``; default ``None``: ``b_ℓ = num_drafts`` at every depth
    (the registered ``"static_tree"``), so a tree has ``num_drafts^L`` paths.

    Examples
    --------
    >>> from otbound import BLOCK_VERIFIERS
    >>> from otbound.block.models import context_free_model
    >>> p, q = context_free_model([0.5, 0.3, 0.2]), context_free_model([0.1, 0.6, 0.3])
    >>> v = BLOCK_VERIFIERS["static_tree"]
    >>> round(v.acceptance(p, q, vocab_size=3, num_drafts=2, block_len=2), 12)   # (0.3+0.2)(1+0.5)
    0.75
    """

    name = "static_tree"
    reference = "static top-k tree (EAGLE/Medusa), traversal with one-hot draft laws"
    sampling = "static_tree"
    lossless = True

    def __init__(self, branching=None):
        self.branching = None if branching is None else check_branching(branching)

    def _branching(self, num_drafts: int, block_len: int) -> tuple:
        if self.branching is None:
            return (check_positive_int(num_drafts, "num_drafts"),) * block_len
        return check_branching(self.branching, block_len)

    # -- drafting scheme ------------------------------------------------------------------------
    def draft_tuple_law(self, draft, num_drafts: int, block_len: int):
        paths = static_tree_paths(draft, self._branching(num_drafts, block_len))
        yield 1.0, tuple(tuple(row) for row in paths.tolist())

    def draw_drafts(self, draft, num: int, num_drafts: int, block_len: int, rng) -> np.ndarray:
        paths = static_tree_paths(draft, self._branching(num_drafts, block_len))
        return np.broadcast_to(paths, (int(num),) + paths.shape).copy()

    def num_rows(self, num_drafts: int, block_len: int) -> int:
        return int(np.prod(self._branching(num_drafts, block_len)))

    def node_drafts(self, law, num_rows: int, num_drafts: int, rng) -> np.ndarray:
        """The node's children (top-``b`` of ``law``), each over its ``num_rows / b`` consecutive rows;
        the depth is read from ``num_rows`` (the rows through a node of depth d: ``b_{d+1}⋯b_L``)."""
        b = self.branching
        if b is None:
            bd = int(num_drafts)
        else:
            sizes = [int(np.prod(b[d:])) for d in range(len(b))]
            if num_rows not in sizes:
                raise InvalidInputError(f"{num_rows} rows through a node do not fit the branching {b}")
            bd = b[sizes.index(num_rows)]
        return np.repeat(_children(np.asarray(law), bd, "a drafted node"), num_rows // bd)

    def own_law_bounds(self, target, draft, *, vocab_size, num_drafts, block_len) -> DraftLawBounds:
        """U_causal = U_joint = U_static for the one (deterministic) tree."""
        value = static_tree_bound(target, draft, self._branching(num_drafts, block_len), vocab_size=vocab_size).value
        return DraftLawBounds(value, value)

    # -- verification ---------------------------------------------------------------------------
    def prepare(self, target, draft, drafts, cache):
        children: dict = {}
        for row in drafts:
            for d in range(len(row)):
                kids = children.setdefault(tuple(row[:d]), [])
                if row[d] not in kids:
                    kids.append(row[d])
        length = len(drafts[0])
        plan = {}
        for node, kids in children.items():
            p = np.asarray(target(node), dtype=np.float64)
            kids_a = np.asarray(kids, dtype=np.int64)
            rest = np.ones(p.size, dtype=bool)
            rest[kids_a] = False
            tail = float(p[rest].sum())
            remaining = tail + np.cumsum(p[kids_a][::-1])[::-1]
            with np.errstate(divide="ignore", invalid="ignore"):
                accept = np.where(remaining > 0, p[kids_a] / np.where(remaining > 0, remaining, 1.0), 1.0)
            corr = np.where(rest, p, 0.0)
            corr = corr / tail if tail > 0 else p
            plan[node] = (kids, np.minimum(accept, 1.0), corr)
        return plan, length, target

    def walk(self, inst, coin, draw):
        plan, length, target = inst
        node = ()
        while len(node) < length:
            kids, accept, corr = plan[node]
            for c, a in zip(kids, accept):
                if coin(float(a)):
                    node = node + (c,)
                    break
            else:
                return node, corr
        return node, np.asarray(target(node), dtype=np.float64)
