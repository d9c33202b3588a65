"""Batched measurement engine: α* for every draft law and K, and every closed-form verifier's
acceptance, for a batch of positions ``(B, V)`` in torch (CPU or CUDA), float64 throughout.

One ordering per row serves every law, K and verifier: the tokens sorted by the ratio
``r = p/q`` (``q = 0`` last), with prefix sums ``Pc[j] = Σ_{l<j} p``, ``Qc[j] = Σ_{l<j} q`` of the
sorted row. Every quantity below is then a handful of prefix sums looked up by a binary search
(``n(μ) = #{r < μ}``), except the few elementwise sums stated. Write
``h(μ) = Σ (p − μ q)_+ = Ps[n(μ)] − μ Qs[n(μ)]`` with the suffix sums ``Ps``, ``Qs`` (summed from the
tail, so that tiny tails keep their relative accuracy).

* **α\\* with replacement** (Hu et al. 2502.18779, Theorem 3.1; prefix form):
  ``1 + min(0, min_j Pc[j] − Qc[j]^K)``, prefixes with ratio ≤ K only (beyond, adding a token
  raises the value).
* **α\\* without replacement**: K = 2 in closed form on the same prefixes,
  ``Q(H) = s − (1 − s) Σ_{i∈H} q_i/(1 − q_i)`` (:mod:`otbound._wor`; ``1 − q_i`` of a token with
  ``q_i > 1/2`` is the other tokens' mass summed directly, as in ``PairMass``); K ≥ 3 the
  exponential-clock integral of :func:`otbound.optimal_acceptance` (its bucketed branch and bound,
  per row on the CPU, called through the law's routine on the already checked batch).
* **α\\*_greedy** ``= p(G) + Σ_{x∉G} min(p, q')``, ``G`` the K − 1 largest q (ties to the lower
  index), ``q' = q/(1 − q(G))`` off G: ``Σ_x min(p, c q) = Pc[n(c)] + c Qs[n(c)]`` minus the
  G terms. The ``greedy`` verifier's acceptance is this same closed form; SpecHub's (K = 2) is too,
  since its per-token acceptance off the hub ``min(p, q) + min((p − q)_+, q(a) q')`` equals
  ``min(p, q')`` (:mod:`otbound.token.verifiers._greedy`).
* **nss** (i.i.d. drafts): ``Σ p (1 − (1 − q)^K) = Σ_{j=1}^K (−1)^{j+1} C(K, j) Σ p q^j`` (moments).
* **rrs** (SpecInfer): the residuals are ``p_i = (p − μ_i q)_+ / h(μ_i)`` with ``μ_1 = 0``,
  ``μ_{i+1} = μ_i + h(μ_i)``; round i rejects with probability ``h(μ_{i+1})/h(μ_i)``, and the final
  residual lives where ``r > μ_{K+1}`` while rejected drafts have ``r < μ_{K+1}``, so the recursion
  of :class:`otbound.token.verifiers.RRSVerifier` collapses to ``α = 1 − h(μ_{K+1})`` (derived here;
  checked against the recursion to 1e-12 in the tests).
* **kseq** (SpecTr K-SEQ at ρ\\*): ``β(ρ) = Pc[n(ρ)]/ρ + Qs[n(ρ)]``, ρ\\* by the same bisection
  as :func:`otbound.token.verifiers.kseq_rho`, ``α = 1 − (1 − β(ρ*))^K``: the coincidence term of
  :class:`otbound.token.verifiers.KSeqVerifier`'s closed form is at most ``|p_acc(ρ*) − ρ* β(ρ*)|``
  (float64 resolution of the root, ~1e-16; derived: it carries the factor ``1 − γ/ρ*`` and a mass
  ``≤ ρ* β``).
* **rrs_wor** (RRS without replacement, Jeon et al. 2402.14160): after rejecting ``x_1..x_{i−1}``
  the target residual is ``(p − μ_i q)_+/h(μ_i)`` and the draft law ``q/S_i`` off the rejected
  tokens (``S_i = 1 − Σ q(x_j)``), with ``μ_{i+1} = μ_i + h(μ_i)/S_i``; rejected tokens have
  ``r < μ_i`` and carry no residual mass, so ``α = 1 − P(all K rejected)`` and round i rejects
  with ``ρ_i = (Qc[n(μ_{i+1})] − q(R))/S_i − Σ_{μ_i ≤ r < μ_{i+1}} (p − μ_i q)/h(μ_i)``. K ≤ 2:
  exact, summing over every first draft. K ≥ 3: Monte Carlo with ``mc_samples`` paths per position,
  Rao–Blackwellised: the rejected drafts ``x_1..x_{K−1}`` are drawn from their conditional law
  given rejection (inverse CDF by binary search on the prefix sums) and the path's weight is
  ``Π ρ_i`` (the last round exactly), an unbiased estimate of P(all rejected) with far less
  variance than counting accepted samples. One set of paths of max K rounds serves every K ≥ 3:
  K's estimate uses the paths' first K rounds (so the estimates of different K are correlated).

Tolerances: laws are checked and renormalised as everywhere (``LAW_ATOL = 1e-6``); every exact
value agrees with the per-row implementations to float64 summation error (the tests demand 1e-9
on random, adversarial and V = 151,936 rows; 1e-12 for α* without replacement, measured ≤ 1e-15).

Speed (``experiments/bench_engine.py``): on the CPU the ordering is one unsigned-integer sort of
the ratio's bit pattern with the index in its low bits (:func:`_ratio_order`; ``torch.sort`` costs
16× ``np.sort`` for float64 on one core, numpy's ``argsort`` 2.6×), and the K ≥ 3 clock integral
runs on the sorted rows; on CUDA the ordering is a stable ``torch.sort``. A batch's working set is
a dozen (B, V) float64 arrays (≈ 20 MB each for 16 rows at V = 151,936), which glibc's malloc
maps afresh and returns to the OS on every call: the page faults cost about a quarter of the
engine's CPU time. The first call therefore asks glibc to keep freed memory for reuse
(:func:`_retain_freed_memory`; the process keeps its peak heap; ``OTBOUND_KEEP_FREED_MEMORY=0``
leaves glibc's settings alone, at 4–7 ms more per position).
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, field

import numpy as np

from otbound._validation import LAW_ATOL, SAMPLINGS, InvalidInputError, check_num_drafts, check_sampling
from otbound.token import deterministic_acceptance
from otbound.token.draft_laws import greedy_split

#: verifiers the engine computes itself (the rest go through their per-row ``acceptance``).
ENGINE_VERIFIERS = {"nss": "with_replacement", "rrs": "with_replacement", "rrs_wor": "without_replacement",
                    "kseq": "with_replacement", "spechub": "greedy", "greedy": "greedy"}
#: bytes of working memory per (row, token) (a dozen float64 / int64 rows): chunks rows accordingly.
_BYTES_PER_CELL = 112


@dataclass
class BatchMeasurement:
    """Per-position results of :func:`measure_batch`; every tensor has shape ``(B,)``, float64, on
    the input's device.

    optimal: ``{sampling: {K: α*}}``.
    verifiers: ``{name: {K: acceptance}}``; ``methods[name][K]`` is ``"exact"`` or ``"monte_carlo"``
    (then with ``mc_samples`` Rao–Blackwellised paths per position).
    skipped: ``{name: {K: reason}}`` for verifiers that do not apply (e.g. SpecHub at K > 2).
    """

    optimal: dict = field(default_factory=dict)
    verifiers: dict = field(default_factory=dict)
    methods: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    mc_samples: int = 0


def _torch():
    import torch

    return torch


def check_laws_torch(p, q):
    """``(p, q)`` as checked, renormalised float64 tensors of shape (B, V) (same rules and
    messages as :func:`otbound._validation.as_law`)."""
    torch = _torch()
    out = []
    for name, x in (("p", p), ("q", q)):
        x = torch.as_tensor(x).to(torch.float64)
        if x.ndim != 2:
            raise InvalidInputError(f"{name} must be 2-D (positions × V), got shape {tuple(x.shape)}")
        if x.shape[-1] == 0:
            raise InvalidInputError(f"{name} has an empty vocabulary axis (shape {tuple(x.shape)})")
        s = x.sum(dim=1, keepdim=True)
        # one pass each for the common case: a finite non-negative row has a finite sum and min ≥ 0
        if x.numel() and not (bool(torch.isfinite(s).all()) and float(x.amin()) >= 0.0):
            if not bool(torch.isfinite(x).all()):
                bad = torch.nonzero(~torch.isfinite(x))[0].tolist()
                raise InvalidInputError(f"{name} has a NaN or infinite entry at index {tuple(bad)}")
            bad = torch.nonzero(x < 0)[0].tolist()
            raise InvalidInputError(f"{name} has a negative entry {float(x[tuple(bad)])!r} at index {tuple(bad)}")
        err = (s - 1.0).abs()
        if bool((err > LAW_ATOL).any()):
            row = int(torch.argmax(err))
            raise InvalidInputError(f"{name} does not sum to 1 (row ({row},) sums to {float(s[row, 0]):.9g}; "
                                    f"tolerance {LAW_ATOL:g})")
        out.append(x / s)
    if out[0].shape != out[1].shape:
        raise InvalidInputError(
            f"p and q must have the same shape, got {tuple(out[0].shape)} and {tuple(out[1].shape)}")
    return out[0], out[1]


def _ratio(p, q):
    """p/q with q = 0 mapped to +inf (0/0 and x/0 alike: last) and −0 to +0 (non-negative floats
    sort as their bit patterns)."""
    return (p / q).masked_fill_(q == 0, math.inf).add_(0.0)


def _index_bits(v: int) -> int:
    return max(1, (v - 1).bit_length())


def _ratio_order(r):
    """Per row of ``r`` (non-negative float64, numpy; overwritten: the result lives in its memory),
    the indices sorting it by (ratio, index) up to near ties: one unsigned-integer sort (numpy's
    ``argsort`` costs 2.6× ``np.sort`` here, its stable kind 17×). A key is the ratio's bit pattern
    (monotone for non-negative floats) with its low ⌈log2 V⌉ bits replaced by the index, so ratios
    closer than a relative 2^(⌈log2 V⌉ − 52) may come out of order: :func:`_fix_near_ties`."""
    low = np.uint64((1 << _index_bits(r.shape[1])) - 1)
    key = r.view(np.uint64)
    key &= ~low
    key |= np.arange(r.shape[1], dtype=np.uint64)
    key.sort(axis=1)
    key &= low
    return key.view(np.int64)


def _fix_near_ties(r, r_in_order, order):
    """Re-sort one row's ``order`` (from :func:`_ratio_order`) exactly by (ratio, index) within its
    runs of equal truncated ratio, where a descent can lie; in place. ``r``: the row's ratios,
    ``r_in_order``: the same in the given order."""
    run = r_in_order.view(np.uint64) >> np.uint64(_index_bits(order.size))
    tied = np.flatnonzero(run[1:] == run[:-1])
    pos = np.union1d(tied, tied + 1)  # every element of a run of length ≥ 2, in increasing order
    sub = order[pos]
    order[pos] = sub[np.lexsort((sub, r[sub], run[pos]))]


class _Sorted:
    """A batch sorted by ratio p/q (ties by index) with prefix sums (module docstring)."""

    def __init__(self, p, q):
        torch = _torch()
        if p.device.type == "cpu":
            order = torch.from_numpy(_ratio_order(_ratio(p, q).numpy()))
        else:
            order = torch.sort(_ratio(p, q), dim=1, stable=True).indices
        self.ps, self.qs = (torch.gather(x, 1, order) for x in (p, q))
        self.r = _ratio(self.ps, self.qs)  # the same divisions, in sorted order
        if p.device.type == "cpu":
            for row in torch.nonzero((self.r[:, 1:] < self.r[:, :-1]).any(1)).flatten().tolist():
                r = _ratio(p[row], q[row])
                _fix_near_ties(r.numpy(), self.r[row].numpy(), order[row].numpy())
                self.ps[row], self.qs[row], self.r[row] = p[row, order[row]], q[row, order[row]], r[order[row]]
        self.v = p.shape[1]
        self.pc, self.qc = self._prefix(self.ps), self._prefix(self.qs)
        # suffix sums summed from the tail (exact in relative terms where they are tiny and get
        # multiplied by a large μ or c; never 1 − prefix), stored reversed: rsuf[:, i] = the last i
        self._prs, self._qrs = self._prefix(self.ps.flip(1)), self._prefix(self.qs.flip(1))
        self.q_tot = self.qc[:, -1:]

    def row(self, i):
        """The same structure for row ``i`` alone (shape (1, V))."""
        view = copy.copy(self)
        for name in ("r", "ps", "qs", "pc", "qc", "_prs", "_qrs", "q_tot"):
            setattr(view, name, getattr(self, name)[i : i + 1])
        return view

    @staticmethod
    def _prefix(x):
        torch = _torch()
        out = torch.empty((x.shape[0], x.shape[1] + 1), dtype=x.dtype, device=x.device)
        out[:, 0] = 0.0
        torch.cumsum(x, 1, out=out[:, 1:])
        return out

    def psuf(self, n):
        """Σ_{l ≥ n} p of the sorted row (n: positions, (B, m))."""
        return _torch().gather(self._prs, 1, self.v - n)

    def qsuf(self, n):
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
        """Σ min(p, c q) per row, c of shape (B, m)."""
        n = self.count_below(c)
        return self.at(self.pc, n) + c * self.qsuf(n)

    def prefix_limit(self, bound):
        """Smallest column count covering every prefix with ratio ≤ bound (B,) in every row."""
        return int(self.count_below(bound.reshape(-1, 1) * (1 + 1e-12)).max()) + 1


def measure_batch(p, q, num_drafts=(2, 3, 4), *, samplings=SAMPLINGS, verifiers=tuple(ENGINE_VERIFIERS),
                  mc_samples: int = 64, seed=0) -> BatchMeasurement:
    """α* for ``samplings`` and each K, and the acceptance of each verifier in ``verifiers``
    (names in :data:`ENGINE_VERIFIERS`), for laws ``p``, ``q`` of shape (B, V) (torch tensors on
    any device, or numpy arrays: then on the CPU). See the module docstring for the formulas.
    The first call keeps glibc from returning freed memory to the OS (:func:`_retain_freed_memory`)."""
    torch = _torch()
    _retain_freed_memory()
    p, q = check_laws_torch(p, q)
    ks = [check_num_drafts(k) for k in np.atleast_1d(num_drafts).tolist()]
    if not ks:
        raise InvalidInputError("num_drafts must list at least one number of drafts K")
    for s in samplings:
        check_sampling(s)
    unknown = [v for v in verifiers if v not in ENGINE_VERIFIERS]
    if unknown:
        raise InvalidInputError(f"the engine does not compute {unknown}; it computes {sorted(ENGINE_VERIFIERS)}")
    laws = set(samplings) | {ENGINE_VERIFIERS[v] for v in verifiers}
    support = int((q > 0).sum(1).min()) if q.shape[0] else q.shape[1]
    for law in laws - {"with_replacement"}:
        for k in ks:
            if k > support:
                raise InvalidInputError(
                    f"num_drafts={k} exceeds the support of q ({support} tokens with q > 0): "
                    f"the {law} law needs K distinct tokens of positive draft mass")
    res = BatchMeasurement(mc_samples=int(mc_samples))
    if p.shape[0] == 0:
        empty = torch.zeros(0, dtype=torch.float64, device=p.device)
        res.optimal = {s: {k: empty for k in ks} for s in samplings}
        res.verifiers = {v: {k: empty for k in ks} for v in verifiers}
        return res
    srt = _Sorted(p, q)
    kt = torch.tensor(ks, dtype=torch.float64, device=p.device)
    wr = _with_replacement(srt, ks)
    greedy = _greedy(p, q, srt, ks) if ("greedy" in laws) else None
    for s in samplings:
        if s == "with_replacement":
            res.optimal[s] = wr
        elif s == "greedy":
            res.optimal[s] = greedy
        elif s == "deterministic":  # p(top-K(q)), otbound.token._deterministic
            res.optimal[s] = {k: deterministic_acceptance(p, q, k) for k in ks}
        else:
            res.optimal[s] = _without_replacement(p, q, srt, ks, wr)
    gen = torch.Generator(device=p.device)
    seq = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    gen.manual_seed(int(seq.generate_state(1, np.uint64)[0] >> np.uint64(1)))
    for name in verifiers:
        res.verifiers[name], res.methods[name] = {}, {}
        for k in ks:
            if name == "spechub" and k > 2:
                res.skipped.setdefault(name, {})[k] = f"verifier 'spechub' supports at most 2 drafts, got K = {k}"
                continue
            res.methods[name][k] = "exact"
        if name == "nss":
            vals = _nss(p, q, ks)
        elif name == "rrs":
            vals = _rrs(srt, ks)
        elif name == "kseq":
            vals = _kseq(srt, kt)
        elif name in ("greedy", "spechub"):
            vals = greedy
        else:
            vals = _rrs_wor(srt, ks, mc_samples, gen)
            for k in ks:
                if k >= 3:
                    res.methods[name][k] = "monte_carlo"
        for k in res.methods[name]:
            res.verifiers[name][k] = vals[k].clamp(0.0, 1.0)
    return res


def _with_replacement(srt, ks):
    torch = _torch()
    out = {}
    for k in ks:
        m = srt.prefix_limit(torch.full((srt.r.shape[0],), float(k), dtype=torch.float64, device=srt.r.device))
        m = min(m, srt.pc.shape[1])
        f = srt.pc[:, :m] - _power(srt.qc[:, :m], k)  # column 0 is the empty set: f = 0
        out[k] = (1.0 + f.min(1).values.clamp(max=0.0)).clamp(0.0, 1.0)
    return out


def _without_replacement(p, q, srt, ks, wr):
    """K = 1: with replacement; K = 2 closed form on the sorted prefixes; K ≥ 3 the clock integral
    (:func:`otbound.token.bounds.without_replacement_ratio_sorted`, per row on the CPU, on the rows
    as sorted here: its bucket sums are runs of the sorted row. The laws and the support were
    checked above, so :func:`otbound.optimal_acceptance`'s checks are not repeated per K)."""
    torch = _torch()
    from otbound.token.bounds import without_replacement_ratio_sorted

    out = {}
    rows = None
    for k in ks:
        if k == 1:
            out[k] = wr[k]
        elif k == 2:
            top = torch.topk(q, 1, dim=1).values[:, 0]
            m = min(srt.prefix_limit(2.0 / (1.0 - top).clamp_min(1e-300)), srt.pc.shape[1])
            qs = srt.qs[:, : m - 1]
            rest = 1.0 - qs
            big = qs > 0.5  # at most one per row: 1 − q as the other tokens' mass summed directly (as PairMass)
            if bool(big.any()):
                rest = torch.where(big, srt.qc[:, : m - 1] + srt.qsuf_range(1, m), rest)
            odds = torch.cumsum(qs / rest, 1)
            s = srt.qc[:, 1:m]
            mass = s - srt.qsuf_range(1, m) * odds
            f = srt.pc[:, 1:m] - mass.clamp(0.0, 1.0)
            out[k] = (1.0 + f.min(1).values.clamp(max=0.0)).clamp(0.0, 1.0)
        else:
            rows = (srt.ps.cpu().numpy(), srt.qs.cpu().numpy()) if rows is None else rows
            out[k] = torch.as_tensor(without_replacement_ratio_sorted(*rows, k), dtype=torch.float64, device=p.device)
    return out


def _greedy(p, q, srt, ks):
    """α*_greedy for every K (module docstring); G by ``topk`` with ties at its edge resolved to the
    lower index as in :func:`otbound.greedy_split`."""
    torch = _torch()
    b = q.shape[0]
    m = max(ks) - 1
    out = {}
    if m > 0:
        vals, idx = torch.topk(q, m, dim=1)
        # ties cut at the edge of the top-m: take the lowest indices among the tied values
        edge = vals[:, -1:]
        tied = ((q == edge).sum(1) != (vals == edge).sum(1)) | (vals[:, 1:] == vals[:, :-1]).any(1)
        for row in torch.nonzero(tied).flatten().tolist():
            idx[row] = torch.as_tensor(greedy_split(q[row].cpu().numpy(), m + 1)[0], device=q.device)
        pg, qg = torch.gather(p, 1, idx), torch.gather(q, 1, idx)
        # q-mass outside G: summed directly where it may be tiny (q(G) > 1/2; never as 1 − q(G)),
        # elsewhere the difference of two sums is as accurate
        in_g = qg.sum(1, keepdim=True)
        outside = q.sum(1, keepdim=True) - in_g
        direct = torch.nonzero(in_g[:, 0] > 0.5).flatten()
        if direct.numel():
            outside[direct] = q[direct].scatter(1, idx[direct], 0.0).sum(1, keepdim=True)
        rest = outside + torch.flip(torch.cumsum(torch.flip(qg, [1]), 1), [1])  # rest[:, j]: outside the top j
    for k in ks:
        if k == 1:
            out[k] = srt.min_sum(torch.ones(b, 1, dtype=torch.float64, device=q.device))[:, 0].clamp(0.0, 1.0)
            continue
        g_p, g_q = pg[:, : k - 1], qg[:, : k - 1]
        c = 1.0 / (rest[:, k - 1 : k] if k - 1 < m else outside)
        val = g_p.sum(1) + srt.min_sum(c)[:, 0] - torch.minimum(g_p, c * g_q).sum(1)
        out[k] = val.clamp(0.0, 1.0)
    return out


def _power(x, k: int):
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


def _nss(p, q, ks):
    moments, w = [], p * q
    for j in range(max(ks)):
        if j:
            w.mul_(q)
        moments.append(w.sum(1))
    return {k: sum((-1) ** (j + 1) * math.comb(k, j) * moments[j - 1] for j in range(1, k + 1)) for k in ks}


def _rrs(srt, ks):
    torch = _torch()
    b = srt.r.shape[0]
    mu = torch.zeros(b, 1, dtype=torch.float64, device=srt.r.device)
    h = srt.h(mu)
    out = {}
    for i in range(1, max(ks) + 1):
        mu = mu + h
        h = srt.h(mu)
        if i in ks:
            out[i] = 1.0 - h[:, 0]
    return out


def _kseq(srt, kt):
    """Batched bisection for ρ* (as :func:`otbound.token.verifiers.kseq_rho`), all K at once."""
    torch = _torch()
    b = srt.r.shape[0]
    k = kt.reshape(1, -1).expand(b, -1).contiguous()

    def beta(rho):
        n = srt.count_below(rho)
        return srt.at(srt.pc, n) / rho + srt.qsuf(n)

    def p_acc(bt):
        return torch.where(bt < 1.0, -torch.expm1(k * torch.log1p(-bt.clamp(max=1.0))), torch.ones_like(bt))

    def f(rho):
        bt = beta(rho)
        return p_acc(bt) - rho * bt

    lo = torch.ones_like(k)
    hi = k.clone()
    done = f(lo) <= 0.0
    hi = torch.where(done, lo, hi)
    while not bool(done.all()):
        mid = 0.5 * (lo + hi)
        stop = (mid <= lo) | (mid >= hi)
        done = done | stop
        pos = f(mid) > 0.0
        lo = torch.where(~done & pos, mid, lo)
        hi = torch.where(~done & ~pos, mid, hi)
    vals = p_acc(beta(hi))
    return {int(kk): vals[:, i] for i, kk in enumerate(kt.tolist())}


def _rrs_wor(srt, ks, mc_samples, gen):
    """α of RRS without replacement (module docstring) for every K in ``ks``: exact for K ≤ 2; for
    K ≥ 3 Monte Carlo on one set of ``mc_samples`` paths of max K rounds, each K's estimate from
    the paths' first K rounds (a draft's law does not depend on how many drafts follow it, so the
    first K rounds of a path are a path for K drafts)."""
    torch = _torch()
    b, v = srt.r.shape
    dev = srt.r.device
    f64 = torch.float64
    out = {}
    mu1 = torch.zeros(b, 1, dtype=f64, device=dev)
    h1 = srt.h(mu1)
    if 1 in ks:
        out[1] = 1.0 - _reject(srt, mu1, h1, torch.ones_like(mu1), torch.zeros_like(mu1))[:, 0]
    # round 1 from the start state (μ = 0, S = 1, nothing removed), then one state per first draft
    if 2 in ks:
        mu2 = mu1 + h1
        h2 = srt.h(mu2)
        n_mu2 = srt.count_below(mu2)
        n1 = int(n_mu2.max())  # first drafts that can be rejected: r < μ_2
        qx = srt.qs[:, :n1]
        w1 = (qx - srt.ps[:, :n1] / h1).clamp_min(0.0)  # rejection weight of each first draft
        s2 = srt.qc[:, :n1] + srt.qsuf_range(1, n1 + 1)  # Σ_{x ≠ x_1} q
        out[2] = 1.0 - (w1 * _reject_first_drafts(srt, mu2, h2, s2, qx, n_mu2)).sum(1)
    k = max(ks)
    if k < 3:
        return out
    n = int(mc_samples)
    shape = (b, n)
    mu = mu1.expand(shape).contiguous()
    h = h1.expand(shape).contiguous()
    s = srt.q_tot.expand(shape).contiguous()
    removed_pos = torch.full((b, n, k), v + 1, dtype=torch.int64, device=dev)
    removed_q = torch.zeros((b, n, k), dtype=f64, device=dev)
    weight = torch.ones(shape, dtype=f64, device=dev)
    for i in range(k):
        q_rem = removed_q.sum(2)
        rho = _reject(srt, mu, h, s, q_rem)
        weight = weight * rho
        if i + 1 >= 3 and i + 1 in ks:
            out[i + 1] = 1.0 - weight.mean(1)
        if i == k - 1:
            break
        mu_next = mu + torch.where(h > 0, h / s, torch.zeros_like(h))
        u = torch.rand(shape, generator=gen, dtype=f64, device=dev) * rho
        pos = _draw_rejected(srt, mu, h, s, mu_next, removed_pos, removed_q, u)
        qx = torch.gather(srt.qs, 1, pos)
        removed_pos[:, :, i] = pos
        removed_q[:, :, i] = qx
        s = s - qx
        mu = mu_next
        h = srt.h(mu)
    return out


def _reject_first_drafts(srt, mu2, h2, s2, qx, n_mu2, per_row=None):
    """ρ_2 of every first draft x_1 (states (B, m): S_2 = s2, q(x_1) = qx; μ_2, h_2 and n(μ_2) per row).

    μ_3 = μ_2 + h_2/S_2 ≥ μ_2 + h_2, and for most first drafts (q(x_1) tiny, S_2 ≈ 1) no ratio lies in
    [μ_2 + h_2, μ_3): then n(μ_3) is the row's n(μ_2 + h_2) and :func:`_reject` reduces to
    ``(Qc[n] − q(x_1))/S_2 − D`` with D per row. The others take :func:`_reject` itself: row by row
    (``per_row``, default on the CPU) or all at once (default on an accelerator).
    """
    torch = _torch()
    live = h2 > 0
    safe_h = torch.where(live, h2, torch.ones_like(h2))
    base = srt.count_below(mu2 + h2)
    q_hi, q_lo = srt.at(srt.qc, base), srt.at(srt.qc, n_mu2)
    d = ((srt.at(srt.pc, base) - srt.at(srt.pc, n_mu2)) - mu2 * (q_hi - q_lo)) / safe_h
    rho = ((q_hi - qx) / s2 - d).clamp_(0.0, 1.0)
    v = srt.r.shape[1]  # the ratio after the first n(μ_2 + h_2) tokens (inf past the last)
    r_next = torch.gather(srt.r, 1, base.clamp(max=v - 1)).masked_fill_(base >= v, math.inf)
    # μ_3 > r_next ⟺ h_2/S_2 > r_next − μ_2 (S_2 > 0 for every drawable first draft)
    far = (h2 > (r_next - mu2) * s2) & live
    if per_row is None:
        per_row = s2.device.type == "cpu"
    if per_row:
        for row in torch.nonzero(far.any(1)).flatten().tolist():
            sel = far[row]
            rho[row, sel] = _reject(srt.row(row), mu2[row : row + 1], h2[row : row + 1], s2[row : row + 1, sel],
                                    qx[row : row + 1, sel], n_mu2[row : row + 1])[0]
    else:  # on an accelerator one general round over every first draft beats a per-row loop
        rho = torch.where(far, _reject(srt, mu2.expand_as(s2), h2.expand_as(s2), s2, qx, n_mu2), rho)
    return rho if bool(live.all()) else torch.where(live, rho, torch.zeros_like(rho))


def _reject(srt, mu, h, s, q_removed, n0=None, n1=None):
    """ρ = P(reject) of a round in state (μ, h = h(μ), S, q-mass of the rejected drafts); all (B, m).
    ``n0``, ``n1``: n(μ) and n(μ + h/S) if already known."""
    torch = _torch()
    live = (h > 0) & (s > 0)
    safe_h = torch.where(live, h, torch.ones_like(h))
    safe_s = torch.where(live, s, torch.ones_like(s))
    mu_next = mu + h / safe_s
    n0 = srt.count_below(mu) if n0 is None else n0
    n1 = srt.count_below(mu_next) if n1 is None else n1
    q_lo, q_hi = srt.at(srt.qc, n0), srt.at(srt.qc, n1)
    band = (srt.at(srt.pc, n1) - srt.at(srt.pc, n0)) - mu * (q_hi - q_lo)
    rho = (q_hi - q_removed) / safe_s - band / safe_h
    return torch.where(live, rho.clamp(0.0, 1.0), torch.zeros_like(rho))


def _draw_rejected(srt, mu, h, s, mu_next, removed_pos, removed_q, u):
    """Sorted position of a draft drawn from the rejected-draft law of the state, by binary search
    for ``u`` in its cumulative weight ``W(m) = (Qc[m] − q(R ∩ [0, m)))/S − D(m)/h``."""
    torch = _torch()
    n0 = srt.count_below(mu)
    lo = torch.zeros_like(n0)
    hi = srt.count_below(mu_next)
    pc0, qc0 = srt.at(srt.pc, n0), srt.at(srt.qc, n0)
    safe_h = torch.where(h > 0, h, torch.ones_like(h))

    def cum(m):
        qm, pm = srt.at(srt.qc, m), srt.at(srt.pc, m)
        rem = (removed_q * (removed_pos < m.unsqueeze(2))).sum(2)
        d = torch.where(m > n0, (pm - pc0) - mu * (qm - qc0), torch.zeros_like(qm))
        return (qm - rem) / s - d / safe_h

    while bool((hi - lo > 1).any()):
        mid = (lo + hi) // 2
        below = cum(mid) <= u
        lo = torch.where(below, mid, lo)
        hi = torch.where(below, hi, mid)
    return lo


@functools.lru_cache(maxsize=None)
def _retain_freed_memory() -> bool:
    """Once per process, on glibc, unless ``OTBOUND_KEEP_FREED_MEMORY=0``: serve allocations up to
    32 MiB (glibc's largest threshold) from the heap instead of fresh mappings, and keep up to 1 GiB
    of freed heap instead of returning it to the OS (``mallopt(M_MMAP_THRESHOLD)``,
    ``mallopt(M_TRIM_THRESHOLD)``), so the engine's arrays reuse pages already mapped instead of
    faulting in new zeroed ones on every call (what ``MALLOC_MMAP_THRESHOLD_`` /
    ``MALLOC_TRIM_THRESHOLD_`` in the environment, or jemalloc, would do). Returns whether it
    applied; elsewhere a no-op."""
    import ctypes
    import os
    import sys

    if not sys.platform.startswith("linux") or os.environ.get("OTBOUND_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_trim_threshold, 1 << 30)) and bool(mallopt(m_mmap_threshold, 32 << 20))


def default_batch_size(vocab: int, device) -> int:
    """Positions per engine call: about 256 MB of working memory on the CPU, 8 GB on a GPU."""
    budget = 8 * 2**30 if str(device).startswith("cuda") else 256 * 2**20
    return max(1, budget // (_BYTES_PER_CELL * max(vocab, 1)))


def measure_rows(p, q, num_drafts=(2, 3, 4), *, samplings=SAMPLINGS, verifiers=tuple(ENGINE_VERIFIERS),
                 mc_samples: int = 64, seed=0, device=None, batch_size: int | None = None) -> BatchMeasurement:
    """:func:`measure_batch` over any number of rows (numpy or torch), ``batch_size`` rows per call on
    ``device`` (default: the device of a tensor ``p``, else the CPU); results as CPU tensors.

    The Monte Carlo stream of chunk ``c`` is seeded by ``(seed, c)``, so results do not depend on
    the device but do on ``batch_size``."""
    torch = _torch()
    if device is None:
        device = p.device if isinstance(p, torch.Tensor) else "cpu"
    p = torch.as_tensor(p, dtype=torch.float64)
    q = torch.as_tensor(q, dtype=torch.float64)
    if p.ndim == 1:
        p, q = p.reshape(1, -1), q.reshape(1, -1)
    b = default_batch_size(p.shape[-1], device) if batch_size is None else int(batch_size)
    if b < 1:
        raise InvalidInputError(f"batch_size must be a positive integer, got {batch_size!r}")
    parts = []
    seeds = np.random.SeedSequence(seed).spawn(max(1, -(-p.shape[0] // b)))
    for c, start in enumerate(range(0, max(p.shape[0], 1), b)):
        parts.append(measure_batch(p[start : start + b].to(device), q[start : start + b].to(device), num_drafts,
                                   samplings=samplings, verifiers=verifiers, mc_samples=mc_samples, seed=seeds[c]))
    out = BatchMeasurement(mc_samples=int(mc_samples), methods=parts[0].methods, skipped=parts[0].skipped)
    out.optimal = {s: {k: torch.cat([x.optimal[s][k].cpu() for x in parts]) for k in d}
                   for s, d in parts[0].optimal.items()}
    out.verifiers = {n: {k: torch.cat([x.verifiers[n][k].cpu() for x in parts]) for k in d}
                     for n, d in parts[0].verifiers.items()}
    return out
