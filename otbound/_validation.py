"""Input checking shared by every public function.

Every bound and verifier takes probability vectors (the target law ``p`` and the draft law ``q``)
along the last axis. Bad input raises :class:`InvalidInputError` (a ``ValueError``) naming what is
wrong, never a silent wrong number.

Tolerance: a law must sum to 1 within ``LAW_ATOL = 1e-6`` (absolute, float64). Laws within the
tolerance are renormalised exactly so that bound arithmetic sees a law summing to 1.
"""

from __future__ import annotations

import numpy as np

LAW_ATOL = 1e-6


class InvalidInputError(ValueError):
    """Raised for malformed input: laws, shapes, draft counts, sampling names, settings.

    The message names what is wrong. A subclass of :class:`ValueError`.

    Examples
    --------
    >>> import otbound as ob
    >>> try:
    ...     ob.optimal_acceptance([0.5, 0.5], [0.5, 0.6], num_drafts=2)
    ... except ob.InvalidInputError as err:
    ...     print(err)
    q does not sum to 1 (row () sums to 1.1; tolerance 1e-06)
    >>> issubclass(ob.InvalidInputError, ValueError)
    True
    """


def check_real(x, name: str):
    """``x`` unchanged if it holds real numbers; an error naming ``name`` if its dtype is complex.

    A complex value is never a probability nor a logit: casting it to float64 would silently drop
    its imaginary part, so every public entry that takes laws or logits (numpy arrays, sequences
    or torch tensors) refuses it here, whatever the imaginary part.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound._validation import check_real
    >>> check_real([0.5, 0.5], "p")
    [0.5, 0.5]
    >>> check_real(np.array([0.5, 0.5]) + 0.1j, "p")
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: p must hold real numbers, got complex values (dtype complex128)
    """
    is_complex = getattr(x, "is_complex", None)  # a torch tensor, checked without importing torch
    if callable(is_complex) and hasattr(x, "detach"):
        if is_complex():
            raise InvalidInputError(f"{name} must hold real numbers, got complex values (dtype {x.dtype})")
        return x
    if np.iscomplexobj(x):
        raise InvalidInputError(f"{name} must hold real numbers, got complex values (dtype {np.asarray(x).dtype})")
    return x


def as_law(x, name: str = "p", *, ndim: int | None = None) -> np.ndarray:
    """Return ``x`` as a float64 array of laws along the last axis, checked and renormalised.

    Checks: real (:func:`check_real`), at least 1-D, non-empty last axis, finite, non-negative,
    each row summing to 1 within ``LAW_ATOL``. ``ndim`` (if given) demands an exact number of dimensions.

    Parameters
    ----------
    x : array_like
    name : str
        Named in the error.
    ndim : int, optional

    Returns
    -------
    numpy.ndarray
        Float64, each row divided by its sum.

    Raises
    ------
    otbound.InvalidInputError
        Naming the first failed check.

    Examples
    --------
    >>> from otbound._validation import as_law
    >>> as_law([0.2, 0.8000001])
    array([0.19999998, 0.80000002])
    >>> as_law([0.5, 0.6], "q")
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: q does not sum to 1 (row () sums to 1.1; tolerance 1e-06)
    """
    a = np.asarray(check_real(x, name), dtype=np.float64)
    if a.ndim == 0:
        raise InvalidInputError(f"{name} must be an array of probabilities, got a scalar")
    if ndim is not None and a.ndim != ndim:
        raise InvalidInputError(f"{name} must be {ndim}-D, got shape {a.shape}")
    if a.shape[-1] == 0:
        raise InvalidInputError(f"{name} has an empty vocabulary axis (shape {a.shape})")
    if not np.all(np.isfinite(a)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])  # Python ints: "(0,)", not "(np.int64(0),)"
        raise InvalidInputError(f"{name} has a NaN or infinite entry at index {bad}")
    if np.any(a < 0):
        bad = tuple(int(i) for i in np.argwhere(a < 0)[0])
        raise InvalidInputError(f"{name} has a negative entry {float(a[bad])!r} at index {bad}")
    s = a.sum(axis=-1, keepdims=True)
    err = np.abs(s - 1.0)
    if np.any(err > LAW_ATOL):
        idx = np.unravel_index(int(np.argmax(err)), err.shape)[:-1]
        raise InvalidInputError(
            f"{name} does not sum to 1 (row {idx} sums to {float(s[idx + (0,)]):.9g}; "
            f"tolerance {LAW_ATOL:g})"
        )
    return a / s


def as_pair(p, q) -> tuple[np.ndarray, np.ndarray]:
    """Check a target/draft pair: both laws (:func:`as_law`), identical shapes.

    Examples
    --------
    >>> from otbound._validation import as_pair
    >>> as_pair([0.5, 0.5], [1, 0])
    (array([0.5, 0.5]), array([1., 0.]))
    >>> as_pair([0.5, 0.5], [1, 0, 0])
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: p and q must have the same shape, got (2,) and (3,)
    """
    p = as_law(p, "p")
    q = as_law(q, "q")
    if p.shape != q.shape:
        raise InvalidInputError(f"p and q must have the same shape, got {p.shape} and {q.shape}")
    return p, q


def check_positive_int(value, name: str) -> int:
    """``value`` as an ``int`` if it is an integer (not a bool) ≥ 1, else an error naming ``name``.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound._validation import check_positive_int
    >>> check_positive_int(np.int64(3), "K")
    3
    >>> check_positive_int(True, "K")
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: K must be a positive integer, got True
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_temperatures(temperatures) -> list[float]:
    """Temperatures as floats, each finite and > 0 (greedy decoding is not a law).

    Examples
    --------
    >>> from otbound._validation import check_temperatures
    >>> check_temperatures([0.7, 1]), check_temperatures(1.0)
    ([0.7, 1.0], [1.0])
    >>> check_temperatures([0])
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: temperatures must be finite and > 0 (greedy is not a law), got [0]
    """
    ts = [float(t) for t in np.atleast_1d(temperatures)]
    bad = [t for t in ts if not (np.isfinite(t) and t > 0)]
    if bad or not ts:
        raise InvalidInputError(
            f"temperatures must be finite and > 0 (greedy is not a law), got {np.atleast_1d(temperatures).tolist()}"
        )
    return ts


#: the largest number of drafts accepted anywhere. Beyond it the bounds are not resolved in float64
#: (α* for i.i.d. drafts holds q(H)^K, whose relative error is K times that of the summed q(H)), the
#: verifiers' acceptances cost time growing with K, and no speculative decoder drafts so many.
MAX_NUM_DRAFTS = 65_536


def check_num_drafts(num_drafts) -> int:
    """Check ``num_drafts`` is an integer in ``1..MAX_NUM_DRAFTS`` (a draft law's own limit, K within
    the support of q for distinct drafts, is :meth:`otbound.token.DraftLaw.check_num_drafts`).

    Examples
    --------
    >>> from otbound._validation import check_num_drafts
    >>> check_num_drafts(3)
    3
    >>> check_num_drafts(10**15)
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: num_drafts=1000000000000000 exceeds 65536, the most drafts ...
    """
    if isinstance(num_drafts, bool) or not isinstance(num_drafts, (int, np.integer)):
        raise InvalidInputError(f"num_drafts must be an integer, got {num_drafts!r}")
    k = int(num_drafts)
    if k < 1:
        raise InvalidInputError(f"num_drafts must be at least 1, got {k}")
    if k > MAX_NUM_DRAFTS:
        raise InvalidInputError(f"num_drafts={k} exceeds {MAX_NUM_DRAFTS}, the most drafts otbound resolves exactly "
                                "in float64")
    return k
