"""The HSD figures at L = 3 on Sun et al.'s toy, worked exactly in fractions from the steps of the two
public versions of HSD's ``_speculative_sampling`` (github.com/ZhouYuxuanYX/Hierarchical-Speculative-
Decoding): the backward branch of ``transformers/generation/utils.py`` (commit 747d2594), which caps
the prefix mass by its running ratio maximum, gives 16/9 — what ``BLOCK_VERIFIERS["hsd"]`` computes —
and ``algorithm_clean.py`` (commit 89745108), which caps it by min(P, Q), gives 50/27."""

import itertools
from fractions import Fraction as F

import pytest

from otbound import BLOCK_VERIFIERS, block_bound

P, Q, L = (F(1, 3), F(2, 3)), (F(2, 3), F(1, 3)), 3  # Sun et al.'s context-free toy, block length 3


def running_max_cap(prefix_p, prefix_q, ratios, j):
    """P̃_j = P_j / max{1, R_1, …, R_j} (the backward branch)."""
    return prefix_p[j] / max([F(1), *ratios[:j]])


def min_cap(prefix_p, prefix_q, ratios, j):
    """P̃_j = min(P_j, Q_j) (``algorithm_clean.py``)."""
    return min(prefix_p[j], prefix_q[j])


def expected_matches(cap, hsd_flag=False):
    """E[n_matches] of one call, exactly: per draft block, the step-back probabilities
    ``1 − Σ(P̃_j p − Q_j q)_+ / max(Σ(·)_+, Σ(·)_−)`` (0 where the flag is set and R_{j+1} ≥ 1),
    independent step-back draws, τ the last position not stepping back (the code's ``argmax`` of an
    all-False row: L − 1), the block accepted with min(1, R_L), else τ; one more match where the
    residual at τ is empty."""
    total = F(0)
    for x in itertools.product((0, 1), repeat=L):
        prefix_q = [F(1), Q[x[0]], Q[x[0]] * Q[x[1]]]
        prefix_p = [F(1), P[x[0]], P[x[0]] * P[x[1]]]
        ratios = [prefix_p[j] * P[x[j]] / (prefix_q[j] * Q[x[j]]) for j in range(L)]  # R_1..R_L
        back, empty = [], []
        for j in range(L):
            diff = [cap(prefix_p, prefix_q, ratios, j) * P[v] - prefix_q[j] * Q[v] for v in (0, 1)]
            plus, minus = sum(max(d, 0) for d in diff), sum(max(-d, 0) for d in diff)
            b = 1 - (plus / max(plus, minus) if max(plus, minus) > 0 else F(0))
            back.append(F(0) if hsd_flag and ratios[j] >= 1 else b)
            empty.append(plus == 0)
        accept = min(F(1), ratios[-1])
        mean = F(0)
        for steps in itertools.product((True, False), repeat=L):
            prob = F(1)
            for j in range(L):
                prob *= back[j] if steps[j] else 1 - back[j]
            kept = [j for j in range(L) if not steps[j]]
            tau = kept[-1] if kept else L - 1
            n = tau + 1 if empty[tau] else tau
            mean += prob * (accept * L + (1 - accept) * n)
        total += Q[x[0]] * Q[x[1]] * Q[x[2]] * mean
    return total


def test_the_backward_branch_gives_16_9_as_the_package_verifier():
    from otbound.block.models import context_free_model

    assert expected_matches(running_max_cap) == F(16, 9)
    tg, dr = context_free_model([1 / 3, 2 / 3]), context_free_model([2 / 3, 1 / 3])
    assert BLOCK_VERIFIERS["hsd"].acceptance(tg, dr, vocab_size=2, num_drafts=1, block_len=L) == pytest.approx(
        16 / 9, abs=1e-12)
    # and the joint bound the other version reaches
    assert block_bound(tg, dr, vocab_size=2, num_drafts=1, block_len=L, kind="joint").value == pytest.approx(50 / 27)


@pytest.mark.parametrize("hsd_flag", [False, True])
def test_algorithm_clean_min_cap_gives_50_27(hsd_flag):
    assert expected_matches(min_cap, hsd_flag) == F(50, 27)
