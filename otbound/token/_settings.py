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
                largest token always kept; ties: the lower index first)
    z_i = −inf  where softmax(z)_i < min_p · max softmax(z)                    (min-p)
    law = softmax(z)                                   (−inf → probability 0)

Every step matches transformers' ``RepetitionPenaltyLogitsProcessor``, ``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper`` and ``MinPLogitsWarper`` to 1e-12 in float64 (the
tests run transformers' own classes on random and tie-heavy logits). Three rules are stated here
because transformers leaves them to rounding or to its sort, and numpy and torch (CPU or CUDA)
apply each identically:

* **Masses on a cut.** The comparisons ``≤ 1 − top_p`` (top-p) and ``< min_p · max`` (min-p)
  are those of exact arithmetic, with masses within a relative :data:`CUT_RTOL` ``= 1e-9`` of the
  cut counted as equal to it: such a token is removed at top-p (``≤``) and kept at min-p (``<``).
  Two libraries' float64 softmax and cumsum differ by rounding (≲ 1e-11 relative), so without
  the tolerance a token exactly on a cut (``log([1, 2, 3] / 6)`` at min_p = 2/3; four masses
  1/2, 1/4, 1/8, 1/8 at top_p = 0.75 are exact in binary and need none) lands on either side.
  Where a cut lands exactly in binary, transformers agrees bit for bit; at decimal settings
  (top_p = 0.8 is not 4/5 in binary) transformers' side is its rounding's.
* **Ties straddling the top-p cut.** The sort is stable ascending: of equal logits the **lower
  index is removed first** (the higher kept) — what transformers' ``torch.sort`` does whenever it
  is stable (CPU, V ≤ 16); above that transformers' sort is unstable and its choice arbitrary.
* **Overflow.** Where ``z · r`` or ``z / T`` would overflow float64 (a temperature of 1e-310, a
  logit of 1e308 at T = 0.5, a penalty of 1e308), the row is computed at a power-of-two scale
  (exact), so the law is the exact one — one-hot or uniform over the tied maxima in the limit,
  never NaN.

The draft and the target each have their own settings; lossless always means the target's law
after its settings, and a verifier always reads the draft's law after the draft's settings
(:mod:`otbound.token.logits`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from otbound._backend import is_torch
from otbound._validation import InvalidInputError, check_real

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
            Empty vocabulary axis, complex, NaN or +inf logits, a row of only ``-inf``, a missing
            or misshapen context.

        Examples
        --------
        >>> import numpy as np
        >>> s = SamplingParams(repetition_penalty=2.0)
        >>> s.laws(np.array([2.0, 2.0, -1.0]), context=[0]).round(4).tolist()
        [0.2595, 0.7054, 0.0351]
        >>> SamplingParams(temperature=1e-310).laws(np.array([-1.0, -2.0])).tolist()  # the greedy limit
        [1.0, 0.0]
        >>> SamplingParams(min_p=2 / 3).laws(np.log([1, 2, 3])).round(4).tolist()  # 2/6 is on the cut: kept
        [0.0, 0.4, 0.6]
        """
        return _apply(self, logits, context)


#: relative tolerance of the top-p and min-p cuts: a cumulative mass within a factor 1 ± CUT_RTOL of
#: 1 − top_p, or a probability within it of min_p · (largest probability), is *on* the cut. Far above
#: the float64 rounding that separates two array libraries' softmax and cumsum (a sum of n positive
#: terms is exact to a relative n·2⁻⁵³ ≈ 1.7e-11 at n = 151,936), so numpy and torch, CPU and CUDA,
#: decide every cut alike; far below any setting's resolution.
CUT_RTOL = 1e-9

#: processed logits are kept below 2**_SCALE_EXP in magnitude (so a difference of two stays finite)
_SCALE_EXP = 1021


class _Numpy:
    """The array operations of :func:`_apply` in numpy (a twin of :class:`_Torch`)."""

    neg_inf = -np.inf

    def __init__(self, logits):
        self.logits = logits

    def float64(self):
        return np.array(check_real(self.logits, "logits"), dtype=np.float64)  # a copy: modified below

    @staticmethod
    def to_numpy(x):
        return x

    @staticmethod
    def from_numpy(x, like):
        return x

    @staticmethod
    def amax(x):
        return x.max(axis=-1, keepdims=True)

    @staticmethod
    def kth_largest(x, k):
        v = x.shape[-1]
        return np.partition(x, v - k, axis=-1)[..., v - k : v - k + 1]

    @staticmethod
    def ascending(x):
        return np.argsort(x, axis=-1, kind="stable")  # ties: the lower index first

    @staticmethod
    def take(x, idx):
        return np.take_along_axis(x, idx, -1)

    @staticmethod
    def unsort(idx, values):
        out = np.zeros_like(values)
        np.put_along_axis(out, idx, values, -1)
        return out

    @staticmethod
    def exponent(x):
        return np.frexp(x)[1]


class _Torch:
    """The array operations of :func:`_apply` in torch, on the input's device."""

    neg_inf = -math.inf

    def __init__(self, logits):
        import torch

        self.torch, self.logits = torch, logits

    def float64(self):
        return check_real(self.logits, "logits").detach().to(self.torch.float64).clone()

    @staticmethod
    def to_numpy(x):
        return x.cpu().numpy()

    def from_numpy(self, x, like):
        return self.torch.as_tensor(x, device=like.device)

    @staticmethod
    def amax(x):
        return x.amax(dim=-1, keepdim=True)

    def kth_largest(self, x, k):
        return self.torch.topk(x, k, dim=-1).values[..., -1:]

    def ascending(self, x):
        return self.torch.sort(x, dim=-1, stable=True).indices  # ties: the lower index first

    def take(self, x, idx):
        return self.torch.gather(x, -1, idx)

    def unsort(self, idx, values):
        return self.torch.zeros_like(values).scatter(-1, idx, values)

    def exponent(self, x):
        return self.torch.frexp(x)[1]


def _apply(s: SamplingParams, logits, context):
    """:meth:`SamplingParams.laws` on numpy or torch input: the same steps with the same float64
    operations in both libraries (so the two agree to rounding, and every cut alike, see
    :data:`CUT_RTOL`)."""
    ops = _Torch(logits) if is_torch(logits) else _Numpy(logits)
    z = ops.float64()  # a private copy
    top = _check_logits(z, ops)  # (…, 1) the rows' largest logits
    v = z.shape[-1]
    mask = None
    if s.needs_context:
        mask = ops.from_numpy(_context_mask(context, tuple(z.shape), np.asarray), z)
    with np.errstate(over="ignore", under="ignore"):
        a = _scaled(s, z, mask, None)  # without a penalty, z itself divided in place
        # the rows' largest processed logit: division by T > 0 keeps the order (also when rounded)
        a_top = top / s.temperature if mask is None else ops.amax(a)
        scale = _overflow_scale(s, a, a_top, ops)
        if scale is not None:  # rows whose processed logits overflow: computed at a power-of-two scale
            a = _scaled(s, ops.float64(), mask, scale)
        if s.top_k is not None:
            kth = ops.kth_largest(a, min(s.top_k, v))
            a = _where(a < kth, ops.neg_inf, a)
        if s.top_p is not None:
            order = ops.ascending(a)
            cum = _softmax(ops.take(a, order), scale, inplace=True).cumsum(-1)
            remove = cum <= (1.0 - s.top_p) * (1.0 + CUT_RTOL)
            remove[..., -1:] = False  # the largest token always stays
            a = _where(ops.unsort(order, remove), ops.neg_inf, a)
        if s.min_p is not None:
            ratio = _numerators(a, scale)  # p / max p, exactly 1 at the largest token
            a = _where(ratio < s.min_p * (1.0 - CUT_RTOL), ops.neg_inf, a)
        return _softmax(a, scale, inplace=True)  # a is this call's own array


def _where(cond, value, x):
    """``x`` with the scalar ``value`` where ``cond`` (numpy or torch)."""
    if isinstance(x, np.ndarray):
        return np.where(cond, value, x)
    return x.masked_fill(cond, value)


def _select(cond, x, y):
    """``x`` where ``cond``, else ``y`` (numpy or torch)."""
    if isinstance(x, np.ndarray):
        return np.where(cond, x, y)
    import torch

    return torch.where(cond, x, y)


def _scaled(s: SamplingParams, z, mask, scale):
    """The logits after the repetition penalty and the temperature — transformers' ``z·r`` or
    ``z/r``, then ``/T`` — or, where ``scale = (k1, k2)`` (…, 1) is given, the same divided by
    ``2**(k1 + k2)``: by ``2**k1`` before the penalty and ``2**k2`` before the temperature (exact
    powers of two, applied where the values are largest, so that the entries that matter keep
    their precision). Without a penalty or a scale ``z`` (a private copy) is divided in place."""
    if scale is not None:
        z = _times_pow2(z, -scale[0])
    if mask is not None:
        r = s.repetition_penalty
        z = _select(mask, _select(z < 0, z * r, z / r), z)
    if scale is not None:
        z = _times_pow2(z, -scale[1])
    if s.temperature != 1.0:
        z /= s.temperature
    return z


def _overflow_scale(s: SamplingParams, a, a_top, ops):
    """``None`` when the processed logits ``a`` are safe — every row's largest ``a_top`` finite and
    above −2**1022, and no ``z·r`` overflowed before a division by T > 1, so any entry overflowed
    to −inf is truly below the largest by more than 2**1022 and has probability exactly 0 — else
    the powers of two ``(k1, k2)`` (…, 1) of :func:`_scaled` that keep each row's processed logits
    below ``2**_SCALE_EXP`` in magnitude (0 for the safe rows)."""
    safe = (a_top > -(2.0**1022)) & (a_top < math.inf)
    if s.needs_context and s.temperature > 1.0:
        # z·r overflowed before a division by T > 1 that could have brought it back in range
        z = ops.float64()
        safe = safe & ~((a == -math.inf) & (z > -math.inf)).any(-1, keepdims=True)
    if bool(safe.all()):
        return None
    z = ops.float64()
    finite = z > -math.inf
    e_z = ops.to_numpy(ops.amax(ops.exponent(_where(~finite, 0.0, z)))).astype(np.int64)  # |z| < 2**e_z
    e_c = 0
    if s.needs_context:
        r = s.repetition_penalty
        e_c = max(int(np.frexp(r)[1]), int(np.frexp(1.0 / r)[1]), 0)  # r, 1/r < 2**e_c
    e_t = int(np.frexp(s.temperature)[1])  # T ≥ 2**(e_t − 1)
    k1 = np.maximum(0, e_z + e_c - _SCALE_EXP)  # |z·c| / 2**k1 < 2**_SCALE_EXP
    k2 = np.maximum(0, e_z + e_c - k1 - e_t + 1 - _SCALE_EXP)  # and after /T as well
    unsafe = ~ops.to_numpy(safe)
    return ops.from_numpy(k1 * unsafe, z), ops.from_numpy(k2 * unsafe, z)


def _times_pow2(x, k):
    """``x · 2**k`` for integer ``k`` (…, 1), in steps of at most 2**±1000 (each an exact power of
    two, so the product is exact unless it under- or overflows; an overflow gives ±inf)."""
    k_np = k if isinstance(k, np.ndarray) else k.cpu().numpy()
    while np.any(k_np != 0):
        step = np.clip(k_np, -1000, 1000)
        factor = np.ldexp(1.0, step)
        x = x * (factor if isinstance(x, np.ndarray) else _like(factor, x))
        k_np = k_np - step
    return x


def _like(a: np.ndarray, x):
    import torch

    return torch.as_tensor(a, dtype=torch.float64, device=x.device)


def _numerators(a, scale, inplace=False):
    """``exp(a·2**scale − max)`` along the last axis: the softmax numerators, 1 at the largest entry
    (in ``a``'s own memory where ``inplace``, else a new array)."""
    if isinstance(a, np.ndarray):
        top = a.max(axis=-1, keepdims=True)
        d = np.subtract(a, top, out=a if inplace else None)
        if scale is not None:
            d = _times_pow2(d, scale[0] + scale[1])  # an entry overflowing to −inf has numerator exactly 0
        return np.exp(d, out=d)
    top = a.amax(dim=-1, keepdim=True)
    d = a.sub_(top) if inplace else a - top
    if scale is not None:
        d = _times_pow2(d, scale[0] + scale[1])
    return d.exp_()


def _softmax(a, scale=None, inplace=False):
    """The softmax along the last axis (of ``a·2**scale``; in ``a``'s own memory where ``inplace``)."""
    e = _numerators(a, scale, inplace)
    if isinstance(e, np.ndarray):
        e /= e.sum(-1, keepdims=True)
        return e
    return e.div_(e.sum(dim=-1, keepdim=True))


def _check_logits(z, ops):
    """The rows' largest logits (…, 1), after refusing an empty vocabulary, a NaN or +inf entry and
    a row of only −inf (one reduction: a row's max is NaN or +inf exactly when it holds one)."""
    if z.ndim == 0 or z.shape[-1] == 0:
        raise InvalidInputError(f"logits must have a non-empty vocabulary axis, got shape {tuple(z.shape)}")
    top = ops.amax(z)
    if not bool((top < math.inf).all()):
        bad = (z != z) | (z == math.inf)
        where = tuple(int(i) for i in np.argwhere(ops.to_numpy(bad))[0])
        raise InvalidInputError(f"logits have a NaN or +inf entry at index {where}")
    if bool((top == -math.inf).any()):
        dead = ops.to_numpy((top == -math.inf)[..., 0])
        raise InvalidInputError(f"logits row {tuple(int(i) for i in np.argwhere(np.atleast_1d(dead))[0])} is -inf "
                                "everywhere: no law")
    return top


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
