"""Exact expected accepted length E[τ] of a block draft, differentiable in the draft laws (torch).

Implementation of :func:`otbound.objectives.expected_accepted_length`; see that docstring for the
formulas and their derivation. Laws are given per level: level ``i`` (0-based, position ``i + 1``)
is a tensor ``(..., P_i, V)`` with ``P_i = V**i`` (one law per prefix ``x_{1:i}``, row-major order)
or ``P_i = 1`` (the same law after every prefix: context-free per position). Paths are enumerated
level by level, so the cost is ``O(V**L)`` per batch element for block verification (and for token
verification with a prefix-dependent law); token verification with context-free laws on both sides
is the ``O(L V)`` product of overlaps.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from otbound._validation import LAW_ATOL, InvalidInputError

VERIFICATIONS = ("token", "block")

#: Largest number of (batch element × draft path) entries a path enumeration may hold (about
#: 256 MB per float64 tensor); larger problems raise :class:`InvalidInputError` with advice.
MAX_PATHS = 1 << 25


def law_tolerance(dtype: torch.dtype, vocab_size: int) -> float:
    """Absolute tolerance on a law's row sum: ``LAW_ATOL`` (1e-6) in float64; in float32
    ``max(LAW_ATOL, 32 sqrt(V) eps_float32)`` (rounding of a softmax over ``V`` tokens).

    Parameters
    ----------
    dtype : torch.dtype
        float32 or float64.
    vocab_size : int
        V, the length of a row.

    Returns
    -------
    float

    Examples
    --------
    >>> import torch
    >>> from otbound.objectives import law_tolerance
    >>> law_tolerance(torch.float64, 10), round(law_tolerance(torch.float32, 151_936), 5)
    (1e-06, 0.00149)
    """
    if dtype == torch.float64:
        return LAW_ATOL
    return max(LAW_ATOL, 32.0 * math.sqrt(vocab_size) * torch.finfo(dtype).eps)


def check_verification(verification: str) -> str:
    if verification not in VERIFICATIONS:
        raise InvalidInputError(f"unknown verification {verification!r}; expected one of {VERIFICATIONS}")
    return verification


def as_torch_law(x, name: str, *, subset: bool = False, min_ndim: int = 1) -> torch.Tensor:
    """Return ``x`` as a float torch tensor of laws along the last axis, checked, NOT renormalised.

    Accepts torch tensors (float32/float64, kept as they are so autograd flows) and anything numpy
    converts (made float64). Checks: at least ``min_ndim`` dimensions, non-empty last axis, finite,
    non-negative, each row summing to 1 within :func:`law_tolerance` (``subset=True``: at most
    1 + tolerance, for laws restricted to part of the vocabulary).
    """
    if isinstance(x, torch.Tensor):
        t = x
        if t.dtype not in (torch.float32, torch.float64):
            raise InvalidInputError(
                f"{name} must be a float32 or float64 tensor, got {t.dtype} (upcast lower precision first)"
            )
    else:
        try:
            t = torch.from_numpy(np.array(x, dtype=np.float64))
        except (TypeError, ValueError) as err:
            raise InvalidInputError(f"{name} must be an array of probabilities: {err}") from None
    if t.ndim < min_ndim:
        raise InvalidInputError(f"{name} must have at least {min_ndim} dimensions, got shape {tuple(t.shape)}")
    if t.shape[-1] == 0:
        raise InvalidInputError(f"{name} has an empty vocabulary axis (shape {tuple(t.shape)})")
    with torch.no_grad():
        d = t.detach()
        finite = torch.isfinite(d)
        if not bool(finite.all()):
            bad = tuple(int(i) for i in torch.nonzero(~finite)[0])
            raise InvalidInputError(f"{name} has a NaN or infinite entry at index {bad}")
        if bool((d < 0).any()):
            bad = tuple(int(i) for i in torch.nonzero(d < 0)[0])
            raise InvalidInputError(f"{name} has a negative entry {float(d[bad])!r} at index {bad}")
        if d.numel():
            tol = law_tolerance(d.dtype, d.shape[-1])
            s = d.sum(dim=-1)
            err = (s - 1.0) if subset else (s - 1.0).abs()
            worst = int(torch.argmax(err.reshape(-1)))
            if float(err.reshape(-1)[worst]) > tol:
                row = tuple(int(i) for i in np.unravel_index(worst, tuple(s.shape)))
                what = "sums to more than 1" if subset else "does not sum to 1"
                raise InvalidInputError(
                    f"{name} {what} (row {row} sums to {float(s.reshape(-1)[worst]):.9g}; tolerance {tol:.3g})"
                )
    return t


def _levels(x, name: str, subset: bool) -> tuple[list[torch.Tensor], bool]:
    """Split a per-position tensor ``(..., L, V)`` or a sequence of ``L`` level tensors into levels
    ``(..., P_i, V)``; also say whether the input was per-position (context-free)."""
    if isinstance(x, (list, tuple)):
        if len(x) == 0:
            raise InvalidInputError(f"{name} is an empty list of levels; need one law tensor per position")
        levels = [as_torch_law(lv, f"{name}[{i}]", subset=subset, min_ndim=2) for i, lv in enumerate(x)]
        vocab = levels[0].shape[-1]
        for i, lv in enumerate(levels):
            if lv.shape[-1] != vocab:
                raise InvalidInputError(
                    f"{name}[{i}] has vocabulary size {lv.shape[-1]}, but {name}[0] has {vocab}"
                )
            if lv.shape[-2] not in (1, vocab**i):
                raise InvalidInputError(
                    f"{name}[{i}] must have shape (..., {vocab ** i}, {vocab}) (one law per prefix of "
                    f"length {i}) or (..., 1, {vocab}); got {tuple(lv.shape)}"
                )
        return levels, False
    t = as_torch_law(x, name, subset=subset, min_ndim=2)
    return [t[..., i : i + 1, :] for i in range(t.shape[-2])], True


def prepare(draft, target, verification: str, subset: bool):
    """Validate and return ``(draft_levels, target_levels, context_free)``."""
    check_verification(verification)
    q, q_cf = _levels(draft, "draft_probs", subset)
    p, p_cf = _levels(target, "target_probs", subset)
    if len(q) != len(p):
        raise InvalidInputError(f"draft_probs has {len(q)} positions but target_probs has {len(p)}")
    if q[0].shape[-1] != p[0].shape[-1]:
        raise InvalidInputError(
            f"draft_probs and target_probs have different vocabulary sizes {q[0].shape[-1]} and {p[0].shape[-1]}"
        )
    try:
        batch = torch.broadcast_shapes(*(t.shape[:-2] for t in q + p))
    except RuntimeError:
        raise InvalidInputError(
            "batch shapes of draft_probs and target_probs do not broadcast: "
            f"{tuple(q[0].shape[:-2])} and {tuple(p[0].shape[:-2])}"
        ) from None
    dtype = torch.promote_types(q[0].dtype, p[0].dtype)
    if q[0].device != p[0].device:
        raise InvalidInputError(f"draft_probs is on {q[0].device} but target_probs on {p[0].device}")
    q = [t.to(dtype) for t in q]
    p = [t.to(dtype) for t in p]
    context_free = q_cf and p_cf
    if not (context_free and verification == "token"):
        vocab, length = q[0].shape[-1], len(q)
        paths = math.prod(batch) * vocab**length
        if paths > MAX_PATHS:
            raise InvalidInputError(
                f"exact enumeration needs {paths:,} (batch × V**L = {math.prod(batch)} × {vocab}**{length}) "
                f"path entries, above MAX_PATHS = {MAX_PATHS:,}: restrict each position to its top-m tokens "
                "(subset=True gives the resulting lower bound) or use smaller batches"
            )
    return q, p, context_free


def survival(q: list[torch.Tensor], p: list[torch.Tensor], verification: str, context_free: bool) -> torch.Tensor:
    """``P(τ ≥ i)`` for ``i = 1..L`` as a tensor ``(..., L)`` (laws already validated).

    token: path mass ``A_i = A_{i-1} · min(q_i, p_i)``;
    block: ``W_i = W_{i-1} q_i``, ``M_i = min(W_i, M_{i-1} p_i)`` (``W_0 = M_0 = 1``), so that
    ``M_i(x_{1:i}) = min_{0≤j≤i} q(x_{1:j}) p(x_{j+1:i} | x_{1:j})``; ``P(τ ≥ i) = Σ M_i``.
    """
    if verification == "token" and context_free:
        overlap = torch.stack([torch.minimum(a, b).sum(-1)[..., 0] for a, b in zip(q, p)], dim=-1)
        return torch.cumprod(overlap, dim=-1)
    out = []
    one = torch.ones((), dtype=q[0].dtype, device=q[0].device)
    w = m = one.reshape(1)  # (..., P) path masses; P = 1 for the empty prefix
    for qi, pi in zip(q, p):
        if verification == "token":
            m = (m.unsqueeze(-1) * torch.minimum(qi, pi)).flatten(-2)
        else:
            w_next = (w.unsqueeze(-1) * qi).flatten(-2)
            m = torch.minimum(w_next, (m.unsqueeze(-1) * pi).flatten(-2))
            w = w_next
        out.append(m.sum(-1))
    batch = torch.broadcast_shapes(*(t.shape for t in out))
    return torch.stack([t.expand(batch) for t in out], dim=-1)


def conditional_survival(q: torch.Tensor, p: torch.Tensor, x: torch.Tensor, verification: str) -> torch.Tensor:
    """``E[1{τ ≥ i} | X_{<i}]`` for ``i = 1..L`` from one drafted block ``x`` (laws validated).

    ``q (..., L, V)`` factorised draft laws, ``p (..., L, V)`` target laws along the draft
    (``p_i = p(· | context, x_{<i})``), ``x (..., L)`` drafted tokens (``x_L`` is integrated out).
    token: ``Π_{j<i} min(1, r_j) · Σ_v min(q_i(v), p_i(v))``; block: ``Σ_v min(q_i(v), s_{i−1} p_i(v))``
    with ``s_0 = 1``, ``s_i = min(1, s_{i−1} r_i)``; ``r_j = p_j(x_j) / q_j(x_j)``.
    """
    ratio = p.gather(-1, x.unsqueeze(-1)).squeeze(-1) / q.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    if verification == "token":
        kept = torch.cumprod(torch.clamp(ratio[..., :-1], max=1.0), dim=-1)
        before = torch.cat([torch.ones_like(ratio[..., :1]), kept], dim=-1)
        return before * torch.minimum(q, p).sum(-1)
    out = []
    s = torch.ones_like(ratio[..., 0])
    for i in range(q.shape[-2]):
        out.append(torch.minimum(q[..., i, :], s.unsqueeze(-1) * p[..., i, :]).sum(-1))
        s = torch.clamp(s * ratio[..., i], max=1.0)
    return torch.stack(out, dim=-1)
