"""Shared machinery of the token-level verifiers (docs/theory/token-verifiers.md).

A *verifier* maps a target law ``p``, a draft law ``q`` and one draft tuple ``x̄ = (x_1..x_K)`` to an
emitted token ``Y``. It is lossless when ``Σ_x̄ Q(x̄) law(Y = · | x̄) = p`` for its draft law ``Q``.
Every verifier here exposes

* ``sample(p, q, drafts, rng)`` — the algorithm itself, vectorised over the rows of ``drafts``;
* ``conditional_law(p, q, drafts)`` — the exact law of ``Y`` given each draft tuple;
* ``acceptance(p, q, num_drafts)`` — the exact ``α = P(Y ∈ x̄)`` (closed form, recursion, or
  enumeration of the draft tuples when ``|V|^K`` is small), else ``None``.

Acceptance follows docs/theory/notation.md: a residual sample that happens to equal a draft counts as accepted.

Numerics: float64 throughout; conditional laws are exact up to float64 rounding (the tests check
``Σ_x̄ Q(x̄) law(·|x̄) = p`` to ``1e-12``). Residual laws ``norm((a − b)_+)`` whose mass is exactly 0
are only reached with probability 0; they are replaced by ``a`` so that nothing divides by zero.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from otbound._backend import is_torch, on_one_cpu_thread, to_numpy
from otbound._validation import InvalidInputError, as_pair
from otbound.token._kernel import LawBatch
from otbound.token.draft_laws import DraftLaw, draft_joint, draft_law, inverse_cdf, sample_drafts

#: exact acceptance by enumeration only when the draft law has at most this many tuples ``|V|^K`` …
ENUMERATION_MAX_TUPLES = 200_000
#: … and at most this many (tuple, token) cells ``|V|^(K+1)`` to evaluate.
ENUMERATION_MAX_CELLS = 100_000_000
#: rows × V cells per vectorised chunk (bounds the memory of per-row laws to ~32 MB).
CHUNK_CELLS = 4_000_000
_OVERFLOW_Q = 1.0 / np.finfo(np.float64).max  # p/q ≤ 1/q is finite for q ≥ this


class _LawKey:
    """Cache key of a checked (p, q, K): hashed from a strided sample of the entries (O(V / 97), not
    a pass over 2 × V doubles), compared exactly (``np.array_equal``) — a hash collision costs one
    comparison, never a wrong hit. Holds the checked copies, which the caller cannot mutate."""

    __slots__ = ("p", "q", "k", "_hash")

    def __init__(self, p: np.ndarray, q: np.ndarray, k: int):
        self.p, self.q, self.k = p, q, k
        self._hash = hash((p.shape, k, p[::97].tobytes(), q[::97].tobytes(), float(p[-1]), float(q[-1])))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, _LawKey) and self.k == other.k and self.p.shape == other.p.shape
            and np.array_equal(self.p, other.p) and np.array_equal(self.q, other.q)
        )


class PreparedCache(OrderedDict):
    """The ``size`` most recently prepared (p, q, K) instances of a verifier, keyed by content
    (:class:`_LawKey`; p and q as returned by the verifiers' input check, fresh arrays)."""

    def __init__(self, size: int = 16):
        super().__init__()
        self.size = int(size)

    def get_or_build(self, p, q, k, build):
        """The cached value for (p, q, k), else ``build()`` stored (the least recent dropped)."""
        key = _LawKey(p, q, k)
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = self[key] = build()
        if len(self) > self.size:
            self.popitem(last=False)
        return value


@dataclass
class VerifierSample:
    """Output of :meth:`Verifier.sample`.

    Attributes
    ----------
    tokens : numpy.ndarray
        int64 array (n,), the emitted tokens Y.
    accepted : numpy.ndarray
        bool array (n,), Y ∈ {x_1..x_K} for its draft row (a residual draw equal to a draft counts
        as accepted, docs/theory/notation.md); its mean estimates α = P(Y ∈ x̄).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound import VERIFIERS
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> s = VERIFIERS["rrs"].sample(p, q, np.array([[0, 1], [2, 2]]), rng=0)
    >>> s.tokens.shape, s.accepted.dtype
    ((2,), dtype('bool'))
    >>> bool(s.accepted[0])  # token 0 has p/q > 1: the first round always accepts it
    True
    """

    tokens: np.ndarray
    accepted: np.ndarray


@dataclass
class VerifierRun:
    """Output of :func:`otbound.token.verifiers.run`: drafts, the verifier's sample, and the Monte
    Carlo acceptance.

    acceptance: fraction of accepted rows; [ci_low, ci_high]: its Wilson score interval at level
    ``confidence``, ``(m + z²/2n ± z·√(m(1−m)/n + z²/4n²)) / (1 + z²/n)`` with m the acceptance and
    z the normal quantile at ``0.5 + confidence/2``.

    Attributes
    ----------
    drafts : numpy.ndarray
        int64 (n, K), the draft tuples drawn from the verifier's draft law.
    sample : VerifierSample
        The verifier's output on them.
    acceptance : float
        Fraction of accepted rows.
    ci_low, ci_high : float
        The Wilson score interval of the acceptance.
    confidence : float
        Its level, in (0, 1).
    num_samples : int
        n (a property).

    References
    ----------
    Wilson, "Probable inference, the law of succession, and statistical inference", J. Amer.
    Statist. Assoc. 22 (1927) (the interval).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.token.verifiers import run
    >>> r = run("rrs", np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5]), 2, 100, rng=0)
    >>> r.drafts.shape, r.num_samples, r.confidence
    ((100, 2), 100, 0.95)
    >>> r.ci_low <= r.acceptance <= r.ci_high
    True
    """

    drafts: np.ndarray
    sample: VerifierSample
    acceptance: float
    ci_low: float
    ci_high: float
    confidence: float

    @property
    def num_samples(self) -> int:
        return int(self.sample.tokens.size)


class Verifier(ABC):
    """Base class of the token-level multi-draft verifiers.

    Subclasses set ``name``, ``reference``, ``lossless`` and ``sampling`` (the draft law of
    docs/theory/token-bounds.md they verify), optionally ``max_drafts``, and implement ``_laws`` and ``_sample``
    (and ``_prepare`` / ``_closed_form``). The block verifiers
    (:class:`otbound.block.verifiers.BlockVerifier`) carry the same attributes.

    Attributes
    ----------
    name : str
        The registry name (:data:`otbound.VERIFIERS`).
    reference : str
        The algorithm and the paper it comes from.
    lossless : bool
        Declared by every verifier: whether its output law is the target's,
        ``Σ_x̄ Q(x̄) law(·|x̄) = p`` (checked exactly by :meth:`lossless_error` in the tests; a
        published verifier found lossy is kept with ``lossless = False``).
    sampling : str
        Its draft law, a name in :data:`otbound.DRAFT_LAWS` (the object: :attr:`law`).
    max_drafts : int or None
        The largest K it supports (None: any).
    in_default_measurement : bool
        Whether :func:`otbound.report.measure_laws` (and so ``python -m otbound.compare``) measures
        it when no verifiers are named: False for the verifiers whose exact acceptance costs a
        per-row set-up far above the sorted-rows kernel's (named explicitly, they are measured).
    planned : bool
        Whether the planner plans it when no verifiers are named (:data:`otbound.plan.DEFAULT_VERIFIERS`):
        the lossless verifiers with a fast exact acceptance, one per algorithm.
    synthetic_max_drafts : int or None
        The largest K the planner measures it at on its synthetic laws (``--synthetic``), where its
        exact acceptance is an enumeration costing tens of seconds per K above it (None: no cap).
    monte_carlo : str or None
        Where its acceptance is a Monte Carlo estimate (:meth:`batch_estimate` answers
        ``"monte_carlo"``) rather than exact, in words; None: exact wherever it is computed.
    attains_optimum : bool
        Whether its acceptance is α* of its draft law (proved in its module docstring): its
        :meth:`batch_acceptance` is then the law's α* kernel (``greedy``, ``spechub``, ``onehot``,
        ``nss_deterministic``).

    The facts of a registered verifier are read from its object (``VERIFIERS[name].planned``), never
    from a table elsewhere.

    Examples
    --------
    Every registered verifier on one toy (p = (0.5, 0.3, 0.2), q = (0.2, 0.3, 0.5), K = 2): its draft
    law, its acceptance α, the bound α* of its law (:func:`otbound.optimal_acceptance`), the
    declaration ``lossless`` and the exact :meth:`lossless_error`. Each verifier's own example checks
    the claim its docstring makes.

    >>> import numpy as np
    >>> import otbound as ob
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> for name, v in ob.VERIFIERS.items():
    ...     alpha, bound = v.acceptance(p, q, 2), ob.optimal_acceptance(p, q, 2, v.sampling)
    ...     print(f"{name:17} {v.sampling:19} {alpha:.6f} {bound:.6f}  {v.lossless!s:5}  "
    ...           f"{v.lossless_error(p, q, 2):.6f}")
    nss               with_replacement    0.483000 0.860000  True   0.000000
    rrs               with_replacement    0.760000 0.860000  True   0.000000
    rrs_wor           without_replacement 0.820000 0.985714  True   0.000000
    kseq              with_replacement    0.791355 0.860000  True   0.000000
    spechub           greedy              0.900000 0.900000  True   0.000000
    greedy            greedy              0.900000 0.900000  True   0.000000
    khisti_is         with_replacement    0.814434 0.860000  True   0.000000
    khisti_lp         with_replacement    0.860000 0.860000  True   0.000000
    ot                with_replacement    0.860000 0.860000  True   0.000000
    onehot            deterministic       0.500000 0.500000  True   0.000000
    nss_deterministic deterministic       0.500000 0.500000  True   0.000000
    ot_wor_top        without_replacement 0.985714 0.985714  True   0.000000
    ot_wor_iid        without_replacement 0.885934 0.985714  True   0.000000
    ot_wor            without_replacement 0.985714 0.985714  True   0.000000
    gls               with_replacement    0.773999 0.860000  True   0.000000
    """

    name: str = ""
    reference: str
    lossless: bool
    sampling: str = "with_replacement"
    max_drafts: int | None = None
    in_default_measurement: bool = True
    planned: bool = False
    synthetic_max_drafts: int | None = None
    attains_optimum: bool = False
    monte_carlo: str | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, sampling={self.sampling!r})"

    # -- public API -------------------------------------------------------------------------

    def sample(self, p, q, drafts, rng=None) -> VerifierSample:
        """Run the verifier on every row of ``drafts`` (int array (n, K)); returns tokens, accepted."""
        p, q = _check_laws(p, q)
        drafts = self._check_drafts(q, drafts)
        rng = np.random.default_rng(rng)
        n, k = drafts.shape
        aux = self._prepare(p, q, k)
        tokens = np.empty(n, dtype=np.int64)
        for sl in _chunks(n, q.size):
            tokens[sl] = self._sample(p, q, aux, drafts[sl], rng)
        accepted = (tokens[:, None] == drafts).any(axis=1)
        return VerifierSample(tokens=tokens, accepted=accepted)

    def clear_cache(self) -> None:
        """Forget the prepared (p, q, K) set-ups this verifier keeps, and those of the verifiers it
        runs inside it: the next call pays its set-up again, as it does on fresh laws (each token of
        a decoding step). The values never depend on the cache (it is keyed by the laws' content);
        this is for timing a fresh verification and for freeing memory.

        Examples
        --------
        >>> import numpy as np
        >>> from otbound import VERIFIERS
        >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
        >>> ver = VERIFIERS["ot"]
        >>> before = ver.conditional_law(p, q, np.array([2, 1]))   # set-up prepared and cached
        >>> ver.clear_cache()
        >>> bool(np.array_equal(ver.conditional_law(p, q, np.array([2, 1])), before))   # set up again
        True
        """
        for value in vars(self).values():
            if isinstance(value, PreparedCache):
                value.clear()
            elif isinstance(value, Verifier):
                value.clear_cache()

    def conditional_law(self, p, q, drafts) -> np.ndarray:
        """Exact law of the emitted token given the draft tuple(s).

        ``drafts``: one tuple (K,) → array (V,); or rows (n, K) → array (n, V).
        """
        p, q = _check_laws(p, q)
        arr = _token_ids(drafts)
        single = arr.ndim == 1
        drafts = self._check_drafts(q, arr[None, :] if single else arr)
        aux = self._prepare(p, q, drafts.shape[1])
        laws = self._chunked_laws(p, q, aux, drafts)
        return laws[0] if single else laws

    @on_one_cpu_thread
    def acceptance(self, p, q, num_drafts: int):
        """Exact acceptance P(Y ∈ x̄) under this verifier's draft law, or None if not computable.

        Closed form where one exists (see each verifier; computed for the whole batch at once by
        :meth:`batch_acceptance` on the sorted-rows kernel), else enumeration of the draft tuples
        with Q(x̄) > 0 when ``|V|^K ≤ ENUMERATION_MAX_TUPLES`` and
        ``|V|^(K+1) ≤ ENUMERATION_MAX_CELLS``. Exact up to float64 rounding (~1e-15), clipped to
        [0, 1].

        Parameters
        ----------
        p, q : array_like or torch.Tensor, shape (V,) or (..., V)
            Target and draft laws along the last axis.
        num_drafts : int
            K (within the support of q for the laws without replacement and greedy, and within
            ``max_drafts``).

        Returns
        -------
        float, numpy.ndarray, torch.Tensor or None
            A float for 1-D laws, an array over the batch shape otherwise, a float64 tensor on the
            input's device for torch input; None where no exact value is computable.

        Raises
        ------
        InvalidInputError
            Malformed laws, K out of range, or ``p/q`` overflowing float64.

        Examples
        --------
        >>> import numpy as np
        >>> from otbound import VERIFIERS
        >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
        >>> round(VERIFIERS["rrs"].acceptance(p, q, 2), 6)
        0.76
        >>> VERIFIERS["rrs"].acceptance(np.stack([p, q]), np.stack([q, p]), 2).round(6)
        array([0.76, 0.76])
        """
        batch = LawBatch(p, q, check_overflow=True)
        k = self.check_num_drafts(batch, num_drafts)
        values = self.batch_acceptance(batch, k)
        return None if values is None else batch.wrap(values.clamp(0.0, 1.0))

    def batch_acceptance(self, batch: LawBatch, num_drafts: int):
        """The exact acceptance of every row of a :class:`otbound.token.LawBatch` for a checked K, a
        (B,) float64 tensor on the batch's device (not clipped), or None where not computable.

        This default is the law's α* kernel for a verifier that ``attains_optimum``, else the
        verifier's per-row closed form or enumeration on each row; verifiers with a batched closed
        form override it (their docstrings give the derivation).

        Examples
        --------
        >>> import numpy as np
        >>> from otbound import VERIFIERS
        >>> from otbound.token import LawBatch
        >>> b = LawBatch(np.array([[0.5, 0.3, 0.2]]), np.array([[0.2, 0.3, 0.5]]))
        >>> VERIFIERS["khisti_is"].batch_acceptance(b, 2).numpy().round(6)
        array([0.814434])
        >>> VERIFIERS["spechub"].batch_acceptance(b, 2).numpy().round(6)  # α*_greedy
        array([0.9])
        """
        import torch

        if self.attains_optimum:
            return batch.optimal_acceptance(num_drafts, self.law)
        P, Q = batch.numpy_rows()
        out = np.empty(batch.rows)
        for i, (p, q) in enumerate(zip(P, Q)):
            aux = self._prepare(p, q, num_drafts)
            value = self._closed_form(p, q, aux, num_drafts)
            if value is None:
                value = self._enumerated_acceptance(p, q, aux, num_drafts)
            if value is None:
                return None
            out[i] = min(1.0, max(0.0, value))  # as the per-row acceptance always clipped (NaN → 0)
        return torch.as_tensor(out, device=batch.p.device)

    @on_one_cpu_thread
    def batch_estimate(self, batch: LawBatch, num_drafts, mc_samples: int = 64, rng=None) -> dict:
        """Per K in ``num_drafts``: ``(values, method)`` with the exact :meth:`batch_acceptance`
        (``"exact"``) where computable, else a Monte Carlo estimate per row (``"monte_carlo"``:
        by default the accepted fraction of ``mc_samples`` draft tuples drawn and verified with the
        numpy generator ``rng``, standard error ≤ 0.5/√mc_samples); or the
        :class:`InvalidInputError` that refuses that K. Values are (B,) float64 tensors on the
        batch's device, clipped to [0, 1].

        Examples
        --------
        >>> import numpy as np
        >>> from otbound import VERIFIERS
        >>> from otbound.token import LawBatch
        >>> res = VERIFIERS["spechub"].batch_estimate(LawBatch(np.array([[0.5, 0.5]]), np.array([[0.9, 0.1]])), (2, 3))
        >>> res[2][1], type(res[3]).__name__   # exact at K = 2; K = 3 refused (max_drafts = 2)
        ('exact', 'InvalidInputError')
        """
        import torch

        rng = np.random.default_rng(rng)
        out, todo = self._exact_estimates(batch, num_drafts)
        for k in todo:
            P, Q = batch.numpy_rows()
            try:
                est = [float(self.sample(p, q, sample_drafts(q, k, self.sampling, mc_samples, rng),
                                         rng).accepted.mean()) for p, q in zip(P, Q)]
            except InvalidInputError as exc:
                out[k] = exc
                continue
            out[k] = (torch.as_tensor(est, dtype=torch.float64, device=batch.p.device), "monte_carlo")
        return out

    def _exact_estimates(self, batch: LawBatch, num_drafts) -> tuple[dict, list]:
        """``(out, todo)``: per K of ``num_drafts`` its exact value ``(values, "exact")`` or the
        :class:`InvalidInputError` refusing it, and the checked Ks with no exact value (left to a
        Monte Carlo estimate, in order)."""
        out, todo = {}, []
        for k in num_drafts:
            try:
                k = self.check_num_drafts(batch, k)
                values = self.batch_acceptance(batch, k)
            except InvalidInputError as exc:
                out[k] = exc
                continue
            if values is None:
                todo.append(k)
            else:
                out[k] = (values.clamp(0.0, 1.0), "exact")
        return out, todo

    @property
    def law(self) -> DraftLaw:
        """The draft law it verifies (:data:`otbound.DRAFT_LAWS` under :attr:`sampling`)."""
        return draft_law(self.sampling)

    def check_num_drafts(self, batch: LawBatch, num_drafts) -> int:
        """K checked against the draft law (the support of every row's q) and ``max_drafts``."""
        return self._within_max(batch.check_num_drafts(num_drafts, self.law))

    def _within_max(self, k: int) -> int:
        if self.max_drafts is not None and k > self.max_drafts:
            raise InvalidInputError(f"verifier {self.name!r} supports at most {self.max_drafts} drafts, got K = {k}")
        return k

    def lossless_error(self, p, q, num_drafts: int) -> float:
        """Exact ``max_y |Σ_x̄ Q(x̄) law(y | x̄) − p(y)|`` over the draft tuples of this verifier's
        draft law: 0 (to float64 rounding, ~1e-16) iff the verifier is lossless on ``(p, q, K)``.

        The block verifiers' :meth:`otbound.block.verifiers.BlockVerifier.lossless_error` is the
        same quantity for one iteration's emitted sequence.

        Parameters
        ----------
        p, q : array_like (V,)
            Target and draft laws.
        num_drafts : int
            K.

        Returns
        -------
        float

        Raises
        ------
        InvalidInputError
            On bad laws or K, or when the enumeration would exceed ``ENUMERATION_MAX_TUPLES`` tuples
            or ``ENUMERATION_MAX_CELLS`` cells.

        Examples
        --------
        >>> import numpy as np
        >>> from otbound import VERIFIERS
        >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
        >>> VERIFIERS["kseq"].lossless_error(p, q, 3) < 1e-15
        True
        """
        p, q = _check_laws(p, q)
        k = self._check_k(q, num_drafts)
        v = q.size
        if v**k > ENUMERATION_MAX_TUPLES or v ** (k + 1) > ENUMERATION_MAX_CELLS:
            raise InvalidInputError(
                f"the exact lossless error enumerates |V|^K = {v}^{k} draft tuples (limits {ENUMERATION_MAX_TUPLES} "
                f"tuples, {ENUMERATION_MAX_CELLS} cells): use a smaller vocabulary"
            )
        aux = self._prepare(p, q, k)
        weights, tuples = support_tuples(q, k, self.sampling)
        out = np.zeros(v)
        for sl in _chunks(tuples.shape[0], v):
            out += weights[sl] @ self._laws(p, q, aux, tuples[sl])
        return float(np.abs(out - p).max())

    @on_one_cpu_thread
    def acceptance_or_estimate(self, p, q, num_drafts: int, mc_samples: int, rng) -> tuple[float, str]:
        """``(acceptance, method)``: the exact :meth:`acceptance` (``"exact"``) where it is
        computable, else the accepted fraction of ``mc_samples`` draft tuples drawn from the draft law
        and verified (``"monte_carlo"``; standard error ≤ 0.5/√mc_samples). 1-D laws."""
        exact = self.acceptance(p, q, num_drafts)
        if exact is not None:
            return exact, "exact"
        drafts = sample_drafts(q, num_drafts, self.sampling, mc_samples, rng)
        return float(self.sample(p, q, drafts, rng).accepted.mean()), "monte_carlo"

    # -- hooks --------------------------------------------------------------------------------

    def _prepare(self, p: np.ndarray, q: np.ndarray, k: int):
        """Per-(p, q, K) precomputation shared by all rows (default: none)."""
        return None

    @abstractmethod
    def _laws(self, p, q, aux, drafts: np.ndarray) -> np.ndarray:
        """Exact conditional laws, array (n, V), for checked drafts (n, K)."""

    @abstractmethod
    def _sample(self, p, q, aux, drafts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Emitted tokens (n,) for checked drafts (n, K)."""

    def _closed_form(self, p, q, aux, k: int) -> float | None:
        return None

    # -- helpers ------------------------------------------------------------------------------

    def _chunked_laws(self, p, q, aux, drafts):
        out = np.empty((drafts.shape[0], q.size))
        for sl in _chunks(drafts.shape[0], q.size):
            out[sl] = self._laws(p, q, aux, drafts[sl])
        return out

    def _enumerated_acceptance(self, p, q, aux, k):
        v = q.size
        if v**k > ENUMERATION_MAX_TUPLES or v ** (k + 1) > ENUMERATION_MAX_CELLS:
            return None
        weights, tuples = support_tuples(q, k, self.sampling)
        total = 0.0
        for sl in _chunks(tuples.shape[0], v):
            laws = self._laws(p, q, aux, tuples[sl])
            total += float(weights[sl] @ _mass_on_drafts(laws, tuples[sl]))
        return total

    def _check_k(self, q, num_drafts) -> int:
        return self._within_max(self.law.check_num_drafts(num_drafts, q))

    def _check_drafts(self, q: np.ndarray, drafts) -> np.ndarray:
        """Check drafts are an integer (n, K) array of tuples the draft law can produce."""
        d = _token_ids(drafts)
        if d.dtype == bool or not np.issubdtype(d.dtype, np.integer):
            raise InvalidInputError(f"drafts must be an integer array of token ids, got dtype {d.dtype}")
        if d.ndim != 2:
            raise InvalidInputError(f"drafts must have shape (n, K), got shape {d.shape}")
        d = d.astype(np.int64, copy=False)
        k = self._check_k(q, d.shape[1])
        v = q.size
        if d.size == 0:
            return d
        bad = (d < 0) | (d >= v)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise InvalidInputError(f"drafts[{r}, {c}] = {d[r, c]} is not a token id in [0, {v})")
        self.law.check_drafts(q, d, k)
        return d


class SequentialVerifier(Verifier):
    """Verifiers that try tokens one round at a time (first acceptance wins) then draw a residual.

    Subclasses implement ``_rounds(p, q, aux, drafts) -> (tokens (n, R), accept (n, R), residual)``
    where ``accept[:, r]`` is the acceptance probability of round r given rounds < r rejected and
    ``residual`` is the law (V,) or (n, V) sampled when every round rejects. The exact conditional
    law is then ``law(· | x̄) = Σ_r Π_{s<r}(1 − a_s) a_r δ_{t_r} + Π_r(1 − a_r) · residual``.

    References
    ----------
    Leviathan, Kalman, Matias, arXiv 2211.17192 (one round); Miao et al., "SpecInfer",
    arXiv 2305.09781 (one round per draft, recursive residuals).

    Examples
    --------
    Single-draft speculative sampling (accept x_1 with probability min(1, p/q), else draw from
    norm((p − q)_+)) as a sequential verifier:

    >>> import numpy as np
    >>> from otbound.token.verifiers import SequentialVerifier
    >>> class SingleDraft(SequentialVerifier):
    ...     name, reference, lossless, max_drafts = "single", "Leviathan et al. 2211.17192", True, 1
    ...     def _rounds(self, p, q, aux, drafts):
    ...         x = drafts[:, :1]
    ...         res = np.maximum(p - q, 0.0)
    ...         return x, np.minimum(1.0, p[x] / q[x]), res / res.sum()
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> v = SingleDraft()
    >>> v.conditional_law(p, q, [2]).round(6).tolist()
    [0.6, 0.0, 0.4]
    >>> round(v.acceptance(p, q, 1), 6), v.lossless_error(p, q, 1) < 1e-15
    (0.7, True)
    """

    @abstractmethod
    def _rounds(self, p, q, aux, drafts):
        """(tokens (n, R), accept (n, R), residual (V,) or (n, V)) for checked drafts (n, K)."""

    def _laws(self, p, q, aux, drafts):
        return first_acceptance_law(*self._rounds(p, q, aux, drafts), q.size)

    def _sample(self, p, q, aux, drafts, rng):
        return first_acceptance_sample(*self._rounds(p, q, aux, drafts), rng)


# ---------------------------------------------------------------------------------------------
# module helpers


def _check_laws(p, q):
    p, q = as_pair(to_numpy(p)[0], to_numpy(q)[0])
    if p.ndim != 1:
        raise InvalidInputError(f"verifiers take 1-D laws p and q, got shape {p.shape}")
    # the verifiers' weights and acceptance ratios are p/q: it can overflow only where q < 1/DBL_MAX
    if np.count_nonzero(q < _OVERFLOW_Q) == np.count_nonzero(q == 0):
        return p, q
    with np.errstate(over="ignore"):
        over = np.flatnonzero((q > 0) & np.isinf(p / np.where(q > 0, q, 1.0)))
    if over.size:
        i = int(over[0])
        raise InvalidInputError(
            f"p/q overflows float64 at token {i} (p = {p[i]:.3g}, q = {q[i]:.3g}): set such denormal q entries to 0"
        )
    return p, q


def _token_ids(x) -> np.ndarray:
    """Token ids as a numpy array, keeping the integer dtype of torch tensors."""
    return x.detach().cpu().numpy() if is_torch(x) else np.asarray(x)


def _chunks(n: int, v: int):
    step = max(1, CHUNK_CELLS // max(v, 1))
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def support_tuples(q, num_drafts: int, sampling: str) -> tuple[np.ndarray, np.ndarray]:
    """All draft tuples with Q(x̄) > 0 and their probabilities: ``(weights (m,), tuples (m, K))``.

    The support of :func:`otbound.draft_joint` (tuples in lexicographic order), over which the exact
    acceptance ``Σ_x̄ Q(x̄) P(Y ∈ x̄ | x̄)`` and lossless error ``max_y |Σ_x̄ Q(x̄) law(y | x̄) − p(y)|``
    are enumerated.

    Parameters
    ----------
    q : array_like, shape (V,)
        The draft model's next-token law.
    num_drafts : int
        K.
    sampling : str or DraftLaw
        The draft law: a name of :data:`otbound.DRAFT_LAWS` (an unknown name is an InvalidInputError).

    Returns
    -------
    weights : numpy.ndarray
        float64 (m,), Q(x̄) of each tuple (summing to 1).
    tuples : numpy.ndarray
        int64 (m, K), the tuples.

    Raises
    ------
    InvalidInputError
        As :func:`otbound.draft_joint` (bad law, sampling or K, or V^K too large).

    References
    ----------
    Sun et al., "SpecTr", arXiv 2310.15141; Jeon et al., arXiv 2402.14160; Hu et al.,
    arXiv 2502.18779 (the draft laws).

    Examples
    --------
    >>> from otbound.token.verifiers import support_tuples
    >>> weights, tuples = support_tuples([0.2, 0.3, 0.5], 2, "greedy")
    >>> weights.round(6).tolist(), tuples.tolist()
    ([0.4, 0.6], [[2, 0], [2, 1]])
    >>> support_tuples([0.2, 0.3, 0.5], 2, "without_replacement")[1].shape
    (6, 2)
    """
    joint = draft_joint(q, num_drafts, sampling)
    flat = joint.ravel()
    support = np.flatnonzero(flat > 0)
    tuples = np.stack(np.unravel_index(support, joint.shape), axis=1).astype(np.int64)
    return flat[support], tuples


def _mass_on_drafts(laws: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """Σ_{y ∈ set(x̄)} law(y | x̄) per row (repeated drafts counted once)."""
    mask = np.zeros(laws.shape, dtype=bool)
    mask[np.arange(drafts.shape[0])[:, None], drafts] = True
    return np.where(mask, laws, 0.0).sum(axis=1)


def residual(a: np.ndarray, b, fallback: np.ndarray | None = None) -> np.ndarray:
    """``norm((a − b)_+)`` along the last axis: the law a rejection corrects from.

    Rows of zero mass (a branch of probability 0, never reached) are ``fallback``, ``a`` unless
    given. The one residual of the token and block verifiers: ``b = 0`` normalises a weight vector
    (``norm(w_+)``). A new array always (never ``a`` or ``fallback`` itself).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.token.verifiers import residual
    >>> residual(np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.6, 0.2]))   # (0.3, 0, 0) normalised
    array([1., 0., 0.])
    >>> residual(np.array([0.5, 0.5]), np.array([0.5, 0.5]), np.array([0.0, 1.0]))   # nothing left
    array([0., 1.])
    """
    d = np.maximum(a - b, 0.0)  # (..., V)
    if d.ndim == 1:  # one law (the block verifiers' and the kit's per-prefix calls): no masked division
        s = d.sum()
        if s > 0:
            return d / s
    mass = d.sum(axis=-1, keepdims=True)  # (..., 1)
    return np.where(mass > 0, d / np.where(mass > 0, mass, 1.0), a if fallback is None else fallback)


def ratio_min1(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``min(1, num/den)`` elementwise, with 0/0 (an event of probability 0) mapped to 1."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)
    return np.minimum(1.0, r)


def draw(law: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws: ``law`` (V,) shared by all ``u`` (n,), or one law per row (n, V).

    Tokens of zero mass are never returned (first index whose CDF exceeds u·total).
    """
    if law.ndim == 1:
        return inverse_cdf(law, u)
    cdf = np.cumsum(law, axis=1)
    idx = (cdf <= (u * cdf[:, -1])[:, None]).sum(axis=1)
    last = law.shape[1] - 1 - np.argmax(law[:, ::-1] > 0, axis=1)
    return np.minimum(idx, last).astype(np.int64)


def first_acceptance_sample(tokens, accept, resid, rng) -> np.ndarray:
    """Sequential verification: rounds r = 1..R try ``tokens[:, r]`` with probability
    ``accept[:, r]`` (conditional on the earlier rounds rejecting); the first success is emitted,
    otherwise a draw from ``resid`` ((V,) or (n, V))."""
    n, rounds = accept.shape
    out = np.empty(n, dtype=np.int64)
    hit = rng.random((n, rounds)) < accept
    any_hit = hit.any(axis=1)
    if rounds:
        first = np.argmax(hit, axis=1)
        out[any_hit] = tokens[any_hit, first[any_hit]]
    rest = ~any_hit
    law = resid if resid.ndim == 1 else resid[rest]
    out[rest] = draw(law, rng.random(int(rest.sum())))
    return out


def first_acceptance_law(tokens, accept, resid, v: int) -> np.ndarray:
    """Exact law (n, V) of :func:`first_acceptance_sample`:
    ``Σ_r Π_{s<r}(1 − a_s) a_r δ_{t_r} + Π_r(1 − a_r) · resid``."""
    n, rounds = accept.shape
    law = np.zeros((n, v))
    alive = np.ones(n)
    rows = np.arange(n)
    for r in range(rounds):
        law[rows, tokens[:, r]] += alive * accept[:, r]
        alive = alive * (1.0 - accept[:, r])
    law += alive[:, None] * resid
    return law


# ---------------------------------------------------------------------------------------------
# Monte Carlo helper


def wilson_interval(mean: float, n: int, confidence: float) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927)."""
    import scipy.stats  # imported here: it costs ~0.2 s at ``import otbound``

    z = float(scipy.stats.norm.ppf(0.5 + confidence / 2))
    z2n = z * z / n
    center = (mean + z2n / 2) / (1 + z2n)
    half = z * np.sqrt(mean * (1 - mean) / n + z2n / (4 * n)) / (1 + z2n)
    # the ends are exactly 0 at mean 0 and 1 at mean 1; set them so rounding cannot exclude them
    lo = 0.0 if mean == 0.0 else max(0.0, center - half)
    hi = 1.0 if mean == 1.0 else min(1.0, center + half)
    return float(lo), float(hi)
