"""Draft laws: the joint law Q of the K-draft tuple x̄ = (x_1..x_K) built from the draft model's q.

Laws (docs/theory/token-bounds.md):

* ``with_replacement`` — x_k ~ q i.i.d. (SpecInfer 2305.09781, SpecTr 2310.15141).
  Q(H) = q(H)^K.
* ``without_replacement`` — sequential draws renormalised after removing drawn tokens (equivalently
  the Gumbel-top-K of log q) (Jeon et al. 2402.14160). Q(H) by exponential clocks, see
  :mod:`otbound.token._wor`.
* ``greedy`` — G = the K−1 most likely tokens of q (ties broken by lower index), deterministic, and a
  last draft x_K ~ q' = q|_{V∖G} / (1 − q(G)) (Hu et al. 2502.18779; SpecHub 2411.05289 is K = 2).
  Q(H) = 1[G ⊆ H] · q'(H ∖ G).
* ``deterministic`` — x̄ = G, the K most likely tokens of q (vLLM's argmax drafts; EAGLE, Medusa and
  SGLang static top-k trees). Q(H) = 1[G ⊆ H].
* ``systematic`` — x_i = F⁻¹((i + U)/K) with one uniform U per tuple (:mod:`otbound.token._systematic`).

Each law is one :class:`otbound.token.DraftLaw` object (:mod:`otbound.token._draft_law`), registered
at the end of this module in :data:`DRAFT_LAWS`; every public function here resolves ``sampling``
once (:func:`draft_law`) and dispatches to it. All functions take a 1-D law ``q`` over the
vocabulary ``V``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from otbound._backend import on_accelerator
from otbound._validation import InvalidInputError, as_law
from otbound.token import _kernel, _wor
from otbound.token._draft_law import DRAFT_LAWS, DraftLaw, _cdf, _draw, draft_law, inverse_cdf, register
from otbound.token._systematic import Systematic


def greedy_split(q, num_drafts: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(G, q_prime)`` for the greedy law: the K−1 top tokens of q and the last draft's law.

    Hu et al. 2502.18779; SpecHub 2411.05289 is K = 2.

    Parameters
    ----------
    q : array_like, shape (V,)
        The draft model's next-token law; needs at least K tokens with q > 0.
    num_drafts : int
        K.

    Returns
    -------
    G : numpy.ndarray
        int64, the K−1 tokens by decreasing q (ties: lower index first).
    q_prime : numpy.ndarray
        q with G zeroed, renormalised: q' = q|_{V∖G} / (1 − q(G)).

    Raises
    ------
    InvalidInputError
        ``q`` not a 1-D law, or K not in [1, number of tokens with q > 0].

    References
    ----------
    Hu et al., arXiv 2502.18779; Sun et al., "SpecHub", arXiv 2411.05289 (K = 2).

    Examples
    --------
    >>> import otbound as ob
    >>> g, q_prime = ob.greedy_split([0.1, 0.4, 0.3, 0.2], 3)
    >>> g.tolist(), q_prime.round(4).tolist()
    ([1, 2], [0.3333, 0.0, 0.0, 0.6667])
    """
    q = as_law(q, "q", ndim=1)
    return _greedy_split(q, DRAFT_LAWS["greedy"].check_num_drafts(num_drafts, q))


def top_tokens(q, num_tokens: int) -> np.ndarray:
    """The ``num_tokens`` most probable tokens of q by decreasing q, ties to the lower index: the
    deterministic draft tuple (``sampling="deterministic"``) and the greedy law's fixed drafts.

    Parameters
    ----------
    q : array_like, shape (V,)
        A law.
    num_tokens : int
        How many tokens, 0 ≤ num_tokens ≤ V.

    Returns
    -------
    numpy.ndarray
        int64 token ids, shape (num_tokens,).

    Examples
    --------
    >>> from otbound.token.draft_laws import top_tokens
    >>> top_tokens([0.2, 0.4, 0.2, 0.2], 3).tolist()
    [1, 0, 2]
    """
    q = as_law(q, "q", ndim=1)
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or not 0 <= num_tokens <= q.size:
        raise InvalidInputError(f"num_tokens must be an integer in [0, {q.size}], got {num_tokens!r}")
    return _kernel.top_tokens(q, int(num_tokens))


def _greedy_split(q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`greedy_split` on a checked law (also the hot path of the greedy bound over batches)."""
    g = _kernel.top_tokens(q, k - 1)
    rest = q.copy()
    rest[g] = 0.0
    return g, rest / rest.sum()


def sample_drafts(q, num_drafts: int, sampling: str = "with_replacement", size: int = 1, rng=None) -> np.ndarray:
    """Draw ``size`` draft tuples from the law ``sampling`` built from ``q``.

    Parameters
    ----------
    q : array_like, shape (V,)
        The draft model's next-token law.
    num_drafts : int
        K, the number of drafts per tuple.
    sampling : str or DraftLaw
        The draft law: a name of :data:`otbound.DRAFT_LAWS` (module docstring) or the law itself; an
        unknown name is an InvalidInputError naming the registered ones.
    size : int
        Number of tuples.
    rng : numpy Generator, seed or None

    Returns
    -------
    numpy.ndarray
        int64 array of shape ``(size, K)``.

    Raises
    ------
    InvalidInputError
        ``q`` not a 1-D law, an unknown ``sampling``, or an invalid K.

    References
    ----------
    Miao et al., "SpecInfer", arXiv 2305.09781 and Sun et al., "SpecTr", arXiv 2310.15141 (with
    replacement); Jeon et al., arXiv 2402.14160 (without replacement); Hu et al., arXiv 2502.18779
    (greedy).

    Examples
    --------
    >>> import otbound as ob
    >>> q = [0.2, 0.3, 0.5]
    >>> x = ob.sample_drafts(q, 2, "without_replacement", size=4, rng=0)
    >>> x.shape, bool((x[:, 0] != x[:, 1]).all())
    ((4, 2), True)
    >>> ob.sample_drafts(q, 2, "greedy", size=3, rng=0)[:, 0].tolist()  # G = {2} is always drafted
    [2, 2, 2]
    """
    q = as_law(q, "q", ndim=1)
    law = draft_law(sampling)
    k = law.check_num_drafts(num_drafts, q)
    return law.sample(q, k, int(size), np.random.default_rng(rng))


def _sample_without_replacement(q: np.ndarray, k: int, n: int, rng) -> np.ndarray:
    """Sequential draws: each draft ~ q conditioned on not being drawn yet.

    Conditioning is done by rejection (redraw from q while the token was drawn before), which is
    exact; rows still clashing after ``_MAX_REJECTIONS`` rounds (the drawn tokens hold most of q)
    draw from their renormalised remaining law directly. Costs O(n·K) plus O(V) per fallback row,
    instead of the O(n·V) of a Gumbel-top-K over the whole vocabulary.
    """
    out = np.empty((n, k), dtype=np.int64)
    cdf = _cdf(q)  # O(V) once; every draw below is a binary search
    out[:, 0] = _draw(cdf, rng.random(n))
    for r in range(1, k):
        todo = np.arange(n)
        for _ in range(_MAX_REJECTIONS):
            cand = _draw(cdf, rng.random(todo.size))
            clash = (cand[:, None] == out[todo, :r]).any(axis=1)
            out[todo[~clash], r] = cand[~clash]
            todo = todo[clash]
            if todo.size == 0:
                break
        for i in todo:
            rest = q.copy()
            rest[out[i, :r]] = 0.0
            out[i, r] = inverse_cdf(rest / rest.sum(), rng.random(1))[0]
    return out


_MAX_REJECTIONS = 16


def draft_joint(q, num_drafts: int, sampling: str = "with_replacement") -> np.ndarray:
    """The joint law Q(x̄) of the ordered draft tuple.

    Memory is V^K: for small vocabularies (the primal LP, brute force, exact enumeration).

    Parameters
    ----------
    q, num_drafts, sampling
        As :func:`sample_drafts`: the draft model's law (V,), K and the draft law.

    Returns
    -------
    numpy.ndarray
        float64 array of shape ``(V,)*K``; ``Q[x_1, ..., x_K]`` is the probability of the ordered tuple.

    Raises
    ------
    InvalidInputError
        ``q`` not a 1-D law, an unknown ``sampling``, an invalid K, or V^K > 5·10^7 entries.

    References
    ----------
    Sun et al., "SpecTr", arXiv 2310.15141 (with replacement: Q(x̄) = Π_k q(x_k)); Jeon et al.,
    arXiv 2402.14160 (without replacement: Π_k q(x_k) / (1 − q(x_1) − … − q(x_{k−1})));
    Hu et al., arXiv 2502.18779 (greedy: 1[x_{1..K−1} = G] · q'(x_K)).

    Examples
    --------
    >>> import otbound as ob
    >>> q = [0.2, 0.3, 0.5]
    >>> ob.draft_joint(q, 2).round(2).tolist()
    [[0.04, 0.06, 0.1], [0.06, 0.09, 0.15], [0.1, 0.15, 0.25]]
    >>> ob.draft_joint(q, 2, "without_replacement")[2].round(4).tolist()
    [0.2, 0.3, 0.0]
    """
    q = as_law(q, "q", ndim=1)
    law = draft_law(sampling)
    k = law.check_num_drafts(num_drafts, q)
    v = q.size
    if v**k > 5e7:
        raise InvalidInputError(f"draft_joint would need V^K = {v}^{k} entries; too large to enumerate")
    return law.joint(q, k)


def subset_mass(q, subset, num_drafts: int, sampling: str = "with_replacement") -> float:
    """Q(H) = P(all K drafts lie in H) for ``subset`` a boolean mask or index list over V.

    with replacement q(H)^K; greedy 1[G ⊆ H]·q'(H ∖ G); deterministic 1[G ⊆ H]; without replacement
    by the exponential-clock integral of :mod:`otbound.token._wor`; systematic a sum over its
    tuples (docs/theory/token-bounds.md).

    Parameters
    ----------
    q, num_drafts, sampling
        As :func:`sample_drafts`: the draft model's law (V,), K and the draft law.
    subset : array_like
        H, as a boolean mask of shape (V,) or a list of distinct integer token ids (a 0/1 integer list
        is ids, so ``[1, 0, 0]`` is refused as a repeated id).

    Returns
    -------
    float
        Q(H).

    Raises
    ------
    InvalidInputError
        ``q`` not a 1-D law, an unknown ``sampling``, an invalid K, or a malformed ``subset``
        (wrong mask shape, ids out of range or repeated).

    References
    ----------
    Hu et al., arXiv 2502.18779 (Q(H) in the dual α* = 1 + min_H [p(H) − Q(H)]).

    Examples
    --------
    >>> import otbound as ob
    >>> q = [0.2, 0.3, 0.5]
    >>> round(ob.subset_mass(q, [1, 2], 2), 6)  # (0.3 + 0.5)^2
    0.64
    >>> round(ob.subset_mass(q, [1, 2], 2, "greedy"), 6)  # G = {2} ⊆ H, q'({1}) = 0.6
    0.6
    >>> round(ob.subset_mass(q, [True, False, True], 2, "without_replacement"), 6)
    0.325
    """
    q = as_law(q, "q", ndim=1)
    law = draft_law(sampling)
    k = law.check_num_drafts(num_drafts, q)
    return law.subset_mass(q, _subset_mask(subset, q.size), k)


def _subset_mask(subset, v: int) -> np.ndarray:
    """``subset`` as a boolean mask over V: a boolean mask of shape (V,), or distinct integer token ids
    in [0, V). A 0/1 integer list is ids (never read as a mask); non-integers, duplicates and ids out
    of range are refused."""
    sub = np.asarray(subset.detach().cpu().numpy() if hasattr(subset, "detach") else subset)  # torch: keep its dtype
    if sub.dtype == bool:
        if sub.shape != (v,):
            raise InvalidInputError(f"subset mask has shape {sub.shape}, expected ({v},); give a mask or token ids")
        return sub
    if sub.size == 0:
        return np.zeros(v, dtype=bool)
    if sub.ndim != 1 or not np.issubdtype(sub.dtype, np.integer):
        raise InvalidInputError(
            f"subset must be a boolean mask or a 1-D list of integer token ids, got {sub.dtype} of shape {sub.shape}"
        )
    if sub.min() < 0 or sub.max() >= v:
        bad = int(sub.min() if sub.min() < 0 else sub.max())
        raise InvalidInputError(f"subset has a token id outside [0, {v}): {bad}")
    ids, counts = np.unique(sub, return_counts=True)
    if (counts > 1).any():
        raise InvalidInputError(f"subset repeats token ids {ids[counts > 1].tolist()}; give distinct ids (or a mask)")
    mask = np.zeros(v, dtype=bool)
    mask[sub] = True
    return mask


def inclusion_probabilities(q, num_drafts: int, sampling: str = "with_replacement") -> np.ndarray:
    """P(y ∈ x̄) for every token y (exact).

    with replacement 1 − (1 − q)^K; greedy 1 on G and q' elsewhere; deterministic 1 on G;
    without replacement 1 − Q(V ∖ {y}) by the exponential-clock integral (one evaluation per token
    with q > 0); systematic min(1, K q).

    Parameters
    ----------
    q, num_drafts, sampling
        As :func:`sample_drafts`: the draft model's law (V,), K and the draft law.

    Returns
    -------
    numpy.ndarray
        float64, shape (V,): P(y ∈ x̄) per token.

    Raises
    ------
    InvalidInputError
        ``q`` not a 1-D law, an unknown ``sampling``, or an invalid K.

    References
    ----------
    Hu et al., arXiv 2502.18779 (the upper relaxation Σ_y min(p(y), P(y ∈ x̄)) of α*).

    Examples
    --------
    >>> from otbound.token.draft_laws import inclusion_probabilities
    >>> q = [0.2, 0.3, 0.5]
    >>> inclusion_probabilities(q, 2).round(4).tolist()
    [0.36, 0.51, 0.75]
    >>> inclusion_probabilities(q, 2, "greedy").round(4).tolist()
    [0.4, 0.6, 1.0]
    """
    q = as_law(q, "q", ndim=1)
    law = draft_law(sampling)
    return law.inclusion(q, law.check_num_drafts(num_drafts, q))

# ---------------------------------------------------------------------------------------------
# the draft laws as objects (:class:`otbound.token._draft_law.DraftLaw`): each carries how K drafts
# are drawn, the joint law of the ordered tuple, Q(H), P(y ∈ x̄), its α* kernel on a LawBatch (a
# reference to the batched kernel of :mod:`otbound.token._kernel`), the law coupled in the lower
# relaxation, the check of a draft tuple, and its label and figure style. They are registered, in
# this order, at the end of this module.


def _unsorted_cpu(batch) -> bool:
    """Whether ``batch`` lives on the CPU and has not been sorted by ratio (then the greedy and
    deterministic laws' α* is cheaper row by row in numpy than sorting it)."""
    return not on_accelerator(batch.p) and "sorted" not in batch.__dict__


class WithReplacement(DraftLaw):
    """x_k ~ q i.i.d.; Q(H) = q(H)^K."""

    name = "with_replacement"
    method = "prefix"
    sorted_rows = True
    label = "with replacement"
    short = "wr"
    color = "#1f77b4"
    style = "-o"
    temperature = True

    def optimal_acceptance(self, batch, k, want_sets=False):
        return _kernel._with_replacement(batch, k, want_sets)

    def single_call(self, p, q, num_drafts):
        return _kernel.with_replacement_as_given(p, q, num_drafts)

    def sample(self, q, k, n, rng):
        return inverse_cdf(q, rng.random((n, k)))

    def joint(self, q, k):
        joint = q
        for _ in range(k - 1):
            joint = np.multiply.outer(joint, q)
        return joint

    def subset_mass(self, q, mask, k):
        return float(q[mask].sum() ** k)

    def inclusion(self, q, k):
        return 1.0 - (1.0 - q) ** k


class WithoutReplacement(DraftLaw):
    """Sequential draws renormalised after removing drawn tokens; Q(H) by exponential clocks."""

    name = "without_replacement"
    method = "prefix"
    sorted_rows = True
    label = "without replacement"
    short = "wor"
    color = "#d62728"
    style = "--s"
    distinct = True
    temperature = True

    def optimal_acceptance(self, batch, k, want_sets=False):
        if k == 1:  # one draw: the law with replacement
            return _kernel._with_replacement(batch, k, want_sets)
        return _kernel._without_replacement(batch, k, want_sets)

    def max_tuples(self, v, k):
        return math.perm(v, k)

    def sample(self, q, k, n, rng):
        return _sample_without_replacement(q, k, n, rng)

    def joint(self, q, k):
        v = q.size
        joint = np.zeros((v,) * k)
        support = np.flatnonzero(q > 0)
        for tup in itertools.permutations(support.tolist(), k):
            prob, left = 1.0, np.ones(v, dtype=bool)
            for x in tup:
                # the mass still undrawn is summed directly, never as 1 − drawn: no cancellation when
                # the drawn tokens hold almost all of q
                prob *= q[x] / q[left].sum()
                left[x] = False
            joint[tup] = prob
        return joint

    def subset_mass(self, q, mask, k):
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            return 0.0
        return float(_wor.wor_prefix_mass(q, idx, k)[-1])

    def inclusion(self, q, k):
        return 1.0 - _wor.wor_exclusion_mass(q, k)

    def check_drafts(self, q, drafts, k):
        super().check_drafts(q, drafts, k)
        if k > 1:
            s = np.sort(drafts, axis=1)
            rep = (s[:, 1:] == s[:, :-1]).any(axis=1)
            if rep.any():
                r = int(np.flatnonzero(rep)[0])
                raise InvalidInputError(
                    f"drafts row {r} = {drafts[r].tolist()} repeats a token; without replacement drafts are distinct"
                )


class _TopTokenLaw(DraftLaw):
    """A law drafting the top tokens G of q (greedy, deterministic): distinct drafts; α* row by row
    in numpy on CPU rows not yet sorted by ratio (:func:`otbound.token._kernel._top_law_rows`), else
    by the batched kernel ``_batched`` on the sorted rows."""

    method = "prefix"
    distinct = True
    _batched = None  # the batched kernel of the law, (batch, K, want_sets) -> (values, sets)

    def optimal_acceptance(self, batch, k, want_sets=False):
        if not want_sets and _unsorted_cpu(batch):
            return _kernel._torch().from_numpy(_kernel._top_law_rows(*batch.numpy_rows(), k, self.name)), None
        return type(self)._batched(batch, k, want_sets)

    def single_call(self, p, q, num_drafts):
        return _kernel.top_law_as_given(p, q, num_drafts, self.name)


class Greedy(_TopTokenLaw):
    """G = the K−1 most likely tokens of q, then x_K ~ q' = q|_{V∖G} / (1 − q(G));
    Q(H) = 1[G ⊆ H] · q'(H ∖ G)."""

    name = "greedy"
    label = "greedy"
    short = "greedy"
    color = "#2ca02c"
    style = ":^"
    _batched = staticmethod(_kernel._greedy)

    def max_tuples(self, v, k):
        return v - k + 1

    def sample(self, q, k, n, rng):
        g, qp = greedy_split(q, k)
        out = np.empty((n, k), dtype=np.int64)
        out[:, : k - 1] = g
        out[:, k - 1] = inverse_cdf(qp, rng.random(n))
        return out

    def joint(self, q, k):
        g, qp = greedy_split(q, k)
        joint = np.zeros((q.size,) * k)
        joint[tuple(g) + (slice(None),)] = qp
        return joint

    def subset_mass(self, q, mask, k):
        g, qp = greedy_split(q, k)
        return float(qp[mask].sum()) if mask[g].all() else 0.0

    def inclusion(self, q, k):
        g, qp = greedy_split(q, k)
        out = qp.copy()
        out[g] = 1.0
        return out

    def coupling_law(self, q, k):
        return greedy_split(q, k)[1]

    def check_drafts(self, q, drafts, k):
        g, qp = greedy_split(q, k)
        wrong = (drafts[:, : k - 1] != g).any(axis=1) | (qp[drafts[:, -1]] <= 0)
        if wrong.any():
            r = int(np.flatnonzero(wrong)[0])
            raise InvalidInputError(
                f"drafts row {r} = {drafts[r].tolist()} is not a greedy-law tuple: expected the top-(K-1) "
                f"tokens {g.tolist()} of q first, then a token outside them with q > 0"
            )


class Deterministic(_TopTokenLaw):
    """x̄ = G, the K most probable tokens of q (decreasing q, ties to the lower index), drawn with no
    randomness; Q(H) = 1[G ⊆ H] and α* = p(G) (docs/theory/token-bounds.md, the deterministic draft law)."""

    name = "deterministic"
    label = "deterministic"
    short = "deterministic"
    color = "#7f7f7f"
    style = "-.D"
    _batched = staticmethod(_kernel._deterministic)

    def max_tuples(self, v, k):
        return 1

    def sample(self, q, k, n, rng):
        return np.tile(_kernel.top_tokens(q, k), (n, 1))

    def joint(self, q, k):
        joint = np.zeros((q.size,) * k)
        joint[tuple(_kernel.top_tokens(q, k))] = 1.0
        return joint

    def subset_mass(self, q, mask, k):
        return float(mask[_kernel.top_tokens(q, k)].all())

    def inclusion(self, q, k):
        out = np.zeros(q.size)
        out[_kernel.top_tokens(q, k)] = 1.0
        return out

    def coupling_law(self, q, k):
        out = np.zeros(q.size)  # the first draft is argmax q, a point mass
        out[_kernel.top_tokens(q, 1)] = 1.0
        return out

    def check_drafts(self, q, drafts, k):
        g = _kernel.top_tokens(q, k)
        wrong = (drafts != g).any(axis=1)
        if wrong.any():
            r = int(np.flatnonzero(wrong)[0])
            raise InvalidInputError(
                f"drafts row {r} = {drafts[r].tolist()} is not the deterministic tuple: expected the top-{k} "
                f"tokens {g.tolist()} of q by decreasing q (ties to the lower index)"
            )


#: the registration: each law once, in the order of tables and figures (:data:`DRAFT_LAWS`)
for _law in (WithReplacement(), WithoutReplacement(), Greedy(), Deterministic(), Systematic()):
    register(_law)

#: the names of the laws measured, reported and planned when none is named (``default``), in order
SAMPLINGS = tuple(name for name, law in DRAFT_LAWS.items() if law.default)
