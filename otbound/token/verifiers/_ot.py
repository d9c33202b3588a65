"""OT-optimal verifier: given the drafts x̄, sample ``Y ~ π*(· | x̄) = π*(x̄, ·)/Q(x̄)`` from an optimal
plan of the membership-cost transport problem (SpecTr OTM 2310.15141; theory.md §2), solved by
:func:`otbound.optimal_acceptance_lp`. Lossless by the plan's marginals; acceptance ``α*``.

Small V only: the plan has ``|V|^K · |V|`` entries (at most ``max_plan_cells``, default
``MAX_PLAN_CELLS``). The LP's plan
satisfies its marginals to the solver tolerance (~1e-10); it is repaired to exact marginals (to
float64 rounding) by the rounding step of Altschuler, Weed & Rigollet (1705.09634, Alg. 2): scale
rows down to Q, columns down to p, and add the outer product of the deficits (normalised). This
moves at most the solver error (~1e-10) of mass, so the acceptance returned (the exact membership
mass of the repaired plan, by enumeration) equals α* to ~1e-9. Plans are cached per (p, q, K)
(``CACHE_SIZE`` most recent).
"""

from __future__ import annotations

import numpy as np

from otbound._validation import InvalidInputError, check_sampling
from otbound.token.bounds import optimal_acceptance_lp
from otbound.token.draft_laws import draft_joint
from otbound.token.verifiers._base import PreparedCache, Verifier, draw

MAX_PLAN_CELLS = 10_000_000
CACHE_SIZE = 16


def round_plan(plan: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Nearest-feasible repair of a plan to exact marginals (Altschuler et al. 1705.09634, Alg. 2)."""
    f = np.maximum(plan, 0.0)
    rs = f.sum(axis=1)
    f *= np.where(rs > rows, rows / np.where(rs > 0, rs, 1.0), 1.0)[:, None]
    cs = f.sum(axis=0)
    f *= np.where(cs > cols, cols / np.where(cs > 0, cs, 1.0), 1.0)[None, :]
    err_r = np.maximum(rows - f.sum(axis=1), 0.0)
    err_c = np.maximum(cols - f.sum(axis=0), 0.0)
    total = err_r.sum()
    if total > 0:
        f += np.outer(err_r, err_c) / total
    return f


class OTVerifier(Verifier):
    """Samples from the LP-optimal plan π*(x̄, y) for the draft law ``sampling`` (small V)."""

    name = "ot"

    def __init__(self, sampling: str = "with_replacement", max_plan_cells: int = MAX_PLAN_CELLS):
        self.sampling = check_sampling(sampling)
        self.max_plan_cells = int(max_plan_cells)
        self._cache = PreparedCache(CACHE_SIZE)

    def _prepare(self, p, q, k):
        return self._cache.get_or_build(p, q, k, lambda: self._plan(p, q, k))

    def _plan(self, p, q, k):
        v = q.size
        if v ** (k + 1) > self.max_plan_cells:
            raise InvalidInputError(
                f"the ot verifier needs the full LP plan with |V|^(K+1) = {v}^{k + 1} entries "
                f"(limit {self.max_plan_cells:.0e}); use a smaller vocabulary"
            )
        joint = draft_joint(q, k, self.sampling)
        bound = optimal_acceptance_lp(p, joint, return_plan=True)
        return round_plan(bound.plan.reshape(v**k, v), joint.ravel(), p)

    def _laws(self, p, q, aux, drafts):
        v = q.size
        idx = np.ravel_multi_index(tuple(drafts.T), (v,) * drafts.shape[1])
        rows = aux[idx]
        return rows / rows.sum(axis=1, keepdims=True)

    def _sample(self, p, q, aux, drafts, rng):
        return draw(self._laws(p, q, aux, drafts), rng.random(drafts.shape[0]))
