"""The complete draft trie of depth L with both models' laws at every node (implementation).

Nodes are all prefixes ``u`` of length ``0..L`` in breadth-first order; the node of a prefix of
depth ``d`` is ``offsets[d] + Σ_t u_t V^{d−1−t}`` (base-V digits, first token most significant),
so children, parents and level slices are arithmetic. Per node:

* ``p_cond[i]`` — target law ``p(·|u)`` (depths 0..L; depth L gives the bonus token's law);
* ``q_cond[i]`` — draft law ``q(·|u)`` (depths 0..L−1; zero rows at depth L);
* ``p_path[i]``, ``q_path[i]`` — joint probabilities ``p(u)``, ``q(u)`` of the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from otbound._validation import InvalidInputError
from otbound.block.models import BlockModel

# largest trie the dense per-node arrays are built for: nodes × V floats per array
MAX_TREE_CELLS = 16_000_000


@dataclass
class BlockTree:
    vocab_size: int
    block_len: int
    offsets: np.ndarray
    depth: np.ndarray
    parent: np.ndarray
    token: np.ndarray
    p_cond: np.ndarray = field(repr=False)
    q_cond: np.ndarray = field(repr=False)
    p_path: np.ndarray = field(repr=False)
    q_path: np.ndarray = field(repr=False)

    @property
    def num_nodes(self) -> int:
        return int(self.offsets[-1])

    def level(self, d: int) -> slice:
        return slice(int(self.offsets[d]), int(self.offsets[d + 1]))

    def prefix(self, i: int) -> tuple:
        d = int(self.depth[i])
        j = int(i - self.offsets[d])
        out = []
        for _ in range(d):
            j, t = divmod(j, self.vocab_size)
            out.append(t)
        return tuple(reversed(out))

    def edge_prob(self) -> np.ndarray:
        """``p(u_last | parent(u))`` for every node (1 at the root)."""
        out = np.ones(self.num_nodes)
        nz = self.parent >= 0
        out[nz] = self.p_cond[self.parent[nz], self.token[nz]]
        return out

    def leaf_prefixes(self) -> np.ndarray:
        """All ``V^L`` blocks in node order, shape ``(V^L, L)``."""
        return np.stack(
            np.unravel_index(np.arange(self.vocab_size**self.block_len), (self.vocab_size,) * self.block_len), axis=1
        )


def build_tree(target: BlockModel, draft: BlockModel, block_len: int, *, with_bonus: bool = True) -> BlockTree:
    """Query both models at every prefix of length ``0..L`` (target) / ``0..L−1`` (draft).

    ``with_bonus=False`` skips the target at depth L (the bonus-token laws, zero rows): the trie LP
    and the per-level bound never read them.
    """
    v, length = int(target.vocab_size), int(block_len)
    n = sum(v**d for d in range(length + 1))  # Python ints: the estimate itself never overflows
    if n * v > MAX_TREE_CELLS:
        raise InvalidInputError(
            f"the complete draft trie has {n} nodes (V = {v}, L = {length}), {n * v} cells per law table "
            f"(limit otbound.block._tree.MAX_TREE_CELLS = {MAX_TREE_CELLS}, about {16 * MAX_TREE_CELLS / 1e9:.1f} GB; "
            "raise it to go further): too large to enumerate; use block_bound_bracket (top-m truncation) instead"
        )
    sizes = v ** np.arange(length + 1, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    depth = np.repeat(np.arange(length + 1), sizes)
    local = np.arange(n) - offsets[depth]
    parent = np.where(depth > 0, offsets[np.maximum(depth - 1, 0)] + local // v, -1)
    token = np.where(depth > 0, local % v, -1)
    tree = BlockTree(
        v, length, offsets, depth, parent, token, np.zeros((n, v)), np.zeros((n, v)), np.ones(n), np.ones(n)
    )
    for i in range(n):
        pre = tree.prefix(i)
        if depth[i] < length:
            tree.p_cond[i] = target(pre)
            tree.q_cond[i] = draft(pre)
        elif with_bonus:
            tree.p_cond[i] = target(pre)
    for d in range(1, length + 1):
        sl, up = tree.level(d), tree.level(d - 1)
        tree.p_path[sl] = (tree.p_path[up][:, None] * tree.p_cond[up]).ravel()
        tree.q_path[sl] = (tree.q_path[up][:, None] * tree.q_cond[up]).ravel()
    return tree
