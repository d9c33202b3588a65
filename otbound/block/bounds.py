"""Block-level upper bounds on E[τ] for K i.i.d. draft blocks of L tokens.

Definitions, the hierarchy and the LP reduction: ``docs/theory/block-bounds.md``.

``E[τ]`` counts accepted draft tokens (bonus/correction excluded; block efficiency is ``E[τ] + 1``).
Three bounds, from loose to exact, ``U_causal ≤ U_joint ≤ U_per-level``:

* ``"per_level"`` — ``Σ_{ℓ=1..L} α*(p_{1:ℓ}, q_{1:ℓ}^{⊗K})``: the token-level optimum
  (:func:`otbound.optimal_acceptance`, i.i.d. drafts; SpecTr 2310.15141, Hu et al. 2502.18779)
  applied to the joint prefix laws flattened over ``V^ℓ``.
* ``"joint"`` — ``max_π E_π[max_k LCP(X^(k), Y_{1:L})]`` over couplings of the K draft blocks with
  a target block (the block OT problem of SpecTr-GBV, 2604.25925).
* ``"causal"`` — the best ``E[τ]`` of any single-iteration lossless verifier: the causal LP.
  For ``K = 1`` it equals block verification (Sun et al. 2403.10444).

Methods: joint and causal are solved exactly by one sparse LP over the draft trie
(``method="lp"``, the default; derivation in :mod:`otbound.block._lp`: the K drafts enter only
through the law of the selected block, built by pairwise splits, so the size is
``(K − 1)·V^{2L}`` instead of ``V^{LK}`` draft tuples). Independent references:
``method="emd"`` (joint; network simplex between multisets of blocks and target blocks),
``method="plain"`` / ``"plain_exchangeable"`` (causal; the causal LP written over ordered tuples /
multisets). Tolerances: LP values are HiGHS optima at feasibility tolerance ``1e-10`` (agreement
between methods ~``1e-9``); per-level values are exact up to float64 summation.

For vocabularies too large to enumerate, :func:`block_bound_bracket` gives a certified
``[lower, upper]`` bracket from a top-m truncation of the draft tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from otbound._validation import InvalidInputError, check_num_drafts, check_positive_int
from otbound.block._lp import solve_selection_lp
from otbound.block._plain import causal_lp_plain, joint_ot_emd
from otbound.block._tree import build_tree
from otbound.block._truncate import merged_tree, truncated_tree
from otbound.block.models import as_block_model
from otbound.token.bounds import optimal_acceptance

KINDS = ("per_level", "joint", "causal")
_METHODS = {"per_level": ("prefix",), "joint": ("lp", "emd"), "causal": ("lp", "plain", "plain_exchangeable")}


@dataclass(frozen=True)
class PerLevelCertificate:
    """Certificate of ``kind="per_level"``: a minimising set per level.

    binding_sets: ``binding_sets[ℓ−1]`` is H*_ℓ as a boolean mask of shape ``(V,)*ℓ``, with
    ``α*_ℓ = 1 + p(H*_ℓ) − q(H*_ℓ)^K`` (the token-level prefix theorem on ``V^ℓ`` blocks).

    Examples
    --------
    >>> from otbound import block_bound, dirichlet_model
    >>> tg, dr = dirichlet_model(2, seed=0), dirichlet_model(2, seed=1)
    >>> b = block_bound(tg, dr, vocab_size=2, num_drafts=2, block_len=2, kind="per_level", return_certificate=True)
    >>> [h.shape for h in b.certificate.binding_sets]
    [(2,), (2, 2)]
    """

    binding_sets: list


@dataclass(frozen=True)
class SelectionCertificate:
    """Certificate of the joint / causal LP (``method="lp"``): the selection rule it found.

    selected_law: law of the selected draft block, shape ``(V,)*L``; through: ``P(prefix accepted)``
    (causal) or matched (joint) for every prefix of the trie, dict prefix → probability (``()`` → 1);
    keep: the pairwise split matrices, K − 1 arrays ``(V^L, V^L)`` (:mod:`otbound.block._lp`).

    Examples
    --------
    >>> from otbound import block_bound, dirichlet_model
    >>> tg, dr = dirichlet_model(2, seed=0), dirichlet_model(2, seed=1)
    >>> b = block_bound(tg, dr, vocab_size=2, num_drafts=2, block_len=2, kind="causal", return_certificate=True)
    >>> b.certificate.selected_law.shape, b.certificate.through[()], len(b.certificate.keep)
    ((2, 2), 1.0, 1)
    """

    selected_law: np.ndarray
    through: dict
    keep: list


@dataclass(frozen=True)
class JointPlanCertificate:
    """Certificate of ``kind="joint"``, ``method="emd"``: the optimal coupling itself.

    multisets: ``(T, K)`` block indices (the K-multisets of draft blocks, blocks in
    ``np.ravel_multi_index`` order over ``(V,)*L``); plan: ``(T, V^L)`` coupling of those multisets
    with the target's blocks, whose expected longest common prefix is the value.

    Examples
    --------
    >>> from otbound import block_bound, dirichlet_model
    >>> tg, dr = dirichlet_model(2, seed=0), dirichlet_model(2, seed=1)
    >>> b = block_bound(tg, dr, vocab_size=2, num_drafts=2, block_len=2, kind="joint", method="emd",
    ...                 return_certificate=True)
    >>> b.certificate.multisets.shape[1], round(float(b.certificate.plan.sum()), 12)
    (2, 1.0)
    """

    multisets: np.ndarray
    plan: np.ndarray


@dataclass
class BlockBound:
    """A block bound on ``E[τ]`` (accepted draft tokens, bonus excluded).

    value: the bound. levels: ``levels[ℓ−1] = P(τ ≥ ℓ)`` under the optimum (per-level: the level's
    own optimum α*_ℓ), so ``value = levels.sum()`` (None for the reference methods).
    certificate (on request, ``return_certificate=True``; None for ``method="plain"``):
    :class:`PerLevelCertificate` (per_level), :class:`SelectionCertificate` (joint / causal,
    ``method="lp"``) or :class:`JointPlanCertificate` (joint, ``method="emd"``).

    Examples
    --------
    >>> import otbound as ob
    >>> target, draft = ob.context_free_model([1/3, 2/3]), ob.context_free_model([2/3, 1/3])
    >>> bound = ob.block_bound(target, draft, vocab_size=2, num_drafts=1, block_len=2, kind="per_level")
    >>> round(bound.value, 6), bound.levels, bound.method
    (1.333333, array([0.66666667, 0.66666667]), 'prefix')
    """

    value: float
    kind: str
    num_drafts: int
    block_len: int
    vocab_size: int
    method: str
    levels: np.ndarray | None = None
    certificate: PerLevelCertificate | SelectionCertificate | JointPlanCertificate | None = field(
        default=None, repr=False
    )


def _check_kind(kind, method):
    if kind not in KINDS:
        raise InvalidInputError(f"unknown block bound kind {kind!r}; expected one of {KINDS}")
    if method is None:
        method = _METHODS[kind][0]
    if method not in _METHODS[kind]:
        raise InvalidInputError(
            f"method {method!r} is not available for kind {kind!r}; expected one of {_METHODS[kind]}"
        )
    return kind, method


def _check_args(target, draft, vocab_size, num_drafts, block_len, kind, method):
    kind, method = _check_kind(kind, method)
    k = check_num_drafts(num_drafts)
    block_len = check_positive_int(block_len, "block_len")
    target = as_block_model(target, vocab_size, "target")
    draft = as_block_model(draft, vocab_size, "draft")
    return target, draft, k, int(block_len), method


def block_bound(
    target,
    draft,
    *,
    vocab_size: int,
    num_drafts: int,
    block_len: int,
    kind: str,
    method: str | None = None,
    return_certificate: bool = False,
) -> BlockBound:
    """The block bound ``kind`` on ``E[τ]`` for K i.i.d. draft blocks of ``block_len`` tokens.

    ``U_causal ≤ U_joint ≤ U_per-level``: per-level ``Σ_ℓ α*(p_{1:ℓ}, q_{1:ℓ}^{⊗K})``; joint, the
    block transport problem of SpecTr-GBV (2604.25925), ``max_π E_π[max_k LCP(X^(k), Y)]``; causal,
    the best single-iteration lossless verifier, equal to block verification (Sun et al.
    2403.10444) at K = 1. Exact float64 on the full ``V^L`` draft tree.

    Parameters
    ----------
    target, draft : callable or BlockModel
        ``prefix (tuple of ints) -> law over vocab_size tokens`` (:class:`otbound.BlockModel`).
    vocab_size : int
        V.
    num_drafts : int
        K, i.i.d. draft blocks.
    block_len : int
        L, tokens per block.
    kind : {"per_level", "joint", "causal"}
        Which bound.
    method : str, optional
        "prefix" (per_level); "lp" (default) or "emd" (joint); "lp" (default), "plain" or
        "plain_exchangeable" (causal). LP values are HiGHS optima at feasibility tolerance 1e-10.
    return_certificate : bool
        Attach the solver's certificate (binding sets, selected-block law, ...).

    Returns
    -------
    BlockBound
        ``value`` (the bound on E[τ], bonus excluded), per-level ``levels``, ``method`` and the
        optional ``certificate``.

    Raises
    ------
    otbound.InvalidInputError
        On an unknown ``kind`` or ``method``, a non-positive ``vocab_size``, ``num_drafts`` or
        ``block_len``, a model that returns no law over ``vocab_size`` tokens, or a problem larger
        than ``MAX_TREE_CELLS`` / ``MAX_SPLIT_VARIABLES`` (the message names the setting).

    References
    ----------
    Sun et al., "Block verification accelerates speculative decoding", arXiv 2403.10444. Sun et
    al., "SpecTr: fast speculative decoding via optimal transport", arXiv 2310.15141. Derivations:
    ``docs/theory/block-bounds.md``.

    Examples
    --------
    Sun et al.'s toy (binary vocabulary, L = 2, K = 1): 12/9 ≥ 12/9 ≥ 11/9, block verification's 11/9.

    >>> import otbound as ob
    >>> target, draft = ob.context_free_model([1/3, 2/3]), ob.context_free_model([2/3, 1/3])
    >>> [round(9 * ob.block_bound(target, draft, vocab_size=2, num_drafts=1, block_len=2, kind=kind).value, 9)
    ...  for kind in ("per_level", "joint", "causal")]
    [12.0, 12.0, 11.0]
    >>> two = ob.block_bound(target, draft, vocab_size=2, num_drafts=2, block_len=2, kind="causal",
    ...                      return_certificate=True)
    >>> round(two.value, 6), type(two.certificate).__name__, two.certificate.selected_law.shape
    (1.617284, 'SelectionCertificate', (2, 2))
    """
    target, draft, k, length, method = _check_args(target, draft, vocab_size, num_drafts, block_len, kind, method)
    # only the plain LPs read the bonus laws
    tree = build_tree(target, draft, length, with_bonus=method.startswith("plain"))
    return bound_on_tree(tree, k, kind, method=method, return_certificate=return_certificate)


def bound_on_tree(
    tree, k: int, kind: str, *, method: str, return_certificate: bool = False, selectable=None
) -> BlockBound:
    """The bound on a built trie; ``selectable`` (mask over nodes): the lower side of a truncation
    bracket, where no other node may be accepted.

    The engine of :func:`block_bound` and :func:`block_bound_bracket` (same ``kind``, ``method`` and
    certificate), for callers that build the trie themselves (real-model draft trees).

    Examples
    --------
    >>> import otbound as ob
    >>> from otbound.block._tree import build_tree
    >>> from otbound.block.bounds import bound_on_tree
    >>> tree = build_tree(ob.context_free_model([1/3, 2/3]), ob.context_free_model([2/3, 1/3]), 2, with_bonus=False)
    >>> round(9 * bound_on_tree(tree, 1, "causal", method="lp").value, 9)
    11.0
    """
    v, length = tree.vocab_size, tree.block_len
    cert = None
    levels = None
    if kind == "per_level":
        levels = np.empty(length)
        sets = []
        for ell in range(1, length + 1):
            sl = tree.level(ell)
            p, q = tree.p_path[sl], tree.q_path[sl]
            if selectable is not None:  # cells that may never be accepted: separate p and q copies
                bad = ~selectable[sl]
                p = np.concatenate([np.where(bad, 0.0, p), p[bad], np.zeros(bad.sum())])
                q = np.concatenate([np.where(bad, 0.0, q), np.zeros(bad.sum()), q[bad]])
            res = optimal_acceptance(
                p / p.sum(), q / q.sum(), k, "with_replacement", return_certificate=return_certificate
            )
            if return_certificate:
                levels[ell - 1] = res.value
                sets.append(res.binding_set[: v**ell].reshape((v,) * ell))
            else:
                levels[ell - 1] = res
        value = float(levels.sum())
        if return_certificate:
            cert = PerLevelCertificate(binding_sets=sets)
    elif method == "lp":

        sol = solve_selection_lp(tree, k, kind, selectable)
        value = sol.value
        levels = np.array([sol.through[tree.level(ell)].sum() for ell in range(1, length + 1)])
        if return_certificate:
            cert = SelectionCertificate(
                selected_law=sol.selected_law.reshape((v,) * length),
                through={tree.prefix(i): float(sol.through[i]) for i in range(tree.num_nodes)},
                keep=list(sol.keep),
            )
    elif method == "emd":

        if return_certificate:
            value, tuples, plan = joint_ot_emd(tree, k, return_plan=True)
            cert = JointPlanCertificate(multisets=tuples, plan=plan)
        else:
            value = joint_ot_emd(tree, k)
    else:

        value = causal_lp_plain(tree, k, exchangeable=method == "plain_exchangeable")
    return BlockBound(
        value=float(value),
        kind=kind,
        num_drafts=k,
        block_len=length,
        vocab_size=v,
        method=method,
        levels=levels,
        certificate=cert,
    )


@dataclass
class BlockBracket:
    """Certified bracket ``lower ≤ U_kind ≤ upper`` from a top-m truncation of the draft tree.

    truncated_target_mass / truncated_draft_mass: probability that a target / draft block leaves
    the kept tree (hits an "other" cell) within ``block_len`` tokens. nodes_evaluated: prefixes at
    which each model was called.

    Examples
    --------
    >>> import otbound as ob
    >>> target, draft = ob.dirichlet_model(6, seed=1), ob.dirichlet_model(6, seed=2)
    >>> b = ob.block_bound_bracket(target, draft, vocab_size=6, num_drafts=2, block_len=2, kind="causal", top_m=3)
    >>> round(b.lower, 4), round(b.upper, 4), round(b.truncated_target_mass, 4)
    (1.2122, 1.7179, 0.3582)
    """

    lower: float
    upper: float
    kind: str
    top_m: int
    num_drafts: int
    block_len: int
    truncated_target_mass: float
    truncated_draft_mass: float
    nodes_evaluated: int


def block_bound_bracket(
    target,
    draft,
    *,
    vocab_size: int,
    num_drafts: int,
    block_len: int,
    kind: str,
    top_m: int,
) -> BlockBracket:
    """``[lower, upper]`` around the block bound ``kind`` from the top-``m`` tokens per node.

    At every kept prefix the ``top_m`` tokens by ``p + q`` are kept and the rest merged into one
    "other" cell ⊥ (derived; proved in :mod:`otbound.block._truncate`, tested on small models):

    * upper — the bound for the merged models, ⊥ followed by ⊥ deterministically in both: any
      coupling / lossless verifier of the original models maps to one of the merged models with at
      least the same ``E[τ]`` (merging can only raise an OT value);
    * lower — the same merged models with ⊥ never accepted (no prefix through ⊥ is selectable): any
      such plan lifts back to the original models (the ⊥ token is resampled from the target's law
      inside the cell), so its value is attained.

    Only kept prefixes are evaluated: ``Σ_{d<L} m^d`` model calls per model, so the vocabulary may
    be a real LM's.

    Parameters
    ----------
    target, draft, vocab_size, num_drafts, block_len, kind
        As for :func:`block_bound`.
    top_m : int
        Tokens kept per node.

    Returns
    -------
    BlockBracket
        ``lower ≤ U_kind ≤ upper`` and the probability that a target / draft block leaves the kept
        tree.

    Raises
    ------
    otbound.InvalidInputError
        As :func:`block_bound`, and if ``top_m`` is not a positive integer.

    Examples
    --------
    >>> import otbound as ob
    >>> target, draft = ob.dirichlet_model(6, seed=1), ob.dirichlet_model(6, seed=2)
    >>> exact = ob.block_bound(target, draft, vocab_size=6, num_drafts=2, block_len=2, kind="causal").value
    >>> bracket = ob.block_bound_bracket(target, draft, vocab_size=6, num_drafts=2, block_len=2,
    ...                                  kind="causal", top_m=3)
    >>> bool(bracket.lower <= exact <= bracket.upper), round(exact, 4), bracket.nodes_evaluated
    (True, 1.5922, 4)
    """

    target, draft, k, length, method = _check_args(target, draft, vocab_size, num_drafts, block_len, kind, None)
    trunc = truncated_tree(target, draft, length, check_positive_int(top_m, "top_m"))
    return _bracket(trunc, k, kind, method, int(top_m))


def merged_bound_bracket(target, draft, *, vocab_size: int, num_drafts: int, block_len: int,
                         kind: str) -> BlockBracket:
    """The bracket of :func:`block_bound_bracket` for models already merged: ``m`` kept tokens per
    prefix and one "other" cell ⊥, the last of ``vocab_size = m + 1`` symbols.

    ``target(prefix)`` / ``draft(prefix)`` give, at a prefix of kept-token *ranks* (symbols
    ``0..m−1``, no ⊥), the probabilities of the prefix's ``m`` kept tokens and of the rest; they are
    called at prefixes without ⊥ only (after ⊥ both models put all mass on ⊥). The kept tokens may
    be chosen by any rule reading only their prefix (e.g. the draft's top-m, the way a real draft
    tree is stored: :class:`otbound.lm.DraftTreeRecord`); the bracket's proof
    (:func:`block_bound_bracket`) does not depend on the rule. ``lower ≤ U_kind ≤ upper`` for the
    original models and K i.i.d. draft blocks, and ``lower`` is attained by a lossless verifier of
    the original models (``kind="causal"``).

    Parameters
    ----------
    target, draft : callable
        ``prefix (tuple of symbols) -> law over vocab_size symbols``.
    vocab_size : int
        ``m + 1`` (at least 2).
    num_drafts, block_len, kind
        As for :func:`block_bound`.

    Returns
    -------
    BlockBracket
        ``top_m = vocab_size − 1``; the truncated masses are those of leaving the kept tree.

    Raises
    ------
    otbound.InvalidInputError
        As :func:`block_bound`, and if ``vocab_size < 2``.

    Examples
    --------
    The merged form of :func:`block_bound_bracket`'s example gives its bracket:

    >>> import numpy as np
    >>> import otbound as ob
    >>> from otbound.block.bounds import merged_bound_bracket
    >>> target, draft = ob.dirichlet_model(6, seed=1), ob.dirichlet_model(6, seed=2)
    >>> def fine(prefix):   # kept tokens: the top 3 by p + q, as block_bound_bracket keeps them
    ...     f = ()
    ...     for r in prefix:
    ...         f += (int(np.argsort(-(target(f) + draft(f)), kind="stable")[r]),)
    ...     return f
    >>> def merged(model):
    ...     def law(prefix):
    ...         f = fine(prefix)
    ...         kept = model(f)[np.argsort(-(target(f) + draft(f)), kind="stable")[:3]]
    ...         return np.append(kept, 1 - kept.sum())
    ...     return law
    >>> b = merged_bound_bracket(merged(target), merged(draft), vocab_size=4, num_drafts=2, block_len=2,
    ...                          kind="causal")
    >>> round(b.lower, 4), round(b.upper, 4), b.top_m, b.nodes_evaluated
    (1.2122, 1.7179, 3, 4)
    """
    if check_positive_int(vocab_size, "vocab_size") < 2:
        raise InvalidInputError(f"merged models need m kept tokens and the cell ⊥: vocab_size ≥ 2, got {vocab_size}")
    kind, method = _check_kind(kind, None)
    k = check_num_drafts(num_drafts)
    length = check_positive_int(block_len, "block_len")
    trunc = merged_tree(target, draft, vocab_size, length)
    return _bracket(trunc, k, kind, method, int(vocab_size) - 1)


def _bracket(trunc, k: int, kind: str, method: str, top_m: int) -> BlockBracket:
    tree = trunc.tree
    length = tree.block_len
    upper = bound_on_tree(tree, k, kind, method=method).value
    lower = bound_on_tree(tree, k, kind, method=method, selectable=trunc.selectable).value
    leaves = tree.level(length)
    kept = trunc.selectable[leaves]
    return BlockBracket(
        lower=float(lower),
        upper=float(upper),
        kind=kind,
        top_m=top_m,
        num_drafts=k,
        block_len=length,
        truncated_target_mass=max(0.0, float(1.0 - tree.p_path[leaves][kept].sum())),  # clip float round-off
        truncated_draft_mass=max(0.0, float(1.0 - tree.q_path[leaves][kept].sum())),
        nodes_evaluated=trunc.nodes_evaluated,
    )
