"""Q(H) for drafts drawn without replacement, by exponential clocks (docs/theory/token-bounds.md, derived).

Give token i a clock T_i ~ Exp(q_i); the order in which the clocks ring is a sequential draw without
replacement from q. The first K drafts all lie in H iff the K-th ring inside H comes before the
first ring outside H, whose time is Exp(1 − s), s = q(H). Hence

    Q(H) = ∫_0^∞ (1 − s) e^{−(1−s) t} P[N_H(t) ≥ K] dt,   N_H(t) = Σ_{i∈H} Bernoulli(1 − e^{−q_i t}),

with Q(H) = 1[#{i ∈ H : q_i > 0} ≥ K] when H holds all of q's mass (s = 1). The mass outside H is
always summed directly (never as 1 − s) so that near-complete sets keep full relative accuracy.

Reference (:func:`wor_prefix_mass`, the independent check): x = ln t on [ln t_lo, ln t_hi] in
Gauss–Legendre panels of width ``PANEL_WIDTH`` with ``PANEL_NODES`` nodes each.
t_lo = ((K+1)! · 1e-17)^{1/(K+1)} bounds the neglected head by 1e-17 (P[N ≥ K] ≤ (ts)^K / K!), and
t_hi = 40 / min(1 − s) bounds the neglected tail by e^{−40}. The Poisson-binomial law of N_H(t),
truncated at K (an absorbing state "≥ K"), is updated one token at a time on the fixed grid, so all
nested prefixes H_1 ⊂ H_2 ⊂ … cost one pass (a Python loop over tokens: about 1 s at V = 151,936).

Fast path (:class:`PairMass`, :class:`ClockMass`; used by the branch and bound of
:mod:`otbound.token.bounds`): Q at chosen positions of a ratio order, from cumulative sums.

* K = 2 in closed form: Q(H) = Σ_{i∈H} q_i (s − q_i)/(1 − q_i) = s − (1 − s) Σ_{i∈H} q_i/(1 − q_i).
* K ≥ 3: the same integral, but the law of N_H(t) is not built token by token. Its generating
  function is ∏_i (1 − π_i + π_i z) = e^{−t q(H)} ∏_i (1 + ρ_i z), ρ_i = e^{q_i t} − 1. For the small
  tokens (x_i = q_i t ≤ x0 = 4/(K − 1) at a node) log ∏ (1 + ρ_i z) mod z^K needs only the power sums
  P_j = Σ_i ρ_i^j, j < K, and ρ^j = Σ_n j! S(n, j) x^n / n! (S: Stirling numbers of the second kind,
  all terms positive), so P_j(t) = Σ_n c_{jn} (tθ)^n Σ_i (q_i/θ)^n: moments of q, bucket sums from one
  scatter per order over the row (:class:`KeySums`; orders truncated per token to a relative 1e-16
  of x_i). The coefficients e_0..e_{K−1} follow by Newton's identities; x0 keeps them well conditioned (rounding
  amplified by at most about e^{(K−1)x0} = e^4). Tokens with q_i > θ = x0/t_end ("exact", few:
  at most 1/θ) are treated exactly at the nodes where they are large, by the positive recursion
  e_b ← e_b + ρ_i e_{b−1} (cumulative sums, no cancellation; x capped at 45, ρ scaled by e^{−45}).
  The grid (Gauss–Legendre in ln t, panels of width 1.8/K^{1/4}, 12 nodes) runs from t_lo to a
  t_end chosen by the caller so that every prefix it asks about has e^{−out·t_end} ≤ e^{−40} or
  P[N_H(t_end) < K] ≤ e^{−40}; the tail beyond t_end is then e^{−out·t_end} in closed form.
  K > ``MAX_FAST_DRAFTS`` uses the reference.
* Shared and batched work. The exact tokens' law P[N_exact = b] = e^{−Σx} e_b is formed as
  e'_b · e^{45 b − Σx} (products of normal floats while Σx ≤ 700, else through logarithms). On a
  row sorted by ratio the bucket moments of every K come from one pass over the row
  (:class:`RunMoments`: Σ (q/θ_c)^n per run at θ_c below every θ asked, rescaled by (θ_c/θ)^n, the
  tokens between θ_c and θ added; positive terms only). Several rows' requests are answered by one
  evaluation (:func:`evaluate_many`: positions of grids with as many nodes stacked, each with its
  own nodes, weights and t_end; the evaluators of one search call whose t_end coincide share their
  grid's arrays, :func:`_clock_grid`); the moment-to-power-sum map is a BLAS product in row blocks small
  enough for OpenBLAS to keep on the calling thread (:func:`_product`).

Measured error of the fast path (experiments/bench_token_bounds.py): α* against brute force over
all subsets (V ≤ 8, K ≤ 4) below 3e-15; α* against the reference at V = 2,000–3,000 (K ≤ 16) below
2e-14 and at V = 151,936 (K ≤ 8) below 1e-13, adversarial laws (near-deterministic, disjoint
supports, flat, zipf at T = 2) included; Q(H) against the reference at every prefix of random
orders (V ≤ 3,000, K ≤ 16) below 2e-13 (the worst case: near-deterministic q, grid to t ≈ 1e7).
The shared and batched work above changes α* by rounding only: against the values before it, at
most 5.6e-16 on the six row families of experiments/bench_engine.py (16 rows each, V = 151,936,
K = 3, 4) and on the random, peaked and adversarial rows of tests/test_engine.py (V ≤ 3,000,
K = 3, 4, 5); against the reference DP on the adversarial families of
experiments/bench_token_bounds.py at V = 2,000 at most 2.1e-15 (K = 3, 4, 5, 8) and 6.3e-15
(K = 16), and on two rows of each of those six families at V = 151,936 (K = 3, 4) at most 5.8e-14
(re-measured with the search's later sampling, bounds and run
finding, which choose the positions evaluated but not how Q is computed: 2.3e-15, 6.2e-15 and
6.1e-14, the same figures as the code before them, whose α* they move by at most 1.1e-16 on the
six families). The shared run moments differ from the per-K sums only in extra
truncated series terms (≤ 6e-16 on the power sums at V = 151,936; tests/test_token_bounds.py
checks 1e-13 relative). Stated tolerance: 1e-12.
"""

from __future__ import annotations

import functools
import math

import numpy as np

PANEL_WIDTH = 0.5
PANEL_NODES = 8


def _t_lo(num_drafts: int) -> float:
    """The grid's lower end: the mass neglected below it is at most 1e-17 (module docstring)."""
    return (math.factorial(num_drafts + 1) * 1e-17) ** (1.0 / (num_drafts + 1))


def _log_panels(x_lo: float, x_hi: float, width: float, nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Legendre nodes t_j in x = ln t on equal panels of about ``width`` over [x_lo, x_hi],
    and weights ω_j for ∫ f(t) dt = Σ ω_j f(t_j) (dt = t dx)."""
    n_panels = max(1, math.ceil((x_hi - x_lo) / width))
    gx, gw = _gauss_legendre(nodes)
    edges = np.linspace(x_lo, x_hi, n_panels + 1)
    half = 0.5 * (edges[1:] - edges[:-1])
    mid = 0.5 * (edges[1:] + edges[:-1])
    t = np.exp((mid[:, None] + half[:, None] * gx[None, :]).ravel())
    return t, (half[:, None] * gw[None, :]).ravel() * t


def _grid(num_drafts: int, min_out: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes t_j and weights ω_j (for ∫ f(t) dt = Σ ω_j f(t_j)) on the log-t panels."""
    t_hi = TAIL / max(min_out, 1e-300)
    return _log_panels(math.log(_t_lo(num_drafts)), math.log(t_hi), PANEL_WIDTH, PANEL_NODES)


CLOCK_FLOOR = 1e-300  # smallest positive q whose clock fits float64: 40 / q and its grid stay finite
NEGLIGIBLE = 1e-16  # total change of α* (or of any Q(H)) allowed when dropping negligible tokens


def clock_law(q: np.ndarray, num_drafts: int) -> np.ndarray:
    """q with its negligible tiny tokens dropped, for the clock integral; refuses what float64 cannot do.

    Dropping a set D of tokens (and renormalising) changes the law of the K drafts without
    replacement by at most P(a token of D is drafted) ≤ K q(D) / (1 − M) in total variation, M the
    mass of the K − 1 largest q's (each draw sees at least 1 − M undrawn mass); as every Q(H) and
    α* are 1-Lipschitz in that law, they change by at most as much. D = {i : 0 < q_i < τ} with
    τ = ``NEGLIGIBLE`` (1 − M) / (K V) keeps that below 1e-16 (1 − M summed directly); only tokens
    below ``CLOCK_FLOOR`` are dropped, so other laws are untouched. A positive q_i below
    ``CLOCK_FLOOR`` that is not negligible (it may be drafted, e.g. to complete K distinct drafts)
    needs clock times beyond float64's range (and overflows the K = 2 closed form's 1/(1 − q_i)):
    :class:`InvalidInputError`.
    Returns q itself when it has no positive entry below ``CLOCK_FLOOR``.
    """
    from otbound._validation import InvalidInputError

    q = np.asarray(q, dtype=np.float64)
    k = int(num_drafts)
    tiny = (q > 0) & (q < CLOCK_FLOOR)
    if not tiny.any():
        return q
    rest = np.delete(q, np.argpartition(q, q.size - k + 1)[q.size - k + 1 :]).sum() if k > 1 else 1.0
    drop = tiny & (q < NEGLIGIBLE * rest / (k * q.size))
    kept = q if not drop.any() else np.where(drop, 0.0, q) / q[~drop].sum()
    small = (kept > 0) & (kept < CLOCK_FLOOR)
    if small.any():
        raise InvalidInputError(
            f"q has {int(small.sum())} positive entries below {CLOCK_FLOOR:g} (smallest {kept[small].min():.3g}) "
            f"that the K={k} drafts without replacement may draw (up to {min(1.0, k * kept[small].sum() / rest):.3g} "
            f"probability): float64 cannot resolve their draw (clock times beyond its range, denormal ratios); "
            f"set them to 0 or raise them to {CLOCK_FLOOR:g}"
        )
    return kept


def wor_prefix_mass(q: np.ndarray, order: np.ndarray, num_drafts: int) -> np.ndarray:
    """Q(H_m) for the nested prefixes H_m = {order[0..m-1]}, m = 1..len(order) (checked input)."""
    q = np.asarray(q, dtype=np.float64)
    q = clock_law(q, num_drafts)
    order = np.asarray(order, dtype=np.int64)
    k = int(num_drafts)
    qo = q[order]
    in_order = np.zeros(q.size, dtype=bool)
    in_order[order] = True
    rest = float(q[~in_order].sum())
    # mass outside H_m, summed from the tail so that it is accurate when tiny
    out = rest + np.concatenate([np.cumsum(qo[::-1])[::-1][1:], [0.0]])
    positive_count = np.cumsum(qo > 0)
    result = np.zeros(order.size)
    pos_out = out[out > 0]
    if pos_out.size == 0:
        result[:] = (positive_count >= k).astype(np.float64)
        return result
    t, wt = _grid(k, float(pos_out.min()))
    state = np.zeros((k + 1, t.size))  # P(N = 0..K-1), and P(N >= K) in the last row
    state[0] = 1.0
    for m in range(order.size):
        qi = qo[m]
        if qi > 0:
            pi = -np.expm1(-qi * t)
            moved = state[:k] * pi
            state[:k] -= moved
            state[1:] += moved
        if positive_count[m] < k:
            continue
        o = out[m]
        if o == 0.0:
            result[m] = 1.0
        else:
            result[m] = float(np.dot(wt * o * np.exp(-o * t), state[k]))
    return np.minimum(result, 1.0)


def wor_exclusion_mass(q: np.ndarray, num_drafts: int) -> np.ndarray:
    """Q(V ∖ {y}) for every token y: the probability that y is not among the K drafts.

    One clock pass per token with q_y > 0: O(V²) — for moderate vocabularies.
    """
    q = np.asarray(q, dtype=np.float64)
    out = np.ones(q.size)
    everyone = np.arange(q.size)
    for y in np.flatnonzero(q > 0):
        out[y] = wor_prefix_mass(q, everyone[everyone != y], num_drafts)[-1]
    return out


# ---------------------------------------------------------------------------------------------
# fast path (module docstring)

TAIL = 40.0  # tails neglected beyond e^{-40} = 4e-18
_X_CAP = 45.0
_EXP_SAFE = 700.0  # e^{-x} is a normal float64 (no gradual underflow) for x up to this
_SERIES_SPAN = 4.0  # (K − 1) x0
_SERIES_TOL = 1e-16  # truncation of each token's moment series, relative to its x = q t
_FAST_PANEL_WIDTH = 1.8  # divided by K^0.25: the law of N sharpens in ln t as K grows
_FAST_PANEL_NODES = 12
_FAST_PANEL_POWER = 0.25
_EXACT_CHUNK = 1024
_BANDED_WORK = 2000  # exact tokens × (K − 1) from which they are exact only where large (ClockMass)
MAX_FAST_DRAFTS = 16  # beyond this the reference DP is used


def _fast_grid(num_drafts: int, t_end: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Gauss–Legendre nodes in ln t on [t_lo, t_hi ≥ t_end], weights for ∫ dt, and t_hi."""
    t_lo = _t_lo(num_drafts)
    x_hi = math.log(max(t_end, 2.0 * t_lo))
    t, w = _log_panels(math.log(t_lo), x_hi, _FAST_PANEL_WIDTH / num_drafts**_FAST_PANEL_POWER, _FAST_PANEL_NODES)
    return t, w, math.exp(x_hi)


_ONE_THREAD_WORK = 1 << 19  # multiply-adds of a product below which OpenBLAS runs it on one thread


def _product(a: np.ndarray, b: np.ndarray, out=None) -> np.ndarray:
    """a @ b ((m, k) by (k, n)) by BLAS on the calling thread: in blocks of rows of fewer than
    ``_ONE_THREAD_WORK`` multiply-adds each, which OpenBLAS computes without its worker threads (from
    2 · 65536 · 4 multiply-adds it splits a product over threads, whose hand-offs and spinning cost
    more than they gain at these sizes and stall on a busy machine). Four to six times faster than
    ``np.einsum``'s loop at the search's sizes ((tens of positions, ≈ 33) by (33, ≈ 400)). ``out``:
    a C-contiguous (m, n) array to write into."""
    m, k = a.shape
    n = b.shape[1]
    if out is None:
        out = np.empty((m, n))
    step = max(1, (_ONE_THREAD_WORK - 1) // max(1, k * n))
    if step >= m:
        return np.dot(a, b, out=out)
    for s in range(0, m, step):
        np.dot(a[s : s + step], b, out=out[s : s + step])
    return out


@functools.lru_cache(maxsize=None)
def _gauss_legendre(n: int):
    return np.polynomial.legendre.leggauss(n)


def _series_error(j_max: int, order: int, x: float) -> float:
    """Bound on the series truncation of ρ^j (j ≤ j_max) after ``order`` terms, relative to x."""
    return j_max ** (order + 1) * x**order * math.exp(j_max * x) / math.factorial(order + 1)


def _series_order(j_max: int, x: float) -> int:
    order = 1
    while _series_error(j_max, order, x) > _SERIES_TOL:
        order += 1
    return order


def _series_limit(j_max: int, order: int, x0: float) -> float:
    """Largest x ≤ x0 whose series is accurate after ``order`` terms (bisection in log x)."""
    lo, hi = 1e-300, x0
    if _series_error(j_max, order, hi) <= _SERIES_TOL:
        return hi
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if _series_error(j_max, order, mid) <= _SERIES_TOL else (lo, mid)
    return lo


def _stirling_coefficients(j_max: int, order: int) -> np.ndarray:
    """c[j−1, n−1] = j! S(n, j) / n!: the Taylor coefficients of (e^x − 1)^j, n = 1..order."""
    base = np.array([1.0 / math.factorial(n) for n in range(1, order + 1)])  # e^x − 1 = Σ x^n / n!
    out = np.zeros((j_max, order))
    power = np.zeros(order + 1)
    power[0] = 1.0  # coefficients of (e^x − 1)^0 in x^0..x^order
    for j in range(j_max):
        power = np.convolve(power, np.concatenate([[0.0], base]))[: order + 1]
        out[j] = power[1:]
    return out


def _recursion(t, q_tokens, e_start, sx_start, keep, j_max):
    """Positive recursion e_b ← e_b + ρ_i e_{b−1} (b = 1..J) over tokens in order at nodes t.

    e'_b = e_b(ρ e^{−45}) with ρ_i = e^{x_i} − 1, x_i = min(q_i t, 45) (a token with x ≥ 45 has rung
    up to e^{−45}), and Σ x; starting from (e_start (J, T), sx_start (T,)); returns the states after
    the tokens ``keep`` (−1: the start) as (J, len(keep), T) and (len(keep), T). Cumulative sums of
    positive terms only, down the tokens of (token, node) arrays (one vector step per token along
    the contiguous nodes), in chunks of tokens.
    """
    e = np.repeat(e_start[:, None, :], keep.size, axis=1)
    sx = np.repeat(sx_start[None, :], keep.size, axis=0)
    carry_e, carry_sx = e_start.copy(), sx_start.copy()
    scale = math.exp(-_X_CAP)
    for c0 in range(0, q_tokens.size, _EXACT_CHUNK):
        qc = q_tokens[c0 : c0 + _EXACT_CHUNK]
        x = np.minimum(np.outer(qc, t), _X_CAP)  # (n, T)
        rho = np.expm1(x)
        rho *= scale
        rows = np.flatnonzero((keep >= c0) & (keep < c0 + qc.size))
        local = keep[rows] - c0
        x[0] += carry_sx
        many = qc.size > 1  # a cumulative sum over one token is the token itself
        if many:
            np.cumsum(x, axis=0, out=x)
        sx[rows] = x[local]
        carry_sx = x[-1].copy()
        old = carry_e.copy()
        level, prev = np.empty_like(rho), np.empty_like(rho)  # (n, T) each
        for b in range(j_max):  # e_b after token l: old_b + Σ_{l' ≤ l} ρ_l' e_{b−1}(before l')
            if b == 0:
                np.copyto(level, rho)
            else:
                np.multiply(rho[1:], prev[:-1], out=level[1:])
                np.multiply(rho[0], old[b - 1], out=level[0])
            level[0] += old[b]
            if many:
                np.cumsum(level, axis=0, out=level)
            e[b, rows] = level[local]
            carry_e[b] = level[-1]
            level, prev = prev, level
    return e, sx


@functools.lru_cache(maxsize=None)
def _series_setup(j_max: int):
    """Order N, coefficients c[j−1, n−1] and per-order limits (in units of x0) of the moment series."""
    x0 = _SERIES_SPAN / j_max
    order = _series_order(j_max, x0)
    limits = {n: _series_limit(j_max, n, x0) / x0 for n in (2, 3, 4, 5, 6, 8, 10, 13, 17, 22, 28) if n < order}
    return x0, order, _stirling_coefficients(j_max, order), limits


_SCATTER_MIN = 1 << 12  # tokens from which KeySums scatters with torch (below, np.bincount costs less per call)
_CHUNK = 1 << 15  # tokens per chunk of KeySums.powers_into (its arrays for all orders stay in a 1 MB L2 cache)


def _torch():
    import torch  # imported by the call (LawBatch) already; not at ``import otbound``

    return torch


class KeySums:
    """Σ of weights per key 0..``num_keys`` (keys in that range), for several weight rows over the
    same keys: a scatter in token order (``np.bincount``, or torch's ``scatter_add_`` on long rows:
    :meth:`into`), or, when ``keys_sorted`` (the tokens of a row sorted by ratio, whose
    bucket keys never decrease), sums of the contiguous runs of equal keys (``np.add.reduceat``: a
    sequential pass instead of a scatter; the run starts are found once for every weight row).
    Keys claimed sorted are verified on the run starts (they must increase strictly), else bincount.
    :meth:`from_runs` builds the run form directly from known run starts (no keys array).
    """

    def __init__(self, keys: np.ndarray, num_keys: int, keys_sorted: bool = False):
        self.keys, self.length, self.starts, self.size = keys, num_keys + 1, None, keys.size
        self._keys_tensor = None  # the keys as a torch tensor (shared memory), made at the first scatter
        if keys_sorted and keys.size:
            starts = np.flatnonzero(keys[1:] != keys[:-1])
            starts += 1
            starts = np.concatenate([[0], starts])
            at = keys[starts]
            if at.size < 2 or bool((at[1:] > at[:-1]).all()):
                self.starts, self.at = starts, at

    @classmethod
    def from_runs(cls, starts: np.ndarray, at: np.ndarray, num_keys: int, size: int) -> "KeySums":
        """The run form over ``size`` tokens whose keys are ``at[r]`` from ``starts[r]`` on (``starts``
        begins at 0 and increases, ``at`` increases strictly)."""
        out = cls.__new__(cls)
        out.keys, out.length, out.size, out.starts, out.at = None, num_keys + 1, size, starts, at
        out._keys_tensor = None
        return out

    def key_of(self, idx: np.ndarray) -> np.ndarray:
        """The keys of the tokens ``idx``."""
        if self.keys is not None:
            return self.keys[idx]
        return self.at[np.searchsorted(self.starts, idx, side="right") - 1]

    def __call__(self, weights: np.ndarray) -> np.ndarray:
        return self.into(weights, np.zeros(self.length))

    def into(self, weights: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The sums written into ``out`` (a zero (num_keys + 1,) array, or view: the keys without
        tokens keep their 0). By keys, from ``_SCATTER_MIN`` tokens on, torch's ``scatter_add_``
        into ``out`` itself: the same additions in the same order as ``np.bincount`` (token order,
        from 0; one thread whatever torch's setting: a 1-D scatter is not split), so the same sums
        bit for bit, about a third cheaper (no pass for the keys' range, no copy of the result)."""
        if self.starts is None:
            if (self.size >= _SCATTER_MIN and self.keys.dtype == np.int64 and weights.dtype == out.dtype == np.float64
                    and weights.flags.writeable and out.flags.writeable):
                torch = _torch()
                if self._keys_tensor is None:
                    self._keys_tensor = torch.from_numpy(self.keys)
                if out.flags.c_contiguous:
                    torch.from_numpy(out).scatter_add_(0, self._keys_tensor, torch.from_numpy(weights))
                else:  # a column of a table: scattered into a contiguous row (cheaper), then copied
                    out[:] = torch.zeros(out.size, dtype=torch.float64).scatter_add_(
                        0, self._keys_tensor, torch.from_numpy(weights)).numpy()
            else:
                out[:] = np.bincount(self.keys, weights=weights, minlength=self.length)
        elif self.starts.size:
            out[self.at] = np.add.reduceat(weights, self.starts)
        return out

    def powers_into(self, y: np.ndarray, out: np.ndarray, first: int = 1, cut=None):
        """out[:, c] = Σ y^(first + c) per key, c = 0..out.shape[1] − 1 (``out`` overwritten; keys in
        the bincount form), the powers y^1, y^2 = y·y, y^3 = y^2·y, … (the products of
        :func:`_moment_sums`). With torch's scatter, by chunks of ``_CHUNK`` tokens whose powers and
        keys stay in cache across the orders: each chunk's powers scattered in token order into the
        same sums, so every sum adds the same terms in the same order as one scatter per order over
        the row (the same sums bit for bit). ``cut``: the tokens with y > cut are listed too, chunk
        by chunk while in cache, and returned (increasing; None without ``cut``)."""
        orders = out.shape[1]
        acc = np.zeros((orders, self.length))  # (orders, keys): contiguous rows for the scatters
        if not (self.keys.dtype == np.int64 and y.dtype == np.float64 and y.flags.writeable):
            w = y.copy()
            for n in range(1, first + orders):  # one bincount per order over the row
                if n > 1:
                    w *= y
                if n >= first:
                    self.into(w, acc[n - first])
            out[:] = acc.T
            return None if cut is None else np.flatnonzero(y > cut)
        torch = _torch()
        if self._keys_tensor is None:
            self._keys_tensor = torch.from_numpy(self.keys)
        w = np.empty(min(_CHUNK, y.size))
        rows, tw = [torch.from_numpy(a) for a in acc], torch.from_numpy(w)
        listed = []
        for lo in range(0, y.size, _CHUNK):
            hi = min(lo + _CHUNK, y.size)
            yc, wc, keys = y[lo:hi], w[: hi - lo], self._keys_tensor[lo:hi]
            np.copyto(wc, yc)
            for n in range(1, first + orders):
                if n == 2:
                    np.multiply(yc, yc, out=wc)
                elif n > 2:
                    wc *= yc
                if n >= first:
                    rows[n - first].scatter_add_(0, keys, tw[: hi - lo])
            if cut is not None:
                found = np.flatnonzero(yc > cut)
                found += lo
                listed.append(found)
        out[:] = acc.T
        return None if cut is None else np.concatenate(listed)

    def spread(self, table: np.ndarray, out=None) -> np.ndarray:
        """``table[keys]`` (by runs when the keys are sorted)."""
        if self.starts is None:
            return np.take(table, self.keys, out=out)
        return np.repeat(table[self.at], np.diff(self.starts, append=self.size))

    def subset(self, idx: np.ndarray) -> "KeySums":
        """The same sums over the tokens ``idx`` (increasing) only (by runs: the runs' new starts, one
        binary search per run, empty runs dropped)."""
        if self.starts is None:
            return KeySums(self.keys[idx], self.length - 1)
        starts = np.searchsorted(idx, self.starts)  # tokens of idx before each run
        ends = np.empty_like(starts)  # ... and before the next run
        ends[:-1] = starts[1:]
        ends[-1:] = idx.size
        held = ends > starts
        return KeySums.from_runs(starts[held], self.at[held], self.length - 1, idx.size)


_PROBE_STRIDE = 64  # every 64th token probes whether many tokens still need more series terms
_KEEP_FRACTION = 3  # the arrays are cut down to the tokens needing more terms once under 1/3 of them do


def _mostly_above(y: np.ndarray, limit: float) -> bool:
    """Whether a strided probe of y finds over 1/``_KEEP_FRACTION`` of it above ``limit`` (then the
    tokens at or below it stay in the arrays: :func:`_moment_sums` keeps them one more order, whose
    extra terms only add accuracy, as one more pass over the arrays costs less than cutting them
    down to a larger part). Rows under 64 probes are checked in full."""
    probe = y[::_PROBE_STRIDE]
    return probe.size >= 64 and _KEEP_FRACTION * int(np.count_nonzero(probe > limit)) > probe.size


def _moment_sums(y: np.ndarray, sums: KeySums, limit: dict, out: np.ndarray, work=None) -> None:
    """out[:, n − 1] = Σ y^n per key (``sums``), n = 1..out.shape[1], each token's series truncated
    after order n once y ≤ limit[n] (it leaves the arrays once under 1/``_KEEP_FRACTION`` of the
    tokens in them need more terms; y may be a scratch row). ``out``: zero on entry, written in
    place. ``work``: optional scratch row "w" of y's size.

    Long rows by keys (the bincount form): the orders every token takes (up to the first checkpoint
    whose probe does not find most tokens above it, :func:`_checkpoint`) are summed chunk by chunk
    (:meth:`KeySums.powers_into`: each chunk's powers and keys stay in cache across the orders; the
    same additions in the same order, so the same sums), the tokens above the checkpoint's limit
    listed in the same pass; then the tokens kept go on as below (or, a third or more of them
    listed, every token on to the next checkpoint the same way)."""
    order = out.shape[1]
    if sums.starts is None and y.size >= 2 * _CHUNK:
        n = _checkpoint(y, limit, order, 2)
        keep = sums.powers_into(y, out[:, :n], cut=limit[n] if n < order else None)
        # the loop's count at that checkpoint: no cut (a third or more need more terms), on with every token
        while keep is not None and keep.size and _KEEP_FRACTION * keep.size >= y.size:
            after = _checkpoint(y, limit, order, n + 1)
            keep = sums.powers_into(y, out[:, n:after], first=n + 1, cut=limit[after] if after < order else None)
            n = after
        if keep is None or keep.size == 0:
            return
        y, sums = np.take(y, keep), sums.subset(keep)
        w = np.multiply(y, y)  # y^n by the same products as below
        for _ in range(n - 2):
            w *= y
        w *= y
        _moment_orders(y, w, sums, limit, out, n + 1)
        return
    sums.into(y, out[:, 0])
    if order == 1:
        return
    w = np.multiply(y, y, out=None if work is None else work["w"][: y.size])
    _moment_orders(y, w, sums, limit, out, 2)


def _moment_orders(y, w, sums, limit, out, start) -> None:
    """Orders start..N of :func:`_moment_sums` (w = y^start).

    The orders between two cuts of the arrays (or to the stop) share their tokens; by keys (the
    bincount form) and below ``_SCATTER_MIN`` tokens, those orders' powers are summed by one
    bincount over (order, key) bins (the powers order by order, each order's tokens in token order:
    every bin adds the same terms in the same order as one bincount per order, so the same sums)."""
    order = out.shape[1]
    n = start
    while True:
        last, keep = n, None  # the orders n..last share the arrays; then cut to keep (None: stop)
        while last < order:
            if last in limit and not _mostly_above(y, limit[last]):
                more = y > limit[last]  # the tokens needing more terms: counted, listed only to cut down to them
                count = int(np.count_nonzero(more))
                if count == 0:
                    break
                if _KEEP_FRACTION * count < y.size:
                    keep = np.flatnonzero(more)
                    break
            last += 1
        if sums.starts is None and last > n and y.size < _SCATTER_MIN:
            span = last - n + 1
            powers = np.empty((span, y.size))  # (orders, tokens): y^n .. y^last
            powers[0] = w
            for c in range(1, span):
                np.multiply(powers[c - 1], y, out=powers[c])
            bins = np.arange(span)[:, None] * sums.length + sums.keys[None, :]  # (orders, tokens)
            found = np.bincount(bins.ravel(), weights=powers.ravel(), minlength=span * sums.length)
            out[:, n - 1 : last] = found.reshape(span, sums.length).T
            w = powers[-1]
        else:
            for m in range(n, last + 1):
                sums.into(w, out[:, m - 1])
                if m < last:
                    w *= y
        if keep is None:
            return
        y, w, sums = np.take(y, keep), np.take(w, keep), sums.subset(keep)
        w *= y
        n = last + 1


def _checkpoint(y: np.ndarray, limit: dict, order: int, begin: int) -> int:
    """The first order n ≥ ``begin`` at which :func:`_moment_sums`' loop counts the tokens needing
    more terms (a checkpoint of ``limit`` whose strided probe of y does not find most above it), or
    ``order`` if none."""
    for n in range(begin, order):
        if n in limit and not _mostly_above(y, limit[n]):
            return n
    return order


class RunMoments:
    """Moment sums of the runs of one row sorted by ratio, shared by the K ≥ 3 of the row.

    For a reference θ_c: T[r, n] = Σ (q_i/θ_c)^n over the tokens of run r with q_i ≤ θ_c (n = 1..N,
    N and the per-token truncation those of every K ≤ ``MAX_FAST_DRAFTS``), the tokens above θ_c
    kept aside (few: at most 1/θ_c). A K whose θ ≥ θ_c reads its features from them,

        Σ_{q_i ≤ θ} (q_i/θ)^n = (θ_c/θ)^n T[r, n] + Σ_{θ_c < q_i ≤ θ} (q_i/θ)^n,

    sums of positive terms only (each term ≤ 1), so the row is passed over once for every K rather
    than once per K. θ_c is a quarter of the first θ asked (the θ of K + 1 is typically 0.4–0.7 of
    that of K); a smaller θ rebuilds the sums at a quarter of it. Runs are summed as far as asked
    (the cut, hence the number of runs read, grows with K).
    """

    SPARE = 4.0  # θ_c = θ / SPARE at the first use

    def __init__(self, q: np.ndarray, starts: np.ndarray):
        self.q, self.starts = q, starts  # the row, its run starts (increasing from 0)
        self.theta_c = None

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def _series():
        """(N, limits): the longest series and the strictest truncation over every fast K."""
        setups = [_series_setup(j) for j in range(2, MAX_FAST_DRAFTS)]  # limits in units of θ (y = q/θ)
        return max(s[1] for s in setups), {n: min(s[3][n] for s in setups) for n in setups[0][3]}

    def _reset(self, theta_c: float):
        order, _ = self._series()
        self.theta_c, self.done = theta_c, 0
        self.table = np.zeros((0, order))  # (runs done, N)
        self.aside = np.zeros(0, dtype=np.int64)  # tokens with q > θ_c in the runs done, increasing
        self.aside_run = np.zeros(0, dtype=np.int64)

    def _extend(self, num_runs: int, work=None):
        """Sum runs done..num_runs − 1 (those below the cut asked)."""
        order, limit = self._series()
        lo = int(self.starts[self.done])
        hi = int(self.starts[num_runs]) if num_runs < self.starts.size else self.q.size
        local = self.starts[self.done : num_runs] - lo
        new = np.zeros((num_runs - self.done + 1, order))
        if hi > lo:
            q = self.q[lo:hi]
            y = np.divide(q, self.theta_c, out=None if work is None else work["y"][: q.size])
            big = np.flatnonzero(q > self.theta_c)
            y[big] = 0.0
            runs = KeySums.from_runs(local, np.arange(local.size), local.size, q.size)
            _moment_sums(y, runs, limit, new, work)
            self.aside = np.concatenate([self.aside, big + lo])
            self.aside_run = np.concatenate([self.aside_run, np.searchsorted(local, big, side="right") - 1 + self.done])
        self.table = np.concatenate([self.table, new[:-1]])
        self.done = num_runs

    def features(self, theta: float, order: int, num_runs: int, work=None) -> np.ndarray:
        """(num_runs, order): Σ (q_i/θ)^n, n = 1..order, per run over its tokens with q_i ≤ θ."""
        if self.theta_c is None or theta < self.theta_c:
            self._reset(theta / self.SPARE)
        if num_runs > self.done:
            self._extend(num_runs, work)
        if order > self.table.shape[1]:
            raise AssertionError("a series longer than the shared run moments")
        scale = (self.theta_c / theta) ** np.arange(1, order + 1)  # ≤ 1
        out = self.table[:num_runs, :order] * scale
        qa = self.q[self.aside]
        sel = np.flatnonzero((qa <= theta) & (self.aside_run < num_runs))
        if sel.size:  # the tokens between θ_c and θ, all their terms
            powers = np.cumprod(np.repeat((qa[sel] / theta)[:, None], order, axis=1), axis=1)
            np.add.at(out, self.aside_run[sel], powers)
        return out


class PairMass:
    """Q(H) for K = 2 in closed form (derived from the sequential draw):

        Q(H) = Σ_{i∈H} q_i (s − q_i)/(1 − q_i) = s − (1 − s) Σ_{i∈H} q_i/(1 − q_i).

    Exact up to rounding; 1 − q_i is the mass of the other tokens (summed directly when q_i > 1/2).
    Features: one per token, u_i = q_i / (1 − q_i). Stretch bound: adding mass x to H_s gives
    Q ≤ Q_s + x (1 + U_s − out_s) + x² (u ≥ q for every token).
    """

    leaf = 1 << 62  # positions cost nothing: evaluate every position of a stretch at once
    has_exact = False
    num_features = 1

    def __init__(self, q: np.ndarray, big: int | None = None):
        self.big = int(np.argmax(q)) if big is None else big  # ``big``: the index of the largest q, if known
        rest = np.delete(q, self.big).sum() if q[self.big] > 0.5 else 1.0 - q[self.big]
        self.rest_of_big = float(rest)

    def chain_features(self, base: np.ndarray, q_tokens: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Features after 0..n of the tokens (in order), starting from ``base``."""
        denom = np.where(tokens == self.big, self.rest_of_big, 1.0 - q_tokens)
        return base + np.concatenate([[0.0], np.cumsum(q_tokens / denom)])[:, None]

    def bucket_features(self, q: np.ndarray, sums: KeySums, num_keys: int, work=None, exact=None,
                        moments=None) -> np.ndarray:
        """Σ u per key below ``num_keys`` (``sums``: the :class:`KeySums` of the row's keys)."""
        u = np.subtract(1.0, q, out=None if work is None else work["w"][: q.size])
        with np.errstate(divide="ignore"):
            np.divide(q, u, out=u)  # q/(1 − q), in the scratch row
        u[self.big] = q[self.big] / self.rest_of_big
        return sums(u)[:num_keys, None]

    def mass(self, features, out, inside, exact=None, out_next=None):
        """Q at positions (cumulative features, q outside, q inside); with ``out_next`` also the
        stretch bound coefficients (D1, C2, C3 = 0): Q(H_s ∪ S) ≤ Q_s + D1 x + C2 x²/2, x = q(S)."""
        q_mass = np.clip(inside - out * features[:, 0], 0.0, 1.0)
        if out_next is None:
            return q_mass
        return q_mass, 1.0 + features[:, 0] - out, np.full(out.size, 2.0), np.zeros(out.size)


def _powers(y: np.ndarray, c: int, last: bool = False) -> np.ndarray:
    """(c, *y.shape) (``last``: (*y.shape, c)): y^1..y^c, each power the previous one times y."""
    out = np.empty(y.shape + (c,) if last else (c,) + y.shape)
    at = (lambda m: out[..., m]) if last else (lambda m: out[m])
    at(0)[...] = y
    for m in range(1, c):
        np.multiply(at(m - 1), y, out=at(m))
    return out


class BlockSums:
    """Running sums Σ_{l<j} y_l^m (m = 1..c) of a row y (n,), read at asked positions j = 0..n: kept
    whole for n ≤ ``SHORT``; longer rows are summed by blocks of ``BLOCK`` entries (one pass, no
    running sum over the row: a search reads a few dozen of a chain's positions), a position adding
    its block's entries before it when asked (sums of the same terms, grouped by block). The powers
    of a long row are made by chunks of ``CHUNK`` tokens that stay in cache (each block summed from
    the same terms: the same sums) and, at lookup, again for the blocks asked (by the same products:
    the same values), never held for the whole row."""

    SHORT = 2048
    BLOCK = 32
    CHUNK = 4096  # a multiple of BLOCK

    def __init__(self, y: np.ndarray, c: int):
        self.y, self.c = y, c  # (n,)
        n = y.size
        self.size = n + 1  # positions
        self.block = block = 1 if n <= self.SHORT else self.BLOCK
        self.head = np.zeros((c, -(-n // block) + 1))  # (c, blocks + 1): the sums of the blocks before
        if not n:
            return
        if block == 1:
            np.cumsum(_powers(y, c), axis=1, out=self.head[:, 1:])
            return
        for lo in range(0, n, self.CHUNK):  # the block sums, chunk by chunk
            part = y[lo : lo + self.CHUNK]
            first = 1 + lo // block
            np.add.reduceat(_powers(part, c), np.arange(0, part.size, block), axis=1,
                            out=self.head[:, first : first + -(-part.size // block)])
        np.cumsum(self.head[:, 1:], axis=1, out=self.head[:, 1:])

    def at(self, idx: np.ndarray) -> np.ndarray:
        """(c, len(idx)): the sums before the positions ``idx``."""
        idx = np.asarray(idx)
        if self.block == 1:
            return self.head[:, idx]
        block = idx // self.block
        window = block[:, None] * self.block + np.arange(self.block)[None, :]  # (len(idx), block)
        # (c, len(idx), block), laid out as (len(idx), block, c) (as a gather of the powers by window
        # lays it out: the sum below then adds in the same order)
        before = np.moveaxis(_powers(self.y[np.minimum(window, self.y.size - 1)], self.c, last=True), -1, 0)
        before *= window < idx[:, None]  # the block's entries before each position
        return self.head[:, block] + before.sum(axis=2)


class _ChainSums:
    """Running moment sums over the tokens of a chain: row j = base + Σ_{l<j} (y_l^1..y_l^N).

    Most tokens need few orders (``limit``): the first ``low`` orders are summed for every token
    (:class:`BlockSums`), the rest only over the few tokens with y above limit[low] (found by
    position at lookup).
    """

    LOW = 6

    def __init__(self, base, y, order, limit):
        low = min(self.LOW, order)
        self.base, self.low = base, low
        self.low_sums = BlockSums(y, low)
        self.high = np.flatnonzero(y > limit[low]) if low < order else np.zeros(0, dtype=np.int64)
        yh = y[self.high]
        powers = np.cumprod(np.repeat(yh[:, None], order - low, axis=1), axis=1) * (yh**low)[:, None]
        self.high_sums = np.zeros((yh.size + 1, order - low))
        np.cumsum(powers, axis=0, out=self.high_sums[1:])

    def __getitem__(self, idx):
        idx = np.asarray(idx)
        out = np.empty((idx.size, self.base.size))
        out[:] = self.base
        out[:, : self.low] += self.low_sums.at(idx).T
        out[:, self.low :] += self.high_sums[np.searchsorted(self.high, idx, side="left")]
        return out


def _clock_grid(k: int, t_end: float) -> tuple:
    """What :class:`ClockMass` (K = k, grid to t_end) holds of its grid, arrays read-only: nodes t,
    weights, the grid's end and start, the series' order, coefficients and truncation limits, θ,
    t·θ, the moment-to-power-sum map, each node's class, the number of classes and 2^{−n}."""
    j_max = k - 1
    t, wt, t_hi = _fast_grid(k, t_end)
    # progressive truncation: after order n only tokens with q/θ > limit[n] need more terms
    x0, order, coef, limit = _series_setup(j_max)
    theta = x0 / t_hi
    tt = t * theta  # ≤ x0
    power_map = ClockMass._map(coef, tt)
    node_class = np.floor(np.log2(t_hi / t)).astype(np.int64)  # non-increasing along t
    halving = 0.5 ** np.arange(1, order + 1)
    for a in (t, wt, tt, power_map, node_class, halving):
        a.flags.writeable = False
    return t, wt, t_hi, _t_lo(k), order, coef, limit, theta, tt, power_map, node_class, int(node_class[0]) + 1, halving


class ClockMass:
    """Q(H) for K ≥ 3 at many positions of one ratio order by the clock integral (fast path above).

    Exact tokens are exact only where they are large: a token with y = q/θ in (2^{c−1}, 2^c] (class
    c ≥ 1) has x = q t ≤ x0 at the nodes with t ≤ t_end / 2^c, and there it joins the moment sums
    (in units of 2^c θ, so every term is ≤ 1); at the other nodes it enters the positive recursion.
    Nodes are grouped by c(t) = ⌊log2(t_end / t)⌋: in group c the classes ≤ c are moments, the
    classes > c exact. So the recursion costs about (nodes per octave) × (exact tokens) instead of
    (all nodes) × (exact tokens). With few exact tokens (``_BANDED_WORK``) they are simply exact at
    every node (fewer, larger array operations).

    Stretch bound (derived): see :func:`_stretch_bound`.
    """

    leaf = 16  # stretches up to this many positions are evaluated whole
    has_exact = True

    def __init__(self, num_drafts: int, t_end: float, grids: dict | None = None):
        """``grids``: the grids already built (read-only arrays, by K and t_end), shared by the
        evaluators of one search call (its rows' horizons often coincide: the Chernoff cut-offs are
        times of a fixed grid); None: built here."""
        k = int(num_drafts)
        key = (k, float(t_end))
        grid = None if grids is None else grids.get(key)
        if grid is None:
            grid = _clock_grid(k, t_end)
            if grids is not None:
                grids[key] = grid
        self.j_max = k - 1
        (self.t, self.wt, self.t_end, self.t_lo, self.order, self.coef, self.limit, self.theta, self.tt,
         self.power_map, self.node_class, self.n_class, self.halving) = grid
        self.num_features = self.order

    @functools.cached_property
    def groups(self) -> list:
        """The node groups ``(c, nodes)`` of c(t) = ⌊log2(t_end / t)⌋, in order, ``nodes`` a slice of
        the grid (contiguous: c does not increase along t; needed by rows with banded exact tokens only)."""
        cuts = (np.flatnonzero(np.diff(self.node_class)) + 1).tolist()
        edges = [0, *cuts, self.t.size]
        return [(int(self.node_class[s]), slice(s, e)) for s, e in zip(edges[:-1], edges[1:])]

    @staticmethod
    def _map(coef, scaled_t):
        """(N, J·T) map from moments Σ (q/u)^n to power sums: c_{jn} (t u)^n at the given t·u."""
        powers = scaled_t[None, :] ** np.arange(1, coef.shape[1] + 1)[:, None]  # (N, T)
        return (coef.T[:, :, None] * powers[:, None, :]).reshape(coef.shape[1], -1)

    # -- smooth (small) tokens
    def is_exact(self, q_tokens: np.ndarray) -> np.ndarray:
        return q_tokens > self.theta

    def chain_features(self, base: np.ndarray, q_tokens: np.ndarray, tokens=None) -> "_ChainSums":
        """Moments after 0..n of the tokens (in order) starting from ``base`` (exact tokens add none)."""
        y = np.where(self.is_exact(q_tokens), 0.0, q_tokens / self.theta)
        return _ChainSums(base, y, self.order, self.limit)

    def bucket_features(self, q: np.ndarray, sums: KeySums, num_keys: int, work=None, exact=None,
                        moments=None) -> np.ndarray:
        """Σ (q_i/θ)^n, n = 1..N, per key over the small tokens (keys ≥ num_keys are ignored; ``sums``:
        the :class:`KeySums` of the row's keys; ``exact``: the indices of q > θ, if known).

        Orders are truncated per token (``limit``): tokens dropping out of the series are removed from
        the arrays once over 2/3 of them have (:func:`_moment_sums`; the sums keep extra, more accurate
        terms otherwise).
        By runs (a row sorted by ratio), the tokens of keys ≥ num_keys, its last ones, are never read.
        ``work``: optional scratch rows "y" and "w" of q's size (reused across rows). ``moments``: the
        row's :class:`RunMoments` (keys: its runs), shared with the other K of the row.
        """
        if moments is not None:
            return moments.features(self.theta, self.order, num_keys, work)
        out = np.zeros((num_keys + 1, self.order))
        if sums.starts is not None and num_keys < sums.starts.size:  # runs: drop the tokens above the cut
            size = int(sums.starts[num_keys])
            q, sums = q[:size], KeySums.from_runs(sums.starts[:num_keys], sums.at[:num_keys], num_keys, size)
        if q.size == 0:
            return out[:num_keys]
        y = np.divide(q, self.theta, out=None if work is None else work["y"][: q.size])
        if exact is None:  # exact tokens: no moments here
            np.copyto(y, 0.0, where=q > self.theta)
        else:
            y[exact[exact < q.size]] = 0.0
        _moment_sums(y, sums, self.limit, out, work)
        return out[:num_keys]

    # -- exact tokens
    def start(self, q_exact: np.ndarray):
        """Exact-token state of the empty prefix, for the exact tokens ``q_exact`` of the row: moment
        sums Σ (y/2^c)^n of each class c that is small somewhere (c_lo..n_class−1), and over the grid
        e'_b (b = 1..J) and Σ x of the tokens exact at each node. A row without exact tokens needs
        no such states: ``has_exact`` becomes False (:meth:`mass` then takes ``exact=None``, the
        same value: P[N_exact = 0] = 1)."""
        self.has_exact = q_exact.size > 0
        cls = self._classes(q_exact)
        banded = q_exact.size * self.j_max >= _BANDED_WORK  # else: exact everywhere, fewer calls
        self.class_lo = int(cls.min()) if banded and cls.size else self.n_class
        self.recursion_groups = self.groups if banded else [(-1, slice(0, self.t.size))]
        self.group_maps = {} if self.class_lo >= self.n_class else {
            c: (nodes, self._map(self.coef, self.tt[nodes] * 2.0**c)) for c, nodes in self.groups if c >= self.class_lo
        }
        width = max(0, self.n_class - self.class_lo)
        return np.zeros((1, width, self.order)), np.zeros((self.j_max, 1, self.t.size)), np.zeros((1, self.t.size))

    def _classes(self, q_exact):
        mant, expo = np.frexp(q_exact / self.theta)
        return expo - (mant == 0.5)  # y = q/θ in (2^{c−1}, 2^c]

    def run_exact(self, q_exact: np.ndarray, start, keep: np.ndarray):
        """States after the exact tokens ``keep`` (indices into q_exact, −1: the start), in order."""
        keep = np.asarray(keep, dtype=np.int64)
        sums = np.repeat(start[0], keep.size, axis=0)
        # exact at every node (group class −1, below every exact token's): the recursion gives e, sx whole
        if q_exact.size and self.recursion_groups[0][0] == -1:
            e = sx = None
        else:
            e, sx = np.repeat(start[1], keep.size, axis=1), np.repeat(start[2], keep.size, axis=0)
        if q_exact.size == 0:
            return sums, e, sx
        y = q_exact / self.theta
        cls = self._classes(q_exact)
        for c in range(self.class_lo, self.n_class):  # moments of each class, in units of 2^c θ
            idx = np.flatnonzero(cls == c)
            if idx.size:
                run = np.zeros((idx.size + 1, self.order))
                powers = np.cumprod(np.repeat((y[idx] / 2.0**c)[:, None], self.order, axis=1), axis=1)
                np.cumsum(powers, axis=0, out=run[1:])
                sums[:, c - self.class_lo] += run[np.searchsorted(idx, keep, side="right")]
        for c, nodes in self.recursion_groups:  # the recursion over the tokens exact at the nodes of group c
            idx = np.flatnonzero(cls > c)
            if idx.size:
                last = np.searchsorted(idx, keep, side="right") - 1
                e_start, sx_start = start[1][:, 0, nodes], start[2][0, nodes]
                e_nodes, sx_nodes = _recursion(self.t[nodes], q_exact[idx], e_start, sx_start, last, self.j_max)
                if e is None:  # the every-node group: every exact token (all of class ≥ 1 > −1)
                    e, sx = e_nodes, sx_nodes
                else:
                    e[:, :, nodes], sx[:, nodes] = e_nodes, sx_nodes
        return sums, e, sx

    # -- the integrals
    def mass(self, features, out, inside=None, exact=None, out_next=None):
        """Q at positions (cumulative small-token moments, q outside, exact-token states); with
        ``out_next`` (q outside the stretch end) also the stretch bound coefficients (D1, C2, C3)."""
        if isinstance(exact, StatesAt):
            exact = exact.gathered()
        psum, lam = self._power_sums(features, exact)
        return _integrals(psum, lam, exact, out, out_next, self.t[None, :], self.wt[None, :], self.t_end, self.t_lo)

    def _power_sums(self, features, exact=None, out=None):
        """P_j (j = 1..J) of the tokens in the series at every (position, node), (npos, J, T), and
        λ = Σ x over them, (npos, T): small-token moments, plus the exact tokens where small.
        ``out``: optional C-contiguous arrays ((npos, J, T), (npos, T)) to write them into."""
        npos, nt, jm = features.shape[0], self.t.size, self.j_max
        psum_out, lam_out = (None, None) if out is None else out
        psum = _product(features, self.power_map,
                        out=None if psum_out is None else psum_out.reshape(npos, jm * nt)).reshape(npos, jm, nt)
        lam = np.multiply(features[:, :1], self.tt[None, :], out=lam_out)
        if exact is not None and exact[0].shape[1]:  # exact tokens where they are small: classes ≤ c
            sums = exact[0]
            acc = np.zeros((npos, self.order))
            for c in range(self.class_lo, self.n_class):
                acc *= self.halving  # Σ_{c' ≤ c} 2^{−(c−c') n} Σ_{class c'} (y/2^{c'})^n = Σ (y/2^c)^n
                acc += sums[:, c - self.class_lo]
                if c in self.group_maps:
                    nodes, group_map = self.group_maps[c]
                    psum[:, :, nodes] += _product(acc, group_map).reshape(npos, jm, -1)
                    lam[:, nodes] += acc[:, :1] * (self.tt[nodes] * 2.0**c)[None, :]
        return psum, lam


class StatesAt:
    """Exact-token states of :meth:`ClockMass.run_exact` at a request's positions, by reference:
    ``pieces``, ``(states, index)`` pairs (``states``: ``(sums, e, sx)``; ``index`` (n,): the state of
    each position), the pieces' positions in order. Read where used (:meth:`gathered`, or straight
    into the stacked arrays of :func:`_mass_stacked`: one copy of e and sx per piece instead of a
    gather and a concatenation per piece and per row)."""

    def __init__(self, pieces: list):
        self.pieces = pieces
        self.width = pieces[0][0][0].shape[1]  # class sums per state (0: no class small anywhere)

    def gathered(self) -> tuple:
        """``(sums, e, sx)`` at the positions: (npos, W, N), (J, npos, T), (npos, T)."""
        found = [(sums[si], e[:, si], sx[si]) for (sums, e, sx), si in self.pieces]
        if len(found) == 1:
            return found[0]
        return tuple(np.concatenate([f[i] for f in found], axis=1 if i == 1 else 0) for i in range(3))

    def into(self, e_out: np.ndarray, sx_out: np.ndarray) -> None:
        """e and sx at the positions written into ``e_out`` (J, npos, T) and ``sx_out`` (npos, T)."""
        at = 0
        for (_, e, sx), si in self.pieces:
            n = si.size
            # indices valid: mode "clip" writes into the slices directly (no buffer for the bounds check)
            np.take(e, si, axis=1, out=e_out[:, at : at + n], mode="clip")
            np.take(sx, si, axis=0, out=sx_out[at : at + n], mode="clip")
            at += n


def _state_width(exact) -> int:
    """The class sums per state of ``exact`` (a :class:`StatesAt` or the states ``(sums, e, sx)``)."""
    return exact.width if isinstance(exact, StatesAt) else exact[0].shape[1]


def evaluate_many(asks: list) -> list:
    """Answers to several evaluators' requests ``(ev, (features, out, inside, exact, out_next))``, each
    ``ev.mass(...)`` of its request, in order. The requests of :class:`ClockMass` evaluators of one K
    with grids of as many nodes (whose exact tokens need no class sums) are answered by one
    evaluation over all their positions, each position with its own grid's nodes, weights and
    t_end (the same arithmetic per position: values equal to rounding in the node sums)."""
    answers = [None] * len(asks)
    groups: dict = {}
    for i, (ev, args) in enumerate(asks):
        exact = args[3]
        if isinstance(ev, ClockMass) and args[4] is not None and (exact is None or not _state_width(exact)):
            groups.setdefault((ev.j_max, ev.t.size), []).append(i)
        else:
            answers[i] = ev.mass(*args)
    for idx in groups.values():
        if len(idx) == 1:
            ev, args = asks[idx[0]]
            answers[idx[0]] = ev.mass(*args)
            continue
        for i, answer in zip(idx, _mass_stacked([asks[i] for i in idx])):
            answers[i] = answer
    return answers


def _mass_stacked(asks: list) -> list:
    """:meth:`ClockMass.mass` (with stretch bounds) of several evaluators of one K and one node count
    at once (:func:`evaluate_many`): each position's own nodes, weights and t_end."""
    sizes = [args[0].shape[0] for _, args in asks]
    reps = np.array(sizes)
    bounds = np.cumsum([0] + sizes).tolist()
    jm, nt = asks[0][0].j_max, asks[0][0].t.size
    psum, lam = np.empty((bounds[-1], jm, nt)), np.empty((bounds[-1], nt))  # (npos, J, T), (npos, T)
    for (ev, args), a, b in zip(asks, bounds[:-1], bounds[1:]):
        ev._power_sums(args[0], out=(psum[a:b], lam[a:b]))
    t = np.repeat(np.stack([ev.t for ev, _ in asks]), reps, axis=0)  # (npos, T)
    wt = np.repeat(np.stack([ev.wt for ev, _ in asks]), reps, axis=0)  # (npos, T)
    t_end = np.repeat([ev.t_end for ev, _ in asks], reps)  # (npos,)
    exact = None
    if any(args[3] is not None for _, args in asks):
        e_ex, sx = np.empty((jm, bounds[-1], nt)), np.empty((bounds[-1], nt))  # (J, npos, T), (npos, T)
        for (_, args), a, b in zip(asks, bounds[:-1], bounds[1:]):
            states = args[3]
            if states is None:  # a row without exact tokens: P[N_exact = 0] = 1
                e_ex[:, a:b], sx[a:b] = 0.0, 0.0
            elif isinstance(states, StatesAt):
                states.into(e_ex[:, a:b], sx[a:b])
            else:
                e_ex[:, a:b], sx[a:b] = states[1], states[2]
        exact = (None, e_ex, sx)
    out = np.concatenate([args[1] for _, args in asks])
    out_next = np.concatenate([args[4] for _, args in asks])
    res = _integrals(psum, lam, exact, out, out_next, t, wt, t_end, asks[0][0].t_lo)
    return [tuple(r[a:b] for r in res) for a, b in zip(bounds[:-1], bounds[1:])]


def _integrals(psum, lam, exact, out, out_next, t, wt, t_end, t_lo):
    """Q (and with ``out_next`` the stretch bound coefficients) from the power sums and λ of the
    series tokens, the exact-token states (or None) and the grid: nodes t and weights wt ((1, T), or
    (npos, T) per position), its end t_end (a float or (npos,)) and start t_lo.

    Newton's identities a e_a = Σ_{j=1..a} (−1)^{j−1} e_{a−j} P_j (e_0 = 1), P[N_small = a] = e^{−λ} e_a,
    and P[N ≤ m] = Σ_b P[N_exact = b] P[N_small ≤ m − b]; in-place ufuncs on (npos, T) arrays (the
    same operations on the same operands as the plain expressions, so the same values)."""
    jm = psum.shape[1]
    g = np.negative(lam)  # (npos, T)
    np.exp(g, out=g)
    e = [None, psum[:, 0]]  # e_0 = 1, e_1 = P_1
    cum = [g, np.multiply(g, psum[:, 0])]  # P[N_small ≤ c]
    cum[1] += g
    for a in range(2, jm + 1):  # Newton's identities
        acc = e[a - 1] * psum[:, 0]
        term = np.empty_like(acc)
        for j in range(2, a + 1):
            if j == a:
                np.copyto(term, psum[:, j - 1])
            else:
                np.multiply(e[a - j], psum[:, j - 1], out=term)
            if j % 2:
                acc += term
            else:
                acc -= term
        acc /= a
        e.append(acc)
        np.multiply(g, acc, out=term)
        term += cum[-1]
        cum.append(term)
    if exact is None:
        at_most = cum  # P[N ≤ m], m = 0..J
    else:
        _, e_ex, sx = exact
        p0 = np.negative(sx)  # P[N_exact = b] = e^{−Σx} e_b = e'_b e^{45 b − Σx}
        np.exp(p0, out=p0)
        p_exact = [p0]
        if float(sx.max(initial=0.0)) <= _EXP_SAFE:  # e^{−Σx} a normal float: products, no logarithms
            for b in range(1, jm + 1):
                pb = np.multiply(p0, math.exp(b * _X_CAP))
                pb *= e_ex[b - 1]
                p_exact.append(pb)
        else:
            with np.errstate(divide="ignore"):
                p_exact += [np.exp(np.log(e_ex[b - 1]) + b * _X_CAP - sx) for b in range(1, jm + 1)]
        levels = range(max(0, jm - 2), jm + 1) if out_next is not None else (jm,)  # those used below
        at_most = {}
        term = np.empty_like(p0)
        for m in levels:
            acc = p0 * cum[m]
            for b in range(1, m + 1):
                np.multiply(p_exact[b], cum[m - b], out=term)
                acc += term
            at_most[m] = acc
    decay = np.multiply(out[:, None], t)  # (npos, T)
    np.negative(decay, out=decay)
    np.exp(decay, out=decay)
    decay *= wt
    rest = np.subtract(1.0, at_most[jm])  # (npos, T)
    q_mass = np.einsum("pt,pt->p", decay, rest)
    q_mass *= out
    q_mass += np.exp(-out * t_end)
    np.clip(q_mass, 0.0, 1.0, out=q_mass)
    if out_next is None:
        return q_mass
    bound = _stretch_bound(out, out_next, at_most[jm], at_most[jm - 1], at_most[jm - 2], t, wt, t_end, t_lo,
                           work=(decay, rest))
    return (q_mass,) + bound


def _stretch_bound(out, out_next, below_k, below_k1, below_k2, t, wt, t_end, t_lo, work=None):
    """D1, C2, C3 of the stretch bound from P[N ≤ K−1], P[N ≤ K−2], P[N ≤ K−3] at its start:
    Q ≤ Q_s + D1 x + C2 x²/2 + C3 x³/6 with (grid quadrature, plus the parts below t_lo bounded
    with P ≤ 1, beyond t_end with P ≤ P[N < K](last node), P[N < K] falling in t, and the factor
    (1 − out_e t) by 1)
    D1 = ∫ (1 − out_e t) e^{−out_e t} P[N < K] + out_s ∫ t e^{−out_e t} P[N = K−1],
    C2 = out_s ∫ t² e^{−out_e t} P[N = K−2], C3 = out_s ∫ t³ e^{−out_e t} P[N ≤ K−3]
    (P[N_S ≥ j] ≤ (xt)^j / j! for the tokens S added). ``work``: two scratch arrays of P's shape
    (npos, T), overwritten."""
    oe = out_next[:, None]
    decay, diff = work if work is not None else (np.empty(below_k.shape), np.empty(below_k.shape))  # (npos, T)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        x = oe * t  # (npos, T)
        np.negative(x, out=decay)
        np.exp(decay, out=decay)
        decay *= wt
        tail = np.exp(-out_next * t_end) * below_k[:, -1]
        inv = 1.0 / out_next
        tail_moment = [tail * inv]  # ∫_{t_end}^∞ t^m e^{−out_e t} dt, m = 0..3
        t_end_power = np.asarray(t_end, dtype=np.float64)  # t_end^m: inf (not OverflowError) on very long grids
        for m in range(1, 4):
            tail_moment.append(t_end_power**m * tail * inv + m * inv * tail_moment[-1])
        np.subtract(1.0, x, out=x)
        x *= below_k
        a = np.einsum("pt,pt->p", decay, x) + t_lo + tail_moment[0]
        decay *= t
        np.subtract(below_k, below_k1, out=diff)
        b = np.einsum("pt,pt->p", decay, diff) + t_lo**2 / 2 + tail_moment[1]
        decay *= t
        np.subtract(below_k1, below_k2, out=diff)
        c2 = np.einsum("pt,pt->p", decay, diff) + t_lo**3 / 3 + tail_moment[2]
        decay *= t
        c3 = np.einsum("pt,pt->p", decay, below_k2) + t_lo**4 / 4 + tail_moment[3]
        finite = out_next > 0  # a NaN (inf · 0 on very long grids) is no bound either: inf
        return tuple(np.where(finite & ~np.isnan(x), x, np.inf) for x in (a + out * b, out * c2, out * c3))
