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
without-replacement value carries the quadrature error of :mod:`otbound._wor` (< 1e-12 measured).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.optimize
import scipy.sparse

from otbound import _wor
from otbound._backend import to_numpy, wrap_like
from otbound._validation import (
    InvalidInputError,
    as_law,
    as_pair,
    check_num_drafts,
    check_sampling,
)
from otbound.draft_laws import greedy_split, inclusion_probabilities


@dataclass
class TokenBound:
    """An optimal acceptance value and its certificate.

    value: α* (float, or array over the batch).
    binding_set: boolean mask over V of a minimising set H* of the dual (or None).
    plan: the optimal plan π*(x̄, y), shape (V,)*K + (V,) (primal LP only, on request).
    dual: LP dual variables {"drafts": u(x̄) over the support, "tokens": v(y)} (primal LP only).
    """

    value: float | np.ndarray
    sampling: str | None = None
    num_drafts: int | None = None
    method: str = ""
    binding_set: np.ndarray | None = None
    plan: np.ndarray | None = field(default=None, repr=False)
    dual: dict | None = field(default=None, repr=False)


# ---------------------------------------------------------------------------------------------
# dual / prefix form


def optimal_acceptance(p, q, num_drafts: int, sampling: str = "with_replacement", *, return_certificate=False):
    """α*(p, Q) for the draft law ``sampling`` built from ``q`` with ``num_drafts`` drafts.

    ``p``, ``q``: laws along the last axis; 1-D gives a float, ``(..., V)`` an array over the batch,
    torch tensors (CPU or CUDA) a float64 tensor on the same device. With
    ``return_certificate=True`` a :class:`TokenBound` whose ``binding_set`` is H* (the tokens that
    bind: α* = 1 + p(H*) − Q(H*)).
    """
    p, device = to_numpy(p)
    q, _ = to_numpy(q)
    p, q = as_pair(p, q)
    check_sampling(sampling)
    k = check_num_drafts(num_drafts, q, sampling)
    shape = p.shape[:-1]
    P = p.reshape(-1, p.shape[-1])
    Q = q.reshape(-1, q.shape[-1])
    if sampling == "with_replacement":
        values, sets = _with_replacement(P, Q, k, return_certificate)
    elif sampling == "greedy":
        values, sets = _greedy(P, Q, k, return_certificate)
    else:
        values, sets = _without_replacement(P, Q, k, return_certificate)
    values = np.clip(values, 0.0, 1.0).reshape(shape)
    if not return_certificate:
        return wrap_like(values, device)
    return TokenBound(
        value=wrap_like(values, device),
        sampling=sampling,
        num_drafts=k,
        method="prefix",
        binding_set=sets.reshape(p.shape),
    )


def _ratio(P: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """p/q with q = 0 mapped to +inf (those tokens sort last)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = P / Q
    r[Q == 0] = np.inf
    return r


def _with_replacement_sorted(P: np.ndarray, Q: np.ndarray, k: int) -> np.ndarray:
    """Plain O(V log V) reference: full sort by ratio, cumulative sums, min over prefixes."""
    order = np.argsort(_ratio(P, Q), axis=1, kind="stable")
    cp = np.cumsum(np.take_along_axis(P, order, axis=1), axis=1)
    cq = np.cumsum(np.take_along_axis(Q, order, axis=1), axis=1)
    return 1.0 + np.minimum(0.0, np.min(cp - cq**k, axis=1))


# ratio buckets for the branch-and-bound: 8 per octave from 2^-64 up to K, plus "ratio 0" first.
_SUB = 8
_LOW_EXP = -64


def _with_replacement(P, Q, k, want_sets):
    """Exact α* for i.i.d. drafts without a full sort (branch and bound over ratio buckets).

    Tokens with p/q > K never bind (adding i to H changes p(H) − q(H)^K by at least p_i − K q_i),
    so only r ≤ K are kept. Those are bucketed by their float exponent and top mantissa bits
    (monotone in r), bucket sums give the value at every bucket end and, inside bucket b, the lower
    bound p(before b) − q(through b)^K. Only buckets whose lower bound beats the best end value are
    sorted exactly, so the sort touches a few thousand tokens instead of V.
    """
    n, v = P.shape
    r = _ratio(P, Q)
    keep = r <= k
    with np.errstate(invalid="ignore"):
        mant, expo = np.frexp(np.where(keep, r, 1.0))
    nb = (int(np.frexp(float(k))[1]) - _LOW_EXP + 1) * _SUB + 2  # bucket 0: r == 0; last: r > K (dropped)
    b = (expo - _LOW_EXP) * _SUB + ((mant - 0.5) * (2 * _SUB)).astype(np.int64) + 1
    np.clip(b, 1, nb - 2, out=b)
    b[r == 0] = 0
    b[~keep] = nb - 1
    flat = (b + (np.arange(n) * nb)[:, None]).ravel()
    bp = np.bincount(flat, weights=P.ravel(), minlength=n * nb).reshape(n, nb)[:, :-1]
    bq = np.bincount(flat, weights=Q.ravel(), minlength=n * nb).reshape(n, nb)[:, :-1]
    cp_end = np.cumsum(bp, axis=1)
    cq_end = np.cumsum(bq, axis=1)
    cp_start = cp_end - bp
    best = np.minimum(0.0, np.min(cp_end - cq_end**k, axis=1))
    lower = cp_start - cq_end**k
    values = 1.0 + best
    sets = np.zeros((n, v), dtype=bool) if want_sets else None
    best_bucket = np.where(best < 0, np.argmin(cp_end - cq_end**k, axis=1), -1)
    for i in range(n):
        cand = np.flatnonzero((lower[i] < best[i]) & (bq[i] > 0))
        row_best, cut_bucket, cut_tokens = best[i], best_bucket[i], None
        if cand.size:
            sel = np.flatnonzero(np.isin(b[i], cand))
            sel = sel[np.argsort(r[i, sel], kind="stable")]
            bucket_of = b[i, sel]
            # prefix sums restarted at each bucket, offset by the sums before that bucket
            cps = np.cumsum(P[i, sel])
            cqs = np.cumsum(Q[i, sel])
            first = np.searchsorted(bucket_of, bucket_of, side="left")
            base_p = np.where(first > 0, cps[first - 1], 0.0)
            base_q = np.where(first > 0, cqs[first - 1], 0.0)
            f = (cp_start[i, bucket_of] + cps - base_p) - (cq_end[i, bucket_of] - bq[i, bucket_of] + cqs - base_q) ** k
            j = int(np.argmin(f))
            if f[j] < row_best:
                row_best, cut_bucket = f[j], -2
                cut_tokens = (bucket_of[j], sel[first[j] : j + 1])
        values[i] = 1.0 + min(0.0, row_best)
        if want_sets and row_best < 0:
            if cut_bucket == -2:
                bb, toks = cut_tokens
                sets[i] = b[i] < bb
                sets[i, toks] = True
            else:
                sets[i] = b[i] <= cut_bucket
    return values, sets


def _greedy(P, Q, k, want_sets):
    """Closed form α*_greedy = p(G) + Σ_{x∉G} min(p(x), q'(x)) (theory.md §2, derived)."""
    n, v = P.shape
    values = np.empty(n)
    sets = np.zeros((n, v), dtype=bool) if want_sets else None
    for i in range(n):
        g, qp = greedy_split(Q[i], k)
        in_g = np.zeros(v, dtype=bool)
        in_g[g] = True
        gain = np.where(in_g, 0.0, np.minimum(P[i] - qp, 0.0))
        f = P[i, in_g].sum() + gain.sum()  # p(H) − Q(H) at H = G ∪ {x ∉ G: p < q'}
        values[i] = 1.0 + min(0.0, f)
        if want_sets and f < 0:
            sets[i] = in_g | (gain < 0)
    return values, sets


def _without_replacement(P, Q, k, want_sets):
    """α* for drafts without replacement: prefix minimum with Q(H_m) from :mod:`otbound._wor`.

    Only tokens with p_i/q_i ≤ K / (1 − M) can bind, M the mass of the K − 1 largest q's: adding i
    to H raises Q(H) by at most P(i among the drafts) ≤ K q_i / (1 − M).
    """
    n, v = P.shape
    values = np.empty(n)
    sets = np.zeros((n, v), dtype=bool) if want_sets else None
    r = _ratio(P, Q)
    for i in range(n):
        top = np.sort(np.partition(Q[i], v - k + 1)[v - k + 1 :]) if k > 1 else np.zeros(0)
        cut = k / max(1.0 - top.sum(), 1e-300)
        cand = np.flatnonzero(r[i] <= cut)
        order = cand[np.argsort(r[i, cand], kind="stable")]
        if order.size == 0:
            values[i] = 1.0
            continue
        f = np.cumsum(P[i, order]) - _wor.wor_prefix_mass(Q[i], order, k)
        j = int(np.argmin(f))
        values[i] = 1.0 + min(0.0, f[j])
        if want_sets and f[j] < 0:
            sets[i, order[: j + 1]] = True
    return values, sets


# ---------------------------------------------------------------------------------------------
# explicit joint laws: primal LP and brute force


def _check_joint(p, draft_joint):
    p = as_law(to_numpy(p)[0], "p", ndim=1)
    joint = np.asarray(to_numpy(draft_joint)[0], dtype=np.float64)
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
_HIGHS_TOL = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}


def optimal_acceptance_lp(p, draft_joint, *, return_plan: bool = False, method: str = "highs"):
    """α*(p, Q) by the primal LP for an explicit joint draft law ``draft_joint`` of shape (V,)*K.

    Only accepting pairs (x̄, y ∈ x̄) are variables (the rest of the plan is slack):
    max Σ π_e s.t. Σ_{y∈x̄} π(x̄, y) ≤ Q(x̄), Σ_{x̄∋y} π(x̄, y) ≤ p(y), π ≥ 0 — a bipartite
    max-flow. ``method``: "highs" (scipy.optimize.linprog, sparse), "cvxpy", or "pot" (network
    simplex ``ot.emd`` on the dense cost 1[y ∉ x̄]). With ``return_plan=True`` a
    :class:`TokenBound` with the full plan π*(x̄, y) (accepting part plus an independent coupling
    of the leftover masses) and, for "highs", the LP duals.
    """
    p, joint = _check_joint(p, draft_joint)
    v, k = p.size, joint.ndim
    support, tuples, src, dst = _membership_edges(joint)
    qa = joint.ravel()[support]
    dual = None
    if method == "pot":
        import ot

        cost = np.ones((support.size, v))
        cost[src, dst] = 0.0
        plan_s = ot.emd(qa, p, cost)
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
            res = scipy.optimize.linprog(-np.ones(ne), A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs", options=_HIGHS_TOL)
            if res.status != 0:
                raise RuntimeError(f"HiGHS failed on the acceptance LP: {res.message}")
            flow = res.x
            marg = -res.ineqlin.marginals
            dual = {"drafts": marg[: support.size], "tokens": marg[support.size :], "support": tuples}
        else:
            import cvxpy as cp

            x = cp.Variable(ne, nonneg=True)
            prob = cp.Problem(cp.Maximize(cp.sum(x)), [a_ub @ x <= b_ub])
            prob.solve(solver=cp.HIGHS if "HIGHS" in cp.installed_solvers() else None)
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
    return TokenBound(value=float(1.0 + min(0.0, f[h])), num_drafts=joint.ndim, method="brute-force", binding_set=binding)


# ---------------------------------------------------------------------------------------------
# cheap relaxations


@dataclass
class Relaxation:
    """Cheap sanity bracket: lower ≤ α* ≤ upper.

    upper = Σ_y min(p(y), P(y ∈ x̄)) (a token can only be accepted if drafted);
    lower = 1 − TV(p, law of one draft) (couple one draft optimally, ignore the rest).
    """

    lower: float
    upper: float


def relaxation_bounds(p, q, num_drafts: int, sampling: str = "with_replacement") -> Relaxation:
    """The simple relaxations of theory.md §2 for one (p, q) pair (1-D)."""
    p, q = as_pair(to_numpy(p)[0], to_numpy(q)[0])
    if p.ndim != 1:
        raise InvalidInputError(f"relaxation_bounds takes 1-D laws, got shape {p.shape}")
    k = check_num_drafts(num_drafts, q, sampling)
    incl = inclusion_probabilities(q, k, sampling)
    one = greedy_split(q, k)[1] if sampling == "greedy" else q
    return Relaxation(lower=float(np.minimum(p, one).sum()), upper=float(min(1.0, np.minimum(p, incl).sum())))
