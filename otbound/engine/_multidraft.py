"""llama.cpp's multi-draft example (``examples/speculative/speculative.cpp``), one position, ported line
for line so that the conformance kit can enumerate its output law.

What the example does at temperature > 0 (llama-cpp-python 0.3.36's vendored tree):

* **Drafting** — each draft sequence runs the draft's sampler chain (``common_sampler_sample``),
  then reads the candidates *sorted by probability* (``common_sampler_get_candidates(smpl, true)``)
  and drafts ``cur_p->data[0].id`` (a split sequence ``s`` takes ``cur_p->data[s].id`` when its
  probability exceeds ``--draft-p-split``): the draft's most likely tokens, not the token the sampler
  drew. At one position the K sequences draft the top-K of the draft's post-sampling law ``q``.
* **Verification** — while sequences are active, one is picked uniformly at random; its drafted
  token ``x`` is accepted when a uniform ``r ≤ p_tgt(x) / p_dft(x)`` (``p_tgt`` from the current
  target list, ``p_dft`` from that sequence's stored draft list); on a rejection the target list
  becomes the residual, formed by sorting **both candidate lists by token id** and subtracting them
  **entry by entry** (``dist_tgt[i].p = max(0, dist_tgt[i].p − dist_dft[i].p)``, entries past the
  draft list's end kept), then normalised. When every sequence is rejected, a token is drawn from
  the residual (a residual that vanishes, as disjoint lists can make it, is 0/0 in the example).

Two defects follow. (1) A deterministic draft verified by the rule of sampled drafts: with one
sequence the output law is ``a·δ_x + (1 − a)·(p − q)₊/Z`` with ``x = argmax q`` and
``a = min(1, p(x)/q(x))``, which is ``p`` only in degenerate cases — lossy at every vocabulary and
every sampling setting. (2) The entry-by-entry residual is ``(p − q)₊`` only when both candidate
lists hold the same tokens: under top-k / top-p / min-p truncation with different kept sets it
subtracts one token's draft probability from another token's target probability, lossy even with
drafts sampled from ``q``. :func:`llama_speculative_verify` reproduces the example;
checked with drafts drawn
from ``q`` (the kit's ``"with_replacement"`` draft law) it shows (2) on its own.
"""

from __future__ import annotations

import numpy as np

from otbound.conformance import enumerate_outcomes


def _candidates(law: np.ndarray) -> list[tuple[int, float]]:
    """The candidate list llama.cpp keeps after its sampler chain: the tokens of positive probability."""
    return [(int(i), float(law[i])) for i in np.flatnonzero(law > 0)]


def _residual_by_id(tgt: list, dft: list) -> list:
    """``speculative.cpp``'s residual: both lists sorted by id, subtracted entry by entry, normalised, then
    sorted by probability (descending)."""
    tgt = sorted(tgt, key=lambda e: e[0])
    dft = sorted(dft, key=lambda e: e[0])
    out = [(tid, max(0.0, tp - dft[i][1]) if i < len(dft) else max(0.0, tp)) for i, (tid, tp) in enumerate(tgt)]
    total = sum(p for _, p in out)
    out = [(tid, p / total) for tid, p in out] if total > 0 else out
    return sorted(out, key=lambda e: -e[1])


def llama_speculative_verify(p, q, drafts, coin, draw):
    """One position of ``llama-speculative``'s stochastic verification (module docstring).

    ``p``, ``q``: the target's and the draft's post-sampling laws (V,); ``drafts``: the tokens the
    sequences drafted at this position (the top-K of ``q`` in the example: the kit's ``"greedy"``
    draft law); ``coin`` / ``draw``: the conformance kit's primitives. Returns the emitted token.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.conformance import check_token_verifier
    >>> from otbound.engine._multidraft import llama_speculative_verify
    >>> res = check_token_verifier(llama_speculative_verify, vocab_size=3, num_drafts=1, sampling="greedy",
    ...                            instances=4)
    >>> res.passed, res.lossless_error > 0.05
    (False, True)

    With drafts sampled from ``q`` and the same candidates in both lists its residual is ``(p − q)₊``
    (SpecInfer's recursive rejection sampling); with different candidates (a zero in ``q`` where ``p``
    has mass, as top-k truncation makes) it is not:

    >>> full = [(np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.4, 0.3, 0.2, 0.1]))]
    >>> check_token_verifier(llama_speculative_verify, vocab_size=4, num_drafts=2, instances=full).passed
    True
    >>> cut = [(np.array([0.5, 0.5]), np.array([0.0, 1.0]))]
    >>> res = check_token_verifier(llama_speculative_verify, vocab_size=2, num_drafts=1, instances=cut)
    >>> res.passed, res.counterexample.output_law.tolist()
    (False, [0.0, 1.0])
    """
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    V = p.size
    dist_tgt = sorted(_candidates(p), key=lambda e: -e[1])
    dist_dft = _candidates(q)
    active = list(range(len(drafts)))
    while active:
        pick = np.zeros(V)
        pick[: len(active)] = 1.0 / len(active)
        s = active[int(draw(pick))]          # u_int_dist over the active sequences
        x = int(drafts[s])
        p_tgt = next((pr for t, pr in dist_tgt if t == x), 0.0)
        p_dft = next((pr for t, pr in dist_dft if t == x), 0.0)
        ratio = p_tgt / p_dft if p_dft > 0 else np.inf
        if coin(min(1.0, ratio)):           # r <= p_tgt / p_dft with r ~ U[0, 1)
            return x
        dist_tgt = _residual_by_id(dist_tgt, dist_dft)
        active.remove(s)
    law = np.zeros(V)
    for t, pr in dist_tgt:
        law[t] += pr
    if law.sum() == 0:
        # the residual vanished (disjoint lists paired entry by entry): speculative.cpp divides 0 by 0,
        # and libstdc++'s discrete_distribution over NaN weights returns index 0, the smallest id
        return min(t for t, _ in dist_tgt)
    return int(draw(law / law.sum()))


def top_k_law(law, k: int) -> np.ndarray:
    """``law`` restricted to its ``k`` most likely tokens and renormalised (llama.cpp's top-k then softmax).

    Examples
    --------
    >>> from otbound.engine._multidraft import top_k_law
    >>> top_k_law([0.1, 0.5, 0.4], 2).tolist()
    [0.0, 0.5555555555555556, 0.4444444444444444]
    """
    law = np.asarray(law, dtype=np.float64)
    keep = np.argsort(-law, kind="stable")[: int(k)]
    out = np.zeros_like(law)
    out[keep] = law[keep]
    return out / out.sum()


def output_law(verify, p, q, drafts) -> np.ndarray:
    """The exact output law of ``verify`` at fixed ``drafts`` (the kit's enumeration of its coins and draws)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    law = np.zeros(p.size)
    for prob, y in enumerate_outcomes(lambda coin, draw: verify(p, q, np.asarray(drafts), coin, draw),
                                      vocab_size=p.size):
        law[y] += prob
    return law
