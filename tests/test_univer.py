"""UniVer (Weng, Hu, Yairi 2605.04543) on its own draft tree (top m − 1 draft tokens + one residual
sample per node; :mod:`otbound.block.verifiers.univer`).

Checks: the worked root example of the public EAGLE-based reproduction (by hand); one sampled child
(m = 1) is block verification law for law; exact one-iteration losslessness (1e-12) on random and
near-deterministic models; E[τ] never above U_causal of its own tree law (LP over every tree,
tolerance 1e-9, the LP's), equal to it at L = 1 (the single-level optimum, closed form); the tree
sampler draws the enumerated tree law; the depth-by-depth drafting hook builds the same trees.
Finding: for L ≥ 2, E[τ] can be strictly below U_causal of the same tree law.
As ``BLOCK_VERIFIERS["univer"]`` it also runs through every registry test of
``tests/test_block_verifiers.py`` (exact losslessness, E[τ] ≤ its own U_causal, exact E[τ] == Monte
Carlo, E[τ | tree] averaging to E[τ], sequence-level G-test) with its own tree law.
"""

import numpy as np
import pytest
from test_block_verifiers import random_pair

from otbound import InvalidInputError
from otbound.block.models import context_free_model, dirichlet_model, tabulated_model
from otbound.block.verifiers import BLOCK_VERIFIERS, UniVer
from otbound.conformance import g_test

U = UniVer()


def test_root_example_by_hand():
    """Target (0.3, 0.4, 0.3), draft (0.6, 0.3, 0.1), m = 2, L = 1: children 0 (top-1) and the sample
    c ~ r = (0, 0.75, 0.25). For c = 1: P(1) = min(1, 0.4/0.75) = 8/15, Z = 0.3 + 0.05,
    P(0) = 0.3 (1 − 8/15) / 0.35 = 0.4, tested first: p̃ = 0.4, 8/15 / 0.6 = 8/9; stop mass 1/15 on
    token 2. For c = 2: P(2) = 1, P(0) = 0."""
    tg, dr = context_free_model([0.3, 0.4, 0.3]), context_free_model([0.6, 0.3, 0.1])
    p = np.array([0.3, 0.4, 0.3])
    law = U.conditional_law(tg, dr, np.array([[0], [1]]))
    want = {**{(0, y): 0.4 * p[y] for y in range(3)}, **{(1, y): 8 / 15 * p[y] for y in range(3)}, (2,): 1 / 15}
    assert law.keys() == want.keys() and all(abs(law[s] - want[s]) < 1e-15 for s in want)
    law = U.conditional_law(tg, dr, np.array([[0], [2]]))
    assert law.keys() == {(2, y) for y in range(3)} and all(abs(law[(2, y)] - p[y]) < 1e-15 for y in range(3))
    assert U.acceptance(tg, dr, vocab_size=3, num_drafts=2, block_len=1) == pytest.approx(
        0.75 * (0.4 + 8 / 15) + 0.25, abs=1e-15
    )


@pytest.mark.parametrize("seed", range(3))
def test_one_sampled_child_is_block_verification(seed):
    tg, dr = random_pair(3, seed)
    block = BLOCK_VERIFIERS["block"]
    for drafts in U.draw_drafts(dr, 4, 1, 3, np.random.default_rng(seed)):
        a, b = block.conditional_law(tg, dr, drafts), U.conditional_law(tg, dr, drafts)
        assert a.keys() == b.keys() and all(abs(a[s] - b[s]) < 1e-14 for s in a)
    for length in (1, 2, 3):
        assert U.acceptance(tg, dr, vocab_size=3, num_drafts=1, block_len=length) == pytest.approx(
            block.acceptance(tg, dr, vocab_size=3, num_drafts=1, block_len=length), abs=1e-13
        )


def instances():
    """(target, draft, V, m, L)."""
    out = [(*random_pair(3, s), 3, 2, 2) for s in range(3)]
    out.append((*random_pair(3, 0), 3, 2, 3))
    out.append((*random_pair(4, 1), 4, 3, 2))
    out.append((*random_pair(4, 2), 4, 2, 2))
    out.append((*random_pair(3, 8, concentration=0.08), 3, 2, 2))  # near-deterministic laws
    zeros = tabulated_model({(): [0.5, 0.5, 0.0], (0,): [0.0, 0.9, 0.1]}, 3, default=[0.2, 0.1, 0.7])
    out.append((dirichlet_model(3, seed=9), zeros, 3, 2, 2))  # draft zeros (support still ≥ m)
    holes = tabulated_model({(): [0.0, 0.0, 1.0], (2,): [1.0, 0.0, 0.0]}, 3, default=[0.0, 0.3, 0.7])
    out.append((holes, dirichlet_model(3, seed=10), 3, 2, 2))  # target zeros where the draft is sure
    return out


@pytest.mark.parametrize(
    "inst", instances(), ids=["s0", "s1", "s2", "L3", "m3", "V4", "sharp", "zeros", "target-zeros"]
)
def test_exactly_lossless_and_below_its_causal_bound(inst):
    tg, dr, v, m, length = inst
    assert U.lossless_error(tg, dr, vocab_size=v, num_drafts=m, block_len=length) < 1e-12
    value = U.acceptance(tg, dr, vocab_size=v, num_drafts=m, block_len=length)
    bounds = U.own_law_bounds(tg, dr, vocab_size=v, num_drafts=m, block_len=length)
    assert value <= bounds.causal + 1e-9 and bounds.causal <= bounds.joint + 1e-9


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("m", [2, 3])
def test_single_level_reaches_the_optimum_of_its_draft_law(seed, m):
    """L = 1: E[τ] = Σ_{top m−1} p(d) + Σ_{other x} min{p(x), r(x)} = U_causal = U_joint of the law."""
    tg, dr = random_pair(5, seed)
    p, q = tg(()), dr(())
    det = np.argsort(-q, kind="stable")[: m - 1]
    r = q.copy()
    r[det] = 0
    r /= r.sum()
    rest = np.setdiff1d(np.arange(5), det)
    closed = p[det].sum() + np.minimum(p[rest], r[rest]).sum()
    value = U.acceptance(tg, dr, vocab_size=5, num_drafts=m, block_len=1)
    bounds = U.own_law_bounds(tg, dr, vocab_size=5, num_drafts=m, block_len=1)
    assert value == pytest.approx(closed, abs=1e-13)
    assert abs(bounds.causal - value) < 1e-9 and abs(bounds.joint - value) < 1e-9


def test_a_tree_of_every_token_accepts_every_level():
    """m = V: every node has every token as a child, so τ = L with probability 1."""
    tg, dr = random_pair(3, 4)
    assert U.acceptance(tg, dr, vocab_size=3, num_drafts=3, block_len=2) == pytest.approx(2.0, abs=1e-12)


def test_strictly_below_its_causal_bound_at_two_levels():
    """Finding: UniVer's optimality is within its conditional framework; over all lossless verifiers
    of the same tree law the causal LP is higher (V = 3, m = 2, L = 2, Dirichlet seed 2)."""
    tg, dr = random_pair(3, 2)
    value = U.acceptance(tg, dr, vocab_size=3, num_drafts=2, block_len=2)
    bounds = U.own_law_bounds(tg, dr, vocab_size=3, num_drafts=2, block_len=2)
    assert value == pytest.approx(1.707476030823, abs=1e-9)
    assert bounds.causal - value > 0.03


def test_draw_drafts_follows_the_tree_law():
    """20 000 drawn trees against the enumerated law (G-test, 8 trees) and each drawn tree valid."""
    tg, dr = random_pair(3, 1)
    law = list(U.draft_tuple_law(dr, 2, 2))
    index = {paths: i for i, (_, paths) in enumerate(law)}
    drawn = U.draw_drafts(dr, 20_000, 2, 2, np.random.default_rng(3))
    assert drawn.shape == (20_000, 4, 2)
    counts = np.bincount([index[tuple(map(tuple, t.tolist()))] for t in drawn], minlength=len(law))
    expected = 20_000 * np.array([p for p, _ in law])
    assert abs(expected.sum() - 20_000) < 1e-6
    assert g_test(counts, expected)[1] > 1e-3  # the conformance kit's G-test


def test_node_drafts_builds_the_drawn_trees():
    """Drafting depth by depth through ``node_drafts`` (as the LM decoder does: rows grouped by
    prefix) gives trees in the path layout of ``draw_drafts``, each one a tree of the enumerated law."""
    tg, dr = random_pair(4, 3)
    m, length, rng = 2, 3, np.random.default_rng(11)
    assert U.num_rows(m, length) == 8
    trees = {paths for _, paths in U.draft_tuple_law(dr, m, length)}
    for _ in range(20):
        rows = np.zeros((8, length), dtype=np.int64)
        for d in range(length):
            keys, inverse = np.unique(rows[:, :d], axis=0, return_inverse=True)
            for g in range(keys.shape[0]):
                where = np.flatnonzero(inverse.reshape(-1) == g)
                rows[where, d] = U.node_drafts(dr(tuple(keys[g].tolist())), where.size, m, rng)
        U.prepare(tg, dr, tuple(map(tuple, rows.tolist())), {})  # refuses anything but a UniVer tree
        assert tuple(map(tuple, rows.tolist())) in trees


def test_bad_trees_are_named():
    tg, dr = random_pair(3, 1)
    top = int(np.argmax(dr(())))
    with pytest.raises(InvalidInputError, match="m\\^L paths"):
        U.conditional_law(tg, dr, np.array([[0, 1], [1, 1], [2, 0]]))
    other = [t for t in range(3) if t != top]
    with pytest.raises(InvalidInputError, match="not a UniVer tree at prefix \\[\\]"):
        U.conditional_law(tg, dr, np.array([[other[0]], [other[1]]]))  # the top-1 draft token is missing
    with pytest.raises(InvalidInputError, match="not a UniVer tree"):
        U.conditional_law(tg, dr, np.array([[top], [top]]))  # the sample repeats a deterministic child
    narrow = tabulated_model({(): [0.0, 1.0, 0.0]}, 3, default=[0.3, 0.3, 0.4])
    with pytest.raises(InvalidInputError, match="at least 2 draft tokens"):
        U.acceptance(tg, narrow, vocab_size=3, num_drafts=2, block_len=1)
