"""Acceptance-aware training objectives for block drafters (torch, differentiable).

A *block drafter* proposes ``L`` tokens at once from a factorised law ``q(x_{1:L}) = Π_k q_k(x_k)``
(parallel heads, a diffusion block) while verification runs left to right. Whalen, Ito & Sakamoto,
"Teaching Diffusion to Speculate Left-to-Right" (arXiv 2606.11552), train such drafters with
three additions to cross-entropy; this module implements them and the exact objective they
approximate (derivations: ``docs/theory/drafter-objectives.md``):

* :func:`position_weighted_ce` — ``Σ_k w_k CE_k / Σ_k w_k``, ``w_k = exp(−γ k)``, ``k = 1..L``
  (``γ = 0``: plain mean cross-entropy, the baseline).
* :func:`first_error_focal` — extra CE at the first position ``k*`` where the drafter's argmax
  differs from the target token (the first token greedy verification rejects); 0 when the whole
  block matches. Optional focal factor ``(1 − q_{k*}(y_{k*}))^β`` (Lin et al. 1708.02002).
* :func:`chain_term` — ``C = Σ_{k=1..L} Π_{j≤k} a_j`` with ``a_j = q_j(y_j)`` (target ids) or
  ``a_j = ⟨p_j, q_j⟩`` (target laws), maximised.
* :func:`expected_accepted_length` — the exact ``E[τ]`` (bonus token excluded) under token-level
  or block verification, from per-position (or prefix-conditional) laws.
* :func:`block_law_gains` — per block draft law of a block-diffusion drafter
  (:data:`otbound.block.BLOCK_DRAFT_LAWS`), E[τ] at the cross-entropy optimum against the family's
  ceiling: what any objective can gain at most.

**What the chain term is** (derived; tests check it). The summary form
``(1/(L−1)) Σ_k Π_{j≤k} p_j`` is ``E[τ]`` up to scale *only* when ``p_j`` is the drafter's
probability of the target's token and the target is deterministic (greedy, temperature 0): then
token-level and block verification both accept exactly while the sampled draft equals the
target's tokens, so ``P(τ ≥ k) = Π_{j≤k} q_j(y_j)`` and ``E[τ] = C`` exactly, even for a
prefix-dependent target (the accepted prefix *is* ``y_{<k}``). The normaliser that makes it the
accepted fraction is ``1/L`` for ``L`` drafted tokens; ``1/(L−1)`` fits only a block whose first
token is not drafted — a constant either way, it only rescales the term against CE. For a
stochastic target, ``E_y[C] = Σ_k Π_{j≤k} ⟨p_j, q_j⟩`` is the accepted length of *naive*
verification (sample from the target, accept on equality), a lower bound on speculative
sampling's (``⟨p, q⟩ ≤ Σ min(p, q)``) maximised by a one-hot ``q`` at the target's mode, whereas the
exact objectives below are maximised by ``q = p``: the chain term is the right objective for
greedy verification and a mode-seeking surrogate for sampled verification. The right chain for
speculative sampling with context-free laws has ``a_j = Σ_x min(p_j(x), q_j(x)) = 1 − TV(p_j, q_j)``:
that is the exact token-level ``E[τ]``; block verification's exact value is larger (below).

**First-error term.** With greedy labels it adds CE where greedy verification stops. With labels
sampled from a stochastic target it is not a proper scoring rule: the extra weight falls on
tokens that differ from the drafter's argmax, so its minimiser is flatter than ``p`` (in the
synthetic ablation it lowered temperature-1 ``E[τ]``).

All losses take logits ``(..., L, V)`` and a target as ids ``(..., L)`` (integer tensor) or laws
``(..., L, V)`` (float tensor, CE then ``−Σ_x p log q``), and return one value per block ``(...)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from otbound._validation import InvalidInputError
from otbound.objectives._ceilings import BlockLawGains, block_law_gains
from otbound.objectives._exact import (
    MAX_PATHS,
    VERIFICATIONS,
    as_torch_law,
    check_verification,
    conditional_survival,
    law_tolerance,
    prepare,
    survival,
)
from otbound.objectives._losses import chain, check_logits, checked, first_error_index, focal, weighted_ce

__all__ = [
    "ABLATION",
    "BlockLawGains",
    "MAX_PATHS",
    "VERIFICATIONS",
    "DrafterObjective",
    "LossTerms",
    "accepted_length_survival",
    "block_law_gains",
    "chain_term",
    "conditional_accepted_length",
    "expected_accepted_length",
    "first_error_focal",
    "first_error_index",
    "law_tolerance",
    "position_weighted_ce",
]


def _survival(target_probs, draft_probs, verification: str, subset: bool):
    """``(P(τ ≥ i) as torch (..., L), whether to answer in numpy)``."""
    numpy_in = not any(isinstance(x, (torch.Tensor, list, tuple)) for x in (draft_probs, target_probs))
    q, p, context_free = prepare(draft_probs, target_probs, verification, subset)
    return survival(q, p, verification, context_free), numpy_in


def _answer(value: torch.Tensor, numpy_in: bool):
    if not numpy_in:
        return value
    out = value.detach().numpy()
    return float(out) if out.ndim == 0 else out


def accepted_length_survival(target_probs, draft_probs, verification: str = "block", *, subset: bool = False):
    """``P(τ ≥ i)`` for ``i = 1..L``, shape ``(..., L)``; ``E[τ]`` is its sum.

    Same arguments (target first), formulas, checks and tolerances as :func:`expected_accepted_length`.

    Parameters
    ----------
    target_probs, draft_probs
        Per-position laws ``(..., L, V)`` or per-level tree laws (see
        :func:`expected_accepted_length`).
    verification : {"token", "block"}
    subset : bool
        Rows may sum to less than 1 (a lower bound).

    Returns
    -------
    torch.Tensor or numpy.ndarray, shape (..., L)
        ``P(τ ≥ i)``, non-increasing in i.

    Raises
    ------
    otbound.InvalidInputError
        As :func:`expected_accepted_length`.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.objectives import accepted_length_survival
    >>> q = np.array([[2/3, 1/3], [2/3, 1/3]]); p = np.array([[1/3, 2/3], [1/3, 2/3]])
    >>> accepted_length_survival(p, q, "block")           # 6/9, 5/9
    array([0.66666667, 0.55555556])
    >>> accepted_length_survival(p, q, "token")           # 6/9, (6/9)^2
    array([0.66666667, 0.44444444])
    """
    return _answer(*_survival(target_probs, draft_probs, verification, subset))


def expected_accepted_length(target_probs, draft_probs, verification: str = "block", *, subset: bool = False):
    r"""Exact expected number of accepted draft tokens ``E[τ]`` (bonus/correction token excluded).

    Parameters
    ----------
    target_probs, draft_probs
        Per-position laws ``(..., L, V)``: the target law ``p_k`` and the factorised drafter law
        ``q_k`` at position ``k`` (target first, as everywhere in otbound), taken as fixed
        whatever the drafted prefix (context-free per position). Either may instead be a list of
        ``L`` tensors, entry ``i`` of shape
        ``(..., V**i, V)``: the law at position ``i + 1`` after each prefix ``x_{1:i}`` (row-major
        order), i.e. an autoregressive model enumerated as a tree. Batch dimensions broadcast.
        torch tensors (float32/float64) keep autograd; numpy input gives numpy output.
    verification
        ``"token"``: speculative sampling token by token (Leviathan et al. 2211.17192, Chen et
        al. 2302.01318). ``"block"``: block verification (Sun et al. 2403.10444).
    subset
        If true, the last axis may be part of the vocabulary (rows summing to at most 1): the
        value is then the sum below over draft paths inside that part, a *lower bound* on the
        full-vocabulary value (all path terms are non-negative), e.g. for a target stored as its
        top-m tokens.

    Returns
    -------
    ``E[τ]`` with the batch shape, differentiable in both laws (piecewise: ``min`` has a kink
    where two terms tie; autograd then splits the gradient).

    Formulas (derived here and checked against brute-force enumeration of each verifier in the
    tests; ``r_m = p(x_m | x_{<m}) / q(x_m | x_{<m})``):

    * token: ``P(τ ≥ i) = Σ_{x_{1:i}} Π_{m≤i} min(q(x_m|x_{<m}), p(x_m|x_{<m}))``, which for
      context-free laws factorises to ``Π_{m≤i} (1 − TV(p_m, q_m))``; so
      ``E[τ] = Σ_{i=1..L} Π_{m≤i} Σ_x min(p_m(x), q_m(x))`` — ``O(L V)``.
    * block: the verifier's weights ``p_i = min(1, p_{i−1} r_i)`` satisfy
      ``P(τ ≥ i | X_{1:i}) = p_i`` (backward induction: with ``D = Σ_x (p_i p(x) − q(x))_+`` and
      ``h_i = D / (D + 1 − p_i)``, ``h_i + (1 − h_i) E[p_{i+1}] = h_i + (1 − h_i)(p_i − D) = p_i``),
      and ``p_i = min_{0≤j≤i} Π_{m=j+1..i} r_m``, hence

          P(τ ≥ i) = Σ_{x_{1:i}} min_{0≤j≤i} q(x_{1:j}) · p(x_{j+1:i} | x_{1:j}).

      Computed as ``W_i = W_{i−1} q_i``, ``M_i = min(W_i, M_{i−1} p_i)``, ``P(τ ≥ i) = Σ M_i``
      (no division, so zeros are safe) — ``O(V**L)`` paths; at most :data:`MAX_PATHS` entries.
      Keeping only ``j ∈ {0, i}`` in the min gives the per-level bound
      ``Σ min(q(x_{1:i}), p(x_{1:i}))``, so token ≤ block ≤ per-level; for one draft block the
      block value equals the causal (lossless-verifier) bound ``U_causal`` of docs/theory/block-bounds.md.

    Tolerances: each row must sum to 1 within :func:`law_tolerance` (1e-6 in float64); laws are
    not renormalised, so gradients are the plain partial derivatives of the formula.

    Raises
    ------
    otbound.InvalidInputError
        On an unknown ``verification``; laws that are not finite, negative, or do not sum to 1 within
        the tolerance (at most 1 with ``subset=True``); mismatched shapes; an enumeration larger than
        :data:`MAX_PATHS`.

    References
    ----------
    Sun et al., "Block verification accelerates speculative decoding", arXiv 2403.10444. Leviathan,
    Kalman, Matias, arXiv 2211.17192. Derivation: ``docs/theory/drafter-objectives.md``.

    Examples
    --------
    Sun et al.'s toy: block verification accepts 11/9 tokens, token verification 10/9.

    >>> import torch
    >>> from otbound.objectives import expected_accepted_length
    >>> q = torch.tensor([[2/3, 1/3], [2/3, 1/3]], dtype=torch.float64, requires_grad=True)
    >>> p = torch.tensor([[1/3, 2/3], [1/3, 2/3]], dtype=torch.float64)
    >>> block = expected_accepted_length(p, q, "block")
    >>> round(9 * block.item(), 9), round(9 * expected_accepted_length(p, q, "token").item(), 9)
    (11.0, 10.0)
    >>> block.backward()            # differentiable in the draft laws
    >>> q.grad.shape
    torch.Size([2, 2])
    >>> expected_accepted_length(p.numpy(), q.detach().numpy())   # numpy in, numpy out
    1.222...
    """
    surv, numpy_in = _survival(target_probs, draft_probs, verification, subset)
    return _answer(surv.sum(-1), numpy_in)


def conditional_accepted_length(target_probs, draft_probs, draft_tokens, verification: str = "block"):
    r"""``E[τ | X_{1:L−1}]`` from one drafted block: the Rao–Blackwellised estimate of ``E[τ]`` for
    a factorised drafter and a target that may depend on the drafted prefix (a real LM).

    Parameters
    ----------
    target_probs
        ``(..., L, V)`` the target's laws *along the draft*: ``p_i = p(· | context, X_{<i})``
        (one target forward over the drafted tokens gives all of them).
    draft_probs
        ``(..., L, V)`` the drafter's per-position laws ``q_i``.
    draft_tokens
        ``(..., L)`` integer tensor, the drafted block ``X ~ q`` (``q_i(X_i) > 0``); ``X_L`` is
        integrated out, not used.

    With ``r_j = p_j(X_j) / q_j(X_j)``, the value is ``Σ_{i=1..L} E[1{τ ≥ i} | X_{<i}]``:

    * token: ``Π_{j<i} min(1, r_j) · Σ_v min(q_i(v), p_i(v))``;
    * block: ``Σ_v min(q_i(v), s_{i−1} p_i(v))`` with ``s_0 = 1``, ``s_i = min(1, s_{i−1} r_i)``
      (Sun et al. 2403.10444: ``P(τ ≥ i | X_{1:i}) = s_i``, see :func:`expected_accepted_length`).

    Its mean over ``X ~ q`` is exactly :func:`expected_accepted_length` with the target as a tree
    (tested by enumeration), with lower variance than the verifier's own ``τ``; the block value is
    at least the token value for every ``X``. Same input checks and tolerances.

    Returns
    -------
    torch.Tensor, numpy.ndarray or float
        ``E[τ | X_{<L}]`` with the batch shape (numpy / float for non-torch input).

    Raises
    ------
    otbound.InvalidInputError
        As :func:`expected_accepted_length`, and if ``draft_tokens`` has the wrong shape or dtype,
        lies outside the vocabulary or holds a token the drafter gives probability 0.

    Examples
    --------
    With context-free laws, the mean over the drafted block is the exact value (11/9 here).

    >>> import numpy as np
    >>> from otbound.objectives import conditional_accepted_length
    >>> q = np.array([[2/3, 1/3], [2/3, 1/3]]); p = np.array([[1/3, 2/3], [1/3, 2/3]])
    >>> values = {(a, b): conditional_accepted_length(p, q, np.array([a, b])) for a in (0, 1) for b in (0, 1)}
    >>> round(values[0, 1], 6), round(values[1, 0], 6)
    (1.166667, 1.333333)
    >>> round(9 * float(sum(q[0, a] * q[1, b] * v for (a, b), v in values.items())), 9)
    11.0
    """
    check_verification(verification)
    numpy_in = not isinstance(draft_probs, torch.Tensor)
    q = as_torch_law(draft_probs, "draft_probs", min_ndim=2)
    p = as_torch_law(target_probs, "target_probs", min_ndim=2).to(q.dtype)
    if q.shape != p.shape:
        raise InvalidInputError(
            f"draft_probs and target_probs must have the same shape, got {tuple(q.shape)} and {tuple(p.shape)}"
        )
    x = torch.as_tensor(draft_tokens, device=q.device)
    if x.is_floating_point() or tuple(x.shape) != tuple(q.shape[:-1]):
        raise InvalidInputError(
            f"draft_tokens must be an integer array of shape {tuple(q.shape[:-1])}, got {x.dtype} {tuple(x.shape)}"
        )
    x = x.long()
    if bool(((x < 0) | (x >= q.shape[-1])).any()):
        raise InvalidInputError(f"draft_tokens must lie in [0, V={q.shape[-1]})")
    if bool((q.detach().gather(-1, x.unsqueeze(-1)) <= 0).any()):
        raise InvalidInputError(
            "draft_tokens holds a token the drafter gives probability 0: it cannot have been drafted"
        )
    return _answer(conditional_survival(q, p, x, verification).sum(-1), numpy_in)


def position_weighted_ce(draft_logits, target, gamma: float = 0.0) -> torch.Tensor:
    """Position-weighted cross-entropy ``Σ_{k=1..L} w_k CE_k / Σ_k w_k``, ``w_k = exp(−γ k)``.

    ``CE_k = −log q_k(y_k)`` for target ids, ``−Σ_x p_k(x) log q_k(x)`` for target laws; ``γ = 0``
    is the mean per-position CE.

    Parameters
    ----------
    draft_logits : torch.Tensor, shape (..., L, V)
        The drafter's logits.
    target : torch.Tensor
        Target ids ``(..., L)`` (integer) or target laws ``(..., L, V)`` (float).
    gamma : float
        γ ≥ 0, the decay of the position weights.

    Returns
    -------
    torch.Tensor, shape (...)

    Raises
    ------
    otbound.InvalidInputError
        On non-finite logits, ids outside the vocabulary, laws that are not laws, or mismatched shapes.

    References
    ----------
    Whalen, Ito, Sakamoto, "Teaching Diffusion to Speculate Left-to-Right", arXiv 2606.11552.

    Examples
    --------
    >>> import torch
    >>> from otbound.objectives import position_weighted_ce
    >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])      # L = 2, V = 3
    >>> ids = torch.tensor([0, 2])
    >>> position_weighted_ce(logits, ids), position_weighted_ce(logits, ids, gamma=0.5)
    (tensor(0.8606), tensor(0.6915))
    """
    return weighted_ce(*checked(draft_logits, target), gamma)


def first_error_focal(draft_logits, target, focal_gamma: float = 0.0) -> torch.Tensor:
    """First-error term: ``(1 − q_{k*}(y_{k*}))^β · CE_{k*}`` at the first position ``k*`` where
    ``argmax q_k ≠ y_k`` (``y`` = target ids, or the target laws' argmax), 0 if there is none.

    ``k*`` is piecewise constant (no gradient flows through the argmax); ``β = focal_gamma``
    (0: plain CE at the first error).

    Parameters
    ----------
    draft_logits, target : torch.Tensor
        As in :func:`position_weighted_ce` (logits ``(..., L, V)``; target ids ``(..., L)`` or laws
        ``(..., L, V)``), refused as it refuses them.
    focal_gamma : float
        β ≥ 0 (Lin et al. 1708.02002's focal exponent).

    Returns
    -------
    torch.Tensor, shape (...)

    References
    ----------
    Whalen, Ito, Sakamoto, arXiv 2606.11552; Lin, Goyal, Girshick, He, Dollár, "Focal loss for
    dense object detection", arXiv 1708.02002.

    Examples
    --------
    The drafter's argmax is right at position 1 and wrong at position 2 (k* = 2):

    >>> import torch
    >>> from otbound.objectives import first_error_focal
    >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    >>> ids = torch.tensor([0, 2])
    >>> first_error_focal(logits, ids), first_error_focal(logits, ids, focal_gamma=2.0)
    (tensor(1.5514), tensor(0.9635))
    """
    return focal(*checked(draft_logits, target), focal_gamma)


def chain_term(draft_logits, target) -> torch.Tensor:
    """Chain term ``Σ_{k=1..L} Π_{j≤k} a_j`` (to be maximised), ``a_j = q_j(y_j)`` for target ids,
    ``⟨p_j, q_j⟩`` for target laws. Equals :func:`expected_accepted_length` (token or block) for a
    one-hot target; see the module docstring for what it is otherwise.

    Parameters
    ----------
    draft_logits, target : torch.Tensor
        As in :func:`position_weighted_ce` (logits ``(..., L, V)``; target ids ``(..., L)`` or laws
        ``(..., L, V)``), refused as it refuses them.

    Returns
    -------
    torch.Tensor, shape (...)

    References
    ----------
    Whalen, Ito, Sakamoto, arXiv 2606.11552.

    Examples
    --------
    >>> import torch
    >>> from otbound.objectives import chain_term, expected_accepted_length
    >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    >>> ids = torch.tensor([0, 2])
    >>> chain_term(logits, ids)                  # q_1(0) + q_1(0) q_2(2)
    tensor(1.0226)
    >>> one_hot = torch.nn.functional.one_hot(ids, 3).double()
    >>> round(expected_accepted_length(torch.softmax(logits.double(), -1), one_hot, "token").item(), 4)
    1.0226
    """
    return chain(*checked(draft_logits, target))


@dataclass(frozen=True)
class LossTerms:
    """Batch-mean terms of a :class:`DrafterObjective` (``total`` is what is minimised).

    Examples
    --------
    >>> import torch
    >>> from otbound.objectives import DrafterObjective
    >>> terms = DrafterObjective("baseline CE")(torch.zeros(2, 3), torch.tensor([0, 1]))
    >>> round(terms.total.item(), 4), round(terms.ce.item(), 4), terms.exact.item()
    (1.0986, 1.0986, 0.0)
    """

    total: torch.Tensor
    ce: torch.Tensor
    focal: torch.Tensor
    chain: torch.Tensor
    exact: torch.Tensor


@dataclass(frozen=True)
class DrafterObjective:
    """A weighted sum of the terms above, minimised:

        total = ce_weight · CE_γ + focal · F − chain · C / L − exact · E[τ] / L

    with ``CE_γ`` = :func:`position_weighted_ce` (``gamma``), ``F`` = :func:`first_error_focal`,
    ``C`` = :func:`chain_term` and ``E[τ]`` = :func:`expected_accepted_length` under
    ``verification`` (``C / L`` and ``E[τ] / L`` are accepted fractions, on CE's scale).
    Calling it on a batch returns the :class:`LossTerms`.

    Parameters
    ----------
    name : str
        Label of the objective (ablation tables).
    ce_weight, gamma, focal, focal_gamma, chain, exact : float
        The weights and parameters above.
    verification : {"token", "block"}
        The verification of the exact term.

    References
    ----------
    Whalen, Ito, Sakamoto, arXiv 2606.11552 (the interventions); ``docs/theory/drafter-objectives.md``.

    Examples
    --------
    >>> import torch
    >>> from otbound.objectives import DrafterObjective
    >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]], dtype=torch.float64)   # (L, V)
    >>> ids = torch.tensor([0, 2])
    >>> target = torch.softmax(torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]), -1).double()
    >>> terms = DrafterObjective("demo", gamma=0.5, focal=1.0, exact=1.0)(logits, ids, target)
    >>> [round(float(t), 4) for t in (terms.total, terms.ce, terms.focal, terms.exact)]
    [1.6156, 0.6915, 1.5514, 1.2547]
    """

    name: str
    ce_weight: float = 1.0
    gamma: float = 0.0
    focal: float = 0.0
    focal_gamma: float = 0.0
    chain: float = 0.0
    exact: float = 0.0
    verification: str = "block"

    def __call__(
        self, draft_logits, target_ids=None, target_probs=None, *, subset: bool = False, exact_ids=None
    ) -> LossTerms:
        """Evaluate on a batch. ``target_ids`` ``(..., L)`` feed the CE, focal and chain terms
        (``target_probs`` ``(..., L, V)`` are used instead when ids are not given, i.e. soft
        labels); ``target_probs`` feed the exact term. ``subset=True``: the rows of
        ``target_probs`` may sum to less than 1 (the target's mass on the drafter's vocabulary
        axis). ``exact_ids`` ``(..., L, m)``: compute the exact term on those tokens only (e.g. the
        target's top-m) — the lower bound of :func:`expected_accepted_length` with ``subset=True``.
        """
        label = target_ids if target_ids is not None else target_probs
        if target_ids is None and subset and label is not None:
            label = target_probs / target_probs.sum(-1, keepdim=True)  # soft labels: renormalised
        zero = draft_logits.new_zeros(())
        length = draft_logits.shape[-2]
        needs_label = self.ce_weight or self.focal or self.chain
        # inputs checked and log-probabilities computed once for every term
        logq, t = (
            checked(draft_logits, label) if needs_label else (torch.log_softmax(check_logits(draft_logits), -1), None)
        )
        ce = weighted_ce(logq, t, self.gamma).mean() if self.ce_weight else zero
        first_error = focal(logq, t, self.focal_gamma).mean() if self.focal else zero
        chained = chain(logq, t).mean() if self.chain else zero
        exact = zero
        if self.exact:
            q, p = torch.softmax(draft_logits, -1), target_probs
            if exact_ids is not None:
                q, p = q.gather(-1, exact_ids), p.gather(-1, exact_ids)
            exact = expected_accepted_length(p, q, self.verification, subset=subset or exact_ids is not None).mean()
        total = (
            self.ce_weight * ce + self.focal * first_error - self.chain * chained / length - self.exact * exact / length
        )
        return LossTerms(total=total, ce=ce, focal=first_error, chain=chained, exact=exact)


#: The ablation of the drafter objectives (``docs/theory/drafter-objectives.md``), cumulative as in
#: the paper (baseline, +positional weighting, +first-error focal, +chain), then the exact objective
#: in place of the chain term, and the exact objective alone. ``γ = 0.5`` (weights ∝ 0.61, 0.37,
#: 0.22, 0.14 for L = 4) and unit weights are fixed a priori, not tuned on evaluation data.
ABLATION: tuple[DrafterObjective, ...] = (
    DrafterObjective("baseline CE"),
    DrafterObjective("+pos weighting", gamma=0.5),
    DrafterObjective("+first-error focal", gamma=0.5, focal=1.0),
    DrafterObjective("+chain", gamma=0.5, focal=1.0, chain=1.0),
    DrafterObjective("+exact (for chain)", gamma=0.5, focal=1.0, exact=1.0),
    DrafterObjective("exact only", ce_weight=0.0, exact=1.0),
)
