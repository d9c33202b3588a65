"""Importance-sampling draft selection + single-draft speculative sampling (Khisti, Ebrahimi, Dbouk,
Behboodi, Memisevic, Louizos, 2410.18234, "Multi-Draft Speculative Sampling: Canonical
Decomposition and Theoretical Limits").

Their canonical decomposition: any multi-draft verifier's optimum is reached by (1) selecting one
of the K drafts with probabilities β(i | x̄) (an importance-sampling type rule), which induces a law
``p_s`` of the selected token, then (2) speculative sampling of that token against p with proposal
``p_s``: accept w.p. ``min(1, p(y)/p_s(y))``, else ``Y ∝ (p − p_s)_+``. Step (2) is lossless for
*any* selection rule as long as ``p_s`` is the exact law of the selected token.

Selection here is self-normalised importance sampling with weights ``w(x) = p(x)/q(x)``:
``β(i | x̄) = w(x_i) / Σ_j w(x_j)`` (uniform 1/K if every weight is 0). The selected-token law for
i.i.d. drafts is, with ``S = Σ_{j≥2} w(x_j)`` over K − 1 further drafts,

    p_s(y) = K q(y) E[ sel(w(y), S) ],  sel(w, s) = w/(w + s)  (1/K when w + s = 0),

computed exactly by enumerating the law of S (``|supp q|^(K−1)`` atoms; at most
``MAX_SELECTION_CELLS`` atom × token pairs, e.g. K = 2 up to V ≈ 7000) — ``khisti_is``.

``khisti_lp`` (K = 2) selects with the *optimal* weights instead: ``W[i, j] = P(select i | drafts
{i, j})`` maximising ``Σ_y min(p(y), p_s(y))`` with
``p_s(y) = q(y)² + 2 q(y) Σ_{j≠y} q(j) W[y, j]``, ``W[i, j] + W[j, i] = 1`` — a linear program
(HiGHS) in the ``|supp q|·(|supp q| − 1)/2`` pair weights, the paper's optimisation of the selection
step for two identical drafts (their experiments solve it on a truncated alphabet). Exact
acceptance: enumeration (small V).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse

from otbound._solvers import solve_lp
from otbound._validation import InvalidInputError
from otbound.token.verifiers._base import Verifier, draw, first_acceptance_sample, ratio_min1, residual

#: atom × token pairs allowed when computing the exact selected-token law p_s.
MAX_SELECTION_CELLS = 50_000_000
#: pair weights allowed in the optimal-selection LP (|supp q| ≈ 630)
MAX_SELECTION_PAIRS = 200_000


def _weights(p, q):
    return np.where(q > 0, p / np.where(q > 0, q, 1.0), 0.0)


def selected_law(p: np.ndarray, q: np.ndarray, num_drafts: int) -> np.ndarray:
    """Exact law p_s of the token selected by self-normalised IS among K i.i.d. drafts from q.

    With weights ``w(x) = p(x)/q(x)`` and ``S = Σ_{j≥2} w(x_j)`` over K − 1 further drafts,
    ``p_s(y) = K q(y) E[sel(w(y), S)]``, ``sel(w, s) = w/(w + s)`` (1/K when w + s = 0), computed
    exactly by enumerating the law of S.

    Parameters
    ----------
    p, q : numpy.ndarray, shape (V,)
        Target and draft laws, already checked (float64, summing to 1).
    num_drafts : int
        K ≥ 1.

    Returns
    -------
    numpy.ndarray
        float64 (V,), p_s (q itself at K = 1).

    Raises
    ------
    InvalidInputError
        When ``|supp q|^K`` exceeds ``MAX_SELECTION_CELLS``.

    References
    ----------
    Khisti, Ebrahimi, Dbouk, Behboodi, Memisevic, Louizos, "Multi-Draft Speculative Sampling:
    Canonical Decomposition and Theoretical Limits", arXiv 2410.18234.

    Examples
    --------
    >>> import numpy as np
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> from otbound.token.verifiers import selected_law
    >>> selected_law(p, q, 2).round(4).tolist()
    [0.2981, 0.3386, 0.3633]
    >>> selected_law(p, q, 1).tolist()
    [0.2, 0.3, 0.5]
    """
    k = int(num_drafts)
    size = int(np.count_nonzero(q > 0))  # |supp q|, checked before any other work
    if size ** k > MAX_SELECTION_CELLS:
        raise InvalidInputError(
            f"khisti_is needs the exact selected-token law: |supp q|^K = {size}^{k} exceeds "
            f"{MAX_SELECTION_CELLS:.0e}"
        )
    w = _weights(p, q)
    supp = np.flatnonzero(q > 0)
    vals, probs = np.zeros(1), np.ones(1)
    for _ in range(k - 1):
        vals = (vals[:, None] + w[supp][None, :]).ravel()
        probs = (probs[:, None] * q[supp][None, :]).ravel()
    vals, inv = np.unique(vals, return_inverse=True)
    probs = np.bincount(inv.ravel(), weights=probs, minlength=vals.size)
    ps = np.zeros_like(q)
    step = max(1, MAX_SELECTION_CELLS // 10 // max(vals.size, 1))
    for start in range(0, supp.size, step):
        y = supp[start : start + step]
        tot = w[y][:, None] + vals[None, :]
        sel = np.where(tot > 0, w[y][:, None] / np.where(tot > 0, tot, 1.0), 1.0 / k)
        ps[y] = k * q[y] * (sel @ probs)
    return ps


class ImportanceSamplingVerifier(Verifier):
    """Khisti et al. (2410.18234): IS selection of one draft, then speculative sampling vs p_s.

    Drafts i.i.d. from q; select x_i w.p. ``β(i | x̄) = w(x_i) / Σ_j w(x_j)``, ``w = p/q`` (uniform
    1/K if every weight is 0), then accept the selected y w.p. ``min(1, p(y)/p_s(y))``, else draw
    ``Y ∝ (p − p_s)_+``, with p_s the exact selected-token law (:func:`selected_law`). Lossless for
    any selection rule. The instance in :data:`otbound.VERIFIERS` is ``"khisti_is"``.

    References
    ----------
    Khisti, Ebrahimi, Dbouk, Behboodi, Memisevic, Louizos, "Multi-Draft Speculative Sampling:
    Canonical Decomposition and Theoretical Limits", arXiv 2410.18234.

    Examples
    --------
    >>> from otbound.token.verifiers import ImportanceSamplingVerifier
    >>> [round(ImportanceSamplingVerifier().acceptance([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], k), 6) for k in (1, 2, 3)]
    [0.7, 0.814434, 0.882293]

    At K = 1 the selection is the one draft and this is speculative sampling, ``Σ min(p, q)``.
    """

    name = "khisti_is"
    monte_carlo = "K ≥ 2 beyond the enumeration limit (V^K tuples), while |supp q|^K ≤ MAX_SELECTION_CELLS"
    planned = True
    reference = "importance-sampling draft selection + speculative sampling (Khisti et al. 2410.18234)"
    lossless = True
    sampling = "with_replacement"

    def _prepare(self, p, q, k):
        ps = selected_law(p, q, k)
        return {"w": _weights(p, q), "accept": ratio_min1(p, ps), "residual": residual(p, ps)}

    @staticmethod
    def _selection(aux, drafts):
        w = aux["w"][drafts]
        tot = w.sum(axis=1, keepdims=True)
        return np.where(tot > 0, w / np.where(tot > 0, tot, 1.0), 1.0 / drafts.shape[1])

    def _laws(self, p, q, aux, drafts):
        n = drafts.shape[0]
        sel = self._selection(aux, drafts)
        acc = aux["accept"][drafts]
        law = np.zeros((n, q.size))
        rows = np.arange(n)
        for i in range(drafts.shape[1]):
            law[rows, drafts[:, i]] += sel[:, i] * acc[:, i]
        law += (sel * (1.0 - acc)).sum(axis=1)[:, None] * aux["residual"]
        return law

    def _sample(self, p, q, aux, drafts, rng):
        sel = self._selection(aux, drafts)
        pick = draw(sel, rng.random(drafts.shape[0]))
        chosen = drafts[np.arange(drafts.shape[0]), pick][:, None]
        return first_acceptance_sample(chosen, aux["accept"][chosen], aux["residual"], rng)


def optimal_selection(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Optimal selection for K = 2 i.i.d. drafts from q (see the module docstring).

    Returns ``(supp, W, p_s)``: the support of q, ``W[a, b] = P(select supp[a] | drafts {supp[a],
    supp[b]})`` (``W + Wᵀ = 1`` off the diagonal) and the selected-token law ``p_s`` over all V
    tokens. The LP is solved by HiGHS at feasibility tolerances 1e-10.

    It maximises ``Σ_y min(p(y), p_s(y))`` over the pair weights with
    ``p_s(y) = q(y)² + 2 q(y) Σ_{j≠y} q(j) W[y, j]`` and ``W[i, j] + W[j, i] = 1``.

    Parameters
    ----------
    p, q : numpy.ndarray, shape (V,)
        Target and draft laws, already checked (float64, summing to 1).

    Returns
    -------
    supp : numpy.ndarray
        int64, the tokens with q > 0.
    W : numpy.ndarray
        float64 ``(|supp|, |supp|)``, the selection probabilities (0.5 on the diagonal).
    p_s : numpy.ndarray
        float64 (V,), the selected-token law.

    Raises
    ------
    InvalidInputError
        More than ``MAX_SELECTION_PAIRS`` pair weights (``|supp q| ≳ 630``).

    References
    ----------
    Khisti, Ebrahimi, Dbouk, Behboodi, Memisevic, Louizos, "Multi-Draft Speculative Sampling:
    Canonical Decomposition and Theoretical Limits", arXiv 2410.18234.

    Examples
    --------
    >>> import numpy as np
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> from otbound.token.verifiers import optimal_selection
    >>> supp, W, p_s = optimal_selection(p, q)
    >>> supp.tolist(), W.shape, round(float(np.minimum(p, p_s).sum()), 6)
    ([0, 1, 2], (3, 3), 0.86)
    >>> bool(np.allclose(W + W.T, 1.0))
    True
    """
    supp = np.flatnonzero(q > 0)
    n = supp.size
    if n * (n - 1) // 2 > MAX_SELECTION_PAIRS:
        raise InvalidInputError(
            f"khisti_lp solves an LP over |supp q|·(|supp q| − 1)/2 = {n * (n - 1) // 2:,} pair weights; "
            f"at most {MAX_SELECTION_PAIRS:,} (|supp q| ≲ 630)"
        )
    qs = q[supp]
    a, b = np.triu_indices(n, 1)
    m = a.size
    # variables: w (pairs, P(select a | {a, b})) then t (tokens); maximise Σ t, t_y ≤ p(y), t_y ≤ p_s(y):
    # p_s(y) = q_y² + 2 q_y (Σ_{b>y} q_b w_yb + Σ_{a<y} q_a (1 − w_ay))
    rows = np.concatenate([a, b, np.arange(n)])
    cols = np.concatenate([np.arange(m), np.arange(m), m + np.arange(n)])
    vals = np.concatenate([-2.0 * qs[a] * qs[b], 2.0 * qs[a] * qs[b], np.ones(n)])
    a_ub = scipy.sparse.csr_matrix((vals, (rows, cols)), shape=(n, m + n))
    b_ub = qs**2 + 2.0 * qs * (np.cumsum(qs) - qs)
    bounds = [(0.0, 1.0)] * m + [(0.0, float(x)) for x in p[supp]]
    c = np.concatenate([np.zeros(m), -np.ones(n)])
    res = solve_lp(c, a_ub, b_ub, None, None, bounds, "optimal-selection LP")
    w = np.clip(res.x[:m], 0.0, 1.0)
    big_w = np.full((n, n), 0.5)
    big_w[a, b], big_w[b, a] = w, 1.0 - w
    ps = np.zeros_like(q)
    ps[supp] = qs**2 + 2.0 * qs * (np.bincount(a, qs[b] * w, n) + np.bincount(b, qs[a] * (1.0 - w), n))
    return supp, big_w, ps


class OptimalImportanceVerifier(ImportanceSamplingVerifier):
    """Khisti et al. (2410.18234), K = 2: LP-optimal selection of one draft, then speculative sampling.

    Selects x_i among two i.i.d. drafts {i, j} w.p. ``W[i, j]`` of :func:`optimal_selection`, then
    accepts it w.p. ``min(1, p(y)/p_s(y))``, else ``Y ∝ (p − p_s)_+``; acceptance
    ``Σ_y min(p(y), p_s(y))``. K = 1 is single-draft speculative sampling. Lossless. The instance
    in :data:`otbound.VERIFIERS` is ``"khisti_lp"`` (``max_drafts = 2``).

    References
    ----------
    Khisti, Ebrahimi, Dbouk, Behboodi, Memisevic, Louizos, "Multi-Draft Speculative Sampling:
    Canonical Decomposition and Theoretical Limits", arXiv 2410.18234.

    Examples
    --------
    >>> from otbound import VERIFIERS
    >>> [round(VERIFIERS["khisti_lp"].acceptance([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], k), 6) for k in (1, 2)]
    [0.7, 0.86]

    K = 1 gives ``Σ min(p, q)``; K = 2 reaches α* of the i.i.d. law (0.86 on this toy).
    """

    name = "khisti_lp"
    planned = False  # the LP form of the optimum at K ≤ 2
    monte_carlo = "K = 2 beyond the enumeration limit (V^K tuples), while its LP is within its pair limit"
    reference = "LP-optimal draft selection + speculative sampling, K ≤ 2 (Khisti et al. 2410.18234)"
    lossless = True
    max_drafts = 2

    def _prepare(self, p, q, k):
        if k == 1:  # nothing to select: single-draft speculative sampling
            return {"accept": ratio_min1(p, q), "residual": residual(p, q)}
        supp, big_w, ps = optimal_selection(p, q)
        index = np.full(q.size, -1)
        index[supp] = np.arange(supp.size)
        return {"index": index, "select": big_w, "accept": ratio_min1(p, ps), "residual": residual(p, ps)}

    @staticmethod
    def _selection(aux, drafts):
        if drafts.shape[1] == 1:
            return np.ones((drafts.shape[0], 1))
        i, j = aux["index"][drafts[:, 0]], aux["index"][drafts[:, 1]]
        first = np.where(i == j, 1.0, aux["select"][i, j])
        return np.stack([first, 1.0 - first], axis=1)
