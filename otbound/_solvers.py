"""POT's network simplex (``ot.emd``) with its stopping status checked.

``ot.emd`` stops at ``numItermax`` pivots and returns the current, feasible but non-optimal plan
with only a ``UserWarning``: an acceptance bound computed from it would be silently too low. Here a
non-optimal exit is an error naming the limit. And HiGHS: :func:`solve_lp`, whose solves a
:func:`lp_time_limit` block stops after a time limit.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import sys
import warnings
from collections.abc import Iterator

import numpy as np

from otbound._validation import InvalidInputError

#: default pivot limit (POT's own default is 100,000, reached on the V ≈ 400, K = 2 acceptance LP)
EMD_MAX_ITER = 10_000_000

HIGHS_OPTIONS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
#: last resort of :func:`solve_lp` (tolerances 1e-9: the accuracy the tests allow an LP value)
HIGHS_FALLBACK_OPTIONS = {"primal_feasibility_tolerance": 1e-9, "dual_feasibility_tolerance": 1e-9}


_HIGHSPY_QUIET = False


def quiet_highspy() -> None:
    """Create highspy's first ``Highs`` object with the process's standard output closed.

    highspy prints its banner ("Running HiGHS ...: Copyright ...") from C++ when the first ``Highs`` of a
    process is constructed, before any option (``output_flag``, ``log_to_console``) can be set, so
    cvxpy's HiGHS solve puts it in every notebook cell and report that first uses it. The banner is
    printed once per process: after this call no ``Highs`` prints it. Idempotent; a no-op without
    highspy.

    Examples
    --------
    >>> from otbound._solvers import quiet_highspy
    >>> quiet_highspy()
    """
    global _HIGHSPY_QUIET
    if _HIGHSPY_QUIET:
        return
    _HIGHSPY_QUIET = True
    try:
        import highspy
    except ImportError:
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            try:
                highspy.Highs()
            finally:
                os.dup2(saved, 1)
    finally:
        os.close(saved)


def emd(a: np.ndarray, b: np.ndarray, cost: np.ndarray, *, max_iter: int = EMD_MAX_ITER) -> np.ndarray:
    """Optimal plan of ``min <π, cost>`` with marginals ``a``, ``b`` (POT ``ot.emd``).

    Parameters
    ----------
    a, b : numpy.ndarray
        Source and target marginals (non-negative, equal totals).
    cost : numpy.ndarray, shape (len(a), len(b))
    max_iter : int
        Pivot limit of the network simplex.

    Returns
    -------
    numpy.ndarray, shape (len(a), len(b))
        An optimal plan.

    Raises
    ------
    RuntimeError
        Unless the network simplex reports optimality (e.g. ``max_iter`` pivots were reached).
        Marginals with different totals are refused by POT itself (an ``AssertionError``).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound._solvers import emd
    >>> emd(np.array([0.5, 0.5]), np.array([0.5, 0.5]), np.array([[0.0, 1.0], [1.0, 0.0]]))
    array([[0.5, 0. ],
           [0. , 0.5]])
    >>> a = np.full(4, 0.25)
    >>> emd(a, a, np.arange(16.0).reshape(4, 4) % 3, max_iter=1)
    Traceback (most recent call last):
        ...
    RuntimeError: POT ot.emd did not reach optimality (numItermax reached before optimality. ...); max_iter=1
    """
    import ot

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the status is checked below instead
        plan, log = ot.emd(a, b, cost, numItermax=int(max_iter), log=True)
    if log["result_code"] != 1:  # 1 = OPTIMAL in POT's network simplex
        raise RuntimeError(f"POT ot.emd did not reach optimality ({log['warning']}); max_iter={int(max_iter):,}")
    return plan


def solve_lp(cost, a_ub, b_ub, a_eq, b_eq, bounds, what: str):
    """``scipy.optimize.linprog`` with HiGHS at ``HIGHS_OPTIONS``.

    HiGHS presolve occasionally reports a feasible LP as infeasible at these tight tolerances when
    some probabilities are tiny (seen with draft blocks of mass ~1e−10); the solve is then repeated
    without presolve, and last without presolve at feasibility tolerances 1e−9
    (:data:`HIGHS_FALLBACK_OPTIONS`; needed by the causal LP over UniVer's trees on the conformance
    kit's near-deterministic models, whose tree probabilities reach ~1e−19), before giving up.

    Parameters
    ----------
    cost, a_ub, b_ub, a_eq, b_eq, bounds
        As for ``scipy.optimize.linprog`` (minimise ``cost @ x``).
    what : str
        What the LP computes, named in the error.

    Returns
    -------
    scipy.optimize.OptimizeResult
        With ``status == 0``.

    Raises
    ------
    RuntimeError
        If HiGHS fails in all three attempts (infeasible, unbounded, ...).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound._solvers import solve_lp
    >>> res = solve_lp(np.array([-1.0, -1.0]), np.array([[1.0, 2.0]]), np.array([1.0]), None, None,
    ...                [(0, None), (0, None)], "example LP")
    >>> res.fun, res.x
    (-1.0, array([1., 0.]))
    >>> solve_lp(np.array([1.0]), None, None, np.array([[1.0], [1.0]]), np.array([1.0, 2.0]), [(0, None)], "example LP")
    Traceback (most recent call last):
        ...
    RuntimeError: HiGHS failed on the example LP: The problem is infeasible. ...
    """
    import scipy.optimize  # imported here: it costs ~0.3 s at ``import otbound``

    res = None
    for options in ({**HIGHS_OPTIONS, "presolve": True}, {**HIGHS_OPTIONS, "presolve": False},
                    {**HIGHS_FALLBACK_OPTIONS, "presolve": False}):
        res = scipy.optimize.linprog(
            cost,
            A_ub=a_ub,
            b_ub=b_ub,
            A_eq=a_eq,
            b_eq=b_eq,
            bounds=bounds,
            method="highs",
            options=options,
        )
        if res.status == 0:
            return res
    raise RuntimeError(f"HiGHS failed on the {what}: {res.message}")


@contextlib.contextmanager
def lp_time_limit(seconds: float) -> Iterator[None]:
    """Stop every HiGHS solve otbound makes inside the block after ``seconds`` of solver time.

    HiGHS's ``time_limit`` option is added to the options of every HiGHS solve (``scipy.optimize.linprog``
    and cvxpy's HiGHS) for the block, and the options are restored when it exits (also on an
    exception). A solve that reaches the limit does not return a number: an LP is tried at three
    settings (presolve, none, looser feasibility tolerances), each stopping after ``seconds`` (so
    one LP stops within ``3 · seconds``), and then ``RuntimeError`` is raised. Useful where
    HiGHS can stall (near-deterministic laws whose path probabilities reach ~1e-12 beside ~1) and a
    missing value is better than a long wait. The options are process-wide: a block in one thread
    limits the solves of every thread.

    Parameters
    ----------
    seconds : float
        The limit per HiGHS solve, positive and finite.

    Yields
    ------
    None

    Raises
    ------
    otbound.InvalidInputError
        ``seconds`` not a positive finite number.

    Examples
    --------
    >>> import numpy as np
    >>> import otbound as ob
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> with ob.lp_time_limit(30.0):
    ...     round(ob.optimal_acceptance_lp(p, ob.draft_joint(q, 2)), 4)
    0.86
    >>> with ob.lp_time_limit(0):
    ...     pass
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: seconds must be a positive finite number, got 0
    """
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or not 0 < seconds < float("inf"):
        raise InvalidInputError(f"seconds must be a positive finite number, got {seconds!r}")
    shared = (HIGHS_OPTIONS, HIGHS_FALLBACK_OPTIONS)
    saved = [dict(o) for o in shared]
    for options in shared:
        options["time_limit"] = float(seconds)
    try:
        yield
    finally:
        for options, old in zip(shared, saved):
            options.clear()
            options.update(old)
