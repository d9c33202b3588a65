"""Multi-path token-level verification: a token-level multi-draft verifier at every tree node.

The K i.i.d. draft blocks form a tree (drafts sharing a prefix share its node). At node ``u`` (root
first) the next tokens of the ``c`` drafts passing through ``u`` are ``c`` i.i.d. draws of
``q(·|u)`` (independent of everything decided above ``u``), so a lossless token-level verifier
``V`` for i.i.d. drafts applied to that row emits ``Y ~ p(·|u)`` exactly. If ``Y`` equals one of the
row's tokens (a residual sample equal to a draft counts, docs/theory/notation.md) the walk moves to the child
``u·Y`` with the drafts that drafted ``Y``; otherwise ``Y`` is the correction token and the
iteration stops. At depth ``L`` the bonus token is drawn from ``p(·|u)``. Lossless by induction
over the depth.

* ``multipath_rrs``: ``V`` = SpecInfer recursive rejection sampling (Miao et al. 2305.09781);
* ``multipath_kseq``: ``V`` = SpecTr K-SEQ (Sun et al. 2310.15141), ``K`` = drafts at the node.

The token-level verifiers are otbound's :data:`otbound.token.verifiers.VERIFIERS` (``conditional_law``
for the exact law, ``sample`` — the algorithm itself, batched over the samples at a node — for
sampling).
"""

from __future__ import annotations

import numpy as np

from otbound.block.verifiers._base import BlockVerifier
from otbound.token.draft_laws import inverse_cdf


class MultiPathVerifier(BlockVerifier):
    """A token-level verifier applied at every node of the draft tree (tree verification): at a node,
    the drafted children are the token verifier's drafts, the accepted child continues; lossless when
    the token verifier is.

    Parameters
    ----------
    token_verifier : str or Verifier
        A name in :data:`otbound.VERIFIERS` or a token-level verifier object.

    Examples
    --------
    A token verifier by name or as an object; on Sun et al.'s toy (2403.10444: p = (1/3, 2/3),
    q = (2/3, 1/3) at every prefix; K = L = 2) SpecTr's K-SEQ at every node accepts more than
    SpecInfer's RRS:

    >>> import otbound as ob
    >>> from otbound.block.verifiers import MultiPathVerifier
    >>> t, d = ob.context_free_model([1 / 3, 2 / 3]), ob.context_free_model([2 / 3, 1 / 3])
    >>> kw = dict(vocab_size=2, num_drafts=2, block_len=2)
    >>> [round(9 * MultiPathVerifier(v).acceptance(t, d, **kw), 6) for v in ("rrs", ob.VERIFIERS["kseq"])]
    [12.0, 12.649379]
    >>> MultiPathVerifier(ob.VERIFIERS["kseq"]).name, ob.BLOCK_VERIFIERS["multipath_kseq"].lossless
    ('multipath_kseq', True)
    """
    def __init__(self, token_verifier):
        """``token_verifier``: a name in :data:`otbound.VERIFIERS` or a token-level verifier object."""
        self.token_verifier = token_verifier
        label = getattr(token_verifier, "name", token_verifier)
        self.name = f"multipath_{label}"
        self.reference = f"token-level {label} at every node of the draft tree"

    @property
    def lossless(self) -> bool:
        """Lossless exactly when its token-level verifier is: every node emits the target's law."""
        return bool(self._verifier().lossless)

    def _verifier(self):
        from otbound.token.verifiers import VERIFIERS

        return VERIFIERS[self.token_verifier] if isinstance(self.token_verifier, str) else self.token_verifier

    def prepare(self, target, draft, drafts, cache):
        # token-level laws are shared by every draft tuple with the same (node, row): cache them
        return np.asarray(drafts, dtype=np.int64), target, draft, cache.setdefault("laws", {})

    def _law(self, inst, node: tuple, row: np.ndarray) -> np.ndarray:
        """The token-level verifier's exact law of the token emitted at ``node`` given ``row``."""
        _, target, draft, laws = inst
        key = (node, row.tobytes())
        law = laws.get(key)
        if law is None:
            law = laws[key] = self._verifier().conditional_law(target(node), draft(node), row)
        return law

    def walk(self, inst, coin, draw):
        drafts, target = inst[0], inst[1]
        members = np.arange(drafts.shape[0])
        node: tuple = ()
        for depth in range(drafts.shape[1]):
            row = drafts[members, depth]
            y = draw(self._law(inst, node, row))
            if not np.any(row == y):
                return node, np.eye(target.vocab_size)[y]
            members = members[row == y]
            node = node + (y,)
        return node, target(node)

    def _conditional_value(self, inst) -> float:
        """``E[τ | drafts]`` by recursion over the draft tree: at a node, the emitted token moves to
        a child only if it equals one of the row's tokens, so only those branches are followed
        (the walk's replay would enumerate all V outcomes of every node)."""
        drafts = inst[0]

        def value(node: tuple, members: np.ndarray) -> float:
            depth = len(node)
            if depth == drafts.shape[1]:
                return 0.0
            row = drafts[members, depth]
            law = self._law(inst, node, row)
            return sum(
                law[y] * (1.0 + value(node + (y,), members[row == y])) for y in np.unique(row).tolist() if law[y] > 0
            )

        return value((), np.arange(drafts.shape[0]))

    def _node_drafts(self, row: np.ndarray) -> np.ndarray:
        """The drafts handed to the token verifier at a node: its rows' tokens, in row order."""
        return row

    def _sample_group(self, inst, rows, tokens, accepted, rng):
        """Breadth-first over the draft tree, one batched token-level call per (node, group)."""
        drafts, target, draft, _ = inst
        verifier = self._verifier()
        length = drafts.shape[1]
        stack = [((), np.arange(drafts.shape[0]), rows)]
        while stack:
            node, members, where = stack.pop()
            depth = len(node)
            if depth == length:
                tokens[where, depth] = inverse_cdf(target(node), rng.random(where.size))
                accepted[where] = depth
                continue
            row = drafts[members, depth]
            kids = self._node_drafts(row)  # the drafts the token verifier sees at this node
            out = verifier.sample(target(node), draft(node), np.broadcast_to(kids, (where.size, kids.size)), rng).tokens
            tokens[where, depth] = out
            hit = np.isin(out, kids)
            accepted[where[~hit]] = depth
            for y in np.unique(out[hit]).tolist():
                stack.append((node + (y,), members[row == y], where[out == y]))
