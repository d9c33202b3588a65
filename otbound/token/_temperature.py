"""The draft temperature as a knob: the optimum α* as a function of the temperature τ at which the
drafter samples, and the τ that maximises it per position and per run.

The drafter's law at temperature τ is ``q_τ = softmax(z_q / τ)`` (z_q the draft logits; a stored
law q at temperature T₀ has ``z_q / T₀ = log q + c``, so passing ``log q`` as the logits measures τ
relative to T₀, with ``q_τ ∝ q^{T₀/τ}``). With one sampled draft the optimum is ``Σ min(p, q_τ)``;
with deterministic drafting it is ``p(argmax q)``; neither dominates (q = (.4, .3, .3),
p = (.9, .05, .05): 0.90 deterministic against 0.50 sampled at τ = 1; swapped, sampling wins). For K
drafts the curve is ``α*(p, q_τ, K)`` of the draft law (:func:`otbound.optimal_acceptance`), with
two ends:

* ``τ = 0``: deterministic drafting, the top-K tokens of z_q, ``α = p(top-K(z_q))``
  (``sampling="deterministic"``). At K = 1 it is the limit τ → 0 of every sampled law; at K ≥ 2
  it is the limit without replacement and dominates the i.i.d. limit ``p(argmax z_q)``;
* ``τ = ∞``: the uniform law over the tokens of finite logit.

:func:`best_draft_temperature` evaluates the curve on a log-spaced grid of ``grid`` temperatures in
``bounds`` and at both ends, then refines the best interior grid point by a bounded Brent search in
``log τ`` between its neighbours (``scipy.optimize.minimize_scalar``, ``xatol`` in ``log τ``). The
value returned is the curve at the τ returned (float64, exact to the α* routine's 1e-12); it is
the global maximum when the curve has a single peak per grid cell (tested against a dense grid).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from otbound._validation import InvalidInputError, check_positive_int
from otbound.token._settings import SamplingParams
from otbound.token.bounds import optimal_acceptance
from otbound.token.draft_laws import DRAFT_LAWS, draft_law


@dataclass(frozen=True)
class DraftTemperature:
    """Output of :func:`best_draft_temperature`.

    Attributes
    ----------
    temperature : float or numpy.ndarray
        The best τ of each position (0.0: deterministic drafting, inf: uniform).
    acceptance : float or numpy.ndarray
        α* at that τ.
    run_temperature : float
        The τ maximising the mean α* over the positions.
    run_acceptance : float
        That mean.
    temperatures : numpy.ndarray
        The grid, (G,), log-spaced in ``bounds``.
    curve : numpy.ndarray
        α* on the grid, (..., G).
    deterministic, uniform : float or numpy.ndarray
        α* at τ = 0 (top-K of the logits) and τ = ∞.
    num_drafts : int
    sampling : str
    xatol : float
        The tolerance of the refinement in log τ.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound import best_draft_temperature
    >>> p, z = np.array([[0.9, 0.05, 0.05], [0.4, 0.3, 0.3]]), np.log([[0.4, 0.3, 0.3], [0.9, 0.05, 0.05]])
    >>> res = best_draft_temperature(p, z, 1)
    >>> res.temperature.round(3).tolist(), res.acceptance.round(6).tolist(), res.curve.shape
    ([0.1, 10.047], [1.0, 1.0], (2, 49))
    """

    temperature: object
    acceptance: object
    run_temperature: float
    run_acceptance: float
    temperatures: np.ndarray
    curve: np.ndarray
    deterministic: object
    uniform: object
    num_drafts: int
    sampling: str
    xatol: float


def _check(p, draft_logits, sampling):
    if not draft_law(sampling).temperature:
        tempered = tuple(name for name, law in DRAFT_LAWS.items() if law.temperature)
        raise InvalidInputError(f"sampling must be one of {tempered} (a sampled draft law), got {sampling!r}")
    z = np.asarray(draft_logits, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    if z.shape != p.shape or z.ndim not in (1, 2) or z.shape[-1] < 1:
        raise InvalidInputError(
            f"p and draft_logits must have the same shape (V,) or (B, V), got {p.shape} and {z.shape}"
        )
    if np.isnan(z).any() or np.isposinf(z).any():
        raise InvalidInputError("draft_logits must be finite or -inf (a masked token)")
    if not np.isfinite(z).any(axis=-1).all():
        raise InvalidInputError("every row of draft_logits needs a finite entry")
    return p, z


def _draft_law(z: np.ndarray, tau: float) -> np.ndarray:
    """softmax(z/τ) along the last axis, float64: :meth:`otbound.SamplingParams.laws` at temperature
    τ (τ = inf, outside the settings: uniform over the finite logits)."""
    if np.isinf(tau):
        finite = np.isfinite(z)
        return finite / finite.sum(axis=-1, keepdims=True)
    return SamplingParams(tau).laws(z)


def draft_temperature_curve(p, draft_logits, num_drafts: int, temperatures, sampling: str = "with_replacement"):
    """α*(p, softmax(z_q/τ), K) at each temperature (module docstring).

    Parameters
    ----------
    p : array_like, shape (V,) or (B, V)
        Target laws.
    draft_logits : array_like, same shape
        The drafter's logits z_q (−inf for masked tokens); ``log q`` of a stored law measures τ
        relative to that law's temperature.
    num_drafts : int
        K.
    temperatures : array_like, shape (G,)
        τ ≥ 0; 0 is deterministic drafting (top-K of z_q), ``inf`` the uniform law.
    sampling : {"with_replacement", "without_replacement"}
        The draft law at τ > 0.

    Returns
    -------
    numpy.ndarray
        (G,) for 1-D laws, (B, G) otherwise.

    Raises
    ------
    InvalidInputError
        Bad laws or logits, a negative or NaN temperature, an unknown sampling, or K beyond the
        tokens of finite logit without replacement.

    References
    ----------
    Hu et al., arXiv 2502.18779 (α* of the draft laws).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound import draft_temperature_curve
    >>> p, q = np.array([0.9, 0.05, 0.05]), np.array([0.4, 0.3, 0.3])
    >>> draft_temperature_curve(p, np.log(q), 1, [0.0, 1.0, np.inf]).round(6).tolist()
    [0.9, 0.5, 0.433333]
    """
    p, z = _check(p, draft_logits, sampling)
    k = check_positive_int(num_drafts, "num_drafts")
    taus = np.asarray(temperatures, dtype=np.float64).ravel()
    if np.isnan(taus).any() or (taus < 0).any():
        raise InvalidInputError(f"temperatures must be ≥ 0 (0: deterministic, inf: uniform), got {taus.tolist()}")
    finite = np.isfinite(z).sum(axis=-1)
    distinct = draft_law(sampling).distinct
    if distinct and (finite < k).any():
        raise InvalidInputError(f"K = {k} drafts without replacement need {k} tokens of finite logit; "
                                f"a row has {int(finite.min())}")
    out = np.empty(z.shape[:-1] + (taus.size,))
    det = None
    for j, tau in enumerate(taus):
        if tau == 0.0:
            if det is None:
                det = optimal_acceptance(p, _draft_law(z, 1.0), k, "deterministic")
            out[..., j] = det
            continue
        q = _draft_law(z, float(tau))
        if distinct:
            # so cold that fewer than K tokens keep a positive mass: the law is (to float64) the top-K
            short = np.count_nonzero(q, axis=-1) < k
            if short.any():
                if det is None:
                    det = optimal_acceptance(p, _draft_law(z, 1.0), k, "deterministic")
                vals = np.array(det, dtype=np.float64, copy=True)
                keep = ~short
                if keep.any():
                    vals[keep] = optimal_acceptance(p[keep], q[keep], k, sampling)
                out[..., j] = vals
                continue
        out[..., j] = optimal_acceptance(p, q, k, sampling)
    return out


def best_draft_temperature(p, draft_logits, num_drafts: int, sampling: str = "with_replacement", *,
                           bounds=(0.05, 20.0), grid: int = 49, xatol: float = 1e-4) -> DraftTemperature:
    """The draft temperature maximising α*, per position and per run (module docstring).

    Parameters
    ----------
    p, draft_logits : array_like, shape (V,) or (B, V)
        Target laws and draft logits (as :func:`draft_temperature_curve`).
    num_drafts : int
        K.
    sampling : {"with_replacement", "without_replacement"}
        The draft law at τ > 0.
    bounds : (float, float)
        The interval of τ searched, ``0 < lo < hi < inf``; the ends τ = 0 and τ = ∞ are always
        evaluated.
    grid : int
        Grid points (≥ 3), log-spaced in ``bounds``.
    xatol : float
        Tolerance of the refinement, in log τ.

    Returns
    -------
    DraftTemperature

    Raises
    ------
    InvalidInputError
        Bad laws, logits, bounds, grid or tolerance.

    Examples
    --------
    Sampling wins when the drafter is sharper than the target: q = (.9, .05, .05), p = (.4, .3, .3);
    q_τ ∝ q^{1/τ} equals p at τ = log 18 / log(4/3) ≈ 10.05, where α* = 1:

    >>> import numpy as np
    >>> from otbound import best_draft_temperature
    >>> res = best_draft_temperature([0.4, 0.3, 0.3], np.log([0.9, 0.05, 0.05]), 1)
    >>> round(res.temperature, 3), round(res.acceptance, 6), round(res.deterministic, 6)
    (10.047, 1.0, 0.4)
    """
    p, z = _check(p, draft_logits, sampling)
    k = check_positive_int(num_drafts, "num_drafts")
    grid = check_positive_int(grid, "grid")
    try:
        lo, hi = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise InvalidInputError(f"bounds must be two temperatures (lo, hi), got {bounds!r}") from None
    if not 0.0 < lo < hi < np.inf:
        raise InvalidInputError(f"bounds must satisfy 0 < lo < hi < inf, got {bounds!r}")
    if grid < 3:
        raise InvalidInputError(f"grid must be at least 3, got {grid}")
    if not 0.0 < float(xatol) < 1.0:
        raise InvalidInputError(f"xatol (in log τ) must lie in (0, 1), got {xatol!r}")
    import scipy.optimize  # imported here: it costs ~0.2 s at ``import otbound``

    taus = np.geomspace(lo, hi, grid)
    rows = z.reshape(-1, z.shape[-1])
    prow = p.reshape(rows.shape)
    curve = draft_temperature_curve(prow, rows, k, taus, sampling)  # (B, G)
    ends = draft_temperature_curve(prow, rows, k, [0.0, np.inf], sampling)  # (B, 2)

    def refine(values, fun):
        """(τ, value): the best of the grid, its refinement and the two ends."""
        i = int(np.argmax(values))
        best_tau, best = float(taus[i]), float(values[i])
        a, b = np.log(taus[max(i - 1, 0)]), np.log(taus[min(i + 1, grid - 1)])
        res = scipy.optimize.minimize_scalar(lambda t: -fun(np.exp(t)), bounds=(a, b), method="bounded",
                                             options={"xatol": float(xatol)})
        if -res.fun > best:
            best_tau, best = float(np.exp(res.x)), float(-res.fun)
        return best_tau, best

    per_tau = np.empty(rows.shape[0])
    per_val = np.empty(rows.shape[0])
    for r in range(rows.shape[0]):
        tau, val = refine(curve[r], lambda t, r=r: float(draft_temperature_curve(prow[r], rows[r], k, [t],
                                                                                   sampling)[0]))
        for end_tau, end_val in ((0.0, ends[r, 0]), (np.inf, ends[r, 1])):
            if end_val > val:
                tau, val = end_tau, float(end_val)
        per_tau[r], per_val[r] = tau, val
    run_tau, run_val = refine(curve.mean(axis=0),
                              lambda t: float(draft_temperature_curve(prow, rows, k, [t], sampling).mean()))
    for end_tau, end_val in ((0.0, ends[:, 0].mean()), (np.inf, ends[:, 1].mean())):
        if end_val > run_val:
            run_tau, run_val = end_tau, float(end_val)
    one = z.ndim == 1

    def shaped(x):
        return float(x[0]) if one else x

    return DraftTemperature(
        temperature=shaped(per_tau), acceptance=shaped(per_val), run_temperature=run_tau, run_acceptance=run_val,
        temperatures=taus, curve=curve[0] if one else curve, deterministic=shaped(ends[:, 0]),
        uniform=shaped(ends[:, 1]), num_drafts=k, sampling=sampling, xatol=float(xatol),
    )
