"""Training losses for block drafters (torch): positional CE, first-error focal term, chain term.

Implementation of the losses documented in :mod:`otbound.objectives`. All take the drafter's
logits ``(..., L, V)`` and a target given either as token ids ``(..., L)`` (integer tensor) or as
per-position target laws ``(..., L, V)`` (float tensor), and return one value per block ``(...)``.
"""

from __future__ import annotations

import torch

from otbound._validation import InvalidInputError
from otbound.objectives._exact import as_torch_law


def check_logits(draft_logits) -> torch.Tensor:
    if not isinstance(draft_logits, torch.Tensor) or not draft_logits.is_floating_point():
        raise InvalidInputError(f"draft_logits must be a float torch tensor, got {type(draft_logits).__name__}")
    if draft_logits.ndim < 2 or draft_logits.shape[-1] == 0 or draft_logits.shape[-2] == 0:
        raise InvalidInputError(
            f"draft_logits must have shape (..., L, V) with L, V >= 1, got {tuple(draft_logits.shape)}"
        )
    if bool(torch.isnan(draft_logits.detach()).any()):
        raise InvalidInputError("draft_logits has a NaN entry")
    return draft_logits


def check_target(target, draft_logits: torch.Tensor) -> torch.Tensor:
    """Return the target as ids ``(..., L)`` (long) or laws ``(..., L, V)``, checked against the logits."""
    lv = tuple(draft_logits.shape[-2:])
    if isinstance(target, torch.Tensor) and not target.is_floating_point():
        if target.ndim < 1 or target.shape[-1] != lv[0]:
            raise InvalidInputError(f"target ids must have shape (..., L={lv[0]}), got {tuple(target.shape)}")
        if target.numel() and (int(target.min()) < 0 or int(target.max()) >= lv[1]):
            raise InvalidInputError(
                f"target ids must lie in [0, V={lv[1]}), got range [{int(target.min())}, {int(target.max())}]"
            )
        return target.long()
    t = as_torch_law(target, "target_probs", min_ndim=2)
    if tuple(t.shape[-2:]) != lv:
        raise InvalidInputError(f"target_probs must end in (L, V) = {lv} like draft_logits, got {tuple(t.shape)}")
    return t.to(device=draft_logits.device, dtype=draft_logits.dtype)


def per_position_ce(logq: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``CE_k = −log q_k(y_k)`` (ids) or ``−Σ_x p_k(x) log q_k(x)`` (laws), shape ``(..., L)``.

    With laws, terms with ``p_k(x) = 0`` contribute 0 even where ``q_k(x) = 0``."""
    if target.is_floating_point():
        return -torch.where(target > 0, target * logq, torch.zeros_like(logq)).sum(-1)
    return -logq.gather(-1, target.unsqueeze(-1)).squeeze(-1)


def label_ids(target: torch.Tensor) -> torch.Tensor:
    """Ids of the target's tokens: the ids themselves, or the target's argmax (greedy) token."""
    return target.argmax(-1) if target.is_floating_point() else target


def position_weights(length: int, gamma: float, like: torch.Tensor) -> torch.Tensor:
    k = torch.arange(1, length + 1, dtype=like.dtype, device=like.device)
    return torch.exp(-gamma * k)


def weighted_ce(logq: torch.Tensor, target: torch.Tensor, gamma: float) -> torch.Tensor:
    """``Σ_k w_k CE_k / Σ_k w_k`` from checked log-probabilities and target (no input checks)."""
    ce = per_position_ce(logq, target)
    w = position_weights(logq.shape[-2], float(gamma), ce)
    return (ce * w).sum(-1) / w.sum()


def first_error_index(draft_logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k*, has_error)``: the first position (0-based) where the drafter's argmax differs from the
    target token, and whether there is one (``k* = L − 1`` placeholder when there is none).

    Parameters
    ----------
    draft_logits : torch.Tensor, shape (..., L, V)
    target : torch.Tensor
        Target ids ``(..., L)`` or laws ``(..., L, V)`` (their argmax is the label).

    Returns
    -------
    tuple of torch.Tensor, each of shape (...)
        ``k*`` (int64) and ``has_error`` (bool).

    Examples
    --------
    >>> import torch
    >>> from otbound.objectives import first_error_index
    >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    >>> first_error_index(logits, torch.tensor([0, 2])), first_error_index(logits, torch.tensor([0, 1]))
    ((tensor(1), tensor(True)), (tensor(1), tensor(False)))
    """
    mismatch = draft_logits.argmax(-1) != label_ids(target)
    has_error = mismatch.any(-1)
    first = torch.where(
        has_error, mismatch.int().argmax(-1), torch.full_like(has_error, mismatch.shape[-1] - 1, dtype=torch.long)
    )
    return first, has_error


def focal(logq: torch.Tensor, target: torch.Tensor, focal_gamma: float) -> torch.Tensor:
    """The first-error term from checked log-probabilities and target (no input checks)."""
    ce = per_position_ce(logq, target)
    first, has_error = first_error_index(logq, target)  # argmax of log q = argmax of the logits
    ce_first = ce.gather(-1, first.unsqueeze(-1)).squeeze(-1)
    if focal_gamma:
        y = label_ids(target).gather(-1, first.unsqueeze(-1))
        q_y = logq.gather(-2, first[..., None, None].expand(*first.shape, 1, logq.shape[-1])).squeeze(-2)
        q_y = q_y.gather(-1, y).squeeze(-1).exp()
        ce_first = (1.0 - q_y).clamp_min(0.0) ** float(focal_gamma) * ce_first
    return torch.where(has_error, ce_first, torch.zeros_like(ce_first))


def chain(logq: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The chain term from checked log-probabilities and target (no input checks)."""
    q = logq.exp()
    a = (q * target).sum(-1) if target.is_floating_point() else q.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return torch.cumprod(a, dim=-1).sum(-1)


def checked(draft_logits, target) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log q, target)`` after the input checks shared by every loss."""
    z = check_logits(draft_logits)
    return torch.log_softmax(z, -1), check_target(target, z)
