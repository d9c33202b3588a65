"""Optimal token-level multi-draft acceptance α*(p, Q): dual (prefix / subset) and primal (LP) forms.

Primal (SpecTr 2310.15141 §3; Hu et al. 2502.18779 §3)::

    α*(p, Q) = max_{π ≥ 0} Σ_{y ∈ x̄} π(x̄, y)   s.t.  Σ_y π(x̄, y) = Q(x̄),  Σ_x̄ π(x̄, y) = p(y).

Dual / min-cut (Hu et al. Theorem 3.1)::

    α*(p, Q) = 1 + min_{H ⊆ V} [ p(H) − Q(H) ],   Q(H) = P(all K drafts lie in H).

Prefix theorem: with tokens sorted by p(i)/q(i) ascending the minimum is attained at a prefix, so
α* costs a sort plus Q on nested prefixes (proved for i.i.d. drafts, tested against brute force
for drafts without replacement; the greedy law has the closed form
α*_greedy = p(G) + Σ_{x∉G} min(p(x), q'(x))).

Tolerances: laws are accepted within ``LAW_ATOL = 1e-6`` of summing to 1 and renormalised; the
with-replacement and greedy values are exact up to float64 summation (≈1e-15·V); the
without-replacement value carries the quadrature error of :mod:`otbound.token._wor` (stated 1e-12,
measured below 1e-13 against its reference DP and exact enumeration).

Computation: the batched sorted-rows kernel of :mod:`otbound.token._kernel` (one ratio ordering per
row, prefix sums, on the caller's device); without replacement at K ≥ 3 the branch and bound over
ratio buckets of :mod:`otbound.token._search`. A single call on numpy laws sorts no row whole: with
replacement sums ratio buckets, the greedy and deterministic laws select the largest q, each
checking the laws on its way (:meth:`otbound.token.DraftLaw.single_call`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse

from otbound._backend import on_one_cpu_thread, to_numpy
from otbound._solvers import EMD_MAX_ITER, HIGHS_OPTIONS, emd, quiet_highspy, solve_lp
from otbound._validation import InvalidInputError, as_law, as_pair, check_real
from otbound.token._kernel import LawBatch
from otbound.token.draft_laws import draft_law, inclusion_probabilities


@dataclass
class TokenBound:
    """An optimal acceptance value and its certificate.

    Returned by :func:`otbound.optimal_acceptance` (``return_certificate=True``),
    :func:`optimal_acceptance_lp` (``return_plan=True``) and :func:`optimal_acceptance_brute_force`.
    The value is α*(p, Q) = max_π Σ_{y ∈ x̄} π(x̄, y) = 1 + min_H [p(H) − Q(H)].

    Attributes
    ----------
    value : float or numpy.ndarray
        α* (float, or array over the batch).
    sampling : str or None
        The draft law's name, when the value was computed from (p, q) and a law.
    num_drafts : int or None
        K.
    method : str
        How it was computed: ``"prefix"``, ``"lp-highs"``, ``"lp-cvxpy"``, ``"lp-pot"`` or
        ``"brute-force"``.
    binding_set : numpy.ndarray or None
        Boolean mask over V of a minimising set H* of the dual (or None).
    plan : numpy.ndarray or None
        The optimal plan π*(x̄, y), shape (V,)*K + (V,) (primal LP only, on request).
    dual : LPDual or None
        The LP's dual variables, an :class:`LPDual` (primal LP with ``method="highs"`` only).

    References
    ----------
    Hu et al., arXiv 2502.18779, Theorem 3.1 (dual); Sun et al., "SpecTr", arXiv 2310.15141 §3
    (primal).

    Examples
    --------
    >>> import numpy as np
    >>> import otbound as ob
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> res = ob.optimal_acceptance(p, q, 2, return_certificate=True)
    >>> round(res.value, 6), res.method, res.binding_set.tolist()
    (0.86, 'prefix', [False, True, True])
    """

    value: float | np.ndarray
    sampling: str | None = None
    num_drafts: int | None = None
    method: str = ""
    binding_set: np.ndarray | None = None
    plan: np.ndarray | None = field(default=None, repr=False)
    dual: LPDual | None = field(default=None, repr=False)


@dataclass(frozen=True)
class LPDual:
    """Dual certificate of the acceptance LP (:func:`optimal_acceptance_lp`, ``method="highs"``).

    support: ``(m, K)`` int, the draft tuples x̄ with Q(x̄) > 0; drafts: ``(m,)`` u(x̄), one per
    support tuple; tokens: ``(V,)`` v(y). Optimality: ``Σ_x̄ Q(x̄) u(x̄) + Σ_y p(y) v(y) = α*`` and
    ``u(x̄) + v(y) ≥ 1`` for every ``y ∈ x̄`` (to the solver's tolerance, ~1e-9).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound import draft_joint, optimal_acceptance_lp
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> joint = draft_joint(q, 2, "with_replacement")
    >>> res = optimal_acceptance_lp(p, joint, return_plan=True)
    >>> d = res.dual
    >>> bool(abs(joint[tuple(d.support.T)] @ d.drafts + p @ d.tokens - res.value) < 1e-8)
    True
    """

    support: np.ndarray
    drafts: np.ndarray
    tokens: np.ndarray


# ---------------------------------------------------------------------------------------------
# dual / prefix form


@on_one_cpu_thread
def optimal_acceptance(p, q, num_drafts: int, sampling: str = "with_replacement", *, return_certificate=False):
    """α*(p, Q) for the draft law ``sampling`` built from ``q`` with ``num_drafts`` drafts.

    Dual / min-cut form (Hu et al. 2502.18779 Theorem 3.1): ``α* = 1 + min_H [p(H) − Q(H)]`` with
    ``Q(H)`` = P(all K drafts lie in H), minimised over prefixes of the tokens sorted by p/q (module
    docstring; exact up to float64 summation, without replacement within 1e-12).

    Parameters
    ----------
    p, q : array_like or torch.Tensor, shape (V,) or (..., V)
        Target and draft laws along the last axis (same shape; each row sums to 1 within
        ``LAW_ATOL``).
    num_drafts : int
        K ≥ 1 (at most the support of q for the laws without replacement and greedy).
    sampling : str or DraftLaw
        The draft law (:data:`otbound.DRAFT_LAWS`).
    return_certificate : bool
        Also return the binding set.

    Returns
    -------
    float, numpy.ndarray, torch.Tensor or TokenBound
        α*: a float for 1-D laws, an array over the batch shape otherwise, a float64 tensor on the
        input's device for torch input. With ``return_certificate=True`` a :class:`TokenBound` whose
        ``binding_set`` is H* (the tokens that bind: α* = 1 + p(H*) − Q(H*)), a boolean array of
        the laws' shape (a tensor for torch input).

    Raises
    ------
    InvalidInputError
        Malformed laws, an unknown ``sampling``, or K beyond the support of q where it must not be.

    Examples
    --------
    >>> import numpy as np
    >>> import otbound as ob
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> round(ob.optimal_acceptance(p, q, 2), 6)
    0.86
    >>> ob.optimal_acceptance(np.stack([p, q]), np.stack([q, p]), 2, "greedy").round(6)
    array([0.9, 0.9])
    >>> ob.optimal_acceptance(p, q, 2, return_certificate=True).binding_set
    array([False,  True,  True])
    """
    law = draft_law(sampling)
    if not return_certificate:  # a law's own path for laws as given, checked on its way (or None)
        value = law.single_call(p, q, num_drafts)
        if value is not None:
            return value
    batch = LawBatch(p, q)
    k = batch.check_num_drafts(num_drafts, law)
    values, sets = law.optimal_acceptance(batch, k, want_sets=return_certificate)
    if not return_certificate:
        return batch.wrap(values)
    sets = sets.reshape(batch.shape + (batch.vocab,))
    return TokenBound(
        value=batch.wrap(values),
        sampling=law.name,
        num_drafts=k,
        method=law.method,
        binding_set=sets if batch.device is not None else sets.cpu().numpy(),
    )



# ---------------------------------------------------------------------------------------------
# explicit joint laws: primal LP and brute force


def _check_joint(p, draft_joint):
    p = as_law(to_numpy(p)[0], "p", ndim=1)
    joint = np.asarray(check_real(to_numpy(draft_joint)[0], "draft_joint"), dtype=np.float64)
    v = p.size
    if joint.ndim < 1 or any(s != v for s in joint.shape):
        raise InvalidInputError(f"draft_joint must have shape (V,)*K with V = {v}, got {joint.shape}")
    as_law(joint.ravel(), "draft_joint")
    return p, joint / joint.sum()


def _membership_edges(joint: np.ndarray):
    """Support tuples of Q and the (tuple, token) pairs with token ∈ tuple."""
    support = np.flatnonzero(joint.ravel() > 0)
    tuples = np.stack(np.unravel_index(support, joint.shape), axis=1)
    src, dst = [], []
    for a, tup in enumerate(tuples):
        for y in np.unique(tup):
            src.append(a)
            dst.append(y)
    return support, tuples, np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)


# HiGHS defaults (1e-7) leave ~3e-8 errors in α*; these give agreement with the dual to ~1e-12.
def optimal_acceptance_lp(
    p, draft_joint, *, return_plan: bool = False, method: str = "highs", max_iter: int = EMD_MAX_ITER
):
    """α*(p, Q) by the primal LP for an explicit joint draft law ``draft_joint`` of shape (V,)*K.

    Primal (SpecTr 2310.15141 §3; Hu et al. 2502.18779 §3). Only accepting pairs (x̄, y ∈ x̄) are
    variables (the rest of the plan is slack): max Σ π_e s.t. Σ_{y∈x̄} π(x̄, y) ≤ Q(x̄),
    Σ_{x̄∋y} π(x̄, y) ≤ p(y), π ≥ 0 — a bipartite max-flow.

    Parameters
    ----------
    p : array_like, shape (V,)
        Target law.
    draft_joint : array_like, shape (V,)*K
        Joint law Q(x̄) of the ordered draft tuple (e.g. :func:`otbound.draft_joint`).
    return_plan : bool
        Return a :class:`TokenBound` with the plan instead of the value.
    method : {"highs", "cvxpy", "pot"}
        "highs": ``scipy.optimize.linprog`` on the sparse LP at feasibility tolerances 1e-10;
        "cvxpy"; "pot": network simplex ``ot.emd`` on the dense cost 1[y ∉ x̄].
    max_iter : int
        Pivot limit of "pot"; a non-optimal exit raises ``RuntimeError`` rather than returning a
        low value.

    Returns
    -------
    float or TokenBound
        α*; with ``return_plan=True`` a :class:`TokenBound` with the full plan π*(x̄, y)
        (accepting part plus an independent coupling of the leftover masses) and, for "highs",
        the LP duals.

    Raises
    ------
    InvalidInputError
        ``p`` not a law, ``draft_joint`` not a law of shape (V,)*K, or an unknown ``method``.
    RuntimeError
        The solver did not reach optimality (``"pot"`` past ``max_iter``, ``"cvxpy"`` failing).

    References
    ----------
    Sun et al., "SpecTr: fast speculative decoding via optimal transport", arXiv 2310.15141 §3;
    Hu et al., arXiv 2502.18779 §3.

    Examples
    --------
    >>> import numpy as np
    >>> import otbound as ob
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> joint = ob.draft_joint(q, 2, "with_replacement")
    >>> round(ob.optimal_acceptance_lp(p, joint), 6)
    0.86
    >>> round(ob.optimal_acceptance_lp(p, joint, method="pot"), 6)
    0.86
    >>> res = ob.optimal_acceptance_lp(p, joint, return_plan=True)
    >>> res.plan.shape, round(float(res.plan.sum()), 6)
    ((3, 3, 3), 1.0)
    """
    p, joint = _check_joint(p, draft_joint)
    v, k = p.size, joint.ndim
    support, tuples, src, dst = _membership_edges(joint)
    qa = joint.ravel()[support]
    dual = None
    if method == "pot":
        cost = np.ones((support.size, v))
        cost[src, dst] = 0.0
        plan_s = emd(qa, p, cost, max_iter=max_iter)
        flow = plan_s[src, dst]
    elif method in ("highs", "cvxpy"):
        ne = src.size
        a_ub = scipy.sparse.vstack(
            [
                scipy.sparse.csr_matrix((np.ones(ne), (src, np.arange(ne))), shape=(support.size, ne)),
                scipy.sparse.csr_matrix((np.ones(ne), (dst, np.arange(ne))), shape=(v, ne)),
            ]
        ).tocsr()
        b_ub = np.concatenate([qa, p])
        if method == "highs":
            res = solve_lp(-np.ones(ne), a_ub, b_ub, None, None, (0, None), "acceptance LP")
            flow = res.x
            marg = -res.ineqlin.marginals
            dual = LPDual(support=tuples, drafts=marg[: support.size], tokens=marg[support.size :])
        else:
            import cvxpy as cp

            x = cp.Variable(ne, nonneg=True)
            prob = cp.Problem(cp.Maximize(cp.sum(x)), [a_ub @ x <= b_ub])
            if "HIGHS" in cp.installed_solvers():
                quiet_highspy()  # no banner in the caller's output (notebook cells, reports)
                prob.solve(solver=cp.HIGHS, **HIGHS_OPTIONS)
            else:
                prob.solve()
            if prob.status not in ("optimal", "optimal_inaccurate"):
                raise RuntimeError(f"cvxpy failed on the acceptance LP: {prob.status}")
            flow = np.maximum(np.asarray(x.value).ravel(), 0.0)
    else:
        raise InvalidInputError(f"unknown method {method!r}; expected 'highs', 'cvxpy' or 'pot'")
    value = float(min(1.0, flow.sum()))
    if not return_plan:
        return value
    plan_s = np.zeros((support.size, v))
    np.add.at(plan_s, (src, dst), flow)
    row_left = np.maximum(qa - plan_s.sum(1), 0.0)
    col_left = np.maximum(p - plan_s.sum(0), 0.0)
    left = row_left.sum()
    if left > 0:
        plan_s += np.outer(row_left, col_left) / left
    plan = np.zeros((v**k, v))
    plan[support] = plan_s
    return TokenBound(value=value, num_drafts=k, method=f"lp-{method}", plan=plan.reshape((v,) * k + (v,)), dual=dual)


def optimal_acceptance_brute_force(p, draft_joint) -> TokenBound:
    """α* = 1 + min over all 2^|V| subsets H of [p(H) − Q(H)], for V ≤ 20 (an independent check).

    Q(H) for every H by a subset-sum (zeta) transform of the tuples' token-set masks.

    Parameters
    ----------
    p : array_like, shape (V,)
        Target law, V ≤ 20.
    draft_joint : array_like, shape (V,)*K
        Joint law Q(x̄) of the ordered draft tuple.

    Returns
    -------
    TokenBound
        ``value`` α* and ``binding_set`` H* (a boolean mask over V).

    Raises
    ------
    InvalidInputError
        ``p`` not a law, ``draft_joint`` not a law of shape (V,)*K, or V > 20.

    References
    ----------
    Hu et al., arXiv 2502.18779, Theorem 3.1 (the subset / min-cut form).

    Examples
    --------
    >>> import numpy as np
    >>> import otbound as ob
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> res = ob.optimal_acceptance_brute_force(p, ob.draft_joint(q, 2))
    >>> round(res.value, 6), res.binding_set.tolist()
    (0.86, [False, True, True])
    """
    p, joint = _check_joint(p, draft_joint)
    v = p.size
    if v > 20:
        raise InvalidInputError(f"brute force over 2^V subsets needs V <= 20, got V = {v}")
    support, tuples, _, _ = _membership_edges(joint)
    masks = np.zeros(support.size, dtype=np.int64)
    for j in range(joint.ndim):
        masks |= np.left_shift(1, tuples[:, j])
    qsub = np.zeros(1 << v)
    np.add.at(qsub, masks, joint.ravel()[support])
    psub = np.zeros(1 << v)
    psub[np.left_shift(1, np.arange(v))] = p
    for bit in range(v):  # zeta transform: sum over subsets
        for arr in (qsub, psub):
            view = arr.reshape(-1, 2, 1 << bit)
            view[:, 1, :] += view[:, 0, :]
    f = psub - qsub
    h = int(np.argmin(f))
    binding = ((h >> np.arange(v)) & 1).astype(bool)
    return TokenBound(
        value=float(1.0 + min(0.0, f[h])), num_drafts=joint.ndim, method="brute-force", binding_set=binding
    )


# ---------------------------------------------------------------------------------------------
# cheap relaxations


@dataclass
class Relaxation:
    """Cheap sanity bracket: lower ≤ α* ≤ upper (returned by :func:`relaxation_bounds`).

    upper = Σ_y min(p(y), P(y ∈ x̄)) (a token can only be accepted if drafted);
    lower = 1 − TV(p, law of one draft) (couple one draft optimally, ignore the rest).

    Attributes
    ----------
    lower : float
        1 − TV(p, law of one draft) = Σ_y min(p(y), q₁(y)).
    upper : float
        min(1, Σ_y min(p(y), P(y ∈ x̄))).

    References
    ----------
    Sun et al., "SpecTr", arXiv 2310.15141 (the single-draft coupling 1 − TV); Hu et al.,
    arXiv 2502.18779 (α* these bracket).

    Examples
    --------
    >>> from otbound.token import Relaxation
    >>> r = Relaxation(lower=0.7, upper=0.86)
    >>> r.lower <= r.upper
    True
    """

    lower: float
    upper: float


def relaxation_bounds(p, q, num_drafts: int, sampling: str = "with_replacement") -> Relaxation:
    """The simple relaxations of docs/theory/token-bounds.md for one (p, q) pair (1-D).

    ``lower = Σ_y min(p(y), q₁(y))`` with q₁ the law of the one random draft coupled (q, or q' for
    the greedy law) and ``upper = min(1, Σ_y min(p(y), P(y ∈ x̄)))``; lower ≤ α*(p, Q) ≤ upper.

    Parameters
    ----------
    p, q : array_like or torch.Tensor, shape (V,)
        Target and draft laws.
    num_drafts : int
        K ≥ 1.
    sampling : str or DraftLaw
        The draft law (:data:`otbound.DRAFT_LAWS`).

    Returns
    -------
    Relaxation
        The bracket ``(lower, upper)``.

    Raises
    ------
    InvalidInputError
        Malformed or batched laws, an unknown ``sampling``, or an invalid K.

    References
    ----------
    Sun et al., "SpecTr", arXiv 2310.15141; Hu et al., arXiv 2502.18779.

    Examples
    --------
    >>> import numpy as np
    >>> import otbound as ob
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> r = ob.relaxation_bounds(p, q, 2)
    >>> round(r.lower, 6), round(r.upper, 6)
    (0.7, 0.86)
    >>> r.lower <= ob.optimal_acceptance(p, q, 2) <= r.upper + 1e-12
    True
    """
    p, q = as_pair(to_numpy(p)[0], to_numpy(q)[0])
    if p.ndim != 1:
        raise InvalidInputError(f"relaxation_bounds takes 1-D laws, got shape {p.shape}")
    law = draft_law(sampling)
    k = law.check_num_drafts(num_drafts, q)
    incl = inclusion_probabilities(q, k, law)
    one = law.coupling_law(q, k)
    return Relaxation(lower=float(np.minimum(p, one).sum()), upper=float(min(1.0, np.minimum(p, incl).sum())))
