"""Draft laws: the joint law Q of the K-draft tuple x̄ = (x_1..x_K) built from the draft model's q.

Laws (theory.md §2):

* ``with_replacement`` — x_k ~ q i.i.d. (SpecInfer 2305.09781, SpecTr 2310.15141).
  Q(H) = q(H)^K.
* ``without_replacement`` — sequential draws renormalised after removing drawn tokens (equivalently
  the Gumbel-top-K of log q) (Jeon et al. 2402.14160). Q(H) by exponential clocks, see
  :mod:`otbound.token._wor`.
* ``greedy`` — G = the K−1 most likely tokens of q (ties broken by lower index), deterministic, and a
  last draft x_K ~ q' = q|_{V∖G} / (1 − q(G)) (Hu et al. 2502.18779; SpecHub 2411.05289 is K = 2).
  Q(H) = 1[G ⊆ H] · q'(H ∖ G).

All functions take a 1-D law ``q`` over the vocabulary ``V``.
"""

from __future__ import annotations

import numpy as np

from otbound._validation import InvalidInputError, as_law, check_num_drafts


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
    """
    q = as_law(q, "q", ndim=1)
    return _greedy_split(q, check_num_drafts(num_drafts, q, "greedy"))


def _greedy_split(q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`greedy_split` on a checked law (also the hot path of the greedy bound over batches)."""
    g = _top_tokens(q, k - 1)
    rest = q.copy()
    rest[g] = 0.0
    return g, rest / rest.sum()


def _top_tokens(q: np.ndarray, m: int) -> np.ndarray:
    """Indices of the m largest entries of q by decreasing q, ties to the lower index (the first m
    of a stable sort of −q), found by a partition: O(V + m log m) instead of a full sort."""
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    v = q.size
    part = np.argpartition(q, v - m)[v - m :]
    thr = q[part].min()
    if int(np.count_nonzero(q == thr)) != int(np.count_nonzero(q[part] == thr)):  # ties cut at the threshold
        above = np.flatnonzero(q > thr)
        part = np.concatenate([above, np.flatnonzero(q == thr)[: m - above.size]])
    return part[np.lexsort((part, -q[part]))].astype(np.int64)


def sample_drafts(q, num_drafts: int, sampling: str = "with_replacement", size: int = 1, rng=None) -> np.ndarray:
    """Draw ``size`` draft tuples from the law ``sampling`` built from ``q``.

    Parameters
    ----------
    q : array_like, shape (V,)
        The draft model's next-token law.
    num_drafts : int
        K, the number of drafts per tuple.
    sampling : {"with_replacement", "without_replacement", "greedy"}
        The draft law (module docstring; :data:`DRAFT_LAWS`).
    size : int
        Number of tuples.
    rng : numpy Generator, seed or None

    Returns
    -------
    numpy.ndarray
        int64 array of shape ``(size, K)``.
    """
    from otbound.token.laws import draft_law  # the law objects build on this module

    q = as_law(q, "q", ndim=1)
    law = draft_law(sampling)
    k = check_num_drafts(num_drafts, q, sampling)
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


def _cdf(q: np.ndarray) -> tuple[np.ndarray, int]:
    """``(cumsum(q), last token with q > 0)``: what :func:`_draw` needs, computed once per law."""
    return np.cumsum(q), int(np.flatnonzero(q > 0)[-1])


def _draw(cdf: tuple[np.ndarray, int], u: np.ndarray) -> np.ndarray:
    """Tokens at uniforms ``u`` by inverse CDF (never past the last token of positive mass)."""
    cum, last = cdf
    return np.minimum(np.searchsorted(cum, u * cum[-1], side="right"), last).astype(np.int64)


def inverse_cdf(q: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Tokens of law ``q`` at uniforms ``u`` (inverse CDF; shared by the token and block samplers)."""
    return _draw(_cdf(q), u)


def draft_joint(q, num_drafts: int, sampling: str = "with_replacement") -> np.ndarray:
    """The joint law Q(x̄) of the ordered draft tuple.

    Memory is V^K: for small vocabularies (the primal LP, brute force, exact enumeration).

    Parameters
    ----------
    q : array_like, shape (V,)
        The draft model's next-token law.
    num_drafts : int
        K, the number of drafts.
    sampling : {"with_replacement", "without_replacement", "greedy"}
        The draft law.

    Returns
    -------
    numpy.ndarray
        float64 array of shape ``(V,)*K``; ``Q[x_1, ..., x_K]`` is the probability of the ordered tuple.
    """
    from otbound.token.laws import draft_law

    q = as_law(q, "q", ndim=1)
    law = draft_law(sampling)
    k = check_num_drafts(num_drafts, q, sampling)
    v = q.size
    if v**k > 5e7:
        raise InvalidInputError(f"draft_joint would need V^K = {v}^{k} entries; too large to enumerate")
    return law.joint(q, k)


def subset_mass(q, subset, num_drafts: int, sampling: str = "with_replacement") -> float:
    """Q(H) = P(all K drafts lie in H) for ``subset`` a boolean mask or index list over V.

    with replacement q(H)^K; greedy 1[G ⊆ H]·q'(H ∖ G); without replacement by the exponential-clock
    integral of :mod:`otbound.token._wor` (theory.md §2).

    Parameters
    ----------
    q : array_like, shape (V,)
        The draft model's next-token law.
    subset : array_like
        H, as a boolean mask of shape (V,) or a list of distinct integer token ids (a 0/1 integer list
        is ids, so ``[1, 0, 0]`` is refused as a repeated id).
    num_drafts : int
        K.
    sampling : {"with_replacement", "without_replacement", "greedy"}
        The draft law.

    Returns
    -------
    float
        Q(H).
    """
    q = as_law(q, "q", ndim=1)
    k = check_num_drafts(num_drafts, q, sampling)
    mask = _subset_mask(subset, q.size)
    from otbound.token.laws import DRAFT_LAWS

    return DRAFT_LAWS[sampling].subset_mass(q, mask, k)


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

    with replacement 1 − (1 − q)^K; greedy 1 on G and q' elsewhere; without replacement
    1 − Q(V ∖ {y}) by the exponential-clock integral (one evaluation per token with q > 0).
    """
    from otbound.token.laws import DRAFT_LAWS

    q = as_law(q, "q", ndim=1)
    k = check_num_drafts(num_drafts, q, sampling)
    return DRAFT_LAWS[sampling].inclusion(q, k)
