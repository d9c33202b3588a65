"""The optimum as the number of i.i.d. drafts grows (docs/theory/token-bounds.md, "Many drafts").

With K drafts i.i.d. from q, ``Q(H) = q(H)^K`` and ``α*(K) = 1 + min_H [p(H) − q(H)^K]`` (Hu et al.
2502.18779, Thm 3.1), the minimum taken over the prefixes ``H_j`` of the tokens sorted by increasing
``p/q`` (tokens with q = 0 last). Write S = supp q.

* **Limit.** ``q(H)^K → 0`` unless ``q(H) = 1`` (H ⊇ S), so ``α*(K) ↑ p(S)``; for every K,
  ``min(p(S), 1 − (1 − q_min)^K) ≤ α*(K) ≤ p(S)`` with ``q_min`` the least positive mass of q (a set
  with ``q(H) < 1`` misses a token of S, so ``q(H) ≤ 1 − q_min``).
* **Certain acceptance.** ``α*(K) = 1`` iff ``p(H) ≥ q(H)^K`` for every prefix, which needs
  ``p(S) = 1`` and no token drafted that p never emits (a set of p-mass 0 and positive q-mass
  fails at every K): supp p = supp q. Then the smallest such K is

      K₁ = max_j ⌈log p(H_j) / log q(H_j)⌉   over the prefixes with 0 < q(H_j) < 1

  (1 if there is none), each ratio evaluated in float64 (a ratio within 1e-12 of an integer is
  taken as that integer).
"""

from __future__ import annotations

import numpy as np

from otbound._validation import as_pair


def _log_prefix_masses(p: np.ndarray, q: np.ndarray):
    """``log p(H_j)``, ``log q(H_j)`` of the proper prefixes ``H_j`` (j = 1 .. |S| − 1) of supp q
    sorted by increasing p/q; each mass summed directly from its own side (``log1p(−mass of the
    rest)`` near 1), so a prefix close to the whole support keeps its accuracy."""
    s = np.flatnonzero(q > 0)
    order = s[np.argsort(p[s] / q[s], kind="stable")]
    ps, qs = p[order], q[order]

    def logs(x):
        head = np.cumsum(x)[:-1]  # (|S| − 1,) x(H_j)
        tail = np.cumsum(x[::-1])[::-1][1:]  # (|S| − 1,) x(S ∖ H_j)
        with np.errstate(divide="ignore"):
            return np.where(head < 0.5, np.log(head), np.log1p(-np.minimum(tail, 1.0)))

    return logs(ps), logs(qs)


def optimal_acceptance_limit(p, q) -> float:
    """``lim_{K→∞} α*(p, q, K) = p(supp q)`` for i.i.d. drafts (module docstring).

    Parameters
    ----------
    p, q : array_like, shape (V,)
        Target and draft laws.

    Returns
    -------
    float
        ``p(supp q)``: the target's mass on the tokens the draft can propose.

    Raises
    ------
    InvalidInputError
        Malformed laws.

    References
    ----------
    Hu et al., arXiv 2502.18779 (α* of i.i.d. drafts).

    Examples
    --------
    >>> from otbound import optimal_acceptance_limit
    >>> optimal_acceptance_limit([0.5, 0.3, 0.2], [0.6, 0.4, 0.0])
    0.8
    """
    p, q = as_pair(p, q)
    return float(p[q > 0].sum())


def drafts_for_certain_acceptance(p, q) -> int | None:
    """The smallest K with ``α*(p, q, K) = 1`` for i.i.d. drafts, or None where no K reaches it
    (supp p ≠ supp q; module docstring).

    Parameters
    ----------
    p, q : array_like, shape (V,)
        Target and draft laws.

    Returns
    -------
    int or None
        That K: ``max(1, ⌈max_j log P(H_j) / log Q(H_j)⌉)`` over the proper prefixes ``H_j`` of the
        tokens sorted by p/q (module docstring).

    Raises
    ------
    InvalidInputError
        Malformed laws.

    Examples
    --------
    p = (.5, .5), q = (.9, .1): H = {0} needs .5 ≥ .9^K, K ≥ log .5 / log .9 = 6.58:

    >>> from otbound import drafts_for_certain_acceptance
    >>> drafts_for_certain_acceptance([0.5, 0.5], [0.9, 0.1])
    7
    >>> drafts_for_certain_acceptance([0.5, 0.5, 0.0], [0.8, 0.1, 0.1]) is None   # token 2 drafted, never emitted
    True
    """
    p, q = as_pair(p, q)
    if not np.array_equal(p > 0, q > 0):
        return None
    log_p, log_q = _log_prefix_masses(p, q)
    if log_p.size == 0:
        return 1  # one token: every draft is it
    ratio = log_p / log_q  # both negative: every proper prefix has 0 < p(H), q(H) < 1
    return max(1, int(np.ceil(ratio.max() - 1e-12)))
