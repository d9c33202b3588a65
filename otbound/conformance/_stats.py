"""Sample mode statistics: the G-test of an output histogram against the target law, and its power.

Test (Sokal & Rohlf; scipy.stats.power_divergence, ``lambda_="log-likelihood"``): counts over the
cells of positive target probability against their expected counts, ``df = cells − 1``; any count in
a cell of target probability 0 rejects outright (p-value 0).

Power: for a true law at total-variation distance ``δ`` from the target ``p``, the statistic is
asymptotically noncentral chi-square with ``df`` degrees of freedom and noncentrality
``λ = n Σ_c (p'_c − p_c)² / p_c``. By Cauchy–Schwarz, ``(Σ|d_c|)² ≤ Σ d_c²/p_c · Σ p_c``, so
``λ ≥ 4 n δ²`` for *every* distortion of size δ; the power reported,
``P(ncx2(df, 4nδ²) > chi2.isf(level, df))``, is therefore a lower bound over all distortions of
total-variation size δ. :func:`samples_for_power` finds the smallest ``n`` with that power.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize
import scipy.stats

#: a cell of target probability 0 with this many samples rejects a δ-distortion placed there w.p. ≥ 0.99
MIN_SAMPLES = 500


def power(n: int, df: int, distortion: float, level: float) -> float:
    """Lower bound on the G-test's power at ``level`` against any distortion of TV size ``distortion``.

    ``P(ncx2(df, 4 n δ²) > chi2.isf(level, df))`` (module docstring: ``λ ≥ 4nδ²`` by
    Cauchy–Schwarz for every distortion of total-variation size δ); with ``df < 1`` (one cell of
    positive target probability) ``1 − (1 − δ)^n``, the chance that some sample leaves that cell.

    Parameters
    ----------
    n : int
        Samples.
    df : int
        Degrees of freedom: cells of positive target probability − 1.
    distortion : float
        Total-variation size δ of the distortion in (0, 1].
    level : float
        Significance level of the test.

    Returns
    -------
    float
        The power's lower bound, in [0, 1].

    References
    ----------
    Sokal & Rohlf, *Biometry* (the G-test); the noncentral chi-square limit of the
    likelihood-ratio statistic under local alternatives.

    Examples
    --------
    >>> from otbound.conformance import power
    >>> round(power(1000, 2, 0.05, 0.01), 4)
    0.6148
    >>> round(power(88119, 2, 0.01, 1e-3), 4)
    0.99
    """
    if df < 1:  # a single possible cell: only mass outside it can show a distortion
        return float(1.0 - (1.0 - distortion) ** n)
    crit = scipy.stats.chi2.isf(level, df)
    return float(scipy.stats.ncx2.sf(crit, df, 4.0 * n * distortion**2))


def samples_for_power(df: int, distortion: float, level: float, target_power: float) -> int:
    """Smallest ``n`` (at least ``MIN_SAMPLES`` = 500) with :func:`power` ≥ ``target_power``.

    Parameters
    ----------
    df : int
        Degrees of freedom (cells of positive target probability − 1).
    distortion : float
        Total-variation size δ to detect, in (0, 1).
    level : float
        Significance level of the test.
    target_power : float
        Power to reach, in (0, 1).

    Returns
    -------
    int
        The sample size.

    Examples
    --------
    >>> from otbound.conformance import power, samples_for_power
    >>> n = samples_for_power(2, 0.01, 1e-3, 0.99)
    >>> n, power(n, 2, 0.01, 1e-3) >= 0.99 > power(n - 1, 2, 0.01, 1e-3)
    (88119, True)
    >>> samples_for_power(0, 0.01, 1e-3, 0.99)  # one cell: at least MIN_SAMPLES
    500
    """
    if df < 1:
        return max(MIN_SAMPLES, math.ceil(math.log(1.0 - target_power) / math.log(1.0 - distortion)))
    crit = scipy.stats.chi2.isf(level, df)
    lam = scipy.optimize.brentq(lambda x: scipy.stats.ncx2.sf(crit, df, x) - target_power, 1e-6, 1e6, xtol=1e-9)
    n = max(MIN_SAMPLES, math.ceil(lam / (4.0 * distortion**2)))
    while power(n, df, distortion, level) < target_power:  # brentq's tolerance: step to the exact side
        n += 1
    return n


def g_test(counts: np.ndarray, law: np.ndarray) -> tuple[float, float]:
    """``(G statistic, p-value)`` of ``counts`` against ``law`` (same shape); inf/0 if a count lands
    where the law is 0.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.conformance import g_test
    >>> g, pval = g_test(np.array([30, 70]), np.array([0.3, 0.7]))
    >>> round(g, 12), round(pval, 12)
    (0.0, 1.0)
    >>> g_test(np.array([1, 9]), np.array([0.0, 1.0]))
    (inf, 0.0)
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    law = np.asarray(law, dtype=np.float64).ravel()
    pos = law > 0
    if counts[~pos].sum() > 0:
        return math.inf, 0.0
    if pos.sum() < 2:
        return 0.0, 1.0
    expected = law[pos] / law[pos].sum() * counts.sum()
    stat, pval = scipy.stats.power_divergence(counts[pos], expected, lambda_="log-likelihood")
    return float(stat), float(pval)


def degrees_of_freedom(law: np.ndarray) -> int:
    """Degrees of freedom of the G-test against ``law``: its cells of positive probability − 1.

    Examples
    --------
    >>> from otbound.conformance import degrees_of_freedom
    >>> degrees_of_freedom([0.5, 0.0, 0.5])
    1
    """
    return int(np.count_nonzero(np.asarray(law) > 0)) - 1
