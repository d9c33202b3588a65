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

Speed (experiments/bench_token_bounds.py): the dual is computed without a full sort. Tokens are
bucketed by the bit pattern of p/q (32 buckets per octave, a bincount per row), prefix values come
from bucket sums, and a branch and bound sorts only the buckets whose lower bound can beat the best
value found (a few thousand tokens of V = 151,936).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse

from otbound._backend import to_numpy, wrap_like
from otbound._solvers import EMD_MAX_ITER, HIGHS_OPTIONS, emd, solve_lp
from otbound._validation import (
    InvalidInputError,
    as_law,
    as_pair,
    check_num_drafts,
)
from otbound.token import _wor
from otbound.token.draft_laws import _greedy_split, inclusion_probabilities
from otbound.token.laws import DRAFT_LAWS, draft_law


@dataclass
class TokenBound:
    """An optimal acceptance value and its certificate.

    value: α* (float, or array over the batch).
    binding_set: boolean mask over V of a minimising set H* of the dual (or None).
    plan: the optimal plan π*(x̄, y), shape (V,)*K + (V,) (primal LP only, on request).
    dual: the LP's dual variables, an :class:`LPDual` (primal LP with ``method="highs"`` only).
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
    sampling : {"with_replacement", "without_replacement", "greedy"}
        The draft law (:data:`otbound.DRAFT_LAWS`).
    return_certificate : bool
        Also return the binding set.

    Returns
    -------
    float, numpy.ndarray, torch.Tensor or TokenBound
        α*: a float for 1-D laws, an array over the batch shape otherwise, a float64 tensor on the
        input's device for torch input. With ``return_certificate=True`` a :class:`TokenBound` whose
        ``binding_set`` is H* (the tokens that bind: α* = 1 + p(H*) − Q(H*)).
    """
    p, device = to_numpy(p)
    q, _ = to_numpy(q)
    p, q = as_pair(p, q)
    law = draft_law(sampling)
    k = check_num_drafts(num_drafts, q, sampling)
    shape = p.shape[:-1]
    P = p.reshape(-1, p.shape[-1])
    Q = q.reshape(-1, q.shape[-1])
    values, sets = law.optimal_acceptance(P, Q, k, return_certificate)
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


# Ratio buckets for the branch and bound: the float64 bit pattern of r = p/q shifted right by 47 keeps
# the exponent and the top 5 mantissa bits, a bucket id monotone in r (32 buckets per octave).
_SHIFT = 47


def _ratio_buckets(p: np.ndarray, q: np.ndarray, limit: float, out=None) -> tuple[np.ndarray, int]:
    """Bucket id of every token's ratio p/q (one row) and the id ``top`` of the overflow bucket.

    Bucket j holds the ratios in [_bucket_floor(j), _bucket_floor(j + 1)); tokens with q = 0 (ratio
    inf or nan) and all buckets above the one holding ``limit`` are merged into ``top``, so every
    bucket below ``top`` holds only tokens with q > 0 and ratio < _bucket_floor(top). ``out``: a
    float64 scratch row, reused across rows (fresh large arrays cost page faults); the ids live in it.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        bits = np.divide(p, q, out=out).view(np.uint64)
    np.bitwise_and(bits, np.uint64(0x7FFF_FFFF_FFFF_FFFF), out=bits)  # −0.0 is 0; nan and inf lie above any ratio
    np.right_shift(bits, _SHIFT, out=bits)
    top = (int(np.float64(limit).view(np.uint64)) >> _SHIFT) + 1
    np.minimum(bits, np.uint64(top), out=bits)
    return bits.view(np.int64), top


def _bucket_sums(p: np.ndarray, q: np.ndarray, limit: float, out=None, ratio_sorted=False):
    """``(b, top, bp, bq, ids, sums)``: the buckets of :func:`_ratio_buckets`, the p and q mass of
    every bucket id ``0..top``, the ids below ``top`` holding q mass (in increasing ratio) and the
    :class:`otbound.token._wor.KeySums` of ``b`` (by runs when ``ratio_sorted``: the row is sorted
    by ratio)."""
    b, top = _ratio_buckets(p, q, limit, out=out)
    sums = _wor.KeySums(b, top, ratio_sorted)
    if ratio_sorted and sums.starts is None:  # the bucket ids of a ratio-sorted row never decrease
        raise InvalidInputError("a row given as sorted by ratio p/q (ascending, q = 0 last) is not")
    bp, bq = sums(p), sums(q)
    return b, top, bp, bq, np.flatnonzero(bq[:top] > 0), sums


def _bucket_floor(ids) -> np.ndarray:
    """Smallest ratio of each bucket id (the float whose bit pattern is id << _SHIFT)."""
    return np.left_shift(np.asarray(ids, dtype=np.int64), _SHIFT).view(np.float64)


def _bucket_tokens(b: np.ndarray, ids, p: np.ndarray, q: np.ndarray, ratio_sorted=False) -> np.ndarray:
    """Indices of the tokens in buckets ``ids``, sorted by ratio (ties: lower index first).
    ``ratio_sorted``: the row is sorted by ratio, so a bucket's tokens are a run of ``b`` (found by
    binary search; sorting the run again costs one pass)."""
    if ratio_sorted and len(ids) == 1:
        sel = np.arange(np.searchsorted(b, ids[0], "left"), np.searchsorted(b, ids[0], "right"))
    elif len(ids) == 1:
        sel = np.flatnonzero(b == ids[0])
    else:
        table = np.zeros(int(b.max()) + 1, dtype=bool)
        table[ids] = True
        sel = np.flatnonzero(table[b])
    return sel[np.argsort(p[sel] / q[sel], kind="stable")]


def _with_replacement(P, Q, k, want_sets):
    """Exact α* for i.i.d. drafts without a full sort (branch and bound over ratio buckets).

    f(H) = p(H) − q(H)^K over prefixes H of the ratio order. Tokens with p/q > K never bind (adding
    i to H changes f by at least p_i − K q_i), so only the buckets up to the one holding K are kept.
    Bucket sums give f exactly at every bucket end. Inside bucket j (ratios in [r_lo, r_hi), mass
    (p_j, q_j) after (P0, Q0)) a prefix that adds q-mass x adds p-mass ≥ max(r_lo x, p_j − r_hi(q_j − x)),
    so f ≥ P0 + r_lo x* − (Q0 + x*)^K at the kink x* = (r_hi q_j − p_j)/(r_hi − r_lo) (the bound is
    concave on each side of x*, and the two ends are bucket-end values). A minimiser H* also satisfies
    p_i/q_i ≤ K q(H*)^{K−1} ≤ p_j/q_j for i ∈ H*, j ∉ H* (theory.md §2), so a bucket can hold the end
    of H* only if K Q0^{K−1} ≤ r_hi and r_lo ≤ K (Q0 + q_j)^{K−1}. Only the buckets passing both tests
    are sorted token by token: one or two buckets, tens to a few thousand tokens out of V = 151,936
    on the benchmark's synthetic LM pairs. The bucket ids live in a scratch row reused across rows.
    """
    n, v = P.shape
    values = np.ones(n)
    sets = np.zeros((n, v), dtype=bool) if want_sets else None
    slack = 1.0 + 1e-12  # the stationarity test is only a filter: keep borderline buckets
    scratch = np.empty(v)
    for i in range(n):
        p, q = P[i], Q[i]
        b, top, bp, bq, ids, _ = _bucket_sums(p, q, float(k), out=scratch)
        if ids.size == 0:
            continue
        bp, bq = bp[ids], bq[ids]
        cp, cq = np.cumsum(bp), np.cumsum(bq)
        f_end = cp - cq**k
        j_end = int(np.argmin(f_end))
        best = min(0.0, float(f_end[j_end]))
        cp0, cq0 = cp - bp, cq - bq
        r_lo, r_hi = _bucket_floor(ids), _bucket_floor(ids + 1)
        kink = np.clip((r_hi * bq - bp) / (r_hi - r_lo), 0.0, bq)
        lower = cp0 + r_lo * kink - (cq0 + kink) ** k
        stationary = (k * cq0 ** (k - 1) <= r_hi * slack) & (r_lo <= k * cq ** (k - 1) * slack)
        cand = np.flatnonzero((lower < best) & stationary)
        cut = None  # (bucket position, tokens of that bucket in H*) when H* ends inside a bucket
        if cand.size:
            toks = _bucket_tokens(b, ids[cand], p, q)
            pos = np.searchsorted(ids, b[toks])  # bucket position of each token (non-decreasing)
            first = np.searchsorted(pos, pos, side="left")
            cps, cqs = np.cumsum(p[toks]), np.cumsum(q[toks])
            base_p = np.where(first > 0, cps[first - 1], 0.0)
            base_q = np.where(first > 0, cqs[first - 1], 0.0)
            f = (cp0[pos] + cps - base_p) - (cq0[pos] + cqs - base_q) ** k
            j = int(np.argmin(f))
            if f[j] < best:
                best, cut = float(f[j]), (pos[j], toks[first[j] : j + 1])
        values[i] = 1.0 + best
        if want_sets and best < 0:
            if cut is None:
                sets[i] = b <= ids[j_end]
            else:
                sets[i] = b < ids[cut[0]]
                sets[i, cut[1]] = True
    return values, sets


def _greedy(P, Q, k, want_sets):
    """Closed form α*_greedy = p(G) + Σ_{x∉G} min(p(x), q'(x)) (theory.md §2, derived).

    G = the K − 1 largest q's, ties to the lower index, and q' = q with G zeroed, renormalised
    (:func:`otbound.token.draft_laws.greedy_split`, by a partition instead of a sort). Since q' = 0 on G,
    the sum may run over all of V.
    """
    n, v = P.shape
    values = np.empty(n)
    sets = np.zeros((n, v), dtype=bool) if want_sets else None
    for i in range(n):
        p, q = P[i], Q[i]
        g, q_prime = _greedy_split(q, k)
        values[i] = min(1.0, p[g].sum() + np.minimum(p, q_prime).sum())
        if want_sets and values[i] < 1.0:  # H* = G ∪ {x ∉ G: p(x) < q'(x)}
            sets[i] = p < q_prime
            sets[i, g] = True
    return values, sets


def _without_replacement(P, Q, k, want_sets, ratio_sorted=False):
    """α* for drafts without replacement: branch and bound over ratio buckets with fast Q(H).

    Only tokens with p_i/q_i ≤ K / (1 − M) can bind, M the mass of the K − 1 largest q's: adding i
    to H raises Q(H) by at most P(i among the drafts) ≤ K q_i / (1 − M). K = 1 is the i.i.d. case;
    K ≤ ``_wor.MAX_FAST_DRAFTS`` uses the fast prefix masses of :mod:`otbound.token._wor` (closed form for
    K = 2, clock integral with moment sums for K ≥ 3); larger K the reference DP.
    ``ratio_sorted``: every row is sorted by ratio p/q ascending (q = 0 last), as
    :func:`without_replacement_ratio_sorted` takes them; binding sets are then in that order.
    """
    if k == 1:  # a single draft has the same law with or without replacement
        return _with_replacement(P, Q, 1, want_sets)
    if k > _wor.MAX_FAST_DRAFTS:
        return _without_replacement_reference(P, Q, k, want_sets)
    n, v = P.shape
    values = np.ones(n)
    sets = np.zeros((n, v), dtype=bool) if want_sets else None
    work = {"ratio": np.empty(v), "keys": np.empty(v, dtype=np.int64), "y": np.empty(v), "w": np.empty(v)}
    for i in range(n):
        row_q = Q[i]
        q = _wor.clock_law(row_q, k)
        # a law changed by clock_law (dropped tiny tokens, renormalised) may no longer be in ratio order
        values[i], h = _without_replacement_row(P[i], q, k, want_sets, work, ratio_sorted and q is row_q)
        if h is not None:
            sets[i] = h
    return values, sets


def without_replacement_ratio_sorted(P: np.ndarray, Q: np.ndarray, k: int) -> np.ndarray:
    """α* without replacement (:func:`optimal_acceptance`'s value, within its 1e-12) for checked rows
    (shape (B, V), each a law, K within the support) already sorted by ratio p/q ascending with
    q = 0 last, as the batched engine sorts them once for every law and K. The branch and bound is
    the same; its bucket sums and moment features become sums of contiguous runs and a bucket's
    tokens a slice (no scatter, no search over the row)."""
    return np.clip(_without_replacement(P, Q, k, False, ratio_sorted=True)[0], 0.0, 1.0)


def _without_replacement_row(p, q, k, want_set, work, ratio_sorted=False):
    """One row of :func:`_without_replacement`; returns (α*, H* or None). ``work``: scratch arrays;
    ``ratio_sorted``: the row is sorted by ratio (bucket sums and features by runs, buckets as slices).

    f(H) = p(H) − Q(H) over prefixes of the ratio order, by branch and bound over chains of
    positions: the bucket ends (cumulative sums from bincounts), and inside an opened bucket its
    tokens sorted by ratio. A stretch of a chain between evaluated positions s and e is dropped
    when its lower bound is no better than the best value found: every prefix H in it adds q-mass
    x ≤ q(e) − q(s) and p-mass ≥ r_lo x (r_lo: smallest ratio in the stretch) to H_s, while
    Q(H) ≤ min(Q_e, Q_s + D1 x + C2 x²/2) (``mass(..., out_next=...)`` in :mod:`otbound.token._wor`), so
    f(H) ≥ min(f_s, p_s + r_lo x_c − Q_e) with x_c where the quadratic reaches Q_e (the bound is
    concave below x_c and increasing above). Long stretches are sampled at about ``_FANOUT``
    positions and the pieces bounded the same way; a bucket (one step of the bucket chain) is opened
    into its tokens. All stretches alive in a round are evaluated in one call.

    The quadrature grid (K ≥ 3) reaches the horizon the bucket ends need (:func:`_wor_horizons`); a
    bucket whose inside needs a longer one is opened only after the row is redone on a longer grid.
    """
    v = p.size
    n_top = min(v, 2 * k + 30)
    top = np.argpartition(q, v - n_top)[v - n_top :]
    top = top[np.argsort(-q[top], kind="stable")]
    m = q[top[: k - 1]].sum()
    rest = np.delete(q, top[: k - 1]).sum() if m > 0.5 else q.sum() - m  # 1 − M summed directly if small
    cut = k / max(rest, 1e-300) * (1.0 + 1e-9)
    b, top_id, bp, bq, ids, sums = _bucket_sums(p, q, min(cut, 2.0**1000), out=work["ratio"],
                                                 ratio_sorted=ratio_sorted)
    nb = ids.size
    if nb == 0:
        return 1.0, None
    # q mass from bucket j up, summed from the top (accurate when small) over the buckets holding any
    held = np.flatnonzero(bq)
    tail = np.append(np.cumsum(bq[held][::-1])[::-1], 0.0)
    out = tail[np.searchsorted(held, np.concatenate([[0], ids + 1]))]  # chain position i: after i buckets
    inside = np.concatenate([[0.0], np.cumsum(bq[ids])])
    fp = np.concatenate([[0.0], np.cumsum(bp[ids])])
    key = np.full(top_id + 1, nb)
    key[ids] = np.arange(nb)
    keys = sums.spread(key, out=work["keys"])
    row = (p, q, k, b, ids, keys, fp, out, inside, ratio_sorted)
    if k == 2:
        return _wor_search(row, _wor.PairMass(q), None, want_set, work)
    t_ends, t_cut_before = _wor_horizons(q, k, b, ids, top, out, inside)
    horizon = t_ends
    while True:
        try:
            return _wor_search(row, _wor.ClockMass(k, horizon), t_cut_before, want_set, work)
        except _LongerGrid as need:
            horizon = need.t_end


class _LongerGrid(Exception):
    """A bucket to open needs the clock integral beyond the grid: redo the row up to ``t_end``."""

    def __init__(self, t_end: float):
        super().__init__(t_end)
        self.t_end = t_end


def _wor_search(row, ev, t_cut_before, want_set, work):
    """The branch and bound of :func:`_without_replacement_row` with evaluator ``ev``."""
    p, q, k, b, ids, keys, fp, out, inside, ratio_sorted = row
    nb = ids.size
    feats = np.zeros((nb + 1, ev.num_features))
    np.cumsum(ev.bucket_features(q, keys, nb, work, keys_sorted=ratio_sorted), axis=0, out=feats[1:])
    states = None
    if ev.has_exact:
        exact = np.flatnonzero(q > ev.theta)
        exact = exact[keys[exact] < nb]
        exact = exact[np.argsort(p[exact] / q[exact], kind="stable")]
        through = np.searchsorted(keys[exact], np.arange(nb), side="right")
        states = ev.run_exact(q[exact], ev.start(q[exact]), np.concatenate([[-1], through - 1]))
    chain = _Chain(ev, fp, feats, out, inside, np.concatenate([[0.0], _bucket_floor(ids)]), states=states)
    ends = np.array([0, nb])
    chain.q[ends] = ev.mass(feats[ends], out[ends], inside[ends], chain.exact(ends))
    f_all = float(fp[nb] - chain.q[nb])

    def open_bucket(i):  # chain position i ends bucket i − 1
        toks = _bucket_tokens(b, ids[i - 1 : i], p, q, ratio_sorted)
        if toks.size < 2:
            return None
        if t_cut_before is not None:  # prefixes inside keep at least the last token out
            t_inside = min(_wor.TAIL / (out[i] + q[toks[-1]]), t_cut_before[i - 1])
            if t_inside > ev.t_end * (1.0 + 1e-9):
                raise _LongerGrid(t_inside * (1.0 + 1e-6))
        return chain.tokens(i, toks, p, q)

    best, where = _search(chain, min(0.0, f_all), (chain, nb) if f_all < 0 else None, open_bucket)
    if not (want_set and best < 0):
        return 1.0 + best, None
    ch, j = where
    if ch is chain:
        return 1.0 + best, b <= ids[j - 1]
    h = b < ids[ch.bucket - 1]
    h[ch.toks[:j]] = True
    return 1.0 + best, h


class _Chain:
    """Nested prefixes along one stretch of the ratio order (index 0: the prefix before it).

    Arrays over positions: cumulative p (``fp``), evaluator features, q outside and inside, the
    smallest ratio of the step into each position (``r_step``), Q where evaluated (nan otherwise)
    and exact-token states (given for all positions, or rebuilt on demand from a start state).
    A token chain also records its bucket position and tokens.
    """

    def __init__(self, ev, fp, feats, out, inside, r_step, states=None, exact_run=None, bucket=None, toks=None):
        self.ev, self.fp, self.feats, self.out, self.inside, self.r_step = ev, fp, feats, out, inside, r_step
        self.states, self.exact_run, self.bucket, self.toks = states, exact_run, bucket, toks
        self.q = np.full(fp.size, np.nan)

    def exact(self, idx):
        if self.exact_run is not None:
            return self.exact_run(np.asarray(idx))
        if self.states is None:
            return None
        sums, e, sx = self.states
        return sums[idx], e[:, idx], sx[idx]

    def tokens(self, i, toks, p, q):
        """The chain of the tokens ``toks`` (sorted by ratio) of the bucket ending at position i."""
        ev, qt = self.ev, q[toks]
        n = toks.size
        fp = self.fp[i - 1] + np.concatenate([[0.0], np.cumsum(p[toks])])
        feats = ev.chain_features(self.feats[i - 1], qt, toks)
        out = self.out[i] + np.concatenate([np.cumsum(qt[::-1])[::-1], [0.0]])  # + q of the bucket's later tokens
        inside = self.inside[i - 1] + np.concatenate([[0.0], np.cumsum(qt)])
        exact_run = None
        if ev.has_exact:
            is_exact = ev.is_exact(qt)
            exact_q = qt[is_exact]
            last = np.concatenate([[-1], np.cumsum(is_exact) - 1])
            start = self.exact([i - 1])

            def exact_run(idx):
                return ev.run_exact(exact_q, start, last[idx])

        r_step = np.concatenate([[0.0], p[toks] / qt])
        sub = _Chain(ev, fp, feats, out, inside, r_step, exact_run=exact_run, bucket=i, toks=toks)
        sub.q[0], sub.q[n] = self.q[i - 1], self.q[i]
        return sub


_FANOUT = 24  # a long stretch is sampled at about this many positions


def _search(root, best, where, open_bucket):
    """Branch and bound over the positions strictly inside ``root`` (Q known at both ends).

    Rounds: every live stretch (lo → hi of a chain, bound < best) is sampled (or, for one step of
    the bucket chain, opened into its token chain by ``open_bucket``); the samples of all chains
    are evaluated in one call, and each consecutive pair of samples becomes a stretch of the next
    round. Returns the best f and where it is ((chain, position), or the ``where`` given).
    """
    ev = root.ev
    n = root.fp.size - 1
    first = np.array([0]), np.array([n])
    _, bound = _bounds(root, *first, *_evaluate(ev, [(root, *first)]))
    live = {root: [(0, n, float(bound[0]))]}
    while live:
        parts = []
        for ch, stretches in live.items():
            pts, nxt = [], []
            for lo, hi, lower in stretches:
                if lower >= best:  # beaten by a value found later in the previous round
                    continue
                if hi - lo == 1:
                    sub = open_bucket(hi)  # only root stretches are single steps here
                    if sub is not None:
                        m = sub.fp.size - 1
                        s = _samples(0, m, ev.leaf)
                        parts.append((sub, s, np.append(s[1:], m)))
                    continue
                s = _samples(lo, hi, ev.leaf)
                pts.append(s)
                nxt.append(np.append(s[1:], hi))
            if pts:
                parts.append((ch, np.concatenate(pts), np.concatenate(nxt)))
        if not parts:
            break
        q_pts, d1, c2, c3 = _evaluate(ev, parts)
        live = {}
        start = 0
        for ch, pts, nxt in parts:
            sl = slice(start, start + pts.size)
            start += pts.size
            ch.q[pts] = q_pts[sl]
            f, bound = _bounds(ch, pts, nxt, q_pts[sl], d1[sl], c2[sl], c3[sl])
            j = int(np.argmin(f))
            if f[j] < best:
                best, where = float(f[j]), (ch, int(pts[j]))
            keep = np.flatnonzero((bound < best) & ((nxt - pts > 1) | (ch is root)))
            if keep.size:
                live.setdefault(ch, []).extend(zip(pts[keep].tolist(), nxt[keep].tolist(), bound[keep].tolist()))
    return best, where


def _bounds(ch, pts, nxt, q_pts, d1, c2, c3):
    """f at ``pts`` and the lower bound of f over each stretch pts → nxt (Q known at nxt):
    f ≥ min(f_s, p_s + r_lo x_c − Q_e), x_c where Q_s + D1 x + C x²/2 reaches Q_e."""
    f = ch.fp[pts] - q_pts
    q_e = ch.q[nxt]
    mass = ch.inside[nxt] - ch.inside[pts]
    rise = np.maximum(q_e - q_pts, 0.0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        curv = c2 + c3 * mass / 3.0  # x ≤ mass: the cubic term folded into the quadratic
        x_c = 2.0 * rise / (d1 + np.sqrt(d1 * d1 + 2.0 * curv * rise))
    x_c = np.clip(np.where(np.isfinite(x_c), x_c, 0.0), 0.0, mass)
    return f, np.minimum(f, ch.fp[pts] + ch.r_step[pts + 1] * x_c - q_e)


def _samples(lo, hi, leaf):
    """lo and about ``_FANOUT`` positions strictly between lo and hi (all of them if ≤ ``leaf``)."""
    inner = hi - lo - 1
    step = 1 if inner <= leaf else -(-inner // _FANOUT)
    return np.arange(lo, hi, step)


def _evaluate(ev, parts):
    """Q and the stretch-bound coefficients at the positions of several chains, in one call."""
    feats = np.concatenate([ch.feats[pts] for ch, pts, _ in parts])
    out = np.concatenate([ch.out[pts] for ch, pts, _ in parts])
    inside = np.concatenate([ch.inside[pts] for ch, pts, _ in parts])
    out_next = np.concatenate([ch.out[nxt] for ch, _, nxt in parts])
    exact = ev.concat_states([ch.exact(pts) for ch, pts, _ in parts]) if ev.has_exact else None
    return ev.mass(feats, out, inside, exact, out_next=out_next)


def _wor_horizons(q, k, b, ids, top, out, inside):
    """Grid end for the bucket ends and, per bucket m, the cut-off t_cut(H_{m−1}) for the prefixes
    inside it.

    A prefix H needs the clock integral up to min(40/out(H), t_cut(H)): beyond, the tail is ≤ e^{−40}
    or P[N_H(t) < K] ≤ e^{−40} (:mod:`otbound.token._wor`); ``out``, ``inside``: q outside and inside each
    bucket-chain position.
    t_cut(H) is the smaller of two sufficient times, both monotone in H (so that of H_{m−1} serves
    every prefix inside bucket m):

    * (40 + ln K)/q_(K)(H), as P[N_H < K] ≤ K e^{−q_(K) t}; q_(K)(H) is bounded below by the K-th
      largest q among the ``top`` tokens (the largest q's, sorted) in H;
    * a Chernoff time: the tokens of H outside ``top`` (mass s', each q ≤ q_cap, the smallest top q)
      ring on average μ ≥ s' t (1 − q_cap t/2) of them by t ≤ 1/q_cap, and for a Poisson-binomial
      count P[N ≤ K−1] ≤ e^{−μ} (eμ/(K−1))^{K−1} when μ > K − 1 (e^{−μ} for K = 1).

    Ends with out = 0 need no grid (Q = 1).
    """
    nb = ids.size
    pos = np.searchsorted(ids, b[top])  # bucket position of each top token (nb: not a candidate)
    through = pos[:, None] <= np.arange(nb)[None, :]  # top token in H_m (after bucket m)
    rank = np.cumsum(through, axis=0)
    has_k = rank[-1] >= k
    kth = q[top][np.argmax(rank >= k, axis=0)]
    s_rest = np.maximum(inside[1:] - q[top] @ through, 0.0)  # mass of H_m outside top
    q_cap = float(q[top[-1]]) if top.size < q.size else 0.0
    t = 2.0 ** (np.arange(-4, 100) / 2.0)
    if q_cap > 0:
        t = t[t <= 1.0 / q_cap]
    mu = s_rest[:, None] * t[None, :] * (1.0 - 0.5 * q_cap * t[None, :])  # (nb, len(t))
    a = k - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        log_tail = -mu if a == 0 else np.where(mu > a, -mu + a * (1.0 + np.log(mu / a)), 0.0)
        ok = log_tail <= -_wor.TAIL
        t_chernoff = np.where(ok.any(axis=1), t[np.argmax(ok, axis=1)], np.inf) if t.size else np.full(nb, np.inf)
        t_cut = np.where(has_k, (_wor.TAIL + np.log(k)) / np.where(has_k, kth, 1.0), np.inf)
        t_cut = np.minimum(t_cut, t_chernoff)
        t_ends = np.minimum(_wor.TAIL / out[1:], t_cut)[out[1:] > 0]
    return float(t_ends.max(initial=_wor.TAIL)), np.concatenate([[np.inf], t_cut[:-1]])


def _without_replacement_reference(P, Q, k, want_sets):
    """The plain reference: full sort of the candidates and the token-by-token DP of
    :func:`otbound.token._wor.wor_prefix_mass` (used for K > ``_wor.MAX_FAST_DRAFTS``; an independent check)."""
    n, v = P.shape
    values = np.empty(n)
    sets = np.zeros((n, v), dtype=bool) if want_sets else None
    r = _ratio(P, Q)
    for i in range(n):
        top = np.argpartition(Q[i], v - k + 1)[v - k + 1 :] if k > 1 else np.zeros(0, dtype=np.int64)
        cut = k / max(np.delete(Q[i], top).sum(), 1e-300)  # 1 − M summed directly
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
    one = DRAFT_LAWS[sampling].coupling_law(q, k)
    return Relaxation(lower=float(np.minimum(p, one).sum()), upper=float(min(1.0, np.minimum(p, incl).sum())))
