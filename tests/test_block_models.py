"""Block models: checked laws, reproducibility, joint laws, vectorised sampling (chi-square)."""

import numpy as np
import pytest
from conftest import gof_pvalue

from otbound import InvalidInputError
from otbound.block.models import (
    BlockModel,
    as_block_model,
    context_free_model,
    dirichlet_model,
    mixture_model,
    prefix_law,
    sample_blocks,
    sequence_probability,
    shifted_model,
    tabulated_model,
    zipf_model,
)


def test_dirichlet_is_a_pure_function_of_seed_and_prefix():
    a = dirichlet_model(5, seed=3)
    b = dirichlet_model(5, seed=3)
    b((4, 4, 1))  # query order must not matter
    for pre in [(), (1,), (2, 0), (4, 4, 1)]:
        np.testing.assert_array_equal(a(pre), b(pre))
        assert a(pre).sum() == pytest.approx(1.0, abs=1e-12)
    assert not np.allclose(a((1,)), dirichlet_model(5, seed=4)((1,)))
    # tiny concentrations underflow to all-zero Dirichlet draws: still a law
    assert dirichlet_model(4, concentration=1e-6, seed=0)(()).sum() == pytest.approx(1.0)


def test_zipf_shape_and_context_free():
    z = zipf_model(6, exponent=1.5, seed=1)
    law = np.sort(z((2,)))[::-1]
    expected = np.arange(1, 7) ** -1.5
    np.testing.assert_allclose(law, expected / expected.sum())
    c = context_free_model([0.2, 0.8])
    np.testing.assert_array_equal(c((1, 0, 1)), [0.2, 0.8])


def test_prefix_law_matches_sequence_probability():
    m = dirichlet_model(3, seed=7)
    joint = prefix_law(m, 3, context=(2,))
    assert joint.shape == (3, 3, 3)
    assert joint.sum() == pytest.approx(1.0, abs=1e-12)
    assert joint[1, 0, 2] == pytest.approx(sequence_probability(m, (1, 0, 2), context=(2,)))
    assert joint[1, 0, 2] == pytest.approx(sequence_probability(shifted_model(m, (2,)), (1, 0, 2)))


def test_tabulated_and_mixture():
    t = tabulated_model({(): [0.5, 0.5], (1,): [1.0, 0.0]}, 2, default=[0.25, 0.75])
    np.testing.assert_array_equal(t((1,)), [1.0, 0.0])
    np.testing.assert_array_equal(t((0, 1)), [0.25, 0.75])
    strict = tabulated_model({(): [0.5, 0.5]}, 2)
    with pytest.raises(InvalidInputError, match=r"no law for prefix \[1\]"):
        strict((1,))
    mix = mixture_model(context_free_model([1.0, 0.0]), context_free_model([0.0, 1.0]), 0.25)
    np.testing.assert_allclose(mix(()), [0.75, 0.25])


def test_bad_input_is_named():
    with pytest.raises(InvalidInputError, match="vocab_size"):
        BlockModel(0, lambda pre: [1.0])
    bad = BlockModel(3, lambda pre: np.array([0.5, 0.5]), "bad")
    with pytest.raises(InvalidInputError, match="2 tokens .* expected vocab_size = 3"):
        bad(())
    neg = BlockModel(2, lambda pre: np.array([1.5, -0.5]), "neg")
    with pytest.raises(InvalidInputError, match="negative"):
        neg(())
    with pytest.raises(InvalidInputError, match="outside the vocabulary"):
        dirichlet_model(3)((3,))
    with pytest.raises(InvalidInputError, match="callable"):
        as_block_model([0.5, 0.5], 2)
    with pytest.raises(InvalidInputError, match="concentration"):
        dirichlet_model(3, concentration=0.0)


def test_sample_blocks_law_chi_square():
    """2e5 blocks of length 3 over V = 3 against the exact joint law (fixed seed, level 1e-3; 27 bins:
    worst-case power 0.999 against any 1%-TV distortion, asserted below; 1e5 blocks had 0.79)."""
    m = dirichlet_model(3, seed=11, concentration=0.8)
    n = 200_000
    blocks = sample_blocks(m, n, 3, rng=123, context=(1,))
    pval = gof_pvalue(np.ravel_multi_index(blocks.T, (3, 3, 3)), prefix_law(m, 3, context=(1,)).ravel(), power=0.99)
    assert pval > 1e-3, pval
