"""Single-draft block verifiers: token-level speculative sampling and block verification.

* :class:`TokenChain` (``"token"``) — speculative sampling token by token along the draft
  (Leviathan et al. 2211.17192; Chen et al. 2302.01318): accept ``X_i`` w.p.
  ``min(1, p(X_i|X_<i)/q(X_i|X_<i))``; at the first rejection emit a token from
  ``norm((p(·|X_<i) − q(·|X_<i))_+)``; if all ``L`` are accepted, a bonus token from ``p(·|X_{1:L})``.
* :class:`BlockVerification` (``"block"``) — Sun et al., "Block Verification Accelerates Speculative
  Decoding" (2403.10444), Alg. 2: ``p_0 = 1``, ``p_i = min{1, p_{i−1} p(X_i|X_<i)/q(X_i|X_<i)}``;
  ``h_L = p_L``, for ``i < L``
  ``h_i = Σ_x (p_i p(x|X_≤i) − q(x|X_≤i))_+ / (Σ_x (p_i p(x|X_≤i) − q(x|X_≤i))_+ + 1 − p_i)``
  (so ``h_0 = 1``); for ``i = L, L−1, …, 0`` draw a fresh ``η ~ U(0, 1)`` and stop at the first
  ``η ≤ h_i``: ``τ = i``, correction from ``p(·|X_{1:L})`` if ``τ = L`` else from
  ``norm((p_τ p(·|X_≤τ) − q(·|X_≤τ))_+)``. Optimal among single-draft lossless verifiers: its
  ``E[τ]`` equals ``U_causal`` at ``K = 1`` (tested).

Both read only the first draft when given ``K > 1`` drafts (their value is then the ``K = 1`` one).
"""

from __future__ import annotations

import numpy as np

from otbound.block.verifiers._base import BlockVerifier
from otbound.token.verifiers import residual


def block_schedule(target, draft, tokens: tuple, *, root_p: float = 1.0, root_law=None) -> list:
    """Block verification's tests ``[(i, h_i, correction law), …]`` for ``i = L..0`` (Sun et al. Alg. 2).

    ``draft(prefix)`` is the draft's next-token law (a model, or any law the block was drawn from).
    ``root_p`` / ``root_law``: the running ``p_0`` and the target's law at the root (default 1 and
    ``target(())``); traversal verification chains blocks through them, feeding each block the
    previous one's ``(h_0, law_0)``.
    """
    length = len(tokens)

    def law_at(i):
        return root_law if i == 0 and root_law is not None else target(tokens[:i])

    ps = [float(root_p)]
    for i, x in enumerate(tokens):
        ps.append(min(1.0, ps[-1] * float(law_at(i)[x]) / float(draft(tokens[:i])[x])))
    sched = [(length, ps[length], target(tokens))]
    for i in range(length - 1, -1, -1):
        p_here = law_at(i)
        pos = np.maximum(ps[i] * p_here - draft(tokens[:i]), 0.0)
        s = float(pos.sum())
        den = s + (1.0 - ps[i])  # not (s + 1) − p_i: that loses s when s ≪ 1
        # den = 0 only when p_i = 1 and p = q at this node: the walk stops earlier with probability 1
        h = s / den if den > 0 else 1.0
        sched.append((i, h, pos / s if s > 0 else p_here))
    return sched


def walk_schedule(tokens: tuple, sched: list, coin):
    """Run the tests ``i = L..1``; ``h_0 = 1`` (no test) ends the scan at the root."""
    for i, h, law in sched[:-1]:
        if coin(h):
            return tokens[:i], law
    return (), sched[-1][2]


class TokenChain(BlockVerifier):
    """Token-by-token speculative sampling of one draft block: accept ``x_i`` with probability
    ``min(1, p(x_i)/q(x_i))`` along the block, correct from ``(p − q)₊`` at the first rejection,
    bonus token from p after a full acceptance; E[τ] = Σ_ℓ Π_{i≤ℓ} α_i on context-free laws.

    References
    ----------
    Leviathan, Kalman, Matias, arXiv 2211.17192; Chen et al., arXiv 2302.01318.

    Examples
    --------
    On Sun et al.'s toy (2403.10444: p = (1/3, 2/3), q = (2/3, 1/3) at every prefix) each token is
    accepted with α = Σ_x min(p, q) = 2/3, so at L = 2, E[τ] = α + α² = 10/9:

    >>> import otbound as ob
    >>> t, d = ob.context_free_model([1 / 3, 2 / 3]), ob.context_free_model([2 / 3, 1 / 3])
    >>> e = ob.BLOCK_VERIFIERS['token'].acceptance(t, d, vocab_size=2, num_drafts=1, block_len=2)
    >>> abs(e - (2 / 3 + (2 / 3) ** 2)) < 1e-12
    True
    """
    name = "token"
    reference = "speculative sampling (Leviathan et al. 2211.17192; Chen et al. 2302.01318)"
    lossless = True

    def prepare(self, target, draft, drafts, cache):
        tokens = drafts[0]
        steps = []
        for i, x in enumerate(tokens):
            pre = tokens[:i]
            p, q = target(pre), draft(pre)
            steps.append((min(1.0, float(p[x]) / float(q[x])), residual(p, q)))
        return tokens, steps, target(tokens)

    def walk(self, inst, coin, draw):
        tokens, steps, bonus = inst
        for i, (acc, res) in enumerate(steps):
            if not coin(acc):
                return tokens[:i], res
        return tokens, bonus


class BlockVerification(BlockVerifier):
    """Block verification of one draft block (Sun et al., Alg. 2): the longest prefix is accepted at
    once by the schedule of prefix weights, optimal among single-draft verifiers (E[τ] = U_causal at
    K = 1).

    References
    ----------
    Sun et al., "Block verification accelerates speculative decoding", arXiv 2403.10444.

    Examples
    --------
    On Sun et al.'s toy (above; L = 2) E[τ] = 11/9 is U_causal at K = 1, the most any lossless
    single-draft verifier accepts (token by token: 10/9):

    >>> import otbound as ob
    >>> t, d = ob.context_free_model([1 / 3, 2 / 3]), ob.context_free_model([2 / 3, 1 / 3])
    >>> kw = dict(vocab_size=2, num_drafts=1, block_len=2)
    >>> bound = ob.block_bound(t, d, kind="causal", **kw).value
    >>> abs(ob.BLOCK_VERIFIERS['block'].acceptance(t, d, **kw) - bound) < 1e-12, round(9 * bound, 9)
    (True, 11.0)
    """
    name = "block"
    reference = "block verification (Sun et al. 2403.10444, Alg. 2)"
    lossless = True

    def prepare(self, target, draft, drafts, cache):
        tokens = drafts[0]
        return tokens, block_schedule(target, draft, tokens)

    def walk(self, inst, coin, draw):
        return walk_schedule(*inst, coin)
