"""Planned trees decoded end to end: :class:`otbound.block.verifiers.TreeShapeVerifier`."""

import numpy as np
import pytest
from conftest import gof_pvalue

import otbound as ob
from otbound.block.verifiers import TreeShapeVerifier
from otbound.token.verifiers import VERIFIERS


def draw_trees(v, law, length, num, rng):
    """``num`` draft tuples drafted as :func:`otbound.lm.speculative_sample` does: depth by depth,
    ``node_drafts`` for the rows through each node (a context-free draft law ``law``)."""
    rows = v.num_rows(0, length)
    out = np.zeros((num, rows, length), dtype=np.int64)
    for i in range(num):
        for depth in range(length):
            _, inverse = np.unique(out[i, :, :depth], axis=0, return_inverse=True)
            inverse = inverse.reshape(-1)
            for g in np.unique(inverse):
                members = np.flatnonzero(inverse == g)
                out[i, members, depth] = v.node_drafts(law, members.size, 0, rng)
    return out


@pytest.mark.parametrize("name, branching", [("rrs_wor", (2, 2)), ("greedy", (3, 1)), ("rrs_wor", (3, 2, 1))])
def test_tree_acceptance_is_the_product_of_node_acceptances(name, branching):
    """On context-free laws the planner's positional formula is exact: E[τ] of a uniform tree is
    Σ_ℓ Π_{d≤ℓ} α_V(p, q, b_d). The exact E[τ | drafts] averaged over 3000 drafted trees must match
    it within 4 standard errors (at most ±0.06 here; a tree verified with the wrong drafts — e.g. the
    repeated row tokens — or a wrong walk misses by more than 0.1)."""
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = np.array([0.1, 0.2, 0.3, 0.4])
    v = TreeShapeVerifier(name, branching)
    rng = np.random.default_rng(0)
    trees = draw_trees(v, q, len(branching), 3000, rng)
    assert trees.shape[1] == int(np.prod(branching))
    for t in trees[:50]:  # every node's drafts are distinct and there are b_d of them
        for depth, b in enumerate(branching):
            _, inverse = np.unique(t[:, :depth], axis=0, return_inverse=True)
            for g in np.unique(inverse):
                assert np.unique(t[inverse.reshape(-1) == g, depth]).size == b
    target, draft = ob.context_free_model(p), ob.context_free_model(q)
    values = v.conditional_acceptance(target, draft, trees)
    alpha = {b: VERIFIERS[name].acceptance(p, q, b) for b in set(branching)}
    expected = float(np.sum(np.cumprod([alpha[b] for b in branching])))
    se = values.std(ddof=1) / np.sqrt(values.size)
    assert se < 0.015
    assert abs(values.mean() - expected) < 4 * se
    # sampling one iteration per tree agrees with the exact conditional value, and is lossless: the
    # first two emitted tokens (continued by the target after a correction) are distributed as p ⊗ p
    out = v.sample(target, draft, trees, rng)
    sampled = out.num_accepted
    assert abs(sampled.mean() - values.mean()) < 4 * sampled.std(ddof=1) / np.sqrt(sampled.size)
    second = np.where(sampled >= 1, out.tokens[:, 1], rng.choice(4, size=sampled.size, p=p))
    assert gof_pvalue(out.tokens[:, 0] * 4 + second, np.outer(p, p).ravel(), tv=0.08, power=0.99) > 1e-3


def test_tree_decodes_on_the_tiny_pair():
    from otbound.lm import speculative_sample, tiny_pair

    v = TreeShapeVerifier("greedy", (2, 2))
    run = speculative_sample(tiny_pair(), [1, 2, 3], verifier=v, num_drafts=2, block_len=2, max_new_tokens=8, seed=1)
    assert len(run.tokens) == 8
    for it in run.iterations:
        assert it.drafts.shape == (4, 2) and 0 <= it.num_accepted <= 2
        assert np.unique(it.drafts[:, 0]).size == 2  # two distinct first tokens, each on two rows


def test_tree_shape_verifier_bad_input():
    with pytest.raises(ob.InvalidInputError, match="merge"):
        TreeShapeVerifier("rrs", (2, 2))  # i.i.d. siblings can coincide
    with pytest.raises(ob.InvalidInputError, match="branch again"):
        TreeShapeVerifier("rrs_wor", (1, 2))
    with pytest.raises(ob.InvalidInputError, match="unknown verifier"):
        TreeShapeVerifier("nope", (2,))
    with pytest.raises(ob.InvalidInputError, match="depth 2"):
        TreeShapeVerifier("rrs_wor", (2, 2)).num_rows(2, 3)


def test_a_deterministic_law_tree_is_decoded_as_planned():
    """Every law with distinct drafts is decodable (``onehot``: the top-b tokens at every node). The
    one drafted tree is the static top-(2, 2) tree, so E[τ | tree] is exact and equals the planner's
    product Σ_ℓ Π_{d≤ℓ} α(p, q, b_d) with α = p(top-2(q)) = 0.3 (to 1e-12); one iteration per
    tree sampled 20,000 times emits p ⊗ p for its first two tokens (chi-square with stated power)."""
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = np.array([0.1, 0.2, 0.3, 0.4])
    v = TreeShapeVerifier("onehot", (2, 2))
    rng = np.random.default_rng(2)
    trees = draw_trees(v, q, 2, 20_000, rng)
    assert (trees == trees[0]).all() and sorted(set(trees[0, :, 0])) == [2, 3]
    target, draft = ob.context_free_model(p), ob.context_free_model(q)
    alpha = VERIFIERS["onehot"].acceptance(p, q, 2)
    assert abs(alpha - 0.3) < 1e-12  # p(top-2(q)) = p(2) + p(3)
    value = v.conditional_acceptance(target, draft, trees[:1])[0]
    assert abs(value - (alpha + alpha * alpha)) < 1e-12
    out = v.sample(target, draft, trees, rng)
    second = np.where(out.num_accepted >= 1, out.tokens[:, 1], rng.choice(4, size=trees.shape[0], p=p))
    assert gof_pvalue(out.tokens[:, 0] * 4 + second, np.outer(p, p).ravel(), tv=0.08, power=0.99) > 1e-3
