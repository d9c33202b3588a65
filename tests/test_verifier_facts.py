"""A verifier's facts are attributes of its object, read through the registry (one lookup)."""

import numpy as np
import pytest

import otbound as ob
from otbound.plan import DEFAULT_VERIFIERS


def test_the_planner_defaults_and_caps_are_the_verifiers_own_facts():
    """The planner's default verifiers and its synthetic K caps come from the objects (the sets the
    planner used before the facts moved onto the verifiers), and every planned verifier is lossless."""
    assert set(DEFAULT_VERIFIERS) == {"rrs", "rrs_wor", "kseq", "spechub", "greedy", "ot", "khisti_is", "onehot"}
    assert list(DEFAULT_VERIFIERS) == [n for n in ob.VERIFIERS if n in DEFAULT_VERIFIERS]  # registry order
    assert all(ob.VERIFIERS[n].lossless for n in DEFAULT_VERIFIERS)
    caps = {n: v.synthetic_max_drafts for n, v in ob.VERIFIERS.items() if v.synthetic_max_drafts is not None}
    assert caps == {"rrs_wor": 2, "ot_wor_top": 2, "ot_wor_iid": 2, "ot_wor": 2}
    for v in ob.VERIFIERS.values():
        assert v.law is ob.DRAFT_LAWS[v.sampling]


@pytest.mark.parametrize("name", [n for n, v in ob.VERIFIERS.items() if v.attains_optimum])
def test_a_verifier_that_attains_the_optimum_does(name):
    """``attains_optimum`` is a claim: each such verifier's exact acceptance, enumerated from its
    conditional laws over the tuple law (not its batched shortcut), equals α* of its law by the
    primal LP on the dense joint (HiGHS), to 1e-9, on random rows at K = 1, 2."""
    v = ob.VERIFIERS[name]
    rng = np.random.default_rng(4)
    for k in (1, 2):
        for _ in range(3):
            p, q = rng.dirichlet(np.full(5, 0.6)), rng.dirichlet(np.full(5, 0.6))
            aux = v._prepare(p, q, k)
            enumerated = v._enumerated_acceptance(p, q, aux, k)
            lp = ob.optimal_acceptance_lp(p, ob.draft_joint(q, k, v.sampling))
            assert abs(enumerated - lp) < 1e-9, (name, k)
            assert abs(v.acceptance(p, q, k) - lp) < 1e-9


def test_where_a_verifier_is_monte_carlo_is_stated_on_it():
    """``monte_carlo`` is checked against what :meth:`batch_estimate` does at K = 1..3: a verifier
    stating None answers exactly (or refuses) at V = 6 and V = 500 (beyond the enumeration limit at
    K = 2, 3); every stated one is exact at V = 6 and estimates at V = 500 for some K."""
    from otbound.token import LawBatch

    rng = np.random.default_rng(5)
    methods = {}
    for v_size in (6, 500):
        batch = LawBatch(rng.dirichlet(np.ones(v_size), 1), rng.dirichlet(np.ones(v_size), 1))
        for name, v in ob.VERIFIERS.items():
            if v_size > 6 and name == "ot_wor_top":  # its exact LP set-up: seconds per K at this size
                continue
            res = v.batch_estimate(batch, (1, 2, 3), mc_samples=4, rng=0)
            methods[name, v_size] = {r[1] for r in res.values() if isinstance(r, tuple)}
    for name, v in ob.VERIFIERS.items():
        assert methods[name, 6] <= {"exact"}, name
        if (name, 500) in methods:
            assert ("monte_carlo" in methods[name, 500]) == (v.monte_carlo is not None), name
