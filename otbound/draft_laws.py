"""Draft laws: the joint law Q of the K-draft tuple x̄ = (x_1..x_K) built from the draft model's q.

Laws (theory.md §2):

* ``with_replacement`` — x_k ~ q i.i.d. (SpecInfer 2305.09781, SpecTr 2310.15141).
  Q(H) = q(H)^K.
* ``without_replacement`` — sequential draws renormalised after removing drawn tokens (equivalently
  the Gumbel-top-K of log q) (Jeon et al. 2402.14160). Q(H) by exponential clocks, see
  :mod:`otbound._wor`.
* ``greedy`` — G = the K−1 most likely tokens of q (ties broken by lower index), deterministic, and a
  last draft x_K ~ q' = q|_{V∖G} / (1 − q(G)) (Hu et al. 2502.18779; SpecHub 2411.05289 is K = 2).
  Q(H) = 1[G ⊆ H] · q'(H ∖ G).

All functions take a 1-D law ``q`` over the vocabulary ``V``.
"""

from __future__ import annotations

import itertools

import numpy as np

from otbound._validation import InvalidInputError, as_law, check_num_drafts, check_sampling


def greedy_split(q, num_drafts: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(G, q_prime)`` for the greedy law: the K−1 top tokens of q and the last draft's law.

    ``G`` lists the tokens by decreasing q (ties: lower index first); ``q_prime`` is q with G zeroed,
    renormalised. Needs at least K tokens with q > 0.
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
    """Draw ``size`` draft tuples from the law; returns int64 array of shape ``(size, K)``."""
    q = as_law(q, "q", ndim=1)
    check_sampling(sampling)
    k = check_num_drafts(num_drafts, q, sampling)
    rng = np.random.default_rng(rng)
    n = int(size)
    if sampling == "with_replacement":
        return _inverse_cdf(q, rng.random((n, k)))
    if sampling == "greedy":
        g, qp = greedy_split(q, k)
        out = np.empty((n, k), dtype=np.int64)
        out[:, : k - 1] = g
        out[:, k - 1] = _inverse_cdf(qp, rng.random(n))
        return out
    return _sample_without_replacement(q, k, n, rng)


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
            out[i, r] = _inverse_cdf(rest / rest.sum(), rng.random(1))[0]
    return out


_MAX_REJECTIONS = 16


def _cdf(q: np.ndarray) -> tuple[np.ndarray, int]:
    """``(cumsum(q), last token with q > 0)``: what :func:`_draw` needs, computed once per law."""
    return np.cumsum(q), int(np.flatnonzero(q > 0)[-1])


def _draw(cdf: tuple[np.ndarray, int], u: np.ndarray) -> np.ndarray:
    """Tokens at uniforms ``u`` by inverse CDF (never past the last token of positive mass)."""
    cum, last = cdf
    return np.minimum(np.searchsorted(cum, u * cum[-1], side="right"), last).astype(np.int64)


def _inverse_cdf(q: np.ndarray, u: np.ndarray) -> np.ndarray:
    return _draw(_cdf(q), u)


def draft_joint(q, num_drafts: int, sampling: str = "with_replacement") -> np.ndarray:
    """The joint law Q(x̄) of the ordered draft tuple as a float64 array of shape ``(V,)*K``.

    Memory is V^K: for small vocabularies (the primal LP, brute force, exact enumeration).
    """
    q = as_law(q, "q", ndim=1)
    check_sampling(sampling)
    k = check_num_drafts(num_drafts, q, sampling)
    v = q.size
    if v**k > 5e7:
        raise InvalidInputError(f"draft_joint would need V^K = {v}^{k} entries; too large to enumerate")
    if sampling == "with_replacement":
        joint = q
        for _ in range(k - 1):
            joint = np.multiply.outer(joint, q)
        return joint
    if sampling == "greedy":
        g, qp = greedy_split(q, k)
        joint = np.zeros((v,) * k)
        joint[tuple(g) + (slice(None),)] = qp
        return joint
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


def subset_mass(q, subset, num_drafts: int, sampling: str = "with_replacement") -> float:
    """Q(H) = P(all K drafts lie in H) for ``subset`` a boolean mask of shape (V,) or a list of distinct
    integer token ids (a 0/1 integer list is ids, so ``[1, 0, 0]`` is refused as a repeated id)."""
    q = as_law(q, "q", ndim=1)
    k = check_num_drafts(num_drafts, q, sampling)
    mask = _subset_mask(subset, q.size)
    if sampling == "with_replacement":
        return float(q[mask].sum() ** k)
    if sampling == "greedy":
        g, qp = greedy_split(q, k)
        return float(qp[mask].sum()) if mask[g].all() else 0.0
    from otbound._wor import wor_prefix_mass

    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return 0.0
    return float(wor_prefix_mass(q, idx, k)[-1])


def _subset_mask(subset, v: int) -> np.ndarray:
    """``subset`` as a boolean mask over V: a boolean mask of shape (V,), or distinct integer token ids
    in [0, V). A 0/1 integer list is ids (never read as a mask); non-integers, duplicates and ids out
    of range are refused."""
    sub = np.asarray(subset.detach().cpu().numpy() if hasattr(subset, "detach") else subset)  # torch: keep its dtype
    if sub.dtype == bool:
        if sub.shape != (v,):
            raise InvalidInputError(f"subset mask has shape {sub.shape}, expected ({v},); give a boolean mask or token ids")
        return sub
    if sub.size == 0:
        return np.zeros(v, dtype=bool)
    if sub.ndim != 1 or not np.issubdtype(sub.dtype, np.integer):
        raise InvalidInputError(f"subset must be a boolean mask or a 1-D list of integer token ids, got {sub.dtype} of shape {sub.shape}")
    if sub.min() < 0 or sub.max() >= v:
        raise InvalidInputError(f"subset has a token id outside [0, {v}): {int(sub.min() if sub.min() < 0 else sub.max())}")
    ids, counts = np.unique(sub, return_counts=True)
    if (counts > 1).any():
        raise InvalidInputError(f"subset repeats token ids {ids[counts > 1].tolist()}; give distinct ids (or a boolean mask)")
    mask = np.zeros(v, dtype=bool)
    mask[sub] = True
    return mask


def inclusion_probabilities(q, num_drafts: int, sampling: str = "with_replacement") -> np.ndarray:
    """P(y ∈ x̄) for every token y (exact).

    with replacement 1 − (1 − q)^K; greedy 1 on G and q' elsewhere; without replacement
    1 − Q(V ∖ {y}) by the exponential-clock integral (one evaluation per token with q > 0).
    """
    q = as_law(q, "q", ndim=1)
    k = check_num_drafts(num_drafts, q, sampling)
    if sampling == "with_replacement":
        return 1.0 - (1.0 - q) ** k
    if sampling == "greedy":
        g, qp = greedy_split(q, k)
        out = qp.copy()
        out[g] = 1.0
        return out
    from otbound._wor import wor_exclusion_mass

    return 1.0 - wor_exclusion_mass(q, k)
