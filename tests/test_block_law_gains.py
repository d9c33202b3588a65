"""What a drafter objective can gain at most per block draft law: the cross-entropy optimum against
the family's ceiling, each checked by an independent method (the block LP, a dense grid, enumeration)."""

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from otbound import InvalidInputError  # noqa: E402
from otbound.block import (  # noqa: E402
    BLOCK_DRAFT_LAWS,
    TopKMarkov,
    block_draft_law_bounds,
    block_marginals,
    dirichlet_model,
    sequence_probability,
    tabulated_model,
)
from otbound.objectives import block_law_gains, chain_term, expected_accepted_length  # noqa: E402


@pytest.mark.parametrize("v, length, seed", [(2, 2, 0), (3, 2, 1), (2, 3, 2)])
def test_ce_values_are_the_block_bounds_of_the_target_marginals(v, length, seed):
    target = dirichlet_model(v, concentration=0.8, seed=seed)
    g = block_law_gains(target, length, steps=20, restarts=0)
    m, t = block_marginals(target, length)
    laws = (BLOCK_DRAFT_LAWS["marginal_product"], BLOCK_DRAFT_LAWS["argmax_chain"], TopKMarkov(2))
    for i, law in enumerate(laws):
        assert abs(g.ce[i] - block_draft_law_bounds(target, law, m, t).causal) < 1e-8
    assert (g.gain >= -1e-12).all() and (g.ceiling <= length + 1e-12).all()
    # argmax chain: the exact ceiling is the best fixed block by enumeration
    best = max(sum(sequence_probability(target, x[:ell]) for ell in range(1, length + 1))
               for x in itertools.product(range(v), repeat=length))
    assert abs(g.ceiling[1] - best) < 1e-12 and g.method[1] == "exact"


def test_product_ceiling_matches_a_dense_grid():
    target = dirichlet_model(2, concentration=0.6, seed=3)
    g = block_law_gains(target, 2, steps=300, restarts=2)
    grid = np.linspace(0.0, 1.0, 501)
    a, b = np.meshgrid(grid, grid, indexing="ij")
    q = np.stack([np.stack([a, 1 - a], -1), np.stack([b, 1 - b], -1)], axis=-2).reshape(-1, 2, 2)
    levels = [np.asarray(target(()))[None], np.stack([target((0,)), target((1,))])]
    values = expected_accepted_length(levels, q, "block")
    # the grid max is within 2 × 0.002 × (Lipschitz ≤ 2) of the true max; the search at most that above
    assert abs(g.ceiling[0] - values.max()) < 1e-2 and g.ceiling[0] >= values.max() - 1e-3
    assert g.ceiling[0] >= g.ce[0] - 1e-12


def test_markov_ceiling_reaches_the_target_when_the_family_holds_it():
    # V = 2, L = 2, k = 2: every block law is a Markov law on these candidates, the target's own
    # included, whose block verification accepts everything (E[τ] = L)
    target = dirichlet_model(2, concentration=2.0, seed=4)
    g = block_law_gains(target, 2, steps=400, restarts=1)
    assert g.ceiling[2] > 2.0 - 2e-3 and g.ce[2] == pytest.approx(2.0, abs=1e-9)
    # the product family cannot: the target's second token depends on the first
    assert g.ceiling[0] < 2.0 - 1e-3


def test_chain_term_optimum_is_the_argmax_chain():
    # the chain term with target laws is maximised by one-hot q at the marginals' argmax
    target = dirichlet_model(3, seed=5)
    m, _ = block_marginals(target, 3)
    p = torch.tensor(m)
    star = torch.nn.functional.one_hot(torch.tensor(m.argmax(-1)), 3).double()
    best = chain_term(torch.log(star.clamp_min(1e-300)), p)
    rand = chain_term(torch.randn((200, 3, 3), generator=torch.Generator().manual_seed(0), dtype=torch.float64), p)
    assert (rand <= best + 1e-12).all()


def test_copying_target():
    copy = tabulated_model({(): [0.5, 0.5]}, 2, default=lambda pre: np.eye(2)[pre[0]])
    g = block_law_gains(copy, 2, steps=200, restarts=2)
    # product at the target's marginals: 1 + 1/2; no product does better (max over a 401² grid of
    # (q1, q2): 1.5, e.g. q1 = (1/2, 1/2), q2 = (0, 1)); the argmax chain (0, 0): 1/2 + 1/2; Markov: 2
    assert g.ce.tolist() == pytest.approx([1.5, 1.0, 2.0], abs=1e-9)
    assert g.ceiling[0] == pytest.approx(1.5, abs=1e-6) and g.gain[2] == pytest.approx(0.0, abs=1e-9)


def test_bad_input_is_refused():
    target = dirichlet_model(2, seed=0)
    with pytest.raises(InvalidInputError, match="block_len"):
        block_law_gains(target, 0)
    with pytest.raises(InvalidInputError, match="restarts"):
        block_law_gains(target, 2, restarts=-1)
    with pytest.raises(InvalidInputError, match="MAX_PATHS"):
        block_law_gains(dirichlet_model(200, seed=0), 4)


def test_experiment_script_runs(tmp_path):
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    script = importlib.import_module("block_diffusion_laws")
    res = script.main(["--contexts", "1", "--block-len", "2", "--steps", "5", "--out", str(tmp_path),
                       "--results", str(tmp_path)])
    for rows in res["panels"].values():
        for cell in rows["bounds"].values():
            assert abs(cell["block"] - cell["causal"]) < 1e-8 and cell["token"] <= cell["causal"] + 1e-9
        assert all(c >= e - 1e-12 for c, e in zip(rows["ceiling"], rows["ce"]))
    assert (tmp_path / "block_diffusion_laws.png").stat().st_size > 1000
