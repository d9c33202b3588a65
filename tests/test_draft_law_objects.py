"""The draft-law registry: one object per law, keyed by the public ``sampling`` names."""

import itertools

import numpy as np
import pytest

import otbound as ob


def test_registry_matches_the_public_sampling_names():
    assert ob.SAMPLINGS == ("with_replacement", "without_replacement", "greedy", "deterministic")
    assert tuple(ob.DRAFT_LAWS) == ob.SAMPLINGS + ("systematic",)
    assert ob.SAMPLINGS == tuple(name for name, law in ob.DRAFT_LAWS.items() if law.default)
    for name, law in ob.DRAFT_LAWS.items():
        assert isinstance(law, ob.DraftLaw) and law.name == name and ob.draft_law(name) is law
    with pytest.raises(ob.InvalidInputError, match="unknown sampling 'top_k'"):
        ob.draft_law("top_k")


@pytest.mark.parametrize("sampling", ["with_replacement", "without_replacement", "greedy", "systematic"])
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


UNKNOWN = "unknown sampling 'top_k'; expected one of ('with_replacement', 'without_replacement', 'greedy', " \
          "'deterministic', 'systematic')"


def test_an_unknown_law_is_refused_by_every_entry_naming_the_known_ones():
    """Bounds, sampling, the tuple law, the batched engine, measurement, the planner and the kit
    resolve the name once and refuse an unknown one up front (never a fall-through to some kernel)."""
    from otbound.conformance import check_token_verifier, token_sample_adapter
    from otbound.plan import measure_table
    from otbound.report import measure_laws
    from otbound.token import LawBatch

    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    calls = [
        lambda: ob.optimal_acceptance(p, q, 2, "top_k"),
        lambda: ob.optimal_acceptance(p, q, 2, "top_k", return_certificate=True),
        lambda: ob.sample_drafts(q, 2, "top_k"),
        lambda: ob.draft_joint(q, 2, "top_k"),
        lambda: ob.subset_mass(q, [0], 2, "top_k"),
        lambda: ob.token.inclusion_probabilities(q, 2, "top_k"),
        lambda: ob.relaxation_bounds(p, q, 2, "top_k"),
        lambda: LawBatch(p, q).optimal_acceptance(2, "top_k"),
        lambda: measure_laws(p[None], q[None], (2,), samplings=("top_k",)),
        lambda: measure_table([(p[None], q[None])], max_drafts=1, laws=("top_k",)),
        lambda: check_token_verifier(token_sample_adapter(ob.VERIFIERS["rrs"]), vocab_size=2, num_drafts=2,
                                     sampling="top_k"),
        lambda: ob.token.verifiers.NaiveVerifier("top_k"),
    ]
    for call in calls:
        with pytest.raises(ob.InvalidInputError) as err:
            call()
        assert str(err.value) == UNKNOWN


def _random_row(rng, v, zeros=0):
    q = rng.dirichlet(np.full(v, 0.6))
    q[rng.choice(v, zeros, replace=False)] = 0.0
    return q / q.sum()


def test_systematic_tuple_law_sums_to_one_and_matches_its_definition():
    """The enumerated support against an independent fine grid of the uniform U: the tuple law read
    off 200,001 evenly spaced U agrees with it to the grid's resolution, its probabilities sum to 1
    (1e-12), and P(y ∈ x̄) = min(1, K q_y), the closed form, equals the sum over the support."""
    rng = np.random.default_rng(11)
    law = ob.draft_law("systematic")
    grid = (np.arange(200_001) + 0.5) / 200_001
    for v, k, zeros in ((4, 2, 0), (6, 3, 2), (5, 7, 1), (9, 4, 3)):
        q = _random_row(rng, v, zeros)
        tuples, probs = law.support(q, k)
        assert abs(probs.sum() - 1.0) < 1e-12 and (probs > 0).all()
        assert len({tuple(t) for t in tuples.tolist()}) == len(tuples) <= law.max_tuples(v, k)
        cdf = np.cumsum(q)
        points = (np.arange(k)[None, :] + grid[:, None]) / k  # (n, K)
        drawn = np.minimum(np.searchsorted(cdf, points, side="right"), np.flatnonzero(q > 0)[-1])
        seen, counts = np.unique(drawn, axis=0, return_counts=True)
        freq = dict(zip(map(tuple, seen.tolist()), counts / grid.size))
        for t, w in zip(map(tuple, tuples.tolist()), probs):
            assert abs(freq.pop(t, 0.0) - w) <= 2 * k / grid.size
        assert sum(freq.values()) <= 2 * k / grid.size  # nothing on the grid outside the support
        incl = np.zeros(v)
        for t, w in zip(tuples.tolist(), probs):
            incl[sorted(set(t))] += w
        np.testing.assert_allclose(law.inclusion(q, k), incl, atol=1e-12)
        np.testing.assert_allclose(law.inclusion(q, k), np.minimum(1.0, k * q), atol=0)


@pytest.mark.parametrize("seed", range(6))
def test_systematic_alpha_star_matches_an_independent_lp(seed):
    """α* of the systematic law (the LP over its support, certified by its min cut) against POT's
    network simplex and cvxpy on the dense joint (V ≤ 6, K ≤ 3) and, at V ≤ 8, brute force over all
    2^V subsets H, to 1e-9; its binding set attains the value; α* is in [relaxation lower, upper]."""
    rng = np.random.default_rng(seed)
    for v, k in ((3, 2), (5, 2), (6, 3), (4, 5)):
        p = _random_row(rng, v, seed % 2)
        q = _random_row(rng, v, (seed // 2) % 2)
        res = ob.optimal_acceptance(p, q, k, "systematic", return_certificate=True)
        joint = ob.draft_joint(q, k, "systematic")
        for method in ("pot", "cvxpy"):
            assert abs(res.value - ob.optimal_acceptance_lp(p, joint, method=method)) < 1e-9, (v, k, method)
        assert abs(res.value - ob.optimal_acceptance_brute_force(p, joint).value) < 1e-9
        h = res.binding_set
        tuples, probs = ob.draft_law("systematic").support(q, k)
        assert res.method == "support-lp"
        if h.any():
            assert abs(1 + p[h].sum() - probs[h[tuples].all(axis=1)].sum() - res.value) < 1e-12
        rel = ob.relaxation_bounds(p, q, k, "systematic")
        assert rel.lower - 1e-9 <= res.value <= rel.upper + 1e-9
    batch = np.stack([_random_row(rng, 7) for _ in range(4)]), np.stack([_random_row(rng, 7) for _ in range(4)])
    np.testing.assert_array_equal(ob.optimal_acceptance(*batch, 3, "systematic"),
                                  [ob.optimal_acceptance(a, b, 3, "systematic") for a, b in zip(*batch)])


def test_systematic_sampling_passes_the_kits_g_test_with_stated_power():
    """Draws of ``sample_drafts(..., "systematic")`` against the enumerated tuple law by the kit's
    G-test: n is chosen by the kit for power ≥ 0.99 at level 1e-3 against any distortion of total
    variation 0.02 (the test can fail), and a distorted sampler (i.i.d. draws, the same marginal
    inclusion off by K q_y) is rejected by the same test."""
    from otbound.conformance import g_test, samples_for_power

    rng = np.random.default_rng(5)
    q, k = _random_row(rng, 6, 1), 3
    law = ob.draft_law("systematic")
    tuples, probs = law.support(q, k)
    n = samples_for_power(len(probs) - 1, 0.02, 1e-3, 0.99)
    index = {t: i for i, t in enumerate(map(tuple, tuples.tolist()))}

    def counts(drafts):
        c = np.zeros(len(probs) + 1)
        for t in map(tuple, drafts.tolist()):
            c[index.get(t, len(probs))] += 1
        return c

    law_with_outside = np.append(probs, 0.0)
    g, pval = g_test(counts(ob.sample_drafts(q, k, "systematic", size=n, rng=1)), law_with_outside)
    assert pval > 1e-3, (g, pval, n)
    _, pval_iid = g_test(counts(ob.sample_drafts(q, k, "with_replacement", size=n, rng=1)), law_with_outside)
    assert pval_iid < 1e-3


def test_systematic_law_reaches_the_engines_and_the_kit():
    """The new law through the surfaces that take a law by name: the batched engine (LawBatch, the
    naive verifier's exact acceptance ``Σ_y p(y) min(1, K q_y)`` by enumeration), measurement and
    the kit's exact check of the naive verifier on it."""
    from otbound.conformance import check_token_verifier, token_law_adapter
    from otbound.report import measure_laws
    from otbound.token import LawBatch
    from otbound.token.verifiers import NaiveVerifier

    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    batch = LawBatch(np.stack([p, q]), np.stack([q, p]))
    np.testing.assert_array_equal(batch.optimal_acceptance(2, "systematic").numpy(),
                                  ob.optimal_acceptance(np.stack([p, q]), np.stack([q, p]), 2, "systematic"))
    nss = NaiveVerifier("systematic")
    assert abs(nss.acceptance(p, q, 2) - p @ np.minimum(1.0, 2 * q)) < 1e-12
    out = measure_laws(p[None], q[None], (2,), verifiers=[], samplings=("systematic",))
    assert out["optimal"]["systematic"][2] == [ob.optimal_acceptance(p, q, 2, "systematic")]
    res = check_token_verifier(token_law_adapter(nss), vocab_size=3, num_drafts=2, sampling="systematic",
                               instances=3, mode="exact")
    assert res.passed, res
