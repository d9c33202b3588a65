"""Temperature, applied in one place: next-token logits → the float64 laws every bound and verifier
reads (theory.md §0: the temperature T applies to both the target and the draft model).

Used by the traces of real models (:mod:`otbound.lm`, where it defines the law of a stored trace) and
by the synthetic target/draft pairs of the report (:func:`otbound.report.synthetic_pair`).
"""

from __future__ import annotations

import numpy as np

from otbound._validation import InvalidInputError


def laws_from_logits(logits, temperature: float) -> np.ndarray:
    """Float64 laws ``softmax(logits / T)`` along the last axis.

    ``p(x) = exp(z_x / T − m) / Σ_y exp(z_y / T − m)`` with ``m = max_y z_y / T`` (max-shifted, so
    no overflow); each row sums to 1 within ~1e-16·sqrt(V) float64 rounding.

    Parameters
    ----------
    logits : array_like, shape (..., V)
        Next-token logits (any float dtype; computed in float64). ``-inf`` entries get probability 0.
    temperature : float
        T > 0.

    Returns
    -------
    numpy.ndarray
        float64 array of the same shape, laws along the last axis.
    """
    t = float(temperature)
    if not (np.isfinite(t) and t > 0):
        raise InvalidInputError(f"temperature must be finite and > 0, got {temperature!r}")
    x = np.asarray(logits, dtype=np.float64) / t
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x
