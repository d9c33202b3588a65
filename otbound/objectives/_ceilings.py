"""What a drafter objective can gain at most, per block draft law (implementation).

A block-diffusion drafter's law of the drafted block is one of the families of
:data:`otbound.block.BLOCK_DRAFT_LAWS` (product of marginals, argmax chain, top-k Markov selector),
and with one drafted block block verification attains ``U_causal`` of the law
(:func:`otbound.block.block_draft_law_bounds`). At the population optimum (unlimited capacity, the
target's own samples):

* **cross-entropy** per position (:func:`otbound.objectives.position_weighted_ce`, every ``γ``:
  each position's term is minimised by the target's marginal ``m_i`` independently), with a pairwise
  head for the Markov selector's transitions, gives the law built from the target's own marginals
  and transitions (:func:`otbound.block.block_marginals`);
* the **chain term** with target laws, ``Σ_k Π_{j≤k} ⟨m_j, q_j⟩``, is maximised factor by factor by a
  one-hot ``q_j`` at ``argmax m_j``: the argmax chain of the same marginals;
* the **exact term** (:func:`otbound.objectives.expected_accepted_length`, block verification)
  maximised over the family gives the family's ceiling, ``max_θ U_causal(law_θ)``.

The gain an objective can add over cross-entropy within a family is at most ``ceiling − CE value``;
the gap ``L − ceiling`` is what the family itself loses (the target's own block law reaches ``L``).
Ceilings: exact for the argmax chain (every block enumerated); for the product and the Markov
selector a local search (Adam on logits of the exact term, started from the cross-entropy optimum
and from random points), so a lower bound on the family's maximum that is at least the CE value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from otbound._validation import InvalidInputError, check_positive_int
from otbound.block import BLOCK_DRAFT_LAWS, TopKMarkov, block_marginals, prefix_law
from otbound.block.models import as_block_model
from otbound.objectives._exact import MAX_PATHS, survival


@dataclass
class BlockLawGains:
    """Per block draft law: E[τ] at the cross-entropy optimum, the family's ceiling and the gain.

    Returned by :func:`otbound.objectives.block_law_gains`. Values are E[τ] of one drafted block
    under block verification (= U_causal of the law), bonus excluded; ``block_len`` is the most.

    Attributes
    ----------
    laws : tuple of str
        ``("marginal_product", "argmax_chain", "topk_markov")``.
    ce : numpy.ndarray
        E[τ] of the law built from the target's own marginals (and transitions): the optimum of
        per-position cross-entropy (the chain term's optimum is the ``argmax_chain`` row).
    ceiling : numpy.ndarray
        The family's best E[τ] (``method`` says how it was found).
    gain : numpy.ndarray
        ``ceiling − ce``: the most any objective can add over cross-entropy within the family.
    method : tuple of str
        ``"exact"`` (enumeration) or ``"local search"`` (a lower bound on the maximum, ≥ ``ce``).
    block_len : int
        L.
    top_k : int
        k of the Markov selector.

    Examples
    --------
    >>> from otbound.block import tabulated_model
    >>> from otbound.objectives import block_law_gains
    >>> copy = tabulated_model({(): [0.5, 0.5]}, 2, default=lambda pre: [1.0 - pre[0], float(pre[0])])
    >>> g = block_law_gains(copy, 2, steps=50, restarts=1)
    >>> g.ce.round(6).tolist(), g.method
    ([1.5, 1.0, 2.0], ('local search', 'exact', 'local search'))
    >>> bool(g.ceiling[0] >= 1.5 - 1e-9), round(float(g.ceiling[1]), 6)   # the best fixed block: 0.5 + 0.5
    (True, 1.0)
    """

    laws: tuple
    ce: np.ndarray
    ceiling: np.ndarray
    gain: np.ndarray
    method: tuple
    block_len: int
    top_k: int


def _target_levels(target, length: int) -> list:
    v = target.vocab_size
    return [torch.tensor(np.stack([target(pre) for pre in np.ndindex(*(v,) * i)]), dtype=torch.float64)
            for i in range(length)]


def _value(levels_p, levels_q) -> torch.Tensor:
    return survival(levels_q, levels_p, "block", False).sum(-1)


def _product_levels(logits: torch.Tensor) -> list:
    q = torch.softmax(logits, dim=-1)  # (L, V)
    return [q[i : i + 1] for i in range(q.shape[0])]


def _markov_levels(first: torch.Tensor, trans: torch.Tensor, mask: torch.Tensor) -> list:
    """first (V,), trans (L−1, V, V) logits; mask (L, V) candidates: the truncated Markov law as tree levels."""
    neg = torch.tensor(-torch.inf, dtype=first.dtype)
    v = first.shape[0]
    out = [torch.softmax(torch.where(mask[0], first, neg), dim=-1)[None]]
    for i in range(1, mask.shape[0]):
        rows = torch.softmax(torch.where(mask[i][None], trans[i - 1], neg), dim=-1)  # (V, V)
        out.append(rows[torch.arange(v**i) % v])  # (V^i, V): the row of each prefix's last token
    return out


def _ascend(params: list, levels_of, levels_p, steps: int) -> float:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tensors of a few dozen entries: thread hand-offs cost more than the work
    try:
        return _ascend_steps(params, levels_of, levels_p, steps)
    finally:
        torch.set_num_threads(threads)


def _ascend_steps(params: list, levels_of, levels_p, steps: int) -> float:
    opt = torch.optim.Adam(params, lr=0.1)
    best = float(_value(levels_p, levels_of()).detach())
    for _ in range(steps):
        opt.zero_grad()
        val = _value(levels_p, levels_of())
        (-val).backward()
        opt.step()
        best = max(best, float(val.detach()))
    return max(best, float(_value(levels_p, levels_of()).detach()))


def block_law_gains(target, block_len: int, *, top_k: int = 2, restarts: int = 2, steps: int = 200, seed: int = 0,
                    vocab_size: int | None = None) -> BlockLawGains:
    """What a drafter objective can gain at most over cross-entropy, per block draft law.

    For each law of :data:`otbound.block.BLOCK_DRAFT_LAWS` (module :mod:`otbound.objectives._ceilings`):
    E[τ] of the law at the cross-entropy optimum (the target's own marginals and transitions), the
    family's ceiling (the exact term maximised) and their difference.

    Parameters
    ----------
    target : BlockModel or callable
        The target, ``prefix -> next-token law`` (``V^L`` blocks are enumerated).
    block_len : int
        L.
    top_k : int
        k of the Markov path selector.
    restarts : int
        Random starting points of the local search, besides the cross-entropy optimum.
    steps : int
        Adam steps per start (learning rate 0.1, float64).
    seed : int
        Seed of the random starts.
    vocab_size : int, optional
        Needed when ``target`` is a plain callable.

    Returns
    -------
    BlockLawGains

    Raises
    ------
    otbound.InvalidInputError
        Bad sizes, or ``V^L`` above :data:`otbound.objectives.MAX_PATHS`.

    References
    ----------
    Whalen, Ito & Sakamoto, "Teaching Diffusion to Speculate Left-to-Right", arXiv 2606.11552 (the
    objectives); Sun et al., arXiv 2403.10444 (block verification attains U_causal for one block).

    Examples
    --------
    >>> from otbound.block import dirichlet_model
    >>> from otbound.objectives import block_law_gains
    >>> g = block_law_gains(dirichlet_model(3, seed=0), 2, steps=30, restarts=0)
    >>> bool((g.gain >= -1e-12).all() and (g.ceiling <= 2).all())
    True
    """
    length = check_positive_int(block_len, "block_len")
    k = check_positive_int(top_k, "top_k")
    n_restarts = int(restarts)
    if n_restarts < 0:
        raise InvalidInputError(f"restarts must be a non-negative integer, got {restarts!r}")
    n_steps = check_positive_int(steps, "steps")
    v = vocab_size or getattr(target, "vocab_size", None)
    if v is None:
        raise InvalidInputError("pass the target as a BlockModel or give vocab_size")
    target = as_block_model(target, int(v), "target")
    if v**length > MAX_PATHS:
        raise InvalidInputError(f"V^L = {v ** length} blocks, above MAX_PATHS = {MAX_PATHS}: lower L")
    m, t = block_marginals(target, length)
    markov = TopKMarkov(k)
    levels_p = _target_levels(target, length)
    # E[τ] of block verification = U_causal of the law (one block; block_draft_law_bounds by LP, tested equal)
    ce = np.array([float(_value(levels_p, _target_levels(law.law_model(m, t), length)))
                   for law in (BLOCK_DRAFT_LAWS["marginal_product"], BLOCK_DRAFT_LAWS["argmax_chain"], markov)])
    gen = torch.Generator().manual_seed(int(seed))
    # product of marginals: start at the CE optimum, then random logits
    starts = [torch.log(torch.tensor(m).clamp_min(1e-12))] + [torch.randn((length, v), generator=gen,
                                                                           dtype=torch.float64) for _ in
                                                              range(n_restarts)]
    product = ce[0]
    for s in starts:
        logits = s.clone().requires_grad_(True)
        product = max(product, _ascend([logits], lambda lg=logits: _product_levels(lg), levels_p, n_steps))
    # argmax chain: the best fixed block, every block enumerated (Σ_ℓ p(x_{1:ℓ}) along it)
    path = np.zeros((v,) * length)
    for ell in range(1, length + 1):
        path = path + prefix_law(target, ell).reshape((v,) * ell + (1,) * (length - ell))
    chain = float(path.max())
    # top-k Markov selector on the CE drafter's candidates: transitions searched
    mask = torch.zeros((length, v), dtype=torch.bool)
    for i in range(length):
        mask[i, np.lexsort((np.arange(v), -m[i]))[:k]] = True
        mask[i] &= torch.tensor(m[i] > 0)
    ce_levels = markov.law_model(m, t)
    first0 = torch.log(torch.tensor(ce_levels(())).clamp_min(1e-12))
    trans0 = torch.zeros((max(length - 1, 0), v, v), dtype=torch.float64)
    for i in range(1, length):
        for a in range(v):
            trans0[i - 1, a] = torch.log(torch.tensor(ce_levels((0,) * (i - 1) + (a,))).clamp_min(1e-12))
    markov_best = ce[2]
    m_starts = [(first0, trans0)] + [(torch.randn(v, generator=gen, dtype=torch.float64),
                                      torch.randn(trans0.shape, generator=gen, dtype=torch.float64))
                                     for _ in range(n_restarts)]
    for f0, t0 in m_starts:
        first, trans = f0.clone().requires_grad_(True), t0.clone().requires_grad_(True)
        markov_best = max(markov_best, _ascend([first, trans], lambda f=first, tr=trans: _markov_levels(f, tr, mask),
                                               levels_p, n_steps))
    ceiling = np.array([product, chain, markov_best])
    return BlockLawGains(("marginal_product", "argmax_chain", "topk_markov"), ce, ceiling, ceiling - ce,
                         ("local search", "exact", "local search"), length, k)
