"""U_causal and U_joint for any law of draft trees (not only K i.i.d. blocks).

A drafting scheme is a law over draft tuples: each tuple a fixed number ``R`` of root-to-leaf rows
of ``L`` tokens (K i.i.d. blocks, a beam, a static top-k tree, a sampled tree). The best
single-iteration lossless verifier of that scheme has ``E[τ] = U_causal`` (the causal LP of
docs/theory/block-bounds.md over the tuples) and every coupling ``E[τ] ≤ U_joint`` (the block OT);
both read only the tuples and their probabilities (:func:`otbound.block._plain.causal_lp_tuples`,
:func:`otbound.block._plain.joint_ot_tuples`), so one function serves every scheme.
:func:`block_draft_law_bounds` gives both, and the best verifier, for the block laws of block-diffusion
drafters (:data:`otbound.block.BLOCK_DRAFT_LAWS`: one block drawn at once from per-position outputs).
:func:`merged_tuple_law_bracket` brackets U_causal of a scheme on merged models (kept tokens and one
cell ⊥ per prefix, :func:`otbound.block.merged_bound_bracket`) for real vocabularies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from otbound._validation import InvalidInputError, check_positive_int
from otbound.block._plain import causal_lp_tuples, joint_ot_tuples
from otbound.block._tree import build_tree
from otbound.block._truncate import merged_tree
from otbound.block.bounds import BlockBracket, block_bound
from otbound.block.models import BLOCK_DRAFT_LAWS, BlockDraftLaw
from otbound.block.verifiers import BLOCK_VERIFIERS
from otbound.block.verifiers._base import DraftLawBounds, _models


def tuple_law_bounds(target, draft, law, *, vocab_size: int, block_len: int) -> DraftLawBounds:
    """U_causal and U_joint of the draft-tuple law ``law``.

    Parameters
    ----------
    target, draft : callable or BlockModel
        ``prefix (tuple of ints) -> law over vocab_size tokens``.
    law : sequence of (float, rows)
        Every draft tuple of positive probability: ``rows`` is a sequence of ``R`` tuples of
        ``block_len`` token ids (the same ``R`` for all), the probabilities sum to 1.
    vocab_size : int
        V.
    block_len : int
        L.

    Returns
    -------
    DraftLawBounds
        ``causal`` (the best lossless verifier's ``E[τ]`` for this law) and ``joint`` (≥ causal).

    Raises
    ------
    InvalidInputError
        When the rows do not all have ``block_len`` tokens in ``0..V−1`` or their count varies.

    Examples
    --------
    One deterministic block (the draft's own law plays no part): U_causal is the target
    probability of following it, p(x₁) + p(x₁) p(x₂|x₁).

    >>> import numpy as np
    >>> from otbound.block.law_bounds import tuple_law_bounds
    >>> def target(prefix):  # p(·) = (1/2, 1/2) at the root, (1/4, 3/4) after any token
    ...     return np.array([0.5, 0.5]) if not prefix else np.array([0.25, 0.75])
    >>> b = tuple_law_bounds(target, target, [(1.0, [(0, 1)])], vocab_size=2, block_len=2)
    >>> round(b.causal, 12), round(b.joint, 12)
    (0.875, 0.875)
    """
    v = check_positive_int(vocab_size, "vocab_size")
    length = check_positive_int(block_len, "block_len")
    target, draft = _models(target, draft, v)
    rows = [[tuple(int(t) for t in r) for r in tup] for _, tup in law]
    if not rows or len({len(r) for r in rows}) != 1:
        raise InvalidInputError("every draft tuple needs the same positive number of rows")
    if any(len(r) != length or not all(0 <= t < v for t in r) for tup in rows for r in tup):
        raise InvalidInputError(f"every row needs {length} token ids in 0..{v - 1}")
    tree = build_tree(target, draft, length)
    tuples = np.array([[int(np.ravel_multi_index(r, (v,) * length)) for r in tup] for tup in rows])
    probs = np.array([float(p) for p, _ in law])
    joint, _ = joint_ot_tuples(tree, tuples, probs)
    return DraftLawBounds(causal_lp_tuples(tree, tuples, probs), joint)


def merged_tuple_law_bracket(target, draft, law, *, vocab_size: int, block_len: int) -> BlockBracket:
    """``lower ≤ U_causal ≤ upper`` of a draft-tuple law given on merged models (``vocab_size = m + 1``
    symbols, ⊥ = ``m`` the last; :func:`otbound.block.merged_bound_bracket`).

    ``law`` is the image of the real scheme's tuple law under the merge (a real token outside a
    prefix's kept tokens becomes ⊥, and every later token ⊥ too): rows through ⊥ are padded with ⊥.
    Upper: U_causal of the merged models and law; lower: the same LP with no prefix through ⊥
    accepted, attained by a lossless verifier of the real models (the proofs of
    :mod:`otbound.block._truncate`, which read the tuple law only through that image).

    Parameters
    ----------
    target, draft : callable
        Merged models, ``prefix -> law over vocab_size symbols`` (called at prefixes without ⊥).
    law : sequence of (float, rows)
        As for :func:`tuple_law_bounds`, over the merged symbols.
    vocab_size : int
        ``m + 1`` (at least 2).
    block_len : int
        L.

    Returns
    -------
    otbound.block.BlockBracket
        ``kind="causal"``, ``num_drafts`` = rows per tuple, ``truncated_draft_mass`` = the probability
        that some row of the tuple passes through ⊥.

    Raises
    ------
    InvalidInputError
        As :func:`tuple_law_bounds`, and if ``vocab_size < 2``.

    Examples
    --------
    One deterministic row (0, 0) and nothing merged away (⊥ has mass 0): lower = upper = the target
    probability of following it, p(0) + p(0) p(0|0).

    >>> import numpy as np
    >>> from otbound.block.law_bounds import merged_tuple_law_bracket
    >>> def target(prefix):
    ...     return np.array([0.5, 0.5, 0.0]) if not prefix else np.array([0.25, 0.75, 0.0])
    >>> b = merged_tuple_law_bracket(target, target, [(1.0, [(0, 0)])], vocab_size=3, block_len=2)
    >>> round(b.lower, 12), round(b.upper, 12)
    (0.625, 0.625)
    """
    v = check_positive_int(vocab_size, "vocab_size")
    if v < 2:
        raise InvalidInputError(f"merged models need m kept tokens and the cell ⊥: vocab_size ≥ 2, got {v}")
    length = check_positive_int(block_len, "block_len")
    rows = [[tuple(int(t) for t in r) for r in tup] for _, tup in law]
    if not rows or len({len(r) for r in rows}) != 1:
        raise InvalidInputError("every draft tuple needs the same positive number of rows")
    if any(len(r) != length or not all(0 <= t < v for t in r) for tup in rows for r in tup):
        raise InvalidInputError(f"every row needs {length} token ids in 0..{v - 1}")
    trunc = merged_tree(target, draft, v, length)
    tree = trunc.tree
    # the plain LP reads a bonus law at depth L: U_causal does not depend on which (emission after a
    # whole row is accepted sums to S(u) whatever the law), so the models are not asked beyond depth L − 1
    tree.p_cond[tree.level(length)] = 1.0 / v
    tuples = np.array([[int(np.ravel_multi_index(r, (v,) * length)) for r in tup] for tup in rows])
    probs = np.array([float(p) for p, _ in law])
    leaves = tree.level(length)
    kept = trunc.selectable[leaves]
    out = (~kept[tuples]).any(axis=1)
    return BlockBracket(
        lower=causal_lp_tuples(tree, tuples, probs, trunc.selectable), upper=causal_lp_tuples(tree, tuples, probs),
        kind="causal", top_m=v - 1, num_drafts=len(rows[0]), block_len=length,
        truncated_target_mass=max(0.0, float(1.0 - tree.p_path[leaves][kept].sum())),
        truncated_draft_mass=float(probs[out].sum() / probs.sum()), nodes_evaluated=trunc.nodes_evaluated,
    )


@dataclass
class BlockDraftLawBounds:
    """The bounds of one block draft law of a block-diffusion drafter and its best verifier.

    Returned by :func:`otbound.block.law_bounds.block_draft_law_bounds`. One block is drafted
    (K = 1), so block verification (Sun et al. 2403.10444) is the best lossless single-iteration
    verifier: its exact ``E[τ]`` equals U_causal.

    Attributes
    ----------
    law : str
        The block draft law's name (:data:`otbound.block.BLOCK_DRAFT_LAWS`).
    causal, joint : float
        U_causal ≤ U_joint of the law (E[τ], bonus excluded).
    verifier : str
        The best verifier's registry name (:data:`otbound.block.BLOCK_VERIFIERS`), ``"block"``.
    verifier_acceptance : float
        Its exact E[τ] on this law (by enumeration of the draft blocks).
    token_acceptance : float
        Exact E[τ] of speculative sampling token by token (``"token"``), the verification engines
        deploy.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.block import context_free_model
    >>> from otbound.block.law_bounds import block_draft_law_bounds
    >>> b = block_draft_law_bounds(context_free_model([0.5, 0.5]), "argmax_chain", [[0.6, 0.4], [0.6, 0.4]])
    >>> round(b.causal, 12), round(b.verifier_acceptance, 12)      # the chain (0, 0): 0.5 + 0.25
    (0.75, 0.75)
    """

    law: str
    causal: float
    joint: float
    verifier: str
    verifier_acceptance: float
    token_acceptance: float


def block_draft_law_bounds(target, law, marginals, transitions=None, *, vocab_size: int | None = None
                           ) -> BlockDraftLawBounds:
    """U_causal, U_joint and the best verifier of a block-diffusion drafter's block law.

    The law (:data:`otbound.block.BLOCK_DRAFT_LAWS`) turns the drafter's per-position marginals
    (and neighbour transitions) into the law of one drafted block of ``L`` tokens
    (:meth:`otbound.block.BlockDraftLaw.law_model`); its bounds are those of one draft block,
    :func:`otbound.block_bound` with K = 1 (the causal and joint LPs of docs/theory/block-bounds.md),
    and block verification attains U_causal.

    Parameters
    ----------
    target : BlockModel or callable
        The target, ``prefix -> next-token law``.
    law : str or BlockDraftLaw
        ``"marginal_product"``, ``"argmax_chain"``, ``"topk_markov"`` or a law object
        (e.g. ``TopKMarkov(3)``).
    marginals : array_like
        ``(L, V)`` per-position laws of the drafter.
    transitions : array_like, optional
        ``(L − 1, V, V)`` neighbour transitions (``topk_markov``).
    vocab_size : int, optional
        Needed when ``target`` is a plain callable (default: the marginals' V).

    Returns
    -------
    BlockDraftLawBounds

    Raises
    ------
    otbound.InvalidInputError
        An unknown law name, marginals or transitions that are not laws, a target over another
        vocabulary, or a block too large to enumerate (``V^L``).

    References
    ----------
    Sun et al., "Block verification accelerates speculative decoding", arXiv 2403.10444.

    Examples
    --------
    A drafter that learned the target's own marginals of a copying target: the product is
    incoherent (its second token ignores the first), the Markov selector is not.

    >>> from otbound.block import BLOCK_DRAFT_LAWS, block_marginals, tabulated_model
    >>> from otbound.block.law_bounds import block_draft_law_bounds
    >>> target = tabulated_model({(): [0.5, 0.5], (0,): [1, 0], (1,): [0, 1]}, 2, default=[0.5, 0.5])
    >>> m, t = block_marginals(target, 2)
    >>> round(block_draft_law_bounds(target, "marginal_product", m).causal, 12)
    1.5
    >>> round(block_draft_law_bounds(target, "topk_markov", m, t).causal, 12)
    2.0
    """
    if isinstance(law, str):
        if law not in BLOCK_DRAFT_LAWS:
            raise InvalidInputError(f"unknown block draft law {law!r}; choose from {sorted(BLOCK_DRAFT_LAWS)}")
        law = BLOCK_DRAFT_LAWS[law]
    if not isinstance(law, BlockDraftLaw):
        raise InvalidInputError(f"law must be a name of BLOCK_DRAFT_LAWS or a BlockDraftLaw, got {law!r}")
    draft = law.law_model(marginals, transitions)
    v = draft.vocab_size if vocab_size is None else check_positive_int(vocab_size, "vocab_size")
    target, draft = _models(target, draft, v)
    length = int(np.asarray(marginals).shape[0])
    args = dict(vocab_size=v, num_drafts=1, block_len=length)
    causal = block_bound(target, draft, kind="causal", **args).value
    joint = block_bound(target, draft, kind="joint", **args).value
    best = BLOCK_VERIFIERS["block"].acceptance(target, draft, **args)
    token = BLOCK_VERIFIERS["token"].acceptance(target, draft, **args)
    return BlockDraftLawBounds(law.name, causal, joint, "block", best, token)
