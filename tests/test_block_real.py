"""Draft trees on a language-model pair (tiny pair): the stored static trees and i.i.d. brackets against
the block layer's own functions on the live models."""

import numpy as np
import pytest

import otbound as ob
from otbound import SamplingParams
from otbound.block import block_bound, block_bound_bracket, merged_bound_bracket, static_tree_bound, static_tree_paths
from otbound.lm import (
    Prompt,
    collect_block_traces,
    collect_draft_trees,
    collect_traces,
    lm_block_models,
    load_block_traces,
    load_draft_trees,
    tiny_pair,
)

#: the stored laws come from batched cached forwards, the live models' from one row at a time (float32):
#: they agree to ~1e-6; every comparison below allows 1e-5
FORWARD_ATOL = 1e-5
#: HiGHS optima (feasibility tolerance 1e-10) of two LPs with the same value
LP_ATOL = 1e-8

V = 5
TRUNCATED = {"top_k": 3, "top_p": 0.9}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trees")
    pair = tiny_pair(vocab_size=V)
    prompts = [Prompt("tiny/0", "tiny", "", (1, 2, 3)), Prompt("tiny/1", "tiny", "", (4, 0))]
    collect_traces(pair, prompts, tmp / "traces", temperatures=[0.8], max_new_tokens=4, progress=False)
    collect_draft_trees(pair, tmp / "traces", tmp / "trees", width=V, depth=3, positions_per_trace=2,
                        variants=[{}, TRUNCATED], progress=False)
    return pair, tmp, list(load_draft_trees(tmp / "trees"))


def test_tree_is_the_drafts_top_m_tree_and_laws_are_merged(stored):
    pair, _, records = stored
    assert len(records) == 4
    for rec in records:
        assert rec.children.shape == (1 + V + V * V, V) and rec.depth == 3 and rec.num_variants == 2
        np.testing.assert_allclose(rec.target.sum(axis=-1), 1.0, atol=1e-12)
        np.testing.assert_allclose(rec.draft.sum(axis=-1), 1.0, atol=1e-12)
        assert np.abs(rec.target[:, :, -1]).max() < 1e-12  # width = V: nothing merged
        _, draft = lm_block_models(pair, rec.prefix, rec.temperature)
        np.testing.assert_array_equal(rec.static_tree((3, 2, 1)).paths, static_tree_paths(draft, (3, 2, 1)))


@pytest.mark.parametrize("branching", [(1, 1, 1), (2, 1), (3, 2, 1), (V, V, V)])
def test_static_tree_value_equals_static_tree_bound_on_the_live_models(stored, branching):
    pair, _, records = stored
    for rec in records:
        for variant, (sp, _) in enumerate(rec.settings):
            # the tree is the draft's rank (its untruncated law's); the target's law is the variant's
            target, draft = lm_block_models(pair, rec.prefix, rec.temperature,
                                            settings=(sp, SamplingParams(rec.temperature)))
            want = static_tree_bound(target, draft, branching)
            got = rec.static_tree(branching, variant=variant)
            np.testing.assert_allclose(got.levels, want.levels, atol=FORWARD_ATOL)
            np.testing.assert_array_equal(got.paths, want.paths)
    full = records[0].static_tree((V, V, V))
    np.testing.assert_allclose(full.levels, 1.0, atol=1e-12)  # the complete tree covers all target mass


@pytest.mark.parametrize("kind", ["causal", "joint"])
def test_iid_bracket_is_exact_when_nothing_is_merged(stored, kind):
    pair, _, records = stored
    for rec in records[:2]:
        for variant, (sp, sq) in enumerate(rec.settings):
            target, draft = lm_block_models(pair, rec.prefix, rec.temperature, settings=(sp, sq))
            exact = block_bound(target, draft, vocab_size=V, num_drafts=2, block_len=2, kind=kind).value
            b = rec.iid_bracket(2, 2, variant=variant, kind=kind)
            assert abs(b.lower - exact) < FORWARD_ATOL and abs(b.upper - exact) < FORWARD_ATOL
            assert b.truncated_target_mass < 1e-12


def test_iid_bracket_of_fewer_kept_children_contains_the_exact_bound(stored):
    pair, _, records = stored
    gaps = []
    for rec in records:
        for variant, settings in enumerate(rec.settings):
            target, draft = lm_block_models(pair, rec.prefix, rec.temperature, settings=settings)
            exact = block_bound(target, draft, vocab_size=V, num_drafts=3, block_len=2, kind="causal").value
            wide = rec.iid_bracket(3, 2, variant=variant, width=3)
            narrow = rec.iid_bracket(3, 2, variant=variant, width=2)
            assert wide.lower - FORWARD_ATOL <= exact <= wide.upper + FORWARD_ATOL
            assert narrow.lower <= wide.lower + LP_ATOL and wide.upper <= narrow.upper + LP_ATOL  # nested kept trees
            if narrow.truncated_draft_mass < 1e-12:  # drafts never leave the kept tree: ⊥ is never drafted
                assert narrow.upper - narrow.lower < LP_ATOL
            gaps.append(narrow.upper - narrow.lower)
    assert max(gaps) > 1e-3  # the brackets are not all trivially tight


def test_merged_bound_bracket_reproduces_block_bound_bracket():
    """Merged models built with block_bound_bracket's rule (top-m by p + q) give its bracket exactly."""
    target, draft = ob.dirichlet_model(5, seed=3), ob.dirichlet_model(5, seed=4)
    m = 2

    def keep(f):
        return np.argsort(-(target(f) + draft(f)), kind="stable")[:m]

    def fine(prefix):
        f = ()
        for r in prefix:
            f += (int(keep(f)[r]),)
        return f

    def merged(model):
        def law(prefix):
            f = fine(prefix)
            kept = model(f)[keep(f)]
            return np.append(kept, 1 - kept.sum())
        return law

    for k, length in [(1, 3), (2, 2), (3, 2)]:
        want = block_bound_bracket(target, draft, vocab_size=5, num_drafts=k, block_len=length, kind="causal",
                                   top_m=m)
        got = merged_bound_bracket(merged(target), merged(draft), vocab_size=m + 1, num_drafts=k,
                                   block_len=length, kind="causal")
        assert abs(got.lower - want.lower) < LP_ATOL and abs(got.upper - want.upper) < LP_ATOL
        assert got.nodes_evaluated == want.nodes_evaluated
        assert abs(got.truncated_target_mass - want.truncated_target_mass) < 1e-12


def test_positions_are_those_of_the_block_traces(stored, tmp_path):
    pair, tmp, records = stored
    collect_block_traces(pair, tmp / "traces", tmp_path / "blocks", num_drafts=1, block_length=1,
                         positions_per_trace=2, progress=False)
    blocks = sorted((r.prompt_id, r.position) for r in load_block_traces(tmp_path / "blocks"))
    assert blocks == sorted((r.prompt_id, r.position) for r in records)


def test_resume_and_bad_input(stored, tmp_path):
    pair, tmp, _ = stored
    again = collect_draft_trees(lambda: pytest.fail("nothing to collect: the models must not load"),
                                tmp / "traces", tmp / "trees", width=V, depth=3, positions_per_trace=2,
                                variants=[{}, TRUNCATED], progress=False)
    assert len(again) == 2
    with pytest.raises(ob.InvalidInputError, match="different configuration"):
        collect_draft_trees(pair, tmp / "traces", tmp / "trees", width=2, depth=3, positions_per_trace=2,
                            progress=False)
    with pytest.raises(ob.InvalidInputError, match="exceeds the vocabulary"):
        collect_draft_trees(pair, tmp / "traces", tmp_path / "x", width=V + 1, progress=False)
    with pytest.raises(ob.InvalidInputError, match="variant"):
        collect_draft_trees(pair, tmp / "traces", tmp_path / "x", variants=[{"top_q": 3}], progress=False)
    rec = next(load_draft_trees(tmp / "trees"))
    with pytest.raises(ob.InvalidInputError, match="does not fit"):
        rec.static_tree((V + 1,))
    with pytest.raises(ob.InvalidInputError, match="exceeds the stored tree's depth"):
        rec.iid_bracket(2, 4)
    with pytest.raises(ob.InvalidInputError, match="out of range"):
        rec.static_tree((1,), variant=2)
    with pytest.raises(ob.InvalidInputError, match="vocab_size"):
        merged_bound_bracket(lambda p: [1.0], lambda p: [1.0], vocab_size=1, num_drafts=1, block_len=1,
                             kind="causal")


def _greedy_law_tokens(draft, k, length, v):
    """The greedy block law in token ids on the live draft, written out independently."""
    from otbound.token.draft_laws import top_tokens

    root = draft(())
    order = top_tokens(root, v)
    fixed = []
    for j in range(k - 1):
        row = (int(order[j]),)
        while len(row) < length:
            row += (int(top_tokens(draft(row), 1)[0]),)
        fixed.append(row)
    rest = np.ones(v, dtype=bool)
    rest[order[: k - 1]] = False
    first = np.where(rest, root, 0.0) / root[rest].sum()
    law = []
    for block in np.ndindex(*(v,) * length):
        pr = first[block[0]] * np.prod([draft(block[:i])[block[i]] for i in range(1, length)])
        if pr > 0:
            law.append((float(pr), fixed + [block]))
    return law


def test_greedy_bracket_is_exact_when_nothing_is_merged(stored):
    from otbound.block.law_bounds import tuple_law_bounds

    pair, _, records = stored
    for rec in records[:2]:
        target, draft = lm_block_models(pair, rec.prefix, rec.temperature)
        for k, length in [(1, 2), (2, 2), (3, 2), (2, 3)]:
            exact = tuple_law_bounds(target, draft, _greedy_law_tokens(draft, k, length, V), vocab_size=V,
                                     block_len=length).causal
            b = rec.greedy_bracket(k, length)
            assert abs(b.lower - exact) < FORWARD_ATOL and abs(b.upper - exact) < FORWARD_ATOL, (k, length)
            if k == 1:  # one random block: the i.i.d. law of K = 1
                assert abs(b.lower - rec.iid_bracket(1, length).lower) < LP_ATOL


def test_greedy_bracket_contains_the_exact_value_and_refuses_an_undefined_law(stored):
    from otbound.block.law_bounds import tuple_law_bounds

    pair, _, records = stored
    gaps = []
    for rec in records:
        target, draft = lm_block_models(pair, rec.prefix, rec.temperature)
        exact = tuple_law_bounds(target, draft, _greedy_law_tokens(draft, 2, 2, V), vocab_size=V,
                                 block_len=2).causal
        b = rec.greedy_bracket(2, 2, width=2)
        assert b.lower - FORWARD_ATOL <= exact <= b.upper + FORWARD_ATOL
        gaps.append(b.upper - b.lower)
    assert max(gaps) > 1e-3
    rec = records[0]
    with pytest.raises(ob.InvalidInputError, match="width above K − 1"):
        rec.greedy_bracket(3, 2, width=2)
    top1 = rec.settings.index(next(s for s in rec.settings if s[1].top_k == 3))  # the truncated variant
    survivors = int(np.count_nonzero(rec.draft[top1, 0, :-1] > 0))
    with pytest.raises(ob.InvalidInputError, match="fewer than K tokens survive"):
        rec.greedy_bracket(survivors + 1, 2, variant=top1)
