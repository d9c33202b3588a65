"""Hierarchical speculative decoding, single draft (Zhou et al., "Hierarchical Speculative Decoding",
arXiv 2601.05724; public code github.com/ZhouYuxuanYX/Hierarchical-Speculative-Decoding, the
``backward`` branch of ``_speculative_sampling`` in ``transformers/generation/utils.py`` as of commit
``747d2594031d8e93bf65f9444489ad155b4c7f76``, the "clever" setting without forward sampling; the
repository's earlier ``algorithm_clean.py``, commit ``89745108cd6c2eab5e4939fd4f78bb12610046c9``,
caps the prefix mass by ``min(P_k, Q_k)`` instead and is not what this module follows).

For a draft block ``x_{1:L}`` with joint prefix probabilities ``P_k = p(x_{1:k})``,
``Q_k = q(x_{1:k})`` and ``R_k = P_k / Q_k``, HSD caps the target's joint prefix mass by the running
maximum of the ratio, ``P̃_k = P_k / max{1, R_1, …, R_k}``, and compares the joint laws of the next
token, ``P̃_k p(·|x_{1:k})`` against ``Q_k q(·|x_{1:k})``. With ``(·)_±`` their positive and negative
parts,

* position ``k < L`` "does not step back" with probability
  ``Σ(P̃_k p − Q_k q)_+ / max{Σ(P̃_k p − Q_k q)_+, Σ(P̃_k p − Q_k q)_−}`` (independent draws);
* the whole block is accepted with probability ``min{1, R_L}`` (the joint ratio, uncapped);
* otherwise ``τ`` is the last position that does not step back (0 if none), and the token after
  ``x_{1:τ}`` is drawn from ``norm((P̃_τ p(·|x_{1:τ}) − Q_τ q(·|x_{1:τ}))_+)``; after a full
  acceptance, the bonus from ``p(·|x_{1:L})``.

Since ``P̃_k ≤ Q_k``, dividing by ``Q_k`` gives ``π_k = R_k / max{1, R_1..R_k}``, which is Sun et al.'s
running ``p_k = min{1, p_{k−1} p(x_k|x_{<k}) / q(x_k|x_{<k})}``, and the step-back test is Sun et
al.'s ``h_k = S_k / (S_k + 1 − π_k)``, ``S_k = Σ(π_k p − q)_+``. Independent draws, keeping the last
success, have the law of Sun et al.'s sequential scan ``k = L, L−1, …, 0``. So HSD's one iteration is
block verification (:class:`~otbound.block.verifiers.chain.BlockVerification`) with one change: the
full block is accepted with ``min{1, R_L} ≥ π_L`` (equal when no prefix has ``R_k > max{1, R_L}``).

Multi-draft HSD (the public code's ``multidraft > 1``, drafts laid out as a striped tree) is not
implemented; like ``block``, this verifier reads only the first draft when given ``K > 1``.
"""

from __future__ import annotations

import numpy as np

from otbound.block.verifiers._base import BlockVerifier
from otbound.block.verifiers.chain import block_schedule, walk_schedule


class HierarchicalSpeculativeDecoding(BlockVerifier):
    """Hierarchical speculative decoding, single draft, as published; found lossy here (one
    iteration's output law is not the target's; ``lossless = False``).

    References
    ----------
    Zhou et al., arXiv 2601.05724.

    Examples
    --------
    On Sun et al.'s toy (2403.10444: p = (1/3, 2/3), q = (2/3, 1/3) at every prefix, L = 2) one
    iteration's output is off the target's law by 2/27, and E[τ] = 12/9 exceeds U_causal = 11/9,
    which no lossless single-draft verifier can:

    >>> import otbound as ob
    >>> t, d = ob.context_free_model([1 / 3, 2 / 3]), ob.context_free_model([2 / 3, 1 / 3])
    >>> hsd, kw = ob.BLOCK_VERIFIERS['hsd'], dict(vocab_size=2, num_drafts=1, block_len=2)
    >>> round(27 * hsd.lossless_error(t, d, **kw), 9), hsd.acceptance(t, d, **kw) > 11 / 9, hsd.lossless
    (2.0, True, False)
    """
    name = "hsd"
    reference = "hierarchical speculative decoding (Zhou et al. 2601.05724), single draft"
    lossless = False  # measured: one iteration's output law is not the target's (module docstring)

    def prepare(self, target, draft, drafts, cache):
        tokens = drafts[0]
        sched = block_schedule(target, draft, tokens)
        ratio = float(np.prod([target(tokens[:i])[x] / draft(tokens[:i])[x] for i, x in enumerate(tokens)]))
        length, _, bonus = sched[0]
        return tokens, [(length, min(1.0, ratio), bonus)] + sched[1:]

    def walk(self, inst, coin, draw):
        return walk_schedule(*inst, coin)
