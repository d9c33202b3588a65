"""Static top-k trees: the covered-mass bound against an independent LP and a brute-force expectation
over target blocks; traversal verification lossless (exact) and attaining it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import gof_pvalue

from otbound import BLOCK_VERIFIERS, InvalidInputError, SamplingParams
from otbound.block import StaticTreeTraversal, static_tree_bound, static_tree_paths
from otbound.block._lp import solve_static_tree_lp
from otbound.block.models import BlockModel, context_free_model, dirichlet_model, prefix_law

BRANCHINGS = [(1,), (2,), (3,), (1, 1), (2, 1), (1, 2), (2, 2), (3, 1, 2), (2, 2, 2)]


def _models(seed, v=4):
    return (dirichlet_model(v, concentration=0.7, seed=seed, name="t"),
            dirichlet_model(v, concentration=0.7, seed=seed + 1000, name="d"))


def _brute_force(target, paths, v):
    """E[longest prefix of the target's block Y_{1:L} in the tree] by enumerating V^L blocks."""
    length = paths.shape[1]
    nodes = {tuple(row[:d]) for row in paths.tolist() for d in range(1, length + 1)}
    law = prefix_law(target, length)
    total = 0.0
    for y in itertools.product(range(v), repeat=length):
        depth = max([d for d in range(1, length + 1) if y[:d] in nodes], default=0)
        total += law[y] * depth
    return total


@pytest.mark.parametrize("branching", BRANCHINGS, ids=str)
@pytest.mark.parametrize("seed", range(4))
def test_bound_equals_lp_and_brute_force(branching, seed):
    target, draft = _models(seed)
    b = static_tree_bound(target, draft, branching)
    assert b.paths.shape == (int(np.prod(branching)), len(branching))
    assert b.value == pytest.approx(b.levels.sum(), abs=1e-15)
    assert b.value == pytest.approx(solve_static_tree_lp(target, b.paths), abs=1e-8)
    assert b.value == pytest.approx(_brute_force(target, b.paths, 4), abs=1e-12)
    assert np.all(np.diff(b.levels) <= 1e-15)  # P(τ ≥ ℓ) is non-increasing


@pytest.mark.parametrize("branching", BRANCHINGS, ids=str)
def test_traversal_is_lossless_and_attains_the_bound(branching):
    target, draft = _models(7)
    ver = StaticTreeTraversal(branching)
    kw = dict(vocab_size=4, num_drafts=1, block_len=len(branching))
    bound = static_tree_bound(target, draft, branching).value
    assert ver.lossless_error(target, draft, **kw) < 1e-12
    assert ver.acceptance(target, draft, **kw) == pytest.approx(bound, abs=1e-12)
    own = ver.own_law_bounds(target, draft, **kw)
    assert own.causal == own.joint == pytest.approx(bound, abs=1e-15)


def test_registered_uniform_branching_and_sampling_matches_exact():
    target, draft = _models(3)
    ver = BLOCK_VERIFIERS["static_tree"]
    exact = ver.acceptance(target, draft, vocab_size=4, num_drafts=2, block_len=3)
    assert exact == pytest.approx(static_tree_bound(target, draft, (2, 2, 2)).value, abs=1e-12)
    drafts = ver.draw_drafts(draft, 200_000, 2, 3, rng=0)
    assert drafts.shape == (200_000, 8, 3) and ver.num_rows(2, 3) == 8
    s = ver.sample(target, draft, drafts, rng=1)
    se = s.num_accepted.std() / np.sqrt(s.num_accepted.size)
    assert abs(s.num_accepted.mean() - exact) < 4.5 * se  # |z| < 4.5: false alarm ~7e-6
    # the emitted first token is a draw of the target's first law (G-test, 4 bins, power asserted)
    assert gof_pvalue(s.tokens[:, 0], target(())) > 1e-3


def test_paths_by_draft_rank_ties_to_lower_index():
    q = context_free_model([0.3, 0.3, 0.1, 0.3])
    assert static_tree_paths(q, (3, 1)).tolist() == [[0, 0], [1, 0], [3, 0]]
    ver = StaticTreeTraversal((3, 1))
    assert ver.node_drafts(np.array([0.3, 0.3, 0.1, 0.3]), 3, 1, None).tolist() == [0, 1, 3]


def test_truncated_draft_with_too_few_survivors_is_an_error():
    logits = np.array([2.0, 1.0, 0.0, -1.0])
    truncated = BlockModel(4, lambda prefix: SamplingParams(top_k=2).laws(logits), name="top-2 draft")
    target = context_free_model(np.full(4, 0.25))
    with pytest.raises(InvalidInputError, match="only 2 tokens with q > 0"):
        static_tree_bound(target, truncated, (3,))
    assert static_tree_bound(target, truncated, (2, 2)).value == pytest.approx(0.5 + 0.25, abs=1e-15)
    with pytest.raises(InvalidInputError, match="branching"):
        static_tree_bound(target, truncated, ())
