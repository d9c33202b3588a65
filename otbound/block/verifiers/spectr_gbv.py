"""SpecTr-GBV (Lin, Sheng, Cai, Zhou, "SpecTr-GBV: Multi-Draft Block Verification Accelerating
Speculative Decoding", arXiv 2604.25925) — Algorithm 1 as far as it could be recovered.

**Source.** The paper's text (Eqs. (2)–(4), Alg. 1, the cross-iteration "distribution
modification" Alg. 2) was not readable here. What was found: the abstract, a summary of Alg. 1
("for each draft, verify ever longer sub-blocks starting after the longest sub-block accepted so
far, with acceptance probability ``h_ik``; if a full block is accepted stop; otherwise record the
rejected sub-blocks and go on to the next draft; output the longest accepted sub-block and a
correction from the residual"), the public review record (one reviewer writes ``h_ik`` for
``K = 1`` as ``(A + Δ_+)/(A − Δ)`` with ``A = Σ_x (q(x_i, x) − p(x_i, x))_+``, ``Δ = q(x_i) − p(x_i)``
and notes it can exceed 1), and a public implementation whose loop matches that summary exactly
(``method = "spectr-gbv"`` for K > 1, ``"gbv"`` for K = 1). This module follows that
implementation. Alg. 2 (distribution modification across iterations) is **not** implemented: it
could not be found. Everything is float64 (the reference code adds ``ε = 1e−20`` to denominators;
kept).

With ``P = p(x^j_{1:ℓ})``, ``Q = q(x^j_{1:ℓ})`` the joint prefix probabilities of draft ``j``,
``p(·), q(·)`` the next-token laws after that prefix and ``ψ(t) = (1 − t)^K``:

* sub-block of length ``ℓ < L``: ``m(x) = min{1, Q q(x) / (P p(x))}``,
  ``h = [Σ_x P p(x) ψ(m(x)) − P ψ(min{1, Q/P})] / [1 − ψ(Q) − Σ_x P p(x)(1 − ψ(m(x)))]``;
* full block: ``h_L = P (1 − ψ(min{1, Q/P})) / (1 − ψ(Q))``;
* scan: ``a = 0``; for ``j = 1..K``: for ``ℓ = a₀+1 .. L−1`` (``a₀`` = ``a`` when draft ``j``
  starts; a sub-block already rejected is skipped) accept with probability ``h`` (then ``a = ℓ``,
  selected draft ``j``, and the scan goes on to longer sub-blocks); then test the full block with
  ``h_L``: accepted → ``a = L`` and stop;
* correction after the accepted ``a < L`` tokens of the selected draft:
  ``∝ P p(x) (1 − min{1, Q q(x)/(P p(x))}^K)`` (with ``P = Q = 1`` and the root laws when
  ``a = 0``); ``a = L``: bonus from ``p(·|x_{1:L})``.

For ``K = 1`` the correction is ``norm((p(x_{1:a}, ·) − q(x_{1:a}, ·))_+)``, the full-block test
``min{1, p(x_{1:L})/q(x_{1:L})}`` and the sub-block test ``h = 1 − Δ_+/A`` with the reviewer's
``A = Σ_x (q(x_{1:ℓ}, x) − p(x_{1:ℓ}, x))_+``, ``Δ = q(x_{1:ℓ}) − p(x_{1:ℓ})`` (the review's
transcription ``(A + Δ_+)/(A − Δ)`` can exceed 1; the implemented form lies in [0, 1]):
joint-probability tests, not Sun et al.'s running ``p_i``. Measured (tests): one iteration is not
lossless for any K (for K ≥ 2 not even the first token's marginal), ``E[τ] = U_joint > U_causal`` at
``K = 1``, and ``E[τ] < U_joint`` for ``K ≥ 2``.
"""

from __future__ import annotations

import numpy as np

from otbound.block.verifiers._base import BlockVerifier
from otbound.token.verifiers import residual

EPS = 1e-20  # as in the reference implementation


class SpecTrGBV(BlockVerifier):
    """SpecTr-GBV's Alg. 1 as recovered; found lossy here: one iteration's output law is not the
    target's (``lossless = False``; its E[τ] may exceed U_causal and is no bound on it).

    References
    ----------
    Lin et al., arXiv 2604.25925.

    Examples
    --------
    On Sun et al.'s toy (2403.10444: p = (1/3, 2/3), q = (2/3, 1/3) at every prefix, L = 2): at
    K = 1, 9·E[τ] = 12 is 9·U_joint, above 9·U_causal = 11; at K = 2 one iteration's output is off
    the target's law by 0.042:

    >>> import otbound as ob
    >>> t, d = ob.context_free_model([1 / 3, 2 / 3]), ob.context_free_model([2 / 3, 1 / 3])
    >>> gbv = ob.BLOCK_VERIFIERS['spectr_gbv']
    >>> [round(9 * gbv.acceptance(t, d, vocab_size=2, num_drafts=k, block_len=2), 6) for k in (1, 2)]
    [12.0, 12.630919]
    >>> round(gbv.lossless_error(t, d, vocab_size=2, num_drafts=2, block_len=2), 6)
    0.042091
    """
    name = "spectr_gbv"
    reference = "SpecTr-GBV (Lin et al. 2604.25925), Alg. 1 as recovered (no Alg. 2)"
    lossless = False  # measured: one iteration's output law is not the target's (module docstring)

    def prepare(self, target, draft, drafts, cache):
        k, length = len(drafts), len(drafts[0])

        def psi(t):
            return (1.0 - t) ** k

        h, h_full, corr = [], [], []
        for tokens in drafts:
            big_p, big_q = 1.0, 1.0
            hj, cj = [None], [self._correction(target(()), draft(()), 1.0, 1.0, k)]
            for ell in range(1, length + 1):
                pre = tokens[: ell - 1]
                big_p *= float(target(pre)[tokens[ell - 1]])
                big_q *= float(draft(pre)[tokens[ell - 1]])
                if ell == length:
                    raw = min(big_q / (big_p + EPS), 1.0)
                    h_full.append(big_p * (1.0 - psi(raw)) / (1.0 - psi(big_q) + EPS))
                    break
                p_next, q_next = target(tokens[:ell]), draft(tokens[:ell])
                m = np.minimum(big_q * q_next / (big_p * p_next + EPS), 1.0)
                raw = min(big_q / (big_p + EPS), 1.0)
                num = float(np.sum(big_p * p_next * psi(m))) - big_p * psi(raw)
                den = 1.0 - psi(big_q) - float(np.sum(big_p * p_next * (1.0 - psi(m))))
                hj.append(num / (den + EPS))
                cj.append(self._correction(p_next, q_next, big_p, big_q, k))
            cj.append(target(tokens))
            h.append(hj)
            corr.append(cj)
        return drafts, h, h_full, corr

    @staticmethod
    def _correction(p_next, q_next, big_p, big_q, k):
        joint_p = big_p * p_next
        m = np.minimum(big_q * q_next / (joint_p + EPS), 1.0)
        return residual(joint_p * (1.0 - m**k), 0.0, p_next)

    def walk(self, inst, coin, draw):
        drafts, h, h_full, corr = inst
        length = len(drafts[0])
        accepted, selected = 0, 0
        rejected = set()
        for j, tokens in enumerate(drafts):
            for ell in range(accepted + 1, length):
                cand = tokens[:ell]
                if cand in rejected:
                    continue
                if coin(h[j][ell]):
                    accepted, selected = ell, j
                else:
                    rejected.add(cand)
            if coin(h_full[j]):
                accepted, selected = length, j
                break
        return drafts[selected][:accepted], corr[selected][accepted]
