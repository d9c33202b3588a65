"""User-described drafting schemes for :func:`~otbound.conformance.check_block_verifier` (implementation).

A block verifier is bounded by the law of the draft trees it is run with: U_causal / U_joint
(docs/theory/block-bounds.md) are maxima over couplings of *that* law with the target. K i.i.d. blocks are the
kit's default; an engine that drafts otherwise (EAGLE's static top-k tree, a beam, a sampled tree)
describes its scheme by two functions — its exact law, for exact mode and for the bounds, and a
draw, for sample mode — and passes ``drafting=DraftingScheme(...)``. The bounds are the causal LP
and the block OT over the enumerated tuples (:func:`otbound.block.law_bounds.tuple_law_bounds`),
the LPs that bound UniVer by its own tree law.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from otbound import InvalidInputError
from otbound._validation import LAW_ATOL


@dataclass(frozen=True)
class DraftingScheme:
    """A drafting scheme given by its exact law and (optionally) a sampler.

    Parameters
    ----------
    name : str
        Shown in reports as the draft law.
    law : callable
        ``law(draft, num_drafts, block_len) -> iterable of (prob, rows)``: every draft tree of
        positive probability, each as its ``rows`` — the root-to-leaf paths, a sequence of
        ``R`` tuples of ``block_len`` token ids (the same ``R`` for every tree; ``num_drafts`` is
        the scheme's own parameter, e.g. the branching) — with its probability; probabilities sum
        to 1. ``draft`` is the draft model (``prefix tuple -> law (V,)``).
    draw : callable, optional
        ``draw(draft, num, num_drafts, block_len, rng) -> int array (num, R, block_len)``: ``num``
        trees drawn as the engine draws them (sample mode). Default: draws from ``law``.

    Examples
    --------
    A deterministic top-2 tree over two tokens is the whole tree (children in decreasing draft
    probability), drafted with probability 1:

    >>> import otbound.conformance as oc
    >>> tree = oc.top_k_tree(2)
    >>> inst = oc.block_instances(2, 2, 1, 0)[0]
    >>> [(p, rows) for p, rows in tree.law(inst.models()[1], 2, 2)]
    [(1.0, ((0, 1), (0, 0), (1, 1), (1, 0)))]
    """

    name: str
    law: object
    draw: object = None

    # -- the protocol check_block_verifier reads (as for a BlockVerifier's own drafting) ------------
    @property
    def sampling(self) -> str:
        """The scheme's name, read as the draft law's name (``sampling``) in reports."""
        return self.name

    def draft_tuple_law(self, draft, num_drafts: int, block_len: int) -> list:
        """The scheme's law, checked: ``[(prob, rows)]`` with rows a tuple of ``R`` paths of length L."""
        v = int(draft.vocab_size)
        out, width = [], None
        for i, item in enumerate(self.law(draft, num_drafts, block_len)):
            try:
                prob, rows = item
                prob = float(prob)
                rows = tuple(tuple(int(t) for t in row) for row in rows)
            except (TypeError, ValueError):
                raise InvalidInputError(
                    f"drafting {self.name!r}: law item {i} must be (probability, rows of token ids)"
                ) from None
            if not (np.isfinite(prob) and prob >= 0):
                raise InvalidInputError(f"drafting {self.name!r}: tree {i} has probability {prob!r}")
            if not rows or any(len(r) != block_len for r in rows):
                raise InvalidInputError(
                    f"drafting {self.name!r}: tree {i} needs rows of {block_len} tokens, got {rows}"
                )
            if any(not 0 <= t < v for r in rows for t in r):
                raise InvalidInputError(f"drafting {self.name!r}: tree {i} has a token outside 0..{v - 1}")
            if width is None:
                width = len(rows)
            elif len(rows) != width:
                raise InvalidInputError(
                    f"drafting {self.name!r}: every tree needs the same number of rows ({width}), tree {i} has "
                    f"{len(rows)}"
                )
            if prob > 0:
                out.append((prob, rows))
        total = sum(p for p, _ in out)
        if not out or abs(total - 1.0) > LAW_ATOL:
            raise InvalidInputError(f"drafting {self.name!r}: tree probabilities sum to {total:.9g}, not 1")
        return [(p / total, rows) for p, rows in out]

    def draw_drafts(self, draft, num: int, num_drafts: int, block_len: int, rng) -> np.ndarray:
        """``num`` trees ``(num, R, L)``: the user's ``draw``, or draws from the exact law."""
        if self.draw is not None:
            out = np.asarray(self.draw(draft, num, num_drafts, block_len, rng))
            if out.ndim != 3 or out.shape[0] != num or out.shape[2] != block_len:
                raise InvalidInputError(
                    f"drafting {self.name!r}: draw must return an int array (num, R, {block_len}), got {out.shape}"
                )
            return out.astype(np.int64)
        law = self.draft_tuple_law(draft, num_drafts, block_len)
        trees = np.array([rows for _, rows in law], dtype=np.int64)
        pick = rng.choice(len(law), size=num, p=np.array([p for p, _ in law]))
        return trees[pick]

    def own_law_bounds(self, target, draft, *, vocab_size, num_drafts, block_len):
        """U_causal and U_joint of this law (:func:`otbound.block.law_bounds.tuple_law_bounds`)."""
        from otbound.block.law_bounds import tuple_law_bounds

        law = self.draft_tuple_law(draft, num_drafts, block_len)
        return tuple_law_bounds(target, draft, law, vocab_size=vocab_size, block_len=block_len)


def as_drafting(drafting):
    """``drafting=`` as given: None, an object with the drafting protocol (a
    :class:`DraftingScheme`, a BlockVerifier with its own scheme), or a pair ``(draw, law)``
    (made a :class:`DraftingScheme` named ``"user drafting"``); anything else is an
    :class:`~otbound.InvalidInputError`.

    Examples
    --------
    >>> import otbound.conformance as oc
    >>> oc.as_drafting(oc.top_k_tree(2)).name
    'top_2_tree'
    >>> oc.as_drafting((lambda *a: None, lambda *a: None)).name
    'user drafting'
    >>> oc.as_drafting("top-k")
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: drafting must be None, a DraftingScheme(name, law, draw), ... got str
    """
    if drafting is None or hasattr(drafting, "draft_tuple_law"):
        return drafting
    if isinstance(drafting, tuple) and len(drafting) == 2 and all(callable(f) for f in drafting):
        return DraftingScheme("user drafting", law=drafting[1], draw=drafting[0])
    raise InvalidInputError(
        "drafting must be None, a DraftingScheme(name, law, draw), a block verifier with its own drafting, "
        f"or a pair (draw, law) of functions; got {type(drafting).__name__}"
    )


def top_k_tree(k: int) -> DraftingScheme:
    """The deterministic top-``k`` tree (EAGLE's static tree): every node expands the ``k`` tokens of
    largest draft probability at its prefix (ties to the smaller id; zero-probability tokens are not
    expanded, a node with fewer than ``k`` is refused), ``k^L`` rows, drafted with probability 1.

    Parameters
    ----------
    k : int
        The branching.

    Returns
    -------
    DraftingScheme
        Named ``"top_{k}_tree"``; its ``num_drafts`` must equal ``k``.

    Examples
    --------
    >>> import otbound.conformance as oc
    >>> oc.top_k_tree(2).name
    'top_2_tree'
    """
    from otbound._validation import check_positive_int

    k = check_positive_int(k, "k")

    def law(draft, num_drafts, block_len):
        if num_drafts != k:
            raise InvalidInputError(f"top_{k}_tree drafts with num_drafts = {k} (its branching), got {num_drafts}")
        rows = [()]
        for _ in range(block_len):
            nxt = []
            for pre in rows:
                q = np.asarray(draft(pre), dtype=np.float64)
                order = np.lexsort((np.arange(q.size), -q))[:k]
                if np.count_nonzero(q[order] > 0) < k:
                    raise InvalidInputError(
                        f"top_{k}_tree: the draft has fewer than {k} tokens of positive probability at prefix {pre}"
                    )
                nxt.extend(pre + (int(t),) for t in order)
            rows = nxt
        return [(1.0, tuple(rows))]

    return DraftingScheme(f"top_{k}_tree", law=law)
