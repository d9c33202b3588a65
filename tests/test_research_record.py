"""Research record (docs/results/findings.md): two block-level claims made reproducible.

1. **SpecTr-GBV's one-iteration losslessness by (K, L)**: as recovered (Alg. 1; no Alg. 2), the
   one-iteration verifier is lossless only at K = 1, L = 1 (plain speculative sampling); at K ≥ 2
   it is lossy already with L = 1 (a token-level law error), and at K = 1 with L = 2. Metric:
   ``BlockVerifier.lossless_error`` (max absolute error of the continued law on V^{L+1}), Dirichlet
   pairs V = 3, seeds 0–2.

2. **Block verification needs a fresh uniform per level** (docs/results/findings.md: "reusing one
   uniform is lossy").

Sun et al.'s block verification (2403.10444, Alg. 2; ``BLOCK_VERIFIERS["block"]``) scans
``i = L, L−1, …, 1`` and stops at the first ``i`` with ``η_i ≤ h_i``, a fresh ``η_i ~ U(0, 1)`` per
level. The variant below reuses one ``U`` for every level: it stops at the first ``i`` with
``U ≤ h_i``, i.e. given that the levels above did not stop (``U > m``, ``m`` = the largest ``h``
seen so far) it stops at ``i`` with probability ``(h_i − m)_+ / (1 − m)``.

Metric: the exact law of one iteration's emitted sequence, continued by sampling the target up to
``L + 1`` tokens (docs/theory/block-bounds.md's losslessness), against the target's law of ``L + 1`` tokens;
reported as the total-variation distance ``½ Σ_v |P(v) − p(v)|`` over ``V^{L+1}`` (and the max
absolute error that ``BlockVerifier.lossless_error`` uses). Instances: the Dirichlet pairs of
``tests/test_block_verifiers.py`` (target ``dirichlet_model(V, seed)``, draft
``dirichlet_model(V, seed + 100)``), K = 1, exact enumeration (no sampling). Measured here:
V = 4, L = 2, seed 0: TV 0.0147 (max error 0.0080); the largest over seeds 0–5, V = 4, L = 3:
TV 0.058 (seed 2). The fresh-uniform verifier is lossless on the same instances (< 1e-12).
"""

from __future__ import annotations

import numpy as np
import pytest

from otbound import BLOCK_VERIFIERS
from otbound.block.models import dirichlet_model, prefix_law, shifted_model
from otbound.block.verifiers.chain import BlockVerification, walk_schedule


class SharedUniformBlockVerification(BlockVerification):
    """Block verification with one uniform for all levels (the lossy reading)."""

    name = "block_shared_uniform"
    lossless = False

    def walk(self, inst, coin, draw):
        tokens, sched = inst
        shared, seen = [], 0.0
        for i, h, law in sched[:-1]:
            shared.append((i, (h - seen) / (1.0 - seen) if h > seen else 0.0, law))
            seen = max(seen, h)
        return walk_schedule(tokens, shared + [sched[-1]], coin)


def continued_law_error(verifier, target, draft, vocab_size, block_len):
    """(TV, max abs error) between the emitted sequence continued by the target and p on V^{L+1}."""
    law = verifier.iteration_law(target, draft, vocab_size=vocab_size, num_drafts=1, block_len=block_len)
    full = np.zeros(vocab_size ** (block_len + 1))
    for seq, prob in law.items():
        rest = block_len + 1 - len(seq)
        start = int(np.ravel_multi_index(seq, (vocab_size,) * len(seq))) * vocab_size**rest
        full[start : start + vocab_size**rest] += prob * prefix_law(shifted_model(target, seq), rest).ravel()
    diff = full - prefix_law(target, block_len + 1).ravel()
    return 0.5 * float(np.abs(diff).sum()), float(np.abs(diff).max())


def _pair(v, seed):
    return dirichlet_model(v, seed=seed), dirichlet_model(v, seed=seed + 100)


def test_shared_uniform_is_lossy_fresh_uniforms_are_not():
    tg, dr = _pair(4, 0)
    tv, worst = continued_law_error(SharedUniformBlockVerification(), tg, dr, 4, 2)
    assert tv == pytest.approx(0.0147, abs=5e-5) and worst == pytest.approx(0.0080, abs=5e-5)
    fresh_tv, fresh_worst = continued_law_error(BlockVerification(), tg, dr, 4, 2)
    assert fresh_tv < 1e-12
    # the error measure agrees with the verifier's own lossless_error (max absolute error)
    assert (
        abs(BlockVerification().lossless_error(tg, dr, vocab_size=4, num_drafts=1, block_len=2) - fresh_worst) < 1e-15
    )
    assert (
        abs(SharedUniformBlockVerification().lossless_error(tg, dr, vocab_size=4, num_drafts=1, block_len=2) - worst)
        < 1e-15
    )


def test_shared_uniform_error_across_instances():
    """Over seeds 0–5 at V = 4, L = 3 the shared uniform is lossy on every instance (TV 0.8%–5.8%)."""
    tvs = [continued_law_error(SharedUniformBlockVerification(), *_pair(4, s), 4, 3)[0] for s in range(6)]
    assert min(tvs) > 0.005 and max(tvs) == pytest.approx(0.0583, abs=5e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_spectr_gbv_one_iteration_lossless_only_for_one_draft_of_one_token(seed):
    gbv = BLOCK_VERIFIERS["spectr_gbv"]
    tg, dr = _pair(3, seed)

    def err(k, length):
        return gbv.lossless_error(tg, dr, vocab_size=3, num_drafts=k, block_len=length)

    assert err(1, 1) < 1e-12  # plain speculative sampling
    assert err(2, 1) > 0.01 and err(3, 1) > 0.01  # K ≥ 2: lossy at the token level already
    assert err(1, 2) > 0.01  # K = 1, L = 2: the one-iteration law is off (Alg. 2 not modelled)
