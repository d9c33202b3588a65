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
``MAX_SELECTION_CELLS`` atom × token pairs, e.g. K = 2 up to V ≈ 7000). The paper's experiments use
*weighted* IS with weights fitted by a truncated LP; this module implements the plain IS weights
(see the report: the LP-fitted variant is not implemented). Exact acceptance: enumeration (small V).
"""

from __future__ import annotations

import numpy as np

from otbound._validation import InvalidInputError
from otbound.verifiers._base import Verifier, draw, first_acceptance_sample, ratio_min1, residual

#: atom × token pairs allowed when computing the exact selected-token law p_s.
MAX_SELECTION_CELLS = 50_000_000


def _weights(p, q):
    return np.where(q > 0, p / np.where(q > 0, q, 1.0), 0.0)


def selected_law(p: np.ndarray, q: np.ndarray, num_drafts: int) -> np.ndarray:
    """Exact law p_s of the token selected by self-normalised IS among K i.i.d. drafts from q."""
    k = int(num_drafts)
    w = _weights(p, q)
    supp = np.flatnonzero(q > 0)
    n_atoms = supp.size ** (k - 1)
    if n_atoms * supp.size > MAX_SELECTION_CELLS:
        raise InvalidInputError(
            f"khisti_is needs the exact selected-token law: |supp q|^K = {supp.size}^{k} exceeds "
            f"{MAX_SELECTION_CELLS:.0e}"
        )
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
    """Khisti et al. (2410.18234): IS selection of one draft, then speculative sampling vs p_s."""

    name = "khisti_is"
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
