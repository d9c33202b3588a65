"""Top-m truncation of the draft tree for certified block-bound brackets (derived; implementation).

At every kept prefix ``f`` the ``m`` tokens with the largest ``p(·|f) + q(·|f)`` are kept (ties by
token id) and the others merged into one cell ⊥. The *merged models* live on ``m + 1`` symbols: at a
kept prefix, ``p̃ = (p(kept), p(rest))`` and ``q̃ = (q(kept), q(rest))``; after ⊥ both models put
all mass on ⊥ (the merged sequence is cut at the first ⊥ and padded).

**Upper side.** Let ``φ`` map a block to its merged block; ``φ(x)_{1:ℓ}`` depends on ``x_{1:ℓ}``
only and is injective on prefixes without ⊥. (i) Joint / per-level: if ``x`` and ``y`` agree on
``ℓ`` tokens so do ``φ(x)`` and ``φ(y)``, so the image of any coupling has at least the same value
under the merged laws ``φ#p`` and ``(φ#q)^{⊗K}``. (ii) Causal: run any lossless verifier of the
original models on drafts resampled from the conditional law given their merged images and map its
output by ``φ``; the accepted prefix stays a prefix of a merged draft, and the output continued by
``p̃`` is ``φ`` of the output continued by ``p``, hence ``p̃``-distributed (given ``φ(Y_{1:N})``, the
future is deterministic after ⊥ and otherwise ``Y_{1:N}`` is recovered exactly). So every bound of
the merged models is ≥ the original one.

**Lower side.** Forbid accepting / matching any merged prefix through ⊥ (per-level: the ⊥ cells of
``p̃`` and ``q̃`` are put on different symbols; joint / causal: those trie nodes are not
selectable). Such a plan lifts to the original models: non-⊥ merged tokens are the original tokens,
and an emitted ⊥ (a correction) is replaced by a token drawn from ``p(·|prefix)`` restricted to the
cell. Losslessness and the value carry over, so the restricted merged value is attained.

Only kept prefixes are evaluated (``Σ_{d<L} m^d`` calls per model). :func:`merged_tree` builds the
trie from merged models given directly (a real draft tree stored as its kept tokens' probabilities
and the rest mass per node, :mod:`otbound.lm`): the argument above holds for any rule choosing the
kept tokens of a prefix from that prefix alone (top-m by ``p + q`` here, top-m by draft rank there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from otbound.block._tree import BlockTree, build_tree
from otbound.block.models import BlockModel


@dataclass
class TruncatedTree:
    tree: BlockTree  # trie of the merged models (vocabulary m + 1, ⊥ = m)
    selectable: np.ndarray  # nodes whose prefix avoids ⊥
    nodes_evaluated: int


def truncated_tree(target: BlockModel, draft: BlockModel, block_len: int, top_m: int) -> TruncatedTree:
    m = min(int(top_m), target.vocab_size)
    kept: dict = {}  # fine prefix -> kept tokens (by rank)
    fine_of: dict = {(): ()}  # merged prefix without ⊥ -> fine prefix

    def fine(c):
        f = fine_of.get(c)
        if f is None:
            parent = fine(c[:-1])
            f = parent + (int(keep(parent)[c[-1]]),)
            fine_of[c] = f
        return f

    def keep(f):
        ks = kept.get(f)
        if ks is None:
            ks = np.argsort(-(target(f) + draft(f)), kind="stable")[:m]
            kept[f] = ks
        return ks

    def merged(model):
        def fn(c):
            f = fine(c)
            law = model(f)
            inside = law[keep(f)]
            return np.concatenate([inside, [max(0.0, 1.0 - float(inside.sum()))]])

        return fn

    tree = merged_tree(merged(target), merged(draft), m + 1, block_len, names=(f"{target.name}[top-{m}]",
                                                                                f"{draft.name}[top-{m}]"))
    return TruncatedTree(tree.tree, tree.selectable, len(kept))


def merged_tree(target, draft, vocab_size: int, block_len: int, *, names=("target", "draft")) -> TruncatedTree:
    """The trie of merged models on ``vocab_size = m + 1`` symbols, ⊥ = ``m`` the last: ``target`` /
    ``draft`` are callables ``prefix -> law over m + 1 symbols`` called at the prefixes without ⊥
    only; after ⊥ both put all mass on ⊥ (module docstring). ``selectable``: nodes avoiding ⊥."""
    bot = int(vocab_size) - 1
    point = np.eye(bot + 1)[bot]
    calls: set = set()

    def absorbing(fn, name):
        def law(c):
            if bot in c:
                return point
            calls.add(c)
            return fn(c)

        return BlockModel(bot + 1, law, name)

    tree = build_tree(absorbing(target, names[0]), absorbing(draft, names[1]), block_len, with_bonus=False)
    selectable = np.ones(tree.num_nodes, dtype=bool)
    for i in range(1, tree.num_nodes):
        selectable[i] = selectable[tree.parent[i]] and tree.token[i] != bot
    return TruncatedTree(tree, selectable, len(calls))
