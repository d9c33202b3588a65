"""Traversal verification (Weng, Hu, Chen, Liu, Mei, Qiu, Tian, Shi, arXiv 2505.12398, NeurIPS 2025).

Leaf-to-root verification of a token tree with *sequence-level* acceptance probabilities. Every
node ``X`` carries ``p_α(X)``, initialised top-down as
``p_α(root) = 1``, ``p_α(X) = min{1, p_α(parent) · M_b(x|parent) / M_s(x|parent)}``
(``M_b`` target, ``M_s`` draft laws at the parent). Repeatedly take the first leaf ``X`` of a
post-order depth-first traversal and draw ``η ~ U(0, 1)``:

* ``η < p_α(X)``: accept the path root → ``X`` and emit the next token from ``M_b(·|X)``;
* otherwise delete ``X`` and update its parent ``Y``:
  ``M_b(·|Y) ← norm([p_α(Y) M_b(·|Y) − M_s(·|Y)]_+)`` and
  ``p_α(Y) ← S / (S + 1 − p_α(Y))``, ``S = Σ_x [p_α(Y) M_b(x|Y) − M_s(x|Y)]_+``
  (the descendants of ``Y``'s remaining children get their ``p_α`` recomputed from the new values).

On a single chain this *is* block verification (Sun et al. 2403.10444; tested: identical law).

**Tree and draft law used here.** otbound's drafts are K i.i.d. blocks, so the tree is the K drafts
as separate branches of the root (duplicate tokens allowed, as in SpecInfer's sampling with
replacement). Weng et al. draw sibling nodes *without* replacement and also renormalise
``M_s(·|Y)`` without the deleted token; with i.i.d. siblings the draft law of the next sibling is
unchanged, so ``M_s`` is left as it is (the with-replacement form of the same update, as in
SpecInfer's RRS). With these branches the traversal is a fixed sequence of tests — chain 1 from its
leaf up to depth 1, the root update, chain 2 with the updated root law, … — and the root itself
finally accepts (``p_α(root)`` stays 1) with the residual ``M_b(·|root)``.
"""

from __future__ import annotations

from otbound.block.verifiers._base import BlockVerifier
from otbound.block.verifiers.chain import block_schedule


class TraversalVerification(BlockVerifier):
    """Traversal verification of K i.i.d. draft branches: each branch is block verification from the
    current root, the next branch continuing from the rejected node's residual law.

    References
    ----------
    Weng et al., "Traversal verification for speculative tree decoding", arXiv 2505.12398.

    Examples
    --------
    On Sun et al.'s toy (2403.10444: p = (1/3, 2/3), q = (2/3, 1/3) at every prefix, L = 2) one
    branch is block verification (E[τ] = 11/9 = 33/27); a second branch lifts E[τ] to 38/27:

    >>> import otbound as ob
    >>> t, d = ob.context_free_model([1 / 3, 2 / 3]), ob.context_free_model([2 / 3, 1 / 3])
    >>> trav = ob.BLOCK_VERIFIERS['traversal']
    >>> {k: round(27 * trav.acceptance(t, d, vocab_size=2, num_drafts=k, block_len=2), 9) for k in (1, 2)}
    {1: 33.0, 2: 38.0}
    """
    name = "traversal"
    reference = "traversal verification (Weng et al. 2505.12398), i.i.d. draft branches"
    lossless = True

    def prepare(self, target, draft, drafts, cache):
        # each branch is block verification from the current root (Sun et al.'s schedule), the
        # root's running p_0 and target law carried from branch to branch
        root_p, root_law = 1.0, target(())
        sched = []  # [(p_α tested, accepted prefix, law of the next token)] in traversal order
        for tokens in drafts:
            chain = block_schedule(target, draft, tokens, root_p=root_p, root_law=root_law)
            sched += [(h, tokens[:i], law) for i, h, law in chain[:-1]]
            _, root_p, root_law = chain[-1]
        return sched, root_law

    def walk(self, inst, coin, draw):
        sched, root_law = inst
        for pa, prefix, law in sched:
            if coin(pa):
                return prefix, law
        return (), root_law
