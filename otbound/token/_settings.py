"""Sampling settings applied in one place: a model's logits → the float64 law it samples from.

A deployed model does not sample from ``softmax(logits)``: it samples from the law left by its
sampling settings. :class:`SamplingParams` holds them and :meth:`SamplingParams.laws` applies them
with the semantics and the order of transformers' logits processors (``GenerationMixin.
_get_logits_processor``, ``min_tokens_to_keep = 1``)::

    z   = logits                                       (float64)
    z_i = z_i / r if z_i > 0 else z_i · r              for i in the context   (repetition penalty r)
    z   = z / T                                                                (temperature)
    z_i = −inf  unless z_i ≥ the k-th largest z                                (top-k; ties kept)
    z_i = −inf  for the ascending-sorted prefix whose softmax mass is ≤ 1 − top_p  (top-p; the
                largest token always kept)
    z_i = −inf  where softmax(z)_i < min_p · max softmax(z)                    (min-p)
    law = softmax(z)                                   (−inf → probability 0)

Every step matches transformers' ``RepetitionPenaltyLogitsProcessor``, ``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper`` and ``MinPLogitsWarper`` to 1e-12 in float64 (the
tests run transformers' own classes on random and tie-heavy logits). One rule is stated here
because transformers leaves it to the sort: when tokens of *equal* logit straddle the top-p cut,
transformers removes whichever of them ``torch.sort`` (unstable on CPU above 16 entries, different
on CUDA) happens to put first; here the tokens of **higher index are removed first** (ties favour
the lower index, as in deterministic drafting). Off such ties the two agree exactly.

The draft and the target each have their own settings; lossless always means the target's law
after its settings, and a verifier always reads the draft's law after the draft's settings
(:mod:`otbound.token.logits`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from otbound._backend import is_torch
from otbound._validation import InvalidInputError

_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def _is_number(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float, np.integer, np.floating))


@dataclass(frozen=True)
class SamplingParams:
    """The sampling settings of one model (transformers' ``generate`` semantics, applied in order
    repetition penalty → temperature → top-k → top-p → min-p, ``min_tokens_to_keep = 1``).

    Parameters
    ----------
    temperature : float
        T > 0, finite (greedy decoding is not a law: use deterministic drafting instead).
    top_k : int or None
        Keep the tokens whose logit is at least the k-th largest (ties at the k-th value are all
        kept, as transformers does); ``None`` disables it (transformers' ``top_k=0``).
    top_p : float or None
        Nucleus: 0 ≤ top_p ≤ 1; remove the smallest tokens while their cumulative mass stays
        ≤ 1 − top_p (the largest token always survives); ``None`` disables it.
    min_p : float or None
        0 ≤ min_p ≤ 1; remove the tokens of probability < min_p · (largest probability), after
        temperature; ``None`` disables it.
    repetition_penalty : float or None
        r > 0 (CTRL, Keskar et al. 1909.05858): every token of the context has its logit divided
        by r if positive, multiplied by r otherwise, before the temperature; ``None`` disables it.

    Raises
    ------
    InvalidInputError
        Naming the field whose value is out of range or of the wrong type.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound import SamplingParams
    >>> s = SamplingParams(temperature=0.7, top_k=2)
    >>> s.laws(np.log([0.5, 0.3, 0.2])).round(4).tolist()
    [0.6748, 0.3252, 0.0]
    >>> s.describe()
    'T=0.7, top-k=2'
    >>> SamplingParams(top_p=1.5)
    Traceback (most recent call last):
    ...
    otbound._validation.InvalidInputError: SamplingParams.top_p must lie in [0, 1] (None disables it), got 1.5

    References
    ----------
    transformers, ``generation/logits_process.py`` (the five processors named above) and
    ``GenerationMixin._get_logits_processor`` (their order). Holtzman et al. 1904.09751 (top-p);
    Nguyen et al. 2407.01082 (min-p); Keskar et al. 1909.05858 (repetition penalty).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None

    def __post_init__(self):
        t = self.temperature
        if not _is_number(t) or not (math.isfinite(float(t)) and float(t) > 0):
            raise InvalidInputError(
                f"SamplingParams.temperature must be a finite number > 0 (greedy is not a law), got {t!r}"
            )
        object.__setattr__(self, "temperature", float(t))
        k = self.top_k
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or int(k) < 1:
                raise InvalidInputError(f"SamplingParams.top_k must be an integer ≥ 1 (None disables it), got {k!r}")
            object.__setattr__(self, "top_k", int(k))
        for name in ("top_p", "min_p"):
            x = getattr(self, name)
            if x is not None:
                if not _is_number(x) or not (0.0 <= float(x) <= 1.0):
                    raise InvalidInputError(f"SamplingParams.{name} must lie in [0, 1] (None disables it), got {x!r}")
                object.__setattr__(self, name, float(x))
        r = self.repetition_penalty
        if r is not None:
            if not _is_number(r) or not (math.isfinite(float(r)) and float(r) > 0):
                raise InvalidInputError(
                    f"SamplingParams.repetition_penalty must be a finite number > 0 (None disables it), got {r!r}"
                )
            object.__setattr__(self, "repetition_penalty", float(r))

    # -- description ------------------------------------------------------------------------

    @property
    def truncates(self) -> bool:
        """Whether top-k, top-p or min-p can remove tokens (the law may have a smaller support)."""
        return self.top_k is not None or (self.top_p is not None and self.top_p < 1.0) or bool(self.min_p)

    @property
    def needs_context(self) -> bool:
        """Whether the law depends on the context's token ids (a repetition penalty other than 1)."""
        return self.repetition_penalty is not None and self.repetition_penalty != 1.0

    def as_dict(self) -> dict:
        """The five fields as a JSON-ready dict (what traces and caches store and are keyed by).

        Examples
        --------
        >>> SamplingParams(top_p=0.8).as_dict()
        {'temperature': 1.0, 'top_k': None, 'top_p': 0.8, 'min_p': None, 'repetition_penalty': None}
        """
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SamplingParams:
        """Inverse of :meth:`as_dict`; an unknown key is an error naming it.

        Examples
        --------
        >>> SamplingParams.from_dict({"temperature": 0.7, "top_k": 20})
        SamplingParams(temperature=0.7, top_k=20, top_p=None, min_p=None, repetition_penalty=None)
        """
        unknown = sorted(set(d) - set(_FIELDS))
        if unknown:
            raise InvalidInputError(f"unknown sampling setting(s) {unknown}; expected some of {list(_FIELDS)}")
        return cls(**d)

    def describe(self) -> str:
        """A one-line statement of the settings (the report headers print it).

        Examples
        --------
        >>> SamplingParams(0.7, top_k=20, top_p=0.8, repetition_penalty=1.05).describe()
        'T=0.7, top-k=20, top-p=0.8, repetition penalty=1.05'
        """
        parts = [f"T={self.temperature:g}"]
        if self.top_k is not None:
            parts.append(f"top-k={self.top_k}")
        if self.top_p is not None:
            parts.append(f"top-p={self.top_p:g}")
        if self.min_p is not None:
            parts.append(f"min-p={self.min_p:g}")
        if self.repetition_penalty is not None:
            parts.append(f"repetition penalty={self.repetition_penalty:g}")
        return ", ".join(parts)

    # -- the law ----------------------------------------------------------------------------

    def laws(self, logits, context=None):
        """The float64 law sampled from, along the last axis of ``logits``.

        Parameters
        ----------
        logits : array_like or torch.Tensor, shape (..., V)
            Next-token logits (any float dtype; computed in float64). ``-inf`` entries get
            probability 0.
        context : array_like or torch.Tensor of int, optional
            The token ids the repetition penalty reads: shape (n,) (one context for every row) or
            (..., n) with the leading shape of ``logits`` (one per row); ids ``< 0`` are padding
            (ignored), ids ``≥ V`` are ignored (as transformers does). Required when the penalty is
            set (≠ 1), ignored otherwise.

        Returns
        -------
        numpy.ndarray or torch.Tensor
            float64 laws of the same shape (a float64 tensor on the input's device for torch
            input); each row sums to 1 within float64 rounding.

        Raises
        ------
        InvalidInputError
            Empty vocabulary axis, NaN / +inf logits, a row of only ``-inf``, a missing or
            misshapen context.

        Examples
        --------
        >>> import numpy as np
        >>> s = SamplingParams(repetition_penalty=2.0)
        >>> s.laws(np.array([2.0, 2.0, -1.0]), context=[0]).round(4).tolist()
        [0.2595, 0.7054, 0.0351]
        """
        if is_torch(logits):
            return _laws_torch(self, logits, context)
        z = np.array(logits, dtype=np.float64)  # a copy: modified in place below
        _check_logits(z)
        v = z.shape[-1]
        if self.needs_context:
            z = np.where(_context_mask(context, z.shape, np.asarray), _penalise(z, self.repetition_penalty), z)
        if self.temperature != 1.0:
            z /= self.temperature
        if self.top_k is not None:
            k = min(self.top_k, v)
            kth = np.partition(z, v - k, axis=-1)[..., v - k : v - k + 1]
            z[z < kth] = -np.inf
        if self.top_p is not None:
            # ascending by logit, ties: the higher index first (so removed first)
            order = v - 1 - np.argsort(np.flip(z, -1), axis=-1, kind="stable")
            zs = np.take_along_axis(z, order, -1)
            cum = np.cumsum(_softmax(zs), axis=-1)
            remove = cum <= 1.0 - self.top_p
            remove[..., -1:] = False
            drop = np.zeros_like(remove)
            np.put_along_axis(drop, order, remove, -1)
            z[drop] = -np.inf
        if self.min_p is not None:
            probs = _softmax(z)
            drop = probs < self.min_p * probs.max(axis=-1, keepdims=True)
            z[drop] = -np.inf  # the largest token is never below min_p · itself
        return _softmax(z)


def _penalise(z, r):
    return np.where(z < 0, z * r, z / r)


def _softmax(z: np.ndarray) -> np.ndarray:
    m = z.max(axis=-1, keepdims=True)
    e = np.exp(z - m)
    return e / e.sum(axis=-1, keepdims=True)


def _check_logits(z) -> None:
    if z.ndim == 0 or z.shape[-1] == 0:
        raise InvalidInputError(f"logits must have a non-empty vocabulary axis, got shape {tuple(z.shape)}")
    bad = np.isnan(z) | (z == np.inf)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InvalidInputError(f"logits have a NaN or +inf entry at index {where}")
    dead = np.all(z == -np.inf, axis=-1)
    if np.any(dead):
        raise InvalidInputError(f"logits row {tuple(int(i) for i in np.argwhere(dead)[0])} is -inf everywhere: no law")


def _context_mask(context, shape, to_array) -> np.ndarray:
    """Boolean (..., V) mask of the tokens present in the context (numpy)."""
    if context is None:
        raise InvalidInputError("a repetition penalty needs the context's token ids: pass context=")
    ids = np.asarray(context.detach().cpu().numpy() if is_torch(context) else to_array(context))
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise InvalidInputError(f"context must hold integer token ids, got dtype {ids.dtype}")
    ids = ids.astype(np.int64)
    lead, v = shape[:-1], shape[-1]
    if ids.ndim == 1:
        ids = np.broadcast_to(ids, lead + ids.shape)
    elif ids.shape[:-1] != lead:
        raise InvalidInputError(
            f"context has shape {ids.shape}: give (n,) or the logits' leading shape {lead} + (n,)"
        )
    flat = ids.reshape(-1, ids.shape[-1]) if ids.size else np.zeros((int(np.prod(lead, dtype=np.int64)), 0), np.int64)
    mask = np.zeros((flat.shape[0], v + 1), dtype=bool)
    safe = np.where((flat < 0) | (flat >= v), v, flat)  # padding and out-of-vocabulary ids land in a dropped column
    mask[np.arange(flat.shape[0])[:, None], safe] = True
    return mask[:, :v].reshape(shape)


def _laws_torch(s: SamplingParams, logits, context):
    """:meth:`SamplingParams.laws` for torch input, on its device (the same steps, in float64)."""
    import torch

    z = logits.detach().to(torch.float64).clone()
    if z.ndim == 0 or z.shape[-1] == 0:
        raise InvalidInputError(f"logits must have a non-empty vocabulary axis, got shape {tuple(z.shape)}")
    if bool((torch.isnan(z) | (z == float("inf"))).any()):
        raise InvalidInputError("logits have a NaN or +inf entry")
    if bool((z == float("-inf")).all(dim=-1).any()):
        raise InvalidInputError("a logits row is -inf everywhere: no law")
    v = z.shape[-1]
    if s.needs_context:
        mask = torch.as_tensor(_context_mask(context, tuple(z.shape), np.asarray), device=z.device)
        r = s.repetition_penalty
        z = torch.where(mask, torch.where(z < 0, z * r, z / r), z)
    if s.temperature != 1.0:
        z = z / s.temperature
    neg = torch.tensor(float("-inf"), dtype=z.dtype, device=z.device)
    if s.top_k is not None:
        k = min(s.top_k, v)
        kth = torch.topk(z, k, dim=-1).values[..., -1:]
        z = torch.where(z < kth, neg, z)
    if s.top_p is not None:
        # ascending by logit, ties: the higher index first (a stable sort of the flipped row)
        order = v - 1 - torch.sort(torch.flip(z, (-1,)), dim=-1, stable=True).indices
        cum = torch.softmax(torch.gather(z, -1, order), dim=-1).cumsum(dim=-1)
        remove = cum <= 1.0 - s.top_p
        remove[..., -1:] = False
        drop = torch.zeros_like(remove).scatter(-1, order, remove)
        z = torch.where(drop, neg, z)
    if s.min_p is not None:
        probs = torch.softmax(z, dim=-1)
        z = torch.where(probs < s.min_p * probs.amax(dim=-1, keepdim=True), neg, z)
    return torch.softmax(z, dim=-1)


def as_sampling_params(settings, name: str = "settings") -> SamplingParams:
    """``settings`` as :class:`SamplingParams`: one already, a temperature (float), or a dict of
    fields; anything else is an error naming ``name``."""
    if isinstance(settings, SamplingParams):
        return settings
    if isinstance(settings, dict):
        return SamplingParams.from_dict(settings)
    if _is_number(settings):
        return SamplingParams(temperature=float(settings))
    raise InvalidInputError(f"{name} must be a SamplingParams, a temperature or a dict of settings, got {settings!r}")


def settings_at(temperature, target=None, draft=None) -> tuple[SamplingParams, SamplingParams]:
    """The target's and the draft's :class:`SamplingParams` at target temperature ``temperature``.

    ``target``: the target's other fields (a dict of ``top_k``, ``top_p``, ``min_p``,
    ``repetition_penalty``; ``None`` entries unset). ``draft``: the draft's own values (any field,
    ``temperature`` included); every field it leaves ``None`` or absent is the target's — the draft
    samples with the target's settings unless told otherwise.

    Examples
    --------
    >>> t, d = settings_at(0.7, {"top_k": 20, "top_p": 0.8}, {"temperature": 0.9})
    >>> t.describe(), d.describe()
    ('T=0.7, top-k=20, top-p=0.8', 'T=0.9, top-k=20, top-p=0.8')
    """
    fields = {k: v for k, v in (target or {}).items() if v is not None}
    if "temperature" in fields:
        raise InvalidInputError("settings_at: give the target's temperature as its own argument, not in target")
    tgt = SamplingParams.from_dict({**fields, "temperature": float(temperature)})
    over = {k: v for k, v in (draft or {}).items() if v is not None}
    return tgt, SamplingParams.from_dict({**tgt.as_dict(), **over})


def describe_settings(temperatures, target=None, draft=None) -> tuple[str, str]:
    """One line each for a report header: the target's and the draft's settings over the
    temperatures of a run (``T ∈ {…}`` where they follow the target's temperature).

    Examples
    --------
    >>> describe_settings([0.7, 1.0], {"top_p": 0.8}, {"temperature": 0.9})
    ('T ∈ {0.7, 1}, top-p=0.8', 'T=0.9, top-p=0.8')
    """
    temps = [float(t) for t in temperatures]
    pairs = [settings_at(t, target, draft) for t in temps]
    tset = "T ∈ {" + ", ".join(f"{t:g}" for t in temps) + "}" if len(temps) > 1 else f"T={temps[0]:g}"

    def line(settings):
        texts = [s.describe() for s in settings]
        if len(set(texts)) == 1:
            return texts[0]
        rest = texts[0].split(", ", 1)[1:]  # the fields after the temperature, the same for every T
        return ", ".join([tset] + rest)

    return line([t for t, _ in pairs]), line([d for _, d in pairs])
