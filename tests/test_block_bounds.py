"""Block bounds: the Sun et al. test vector, the hierarchy, independent cross-checks, brackets.

Every LP value is checked against an independent formulation: the trie LP (default) against the
plain LP of docs/theory/block-bounds.md over ordered tuples and over multisets (causal), and against network
simplex between multisets and target blocks (joint). Tolerance 1e-8 (HiGHS at 1e-10).
"""

import math

import numpy as np
import pytest
from conftest import random_block_pair, sun_toy

from otbound import InvalidInputError
from otbound.block.bounds import KINDS, block_bound, block_bound_bracket
from otbound.block.models import context_free_model, dirichlet_model, mixture_model, tabulated_model, zipf_model

TOL = 1e-8


def bound(tg, dr, v, k, length, kind, **kw):
    return block_bound(tg, dr, vocab_size=v, num_drafts=k, block_len=length, kind=kind, **kw).value


def random_pair(v, seed, concentration=0.7):
    return random_block_pair(v, seed, draft_seed=seed + 1000, concentration=concentration)


def adversarial_pairs():
    """Disjoint supports, near-deterministic laws, zeros in the draft, draft close to target."""
    disjoint = (context_free_model([0.5, 0.5, 0.0, 0.0]), context_free_model([0.0, 0.0, 0.3, 0.7]))
    sharp = random_pair(3, 5, concentration=0.05)
    t = dirichlet_model(3, seed=9)
    zeros = (t, tabulated_model({(): [0.0, 0.4, 0.6], (1,): [1.0, 0.0, 0.0]}, 3, default=[0.2, 0.0, 0.8]))
    close = (t, mixture_model(t, dirichlet_model(3, seed=10), 0.1))
    return {"disjoint": disjoint, "sharp": sharp, "zeros": zeros, "close": close}


@pytest.mark.parametrize("method", ["lp", "emd"])
def test_sun_toy_joint(method):
    tg, dr = sun_toy()
    assert bound(tg, dr, 2, 1, 2, "joint", method=method) == pytest.approx(12 / 9, abs=TOL)


@pytest.mark.parametrize("method", ["lp", "plain", "plain_exchangeable"])
def test_sun_toy_causal(method):
    tg, dr = sun_toy()
    assert bound(tg, dr, 2, 1, 2, "causal", method=method) == pytest.approx(11 / 9, abs=TOL)


def test_sun_toy_per_level_and_levels():
    tg, dr = sun_toy()
    res = block_bound(tg, dr, vocab_size=2, num_drafts=1, block_len=2, kind="per_level")
    assert res.value == pytest.approx(12 / 9, abs=1e-14)
    np.testing.assert_allclose(res.levels, [2 / 3, 2 / 3], atol=1e-14)
    causal = block_bound(tg, dr, vocab_size=2, num_drafts=1, block_len=2, kind="causal")
    # P(τ ≥ 1) = 2/3 as for token verification, P(τ ≥ 2) = 5/9 (block verification's gain)
    np.testing.assert_allclose(causal.levels, [2 / 3, 5 / 9], atol=TOL)


CASES = [(2, 1, 1), (2, 2, 2), (2, 3, 2), (2, 3, 3), (3, 1, 3), (3, 2, 1), (3, 2, 2), (3, 2, 3), (4, 2, 2)]


@pytest.mark.parametrize("v,length,k", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_independent_formulations_agree(v, length, k, seed):
    tg, dr = random_pair(v, 100 * v + 10 * length + k + seed)
    joint = bound(tg, dr, v, k, length, "joint")
    assert joint == pytest.approx(bound(tg, dr, v, k, length, "joint", method="emd"), abs=TOL)
    causal = bound(tg, dr, v, k, length, "causal")
    assert causal == pytest.approx(bound(tg, dr, v, k, length, "causal", method="plain_exchangeable"), abs=TOL)
    if (v**length) ** k <= 5000:
        assert causal == pytest.approx(bound(tg, dr, v, k, length, "causal", method="plain"), abs=TOL)


@pytest.mark.parametrize("name", list(adversarial_pairs()))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_hierarchy_and_cross_checks_adversarial(name, k):
    tg, dr = adversarial_pairs()[name]
    v, length = tg.vocab_size, 2
    per_level, joint, causal = (bound(tg, dr, v, k, length, kind) for kind in KINDS)
    assert -TOL <= causal <= joint + TOL <= per_level + 2 * TOL <= length + 3 * TOL
    assert joint == pytest.approx(bound(tg, dr, v, k, length, "joint", method="emd"), abs=TOL)
    assert causal == pytest.approx(bound(tg, dr, v, k, length, "causal", method="plain_exchangeable"), abs=TOL)
    if name == "disjoint":
        assert per_level == pytest.approx(0.0, abs=TOL)


@pytest.mark.parametrize("seed", range(6))
def test_hierarchy_monotone_in_k_and_k1_identities(seed):
    v, length = (3, 3) if seed % 2 else (4, 2)
    tg, dr = random_pair(v, 500 + seed, concentration=0.5 + 0.3 * seed)
    prev = None
    for k in (1, 2, 3):
        vals = [bound(tg, dr, v, k, length, kind) for kind in KINDS]
        per_level, joint, causal = vals
        assert causal <= joint + TOL and joint <= per_level + TOL
        if k == 1:  # one draft: the joint OT is the per-level relaxation (docs/theory/block-bounds.md)
            assert joint == pytest.approx(per_level, abs=TOL)
        if prev is not None:  # more drafts never hurt
            assert all(a <= b + TOL for a, b in zip(prev, vals))
        prev = vals


def test_strict_gaps_for_two_drafts():
    tg, dr = random_pair(3, 1)
    per_level, joint, causal = (bound(tg, dr, 3, 2, 2, kind) for kind in KINDS)
    assert causal < joint - 1e-3 and joint < per_level - 1e-3


def test_identical_models_accept_everything():
    t = dirichlet_model(3, seed=4)
    for kind in KINDS:
        assert bound(t, t, 3, 2, 3, kind) == pytest.approx(3.0, abs=TOL)


def test_certificates():
    tg, dr = random_pair(3, 21)
    k, length = 2, 2
    per = block_bound(tg, dr, vocab_size=3, num_drafts=k, block_len=length, kind="per_level", return_certificate=True)
    from otbound.block.models import prefix_law

    for ell, (h, val) in enumerate(zip(per.certificate.binding_sets, per.levels), start=1):
        p, q = prefix_law(tg, ell), prefix_law(dr, ell)
        assert 1 + p[h].sum() - q[h].sum() ** k == pytest.approx(val, abs=1e-12)
    for kind in ("joint", "causal"):
        res = block_bound(tg, dr, vocab_size=3, num_drafts=k, block_len=length, kind=kind, return_certificate=True)
        assert res.levels.sum() == pytest.approx(res.value, abs=1e-12)
        through = res.certificate.through
        assert through[()] == 1.0
        assert sum(val for pre, val in through.items() if len(pre) == 1) == pytest.approx(res.levels[0], abs=1e-12)
        # the selected block's law must be a choice among K i.i.d. drafts: r(A) ≤ 1 − (1 − q(A))^K
        r = res.certificate.selected_law.ravel()
        q = prefix_law(dr, length).ravel()
        order = np.argsort(-r / q)
        assert np.all(np.cumsum(r[order]) <= 1 - (1 - np.cumsum(q[order])) ** k + 1e-9)
        assert r.sum() == pytest.approx(1.0, abs=1e-9)
        # feasibility of the accepted-through law, checked from the models themselves: a prefix w is
        # accepted only if the selected block starts with w, and no more often than the target emits
        # w (joint: p(w); causal: p(w_last | parent) times the parent's accepted mass)
        selected = res.certificate.selected_law
        for pre, val in through.items():
            if not pre:
                continue
            assert val <= selected[pre].sum() + 1e-9, (kind, pre)
            parent = through[pre[:-1]] if kind == "causal" else prefix_law(tg, len(pre) - 1)[pre[:-1]]
            assert val <= parent * tg(pre[:-1])[pre[-1]] + 1e-9, (kind, pre)
    emd = block_bound(
        tg, dr, vocab_size=3, num_drafts=k, block_len=length, kind="joint", method="emd", return_certificate=True
    )
    assert emd.certificate.plan.sum() == pytest.approx(1.0)
    # the plan couples the K-multisets of draft blocks with the target's blocks, and its expected
    # longest common prefix is the value
    plan, multisets = emd.certificate.plan, emd.certificate.multisets
    blocks = [np.unravel_index(b, (3,) * length) for b in range(3**length)]
    np.testing.assert_allclose(plan.sum(0), prefix_law(tg, length).ravel(), atol=1e-12)
    q_block = prefix_law(dr, length).ravel()
    multiset_prob = [
        math.factorial(k)
        / np.prod([math.factorial(c) for c in np.unique(m, return_counts=True)[1]])
        * np.prod(q_block[m])
        for m in multisets
    ]
    np.testing.assert_allclose(plan.sum(1), multiset_prob, atol=1e-12)

    def lcp(a, b):
        n = 0
        while n < length and a[n] == b[n]:
            n += 1
        return n

    reward = np.array([[max(lcp(blocks[x], blocks[y]) for x in m) for y in range(3**length)] for m in multisets])
    assert (plan * reward).sum() == pytest.approx(emd.value, abs=1e-12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(3))
def test_bracket_contains_exact_value(kind, seed):
    v, length, k = 5, 3 if seed < 2 else 2, 2
    tg, dr = random_pair(v, 40 + seed, concentration=0.5)
    exact = bound(tg, dr, v, k, length, kind)
    widths = []
    for m in range(1, v + 1):
        b = block_bound_bracket(tg, dr, vocab_size=v, num_drafts=k, block_len=length, kind=kind, top_m=m)
        assert b.lower - 1e-9 <= exact <= b.upper + 1e-9, (m, b, exact)
        assert 0.0 <= b.truncated_target_mass <= 1.0 and 0.0 <= b.truncated_draft_mass <= 1.0
        assert b.nodes_evaluated == sum(m**d for d in range(length))
        widths.append(b.upper - b.lower)
    assert widths[-1] == pytest.approx(0.0, abs=1e-9)  # m = V keeps everything: exact
    assert widths[0] > widths[-1]


def test_bracket_large_vocabulary_only_touches_kept_prefixes():
    v = 12
    tg, dr = zipf_model(v, exponent=1.2, seed=1), zipf_model(v, exponent=1.2, seed=2)
    tg = mixture_model(tg, dr, 0.5)
    exact = bound(tg, dr, v, 2, 2, "causal")
    b = block_bound_bracket(tg, dr, vocab_size=v, num_drafts=2, block_len=2, kind="causal", top_m=4)
    assert b.lower - 1e-9 <= exact <= b.upper + 1e-9
    assert b.nodes_evaluated == 1 + 4


def test_bad_arguments_are_named():
    tg, dr = sun_toy()
    with pytest.raises(InvalidInputError, match="kind"):
        bound(tg, dr, 2, 1, 2, "causual")
    with pytest.raises(InvalidInputError, match="method 'emd' is not available"):
        bound(tg, dr, 2, 1, 2, "causal", method="emd")
    with pytest.raises(InvalidInputError, match="num_drafts"):
        bound(tg, dr, 2, 0, 2, "joint")
    with pytest.raises(InvalidInputError, match="block_len"):
        bound(tg, dr, 2, 1, 0, "joint")
    with pytest.raises(InvalidInputError, match="vocab_size 2, expected 3"):
        bound(tg, dr, 3, 1, 2, "joint")
    with pytest.raises(InvalidInputError, match="top_m"):
        block_bound_bracket(tg, dr, vocab_size=2, num_drafts=1, block_len=2, kind="joint", top_m=0)
    # plain callables are accepted and checked
    assert bound(lambda pre: [0.5, 0.5], lambda pre: [0.5, 0.5], 2, 1, 2, "causal") == pytest.approx(2.0)
    with pytest.raises(InvalidInputError, match="does not sum to 1"):
        bound(lambda pre: [0.5, 0.6], lambda pre: [0.5, 0.5], 2, 1, 2, "causal")
