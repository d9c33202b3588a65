"""Decoding a planned tree shape end to end: a token-level verifier at every node of a uniform tree.

:func:`otbound.lm.speculative_sample` drafts ``num_rows`` root-to-leaf rows depth by depth and asks a
block verifier with a drafting scheme of its own (``sampling`` equal to the verifier's) for the next
tokens of the rows through each node (``node_drafts``). :class:`TreeShapeVerifier` is such a verifier
for a planned shape ``b = (b_1, ..., b_L)``: ``Π_d b_d`` rows; at a node of depth ``d − 1`` it draws
``b_d`` drafts of its token verifier's law from the node's draft law (distinct tokens: the laws
without replacement), gives each to a block of consecutive rows, and verifies there with those
``b_d`` drafts (the distinct tokens of the node's rows, in row order). It is
:class:`otbound.block.verifiers.MultiPathVerifier` on the planned tree, lossless when its token
verifier is (the same induction over the depth).

The rows through a node name its depth (``Π_{j ≥ d} b_j`` rows at depth ``d − 1``), so the shape
must branch (``b_d ≥ 2``) down to some depth and be a chain (``b_d = 1``) below it; a searched tree
that branches again below a chain (``2-1-2-1-1``) is refused. With i.i.d. drafts two siblings can coincide and the
decoder's prefix-keyed tree merges them (the rows through the merged node no longer name a depth):
trees of the i.i.d. law are refused, and its chains are decoded by the decoder's own rows.
"""

from __future__ import annotations

import numpy as np

from otbound._validation import InvalidInputError
from otbound.block.verifiers.multipath import MultiPathVerifier
from otbound.token.draft_laws import DRAFT_LAWS, sample_drafts
from otbound.token.verifiers import VERIFIERS


def _in_row_order(row: np.ndarray) -> np.ndarray:
    """The distinct tokens of ``row`` in order of first appearance."""
    _, first = np.unique(row, return_index=True)
    return row[np.sort(first)]


class TreeShapeVerifier(MultiPathVerifier):
    """A token-level verifier on the uniform tree of per-depth branching ``branching``, drafted by
    :func:`otbound.lm.speculative_sample` (module docstring).

    Parameters
    ----------
    token_verifier : str
        A lossless verifier of :data:`otbound.VERIFIERS` whose draft law gives distinct tokens
        (:attr:`otbound.token.DraftLaw.distinct`: ``rrs_wor``, ``greedy``, ``spechub``, ``onehot``, ...).
    branching : sequence of int
        ``(b_1, ..., b_L)``: ``b_d ≥ 2`` down to some depth, 1 below it.

    Raises
    ------
    otbound.InvalidInputError
        An unknown verifier, an i.i.d. draft law, or a branching of another form.

    Examples
    --------
    >>> from otbound.block.verifiers import TreeShapeVerifier
    >>> from otbound.lm import speculative_sample, tiny_pair
    >>> v = TreeShapeVerifier("rrs_wor", (2, 2, 1))
    >>> v.num_rows(2, 3), v.name, v.sampling
    (4, 'tree_2-2-1_rrs_wor', 'without_replacement')
    >>> run = speculative_sample(tiny_pair(), [1, 2, 3], verifier=v, num_drafts=2, block_len=3, max_new_tokens=6,
    ...                          seed=0)
    >>> len(run.tokens), all(it.num_accepted <= 3 for it in run.iterations)
    (6, True)
    """

    def __init__(self, token_verifier: str, branching):
        if token_verifier not in VERIFIERS:
            raise InvalidInputError(f"unknown verifier {token_verifier!r}; expected one of {sorted(VERIFIERS)}")
        law = VERIFIERS[token_verifier].sampling
        if not DRAFT_LAWS[law].distinct:
            raise InvalidInputError(
                f"{token_verifier} drafts with the {law} law: coinciding siblings would merge in the decoder's tree, "
                f"so a planned tree of this law cannot be decoded as drawn (laws with distinct drafts: "
                f"{tuple(name for name, one in DRAFT_LAWS.items() if one.distinct)})")
        b = [int(x) for x in branching]
        if not b or min(b) < 1:
            raise InvalidInputError(f"branching must be ≥ 1 at every depth, got {b}")
        ones = [x == 1 for x in b]
        if any(ones) and not all(ones[ones.index(True):]):
            raise InvalidInputError(f"branching {b}: a chain (b = 1) must not branch again below it")
        super().__init__(token_verifier)
        self.branching = tuple(b)
        self.sampling = law
        self.name = f"tree_{'-'.join(map(str, b))}_{token_verifier}"
        self.reference = f"token-level {token_verifier} at every node of the uniform tree {b}"
        self._rows_to_branching = {int(np.prod(b[d:])): b[d] for d in range(len(b)) if b[d] > 1}

    def num_rows(self, num_drafts: int, block_len: int) -> int:
        """``Π_d b_d`` rows (``num_drafts`` is unused; ``block_len`` must be the shape's depth)."""
        if int(block_len) != len(self.branching):
            raise InvalidInputError(f"{self.name} has depth {len(self.branching)}, got block_len {block_len}")
        return int(np.prod(self.branching))

    def node_drafts(self, law: np.ndarray, num_rows: int, num_drafts: int, rng) -> np.ndarray:
        """``b`` drafts of the verifier's law at a node with ``num_rows`` rows through it, each given
        to ``num_rows / b`` consecutive rows."""
        b = self._rows_to_branching.get(int(num_rows), 1)
        return np.repeat(sample_drafts(law, b, self.sampling, 1, rng)[0], int(num_rows) // b)

    def _law(self, inst, node: tuple, row: np.ndarray) -> np.ndarray:
        return super()._law(inst, node, _in_row_order(row))

    def _node_drafts(self, row: np.ndarray) -> np.ndarray:
        return _in_row_order(row)
