"""Branch and bound for α* without replacement over ratio buckets (the search routine behind
:func:`otbound.optimal_acceptance` at ``sampling="without_replacement"``, K ≥ 2).

f(H) = p(H) − Q(H) over prefixes H of the ratio order p/q, Q(H) the probability that all K drafts
lie in H (:mod:`otbound.token._wor`). Tokens are bucketed by the bit pattern of p/q (32 buckets per
octave, a scatter per summed quantity and row: :class:`otbound.token._wor.KeySums`), prefix
values come from bucket sums, and the search sorts only the buckets whose lower bound can beat
the best value found (a few thousand tokens of V = 151,936).
On rows already sorted by ratio (the batched kernel's) the buckets are runs of the row: their sums,
q's total and largest entries are found once per row for every K (:class:`RowRuns`), and the
quadrature horizon of every bucket's inside is known before the search (no row is redone on a
longer grid).

The search asks Q(H) and its stretch bounds of a mass evaluator through the small
:class:`MassEvaluator` protocol; :class:`otbound.token._wor.PairMass` (K = 2, closed form) and
:class:`otbound.token._wor.ClockMass` (K ≥ 3, the clock integral) implement it. Each row's search
is a generator that yields its requests; the rows of a batch sorted by ratio are searched in
lockstep (:func:`_lockstep`), every round's requests of all rows answered by one
:func:`otbound.token._wor.evaluate_many` call and their stretch bounds by one :func:`_bounds`
call, and share their bucket moments across K
(:class:`otbound.token._wor.RunMoments`, held by :class:`RowRuns`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from typing import Protocol

import numpy as np

from otbound._validation import InvalidInputError
from otbound.token import _wor


class MassEvaluator(Protocol):
    """What the search needs of a Q(H) evaluator (:class:`otbound.token._wor.PairMass`,
    :class:`otbound.token._wor.ClockMass`)."""

    has_exact: bool
    leaf: int

    def chain_features(self, base, q_tokens, tokens=None):
        """Moment features of the prefixes along a chain of tokens after the state ``base``."""

    def bucket_features(self, q, sums, num_keys, work=None, exact=None, moments=None):
        """Moment features of the bucket-end prefixes of a row (``exact``: its exact tokens, if any;
        ``moments``: the row's shared :class:`otbound.token._wor.RunMoments`, on rows sorted by ratio)."""

    def mass(self, features, out, inside=None, exact=None, out_next=None):
        """``(Q, d1, c2, c3)`` at the given prefixes: Q(H) and the coefficients of its stretch bound."""


def _ratio(P: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """p/q with q = 0 mapped to +inf (those tokens sort last)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = P / Q
    r[Q == 0] = np.inf
    return r


# the exponent and the top 5 mantissa bits, a bucket id monotone in r (32 buckets per octave).
_SHIFT = 47


_INF_ID = int(np.float64(np.inf).view(np.uint64)) >> _SHIFT  # the bucket id of p/q = inf


def _ratio_buckets(p: np.ndarray, q: np.ndarray, limit: float, out=None) -> tuple[np.ndarray, int]:
    """Bucket id of every token's ratio p/q (one row) and the id ``top`` of the overflow bucket.

    Bucket j holds the ratios in [_bucket_floor(j), _bucket_floor(j + 1)); tokens with q = 0 (ratio
    inf or nan) and all buckets above the one holding ``limit`` are merged into ``top``, so every
    bucket below ``top`` holds only tokens with q > 0 and ratio < _bucket_floor(top). ``out``: a
    float64 scratch row, reused across rows (fresh large arrays cost page faults); the ids live in it.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # an overflowing ratio: inf, top
        bits = np.divide(p, q, out=out).view(np.uint64)
    np.bitwise_and(bits, np.uint64(0x7FFF_FFFF_FFFF_FFFF), out=bits)  # −0.0 is 0; nan and inf lie above any ratio
    np.right_shift(bits, _SHIFT, out=bits)
    # inf's own id at limit = inf, so that p/q = inf and 0/0 share the top bucket (a no-op for finite limits)
    top = min((int(np.float64(limit).view(np.uint64)) >> _SHIFT) + 1, _INF_ID)
    np.minimum(bits, np.uint64(top), out=bits)
    return bits.view(np.int64), top


def _bucket_sums(p: np.ndarray, q: np.ndarray, limit: float, out=None):
    """``(b, top, bp, bq, ids, sums, by_id)``: the buckets of :func:`_ratio_buckets`, the p and q mass
    of every bucket id ``0..top``, the ids below ``top`` holding q mass (in increasing ratio), the
    :class:`otbound.token._wor.KeySums` of ``b`` (a row in any order) and ``(sums over the ids from
    lo, lo)``, the sums the p and q masses were made with (ids shifted down by lo)."""
    b, top = _ratio_buckets(p, q, limit, out=out)
    sums = _wor.KeySums(b, top)
    # the ids lie in [lo, top]: the sums are made over those (zeros below, never read), so that a
    # short row does not pay for tables of the 2^15 ids below the cut
    lo = int(b.min()) if 0 < b.size < top else 0
    bp, bq = np.zeros(top + 1), np.zeros(top + 1)  # (top + 1,) each
    shifted = _wor.KeySums(b - lo, top - lo) if lo else sums
    shifted.into(p, bp[lo:])
    shifted.into(q, bq[lo:])
    return b, top, bp, bq, lo + np.flatnonzero(bq[lo:top] > 0), sums, (shifted, lo)


# the largest q's kept per row by RowRuns: the 2K + 30 of every K ≤ MAX_FAST_DRAFTS
_TOP = 2 * _wor.MAX_FAST_DRAFTS + 30


class RowRuns:
    """What the search needs of one row sorted by ratio p/q (ascending, q = 0 last) whatever K: the
    runs of equal bucket id (:func:`_ratio_buckets` unclipped; their starts, ids and p and q sums;
    the ids increase strictly along a sorted row, :func:`_run_starts`), q's total and the positions
    of its ``_TOP`` largest entries by decreasing q. Built once per row and clipped per K
    (:meth:`clip`): the bucket sums of every K are sums of run sums.

    Raises
    ------
    InvalidInputError
        The row is not sorted by ratio (as far as its sampled bucket ids tell: :func:`_run_starts`).
    """

    def __init__(self, p: np.ndarray, q: np.ndarray, tiny: bool = True):
        self.tiny = tiny  # whether q may have positive entries below _wor.CLOCK_FLOOR (False: known not)
        v = self.size = p.size
        self.starts, self.at = _run_starts(p, q)
        self.run_p, self.run_q = np.add.reduceat(p, self.starts), np.add.reduceat(q, self.starts)
        self.q_sum = float(self.run_q.sum())
        self.moments = _wor.RunMoments(q, self.starts)  # the clock integral's run moments, every K ≥ 3
        self.top = _largest(q, min(v, _TOP))

    @property
    def b(self) -> np.ndarray:
        """The bucket id of every position, (V,) (built on demand: the binding set's tokens)."""
        return np.repeat(self.at, np.diff(self.starts, append=self.size))

    def run_of(self, idx: np.ndarray) -> np.ndarray:
        """The run holding each position ``idx``."""
        return np.searchsorted(self.starts, idx, side="right") - 1

    def run_tokens(self, r: int) -> np.ndarray:
        """The positions of run r, in order."""
        return np.arange(self.starts[r], self.starts[r + 1] if r + 1 < self.starts.size else self.size)

    def run_size(self, r: int) -> int:
        """The number of positions of run r."""
        return int(self.starts[r + 1] if r + 1 < self.starts.size else self.size) - int(self.starts[r])

    def clip(self, limit: float):
        """``(ids, bucket_p, bucket_q, rest_q, chain)`` for the buckets below that of ``limit`` (the
        ones above merged, as :func:`_bucket_sums`): their ids, p and q sums (the runs below the
        cut), q above the cut, and ``chain``, the :class:`otbound.token._wor.KeySums` of the
        positions' index in ``ids`` (``ids.size`` above the cut), by runs."""
        top = (int(np.float64(limit).view(np.uint64)) >> _SHIFT) + 1
        n_lo = int(np.searchsorted(self.at, top))
        bucket_q = self.run_q[:n_lo]
        if not bool((bucket_q > 0).all()):  # a bucket below top holds only tokens with q > 0: never here
            raise AssertionError("a ratio bucket below the cut without q mass")
        merged = n_lo < self.starts.size
        starts = self.starts[: n_lo + 1] if merged else self.starts
        at = np.arange(n_lo + 1) if merged else np.arange(n_lo)
        return (self.at[:n_lo], self.run_p[:n_lo], bucket_q, self.run_q[n_lo:].sum(),
                _wor.KeySums.from_runs(starts, at, n_lo, self.size))


_STRIDE = 16  # _run_starts reads the bucket id of every 16th position, then the gaps where it changes


def _run_starts(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, at)``: the runs of equal bucket id (:func:`_ratio_buckets` unclipped) of a row sorted
    by ratio (their first positions and ids), from the ids of every ``_STRIDE``-th position and of
    the positions inside the gaps whose two ends differ: along a sorted row the id never decreases,
    so a gap with equal ends is one id (about V/16 + 16 × runs divisions instead of V).

    Raises
    ------
    InvalidInputError
        An id read is below the one read before it: the row is not sorted by ratio.
    """
    v = p.size
    coarse = np.append(np.arange(0, v - 1, _STRIDE), v - 1)  # (C,) sampled positions, both ends included
    cid, _ = _ratio_buckets(p[coarse], q[coarse], np.inf)  # (C,)
    lo = np.flatnonzero(cid[1:] != cid[:-1])  # the gaps coarse[j] → coarse[j + 1] holding a change
    size = coarse[lo + 1] - coarse[lo]  # positions coarse[j] + 1 .. coarse[j + 1] of each gap
    first = np.cumsum(size) - size  # (G,) where each gap's positions begin in fine
    fine = np.arange(int(size.sum())) + np.repeat(coarse[lo] + 1 - first, size)  # (F,) positions
    fid, _ = _ratio_buckets(p[fine], q[fine], np.inf)  # (F,)
    prev = np.empty_like(fid)  # the id of the position before each fine one
    prev[1:] = fid[:-1]
    prev[first] = cid[lo]
    if bool((fid < prev).any()) or bool((cid[1:] < cid[:-1]).any()):
        raise InvalidInputError("a row given as sorted by ratio p/q (ascending, q = 0 last) is not")
    new = fid != prev
    return np.concatenate([[0], fine[new]]), np.concatenate([cid[:1], fid[new]])


_BLOCK = 64


def _largest(q: np.ndarray, n: int) -> np.ndarray:
    """Indices of n largest entries of q by decreasing q (equal q: lower index first), searched
    among the groups of ``_BLOCK`` tokens (j, j + G, j + 2G, …) whose maxima are among the n largest
    group maxima (each of the n largest entries is at least the n-th largest group maximum, so its
    group is one of them): one pass over q instead of a partition of it."""
    return _largest_and_peaks(q, n)[0]


def _largest_and_peaks(q: np.ndarray, n: int):
    """:func:`_largest` and the group maxima it read (None when it partitioned q instead)."""
    v = q.size
    groups = v // _BLOCK
    peak = None
    if groups <= 4 * n:
        top = np.argpartition(q, v - n)[v - n :]
    else:
        peak = q[: groups * _BLOCK].reshape(_BLOCK, groups).max(axis=0)  # (G,): group j's maximum
        held = np.flatnonzero(peak >= np.partition(peak, groups - n)[groups - n])
        cand = np.concatenate([(held[None, :] + groups * np.arange(_BLOCK)[:, None]).ravel(),
                               np.arange(groups * _BLOCK, v)])
        top = cand[np.argpartition(q[cand], cand.size - n)[cand.size - n :]]
    return top[np.lexsort((top, -q[top]))], peak


def _above(q: np.ndarray, theta: float, peak) -> np.ndarray:
    """Indices of the entries of q above θ, increasing: in the groups of :func:`_largest_and_peaks`
    whose maximum ``peak`` exceeds θ (and the tokens after the last whole group) when those are
    few, else by a pass over q."""
    if peak is None:
        return np.flatnonzero(q > theta)
    groups = peak.size
    held = np.flatnonzero(peak > theta)
    if 8 * _BLOCK * held.size > q.size:
        return np.flatnonzero(q > theta)
    cand = np.concatenate([(held[None, :] + groups * np.arange(_BLOCK)[:, None]).ravel(),
                           np.arange(groups * _BLOCK, q.size)])
    return np.sort(cand[q[cand] > theta])


def sorted_runs(P: np.ndarray, Q: np.ndarray, tiny=None) -> list:
    """:class:`RowRuns` of every row of ``(P, Q)`` (B, V), rows sorted by ratio (shared by every K);
    ``tiny`` (B,) bool: the rows that may hold a positive q below ``_wor.CLOCK_FLOOR`` (None: all)."""
    return [RowRuns(P[i], Q[i], True if tiny is None else bool(tiny[i])) for i in range(P.shape[0])]


def _bucket_floor(ids) -> np.ndarray:
    """Smallest ratio of each bucket id (the float whose bit pattern is id << _SHIFT)."""
    return np.left_shift(np.asarray(ids, dtype=np.int64), _SHIFT).view(np.float64)


def _bucket_tokens(b: np.ndarray, ids, p: np.ndarray, q: np.ndarray, size: int | None = None) -> np.ndarray:
    """Indices of the tokens in buckets ``ids``, sorted by ratio (ties: lower index first); ``size``:
    a bound on the ids of ``b`` (every id < size), if known (else a pass over b finds it)."""
    return _bucket_tokens_by_ratio(b, ids, p, q, size)[0]


def _bucket_tokens_by_ratio(b, ids, p, q, size=None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_bucket_tokens` and the tokens' ratios p/q (in that order). Ratios within 2^16 units
    in the last place of each other (a bucket of tied or near-tied ratios: few distinct values) are
    ordered by their bit patterns' offsets, 16-bit keys whose stable sort is a radix sort (one pass
    instead of a comparison sort; the order of non-negative floats is that of their bit patterns)."""
    if len(ids) == 1:
        sel = np.flatnonzero(b == ids[0])
    else:
        table = np.zeros(size if size is not None else int(b.max()) + 1, dtype=bool)
        table[ids] = True
        sel = np.flatnonzero(table[b])
    return _by_ratio(sel, p[sel], q[sel])[:2]


def _by_ratio(sel, ps, qs):
    """``(sel, ratio, ps, qs)``: the tokens ``sel`` of a bucket, given their p and q, sorted by ratio
    ps/qs (ties: the order of ``sel``) as :func:`_bucket_tokens_by_ratio` sorts them, with their
    ratios, p and q in that order."""
    ratio = ps / qs
    if sel.size < 2:
        return sel, ratio, ps, qs
    bits = ratio.view(np.int64) & np.int64(0x7FFF_FFFF_FFFF_FFFF)  # −0.0 as 0.0 (sorted alike)
    low = int(bits.min())
    if int(bits.max()) - low < 1 << 16:
        order = np.argsort((bits - low).astype(np.uint16), kind="stable")
    else:
        order = np.argsort(ratio, kind="stable")
    return sel[order], ratio[order], ps[order], qs[order]


def _run_tokens(runs: RowRuns, r: int, p: np.ndarray, q: np.ndarray) -> tuple:
    """``(toks, ratio, pt, qt)``: the tokens of run r of a row sorted by ratio (:class:`RowRuns`),
    their ratios p/q and their p and q: its positions, which a row sorted by (ratio, index) already
    holds in that order (checked; else sorted stably by ratio), p and q read as slices of the row
    (views: a run of a ``ties`` row holds thousands of tokens, gathered by position twice before)."""
    sel = runs.run_tokens(r)
    pt, qt = (x[sel[0] : sel[-1] + 1] for x in (p, q)) if sel.size else (p[:0], q[:0])
    ratio = pt / qt
    if sel.size > 1 and bool((ratio[1:] < ratio[:-1]).any()):
        by_ratio = np.argsort(ratio, kind="stable")
        sel, ratio, pt, qt = sel[by_ratio], ratio[by_ratio], pt[by_ratio], qt[by_ratio]
    return sel, ratio, pt, qt


def without_replacement(P, Q, k, want_sets, ratio_sorted=False, runs=None, tiny=None):
    """α* for drafts without replacement: branch and bound over ratio buckets with fast Q(H).

    Only tokens with p_i/q_i ≤ K / (1 − M) can bind, M the mass of the K − 1 largest q's: adding i
    to H raises Q(H) by at most P(i among the drafts) ≤ K q_i / (1 − M). K = 1 is the i.i.d. case;
    K ≤ ``_wor.MAX_FAST_DRAFTS`` uses the fast prefix masses of :mod:`otbound.token._wor` (closed form for
    K = 2, clock integral with moment sums for K ≥ 3); larger K the reference DP.
    ``ratio_sorted``: every row is sorted by ratio p/q ascending (q = 0 last), as
    :func:`without_replacement_ratio_sorted` takes them; binding sets are then in that order, and
    ``runs`` may give the rows' :class:`RowRuns` (:func:`sorted_runs`, shared by every K).
    ``tiny`` (B,) bool: the rows that may hold a positive q below ``_wor.CLOCK_FLOOR`` (None: all;
    the others skip :func:`otbound.token._wor.clock_law`'s scan).
    """
    if k == 1:
        raise ValueError("the without-replacement search needs K >= 2 (K = 1 is the i.i.d. case)")
    if k > _wor.MAX_FAST_DRAFTS:
        return _without_replacement_reference(P, Q, k, want_sets)
    n, v = P.shape
    values = np.ones(n)
    sets = np.zeros((n, v), dtype=bool) if want_sets else None
    work = _work(v)
    grids = {}  # the quadrature grids built, by K and t_end (rows' horizons often coincide)
    searches = []
    for i in range(n):
        row_q = Q[i]
        may_be_tiny = (runs is None or runs[i].tiny) and (tiny is None or bool(tiny[i]))
        q = _wor.clock_law(row_q, k) if may_be_tiny else row_q
        # a law changed by clock_law (dropped tiny tokens, renormalised) may no longer be in ratio order
        row_runs = None
        if ratio_sorted and q is row_q:
            row_runs = runs[i] if runs is not None else RowRuns(P[i], q)
        searches.append(_without_replacement_row(P[i], q, k, want_sets, work, row_runs, grids))
        if not ratio_sorted:  # one row at a time
            values[i], h = _lockstep(searches)[0]
            searches = []
            if h is not None:
                sets[i] = h
        elif row_runs is None:  # in lockstep, this row's buckets stay in its scratch row
            work = _work(v)
    if searches:  # rows sorted by ratio: searched in lockstep, one evaluation per round for all
        for i, (value, h) in enumerate(_lockstep(searches)):
            values[i] = value
            if h is not None:
                sets[i] = h
    return values, sets


def _work(v: int) -> dict:
    """Scratch rows of the search for a row of V tokens (reused across rows)."""
    return {"ratio": np.empty(v), "keys": np.empty(v, dtype=np.int64), "y": np.empty(v), "w": np.empty(v)}


def _lockstep(searches: list) -> list:
    """Run row searches (generators from :func:`_without_replacement_row`) in lockstep: each round
    every live search asks Q and its stretch bounds at positions of its chains (``(evaluator,
    arguments of mass, request)``, the request an :class:`_Ask`), all of them are
    answered by one :func:`otbound.token._wor.evaluate_many` call and their f and stretch bounds
    found by one :func:`_bounds` call, and each search resumes with its (f, bounds). Every search is
    first run to the end of its setup on small arrays (``_SET_UP``), then each to its first request
    (its pass over the row's tokens): the setups run one after another with warm caches instead of
    each after a pass over a row (about 2.5 times the cost then). Returns every search's (α*, H* or
    None), in order."""
    results = [None] * len(searches)
    asks = {}
    for step in range(2):
        for i, search in enumerate(searches):
            if step and asks.get(i) is not _SET_UP:
                continue
            try:
                asks[i] = next(search)
            except StopIteration as done:
                results[i] = done.value
                asks.pop(i, None)
    while asks:
        answers = _wor.evaluate_many([(ev, args) for ev, args, _ in asks.values()])
        found = _bounds([parts for _, _, parts in asks.values()], answers)
        following = {}
        for i, answer in zip(asks, found):
            try:
                following[i] = searches[i].send(answer)
            except StopIteration as done:
                results[i] = done.value
        asks = following
    return results


def without_replacement_ratio_sorted(P: np.ndarray, Q: np.ndarray, k: int, runs=None) -> np.ndarray:
    """α* without replacement (:func:`otbound.optimal_acceptance`'s value, within its 1e-12) for checked rows
    (shape (B, V), each a law, K within the support) already sorted by ratio p/q ascending with
    q = 0 last, as the batched engine sorts them once for every law and K. The branch and bound is
    the same; its bucket sums are sums of the runs of the sorted row (``runs``: the rows'
    :class:`RowRuns`, built here if not given), its moment features sums of contiguous runs and a
    bucket's tokens a slice (no scatter, no search over the row)."""
    return np.clip(without_replacement(P, Q, k, False, ratio_sorted=True, runs=runs)[0], 0.0, 1.0)


def _without_replacement_row(p, q, k, want_set, work, runs=None, grids=None):
    """One row of :func:`without_replacement`, a generator (it yields its requests for Q, as
    :func:`_lockstep` answers them) returning (α*, H* or None). ``work``: scratch arrays;
    ``runs``: the row's :class:`RowRuns` when it is sorted by ratio (bucket sums and features by
    runs, buckets as slices); ``grids``: the quadrature grids of the call's rows, shared
    (:class:`otbound.token._wor.ClockMass`).

    f(H) = p(H) − Q(H) over prefixes of the ratio order, by branch and bound over chains of
    positions: the bucket ends (cumulative sums of the bucket sums), and inside an opened bucket its
    tokens sorted by ratio. A stretch of a chain between evaluated positions s and e is dropped
    when its lower bound is no better than the best value found: every prefix H in it adds q-mass
    x ≤ X = q(e) − q(s) to H_s and p(H) ≥ max(p_s + r_lo x, p_e − r_hi (X − x)) (r_lo, r_hi: the
    smallest and largest ratio in the stretch), while Q(H) ≤ min(Q_e, Q_s + D1 x + C2 x²/2)
    (``mass(..., out_next=...)`` in :mod:`otbound.token._wor`), which bound f over the stretch
    (:func:`_bounds`). Long stretches are sampled at about ``_FANOUT``
    positions and the pieces bounded the same way; a bucket (one step of the bucket chain) is opened
    into its tokens (a bucket of ``_GEO_MIN`` tokens or more first sampled toward its ends too,
    :func:`_samples_to_ends`: on a row as given every such bucket, on a row sorted by ratio the tied
    ones, :func:`_first_samples`). All stretches alive in a round are evaluated in one call.

    The quadrature grid (K ≥ 3) reaches the horizon the bucket ends need (:func:`_wor_horizons`) and,
    on a row sorted by ratio (whose buckets' last tokens are known), the horizon of every bucket's
    inside. On a row as given the inside of bucket m needs at most min(40/out(H_m), t_cut(H_{m−1}))
    (its last token's q ≥ 0): that bound over every bucket is the grid's end when at most
    ``_UPFRONT`` times the bucket ends' horizon; otherwise a bucket whose inside needs a longer grid
    is opened only after the row is redone on a longer one.
    """
    v = p.size
    n_top = min(v, 2 * k + 30)
    # by decreasing q, ties to the lower index (and the group maxima read, to find q > θ later)
    top, peak = _largest_and_peaks(q, n_top) if runs is None else (runs.top[:n_top], None)
    m = q[top[: k - 1]].sum()
    rest = _sum_without(q, top[: k - 1]) if m > 0.5 else _total(q, runs) - m  # 1 − M summed directly if small
    cut = k / max(rest, 1e-300) * (1.0 + 1e-9)
    limit = min(cut, 2.0**1000)
    if runs is None:
        b, top_id, bp, bq, ids, sums, by_id = _bucket_sums(p, q, limit, out=work["ratio"])
        nb = ids.size
        if nb == 0:
            return 1.0, None
        # q mass from bucket j up, summed from the top (accurate when small) over the buckets holding any
        held = ids[0] + np.flatnonzero(bq[ids[0] :])  # the buckets holding q (none below the first id)
        tail = np.append(np.cumsum(bq[held][::-1])[::-1], 0.0)
        out = tail[np.searchsorted(held, np.concatenate([[0], ids + 1]))]  # chain position i: after i buckets
        bucket_p, bucket_q = bp[ids], bq[ids]
        # the features are summed per bucket id from the first id on (no token lies below it: a bucket
        # below the cut holding a token holds its q > 0) and read at ids (the same tokens summed in the
        # same order as sums keyed by chain position, without a second pass to map ids to positions)
        shifted, lo = by_id
        first = int(ids[0])
        if k > 2 and top_id - first > max(_SPARSE_IDS * nb, _ID_ROWS):  # ids far apart (ratios 0 and others):
            # the moment tables by chain position (every token's index in ids, nb above the cut)
            key = np.empty(top_id + 1, dtype=np.int64)
            key[first:] = nb
            key[ids] = np.arange(nb)
            chain_sums = (_wor.KeySums(sums.spread(key, out=work["keys"]), nb), nb, None)
        else:
            if k > 2 and first > lo:  # the moment tables: rows from the first id only
                shifted, lo = _wor.KeySums(np.subtract(b, first, out=work["keys"]), top_id - first), first
            chain_sums = (shifted, top_id - lo, ids - lo)
    else:
        b = None  # by runs: runs.b when a binding set needs it
        ids, bucket_p, bucket_q, rest_q, by_runs = runs.clip(limit)
        nb = ids.size
        if nb == 0:
            return 1.0, None
        chain_sums = (by_runs, nb, None)
        # q after i buckets, summed from the top as above (the same sums: the buckets are the runs)
        out = np.cumsum(np.append(bucket_q, rest_q)[::-1])[::-1]
    inside = np.concatenate([[0.0], np.cumsum(bucket_q)])
    fp = np.concatenate([[0.0], np.cumsum(bucket_p)])
    largest = top if runs is None else runs.top  # the largest q's, decreasing
    moments = None if runs is None else runs.moments
    row = (p, q, k, b, ids, chain_sums, fp, out, inside, runs, largest, moments, peak)
    if k == 2:
        return (yield from _wor_search(row, _wor.PairMass(q, big=int(top[0])), None, want_set, work, pause=True))
    top_pos = np.searchsorted(ids, b[top]) if runs is None else np.minimum(runs.run_of(top), nb)
    t_ends, t_cut_before = _wor_horizons(q, k, top_pos, ids, top, out, inside)
    horizon = t_ends
    if runs is not None:  # each bucket's last token is known: the grid every opened bucket needs, up front
        ends = np.append(runs.starts, v)[1 : nb + 1]
        wide = ends - runs.starts[:nb] >= 2
        t_inside = np.minimum(_wor.TAIL / (out[1:] + q[ends - 1]), t_cut_before)[wide]
        horizon = max(horizon, float(t_inside.max(initial=0.0)) * (1.0 + 1e-6))
    else:  # a bucket's last token unknown: its q ≥ 0 bounds what any opened bucket needs; taken up
        # front when at most _UPFRONT times the bucket ends' grid (else a bucket needing more redoes the row)
        with np.errstate(divide="ignore"):
            need = float(np.minimum(_wor.TAIL / out[1:], t_cut_before).max()) * (1.0 + 1e-6)
        if need <= _UPFRONT * t_ends:
            horizon = max(horizon, need)
    first = True
    while True:
        try:
            ev = _wor.ClockMass(k, horizon, grids)
            return (yield from _wor_search(row, ev, t_cut_before, want_set, work, pause=first))
        except _LongerGrid as need:
            horizon, first = need.t_end, False


# moment tables by bucket id (rows first id..cut) unless they would exceed both this many times the
# buckets holding q mass and _ID_ROWS rows (then by chain position, one more gather over the row)
_SPARSE_IDS = 4
_ID_ROWS = 4096

# a row as given takes the grid any bucket it may open needs up front when at most this many times
# the bucket ends' (a longer grid costs a little in every evaluation, a row redone its whole search)
_UPFRONT = 8.0


def _sum_without(q: np.ndarray, idx: np.ndarray) -> float:
    """Σ q over the tokens not in ``idx`` (distinct indices), summed directly: the slices between
    them, without the copy of ``np.delete``."""
    cuts = np.sort(idx)
    edges = np.concatenate([[-1], cuts, [q.size]])
    return float(sum(q[a + 1 : b].sum() for a, b in zip(edges[:-1].tolist(), edges[1:].tolist())))


def _total(q, runs):
    """Σ q of the row (known to its :class:`RowRuns`)."""
    return q.sum() if runs is None else runs.q_sum


class _LongerGrid(Exception):
    """A bucket to open needs the clock integral beyond the grid: redo the row up to ``t_end``."""

    def __init__(self, t_end: float):
        super().__init__(t_end)
        self.t_end = t_end


# what a row's search yields (with ``pause``) between its setup on small arrays and its pass over
# its tokens (the moment sums), so that :func:`_lockstep` sets up every row before those passes
_SET_UP = "set up"


def _wor_search(row, ev, t_cut_before, want_set, work, pause=False):
    """The branch and bound of :func:`_without_replacement_row` with evaluator ``ev`` (a generator:
    it yields ``(ev, arguments of ev.mass, ask)`` and resumes with f and the stretch bounds; with
    ``pause``, it first yields ``_SET_UP`` once its exact-token states are built, before the moment
    sums)."""
    p, q, k, b, ids, chain_sums, fp, out, inside, runs, largest, moments, peak = row
    nb = ids.size
    exact = None
    if ev.has_exact:  # tokens with q > θ: among the largest q's when the smallest of those is ≤ θ
        if largest.size == q.size or q[largest[-1]] <= ev.theta:
            exact = np.sort(largest[q[largest] > ev.theta])
        else:
            exact = _above(q, ev.theta, peak)
    sums, num_keys, key_at = chain_sums  # key_at: the key of each chain bucket (None: its position)
    exact_all = exact  # every token with q > θ, by index (the moment sums leave them out)
    states = state_of = None
    if ev.has_exact:
        exact_keys = sums.key_of(exact)
        inside_cut = exact_keys < num_keys
        exact, exact_keys = exact[inside_cut], exact_keys[inside_cut]
        if key_at is not None:  # their buckets hold q > 0, so are chain buckets: keys to positions
            exact_keys = np.searchsorted(key_at, exact_keys)
        by_ratio = np.argsort(p[exact] / q[exact], kind="stable")
        exact, exact_keys = exact[by_ratio], exact_keys[by_ratio]
        through = np.searchsorted(exact_keys, np.arange(nb), side="right")
        start = ev.start(q[exact])  # no exact tokens: ev.has_exact is now False, no states
        if ev.has_exact:  # the states after 0..n of the exact tokens; chain position i has through[i − 1]
            states = ev.run_exact(q[exact], start, np.arange(-1, exact.size))
            state_of = np.concatenate([[0], through])
    if pause:
        yield _SET_UP
    feats = np.zeros((nb + 1, ev.num_features))
    bucket_feats = ev.bucket_features(q, sums, num_keys, work, exact_all, moments)  # (num_keys, features)
    np.cumsum(bucket_feats if key_at is None else bucket_feats[key_at], axis=0, out=feats[1:])
    with np.errstate(over="ignore"):  # a bucket's ratios lie in [floor(id), floor(id + 1))
        floors = _bucket_floor(np.append(ids, ids[-1] + 1))
    r_step = np.append(0.0, floors[:-1])  # (nb + 1,)
    table = np.stack([fp, inside, out, np.append(r_step[1:], r_step[-1]), np.append(0.0, floors[1:])])  # (5, nb + 1)
    chain = _Chain(ev, table, feats, r_step, states, state_of)

    def open_bucket(i):  # chain position i ends bucket i − 1
        if runs is None:
            sel = np.flatnonzero(b == ids[i - 1])  # one id: no table
            toks, ratio, pt, qt = _by_ratio(sel, p[sel], q[sel])  # their p and q gathered once
        elif runs.run_size(i - 1) < 2:  # one token: no chain (known before its tokens are read)
            return None
        else:
            toks, ratio, pt, qt = _run_tokens(runs, i - 1, p, q)
        if toks.size < 2:
            return None
        if t_cut_before is not None:  # prefixes inside keep at least the last token out
            t_inside = min(_wor.TAIL / (out[i] + qt[-1]), t_cut_before[i - 1])
            if t_inside > ev.t_end * (1.0 + 1e-9):
                raise _LongerGrid(t_inside * (1.0 + 1e-6))
        return chain.tokens(i, toks, pt, qt, ratio)

    if runs is None:  # a row as given, searched alone
        best, where = yield from _search(chain, open_bucket, _first_samples(tied_only=False), leaves_plain=True)
    else:
        best, where = yield from _search(chain, open_bucket, _first_samples(tied_only=True))
    if not (want_set and best < 0):
        return 1.0 + best, None
    ch, j = where
    if runs is not None:
        b = runs.b
    if ch is chain:
        return 1.0 + best, b <= ids[j - 1]
    h = b < ids[ch.bucket - 1]
    h[ch.toks[:j]] = True
    return 1.0 + best, h


# the rows of a chain's table (:class:`_Chain`): what the search reads at a position, gathered at once
_FP, _INSIDE, _OUT, _R_NEXT, _R_TOP = range(5)


class _Chain:
    """Nested prefixes along one stretch of the ratio order (index 0: the prefix before it).

    Arrays over positions: ``table`` (5, n + 1), whose rows ``_FP``, ``_INSIDE``, ``_OUT``,
    ``_R_NEXT``, ``_R_TOP`` are cumulative p (``fp``), q inside and outside, the smallest ratio of
    the step after each position (the last position's own step at the chain's end) and the largest
    ratio of the step into each position (views ``fp``, ``inside``, ``out``, ``r_top``); the
    smallest ratio of the step into each position (``r_step``: a bucket's floor, ``r_top`` the next
    bucket's; one token's ratio twice), evaluator features, Q where evaluated (nan otherwise) and
    the index (``state_of``) of each position's exact-token state among ``states``, the states after
    0, 1, 2, … of the chain's exact tokens (few: positions share them, gathered only where
    evaluated). A token chain also records its bucket position and tokens.
    """

    def __init__(self, ev, table, feats, r_step, states=None, state_of=None, bucket=None, toks=None):
        self.ev, self.table, self.feats, self.r_step = ev, table, feats, r_step
        self.fp, self.inside, self.out, self.r_top = table[_FP], table[_INSIDE], table[_OUT], table[_R_TOP]
        self.states, self.state_of, self.bucket, self.toks = states, state_of, bucket, toks
        self.q = np.full(table.shape[1], np.nan)

    def exact(self, idx):
        if self.states is None:
            return None
        si = self.state_of[np.asarray(idx)]
        sums, e, sx = self.states
        return sums[si], e[:, si], sx[si]

    def tokens(self, i, toks, pt, qt, ratio=None):
        """The chain of the tokens ``toks`` (sorted by ratio) of the bucket ending at position i, of
        p and q ``pt``, ``qt`` (``ratio``: their p/q, if known)."""
        ev = self.ev
        n = toks.size
        table = np.empty((5, n + 1))
        for row, x, before in ((_FP, pt, self.fp[i - 1]), (_INSIDE, qt, self.inside[i - 1])):
            table[row, 0] = 0.0  # the sum of the first j tokens, then plus the prefix before the bucket
            np.cumsum(x, out=table[row, 1:])
            table[row] += before
        feats = ev.chain_features(self.feats[i - 1], qt, toks)
        out = table[_OUT]  # q of the bucket's tokens from j on, summed from the end, + q after the bucket
        out[n] = 0.0
        np.cumsum(qt[::-1], out=out[n - 1 :: -1])
        out += self.out[i]
        states = state_of = None
        if self.states is not None:
            is_exact = ev.is_exact(qt)
            exact_q = qt[is_exact]
            state_of = np.zeros(n + 1, dtype=np.int64)  # exact tokens among the first j
            if exact_q.size:  # (none: every position has the start state, no pass over the tokens)
                np.cumsum(is_exact, out=state_of[1:])
            start = self.exact([i - 1])
            states = ev.run_exact(exact_q, start, np.arange(-1, exact_q.size)) if exact_q.size else start
        r_step = table[_R_TOP]  # a token's own ratio: the smallest and largest of its step
        r_step[0] = 0.0
        if ratio is None:
            np.divide(pt, qt, out=r_step[1:])
        else:
            r_step[1:] = ratio
        table[_R_NEXT, :n] = r_step[1:]
        table[_R_NEXT, n] = r_step[n]
        sub = _Chain(ev, table, feats, r_step, states, state_of, bucket=i, toks=toks)
        sub.q[0], sub.q[n] = self.q[i - 1], self.q[i]
        return sub


class _Ask:
    """One row's request of a round: its ``parts`` ``(chain, pts, nxt)`` (the stretches pts → nxt of
    each chain), their positions and stretch ends concatenated (``pts``, ``nxt``, (npos,) each;
    part j holds ``ends[j − 1]:ends[j]``), the chain tables gathered there (``at_s``, ``at_e``,
    (5, npos) each: one gather per part and end) and which positions begin a stretch that a token
    chain's first sampling evaluates whole (``whole``, (npos,) bool, or None if none)."""

    def __init__(self, parts: list):
        self.parts = parts
        sizes = [pts.size for _, pts, _ in parts]
        self.ends = list(itertools.accumulate(sizes))  # part j: positions ends[j − 1]:ends[j]
        if len(parts) == 1:
            ch, self.pts, self.nxt = parts[0]
            self.at_s, self.at_e = np.take(ch.table, self.pts, axis=1), np.take(ch.table, self.nxt, axis=1)
        else:
            self.pts = np.concatenate([pts for _, pts, _ in parts])
            self.nxt = np.concatenate([nxt for _, _, nxt in parts])
            self.at_s = np.concatenate([np.take(ch.table, pts, axis=1) for ch, pts, _ in parts], axis=1)
            self.at_e = np.concatenate([np.take(ch.table, nxt, axis=1) for ch, _, nxt in parts], axis=1)
        # a token chain sampled whole (positions 0..m − 1 all asked, distinct: each stretch one step):
        # :func:`_bounds` gives those stretches their exact minimum
        whole = [ch.bucket is not None and pts.size == ch.fp.size - 1 for ch, pts, _ in parts]
        self.whole = np.repeat(whole, sizes) if any(whole) else None

    def part_of(self, j: int) -> int:
        """The part holding position j of the request."""
        return bisect.bisect_right(self.ends, j)

    def mass_arguments(self, ev, bounds=True):
        """The arguments of ``ev.mass`` for Q and (``bounds``) the stretch-bound coefficients at the
        request's positions: (features, out, inside, exact states, out_next or None)."""
        parts = self.parts
        out_next = self.at_e[_OUT] if bounds else None
        exact = _wor.StatesAt([(ch.states, ch.state_of[pts]) for ch, pts, _ in parts]) if ev.has_exact else None
        if len(parts) == 1:  # one chain: its gathers as they are
            ch, pts, _ = parts[0]
            return ch.feats[pts], self.at_s[_OUT], self.at_s[_INSIDE], exact, out_next
        feats = np.concatenate([ch.feats[pts] for ch, pts, _ in parts])
        return feats, self.at_s[_OUT], self.at_s[_INSIDE], exact, out_next

    def record(self, q_at: np.ndarray) -> np.ndarray:
        """Q at the request's positions ``q_at`` recorded in their chains; returns Q at the stretch
        ends (evaluated now or before), (npos,)."""
        start = 0
        for ch, pts, _ in self.parts:
            ch.q[pts] = q_at[start : start + pts.size]
            start += pts.size
        if len(self.parts) == 1:
            ch, _, nxt = self.parts[0]
            return ch.q[nxt]
        return np.concatenate([ch.q[nxt] for ch, _, nxt in self.parts])


_FANOUT = 8  # a long stretch is sampled at about this many positions (more rounds, fewer positions than 12–24)


def _search(root, open_bucket, sample_bucket=None, leaves_plain=False):
    """Branch and bound over the positions of ``root`` (the empty prefix first, f = 0 there).

    Rounds: every live stretch (lo → hi of a chain, bound < best) is sampled (or, for one step of
    the bucket chain, opened into its token chain by ``open_bucket``); the samples of all chains
    are evaluated in one call (a generator: it yields ``(ev, arguments of ev.mass, parts)`` and
    resumes with f and the stretch bounds at the positions of the parts, :func:`_lockstep`), and
    each consecutive pair of samples becomes a stretch of the next round. The
    first round samples the whole root and evaluates its end with them (Q at the end, f of the
    whole chain). ``sample_bucket``: how an opened bucket's token chain is first sampled, a function
    of the chain (:func:`_first_samples`; :func:`_samples` of its positions if None);
    ``leaves_plain``: a round whose stretches are all single steps of token chains (whose bounds
    nothing reads) asks Q alone (:func:`_bounds` then gives them no bound). Returns the best f (≤ 0)
    and where it is ((chain, position), or None for 0).
    """
    ev = root.ev
    n = root.fp.size - 1
    s = _samples(0, n, ev.leaf)
    # the end's own entry (n → n) bounds nothing: it is kept out of the stretches below (nxt > pts)
    parts = [(root, np.append(s, n), np.append(s[1:], [n, n]))]
    best, where = 0.0, None
    while parts:
        # leaves only (token chains' single steps, never kept): Q alone, without the stretch bounds
        need = not leaves_plain or any(ch is root or bool((nxt - pts > 1).any()) for ch, pts, nxt in parts)
        ask = _Ask(parts)
        f, bound = yield ev, ask.mass_arguments(ev, need), ask
        j = int(np.argmin(f))
        if f[j] < best:
            best, where = float(f[j]), (parts[ask.part_of(j)][0], int(ask.pts[j]))
        parts = _next_parts(root, ask, bound < best, open_bucket, sample_bucket)
    return best, where


def _next_parts(root, ask: _Ask, beats: np.ndarray, open_bucket, sample_bucket) -> list:
    """The parts of :func:`_search`'s next round: of each part of ``ask`` in order, the stretches
    whose bound beats the best value (``beats``, (npos,) bool) and span more than one step, sampled
    (:func:`_sample_step`), and the single steps of the root (buckets: each opened into its token
    chain, first sampled by ``sample_bucket``, that part placed before the root's own). The kept
    stretches are found for all parts at once; their samples are Python ranges (a part keeps a
    few stretches: cheaper than array operations per stretch or per part)."""
    span = ask.nxt - ask.pts  # (npos,)
    kept = np.flatnonzero(beats & (span > 0))
    lo_all, hi_all = ask.pts[kept].tolist(), ask.nxt[kept].tolist()
    cuts = np.searchsorted(kept, ask.ends).tolist()  # part j's kept stretches: cuts[j − 1]:cuts[j]
    parts = []
    for (ch, _, _), a, b in zip(ask.parts, [0] + cuts[:-1], cuts):
        pts, nxt = [], []
        for lo, hi in zip(lo_all[a:b], hi_all[a:b]):
            if hi - lo == 1:  # a step of a token chain bounds nothing more; one of the root is a bucket
                sub = open_bucket(hi) if ch is root else None
                if sub is not None:
                    m = sub.fp.size - 1
                    s = _samples(0, m, ch.ev.leaf) if sample_bucket is None else sample_bucket(sub)
                    parts.append((sub, s, np.append(s[1:], m)))
                continue
            samples = range(lo, hi, _sample_step(lo, hi, ch.ev.leaf))
            pts += samples
            nxt += samples[1:]
            nxt.append(hi)
        if pts:
            parts.append((ch, np.array(pts, dtype=np.int64), np.array(nxt, dtype=np.int64)))
    return parts


def _bounds(asks: list, answers: list) -> list:
    """f at the evaluated positions of every row and the lower bound of f over each stretch
    s = pts → e = nxt (``asks``: each row's :class:`_Ask`; ``answers``: each row's ``(Q, D1, C2, C3)``
    at its positions, which are recorded in the chains first: Q at e is then known).

    A prefix H of the stretch adds q-mass x ∈ [0, X] to H_s (X = q(H_e) − q(H_s)), so
    p(H) ≥ L(x) = max(p_s + r_lo x, p_e − r_hi (X − x)) (r_lo, r_hi: the smallest and largest ratio
    of the stretch's steps) and Q(H) ≤ min(Q_e, Q_s + D1 x + C x²/2) (C: the cubic term folded in,
    x ≤ X). With x_c where the quadratic reaches Q_e and x_m where the two lines of L cross:
    beyond x_c, L − Q_e is non-decreasing; below it, L − quadratic is concave on [0, x_m] and on
    [x_m, x_c]; so f ≥ min(f_s, L(x_c) − Q_e, L(x_m) − min(Q_e, quadratic(x_m)) if 0 < x_m < x_c).
    A token chain evaluated whole (:attr:`_Ask.whole`: none of its stretches is kept) gets the
    stretch's exact minimum, min(f_s, f_e), instead. A row answered with Q alone (``leaves_plain``
    of :func:`_search`) gets f and no bound (inf). Returns each row's ``(f, bound)``, over its
    positions in order. One evaluation for all rows (every operation elementwise: each position's
    value is that of its row alone)."""
    plain = [not isinstance(answer, tuple) for answer in answers]
    q_e = [ask.record(answer if is_plain else answer[0]) for ask, answer, is_plain in zip(asks, answers, plain)]
    if any(plain):
        out = [None] * len(asks)
        asked = [i for i, is_plain in enumerate(plain) if not is_plain]
        for i, found in zip(asked, _bounds_of([asks[i] for i in asked], [answers[i] for i in asked],
                                              [q_e[i] for i in asked]) if asked else []):
            out[i] = found
        for i in (i for i, is_plain in enumerate(plain) if is_plain):
            f = asks[i].at_s[_FP] - answers[i]
            out[i] = (f, np.full(f.size, np.inf))
        return out
    return _bounds_of(asks, answers, q_e)


def _bounds_of(asks: list, answers: list, q_ends: list) -> list:
    """:func:`_bounds` of rows answered with the bound coefficients (``q_ends``: each row's Q at its
    stretch ends)."""
    if len(asks) == 1:
        (ask,), (answer,), (q_e,) = asks, answers, q_ends
        at_s, at_e, whole = ask.at_s, ask.at_e, ask.whole  # (5, npos), (5, npos), (npos,)
        q_s, d1, c2, c3 = answer  # (npos,) each
    else:
        at_s = np.concatenate([ask.at_s for ask in asks], axis=1)  # (5, npos)
        at_e = np.concatenate([ask.at_e for ask in asks], axis=1)  # (5, npos)
        q_e = np.concatenate(q_ends)
        q_s, d1, c2, c3 = (np.concatenate([a[i] for a in answers]) for i in range(4))  # (npos,) each
        whole = None
        if any(ask.whole is not None for ask in asks):
            whole = np.concatenate([ask.whole if ask.whole is not None else np.zeros(ask.pts.size, dtype=bool)
                                    for ask in asks])
    p_s, in_s, r_lo = at_s[_FP], at_s[_INSIDE], at_s[_R_NEXT]  # r_lo at the chain's end (x = 0): its own step
    p_e, in_e, r_hi = at_e[_FP], at_e[_INSIDE], at_e[_R_TOP]
    f = p_s - q_s
    mass = in_e - in_s
    rise = np.maximum(q_e - q_s, 0.0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        curv = c2 + c3 * mass / 3.0  # x ≤ mass: the cubic term folded into the quadratic
        x_c = 2.0 * rise / (d1 + np.sqrt(d1 * d1 + 2.0 * curv * rise))
        x_c = np.clip(np.where(np.isfinite(x_c), x_c, 0.0), 0.0, mass)
        low = p_s + r_lo * x_c - q_e  # the bound with p's lower line only
        at_c = np.maximum(p_s + r_lo * x_c, p_e - r_hi * (mass - x_c)) - q_e
        x_m = (r_hi * mass - (p_e - p_s)) / (r_hi - r_lo)
        at_m = p_s + r_lo * x_m - np.minimum(q_e, q_s + d1 * x_m + 0.5 * curv * x_m * x_m)
    bound = np.minimum(f, np.where(np.isnan(at_c), low, at_c))
    inner = (x_m > 0.0) & (x_m < x_c) & ~np.isnan(at_m)
    bound = np.where(inner, np.minimum(bound, at_m), bound)
    if whole is not None:
        bound = np.where(whole, np.minimum(f, p_e - q_e), bound)
    if len(asks) == 1:
        return [(f, bound)]
    ends = np.cumsum([0] + [ask.pts.size for ask in asks]).tolist()
    return [(f[a:b], bound[a:b]) for a, b in zip(ends[:-1], ends[1:])]


def _samples(lo, hi, leaf):
    """lo and about ``_FANOUT`` positions strictly between lo and hi (all of them if ≤ ``leaf``)."""
    return np.arange(lo, hi, _sample_step(lo, hi, leaf))


def _sample_step(lo: int, hi: int, leaf) -> int:
    """The step of :func:`_samples` from lo to hi."""
    inner = hi - lo - 1
    return 1 if inner <= leaf else -(-inner // _FANOUT)


_GEO_MIN = 1024  # an opened bucket of at least this many tokens is also sampled toward its ends


def _samples_to_ends(lo, hi, leaf):
    """:func:`_samples`, plus, on stretches of at least ``_GEO_MIN`` positions, those at distances
    1, 2, 4, … (below the sampling step) from either end (the first sampling of an opened bucket on
    rows as given). A bucket's ends are bucket-chain positions, often the best f found (a tied run
    whose prefixes all lie above its end, as on rows of few distinct ratios): the stretches next to
    the best position are kept until they are single steps, so without these a long bucket is
    narrowed about ``_FANOUT``-fold per round toward its end (five rounds over 16,000 tokens), with
    them in one round."""
    inner = hi - lo - 1
    if inner < _GEO_MIN:
        return _samples(lo, hi, leaf)
    step = -(-inner // _FANOUT)
    steps = 1 << np.arange(max(0, (step - 1).bit_length()))  # 1, 2, 4, … < step
    return np.unique(np.concatenate([np.arange(lo, hi, step), lo + steps, hi - steps]))


# the ratios of a bucket whose largest exceeds its smallest by at most this fraction of it are tied
# (one ratio broken by rounding, as on rows of few distinct ratios)
_TIED = 1e-9


def _first_samples(tied_only: bool):
    """How an opened bucket's token chain is first sampled (``sample_bucket`` of :func:`_search`):
    toward both ends (:func:`_samples_to_ends`) when it holds ``_GEO_MIN`` tokens or more and, with
    ``tied_only``, its ratios are tied (to ``_TIED``); else :func:`_samples`. On rows sorted by ratio
    only tied buckets are: a long tied run (a ``ties`` row's thousands of equal ratios) is narrowed in
    one round instead of five (on 8 ``ties`` rows at V = 151,936, three lockstep rounds instead of
    seven at K = 3 and at K = 4: 9–12% off α* there, the same values), while the long buckets of
    LM-like rows, whose ratios spread over the bucket's width, are found sooner by the plain fan-out
    (sampling them toward their ends too cost 1–2% on ``peaked`` rows)."""

    def first(ch):
        m = ch.fp.size - 1
        r = ch.r_step  # r[1..m]: the tokens' ratios, increasing
        if tied_only and not r[m] - r[1] <= _TIED * r[m]:
            return _samples(0, m, ch.ev.leaf)
        return _samples_to_ends(0, m, ch.ev.leaf)

    return first


_NEVER = np.iinfo(np.int64).max


@functools.lru_cache(maxsize=None)
def _lower_triangle(n: int) -> np.ndarray:
    """``np.tri(n, dtype=bool)`` (read-only: shared by every call)."""
    tri = np.tri(n, dtype=bool)
    tri.flags.writeable = False
    return tri


def _kth_inside(pos: np.ndarray, q_top: np.ndarray, k: int, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """For m = 0..nb − 1, whether H_m (after bucket m) holds k of the top tokens (``q_top``, by
    decreasing q; ``pos``: the bucket position of each) and the k-th largest q among them.

    That q is the one of the first J whose pos_0..pos_J hold k values ≤ m, i.e. whose k-th
    smallest c_J ≤ m; c_J does not increase with J, so J = #{J : c_J > m} (a binary search)."""
    n_top = pos.size
    prefix = np.where(_lower_triangle(n_top), pos[None, :], _NEVER)  # (T, T): row J holds pos_0..pos_J
    c = np.partition(prefix, k - 1, axis=1)[:, k - 1] if n_top >= k else np.full(n_top, _NEVER)  # (T,)
    first = np.searchsorted(-c, -np.arange(nb), side="left")  # (nb,)
    return first < n_top, q_top[np.minimum(first, n_top - 1)]


_CHERNOFF_TIMES = 2.0 ** (np.arange(-4, 100) / 2.0)  # the times tried for the Chernoff cut-off (read-only)
_CHERNOFF_TIMES.flags.writeable = False


def _wor_horizons(q, k, pos, ids, top, out, inside):
    """Grid end for the bucket ends and, per bucket m, the cut-off t_cut(H_{m−1}) for the prefixes
    inside it.

    A prefix H needs the clock integral up to min(40/out(H), t_cut(H)): beyond, the tail is ≤ e^{−40}
    or P[N_H(t) < K] ≤ e^{−40} (:mod:`otbound.token._wor`); ``out``, ``inside``: q outside and inside each
    bucket-chain position; ``pos``: the bucket position of each ``top`` token (nb: above the cut).
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
    through = pos[:, None] <= np.arange(nb)[None, :]  # top token in H_m (after bucket m)
    has_k, kth = _kth_inside(pos, q[top], k, nb)
    s_rest = np.maximum(inside[1:] - q[top] @ through, 0.0)  # mass of H_m outside top
    q_cap = float(q[top[-1]]) if top.size < q.size else 0.0
    t = _CHERNOFF_TIMES
    if q_cap > 0:
        t = t[t <= 1.0 / q_cap]
    # the first t of the grid with μ = s' g(t) ≥ μ*, g(t) = t (1 − q_cap t/2) increasing on it, μ* the
    # least μ whose Chernoff bound is ≤ e^{−40} (the bound decreases in μ > K − 1)
    g = t * (1.0 - 0.5 * q_cap * t)
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.searchsorted(g, _chernoff_mu(k - 1) / s_rest, side="left")  # (nb,); s' = 0: none
        t_chernoff = np.append(t, np.inf)[first]
        t_cut = np.where(has_k, (_wor.TAIL + np.log(k)) / np.where(has_k, kth, 1.0), np.inf)
        t_cut = np.minimum(t_cut, t_chernoff)
        t_ends = np.minimum(_wor.TAIL / out[1:], t_cut)[out[1:] > 0]
    return float(t_ends.max(initial=_wor.TAIL)), np.concatenate([[np.inf], t_cut[:-1]])


@functools.lru_cache(maxsize=None)
def _chernoff_mu(a: int) -> float:
    """The least μ (to a relative 1e-12, rounded up) with −μ + a (1 + ln(μ/a)) ≤ −40 (μ ≥ 40 for a = 0):
    the mean count from which P[N ≤ a] ≤ e^{−40} for a Poisson-binomial count N (Chernoff)."""
    if a == 0:
        return _wor.TAIL
    lo, hi = float(a), float(a) + 2.0 * _wor.TAIL + 10.0 * a  # the bound is ≤ −40 at hi, above at lo
    while hi - lo > 1e-13 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if -mid + a * (1.0 + math.log(mid / a)) <= -_wor.TAIL else (mid, hi)
    return hi * (1.0 + 1e-12)


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
