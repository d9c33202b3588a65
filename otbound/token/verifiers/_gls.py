"""Gumbel-max list sampling (GLS): K drafts and the target sample coupled through shared exponential clocks.

**Algorithm** (Rowan, Phan, Khisti, arXiv 2506.05632; K = 1 is Daliri et al.'s drafter-invariant
speculative decoding, arXiv 2408.07978): K lists of i.i.d. Exp(1) clocks ``S^(k)_i``; draft
``x_k = argmin_i S^(k)_i / q_i``; output ``Y = argmin_i min_k S^(k)_i / p_i``; accepted iff Y is
one of the drafts. There is no rejection step. Each draft is an exponential race with rates q, so
the drafts are i.i.d. from q (its bound is α* with replacement); ``min_k S^(k)_i ~ Exp(K)``, so Y is
an exponential race with rates p: lossless. Given the clocks, Y does not depend on q
(*drafter invariance*, :func:`otbound.conformance.check_drafter_invariance`).

**Conditional clocks** (derived): given ``x_k``, the race's minimum ``M_k = S^(k)_{x_k} / q_{x_k}``
is Exp(1) and independent of ``x_k``, and by memorylessness ``S^(k)_i = q_i M_k + E^(k)_i`` for
``i ≠ x_k`` with ``E`` i.i.d. Exp(1). :meth:`GumbelListVerifier.sample` draws the clocks so.

**Exact conditional law** (derived). Write ``r_i = p_i / q_i`` (∞ where q_i = 0),
``φ(m) = m + Σ_i (p_i − q_i m)_+`` (piecewise linear, slope ``q({r ≤ m}) ∈ [0, 1]``, ``φ ≥ 1``)
and, for a time w > 0, ``F(w; a) = ∫_a^∞ w e^{−w φ(m)} dm`` (``= E[1{M > w a} e^{−Λ}]`` after
``M = w m``). Before the first draft's own clock ``β = min_k q_{x_k} M_k / p_{x_k}`` rings, the
output's clocks ``W_i = min_k S^(k)_i / p_i`` have hazard ``Λ'(w)`` with
``Λ(w) = Σ_k Σ_i (p_i w − q_i M_k)_+``, and token y's share of it is
``p_y · #{k : q_y M_k < p_y w}``; at β the draft ringing first is emitted if nothing rang before.
Integrating M out (each list's factor separates) gives

    law(y | x̄) = ∫_0^∞ dw [ p_y Σ_k (F(w; r_{x_k}) − F(w; r_y))_+ Π_{j≠k} F(w; r_{x_j})
                           + Σ_{k : x_k = y} r_y e^{−w φ(r_y)} Π_{j≠k} F(w; r_{x_j}) ].

K = 1: the w-integral is closed, ``law(x | x) = r_x / φ(r_x)`` and, for y ≠ x,
``law(y | x) = p_y ∫_{r_x}^{r_y} dm / φ(m)²`` (segment by segment, ``∫_a^b dm/φ² = (b − a)/(φ(a)φ(b))``
on a linear piece), so

    α = Σ_x p_x / φ(r_x) = Σ_x 1 / Σ_i max(p_i / p_x, q_i / q_x),

the probability that the Gumbel-max samples of p and q coincide (Daliri et al.: at least
``(1 − TV)/(1 + TV)``). K ≥ 2: the law and the acceptance are one-dimensional integrals in w of
smooth functions (finite sums of exponentials), computed by adaptive Gauss–Kronrod quadrature
(``scipy.integrate.quad_vec``, absolute tolerance ``QUAD_ATOL``); summing the law over the draft
tuples,

    α = K ∫_0^∞ dw [ A F̄^{K−1} + Σ_y p_y Ḡ_y (F̄^{K−1} − (F̄ − q_y F_y)^{K−1}) ],

with ``F_y = F(w; r_y)``, ``F̄ = Σ_x q_x F_x``, ``A = Σ_x p_x e^{−w φ(r_x)}`` and
``Ḡ_y = Σ_x q_x (F_x − F_y)_+``: O(V log V) per quadrature node, any K, any V.
"""

from __future__ import annotations

import numpy as np

from otbound._validation import check_positive_int
from otbound.token.verifiers._base import PreparedCache, Verifier, _check_laws

#: absolute tolerance of the w-quadrature (K ≥ 2); the laws' total error stays below 1e-13 in the tests.
QUAD_ATOL = 1e-15
QUAD_RTOL = 1e-13


class _Ratios:
    """The ratio-sorted row: breakpoints ρ of φ, φ at them, and the token → position map."""

    def __init__(self, p: np.ndarray, q: np.ndarray):
        v = p.size
        drafted = np.flatnonzero(q > 0)
        r = p[drafted] / q[drafted]
        order = np.argsort(r, kind="stable")
        self.tokens = drafted[order]  # (n,) drafted tokens by ratio
        self.rho = r[order]  # (n,) sorted ratios r = p/q
        qs, ps = q[self.tokens], p[self.tokens]
        slope = np.cumsum(qs)  # (n,) q({r ≤ ρ_j}): φ's slope on [ρ_j, ρ_{j+1}]
        slope[-1] = 1.0
        p_after = np.concatenate([np.cumsum(ps[::-1])[::-1][1:], [0.0]]) + float(p[q == 0].sum())
        self.phi = self.rho * slope + p_after  # (n,) φ(ρ_j) = ρ_j q(r ≤ ρ_j) + p(r > ρ_j)
        self.slope = slope
        self.delta = np.diff(self.rho)  # (n − 1,) segment lengths
        self.pos = np.full(v, -1, dtype=np.int64)  # (V,) position of each token, −1 where q = 0
        self.pos[self.tokens] = np.arange(self.tokens.size)
        self.p, self.q = p, q
        # K = 1: C_j = ∫_{ρ_0}^{ρ_j} dm/φ², tail = ∫_{ρ_last}^∞ dm/φ² = 1/φ(ρ_last)
        self.c = np.concatenate([[0.0], np.cumsum(self.delta / (self.phi[:-1] * self.phi[1:]))])  # (n,)
        self.tail = 1.0 / self.phi[-1]
        self._sd = slope[:-1] * self.delta  # (n − 1,) φ(ρ_{j+1}) − φ(ρ_j)
        # −1/s where it is finite; a slope so small that 1/s overflows (q of the first token near the
        # smallest float) takes the segment's limit (1 − e^{−w s Δ})/s → w Δ instead (f_sorted)
        self._tiny = slope[:-1] * np.finfo(float).max < 1.0  # (n − 1,)
        self._minus_inv_slope = -1.0 / np.where(self._tiny, 1.0, slope[:-1])  # (n − 1,)

    def f_sorted(self, w: float, e_phi: np.ndarray | None = None) -> np.ndarray:
        """``F(w; ρ_j)`` at every breakpoint (n,): suffix sums of the segments' integrals
        ``e^{−w φ(ρ_j)} (1 − e^{−w s_j Δ_j}) / s_j`` (``s_j ≥ q`` of the first token > 0, ``expm1``
        keeps short segments exact), plus the tail ``e^{−w φ(ρ_last)}``. ``e_phi``: ``e^{−w φ}``
        if already computed."""
        if e_phi is None:
            e_phi = np.exp(-w * self.phi)  # (n,)
        seg = np.expm1(-w * self._sd)  # (n − 1,) −(1 − e^{−w s Δ})
        seg *= self._minus_inv_slope
        if self._tiny.any():
            seg[self._tiny] = w * self.delta[self._tiny]
        seg *= e_phi[:-1]
        t = np.empty(self.rho.size)
        t[-1] = e_phi[-1]
        t[:-1] = np.cumsum(seg[::-1])[::-1]
        t[:-1] += e_phi[-1]
        return t

    def f_tokens(self, w: float) -> np.ndarray:
        """``F(w; r_y)`` for every token (V,), 0 where q_y = 0."""
        out = np.zeros(self.p.size)
        out[self.tokens] = self.f_sorted(w)
        return out

    def atom(self, w: float) -> np.ndarray:
        """``r_y e^{−w φ(r_y)}`` for every token (V,), 0 where q_y = 0."""
        out = np.zeros(self.p.size)
        out[self.tokens] = self.rho * np.exp(-w * self.phi)
        return out


def _prod_except(f: np.ndarray) -> np.ndarray:
    """``Π_{j≠k} f[:, j]`` for each k, (n, K), without division."""
    n, k = f.shape
    left = np.ones((n, k))
    right = np.ones((n, k))
    for j in range(1, k):
        left[:, j] = left[:, j - 1] * f[:, j - 1]
        right[:, k - 1 - j] = right[:, k - j] * f[:, k - j]
    return left * right


def _integrate(fun, shape, bound: float):
    """``∫_0^∞ fun(w) dw`` in ``t = log w`` over ``[−log bound − 39, log 80]``, split every
    ``_T_STEP``: each exponential ``e^{−c w}`` of the integrand (``1 ≤ c ≤ φ_max``) is a bump of
    width ~1 in t, so none is missed however far apart the rates are (``φ_max`` reaches ``1e9`` when
    q puts ``1e-9`` on a likely token). ``bound`` bounds the integrand near 0 (``K(1 + φ_max)`` for a
    law, ``K²`` for the acceptance), so the lower end cuts at most ``e^{−39} < 2e-17``; the upper end
    cuts at most ``80^K e^{−80}`` (the integrand decays like ``e^{−K w}``)."""
    import scipy.integrate  # imported here: it costs ~0.2 s at ``import otbound``

    lo, hi = -np.log(bound) - 39.0, np.log(80.0)
    points = np.arange(lo + _T_STEP, hi, _T_STEP)
    value, _ = scipy.integrate.quad_vec(lambda t: np.exp(t) * fun(np.exp(t)), lo, hi, epsabs=QUAD_ATOL,
                                        epsrel=QUAD_RTOL, norm="max", limit=4000, points=points,
                                        quadrature="gk15")
    return np.asarray(value, dtype=np.float64).reshape(shape)


_T_STEP = 3.0


class GumbelListVerifier(Verifier):
    """Gumbel-max list sampling (module docstring): drafts i.i.d. from q, coupled with the target's
    sample through shared exponential clocks; lossless and drafter-invariant.

    Exact conditional law and acceptance: closed form at K = 1,
    ``α = Σ_x 1 / Σ_i max(p_i/p_x, q_i/q_x)``; a one-dimensional quadrature in the clock time
    at K ≥ 2 (absolute tolerance ``QUAD_ATOL``).

    References
    ----------
    Rowan, Phan, Khisti, arXiv 2506.05632 (Gumbel-max list sampling); Daliri, Musco, Suresh,
    arXiv 2408.07978 (drafter-invariant speculative decoding, K = 1).

    Examples
    --------
    At K = 1 on p = (0.5, 0.3, 0.2), q = (0.2, 0.3, 0.5): ``α = 1/5 + 3/13 + 1/5`` and, drafting 2,
    ``law(2 | 2) = r_2 / φ(r_2) = 0.4``; at K = 2 the quadrature's law is the target's.

    >>> from otbound import VERIFIERS
    >>> gls, p, q = VERIFIERS["gls"], [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    >>> round(gls.acceptance(p, q, 1), 6), gls.conditional_law(p, q, [2]).round(6).tolist()
    (0.630769, [0.461538, 0.138462, 0.4])
    >>> gls.lossless_error(p, q, 2) < 1e-13
    True
    """

    name = "gls"
    reference = ("Gumbel-max list sampling (Rowan, Phan, Khisti 2506.05632; K = 1: Daliri et al. 2408.07978): "
                 "shared exponential clocks, drafter-invariant")
    lossless = True
    in_default_measurement = False  # K ≥ 2: a quadrature of O(V) nodes per position

    def __init__(self):
        self._cache = PreparedCache()

    def _prepare(self, p, q, k):
        return self._cache.get_or_build(p, q, k, lambda: _Ratios(p, q))

    # -- exact law ------------------------------------------------------------------------------

    def _laws(self, p, q, aux, drafts):
        if drafts.shape[1] == 1:
            return self._laws_single(aux, drafts[:, 0])
        n, v = drafts.shape[0], p.size

        def integrand(w):
            f = aux.f_tokens(w)  # (V,)
            fk = f[drafts]  # (n, K)
            others = _prod_except(fk)  # (n, K)
            cont = np.zeros((n, v))
            for k in range(drafts.shape[1]):
                cont += others[:, k, None] * np.maximum(fk[:, k, None] - f[None, :], 0.0)
            cont *= p[None, :]
            a = aux.atom(w)
            rows = np.arange(n)
            for k in range(drafts.shape[1]):
                np.add.at(cont, (rows, drafts[:, k]), a[drafts[:, k]] * others[:, k])
            return cont.ravel()

        law = _integrate(integrand, (n, v), drafts.shape[1] * (1.0 + float(aux.phi[-1])))
        return np.maximum(law, 0.0)

    def _laws_single(self, aux, x):
        """K = 1 closed form (module docstring), (n, V)."""
        p = aux.p
        n, v = x.size, p.size
        law = np.zeros((n, v))
        px = aux.pos[x]  # (n,) every draft has q > 0
        cy = np.where(aux.pos >= 0, aux.c[np.maximum(aux.pos, 0)], aux.c[-1] + aux.tail)  # (V,) ∫_{ρ_0}^{r_y}
        law[:] = p[None, :] * np.maximum(cy[None, :] - aux.c[px][:, None], 0.0)
        law[np.arange(n), x] = aux.rho[px] / aux.phi[px]
        return law

    # -- sampler --------------------------------------------------------------------------------

    def _sample(self, p, q, aux, drafts, rng):
        """The clocks drawn given the drafts (module docstring), then ``Y = argmin_i min_k S_i/p_i``."""
        n, k = drafts.shape
        rows = np.arange(n)
        best = np.full((n, p.size), np.inf)  # (n, V) min_k S^(k)_i
        for j in range(k):
            m = rng.exponential(size=n)  # (n,) the race's minimum M_k
            s = q[None, :] * m[:, None] + rng.exponential(size=(n, p.size))  # (n, V)
            s[rows, drafts[:, j]] = q[drafts[:, j]] * m
            np.minimum(best, s, out=best)
        return _race(best, p)

    # -- acceptance -----------------------------------------------------------------------------

    def _closed_form(self, p, q, aux, k):
        if k == 1:
            return float(p[aux.tokens] @ (1.0 / aux.phi))
        qt, pt = q[aux.tokens], p[aux.tokens]  # (n,) by ratio
        q_before = np.concatenate([[0.0], np.cumsum(qt)[:-1]])  # (n,) q(r_x before r_y)

        def integrand(w):
            e_phi = np.exp(-w * aux.phi)  # (n,)
            ft = aux.f_sorted(w, e_phi)  # (n,) F(w; r_y) by ratio
            d = qt * ft  # (n,)
            fbar = float(d.sum())
            a = float(pt @ e_phi)
            # Ḡ_y = Σ_{x: r_x < r_y} q_x F_x − F_y q(r_x < r_y): prefix sums over the sorted row
            qf_before = np.cumsum(d) - d
            gbar = np.maximum(qf_before - ft * q_before, 0.0)  # (n,) drafted y; q_y = 0 tokens: D_y = 0
            # F̄^{K−1} − (F̄ − d)^{K−1} = d Σ_i F̄^i (F̄ − d)^{K−2−i} (no cancellation at small d)
            rest = fbar - d
            geo = np.ones_like(d)  # Horner: h_{j+1} = h_j (F̄ − d) + F̄^{j+1}
            for j in range(k - 2):
                geo = geo * rest + fbar ** (j + 1)
            cont = float(pt @ (gbar * d * geo))
            return np.array([k * (a * fbar ** (k - 1) + cont)])

        return float(_integrate(integrand, (1,), float(k * k))[0])

    # -- the procedure with its own clocks ---------------------------------------------------------

    def draft_and_verify(self, p, q, num_drafts: int, n: int, rng=None) -> tuple[np.ndarray, np.ndarray]:
        """Run GLS from its shared clocks: ``(drafts (n, K), tokens (n,))``.

        The clocks ``S`` (n, K, V) are drawn from ``rng`` first (one ``exponential`` call), so the
        same seed gives the same clocks whatever q is: the tokens depend on p and the seed only.
        Holds ``n·K·V`` float64 clocks at once (for tests, the conformance kit and small V; the
        verifier's :meth:`sample` draws the clocks given the drafts, ``n·V`` at a time).

        Examples
        --------
        >>> import numpy as np
        >>> from otbound import VERIFIERS
        >>> p = np.array([0.5, 0.3, 0.2])
        >>> _, y1 = VERIFIERS["gls"].draft_and_verify(p, [0.2, 0.3, 0.5], 2, 5, rng=1)
        >>> _, y2 = VERIFIERS["gls"].draft_and_verify(p, [0.6, 0.2, 0.2], 2, 5, rng=1)
        >>> bool((y1 == y2).all())   # drafter invariance
        True
        """
        p, q = _check_laws(p, q)
        k = self._check_k(q, num_drafts)
        n = check_positive_int(n, "n")
        rng = np.random.default_rng(rng)
        s = rng.exponential(size=(n, k, p.size))  # (n, K, V) the shared clocks
        drafts = _race(s, q)  # (n, K)
        return drafts, _race(s.min(axis=1), p)


def _race(clocks: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """``argmin_i clocks[..., i] / rates[i]`` (∞ where the rate is 0), int64."""
    with np.errstate(divide="ignore"):
        inv = np.where(rates > 0, 1.0 / np.where(rates > 0, rates, 1.0), np.inf)
    return np.argmin(clocks * inv, axis=-1).astype(np.int64)
