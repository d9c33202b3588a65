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
    """Lower bound on the G-test's power at ``level`` against any distortion of TV size ``distortion``."""
    if df < 1:  # a single possible cell: only mass outside it can show a distortion
        return float(1.0 - (1.0 - distortion) ** n)
    crit = scipy.stats.chi2.isf(level, df)
    return float(scipy.stats.ncx2.sf(crit, df, 4.0 * n * distortion**2))


def samples_for_power(df: int, distortion: float, level: float, target_power: float) -> int:
    """Smallest ``n`` (at least :data:`MIN_SAMPLES`) with :func:`power` ≥ ``target_power``."""
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
    where the law is 0."""
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
    return int(np.count_nonzero(np.asarray(law) > 0)) - 1
