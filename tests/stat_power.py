"""Power of the goodness-of-fit tests against a total-variation distortion (shared by the tests).

A distortion d of p with Σ|d| = 2·TV has non-centrality λ = N Σ d²/p ≥ N (2 TV)² (Cauchy–Schwarz,
Σ p = 1), the same for Pearson's chi-square and the G-test to first order; with ``df`` degrees of
freedom (bins − 1) and level ``alpha`` the worst-case power is ``P[χ'²(df, λ) > χ²_{1−alpha}(df)]``.
"""

from __future__ import annotations

import scipy.optimize
import scipy.stats


def chi2_power(df: int, n: int, tv: float = 0.01, alpha: float = 1e-3) -> float:
    """Worst-case power of a level-``alpha`` test with ``df`` degrees of freedom and ``n`` draws."""
    return float(scipy.stats.ncx2.sf(scipy.stats.chi2.isf(alpha, df), df, n * (2.0 * tv) ** 2))


def detectable_tv(df: int, n: int, power: float = 0.99, alpha: float = 1e-3) -> float:
    """The smallest TV distortion detected with probability ``power`` (worst case)."""
    return float(scipy.optimize.brentq(lambda tv: chi2_power(df, n, tv, alpha) - power, 1e-6, 1.0))
