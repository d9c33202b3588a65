"""Bring-your-own-verifier examples, written against the kit's two primitives ``coin`` and ``draw``.

Correct verifiers:

* :func:`rrs` — SpecInfer's recursive rejection sampling (Miao et al. 2305.09781), drafts i.i.d.
  from q, written the way a serving engine would, every random decision a ``coin`` or a ``draw``::

      python -m otbound.conformance otbound.conformance.examples:rrs --level token --num-drafts 2

* :data:`block_verification` — the package's block verification (Sun et al. 2403.10444) through
  :func:`otbound.conformance.block_adapter`.

Defective verifiers, short re-implementations of three defects found in public code
(found in an earlier review; each is caught by exact mode with a minimal counterexample, see
``tests/test_conformance.py`` and ``experiments/conformance_public_defects.py``):

* :func:`rrs_skip_repeats` — RRS that skips a draft token it has already tried;
* :func:`block_shared_uniform` — block verification drawing one uniform for the whole backward scan;
* :func:`block_cumulative_products` — block verification that accepts ``x_{1:i}`` while the product
  of ``i`` uniforms is at most the product of the ratios ``p(x_j|x_<j)/q(x_j|x_<j)``.

Drafting-and-verification procedures ``procedure(p, q, num_drafts, rng) -> (drafts, token)`` for
:func:`otbound.conformance.check_drafter_invariance`:

* :func:`gls_procedure` — Gumbel-max list sampling from its shared clocks (drafter-invariant);
* :func:`specinfer_procedure` — drafts from q, then SpecInfer's RRS (lossless, not drafter-invariant).

The truncation class (verifier and drafter on different sampling settings):

* :func:`rrs_truncated_q` — RRS reading a top-2-truncated q while the drafts come from q.
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial import Polynomial

from otbound import BLOCK_VERIFIERS
from otbound.block.verifiers.chain import block_schedule
from otbound.conformance._adapters import block_adapter
from otbound.token import SamplingParams
from otbound.token.verifiers import residual


def rrs(p, q, drafts, coin, draw):
    """SpecInfer RRS: try x_1..x_K in turn, accept x_i w.p. min(1, p_i(x_i)/q(x_i)), else
    p_{i+1} = norm((p_i − q)_+); if all are rejected, emit a draw from p_{K+1}."""
    cur = np.asarray(p, dtype=np.float64)
    for x in drafts:
        if coin(min(1.0, cur[x] / q[x])):
            return int(x)
        cur = residual(cur, q)
    return draw(cur)


#: Sun et al.'s block verification (2403.10444) from the package, adapted to the kit's interface
block_verification = block_adapter(BLOCK_VERIFIERS["block"])


# -- defective (found in public code) ----------------------------------------------------------------


def rrs_skip_repeats(p, q, drafts, coin, draw):
    """RRS that skips a draft token already tried (a defect found in public code).

    Once ``x`` is rejected, a later copy of ``x`` is skipped instead of being tried against the
    next residual — so the residual update ``p_{i+1} = norm((p_i − q)_+)`` of that round is lost.
    Lossy on tuples with repeated tokens: p = (.1, .4, .5), q = (.6, .2, .2), K = 2 gives the output
    law (.1, .42, .48).
    """
    unique = list(dict.fromkeys(int(x) for x in drafts))
    return rrs(p, q, unique, coin, draw)


def block_shared_uniform(target, draft, blocks, coin, draw):
    """Block verification with ONE uniform η for the whole backward scan (a defect found in public code).

    Sun et al. stop at the first ``i = L, L−1, …`` with a *fresh* ``η_i ≤ h_i``; here the same η is
    compared with every ``h_i``. In coin form: having passed tests with thresholds up to ``m``
    (so η > m), the next test succeeds with probability ``(h_i − m)_+ / (1 − m)``.
    """
    x = tuple(int(t) for t in blocks[0])
    above = 0.0  # η > above is known
    for i, h, law in block_schedule(target, draft, x)[:-1]:
        if coin(max(h - above, 0.0) / (1.0 - above) if above < 1.0 else 0.0):
            return list(x[:i]) + [draw(law)]
        above = max(above, h)
    return [draw(block_schedule(target, draft, x)[-1][2])]


def stay_above(thresholds) -> list[float]:
    """``P(S_1 ≥ a_1, …, S_i ≥ a_i)`` for ``i = 1..n``, where ``S_i = −log(U_1⋯U_i)`` (a sum of ``i``
    Exp(1) variables) and ``a_i`` = ``thresholds[i-1]``.

    Exact: restricted to the earlier constraints, ``S_i`` has density ``e^{−s} g_i(s)`` on
    ``s ≥ l_{i−1}`` with ``l_i = max(l_{i−1}, a_i)``, ``g_1 = 1``, ``g_{i+1}(s) = ∫_{l_i}^s g_i``
    (polynomials), and ``∫_l^∞ e^{−s} g(s) ds = e^{−l} Σ_d g^{(d)}(l)``.
    """
    out, g, lo = [], Polynomial([1.0]), 0.0
    for a in thresholds:
        lo = max(lo, a)
        if not np.isfinite(lo):
            out.append(0.0)
            continue
        out.append(float(np.exp(-lo) * sum(g.deriv(d)(lo) for d in range(g.degree() + 1))))
        g = g.integ(lbnd=lo)
    return out


def block_cumulative_products(target, draft, blocks, coin, draw):
    """Block verification comparing cumulative products (a defect found in public code).

    Draws ``U_1..U_L`` and accepts ``x_{1:i}`` while ``U_1⋯U_i ≤ Π_{j≤i} p(x_j|x_<j)/q(x_j|x_<j)``
    (no clipping of the running ratio at 1, unlike Sun et al.'s ``p_i``); at the first failure ``i``
    it corrects from ``norm((p(·|x_<i) − q(·|x_<i))_+)``, after ``L`` acceptances it draws the bonus.
    The test of step ``i`` given steps ``< i`` passed is the coin ``P_i / P_{i−1}`` of :func:`stay_above`.
    """
    x = tuple(int(t) for t in blocks[0])
    ratio, thresholds = 1.0, []
    for i in range(len(x)):
        ratio *= target(x[:i])[x[i]] / draft(x[:i])[x[i]]
        thresholds.append(-np.log(ratio) if ratio > 0 else np.inf)
    passed = [1.0] + stay_above(thresholds)
    for i in range(len(x)):
        if not coin(passed[i + 1] / passed[i] if passed[i] > 0 else 0.0):
            return list(x[:i]) + [draw(residual(target(x[:i]), draft(x[:i])))]
    return list(x) + [draw(target(x))]


# -- defective: the truncation class ---------------------------------------------------------------


def rrs_truncated_q(p, q, drafts, coin, draw):
    """RRS whose ratios read the draft law after a top-2 truncation while the drafts come from q
    itself: the verifier and the drafter disagree on the sampling settings.

    The defect class of assisted decoding that took q from the raw logits while drafting under
    ``top_k = 50`` (there: drafts from the truncated law, q untruncated); here the reverse
    direction, which the kit's laws express directly: ``q_fed`` is the law of the logits ``log q``
    under ``SamplingParams(top_k=2)`` (:meth:`otbound.SamplingParams.laws`: the two largest
    masses renormalised, every token tied with the second kept, as transformers does). A draft
    outside the top 2 has ``q_fed = 0`` and ratio ``p/0 = inf`` (torch's ``min(1, p/q)``): it is
    always accepted, and its tokens are over-emitted. Lossy whenever q has more than 2 tokens:
    p = (.5, .3, .2), q = (.1, .6, .3), K = 1 gives the output law (.55, .27, .18), and it reports
    an acceptance Σ min(p, q_fed) = .5 where the true one is .55
    (``experiments/truncation_mismatch.py`` measures both directions at top-k 50 / top-p 0.9)::

        python -m otbound.conformance otbound.conformance.examples:rrs_truncated_q --level token --num-drafts 1
    """
    with np.errstate(divide="ignore"):
        fed = SamplingParams(top_k=2).laws(np.log(np.asarray(q, dtype=np.float64)))  # log 0 = −inf: mass 0
    cur = np.asarray(p, dtype=np.float64)
    for x in drafts:
        ratio = np.inf if fed[x] == 0 else cur[x] / fed[x]
        if coin(min(1.0, ratio)):
            return int(x)
        cur = residual(cur, fed)
    return draw(cur)


# -- procedures (drafts and verification from one generator) ------------------------------------------


def gls_procedure(p, q, num_drafts, rng):
    """Gumbel-max list sampling (Rowan et al. 2506.05632) run from its own clocks, drawn first from
    ``rng``: ``(drafts (K,), token)``; the token depends on p and the clocks only."""
    from otbound import VERIFIERS

    drafts, tokens = VERIFIERS["gls"].draft_and_verify(p, q, num_drafts, 1, rng)
    return drafts[0], int(tokens[0])


def specinfer_procedure(p, q, num_drafts, rng):
    """K drafts i.i.d. from q (inverse CDF of ``rng``'s uniforms), then SpecInfer's RRS on the same
    ``rng``: ``(drafts (K,), token)``. Lossless; the token follows the drafts, so it depends on q."""
    from otbound import VERIFIERS, sample_drafts

    drafts = sample_drafts(q, num_drafts, "with_replacement", 1, rng)
    return drafts[0], int(VERIFIERS["rrs"].sample(p, q, drafts, rng).tokens[0])
