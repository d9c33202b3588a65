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

from otbound.block_verifiers._base import BlockVerifier, residual


class TraversalVerification(BlockVerifier):
    name = "traversal"
    reference = "traversal verification (Weng et al. 2505.12398), i.i.d. draft branches"

    def prepare(self, target, draft, drafts, cache):
        length = len(drafts[0])
        root_b, root_s, root_pa = target(()), draft(()), 1.0
        sched = []  # [(p_α tested, accepted prefix, law of the next token)] in traversal order
        for tokens in drafts:
            pa = [root_pa, min(1.0, root_pa * float(root_b[tokens[0]]) / float(root_s[tokens[0]]))]
            for i in range(1, length):
                pre = tokens[:i]
                pa.append(min(1.0, pa[-1] * float(target(pre)[tokens[i]]) / float(draft(pre)[tokens[i]])))
            sched.append((pa[length], tokens, target(tokens)))
            for i in range(length - 1, 0, -1):  # the leaf's parent becomes the next leaf
                pre = tokens[:i]
                w = pa[i] * target(pre) - draft(pre)
                s = float(w.clip(min=0.0).sum())
                den = s + (1.0 - pa[i])
                sched.append((s / den if den > 0 else 1.0, pre, residual(w, target(pre))))
            w = root_pa * root_b - root_s  # chain exhausted: update the root
            s = float(w.clip(min=0.0).sum())
            den = s + (1.0 - root_pa)
            root_b, root_pa = residual(w, root_b), (s / den if den > 0 else 1.0)
        return sched, root_b

    def walk(self, inst, oracle):
        sched, root_law = inst
        for pa, prefix, law in sched:
            if oracle.bernoulli(pa):
                return prefix, law
        return (), root_law
