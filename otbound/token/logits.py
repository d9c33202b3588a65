"""Sampling settings, applied in one place: next-token logits → the float64 laws every bound and
verifier reads. A bare temperature T means ``softmax(logits / T)``; a
:class:`otbound.SamplingParams` adds top-k, top-p, min-p and the repetition penalty with
transformers' semantics (:mod:`otbound.token._settings`).

Used by the traces of real models (:mod:`otbound.lm`, where it defines the law of a stored trace) and
by the synthetic target/draft pairs of the report (:func:`otbound.report.synthetic_pair`).
"""

from __future__ import annotations

import numpy as np

from otbound._validation import InvalidInputError
from otbound.token._settings import SamplingParams


def laws_from_logits(logits, temperature, context=None) -> np.ndarray:
    """Float64 laws along the last axis: ``softmax(logits / T)``, or the law of a
    :class:`otbound.SamplingParams`.

    ``p(x) = exp(z_x / T − m) / Σ_y exp(z_y / T − m)`` with ``m = max_y z_y / T`` (max-shifted;
    where ``z / T`` itself would overflow float64, a row is computed at a power-of-two scale, so a
    tiny T or a huge logit gives its exact law, never NaN); each row sums to 1 within
    ~1e-16·sqrt(V) float64 rounding. NaN, +inf and complex logits are refused. With settings, the
    steps of :meth:`otbound.SamplingParams.laws` (repetition penalty, temperature, top-k, top-p,
    min-p, transformers' order and semantics).

    Parameters
    ----------
    logits : array_like, shape (..., V)
        Next-token logits (any float dtype; computed in float64). ``-inf`` entries get probability 0.
    temperature : float or SamplingParams
        T > 0, or the model's full sampling settings.
    context : array_like of int, optional
        The context's token ids, read by a repetition penalty only
        (:meth:`otbound.SamplingParams.laws`).

    Returns
    -------
    numpy.ndarray
        float64 array of the same shape, laws along the last axis.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound import SamplingParams, laws_from_logits
    >>> laws_from_logits(np.log([0.5, 0.3, 0.2]), 1.0).round(3).tolist()
    [0.5, 0.3, 0.2]
    >>> laws_from_logits(np.log([0.5, 0.3, 0.2]), SamplingParams(top_p=0.6)).round(3).tolist()
    [0.625, 0.375, 0.0]
    """
    if isinstance(temperature, SamplingParams):
        return temperature.laws(logits, context)
    t = float(temperature)
    if not (np.isfinite(t) and t > 0):
        raise InvalidInputError(f"temperature must be finite and > 0, got {temperature!r}")
    return SamplingParams(t).laws(np.asarray(logits))  # numpy out, as documented, for torch input too
