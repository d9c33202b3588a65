"""The draft-law registry: one object per law, keyed by the public ``sampling`` names."""

import itertools

import numpy as np
import pytest

import otbound as ob


def test_registry_matches_the_public_sampling_names():
    assert tuple(ob.DRAFT_LAWS) == ob.SAMPLINGS
    for name, law in ob.DRAFT_LAWS.items():
        assert isinstance(law, ob.DraftLaw) and law.name == name and ob.draft_law(name) is law
    with pytest.raises(ob.InvalidInputError, match="unknown sampling 'top_k'"):
        ob.draft_law("top_k")


@pytest.mark.parametrize("sampling", ["with_replacement", "without_replacement", "greedy"])
def test_each_law_is_one_consistent_object(sampling):
    """joint, subset_mass, inclusion and sample of one law describe the same distribution: Q(H) and
    P(y ∈ x̄) summed from the joint agree to 1e-12, and 20,000 samples match the joint within 5
    standard errors per tuple."""
    law = ob.draft_law(sampling)
    rng = np.random.default_rng(3)
    q = rng.dirichlet(np.full(5, 0.7))
    q[1] = 0.0
    q /= q.sum()
    k = 3
    joint = law.joint(q, k)
    tuples = np.array(list(itertools.product(range(5), repeat=k)))
    mass = joint[tuple(tuples.T)]
    for h in (np.array([1, 1, 0, 1, 1], bool), np.array([1, 0, 1, 1, 0], bool), np.ones(5, bool)):
        inside = h[tuples].all(axis=1)
        assert abs(law.subset_mass(q, h, k) - mass[inside].sum()) < 1e-12
    incl = [mass[(tuples == y).any(axis=1)].sum() for y in range(5)]
    np.testing.assert_allclose(law.inclusion(q, k), incl, atol=1e-12)
    n = 20_000
    drawn = law.sample(q, k, n, rng)
    law.check_drafts(q, drawn, k)  # every sampled tuple is one the law can produce
    freq = np.zeros((5,) * k)
    np.add.at(freq, tuple(drawn.T), 1.0 / n)
    se = np.sqrt(joint * (1 - joint) / n) + 1e-12
    assert np.all(np.abs(freq - joint) <= 5 * se + 1e-9)
