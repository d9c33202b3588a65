"""Deterministic drafting (the K most probable draft tokens): its optimum α* = p(top-K(q)) against the
primal LP and brute force, its two lossless verifiers on truncated laws at several temperatures
(exact law and a G-test with its power asserted), and the batched engine's value."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import gof_pvalue

from otbound import (
    DRAFT_LAWS,
    SAMPLINGS,
    VERIFIERS,
    InvalidInputError,
    SamplingParams,
    draft_joint,
    optimal_acceptance,
    optimal_acceptance_brute_force,
    optimal_acceptance_lp,
    sample_drafts,
    subset_mass,
)
from otbound.token.verifiers import run

DET = ("onehot", "nss_deterministic")
ALPHA = 1e-3


def _top_k_by_hand(q, k):
    """Independent reference: a stable sort of −q (ties to the lower index)."""
    return np.argsort(-q, kind="stable")[:k]


def test_registered_like_the_other_laws():
    assert "deterministic" in SAMPLINGS and DRAFT_LAWS["deterministic"].name == "deterministic"
    assert {VERIFIERS[n].sampling for n in DET} == {"deterministic"}


@pytest.mark.parametrize("seed", range(20))
def test_bound_is_target_mass_of_top_k_against_lp_and_brute_force(seed):
    rng = np.random.default_rng(seed)
    v = int(rng.integers(3, 9))
    k = int(rng.integers(1, min(v, 4) + 1))
    p = rng.dirichlet(np.full(v, 0.5))
    q = rng.dirichlet(np.full(v, 0.5))
    if seed % 3 == 0:  # ties in q at the K-th value
        q = np.round(q * 4) + 1.0
        q /= q.sum()
    expected = p[_top_k_by_hand(q, k)].sum()
    got = optimal_acceptance(p, q, k, "deterministic", return_certificate=True)
    assert got.value == pytest.approx(expected, abs=1e-15)
    joint = draft_joint(q, k, "deterministic")
    assert optimal_acceptance_lp(p, joint) == pytest.approx(expected, abs=1e-9)
    assert optimal_acceptance_brute_force(p, joint).value == pytest.approx(expected, abs=1e-12)
    # the certificate: α* = 1 + p(H*) − Q(H*)
    h = got.binding_set
    if expected < 1:
        assert 1 + p[h].sum() - subset_mass(q, h, k, "deterministic") == pytest.approx(expected, abs=1e-15)


def test_ties_go_to_the_lower_index_and_batches_and_torch_agree():
    q = np.array([0.2, 0.3, 0.2, 0.3])
    p = np.array([0.1, 0.2, 0.3, 0.4])
    assert sample_drafts(q, 3, "deterministic", size=2).tolist() == [[1, 3, 0], [1, 3, 0]]
    assert optimal_acceptance(p, q, 3, "deterministic") == pytest.approx(0.7, abs=1e-15)
    rng = np.random.default_rng(5)
    P, Q = rng.dirichlet(np.ones(50), size=(3, 4)), rng.dirichlet(np.ones(50), size=(3, 4))
    batch = optimal_acceptance(P, Q, 5, "deterministic")
    rows = [[optimal_acceptance(P[i, j], Q[i, j], 5, "deterministic") for j in range(4)] for i in range(3)]
    np.testing.assert_allclose(batch, rows, atol=1e-15)
    t = optimal_acceptance(torch.tensor(P), torch.tensor(Q), 5, "deterministic")
    assert isinstance(t, torch.Tensor)
    np.testing.assert_allclose(t.numpy(), batch, atol=1e-15)


def test_fewer_surviving_tokens_than_drafts_is_an_error():
    q = SamplingParams(top_k=2).laws(np.array([3.0, 2.0, 1.0, 0.0]))
    p = np.full(4, 0.25)
    with pytest.raises(InvalidInputError, match="exceeds the support of q"):
        optimal_acceptance(p, q, 3, "deterministic")
    with pytest.raises(InvalidInputError, match="exceeds the support of q"):
        VERIFIERS["onehot"].acceptance(p, q, 3)


def test_non_deterministic_tuple_is_refused():
    q = np.array([0.1, 0.6, 0.3])
    with pytest.raises(InvalidInputError, match="not the deterministic tuple"):
        VERIFIERS["onehot"].sample(np.full(3, 1 / 3), q, [[2, 1]])


def _truncated_pair(t, seed, v=40):
    """Target and draft laws through deployed settings: each its own top-k / top-p / min-p."""
    rng = np.random.default_rng(seed)
    lp = rng.normal(0, 2, v)
    lq = lp + rng.normal(0, 1, v)
    p = SamplingParams(t, top_k=20, top_p=0.9).laws(lp)
    q = SamplingParams(t * 0.9, top_k=12, min_p=0.01).laws(lq)
    return p, q


@pytest.mark.parametrize("t", [0.5, 0.8, 1.3])
@pytest.mark.parametrize("name", DET)
def test_lossless_and_optimal_on_truncated_laws(name, t):
    p, q = _truncated_pair(t, int(t * 10))
    ver = VERIFIERS[name]
    for k in (1, 2, 4):
        (tup,) = sample_drafts(q, k, "deterministic")
        # exact: the only tuple has probability 1, its conditional law is the target's law itself
        np.testing.assert_allclose(ver.conditional_law(p, q, tup), p, atol=1e-12, rtol=0)
        bound = optimal_acceptance(p, q, k, "deterministic")
        assert ver.acceptance(p, q, k) == pytest.approx(bound, abs=1e-12)
        assert bound == pytest.approx(p[_top_k_by_hand(q, k)].sum(), abs=1e-15)
    # statistical: 200 000 verified draws, G-test against p (power ≥ 0.995 against 1% TV asserted)
    res = run(name, p, q, 3, 200_000, rng=int(100 * t), confidence=1 - ALPHA)
    assert gof_pvalue(res.sample.tokens, p, alpha=ALPHA) > ALPHA  # power ≥ 0.995 against 1% TV asserted
    assert res.ci_low <= ver.acceptance(p, q, 3) <= res.ci_high


def test_batched_kernel_matches_the_top_k_by_hand():
    """The batched α*_det on (B, V) numpy and torch rows, ties at the top included, against p of
    the top-K tokens chosen by hand per row."""
    rng = np.random.default_rng(2)
    P, Q = rng.dirichlet(np.full(300, 0.3), size=6), rng.dirichlet(np.full(300, 0.3), size=6)
    Q[0, :10] = Q[0, 10]  # ties at the top
    Q /= Q.sum(1, keepdims=True)
    for k in (1, 2, 4):
        want = np.array([p[_top_k_by_hand(q, k)].sum() for p, q in zip(P, Q)])
        np.testing.assert_allclose(optimal_acceptance(P, Q, k, "deterministic"), want, atol=1e-15, rtol=0)
        got = optimal_acceptance(torch.tensor(P), torch.tensor(Q), k, "deterministic")
        np.testing.assert_allclose(got.numpy(), want, atol=1e-15, rtol=0)
        for name in ("onehot", "nss_deterministic"):
            np.testing.assert_allclose(VERIFIERS[name].acceptance(P, Q, k), want, atol=1e-15, rtol=0)


@pytest.mark.parametrize("name", DET)
def test_conformance_kit_checks_the_deterministic_law(name):
    import otbound.conformance as oc

    res = oc.check_token_verifier(oc.token_law_adapter(VERIFIERS[name]), vocab_size=4, num_drafts=2,
                                  sampling="deterministic")
    assert res.passed and res.lossless_error < 1e-12
    np.testing.assert_allclose(res.acceptance, res.optimal, atol=1e-12)  # optimal: α = p(top-K(q))


def test_measurement_drafts_the_whole_support_where_it_is_smaller_than_k():
    """measure_laws's cap rule: a row whose truncated draft keeps n < K tokens is measured, for the
    laws of distinct tokens, at K' = n, row by row equal to the direct call at K'; with replacement
    (and rows with n ≥ K) exactly as without the rule."""
    from otbound.report import measure_laws

    rng = np.random.default_rng(3)
    logits_p, logits_q = rng.normal(0, 2, (6, 30)), rng.normal(0, 2, (6, 30))
    P = SamplingParams(top_p=0.9).laws(logits_p)
    keep = [1, 2, 30, 3, 30, 2]  # tokens each row's draft keeps (top-k): rows 0, 1, 3, 5 below K = 4
    Q = np.stack([SamplingParams(top_k=n).laws(z) for n, z in zip(keep, logits_q)])
    names = ["rrs", "rrs_wor", "greedy", "onehot", "nss_deterministic", "ot"]
    res = measure_laws(P, Q, (2, 4), verifiers=names, batch_size=4)
    assert res["capped"] == {2: 1, 4: 4}
    for law in ("without_replacement", "greedy", "deterministic", "with_replacement"):
        for k in (2, 4):
            want = [optimal_acceptance(P[i], Q[i], k if law == "with_replacement" else min(k, keep[i]), law)
                    for i in range(6)]
            np.testing.assert_allclose(res["optimal"][law][k], want, rtol=0, atol=1e-12)
    for name in names:
        v = VERIFIERS[name]
        for k in (2, 4):
            got = res["verifiers"][name][k]
            want = [v.acceptance(P[i], Q[i], k if v.sampling == "with_replacement" else min(k, keep[i]))
                    for i in range(6)]
            if got["method"] == "exact":
                np.testing.assert_allclose(got["acceptance"], want, rtol=0, atol=1e-12)
    full = measure_laws(P[[2, 4]], Q[[2, 4]], (2, 4), verifiers=names)
    assert full["capped"] == {}
    for law, by_k in full["optimal"].items():
        for k, vals in by_k.items():
            np.testing.assert_allclose(vals, np.asarray(res["optimal"][law][k])[[2, 4]], rtol=0, atol=1e-12)
