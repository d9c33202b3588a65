"""POT's network simplex (``ot.emd``) with its stopping status checked.

``ot.emd`` stops at ``numItermax`` pivots and returns the current, feasible but non-optimal plan
with only a ``UserWarning``: an acceptance bound computed from it would be silently too low. Here a
non-optimal exit is an error naming the limit.
"""

from __future__ import annotations

import warnings

import numpy as np

#: default pivot limit (POT's own default is 100,000, reached on the V ≈ 400, K = 2 acceptance LP)
EMD_MAX_ITER = 10_000_000


def emd(a: np.ndarray, b: np.ndarray, cost: np.ndarray, *, max_iter: int = EMD_MAX_ITER) -> np.ndarray:
    """Optimal plan of ``min <π, cost>`` with marginals ``a``, ``b`` (POT ``ot.emd``).

    Raises ``RuntimeError`` unless the network simplex reports optimality (e.g. ``max_iter`` pivots
    were reached, or the marginals have different totals).
    """
    import ot

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the status is checked below instead
        plan, log = ot.emd(a, b, cost, numItermax=int(max_iter), log=True)
    if log["result_code"] != 1:  # 1 = OPTIMAL in POT's network simplex
        raise RuntimeError(f"POT ot.emd did not reach optimality ({log['warning']}); max_iter={int(max_iter):,}")
    return plan
