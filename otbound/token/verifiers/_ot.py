"""The optimal verifier's plan path (implementation of :class:`~otbound.token.verifiers.OptimalVerifier`
for the draft laws other than i.i.d.): given the drafts x̄, sample ``Y ~ π*(· | x̄) = π*(x̄, ·)/Q(x̄)``
from an optimal plan of the membership-cost transport problem (SpecTr OTM 2310.15141; docs/theory/token-bounds.md),
solved by :func:`otbound.optimal_acceptance_lp`. Lossless by the plan's marginals; acceptance ``α*``.

Small V only: the plan has ``|V|^K · |V|`` entries (at most ``max_plan_cells``, default
``MAX_PLAN_CELLS``). The LP's plan
satisfies its marginals to the solver tolerance (~1e-10); it is repaired to exact marginals (to
float64 rounding) by the rounding step of Altschuler, Weed & Rigollet (1705.09634, Alg. 2): scale
rows down to Q, columns down to p, and add the outer product of the deficits (normalised). This
moves at most the solver error (~1e-10) of mass, so the acceptance returned (the exact membership
mass of the repaired plan, by enumeration) equals α* to ~1e-9. Plans are cached per (p, q, K)
(by the verifier).
"""

from __future__ import annotations

import numpy as np

from otbound._validation import InvalidInputError
from otbound.token.bounds import optimal_acceptance_lp
from otbound.token.draft_laws import draft_joint

MAX_PLAN_CELLS = 10_000_000


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


def plan(p: np.ndarray, q: np.ndarray, k: int, sampling: str, max_plan_cells: int = MAX_PLAN_CELLS) -> np.ndarray:
    """The repaired LP-optimal plan ``π*(x̄, y)``, array ``(V^K, V)`` (rows: draft tuples in
    ``np.ravel_multi_index`` order), for the draft law ``sampling``.

    Raises
    ------
    InvalidInputError
        If the plan would have more than ``max_plan_cells`` entries ``|V|^(K+1)``.
    """
    v = q.size
    if v ** (k + 1) > max_plan_cells:
        raise InvalidInputError(
            f"the ot verifier with sampling={sampling!r} needs the full LP plan with |V|^(K+1) = {v}^{k + 1} "
            f"entries (limit {max_plan_cells:.0e}); use a smaller vocabulary (with_replacement has no such limit)"
        )
    joint = draft_joint(q, k, sampling)
    bound = optimal_acceptance_lp(p, joint, return_plan=True)
    return round_plan(bound.plan.reshape(v**k, v), joint.ravel(), p)


def plan_laws(plan_rows: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """``π*(· | x̄)`` for each row of ``drafts`` (n, K): the plan's rows, normalised, array (n, V)."""
    v = plan_rows.shape[1]
    idx = np.ravel_multi_index(tuple(drafts.T), (v,) * drafts.shape[1])
    rows = plan_rows[idx]
    return rows / rows.sum(axis=1, keepdims=True)
