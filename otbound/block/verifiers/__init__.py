"""Block verifiers (docs/theory/block-bounds.md): registry :data:`BLOCK_VERIFIERS` (name → verifier object).

========================= ===================================================================
name                      algorithm
========================= ===================================================================
``token``                 speculative sampling token by token along the first draft
``block``                 block verification (Sun et al. 2403.10444), first draft
``multipath_rrs``         SpecInfer RRS at every node of the K-draft tree
``multipath_kseq``        SpecTr K-SEQ at every node of the K-draft tree
``traversal``             traversal verification (Weng et al. 2505.12398), K draft branches
``spectr_gbv``            SpecTr-GBV (Lin et al. 2604.25925), Alg. 1 as recovered
``causal_optimal``        attains U_causal: LP draft choice + block verification (derived)
``hsd``                   hierarchical speculative decoding (Zhou et al. 2601.05724), first draft
``univer``                UniVer (Weng, Hu, Yairi 2605.04543) on its own tree, ``num_drafts`` = m
``static_tree``           static top-k tree (deterministic drafting), ``num_drafts`` = branching
========================= ===================================================================

:class:`TreeShapeVerifier` (a token verifier of a law with distinct drafts at every node of a planned
uniform tree, :mod:`otbound.plan`) takes its shape as a parameter and is built per shape, not
registered.

Every verifier but ``univer`` is run with K i.i.d. draft blocks (``sampling ==
"with_replacement"``). ``univer`` drafts its own tree (per node the top ``m − 1`` draft tokens plus
one residual sample; ``m^L`` paths): its drafting hooks (``draft_tuple_law``, ``draw_drafts``,
``num_rows``, ``node_drafts``) are used by every consumer, and it is compared with the bounds of its
own law (``own_law_bounds``), not with those of K i.i.d. blocks.

Every verifier has, with the names and argument order of the token verifiers
(:class:`otbound.token.verifiers.Verifier`; target first, then draft): ``sample(target, draft,
drafts, rng)`` (one iteration; drafts ``(K, L)`` or ``(n, K, L)``) → :class:`BlockSample`; the
exact ``conditional_law`` of the emitted sequence given one draft tuple; ``acceptance`` (exact
``E[τ]``, bonus excluded; at L = 1 the token verifiers' α) and ``conditional_acceptance``
(``E[τ | drafts]``); ``lossless_error``; the one-iteration ``iteration_law`` — exact by
enumeration on small models; and the attributes ``name``, ``reference``, ``lossless``,
``sampling``. :func:`generate` iterates a verifier to a fixed output length.
"""

from otbound.block.verifiers._base import MAX_EXACT_TUPLES, BlockSample, BlockVerifier, DraftLawBounds, generate
from otbound.block.verifiers.chain import BlockVerification, TokenChain
from otbound.block.verifiers.hsd import HierarchicalSpeculativeDecoding
from otbound.block.verifiers.multipath import MultiPathVerifier
from otbound.block.verifiers.optimal import CausalOptimal
from otbound.block.verifiers.spectr_gbv import SpecTrGBV
from otbound.block.verifiers.static_tree import StaticTreeTraversal
from otbound.block.verifiers.traversal import TraversalVerification
from otbound.block.verifiers.tree_shape import TreeShapeVerifier
from otbound.block.verifiers.univer import UniVer

BLOCK_VERIFIERS: dict[str, BlockVerifier] = {
    v.name: v
    for v in (
        TokenChain(),
        BlockVerification(),
        MultiPathVerifier("rrs"),
        MultiPathVerifier("kseq"),
        TraversalVerification(),
        SpecTrGBV(),
        CausalOptimal(),
        HierarchicalSpeculativeDecoding(),
        UniVer(),
        StaticTreeTraversal(),
    )
}

__all__ = [
    "BLOCK_VERIFIERS",
    "MAX_EXACT_TUPLES",
    "BlockSample",
    "BlockVerifier",
    "BlockVerification",
    "StaticTreeTraversal",
    "CausalOptimal",
    "DraftLawBounds",
    "HierarchicalSpeculativeDecoding",
    "MultiPathVerifier",
    "SpecTrGBV",
    "TokenChain",
    "TraversalVerification",
    "TreeShapeVerifier",
    "UniVer",
    "generate",
]
