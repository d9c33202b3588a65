"""The batched sorted-rows kernel of the token layer: laws ``(..., V)`` in numpy or torch (CPU or
CUDA), checked once, sorted once by ratio, and every α* and closed-form acceptance computed from the
same prefix sums, on the caller's device, float64 throughout.

One ordering per row serves every draft law, K and verifier: the tokens sorted by the ratio
``r = p/q`` (``q = 0`` last, ties by index), with prefix sums ``Pc[j] = Σ_{l<j} p``,
``Qc[j] = Σ_{l<j} q`` of the sorted row and suffix sums ``Ps``, ``Qs`` summed from the tail (so that
tiny tails keep their relative accuracy). With ``n(μ) = #{r < μ}`` (a binary search per row)

    h(μ) = Σ (p − μ q)_+ = Ps[n(μ)] − μ Qs[n(μ)],     Σ min(p, c q) = Pc[n(c)] + c Qs[n(c)].

α* (Hu et al. 2502.18779, Theorem 3.1, prefix form ``α* = 1 + min_j [Pc[j] − Q(first j tokens)]``):

* **with replacement**: ``1 + min(0, min_j Pc[j] − Qc[j]^K)`` over the prefixes with ratio ≤ K
  (beyond, adding a token raises the value);
* **without replacement**: K = 1 as with replacement; K = 2 in closed form on the same prefixes,
  ``Q(H) = s − (1 − s) Σ_{i∈H} q_i/(1 − q_i)`` (:mod:`otbound.token._wor`; ``1 − q_i`` of a token
  with ``q_i > 1/2`` is the other tokens' mass summed directly); K ≥ 3 the exponential-clock
  integral by the branch and bound of :mod:`otbound.token._search`, run on the rows as sorted here
  (its bucket sums become sums of runs, built once per row for every K:
  :class:`otbound.token._search.RowRuns`);
* **greedy**: ``α*_greedy = p(G) + Σ_{x∉G} min(p, q')``, ``G`` the K − 1 largest q (ties to the
  lower index), ``q' = q/(1 − q(G))`` off G: ``Σ_x min(p, c q)`` from the prefix sums minus the G
  terms;
* **deterministic**: ``α*_det = p(G)``, ``G`` the K largest q. One selection of the largest q per
  batch (:func:`greedy_split_rows`) serves both laws at every K.

Sorting: on the CPU one unsigned-integer sort of the ratio's bit pattern with the index in its low
bits (:func:`_ratio_order`; ``torch.sort`` costs 16× ``np.sort`` for float64 on one core, numpy's
``argsort`` 2.6×), near ties repaired exactly, one row at a time from the division to the prefix
sums (:meth:`SortedRows._sort_cpu`); a row of at most 256 distinct ratios by a radix argsort of their
ranks instead (:func:`_few_ratio_order`); on CUDA a stable ``torch.sort`` of the whole batch.

Sparing the (B, V) passes: with-replacement α* and the K = 2 closed form evaluate their prefix
function only in the column blocks whose lower bound can hold its minimum (:func:`_with_replacement`,
:func:`_pair_closed_form`); one selection of the largest q per batch serves the greedy and
deterministic laws.

A single call (rows not sorted, no binding sets) sorts nothing whole: with replacement sums the
ratio buckets (:func:`_with_replacement_buckets`; numpy laws as given are checked on the way,
:func:`with_replacement_as_given`), the greedy and deterministic laws select the largest q from
column maxima (:func:`top_tokens`, :func:`_top_law_rows`, :func:`top_law_as_given`).

Tolerances: laws are checked and renormalised as everywhere (``LAW_ATOL = 1e-6``); the values agree
with the per-row references of the tests to float64 summation error (≤ 1e-14 measured, 1e-12
demanded; without replacement K ≥ 3 within the clock integral's stated 1e-12).
"""

from __future__ import annotations

import copy
import functools
import math

import numpy as np

from otbound._backend import is_torch, on_accelerator, on_one_cpu_thread, one_cpu_thread, positive_counts
from otbound._validation import LAW_ATOL, InvalidInputError, as_pair, check_num_drafts, check_real
from otbound.token import _search, _wor
from otbound.token._draft_law import draft_law

_OVERFLOW_Q = 1.0 / np.finfo(np.float64).max  # p/q ≤ 1/q is finite for q ≥ this
_BLOCK = 512  # columns per block of the prefix sums (SortedRows._prefix)


def _torch():
    import torch

    return torch


# ---------------------------------------------------------------------------------------------
# the checked batch


class LawBatch:
    """A checked batch of target/draft laws, sorted once by ratio and shared by every quantity.

    Every α* and every verifier's batched acceptance on the same positions reads the same ratio
    ordering and prefix sums (and caches what it derives: α* per law and K, the greedy split, the
    RRS thresholds), so a measurement of many quantities pays for one sort per row.

    Parameters
    ----------
    p, q : array_like or torch.Tensor, shape (V,) or (..., V)
        Target and draft laws along the last axis (same shape; each row sums to 1 within
        ``LAW_ATOL`` and is renormalised; a numpy law summing to exactly 1 is not copied). Torch
        tensors stay on their device (CPU or CUDA).
    seed : int, sequence of ints or numpy.random.SeedSequence
        Seeds the batch's torch generator (Monte Carlo estimates, e.g. RRS without replacement at
        K ≥ 3).
    check_overflow : bool
        Also refuse a positive ``q`` so small that ``p/q`` overflows float64 (the verifiers'
        acceptance ratios).

    Raises
    ------
    InvalidInputError
        Malformed laws (shape, NaN, negative entry, sum away from 1), or an overflowing ``p/q``.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.token import LawBatch
    >>> b = LawBatch(np.array([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]]), np.full((2, 3), 1 / 3))
    >>> b.shape, b.vocab
    ((2,), 3)
    >>> b.wrap(b.optimal_acceptance(2, "with_replacement")).round(6)
    array([1.      , 0.955556])
    """

    def __init__(self, p, q, *, seed=0, check_overflow: bool = False):
        torch = _torch()
        if is_torch(p) or is_torch(q):
            self.device = (p if is_torch(p) else q).device
            p, q, q_min = _check_torch(p, q, self.device)
            self.q_min = q_min.reshape(-1)  # (B,): from the check's pass (the cached property otherwise)
            self.shape = tuple(p.shape[:-1])
            p, q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])  # (B, V) each
        else:
            self.device = None
            p, q, q_min = _check_numpy(p, q)
            v = p.shape[-1]
            self._q_min_rows = q_min.reshape(-1)  # (B,) from the check's pass: q_min's tensor on first use
            low = float(q_min) if q_min.ndim == 0 else float(q_min.min()) if q_min.size else math.inf
            if low > 0.0:  # every token of every row has q > 0: no count needed
                self.support = v
            numpy_rows = (p.reshape(-1, v), q.reshape(-1, v))  # (B, V) each, what numpy_rows() gives
            self.shape = tuple(p.shape[:-1])
            p, q = torch.from_numpy(numpy_rows[0]), torch.from_numpy(numpy_rows[1])  # (B, V) views
        self.vocab = int(p.shape[-1])
        self.p = p  # (B, V) float64
        self.q = q  # (B, V) float64
        self.seed = seed
        self._memo: dict = {} if self.device is not None else {"numpy": numpy_rows}
        if check_overflow:
            self._check_overflow()

    @property
    def rows(self) -> int:
        """B, the number of rows (positions)."""
        return self.p.shape[0]

    def wrap(self, values):
        """``values`` (a (B,) float64 tensor) in the caller's type and batch shape: a float for 1-D
        numpy laws, a numpy array for numpy batches, a tensor on the input's device for torch."""
        if self.device is not None:
            return values.reshape(self.shape)
        arr = values.numpy().reshape(self.shape)  # a CPU tensor; numpy reshapes for less overhead
        return float(arr) if arr.ndim == 0 else arr

    def memo(self, key, build):
        """The value cached under ``key``, else ``build()`` cached (built on one intra-op CPU thread:
        :func:`otbound._backend.one_cpu_thread`)."""
        if key not in self._memo:
            with one_cpu_thread():
                self._memo[key] = build()
        return self._memo[key]

    @functools.cached_property
    def sorted(self) -> SortedRows:
        """The rows sorted by ratio with their prefix and suffix sums (:class:`SortedRows`)."""
        with one_cpu_thread():
            return SortedRows(self.p, self.q)

    @functools.cached_property
    def q_min(self):
        """The smallest q of each row, (B,) float64: one reduction serving the support and the test
        for positive q below ``_wor.CLOCK_FLOOR`` (:func:`_tiny_q_rows`); the check's own minima
        (numpy laws: made a tensor on first use)."""
        if self.device is None:
            return _torch().from_numpy(self._q_min_rows)
        return self.q.amin(1)

    @functools.cached_property
    def support(self) -> int:
        """The smallest number of tokens with q > 0 over the rows (V for an empty batch)."""
        return int(positive_counts(self.q, self.q_min).min()) if self.rows else self.vocab

    @functools.cached_property
    def generator(self):
        """A torch generator on the batch's device seeded from ``seed``."""
        torch = _torch()
        gen = torch.Generator(device=self.p.device)
        seq = self.seed if isinstance(self.seed, np.random.SeedSequence) else np.random.SeedSequence(self.seed)
        gen.manual_seed(int(seq.generate_state(1, np.uint64)[0] >> np.uint64(1)))
        return gen

    def check_num_drafts(self, num_drafts, sampling="with_replacement") -> int:
        """``num_drafts`` checked as K ≥ 1 and, for a law of distinct drafts (``sampling``: a name
        or :class:`otbound.token.DraftLaw`), within the support of every row's q
        (:meth:`otbound.token.DraftLaw.check_num_drafts`)."""
        law = draft_law(sampling)
        k = law.check_num_drafts(num_drafts)
        if law.distinct:  # the support is counted only where it matters
            law.check_support(k, self.support)
        return k

    @on_one_cpu_thread
    def optimal_acceptance(self, num_drafts: int, sampling="with_replacement"):
        """α* per row, a (B,) float64 tensor on the batch's device, in [0, 1]: the α* kernel of the
        draft law ``sampling`` (a name or :class:`otbound.token.DraftLaw`; module docstring).

        Examples
        --------
        >>> import numpy as np
        >>> from otbound.token import LawBatch
        >>> b = LawBatch(np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5]))
        >>> round(float(b.optimal_acceptance(2, "greedy")[0]), 6)
        0.9
        """
        law = draft_law(sampling)
        k = self.check_num_drafts(num_drafts, law)
        return self.memo(("alpha", law.name, k), lambda: law.optimal_acceptance(self, k)[0])

    def numpy_rows(self):
        """``(P, Q)`` as float64 numpy arrays of shape (B, V) (a copy off the CPU)."""
        return self.memo("numpy", lambda: (self.p.cpu().numpy(), self.q.cpu().numpy()))

    def _check_overflow(self):
        q = self.q
        q_min = self.q_min if self.device is not None else self.q_min.numpy()  # (B,)
        if not self.rows or float(q_min.min()) >= _OVERFLOW_Q:  # every q ≥ the floor: nothing to scan
            return
        if self.device is None:  # numpy laws: one scan in numpy (cheaper per call than torch's at small V)
            qn = self.numpy_rows()[1]
            if not bool(((qn > 0) & (qn < _OVERFLOW_Q)).any()):
                return
        elif not bool(((q > 0) & (q < _OVERFLOW_Q)).any()):
            return
        torch = _torch()
        over = (q > 0) & torch.isinf(self.p / torch.where(q > 0, q, torch.ones_like(q)))
        if bool(over.any()):
            r, i = torch.nonzero(over)[0].tolist()
            where = f"token {i}" if not self.shape else f"row {r}, token {i}"
            raise InvalidInputError(
                f"p/q overflows float64 at {where} (p = {float(self.p[r, i]):.3g}, q = {float(q[r, i]):.3g}): "
                f"set such denormal q entries to 0")


def _check_numpy(p, q):
    """``(p, q, q_min)``: numpy laws checked and renormalised as :func:`otbound._validation.as_pair`
    does (the same ``x / x.sum(-1)``, bit for bit), contiguous float64, and the smallest renormalised
    q of each row (shape ``q.shape[:-1]``). A float64 law whose rows all sum to exactly 1 is held as
    given, without a copy (dividing by 1 would copy it unchanged; the kernel never writes to the laws).
    A real array passes on two reductions per law (its
    rows' sums and minima: a finite sum of entries ≥ 0 has finite entries); anything else, or any
    failed condition, is handed to ``as_pair``, whose checks and messages apply."""
    arrays = []
    for x in (p, q):
        a = np.asarray(x)
        if a.dtype.kind not in "biuf" or a.ndim == 0 or a.shape[-1] == 0:
            return (*_as_pair_with_min(p, q),)
        a = np.ascontiguousarray(a, dtype=np.float64)
        if a.ndim == 1:  # one law: the same tests on Python floats (fewer numpy calls for a short row)
            total, low = float(a.sum()), float(a.min())
            if not (abs(total - 1.0) <= LAW_ATOL and low >= 0.0):
                return (*_as_pair_with_min(p, q),)
            keep = total == 1.0 and a.flags.writeable  # torch refuses to wrap a read-only array
            arrays.append((a if keep else a / total, np.float64(low), np.float64(total)))
            continue
        s = a.sum(axis=-1, keepdims=True)  # (..., 1)
        lows = a.min(axis=-1, keepdims=True)  # (..., 1): NaN where the row holds one
        # a NaN or infinite sum fails the first test; a NaN entry makes its row's sum NaN
        if not ((np.abs(s - 1.0) <= LAW_ATOL).all() and not (lows < 0.0).any()):
            return (*_as_pair_with_min(p, q),)
        if not (a.flags.writeable and bool((s == 1.0).all())):  # x / 1 = x: such a law is held as given
            a = a / s
        arrays.append((a, lows, s))
    (p, _, _), (q, lows, s) = arrays
    if p.shape != q.shape:
        return (*_as_pair_with_min(p, q),)
    # min_j fl(q_j/s) = fl(min_j q_j / s): division by s > 0 is monotone
    return p, q, np.asarray(lows / s)[..., 0] if q.ndim > 1 else np.asarray(lows / s)


def _as_pair_with_min(p, q):
    """:func:`otbound._validation.as_pair` (raising for malformed laws) and the rows' smallest q."""
    p, q = as_pair(p, q)
    return np.ascontiguousarray(p), np.ascontiguousarray(q), q.min(axis=-1)


def _check_torch(p, q, device):
    """``(p, q, q_min)``: the laws as checked, renormalised float64 tensors on ``device`` (the rules
    and messages of :func:`otbound._validation.as_law`) and the smallest renormalised q of each row
    (..., shape ``q.shape[:-1]``), from the check's own minima: ``min_j fl(q_j/s) = fl(min_j q_j / s)``
    (division by a positive s rounds monotonically)."""
    torch = _torch()
    out, mins = [], []
    for name, x in (("p", p), ("q", q)):
        x = torch.as_tensor(check_real(x, name), device=device).to(torch.float64)
        if x.ndim == 0:
            raise InvalidInputError(f"{name} must be an array of probabilities, got a scalar")
        if x.shape[-1] == 0:
            raise InvalidInputError(f"{name} has an empty vocabulary axis (shape {tuple(x.shape)})")
        s = x.sum(dim=-1, keepdim=True)
        lows = x.amin(-1, keepdim=True) if x.numel() else s  # (..., 1) the rows' smallest entries
        # one pass each for the common case: a finite non-negative row has a finite sum and min ≥ 0
        if x.numel() and not (bool(torch.isfinite(s).all()) and float(lows.amin()) >= 0.0):
            if not bool(torch.isfinite(x).all()):
                bad = torch.nonzero(~torch.isfinite(x))[0].tolist()
                raise InvalidInputError(f"{name} has a NaN or infinite entry at index {tuple(bad)}")
            bad = torch.nonzero(x < 0)[0].tolist()
            raise InvalidInputError(f"{name} has a negative entry {float(x[tuple(bad)])!r} at index {tuple(bad)}")
        err = (s - 1.0).abs()
        if x.numel() and bool((err > LAW_ATOL).any()):
            flat = err.reshape(-1)
            row = int(torch.argmax(flat))
            idx = tuple(np.unravel_index(row, tuple(err.shape[:-1]))) if x.ndim > 1 else ()
            raise InvalidInputError(f"{name} does not sum to 1 (row {idx} sums to {float(s.reshape(-1)[row]):.9g}; "
                                    f"tolerance {LAW_ATOL:g})")
        out.append(x / s)
        mins.append((lows / s)[..., 0])
    if out[0].shape != out[1].shape:
        raise InvalidInputError(
            f"p and q must have the same shape, got {tuple(out[0].shape)} and {tuple(out[1].shape)}")
    return out[0], out[1], mins[1]


# ---------------------------------------------------------------------------------------------
# the ratio ordering and its prefix sums


def _ratio(p, q):
    """p/q with q = 0 mapped to +inf (0/0 and x/0 alike: last) and −0 to +0 (non-negative floats
    sort as their bit patterns)."""
    return (p / q).masked_fill_(q == 0, math.inf).add_(0.0)


_INF_BITS = np.float64(math.inf).view(np.uint64)  # the bit pattern of +inf: every larger pattern is NaN or negative
_SIGN_BIT = np.uint64(1 << 63)  # −0's pattern, the least with the sign bit


def _as_ratio_bits(bits):
    """In place, the bit patterns (uint64) of plain divisions p/q of laws (p, q ≥ 0, either may be
    −0) made those of :func:`_ratio`'s values: the sign cleared (−0 → +0), then every pattern above
    +inf's (NaN from 0/0, and −inf from x/−0 once cleared) lowered to +inf's. Every other pattern
    (a finite p/q with q > 0, +inf from x/+0 or from an overflow) is _ratio's already."""
    np.bitwise_and(bits, ~_SIGN_BIT, out=bits)
    np.minimum(bits, _INF_BITS, out=bits)


def _index_bits(v: int) -> int:
    return max(1, (v - 1).bit_length())


def _ratio_order(r, index=None):
    """Per row of ``r`` (float64 ratios, numpy; overwritten: the result lives in its memory), the
    indices sorting it by (ratio, index) up to near ties: one unsigned-integer sort. A key is the
    ratio's bit pattern (monotone for non-negative floats) with its low ⌈log2 V⌉ bits replaced by the
    index, so ratios closer than a relative 2^(⌈log2 V⌉ − 52) may come out of order:
    :func:`_near_tie_order`.

    ``index``: ``np.arange(V, dtype=np.uint64)`` if the caller keeps one for many rows.

    Returns ``(order (B, V) int64, odd (B,) bool)``: ``odd`` marks the rows holding a pattern above
    +inf's (NaN from 0/0, or a sign bit: −0, −inf), which sort last whatever they are; such a row's
    order is valid only for ratios made by :func:`_ratio` (the caller redoes those rows)."""
    b = _index_bits(r.shape[1])
    low = np.uint64((1 << b) - 1)
    key = r.view(np.uint64)
    key &= ~low
    key |= np.arange(r.shape[1], dtype=np.uint64) if index is None else index
    key.sort(axis=1)
    odd = key[:, -1] > (_INF_BITS | low)  # (B,): the largest key of each row lies last
    key &= low
    return key.view(np.int64), odd


def _near_tie_order(r_in_order, descents):
    """The moves that sort one row, ordered by :func:`_ratio_order`, exactly by (ratio, index): only
    runs of equal truncated ratio (the ratio's bits above the low b = ⌈log2 V⌉) can hold a descent,
    and only the runs that do move. ``r_in_order``: the row's ratios in the given order (non-negative
    floats, no NaN: their bit patterns are monotone); ``descents``: the positions j with
    ``r[j + 1] < r[j]`` (at least one).

    Returns ``(pos, src)``: ``x[pos] = x[src]`` reorders any array of the row (``pos`` None: the whole
    row, ``x[:] = x[src]``). Within a run the ratios lie in index order where they are equal (the
    first sort broke the truncated ties by index), so a stable sort of each run by ratio gives
    (ratio, index):

    * few tokens in such runs (at most V/4, or V > 2^21): the runs, found by binary search on the
      truncated ratio (nondecreasing along the row), gathered and sorted stably by ratio;
    * many, in few runs whose ratios span at most ``_NEAR_SPREAD`` units of the last place (a row of
      few distinct ratios, each broken into near ties by rounding): a stable counting sort by
      (run, offset of the ratio's bits from the run's least), :func:`_near_tie_buckets`;
    * else one unsigned-integer sort of the key (run rank, low b bits of the ratio, position),
      3b ≤ 64 bits (equal ratios within a run already lie in index order, so position breaks their
      ties as the index would). Work arrays are reused in place (one row, in cache)."""
    v = r_in_order.size
    b = _index_bits(v)
    bits = r_in_order.view(np.uint64)
    sh = np.uint64(b)
    run = bits[descents] >> sh  # (d,) the truncated ratios at the descents: nondecreasing
    new = np.empty(run.size, dtype=bool)  # (d,) the first descent of each run
    new[0] = True
    np.not_equal(run[1:], run[:-1], out=new[1:])
    run = run[new]  # (m,) one per run holding a descent
    lo = np.searchsorted(bits, run << sh, side="left")  # (m,) the runs' bounds
    lens = np.searchsorted(bits, (run + np.uint64(1)) << sh, side="left") - lo  # (m,)
    size = int(lens.sum())
    if 4 * size <= v or 3 * b > 64:
        pos = np.arange(size) + np.repeat(lo - (np.cumsum(lens) - lens), lens)  # (size,) increasing
        return pos, pos[np.argsort(r_in_order[pos], kind="stable")]
    if lo.size * _RUN_TOKENS <= v:  # few long runs: counted one at a time, the rest of the row in place
        perm = _near_tie_runs(bits, lo, lens)
        if perm is not None:
            return None, perm
    run = np.right_shift(bits, sh)  # (V,) the truncated ratio
    starts = np.flatnonzero(run[1:] != run[:-1]) + 1  # (R − 1,) the runs' first positions but the first
    if starts.size < v // 64:
        perm = _near_tie_buckets(bits, np.concatenate(([0], starts)))
        if perm is not None:
            return None, perm
    key = np.zeros(v, dtype=np.uint64)  # (V,) run starts, then the rank, then the key
    key[starts] = 1
    np.cumsum(key, out=key)  # the run's rank < V: fits in b bits
    key <<= np.uint64(2 * b)
    low = np.uint64((1 << b) - 1)
    np.bitwise_and(bits, low, out=run)
    run <<= sh
    key |= run
    key |= np.arange(v, dtype=np.uint64)
    key.sort()
    key &= low
    return None, key.view(np.int64)


_NEAR_SPREAD = 8  # the widest run (units of the last place) the counting sort of near ties takes
_RUN_TOKENS = 2048  # runs holding descents this long on average are counted one at a time (_near_tie_runs)


def _near_tie_runs(bits, lo, lens):
    """The permutation sorting a row's ratios (bit patterns ``bits`` (V,)) stably by ratio where only
    the runs of equal truncated ratio starting at ``lo`` (m,), ``lens`` (m,) long (increasing,
    disjoint) hold descents, their equal ratios in index order: the identity elsewhere, and within
    each run the order (offset of the ratio's bits from the run's least, position), by numpy's stable
    radix sort of the run's offsets as uint8 (one run at a time, in cache: for a few long runs, as a
    row of a few dozen distinct ratios has). None where an offset reaches ``_NEAR_SPREAD`` (the
    caller sorts keys instead)."""
    perm = np.arange(bits.size)  # (V,)
    for a, n in zip(lo.tolist(), lens.tolist()):
        run = bits[a : a + n]  # (n,) one run's bit patterns
        off = run - run.min()  # (n,) offsets from the run's least ratio
        if int(off.max()) >= _NEAR_SPREAD:
            return None
        np.add(np.argsort(off.astype(np.uint8), kind="stable"), a, out=perm[a : a + n])
    return perm


def _near_tie_buckets(bits, starts):
    """The permutation sorting a row's ratios (bit patterns ``bits`` (V,), in runs of equal truncated
    ratio beginning at ``starts`` (R,), equal ratios of a run in index order) stably by ratio, by
    counting: within a run a ratio's bits exceed the run's least by an offset o, and where every
    offset is below ``_NEAR_SPREAD`` the order is (run, o, position). One pass per offset value
    gathers its positions (increasing) and scatters them after the run's smaller offsets. None where
    an offset is larger (the caller sorts keys instead)."""
    v = bits.size
    lens = np.diff(starts, append=v)  # (R,)
    off = bits - np.repeat(np.minimum.reduceat(bits, starts), lens)  # (V,) offsets within the runs
    spread = int(off.max()) + 1
    if spread > _NEAR_SPREAD:
        return None
    off = off.astype(np.uint8)
    perm = np.empty(v, dtype=np.int64)  # (V,)
    fill = starts.copy()  # (R,) the next free place of each run
    bounds = np.append(starts, v)  # (R + 1,)
    mask = np.empty(v, dtype=bool)  # (V,)
    for o in range(spread):
        idx = np.flatnonzero(np.equal(off, o, out=mask))  # (n,) increasing positions of offset o
        if not idx.size:
            continue
        count = np.diff(np.searchsorted(idx, bounds))  # (R,) of them per run
        perm[np.repeat(fill - (np.cumsum(count) - count), count) + np.arange(idx.size)] = idx
        fill += count
    return perm


_WARM_V = 1 << 16  # rows this long are read into cache before their gather (SortedRows._sort_cpu)
_FEW_RATIOS = 256  # rows of at most this many distinct ratios are sorted by counting (_few_ratio_order) ...
_FEW_MIN_V = 4096  # ... from this many columns on
_FEW_SAMPLE = 512  # about this many evenly spaced ratios of a row decide whether to count its distinct ratios
_HASH_BITS = 16  # the table of ranks: 2^16 bytes
_HASH_MULTIPLIERS = tuple(
    np.uint64(a)
    for a in (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
              0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x94D049BB133111EB, 0xBF58476D1CE4E5B9)
)  # odd 64-bit constants of the multiplicative hash, tried in turn until one keeps the ratios apart


def _few_ratio_order(bits, ordered, scratch, rank):
    """The indices sorting one row exactly by (ratio, index) where it holds at most ``_FEW_RATIOS``
    distinct ratios (rounded logits, laws truncated to a few tokens): the rank of each ratio among the
    row's distinct ones, by a table indexed by a multiplicative hash of its bit pattern
    (``(bits · a) >> (64 − _HASH_BITS)``, ``a`` the first of ``_HASH_MULTIPLIERS`` giving the distinct
    ratios distinct slots), then numpy's stable radix argsort of the uint8 ranks: a strictly
    increasing function of the ratio, ties kept in index order. No near ties to repair.

    ``bits`` (V,) uint64: the bit patterns of the row's plain divisions p/q (p, q ≥ 0, either may be
    −0); ``ordered`` (V,) uint64: the patterns sorted (on success: the ratios in the order returned,
    the same values); ``scratch`` (V,) uint64 and ``rank`` (V,) uint8: work arrays, overwritten.

    Returns ``(order, odd)``: ``order`` (V,) int64, or None where the row is not one of few ratios
    (a sample of about ``_FEW_SAMPLE`` ratios already holds more, or the whole row does), or where no
    multiplier separates them; ``odd``: the row held a pattern above +inf's (NaN from 0/0, or a sign
    bit: −0, −inf), found in the sample or by the full sort (not where the sample refused a row
    without them). Such a row's ``bits`` are made :func:`_ratio`'s in place
    (:func:`_as_ratio_bits`): before the full sort where the sample holds one, else ``ordered``
    with them: the sorted patterns above +inf's lie last, the −0 among them first; they move to
    the front as +0 and the rest stay last as +inf."""
    v = bits.size
    sample = np.sort(bits[:: max(1, v // _FEW_SAMPLE)])  # (≈ _FEW_SAMPLE,)
    odd = bool(sample[-1] > _INF_BITS)
    if odd:  # the sample holds 0/0 or −0: the row made _ratio's first
        _as_ratio_bits(bits)
        _as_ratio_bits(sample)
        sample.sort()
    if np.count_nonzero(sample[1:] != sample[:-1]) >= _FEW_RATIOS:
        return None, odd
    np.copyto(ordered, bits)
    ordered.sort()
    if ordered[-1] > _INF_BITS:  # 0/0 or −0 the sample missed
        odd = True
        plain = int(np.searchsorted(ordered, _INF_BITS, side="right"))  # patterns of non-negative floats
        zeros = int(np.searchsorted(ordered, _SIGN_BIT, side="right")) - plain  # the −0
        ordered[zeros : zeros + plain] = ordered[:plain]  # (numpy copies overlapping slices as if apart)
        ordered[:zeros] = 0
        ordered[zeros + plain :] = _INF_BITS
        _as_ratio_bits(bits)
    new = rank.view(bool)  # (V,) the first of each distinct pattern
    new[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    if np.count_nonzero(new) > _FEW_RATIOS:
        return None, odd
    distinct = ordered[new]  # (D,) increasing: patterns of non-negative floats order as the floats
    shift = np.uint64(64 - _HASH_BITS)
    for a in _HASH_MULTIPLIERS:
        slot = (distinct * a) >> shift  # (D,) wraps modulo 2^64
        taken = np.sort(slot)
        if not (taken[1:] == taken[:-1]).any():
            break
    else:
        return None, odd
    table = np.zeros(1 << _HASH_BITS, dtype=np.uint8)  # (2^16,) slot → rank
    table[slot] = np.arange(distinct.size)
    np.multiply(bits, a, out=scratch)
    scratch >>= shift
    np.take(table, scratch.view(np.int64), out=rank)  # (V,) each ratio's rank among the distinct ones
    return np.argsort(rank, kind="stable"), odd


class SortedRows:
    """Rows ``p``, ``q`` (B, V) sorted by ratio p/q (ties by index, q = 0 last) with prefix sums
    (module docstring). ``order`` (B, V): the sorted token ids; ``ps``, ``qs``, ``r``: p, q and the
    ratio in that order; ``pc``, ``qc`` (B, V + 1): prefix sums."""

    def __init__(self, p, q):
        self.v = p.shape[1]
        if not on_accelerator(p):
            self._sort_cpu(p, q)
        else:
            torch = _torch()
            order = torch.sort(_ratio(p, q), dim=1, stable=True).indices  # (B, V)
            self.ps, self.qs = (torch.gather(x, 1, order) for x in (p, q))  # (B, V) each
            self.r = _ratio(self.ps, self.qs)  # (B, V): the same divisions, in sorted order
            self.order = order
            self.pc, self.qc = self._prefix(self.ps), self._prefix(self.qs)  # (B, V + 1) each
            # suffix sums summed from the tail (exact in relative terms where they are tiny and get
            # multiplied by a large μ or c; never 1 − prefix), stored reversed: rsuf[:, i] = the last i
            self._prs, self._qrs = self._prefix(self.ps.flip(1)), self._prefix(self.qs.flip(1))
        self.q_tot = self.qc[:, -1:]

    def _sort_cpu(self, p, q):
        """Every array of the CPU path, one row at a time (a row's dozen work arrays, ≈ 1.2 MB
        each at V = 151,936, stay in cache from the division to the prefix sums; the batch's do
        not, so each output row is written from outside the cache once: the prefix sums take
        about 2.5× their time in cache): one unsigned-integer sort (:func:`_ratio_order`) of the
        plain division p/q (a row holding 0/0 or −0 made :func:`_ratio`'s by
        :func:`_as_ratio_bits`), p and q gathered by
        ``index_select`` (each row of at least ``_WARM_V`` read once in a streaming pass just
        before: the sort has pushed it out of the core's cache, and the random reads of the
        gather cost about twice as much from farther), the ratios divided again in sorted order
        (and made _ratio's likewise), a near-tie descent repaired in place
        (:func:`_near_tie_order`), then the prefix and suffix sums. A row of few distinct ratios is
        ordered exactly by counting instead (:func:`_few_ratio_order`: no key sort, no repair, the
        sorted ratios its sorted division). The same values as the batched path of an accelerator,
        bit for bit."""
        torch = _torch()
        b, v = p.shape
        order = torch.empty((b, v), dtype=torch.int64)  # (B, V)
        ps, qs, r = (torch.empty_like(p) for _ in range(3))  # (B, V) each
        pc, qc, prs, qrs = (torch.empty((b, v + 1), dtype=p.dtype) for _ in range(4))  # (B, V + 1) each
        descent = np.empty(max(v - 1, 0), dtype=bool)  # (V − 1,) r[j + 1] < r[j] of the row
        index = np.arange(v, dtype=np.uint64)  # (V,) the token ids of every row's sort keys
        rank = np.empty(v if v >= _FEW_MIN_V else 0, dtype=np.uint8)  # (V,) work array of _few_ratio_order
        for i in range(b):
            key = order[i].numpy().view(np.float64)  # (V,) the division, then the sort keys, then the order
            torch.div(p[i], q[i], out=torch.from_numpy(key))
            exact, odd = None, False
            if v >= _FEW_MIN_V:  # the ratios sorted into r[i] (kept if counted); ps[i]: free until the gather
                work = r[i].numpy().view(np.uint64), ps[i].numpy().view(np.uint64), rank
                exact, odd = _few_ratio_order(key.view(np.uint64), *work)  # odd: the key made _ratio's
            if exact is not None:
                key.view(np.int64)[:] = exact
            elif _ratio_order(key.reshape(1, v), index)[1][0]:  # 0/0 or −0 (not found by the counting)
                odd = True
                torch.div(p[i], q[i], out=torch.from_numpy(key))
                _as_ratio_bits(key.view(np.uint64))
                _ratio_order(key.reshape(1, v), index)
            for x, xs in ((p, ps), (q, qs)):
                if v >= _WARM_V:
                    np.max(x[i].numpy())  # one streaming read puts the row in cache for the random gather
                torch.index_select(x[i], 0, order[i], out=xs[i])
            r_row = r[i].numpy()
            if exact is None:
                torch.div(ps[i], qs[i], out=r[i])
                if odd:
                    _as_ratio_bits(r_row.view(np.uint64))
            if exact is None and v > 1 and np.less(r_row[1:], r_row[:-1], out=descent).any():
                pos, src = _near_tie_order(r_row, np.flatnonzero(descent))  # local moves: cache-friendly
                for x in (order, ps, qs, r):  # r too: the same divisions, moved
                    x_row = x[i].numpy()
                    if pos is None:
                        x_row[:] = np.take(x_row, src)
                    else:
                        x_row[pos] = x_row[src]
            self._prefix(ps[i : i + 1], out=pc[i : i + 1])
            self._prefix(qs[i : i + 1], out=qc[i : i + 1])
            self._prefix(ps[i : i + 1].flip(1), out=prs[i : i + 1])
            self._prefix(qs[i : i + 1].flip(1), out=qrs[i : i + 1])
        self.order, self.ps, self.qs, self.r = order, ps, qs, r
        self.pc, self.qc, self._prs, self._qrs = pc, qc, prs, qrs

    def row(self, i):
        """The same structure for row ``i`` alone (shape (1, V)), made once per row (views)."""
        rows = self.__dict__.setdefault("_rows", {})
        if i not in rows:
            view = copy.copy(self)
            view._rows = {}
            for name in ("r", "ps", "qs", "pc", "qc", "_prs", "_qrs", "q_tot", "order"):
                setattr(view, name, getattr(self, name)[i : i + 1])
            rows[i] = view
        return rows[i]

    @staticmethod
    def _prefix(x, out=None):
        """``[0, x_0, x_0 + x_1, ...]`` per row, (B, V + 1) (written into ``out`` if given), summed in
        blocks of ``_BLOCK``: within a block sequentially, the block totals by their own cumulative
        sum, so the rounding error grows with ``_BLOCK + V/_BLOCK`` terms instead of V (a
        sequential sum of 151,936 sorted terms drifts by up to ~1e-12; blocked, ~1e-14)."""
        torch = _torch()
        b, v = x.shape
        if out is None:
            out = torch.empty((b, v + 1), dtype=x.dtype, device=x.device)
        out[:, 0] = 0.0
        m = (v // _BLOCK) * _BLOCK
        if m <= _BLOCK:
            torch.cumsum(x, 1, out=out[:, 1:])
            return out
        inner = out[:, 1 : m + 1].unflatten(1, (-1, _BLOCK))  # (B, m/_BLOCK, _BLOCK), a view of out
        torch.cumsum(x[:, :m].reshape(b, -1, _BLOCK), 2, out=inner)
        offsets = torch.cumsum(inner[:, :, -1], 1)  # (B, m/_BLOCK): the sum through each block
        inner[:, 1:] += offsets[:, :-1, None]
        if m < v:
            torch.cumsum(x[:, m:], 1, out=out[:, m + 1 :])
            out[:, m + 1 :] += offsets[:, -1:]
        return out

    def psuf(self, n):
        """Σ_{l ≥ n} p of the sorted row (n: positions, (B, m))."""
        return _torch().gather(self._prs, 1, self.v - n)

    def qsuf(self, n):
        """Σ_{l ≥ n} q of the sorted row (n: positions, (B, m))."""
        return _torch().gather(self._qrs, 1, self.v - n)

    def qsuf_range(self, lo, hi):
        """Σ_{l ≥ j} q for the positions j = lo..hi−1 (a slice, no gather)."""
        return self._qrs[:, self.v - hi + 1 : self.v - lo + 1].flip(1)

    def count_below(self, mu):
        """n(μ) = #{r < μ} per row, μ of shape (B, m)."""
        return _torch().searchsorted(self.r, mu.contiguous(), side="left")

    def at(self, prefix, idx):
        return _torch().gather(prefix, 1, idx)

    def h(self, mu, n=None):
        """h(μ) = Σ (p − μ q)_+ (≥ 0), μ of shape (B, m)."""
        n = self.count_below(mu) if n is None else n
        return (self.psuf(n) - mu * self.qsuf(n)).clamp_min(0.0)

    def min_sum(self, c):
        """Σ min(p, c q) per row, c of shape (B, m) (c may be +inf: then Σ over q > 0 of p)."""
        n = self.count_below(c)
        return self.at(self.pc, n) + _scaled(c, self.qsuf(n))

    def prefix_limit(self, bound):
        """Smallest column count covering every prefix with ratio ≤ bound (B,) in every row."""
        return int(self.count_below(bound.reshape(-1, 1) * (1 + 1e-12)).max()) + 1

    def unsort(self, sorted_mask):
        """A boolean (B, V) mask given in sorted order, back in token order."""
        return _torch().zeros_like(sorted_mask).scatter_(1, self.order, sorted_mask)


def _scaled(c, x):
    """c·x for x ≥ 0, with 0 where x = 0 (c may overflow to +inf: a q-mass off G below 1/DBL_MAX)."""
    return _torch().where(x > 0, c * x, _torch().zeros_like(x))


def power(x, k: int):
    """x**k for an integer k ≥ 1 by repeated squaring (torch's pow is several times slower than a
    multiplication on the CPU for k ≥ 4; the results differ by rounding only)."""
    out, base = None, x
    while True:
        if k & 1:
            out = base if out is None else out * base
        k >>= 1
        if not k:
            return out
        base = base * base


# ---------------------------------------------------------------------------------------------
# α* per draft law: the kernels each DraftLaw's ``optimal_acceptance`` refers to
# (:mod:`otbound.token.draft_laws`), ``(α* (B,), binding sets (B, V) bool or None)`` for a checked K


def _top_law_rows(P, Q, k: int, sampling: str):
    """α* of the greedy or deterministic law for rows not sorted by ratio (numpy (B, V) each, a
    single call's rows), row by row in numpy: G by :func:`top_tokens`, then α*_det = p(G) (G the K
    largest q) or α*_greedy = p(G) + Σ_{x∉G} min(p, q') with G the K − 1 largest q and
    q' = q / q(V∖G) off G. On long rows (V > ``_SHORT_TOP``) q(V∖G) is 1 − q(G) where q(G) ≤ 1/2
    (a row sums to 1 within a few ulps: relative error ≤ 1e-15), else and on short rows it is
    summed directly (no cancellation where q(G) is near 1): for the greedy law three passes over a
    long row (q/q(V∖G), the minimum with p, its sum). The values of :func:`_greedy` and
    :func:`_deterministic` to float64 rounding (their batched torch form; ≤ 1e-15 measured)."""
    out = np.empty(P.shape[0])  # (B,)
    long_rows = P.shape[1] > _SHORT_TOP  # short rows: q(V∖G) summed directly (fewer numpy calls)
    buf = np.empty(P.shape[1]) if long_rows and sampling != "deterministic" else None  # (V,) q', then min(p, q')
    for i in range(P.shape[0]):
        p, q = P[i], Q[i]
        if sampling == "deterministic":
            out[i] = p[top_tokens(q, k)].sum()
            continue
        g = top_tokens(q, k - 1)  # (K − 1,)
        in_g = float(q[g].sum()) if long_rows else 1.0
        if in_g <= 0.5:  # q(V∖G) = 1 − q(G): no copy of q
            rest = np.divide(q, 1.0 - in_g, out=buf)  # (V,) q'
            rest[g] = 0.0
        else:  # q(V∖G) summed directly; G zeroed before the division (q/q(V∖G) may overflow there)
            rest = q.copy()  # (V,) q off G, then q'
            rest[g] = 0.0
            rest /= rest.sum()
        out[i] = p[g].sum() + np.minimum(p, rest, out=rest).sum()
    return np.minimum(np.maximum(out, 0.0, out=out), 1.0, out=out)


def top_law_as_given(p, q, num_drafts, sampling: str):
    """α* of the greedy or deterministic law (``sampling``) for numpy laws as the caller gave them
    (a single call without binding sets, V > ``_SHORT_TOP``), checked on its way: the formulas of
    :func:`_top_law_rows` with q as :class:`LawBatch` holds it (renormalised only where it does not
    sum to exactly 1, so G is the same) and p renormalised through its sum s_p instead of a copy:

    * greedy: ``α*_greedy = [p(G) + Σ_{x∉G} min(p, s_p q')] / s_p``, the two minimum checks
      (p ≥ 0, q ≥ 0) read off ``min_x min(p, s_p q')`` (≥ 0 only where both are: q' ≥ 0 off G, and
      q < 0 on G would make every q off G negative), K within the support of q from q(V∖G) > 0
      (G holds every positive q where K exceeds it): seven passes over a row instead of eight;
    * deterministic: ``α*_det = p(G) / s_p``, the minima of p and q one pass each, the support of q
      counted only where q holds a zero: five passes, as LawBatch's, without its copies.

    A float for 1-D laws, an array over the batch shape otherwise; None where the laws or
    ``num_drafts`` need :class:`LawBatch` (:func:`_rows_as_given`, a failed check).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.token._kernel import top_law_as_given
    >>> q = np.r_[0.5, np.full(512, 1 / 1024)]  # G = {0} at K = 2, q' = 1/512 off G
    >>> p = np.r_[0.125, np.full(256, 1.25 / 512), np.full(256, 0.5 / 512)]
    >>> top_law_as_given(p, q, 2, "greedy")  # p(G) + Σ min(p, q') off G = 0.125 + 256/512 + 256 · 0.5/512
    0.875
    >>> top_law_as_given(p, q, 2, "deterministic")  # p(G), G = {0, 1} (ties to the lower index): 0.125 + 1.25/512
    0.12744140625
    >>> top_law_as_given(p, q, 1000, "greedy") is None  # K beyond the support: the checked path refuses it
    True
    """
    rows = _rows_as_given(p, q, num_drafts, _SHORT_TOP)
    if rows is None:
        return None
    P, Q, k = rows
    if k > P.shape[1]:  # beyond the support: refused by the checked path
        return None
    greedy = sampling == "greedy"
    shape = p.shape[:-1]  # the batch shape
    out = np.empty(P.shape[0])  # (B,)
    buf = np.empty(P.shape[1]) if greedy else None  # (V,) s_p q', then min(p, s_p q')
    for i in range(P.shape[0]):
        p, q = P[i], Q[i]
        sp, sq = float(p.sum()), float(q.sum())  # the checked path's sums, bit for bit
        if not (abs(sp - 1.0) <= LAW_ATOL and abs(sq - 1.0) <= LAW_ATOL):  # NaN and inf fail here
            return None
        if sq != 1.0:  # q renormalised as LawBatch does (the same q / q.sum()): the same G
            q = q / sq
        if not greedy:
            q_min = float(q.min())
            if not (q_min >= 0.0 and p.min() >= 0.0):  # a negative entry: refused by the checked path
                return None
            if q_min == 0.0 and k > int(np.count_nonzero(q > 0)):  # K beyond the support of q
                return None
            value = float(p[top_tokens(q, k)].sum())
            out[i] = value / sp if sp != 1.0 else value
            continue
        g = top_tokens(q, k - 1)  # (K − 1,)
        in_g = float(q[g].sum())
        if in_g <= 0.5:
            off = 1.0 - in_g
            np.divide(q, off / sp if sp != 1.0 else off, out=buf)
            buf[g] = 0.0
        else:  # q(V∖G) summed directly; G zeroed before the division (q/q(V∖G) may overflow there)
            np.copyto(buf, q)
            buf[g] = 0.0
            off = float(buf.sum())
            if not off > 0.0:  # no q off G: K beyond the support (or a negative q), refused by the checked path
                return None
            np.divide(buf, off / sp if sp != 1.0 else off, out=buf)
        np.minimum(p, buf, out=buf)
        low = float(buf.min())
        if not low >= 0.0:  # a negative or NaN entry: refused by the checked path
            return None
        value = float(p[g].sum()) + float(buf.sum())
        out[i] = value / sp if sp != 1.0 else value
    np.minimum(np.maximum(out, 0.0, out=out), 1.0, out=out)
    return float(out[0]) if not shape else out.reshape(shape)


def _deterministic(batch, k, want_sets):
    """α*_det = p(G), G = top-K(q) (ties to the lower index, :func:`greedy_split_rows`), binding set
    H* = G where p(G) < 1 (docs/theory/token-bounds.md, the deterministic draft law)."""
    idx, pg = greedy_split_rows(batch, k)[:2]  # (B, K) each
    value = pg.sum(1).clamp(0.0, 1.0)  # (B,)
    if not want_sets:
        return value, None
    g = _torch().zeros_like(batch.p, dtype=_torch().bool).scatter_(1, idx, True)  # (B, V)
    return value, g & (value < 1.0).reshape(-1, 1)


def _prefix_minimum(srt, f, want_sets, first: int = 0):
    """``1 + min(0, min_j f[:, j])`` over prefix columns (column j: the first ``first + j`` tokens;
    the empty prefix, f = 0, is always a candidate) and the binding prefixes as a token mask."""
    best, j = f.min(1)
    return _prefix_result(srt, best, j + first, want_sets)


def _prefix_result(srt, best, count, want_sets):
    """``(1 + min(0, best)`` clamped to [0, 1], the first ``count`` sorted tokens as a token mask
    where ``best < 0`` or None), ``best`` and ``count`` (B,)."""
    torch = _torch()
    value = (1.0 + best.clamp(max=0.0)).clamp(0.0, 1.0)
    if not want_sets:
        return value, None
    cols = torch.arange(srt.v, device=best.device).reshape(1, -1)
    return value, srt.unsort((cols < count.reshape(-1, 1)) & (best < 0).reshape(-1, 1))


_BOUND_BLOCK = 64  # columns per block of the lower bounds of with-replacement α*


def _with_replacement(batch, k, want_sets):
    """``1 + min(0, min_j f_j)``, ``f_j = Pc[j] − Qc[j]^K``, over the m prefixes with ratio ≤ K,
    f evaluated only in the blocks of ``_BOUND_BLOCK`` columns that can hold its minimum.

    On a block of columns [a, e), ``Pc ≥ Pc[a]`` and ``Qc^K ≤ Qc[e − 1]^K``, in floating point too
    (sums of non-negative terms and products of non-negative factors round monotonically), so
    ``Pc[a] − Qc[e − 1]^K ≤ f`` there; a block whose bound exceeds the least ``f`` at the block
    starts cannot hold the minimum, nor its first column. The other blocks (on LM rows a few per
    cent) are evaluated on the CPU, every row's at once by one gather (:func:`_open_columns`); where
    they are many, and on an accelerator, every column is. The blocks' first and last columns of Pc
    and Qc come from contiguous copies shared by every K (:func:`_block_columns`)."""
    torch = _torch()
    dev = batch.p.device
    if dev.type == "cpu" and not want_sets and "sorted" not in batch.__dict__:
        return torch.from_numpy(_with_replacement_buckets(*batch.numpy_rows(), k)), None
    srt = batch.sorted
    m = srt.prefix_limit(torch.full((batch.rows,), float(k), dtype=torch.float64, device=dev))
    m = min(m, srt.pc.shape[1])
    pc, qc = srt.pc[:, :m], srt.qc[:, :m]  # (B, m) views; column 0 is the empty set: f = 0
    width = _BOUND_BLOCK
    if dev.type != "cpu" or m <= 4 * width:
        return _prefix_minimum(srt, torch.sub(pc, power(qc, k)), want_sets)
    p_cols, q_cols, q_lasts = _block_columns(batch, width)
    nb = -(-m // width)  # the blocks of the m columns
    p_start, q_start = p_cols[:, :nb], q_cols[:, :nb]  # (B, nb) each: Pc, Qc at the blocks' first columns
    q_end = q_lasts[:, : m // width]  # (B, nb or nb − 1): Qc at the full blocks' last columns
    if q_end.shape[1] < nb:  # a last, partial block ends at column m − 1
        q_end = torch.cat([q_end, qc[:, m - 1 :]], 1)
    upper = (p_start - power(q_start, k)).amin(1, keepdim=True)  # (B, 1): f at block starts
    open_ = (p_start - power(q_end, k)) <= upper  # (B, nb): blocks that may hold the minimum
    if 4 * int(open_.sum()) > open_.numel():
        return _prefix_minimum(srt, torch.sub(pc, power(qc, k)), want_sets)
    cols = _open_columns(open_, width, m)  # (B, c·width)
    f = torch.sub(pc.gather(1, cols), power(qc.gather(1, cols), k))  # (B, c·width)
    best, at = f.min(1)  # the first least f: at its first column
    return _prefix_result(srt, best, cols.gather(1, at[:, None])[:, 0], want_sets)


_KINK_MARGIN = 1e-13  # a bucket is opened where its bound is below the best f found plus this (rounding)
_STATIONARY_SLACK = 1.0 + 1e-12  # the stationarity test is a filter: borderline buckets are kept


def _with_replacement_buckets(P, Q, k: int, as_given: bool = False):
    """With-replacement α* of rows not sorted by ratio (numpy (B, V) each; a single call's rows): the
    bound of :func:`_with_replacement` on ratio buckets instead of column blocks, so that only the
    tokens of the buckets that can hold the minimum are sorted.

    The tokens are bucketed by the bits of p/q (32 buckets per octave; those of ratio above the
    bucket of K, and q = 0, never read: :func:`_ratio_ids`); a bucket's p and
    q masses give f = Pc − Qc^K exactly at every bucket end, prefixes of the ratio order. Inside a
    bucket of ratios [r_lo, r_hi) and masses (p_b, q_b) after (P0, Q0), a prefix adding q-mass x adds
    p-mass ≥ max(r_lo x, p_b − r_hi (q_b − x)), so f ≥ P0 + r_lo x* − (Q0 + x*)^K at the kink
    x* = (r_hi q_b − p_b)/(r_hi − r_lo) (concave on each side of it; the ends are bucket-end values).
    Only the buckets whose bound is below the least bucket-end f (plus ``_KINK_MARGIN``) and that can
    hold the end of a minimiser H* (stationarity: ``K Q0^(K−1) ≤ r_hi`` and
    ``r_lo ≤ K (Q0 + q_b)^(K−1)``, since p/q ≤ K q(H*)^(K−1) on H* and ≥ off it) are sorted token by
    token: on LM-like rows a few hundred tokens of V = 151,936. The same α* as the sorted
    rows' to float64 summation (the prefix sums are summed by bucket here: ≤ 1e-14 measured).

    ``as_given``: the rows are the caller's laws as given, checked here instead of by
    :class:`LawBatch` (:func:`with_replacement_as_given`): each row's smallest q (≥ 0) in one pass
    after its bucket sums (q is then in cache), its p and q sums read off its bucket sums (no pass
    of their own), the renormalisation applied to the bucket sums and the ratio bounds (a ratio of
    the renormalised laws is p/q · s_q/s_p) instead of to the rows; None where a row fails or nears
    a check (the caller then takes the checked path, whose messages apply). Its values are those of
    the renormalised rows to float64 summation (≤ 1e-14 from an extended-precision reference on the
    benchmark's rows)."""
    if not as_given and P.shape[1] <= _SMALL_ROW:
        return _with_replacement_small(P, Q, k)
    out = np.ones(P.shape[0])  # (B,)
    scratch = np.empty(P.shape[1])  # (V,) the ratios, then the bucket ids, of each row in turn
    for i in range(P.shape[0]):
        value = _with_replacement_row(P[i], Q[i], k, scratch, as_given)
        if value is None:
            return None
        out[i] = value
    return np.minimum(np.maximum(out, 0.0, out=out), 1.0, out=out)


_FLOORS = _search._bucket_floor(np.arange(_search._INF_ID + 2))  # (ids,) the least ratio of each bucket id
_SHORT_IDS = 1 << 15  # rows shorter than this count their buckets from their least id (about the ids of ratio 2)
_SUM_ATOL = LAW_ATOL - 1e-9  # rows checked on their bucket sums: the ones this near the tolerance take the full check
_WIDEN = 2.0**-45  # relative widening of the ratio bounds of rows renormalised through their bucket sums


def _with_replacement_row(p, q, k: int, scratch, as_given: bool):
    """1 + min over bucket ends and opened buckets of f (:func:`_with_replacement_buckets`) for one
    row, or None where a row ``as_given`` fails or nears a check."""
    sp = sq = 1.0  # the laws' sums: 1 for checked rows (renormalised already)
    b = _ratio_ids(p, q, scratch)  # (V,) bucket ids, those above K's never read
    lo = int(b.min()) if b.size < _SHORT_IDS else 0  # a short row: ids from 0, tables over its own buckets
    if lo:
        b -= lo
    bp, bq = _bucket_masses(b, p, q)  # (max id − lo + 1,) each
    p_checked = not as_given
    if as_given:  # checked after the sums (read while q is in cache; nothing is used before)
        q_min = float(q.min())  # NaN where the row holds one
        if not q_min >= 0.0:
            return None
        if q_min == 0.0:  # q = −0.0 passes q ≥ 0, and p < 0 over it gives +inf: p checked
            if not p.min() >= 0.0:
                return None
            p_checked = True
    if bq.size > _NEG_ZERO_ID - lo:  # a ratio with its sign bit: a p < 0 (refused), −0.0 or 0/0
        if not (p_checked or p.min() >= 0.0):
            return None
        if bq[_NEG_ZERO_ID - lo] > 0:  # a p = −0 where q > 0: ratio 0, the lowest bucket; ids with the sign masked
            b, _ = _search._ratio_buckets(p, q, math.inf, out=scratch)
            lo = int(b.min()) if b.size < _SHORT_IDS else 0
            if lo:
                b -= lo
            bp, bq = _bucket_masses(b, p, q)
    if as_given:  # the sums of the laws as given, from their bucket sums
        sp, sq = float(bp.sum()), float(bq.sum())  # NaN or inf where a row holds one
        if not (abs(sp - 1.0) <= _SUM_ATOL and abs(sq - 1.0) <= _SUM_ATOL):
            return None
    scaled = sp != 1.0 or sq != 1.0
    limit = k * (sp / sq) * (1.0 + _WIDEN) if scaled else float(k)  # the raw ratio of a renormalised K
    top = min((int(np.float64(limit).view(np.uint64)) >> _search._SHIFT) + 1, _search._INF_ID) - lo
    ids = (bq[: max(top, 0)] > 0).nonzero()[0]  # (nb,) the buckets below K's holding q-mass, by increasing ratio
    if ids.size == 0:
        return 1.0
    size = bq.size  # every id of b is below it
    bp, bq = bp[ids], bq[ids]  # (nb,) each
    r_lo, r_hi = _FLOORS[ids + lo], _FLOORS[ids + (lo + 1)]  # (nb,) each
    if scaled:  # the renormalised laws' bucket masses and ratio bounds (widened over rounding)
        bp, bq = bp / sp, bq / sq
        r_lo, r_hi = r_lo * ((sq / sp) * (1.0 - _WIDEN)), r_hi * ((sq / sp) * (1.0 + _WIDEN))
    cp, cq = bp.cumsum(), bq.cumsum()  # (nb,) each: Pc, Qc at the bucket ends
    best = min(0.0, float((cp - power(cq, k)).min()))
    p0, q0 = cp - bp, cq - bq  # (nb,) each: at the bucket starts
    kink = np.minimum(np.maximum((r_hi * bq - bp) / (r_hi - r_lo), 0.0), bq)  # (nb,) in [0, q_b]
    low = p0 + r_lo * kink - power(q0 + kink, k) < best + _KINK_MARGIN  # (nb,)
    # a minimiser H* ending inside bucket b has r ≤ K q(H*)^(K−1) on H* and ≥ off it (the prefix
    # theorem's stationarity), with Q0 ≤ q(H*) ≤ Q0 + q_b: only such buckets can hold its end
    if k > 1:
        low &= (k / _STATIONARY_SLACK) * power(q0, k - 1) <= r_hi  # borderline buckets kept
        low &= r_lo <= (k * _STATIONARY_SLACK) * power(cq, k - 1)
    else:
        low &= (r_lo <= _STATIONARY_SLACK) & (r_hi * _STATIONARY_SLACK >= 1.0)
    cand = low.nonzero()[0]
    if cand.size:
        toks = _search._bucket_tokens(b, ids[cand], p, q, size)  # (t,) by ratio, ties by index
        pos = np.searchsorted(ids, b[toks])  # (t,) each token's bucket (non-decreasing)
        first = np.searchsorted(pos, pos, side="left")  # (t,) the first token of its bucket
        pt, qt = p[toks], q[toks]  # (t,) each
        if scaled:
            pt, qt = pt / sp, qt / sq
        cps, cqs = np.cumsum(pt), np.cumsum(qt)  # (t,) each
        base_p = np.where(first > 0, cps[first - 1], 0.0)
        base_q = np.where(first > 0, cqs[first - 1], 0.0)
        f = (p0[pos] + (cps - base_p)) - power(q0[pos] + (cqs - base_q), k)  # (t,)
        best = min(best, float(f.min()))
    return 1.0 + best


def _bucket_masses(b, p, q):
    """The p and q masses of the bucket ids ``b`` (V,) int64, ≥ 0, ``np.bincount``'s sums bit for
    bit: on rows of ``_wor._SCATTER_MIN`` tokens or more by :class:`otbound.token._wor.KeySums`
    (torch's scatter into a table sized by one vectorised maximum, instead of bincount's scalar pass
    for the ids' range); below, by ``np.bincount`` itself (no table to size, fill and copy)."""
    if b.size < _wor._SCATTER_MIN:
        return np.bincount(b, weights=p), np.bincount(b, weights=q)
    sums = _wor.KeySums(b, int(b.max()))
    return sums(p), sums(q)


def _rows_as_given(p, q, num_drafts, shortest: int):
    """``(P, Q, K)``: numpy laws as the caller gave them as (B, V) views and K checked, for a law's
    path that checks the laws on its way (:meth:`otbound.token.DraftLaw.single_call`); None for
    anything else (another type, dtype or layout, rows of at most ``shortest`` tokens, a bad K: the
    checked path then answers, with its messages in its order)."""
    if type(p) is not np.ndarray or not p.shape or p.shape[-1] <= shortest:  # short rows first: the cheapest test
        return None
    if not (type(q) is np.ndarray and p.dtype == np.float64 and q.dtype == np.float64 and p.shape == q.shape
            and p.size and p.flags.c_contiguous and q.flags.c_contiguous):
        return None
    try:
        k = check_num_drafts(num_drafts)
    except InvalidInputError:
        return None
    v = p.shape[-1]
    return p.reshape(-1, v), q.reshape(-1, v), k


def with_replacement_as_given(p, q, num_drafts):
    """With-replacement α* of numpy laws as the caller gave them (a single call without binding
    sets, V > ``_AS_GIVEN_ROW``), checked on the way (:func:`_with_replacement_buckets`, ``as_given``):
    one pass for the smallest q of each row, the sums from the bucket sums, p ≥ 0 from the sign bits
    of the ratios (read by a pass only where q holds a zero or a ratio has its sign bit); a float
    for 1-D laws, an array over the batch shape otherwise. None where the laws or ``num_drafts``
    need :class:`LawBatch` (another type, dtype or layout, short rows, a failed or borderline check):
    the checked path then gives the value or the error.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.token._kernel import with_replacement_as_given
    >>> p, q = np.full(2048, 1 / 2048), np.r_[np.full(1024, 1.5 / 2048), np.full(1024, 0.5 / 2048)]
    >>> with_replacement_as_given(p, q, 2)  # 1 + p(H) − q(H)² on H, the first 1024 tokens: 1 + 0.5 − 0.75²
    0.9375
    >>> with_replacement_as_given(p, -q, 2) is None  # refused by the checked path, with its message
    True
    """
    rows = _rows_as_given(p, q, num_drafts, _AS_GIVEN_ROW)
    if rows is None:
        return None
    P, Q, k = rows
    values = _with_replacement_buckets(P, Q, k, as_given=True)
    if values is None:
        return None
    return float(values[0]) if p.ndim == 1 else values.reshape(p.shape[:-1])


_NEG_ZERO_ID = int(np.float64(-0.0).view(np.uint64)) >> _search._SHIFT  # the id of a ratio −0 (sign bit kept)


def _ratio_ids(p, q, out):
    """The bucket ids of :func:`otbound.token._search._ratio_buckets` (the ratio's exponent and top
    5 mantissa bits: 32 buckets per octave) for one checked row, in two passes (the division and a
    shift in place in ``out``, a float64 scratch row), not clamped: every finite ratio ≥ +0 has its
    bucket, those above K (and q = 0: inf, or 0/0: a NaN, whose sign bit the division may set) land
    above the cut and are never read; a ratio −0 (a p = −0.0 where q > 0) has id ``_NEG_ZERO_ID``.
    Leaving the ids above K apart instead of merging them into one bucket also spares
    ``np.bincount`` a chain of additions into one bin (on rows of tied ratios: 0.6 against 1.0
    ``np.sort``)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        bits = np.divide(p, q, out=out).view(np.uint64)
    np.right_shift(bits, _search._SHIFT, out=bits)
    return bits.view(np.int64)


_SMALL_ROW = 1023  # checked rows this short are sorted whole (fewer numpy calls than the buckets' bound)
_AS_GIVEN_ROW = 511  # laws as given longer than this: the buckets checked on their way (faster than LawBatch's sort)


def _with_replacement_small(P, Q, k: int):
    """:func:`_with_replacement_buckets` for short checked rows (V ≤ ``_SMALL_ROW``, where the
    per-call overhead of the buckets and of LawBatch's checks exceeds a sort; numpy laws as given
    of V > ``_AS_GIVEN_ROW`` take the buckets, their checks fused): each row sorted by (ratio,
    index) (q = 0 last), f = Pc − Qc^K over the prefixes of ratio below K (1 + 1e-12), as
    :meth:`SortedRows.prefix_limit` takes them; the prefix sums sequential, as
    :meth:`SortedRows._prefix` sums rows of fewer than 1,024 columns: the sorted kernel's values,
    bit for bit."""
    out = np.ones(P.shape[0])  # (B,)
    for i in range(P.shape[0]):
        p, q = P[i], Q[i]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # an overflowing ratio: inf, past K
            r = np.divide(p, q)  # (V,)
        r[q == 0] = np.inf  # 0/0 and x/0 last
        order = np.argsort(r, kind="stable")  # (V,) by ratio, ties by index (−0 and +0 equal)
        m = int(np.searchsorted(r[order], k * (1.0 + 1e-12), side="left"))  # the prefixes' length bound
        if m:
            sel = order[:m]
            out[i] = 1.0 + min(0.0, float((np.cumsum(p[sel]) - power(np.cumsum(q[sel]), k)).min()))
    return np.minimum(np.maximum(out, 0.0, out=out), 1.0, out=out)


def _block_columns(batch, width: int):
    """``(Pc[:, ::width], Qc[:, ::width], Qc[:, width − 1 :: width])`` of the batch's sorted rows as
    contiguous (B, ·) copies, cached per batch: the with-replacement bounds of every K slice them
    (read in place, the strided columns of the (B, V + 1) sums cost a cache line per entry, at each K)."""
    srt = batch.sorted
    return batch.memo(("block_columns", width), lambda: (
        srt.pc[:, ::width].contiguous(), srt.qc[:, ::width].contiguous(), srt.qc[:, width - 1 :: width].contiguous()))


def _open_columns(open_, width: int, m: int):
    """The columns of every row's open blocks at once, (B, c·width) int64 (c the most open blocks of
    a row), from ``open_`` (B, nb) bool (every row has one: the block whose start has the row's least
    f at the block starts): per row its open blocks' columns in increasing order, then its first open
    block's columns repeated to fill the row (a column past ``m − 1`` of a last, partial block
    replaced by the row's first open column).
    A duplicate repeats a value of f that occurs earlier in the row, so the first least f of a row and
    its column are those of its open columns alone (the columns a row-by-row evaluation takes)."""
    torch = _torch()
    rows = open_.shape[0]
    per_row = open_.sum(1)  # (B,) open blocks per row
    row_of, block = torch.nonzero(open_, as_tuple=True)  # (t,) each: by row, then by block
    first = torch.cumsum(per_row, 0) - per_row  # (B,) each row's first entry in ``block``
    blocks = block[first].reshape(-1, 1).repeat(1, int(per_row.max()))  # (B, c) the row's first open block
    blocks[row_of, torch.arange(block.numel(), device=block.device) - first[row_of]] = block
    cols = (blocks[:, :, None] * width + torch.arange(width, device=block.device)).reshape(rows, -1)  # (B, c·width)
    return torch.where(cols < m, cols, blocks[:, :1] * width)


def _without_replacement(batch, k, want_sets):
    """K = 2 closed form on the sorted prefixes; K ≥ 3 the branch and bound of
    :mod:`otbound.token._search` (on the CPU, rows in lockstep; on the rows as sorted here for values, on the
    rows as given for binding sets). On the CPU, rows the batch has not sorted (a single call) take
    the search on the rows as given at every K (a bucketing pass per row instead of a sort). Rows
    with a positive q below ``_wor.CLOCK_FLOOR`` go through
    the search, whose :func:`otbound.token._wor.clock_law` drops or refuses such tokens."""
    torch = _torch()
    if not want_sets and not on_accelerator(batch.p) and "sorted" not in batch.__dict__:
        # rows not sorted (a single call): the search on the rows as given, bucketing each row once
        # (cheaper than sorting it whole); the same values as on sorted rows to rounding
        tiny = batch.q_min.numpy() < _wor.CLOCK_FLOOR  # (B,): rows clock_law must scan (a zero q included)
        vals = _search.without_replacement(*batch.numpy_rows(), k, False, tiny=tiny)[0]
        return torch.from_numpy(np.clip(vals, 0.0, 1.0)), None
    tiny = batch.memo("tiny_q", lambda: _tiny_q_rows(batch))  # (B,), every K
    if k >= 3 or bool(tiny.any()):
        if want_sets:
            P, Q = batch.numpy_rows()
            vals, sets = _search.without_replacement(P, Q, k, True)
            return (torch.as_tensor(np.clip(vals, 0.0, 1.0), device=batch.p.device),
                    torch.as_tensor(sets, device=batch.p.device))
        srt = batch.sorted
        rows = batch.memo("sorted_numpy", lambda: (srt.ps.cpu().numpy(), srt.qs.cpu().numpy()))
        if k >= 3:
            runs = batch.memo("sorted_runs", lambda: _search.sorted_runs(*rows, tiny.cpu().numpy()))  # every K
            vals = _search.without_replacement_ratio_sorted(*rows, k, runs)
            return torch.as_tensor(vals, dtype=torch.float64, device=batch.p.device), None
        vals = _pair_closed_form(batch, want_sets)[0]
        for i in torch.nonzero(tiny).flatten().tolist():
            vals[i] = float(np.clip(_search.without_replacement(rows[0][i : i + 1], rows[1][i : i + 1], 2,
                                                                False)[0][0], 0.0, 1.0))
        return vals, None
    return _pair_closed_form(batch, want_sets)


def _tiny_q_rows(batch):
    """Whether each row holds a q with ``0 < q < _wor.CLOCK_FLOOR``, (B,) bool: only the rows whose
    smallest q (:attr:`LawBatch.q_min`) lies below the floor can, and only those are scanned."""
    torch = _torch()
    low = batch.q_min < _wor.CLOCK_FLOOR  # (B,)
    tiny = torch.zeros_like(low)
    if bool(low.any()):
        q = batch.q[low]  # (b, V): the few rows holding a zero or a tiny q
        tiny[low] = ((q > 0) & (q < _wor.CLOCK_FLOOR)).any(1)
    return tiny


def _pair_closed_form(batch, want_sets):
    """K = 2: ``f_j = Pc[j] − (Qc[j] − Qs[j] Σ_{i<j} q_i/(1 − q_i))`` over the prefixes with ratio
    ≤ 2/(1 − max q) (beyond, adding a token raises f), the odds summed over every column and f
    evaluated only in the blocks of ``_BOUND_BLOCK`` prefixes that can hold its minimum.

    On a block of prefixes [a, e) the mass ``Qc[j] − Qs[j] odds_j`` is at most
    ``Qc[e − 1] − Qs[e − 1] odds_a`` (Qc and the odds grow, Qs shrinks, all rounding
    monotonically), so ``Pc[a]`` minus that bounds f there from below; a block whose bound, less a
    margin of 1e-12 for the rounding of a fused multiply-add, exceeds the least f at the block
    starts cannot hold the minimum. A draft token of q > 1/2 has its 1 − q as the other tokens'
    mass summed directly. On an accelerator every prefix is evaluated, and in a row where many
    blocks stay open, every prefix of the row."""
    torch = _torch()
    srt = batch.sorted
    top = greedy_split_rows(batch, 1)[2][:, 0]  # the largest q per row
    m = min(srt.prefix_limit(2.0 / (1.0 - top).clamp_min(1e-300)), srt.pc.shape[1])
    if m <= 1:
        return _prefix_minimum(srt, torch.zeros_like(srt.pc[:, :1]), want_sets)
    qs = srt.qs[:, : m - 1]  # (B, m − 1): column c is the prefix of c + 1 tokens
    width = _BOUND_BLOCK
    if on_accelerator(srt.r) or m <= 4 * width:
        suffix = srt.qsuf_range(1, m)  # Σ_{l ≥ j} q, j = 1..m−1 (a fresh array)
        rest = 1.0 - qs
        if bool((top > 0.5).any()):  # at most one token per row: 1 − q as the other tokens' mass summed directly
            rest = torch.where(qs > 0.5, srt.qc[:, : m - 1] + suffix, rest)
        odds = torch.cumsum(torch.div(qs, rest, out=rest), 1)  # (B, m − 1): Σ_{i ≤ c} q_i/(1 − q_i)
        mass = torch.addcmul(srt.qc[:, 1:m], suffix, odds, value=-1.0, out=odds).clamp_(0.0, 1.0)
        return _prefix_minimum(srt, torch.sub(srt.pc[:, 1:m], mass, out=mass), want_sets, first=1)
    n = m - 1
    starts = torch.arange(0, n, width)  # (nb,) first columns of the blocks
    ends = (starts + width).clamp_(max=n) - 1  # (nb,) last columns
    offsets = torch.arange(width)  # (width,)
    best = torch.empty(batch.rows, dtype=torch.float64)  # (B,)
    count = torch.empty(batch.rows, dtype=torch.int64)  # (B,)
    big_rows = set(torch.nonzero(top > 0.5).flatten().tolist())  # rows holding a token of q > 1/2
    terms = torch.empty(n, dtype=torch.float64)  # (n,) a row's 1 − q, then q/(1 − q)
    od = torch.empty(n, dtype=torch.float64)  # (n,) a row's odds Σ_{i ≤ c} q_i/(1 − q_i)
    for i in range(batch.rows):  # one row at a time: 1-D index_select is fast, a column gather of (B, ·) is not
        pc, qc, qrs = srt.pc[i], srt.qc[i], srt._qrs[i]  # (V + 1,) each
        torch.neg(qs[i], out=terms).add_(1.0)  # −q + 1 = 1 − q, one rounding
        if i in big_rows:  # its one token of q > 1/2: the others' mass summed directly
            big = torch.nonzero(qs[i] > 0.5)[:, 0]
            terms[big] = qc[big] + qrs[srt.v - 1 - big]
        torch.cumsum(torch.div(qs[i], terms, out=terms), 0, out=od)
        f_at = functools.partial(_pair_f, srt.v, pc, qc, qrs, od)
        p_start, od_start = pc[1 : n + 1 : width], od[::width]  # (nb,) strided views at the block starts
        upper = f_at(starts).min()  # f at the block starts
        mass_hi = torch.addcmul(qc.index_select(0, ends + 1), qrs.index_select(0, srt.v - 1 - ends),
                                od_start, value=-1.0).clamp_(0.0, 1.0)  # (nb,)
        open_ = (p_start - mass_hi) - 1e-12 <= upper  # (nb,) blocks that may hold the minimum
        if 4 * int(open_.sum()) > open_.numel():
            cols = torch.arange(n)
        else:
            cols = (torch.nonzero(open_)[:, 0, None] * width + offsets).flatten()  # increasing columns
            cols = cols[cols < n]
        best[i], at = f_at(cols).min(0)
        count[i] = cols[at] + 1
    return _prefix_result(srt, best, count, want_sets)


def _pair_f(v, pc, qc, qrs, odds, cols):
    """f of :func:`_pair_closed_form` at prefix columns ``cols`` of one row (its Pc, Qc, reversed
    suffix sums and odds), as the full evaluation computes it."""
    torch = _torch()
    mass = torch.addcmul(qc.index_select(0, cols + 1), qrs.index_select(0, v - 1 - cols), odds.index_select(0, cols),
                         value=-1.0).clamp_(0.0, 1.0)
    return torch.sub(pc.index_select(0, cols + 1), mass)


_SHORT_TOP = 256  # rows this short take their top q from one stable argsort (a partition beyond: V = 1,000 1.3x faster)
_TOP_ROWS = 64  # rows of the (_TOP_ROWS, V // _TOP_ROWS) view whose column maxima bound the top q (long rows)
_TOP_CANDIDATES = 4096  # at most this many candidate tokens for the column maxima (more: a tied row, partitioned)


def top_tokens(q: np.ndarray, m: int) -> np.ndarray:
    """Indices of the m largest entries of a 1-D ``q`` by decreasing q, ties to the lower index (the
    first m of a stable sort of −q).

    On a long row (V ≥ ``_TOP_ROWS``² and m ≤ V / ``_TOP_ROWS``) the row's first ``_TOP_ROWS · n``
    entries are viewed as ``_TOP_ROWS`` rows of n and their column maxima taken (one pass, the
    row-wise ``np.maximum`` of contiguous rows); t, the m-th largest column maximum, is at most the
    m-th largest q (m columns each hold an entry ≥ t), so every token of the top m lies in a column
    whose maximum is ≥ t, or in the short tail past the view with q ≥ t. Those candidates (a few
    columns) are sorted by (−q, index). Elsewhere a partition: O(V + m log m) instead of a full sort.
    """
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    if m == 1:  # the largest, ties to the lower index: argmax, one pass
        return np.array([np.argmax(q)], dtype=np.int64)
    v = q.size
    if v <= _SHORT_TOP:  # a short row: the definition itself, one call (fewer than the partition's)
        return np.argsort(-q, kind="stable")[:m].astype(np.int64)
    n = v // _TOP_ROWS
    if n >= max(_TOP_ROWS, m):
        cols = q[: _TOP_ROWS * n].reshape(_TOP_ROWS, n).max(axis=0)  # (n,) column maxima
        t = np.partition(cols, n - m)[n - m]  # the m-th largest column maximum ≤ the m-th largest q
        keep = np.flatnonzero(cols >= t)  # (c,) the columns that can hold a token of the top m
        if keep.size * _TOP_ROWS <= _TOP_CANDIDATES:
            cand = (np.arange(0, _TOP_ROWS * n, n)[:, None] + keep).ravel()  # (64 c,) their tokens
            tail = _TOP_ROWS * n + np.flatnonzero(q[_TOP_ROWS * n :] >= t)  # (≤ V mod 64,)
            cand = np.concatenate([cand[q[cand] >= t], tail])
            return cand[np.lexsort((cand, -q[cand]))[:m]].astype(np.int64)
    part = np.argpartition(q, v - m)[v - m :]
    thr = q[part].min()
    if int(np.count_nonzero(q == thr)) != int(np.count_nonzero(q[part] == thr)):  # ties cut at the threshold
        above = np.flatnonzero(q > thr)
        part = np.concatenate([above, np.flatnonzero(q == thr)[: m - above.size]])
    return part[np.lexsort((part, -q[part]))].astype(np.int64)


def _top_at_edge(q_row, edge, m: int):
    """The m largest entries of a 1-D tensor ``q_row`` (by decreasing q, ties to the lower index,
    as :func:`top_tokens`) given ``edge``, the m-th largest value: the tokens of q ≥ edge (a few
    more than m where the edge is tied), sorted stably by decreasing q. One pass over the row."""
    torch = _torch()
    if not on_accelerator(q_row):
        qn = q_row.numpy()
        cand = np.flatnonzero(qn >= float(edge))  # (c,) increasing indices
        return torch.from_numpy(cand[np.argsort(-qn[cand], kind="stable")[:m]])
    cand = torch.nonzero(q_row >= edge)[:, 0]  # (c,) increasing indices
    return cand[torch.sort(q_row[cand], descending=True, stable=True).indices[:m]]


_TOP_Q = 8  # the largest q's selected at once per batch: every greedy (K − 1) and deterministic (K) split up to 8


def greedy_split_rows(batch: LawBatch, m: int):
    """``(idx, pg, qg, outside, rest)`` of the greedy law for up to m = K − 1 deterministic drafts,
    cached per batch: ``idx`` (B, m) the m largest q per row (ties to the lower index, as
    :func:`otbound.greedy_split`), ``pg``, ``qg`` their p and q, ``outside`` (B, 1) the q-mass off
    the m (summed directly where it may be tiny), ``rest[:, j]`` the q-mass off the top j.

    One selection of the ``max(m, _TOP_Q)`` largest q serves every smaller m (the greedy law at
    every K, the deterministic law's top K, the largest q): its first m columns are the top m, and
    the q-mass off them is ``rest[:, m]`` (a sum of positive terms)."""
    width = min(batch.vocab, max(m, _TOP_Q))

    def build():
        torch = _torch()
        p, q = batch.p, batch.q
        if not on_accelerator(q):  # a partition per row (torch.topk costs several times more on one core)
            idx = torch.from_numpy(np.stack([top_tokens(row, width) for row in q.numpy()])  # (B, width)
                                   if batch.rows else np.zeros((0, width), dtype=np.int64))
            return _split_from(p, q, idx)
        vals, idx = torch.topk(q, min(width + 1, batch.vocab), dim=1)  # (B, width + 1) each
        # a tie cut at the edge of the top width (the next value equals the edge): the lowest indices
        # among the tied values, from the row; ties inside it only: the lower index first
        cut = vals[:, width] == vals[:, width - 1] if width < batch.vocab else torch.zeros_like(vals[:, 0]).bool()
        vals, idx = vals[:, :width], idx[:, :width].contiguous()  # (B, width) each
        inner = (vals[:, 1:] == vals[:, :-1]).any(1)
        for row in torch.nonzero(cut | inner).flatten().tolist():
            if bool(cut[row]):
                idx[row] = _top_at_edge(q[row], vals[row, width - 1], width)
            else:
                v_row, i_row = vals[row].cpu().numpy(), idx[row].cpu().numpy()
                idx[row] = torch.as_tensor(i_row[np.lexsort((i_row, -v_row))], device=q.device)
        return _split_from(p, q, idx)

    idx, pg, qg, outside, rest = batch.memo(("greedy_split", width), build)
    if m == width:
        return idx, pg, qg, outside, rest
    return idx[:, :m], pg[:, :m], qg[:, :m], rest[:, m : m + 1], rest[:, :m]


def _split_from(p, q, idx):
    """``(idx, pg, qg, outside, rest)`` of :func:`greedy_split_rows` from the selected tokens ``idx``
    (B, width)."""
    torch = _torch()
    pg, qg = torch.gather(p, 1, idx), torch.gather(q, 1, idx)  # (B, width) each
    in_g = qg.sum(1, keepdim=True)  # (B, 1)
    outside = q.sum(1, keepdim=True) - in_g  # (B, 1)
    for row in torch.nonzero(in_g[:, 0] > 0.5).flatten().tolist():  # one row at a time: no (·, V) gather
        outside[row] = q[row].scatter(0, idx[row], 0.0).sum()
    rest = outside + torch.flip(torch.cumsum(torch.flip(qg, [1]), 1), [1])  # (B, width)
    return idx, pg, qg, outside, rest


def _min_sum(batch, c):
    """Σ min(p, c q) per row, c of shape (B, 1): from the sorted rows' prefix sums when the batch has
    sorted them already (a measurement of many quantities), else one pass over the rows (a single
    greedy α* needs no sort)."""
    if "sorted" in batch.__dict__:
        return batch.sorted.min_sum(c)[:, 0]
    torch = _torch()
    p, q = batch.p, batch.q  # (B, V) each
    if on_accelerator(p):
        return torch.minimum(p, _scaled(c, q)).sum(1)  # (B,)
    # on the CPU a row at a time: one (V,) buffer stays in cache (a (B, V) product is a fresh mapping)
    out = torch.empty(batch.rows, dtype=torch.float64)  # (B,)
    buf = torch.empty(batch.vocab, dtype=torch.float64)  # (V,)
    for i, ci in enumerate(c[:, 0].tolist()):
        if math.isfinite(ci):
            torch.minimum(p[i], torch.mul(q[i], ci, out=buf), out=buf)  # c q = 0 where q = 0
        else:  # min(p, c q) = p where q > 0
            torch.where(q[i] > 0, p[i], p.new_zeros(()), out=buf)
        out[i] = buf.sum()
    return out


def _greedy(batch, k, want_sets):
    """α*_greedy (module docstring); H* = G ∪ {x ∉ G: p(x) < q'(x)} where α* < 1."""
    torch = _torch()
    if k == 1:
        c = torch.ones(batch.rows, 1, dtype=torch.float64, device=batch.p.device)
        value = _min_sum(batch, c).clamp(0.0, 1.0)
        return value, ((batch.p < batch.q) & (value < 1.0).reshape(-1, 1)) if want_sets else None
    idx, pg, qg, outside, rest = greedy_split_rows(batch, k - 1)
    c = 1.0 / rest[:, k - 1 : k] if k - 1 < idx.shape[1] else 1.0 / outside
    g_p, g_q = pg[:, : k - 1], qg[:, : k - 1]
    value = (g_p.sum(1) + _min_sum(batch, c) - torch.minimum(g_p, _scaled(c, g_q)).sum(1)).clamp(0.0, 1.0)
    # a mass q(V∖G) so small (denormal) that 1/q(V∖G) overflows or nearly: q' by direct division there
    for i in torch.nonzero(~torch.isfinite(c[:, 0]) | (c[:, 0] > 1e290)).flatten().tolist():
        qp = batch.q[i].scatter(0, idx[i, : k - 1], 0.0)
        qp = qp / qp.sum()
        value[i] = (g_p[i].sum() + torch.minimum(batch.p[i], qp).sum()).clamp(0.0, 1.0)
        c[i] = math.inf  # marks the row for the binding set below
    if not want_sets:
        return value, None
    in_g = torch.zeros_like(batch.p, dtype=torch.bool).scatter_(1, idx[:, : k - 1], True)
    scaled = _scaled(c, batch.q)
    for i in torch.nonzero(~torch.isfinite(c[:, 0])).flatten().tolist():
        qp = batch.q[i].scatter(0, idx[i, : k - 1], 0.0)
        scaled[i] = qp / qp.sum()
    sets = (in_g | (batch.p < scaled)) & (value < 1.0).reshape(-1, 1)
    return value, sets
