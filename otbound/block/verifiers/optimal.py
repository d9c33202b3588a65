"""The causal-optimal block verifier: attains ``U_causal`` (derived for otbound; see _block_lp).

The causal LP's solution (:func:`otbound.block_bound` with ``kind="causal"``) is a rule for
*choosing one of the K drafts* — pairwise, the best draft so far ``y`` is kept against the next
draft ``x`` with probability ``keep_k(y, x) / (r_{k−1}(y) q(x))`` — whose chosen block has law
``r``, followed by block verification (Sun et al. 2403.10444) of the chosen draft *with ``r`` as its
draft law* (``r(·|prefix)`` from the marginals of ``r``). Block verification is lossless for any
draft law the block is really drawn from, so the verifier is lossless, and its ``E[τ]`` is the
single-draft optimum for ``r``, which the LP maximised: ``E[τ] = U_causal``.

The selection probabilities are clipped to ``[0, 1]`` and the law of the chosen block recomputed
from the clipped rule, so the verifier stays exactly lossless whatever the LP's rounding
(``E[τ]`` matches ``U_causal`` to the LP tolerance, ~1e-9). One LP per (target, draft) pair
(per context when iterated).
"""

from __future__ import annotations

import numpy as np

from otbound.block._lp import solve_selection_lp
from otbound.block._tree import build_tree
from otbound.block.models import BlockModel
from otbound.block.verifiers._base import BlockVerifier
from otbound.block.verifiers.chain import block_schedule, walk_schedule


def _selection_rule(keep: list, q: np.ndarray):
    """Clipped keep probabilities per stage and the exact law of the chosen block."""
    r = q
    probs = []
    for kp in keep:
        mass = np.outer(r, q)
        with np.errstate(divide="ignore", invalid="ignore"):
            pk = np.where(mass > 0, np.clip(kp / mass, 0.0, 1.0), 1.0)
        probs.append(pk)
        r = (mass * pk).sum(axis=1) + (mass * (1.0 - pk)).sum(axis=0)
    return probs, r


class CausalOptimal(BlockVerifier):
    """The causal-LP optimum as a verifier: choose a draft block with the LP's selection law, then block
    verification with the chosen law; E[τ] = U_causal of K i.i.d. blocks (docs/theory/block-bounds.md).

    References
    ----------
    Sun et al., arXiv 2403.10444 (block verification); the selection LP is derived for otbound.

    Examples
    --------
    On Sun et al.'s toy (2403.10444: p = (1/3, 2/3), q = (2/3, 1/3) at every prefix, L = 2) with
    K = 2 drafts, E[τ] = U_causal = 131/81 (to the LP's tolerance):

    >>> import otbound as ob
    >>> t, d = ob.context_free_model([1 / 3, 2 / 3]), ob.context_free_model([2 / 3, 1 / 3])
    >>> kw = dict(vocab_size=2, num_drafts=2, block_len=2)
    >>> e = ob.BLOCK_VERIFIERS['causal_optimal'].acceptance(t, d, **kw)
    >>> round(81 * e, 6), round(81 * ob.block_bound(t, d, kind="causal", **kw).value, 6)
    (131.0, 131.0)
    """
    name = "causal_optimal"
    reference = "causal-LP optimum: draft choice + block verification with the chosen law (derived)"
    lossless = True

    def prepare(self, target, draft, drafts, cache):
        k, length = len(drafts), len(drafts[0])
        v = target.vocab_size
        if "rule" not in cache:  # the causal LP of otbound.block_bound, solved once per (models, K, L)
            tree = build_tree(target, draft, length, with_bonus=False)
            keep = solve_selection_lp(tree, k, "causal").keep
            probs, r = _selection_rule(keep, tree.q_path[tree.level(length)])
            law = r.reshape((v,) * length)

            def cond(prefix):
                sub = law[prefix].reshape(v, -1).sum(axis=1)
                s = sub.sum()
                return sub / s if s > 0 else draft(prefix)

            cache["rule"] = (probs, r, BlockModel(v, cond, "chosen-draft law"))
        probs, r, chosen = cache["rule"]
        leaf = [int(np.ravel_multi_index(d, (v,) * length)) for d in drafts]
        sched = [block_schedule(target, chosen, d) if r[i] > 0 else None for d, i in zip(drafts, leaf)]
        return drafts, leaf, probs, sched

    def walk(self, inst, coin, draw):
        drafts, leaf, probs, sched = inst
        best = 0
        for j in range(1, len(drafts)):
            if not coin(probs[j - 1][leaf[best], leaf[j]]):
                best = j
        return walk_schedule(drafts[best], sched[best], coin)
