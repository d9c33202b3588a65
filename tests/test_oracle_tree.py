"""The best deterministic tree at a node budget: exact against brute force over all trees, above
every deterministic drafter, and beside the static and sampled schemes."""

import itertools

import numpy as np
import pytest
import scipy.stats

from otbound import InvalidInputError
from otbound.block import (
    BLOCK_VERIFIERS,
    MAX_ORACLE_CELLS,
    context_free_model,
    dirichlet_model,
    fit_log_growth,
    node_budget_comparison,
    oracle_tree_bound,
    sequence_probability,
    static_tree_bound,
    zipf_model,
)


def _all_nodes(v, depth):
    return [w for d in range(1, depth + 1) for w in itertools.product(range(v), repeat=d)]


def _brute_force(model, v, depth, budget):
    """max Σ p(w) over every prefix-closed set of ``budget`` nodes of depth ≤ ``depth``."""
    nodes = _all_nodes(v, depth)
    prob = {w: sequence_probability(model, w) for w in nodes}
    best = 0.0
    for subset in itertools.combinations(nodes, budget):
        chosen = set(subset)
        if all(len(w) == 1 or w[:-1] in chosen for w in chosen):
            best = max(best, sum(prob[w] for w in chosen))
    return best


@pytest.mark.parametrize("v, depth", [(2, 3), (3, 2)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle_equals_brute_force_over_all_trees(v, depth, seed):
    model = dirichlet_model(v, concentration=0.7, seed=seed)
    n = len(_all_nodes(v, depth))
    bound = oracle_tree_bound(model, n, max_depth=depth)
    assert bound.curve.size == n
    for b in range(1, n + 1):
        assert abs(bound.curve[b - 1] - _brute_force(model, v, depth, b)) < 1e-12, b
    assert abs(oracle_tree_bound(model, 3, max_depth=depth).value - bound.curve[2]) < 1e-15


def test_oracle_nodes_form_a_tree_in_decreasing_probability():
    model = zipf_model(5, exponent=1.2, seed=3)
    b = oracle_tree_bound(model, 60, max_depth=4)
    chosen = set(b.nodes)
    assert len(chosen) == 60 and all(len(w) == 1 or w[:-1] in chosen for w in b.nodes)
    assert (np.diff(b.probs) <= 1e-15).all()
    assert all(abs(pw - sequence_probability(model, w)) < 1e-14 for w, pw in zip(b.nodes, b.probs))
    assert abs(b.levels.sum() - b.value) < 1e-12 and max(len(w) for w in b.nodes) <= 4


def test_adversarial_ties_and_zeros():
    # uniform laws: every node of a level ties; zeros: only one path has mass
    uni = oracle_tree_bound(context_free_model([0.5, 0.5]), 6, max_depth=3)
    assert abs(uni.value - (0.5 + 0.5 + 4 * 0.25)) < 1e-15
    point = oracle_tree_bound(context_free_model([0.0, 1.0, 0.0]), 5, max_depth=3)
    assert point.nodes == [(1,), (1, 1), (1, 1, 1)] and point.value == 3.0 and point.budget == 5


def test_every_deterministic_tree_stays_below_the_oracle():
    rng = np.random.default_rng(0)
    target = dirichlet_model(3, seed=4)
    for _ in range(40):
        # a random tree: grow by adding a random child of a random chosen node
        tree = set()
        size = int(rng.integers(1, 12))
        while len(tree) < size:
            parents = [()] + [w for w in tree if len(w) < 3]
            par = parents[rng.integers(len(parents))]
            tree.add(par + (int(rng.integers(3)),))
        value = sum(sequence_probability(target, w) for w in tree)
        assert value <= oracle_tree_bound(target, len(tree), max_depth=3).value + 1e-12
    draft = dirichlet_model(3, seed=5)
    for br in [(1, 1, 1), (2, 1), (3, 2), (2, 2, 1)]:
        st = static_tree_bound(target, draft, br)
        nodes = len({tuple(r[:d]) for r in st.paths.tolist() for d in range(1, len(br) + 1)})
        assert st.value <= oracle_tree_bound(target, nodes, max_depth=len(br)).value + 1e-12
        # the traversal verifier attains the static value: deterministic drafting reaches its Σ p(w)
        acc = BLOCK_VERIFIERS["static_tree"].__class__(br).acceptance(
            target, draft, vocab_size=3, num_drafts=br[0], block_len=len(br))
        assert abs(acc - st.value) < 1e-10


def test_candidates_restrict_the_tree():
    target = context_free_model([0.5, 0.3, 0.2])
    b = oracle_tree_bound(target, 3, max_depth=2, candidates=lambda prefix: [1, 2])
    assert b.nodes == [(1,), (2,), (1, 1)] and abs(b.value - (0.3 + 0.2 + 0.09)) < 1e-15


def test_bad_input_is_refused():
    model = context_free_model([0.5, 0.5])
    for bad in (0, -1, 2.5, "3"):
        with pytest.raises(InvalidInputError, match="budget"):
            oracle_tree_bound(model, bad)
    with pytest.raises(InvalidInputError, match="max_depth"):
        oracle_tree_bound(model, 2, max_depth=0)
    with pytest.raises(InvalidInputError, match="MAX_ORACLE_CELLS"):
        oracle_tree_bound(lambda prefix: np.full(100_000, 1e-5), 10_000, vocab_size=100_000)
    assert 1000 * 1000 < MAX_ORACLE_CELLS  # a budget of 1000 at V = 1000 is allowed
    with pytest.raises(InvalidInputError, match="vocab_size"):
        oracle_tree_bound(lambda prefix: [0.5, 0.5], 2)
    for bad in ([0, 2], [1, 1], [-1]):
        with pytest.raises(InvalidInputError, match="candidates"):
            oracle_tree_bound(model, 2, candidates=lambda prefix, c=bad: c)
    with pytest.raises(InvalidInputError, match="budgets"):
        node_budget_comparison(model, model, None, max_depth=2)
    with pytest.raises(InvalidInputError, match="distinct"):
        fit_log_growth([2, 2], [1.0, 1.0])


def test_log_fit_matches_scipy_linregress():
    rng = np.random.default_rng(1)
    budgets = np.array([1, 2, 4, 8, 16, 32])
    values = rng.random(6).cumsum()
    fit = fit_log_growth(budgets, values)
    ref = scipy.stats.linregress(np.log(budgets), values)
    assert abs(fit.a - ref.intercept) < 1e-12 and abs(fit.b - ref.slope) < 1e-12
    assert abs(fit.r2 - ref.rvalue**2) < 1e-12


def test_node_budget_comparison_on_synthetic_models():
    target, draft = dirichlet_model(3, seed=0), dirichlet_model(3, seed=1)
    c = node_budget_comparison(target, draft, [1, 2, 4, 6], max_depth=2)
    assert (c.static <= c.oracle + 1e-12).all()
    # independent values: the static best by hand over branchings, the sampled best by block_bound
    from otbound.block import block_bound

    for i, b in enumerate(c.budgets):
        cands = [br for br in [(1,), (2,), (3,), (1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (3, 1)]
                 if sum(int(np.prod(br[:d + 1])) for d in range(len(br))) <= b]
        assert abs(c.static[i] - max(static_tree_bound(target, draft, br).value for br in cands)) < 1e-12
        sampled = max(block_bound(target, draft, vocab_size=3, num_drafts=k, block_len=ln, kind="causal").value
                      for k in range(1, 9) for ln in (1, 2) if k * ln <= b)
        assert abs(c.sampled[i] - sampled) < 1e-9
    # at B = 1: the draft's one most probable token against the target's; sampled = 1 − TV
    p0, q0 = target(()), draft(())
    assert abs(c.oracle[0] - p0.max()) < 1e-15 and abs(c.static[0] - p0[q0.argmax()]) < 1e-15
    assert abs(c.sampled[0] - np.minimum(p0, q0).sum()) < 1e-9


def test_tiny_pair_comparison():
    pytest.importorskip("torch")
    from otbound.lm import lm_block_models, tiny_pair

    pair = tiny_pair(vocab_size=5)
    target, draft = lm_block_models(pair, [1, 2, 3], 1.0)
    c = node_budget_comparison(target, draft, [1, 2, 4, 8], max_depth=3, sampled_max_block_len=2,
                               sampled_max_drafts=4)
    assert (c.static <= c.oracle + 1e-12).all() and (np.diff(c.oracle) > 0).all()
    assert c.fit is not None and c.fit.b > 0 and 0.0 <= c.fit.r2 <= 1.0
    # the oracle at B = 1 is the target's mode; at depth 2 it is the brute-force best of the real laws
    assert abs(c.oracle[0] - target(()).max()) < 1e-12
    shallow = oracle_tree_bound(target, 4, max_depth=2).value
    assert abs(shallow - _brute_force(target, 5, 2, 4)) < 1e-12 and c.oracle[2] >= shallow - 1e-15


def test_real_pair_script_runs_on_tiny_draft_trees(tmp_path):
    """The real-pair path of experiments/oracle_tree.py on draft trees of the tiny pair: the best subtree
    of the draft's stored tree stays below the target's own best tree, the static trees below both."""
    pytest.importorskip("torch")
    import importlib
    import sys
    from pathlib import Path

    from otbound.lm import Prompt, collect_draft_trees, collect_traces, tiny_pair

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    script = importlib.import_module("oracle_tree")
    pair = tiny_pair(vocab_size=6)
    traces, trees = tmp_path / "traces", tmp_path / "trees"
    collect_traces(pair, [Prompt("tiny/0", "tiny", "", (1, 2, 3))], str(traces), max_new_tokens=4, progress=False)
    collect_draft_trees(pair, str(traces), str(trees), width=3, depth=2, positions_per_trace=2, progress=False)
    res = script.main(["--trees", str(trees), "--pair", "tiny", "--tiny-vocab", "6", "--budgets", "1", "2", "4",
                       "--out", str(tmp_path), "--results", str(tmp_path)])
    rows = res["panels"]["stored draft trees"]
    assert rows["trees"] == 2
    oracle, sub, static = (np.array(rows[k]) for k in ("oracle", "draft_tree_oracle", "static"))
    assert (sub <= oracle + 1e-6).all() and (static <= sub + 1e-12).all() and (np.diff(oracle) > 0).all()
    assert (tmp_path / "oracle_tree_real.png").stat().st_size > 1000


def test_static_trees_the_draft_cannot_fill_are_skipped():
    # a draft with one token of positive probability has only chains: (1,), (1, 1), ...
    target, draft = dirichlet_model(3, seed=6), context_free_model([0.0, 1.0, 0.0])
    c = node_budget_comparison(target, draft, [1, 3], max_depth=2)
    assert c.static_branching == [(1,), (1, 1)]
    assert abs(c.static[1] - (target(())[1] + target(())[1] * target((1,))[1])) < 1e-15


def test_default_script_path_runs(tmp_path):
    pytest.importorskip("torch")
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    script = importlib.import_module("oracle_tree")
    res = script.main(["--contexts", "1", "--depth", "2", "--budgets", "1", "2", "4", "--out", str(tmp_path),
                       "--results", str(tmp_path)])
    for rows in res["panels"].values():
        assert all(s <= o + 1e-12 for s, o in zip(rows["static"], rows["oracle"]))
        assert rows["fit"]["b"] > 0
    again = script.main(["--redraw", "--out", str(tmp_path), "--results", str(tmp_path)])
    assert again["panels"] == res["panels"] and (tmp_path / "oracle_tree.md").read_text().count("log B") >= 2
    stored = tmp_path / "oracle_tree.json"
    stored.write_text(stored.read_text().replace('"oracle": [', '"oracle": [9.0, ', 1))   # a damaged value
    with pytest.raises(SystemExit) as exc:
        script.main(["--redraw", "--out", str(tmp_path), "--results", str(tmp_path)])
    assert exc.value.code == 2


def test_real_pair_script_oracle_without_depth_limit(tmp_path):
    """--oracle-depth 0: the live oracle may go deeper than the stored trees; it equals
    oracle_tree_bound without max_depth on the same live models, and is at least the depth-limited one."""
    pytest.importorskip("torch")
    import importlib
    import sys
    from pathlib import Path

    from otbound.lm import Prompt, collect_draft_trees, collect_traces, lm_block_models, load_draft_trees, tiny_pair

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    script = importlib.import_module("oracle_tree")
    pair = tiny_pair(vocab_size=4)
    traces, trees = tmp_path / "traces", tmp_path / "trees"
    collect_traces(pair, [Prompt("tiny/0", "tiny", "", (1, 2, 3))], str(traces), max_new_tokens=4, progress=False)
    collect_draft_trees(pair, str(traces), str(trees), width=2, depth=1, positions_per_trace=1, progress=False)
    common = ["--trees", str(trees), "--pair", "tiny", "--tiny-vocab", "4", "--budgets", "1", "3", "6",
              "--out", str(tmp_path), "--results", str(tmp_path)]
    deep = script.main(common + ["--oracle-depth", "0"])["panels"]["stored draft trees"]
    flat = script.main(common)["panels"]["stored draft trees"]
    (rec,) = load_draft_trees(trees)
    live, _ = lm_block_models(pair, rec.prefix.tolist(), rec.temperature)
    expected = oracle_tree_bound(live, 6).curve[[0, 2, 5]]
    assert np.allclose(deep["oracle"], expected, rtol=0, atol=1e-12) and deep["oracle_depth"] == "none"
    assert flat["oracle_depth"] == "tree depth" and flat["oracle"][2] <= 1.0 + 1e-12   # depth 1: at most 1 token
    assert (np.array(deep["oracle"]) >= np.array(flat["oracle"]) - 1e-12).all() and deep["oracle"][2] > 1.0


def test_real_pair_script_curves_per_dataset(tmp_path):
    """Trees of two datasets: each dataset's mean curve, and the panel's curve is their mean weighted
    by trees; the table names both."""
    pytest.importorskip("torch")
    import importlib
    import sys
    from pathlib import Path

    from otbound.lm import Prompt, collect_draft_trees, collect_traces, tiny_pair

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    script = importlib.import_module("oracle_tree")
    pair = tiny_pair(vocab_size=4)
    traces, trees = tmp_path / "traces", tmp_path / "trees"
    prompts = [Prompt("a/0", "a", "", (1, 2, 3)), Prompt("b/0", "b", "", (3, 1)), Prompt("b/1", "b", "", (2, 2, 0))]
    collect_traces(pair, prompts, str(traces), max_new_tokens=3, progress=False)
    collect_draft_trees(pair, str(traces), str(trees), width=2, depth=2, positions_per_trace=1, progress=False)
    res = script.main(["--trees", str(trees), "--budgets", "1", "2", "4", "--out", str(tmp_path), "--results",
                       str(tmp_path)])
    rows = res["panels"]["stored draft trees"]
    parts = rows["by_dataset"]
    assert sorted(parts) == ["a", "b"] and [parts[d]["trees"] for d in ("a", "b")] == [1, 2]
    weighted = (np.array(parts["a"]["static"]) + 2 * np.array(parts["b"]["static"])) / 3
    assert np.allclose(rows["static"], weighted, rtol=0, atol=1e-12)
    text = (tmp_path / "oracle_tree_real.md").read_text()
    assert "stored draft trees: a (1 trees)" in text and "stored draft trees: b (2 trees)" in text
