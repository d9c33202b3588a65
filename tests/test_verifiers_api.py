"""Token-level verifiers: registry, public API, input validation, and an adversarial property test."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import otbound
from otbound import DRAFT_LAWS, VERIFIERS, InvalidInputError, draft_joint, optimal_acceptance, sample_drafts
from otbound.token.verifiers import NaiveVerifier, OptimalVerifier, Verifier, _optimal, run

P = np.array([0.1, 0.2, 0.3, 0.4])
Q = np.array([0.4, 0.3, 0.2, 0.1])


def test_registry():
    assert set(VERIFIERS) == {
        "nss",
        "rrs",
        "rrs_wor",
        "kseq",
        "spechub",
        "greedy",
        "khisti_is",
        "khisti_lp",
        "ot",
        "onehot",
        "nss_deterministic",
        "ot_wor_top",
        "ot_wor_iid",
        "ot_wor",
        "gls",
    }
    assert otbound.VERIFIERS is otbound.token.verifiers.VERIFIERS
    assert all(isinstance(v, otbound.Verifier) and v.name == k for k, v in VERIFIERS.items())
    laws = {k: v.sampling for k, v in VERIFIERS.items()}
    assert laws["rrs_wor"] == laws["ot_wor_top"] == laws["ot_wor_iid"] == laws["ot_wor"] == "without_replacement"
    assert laws["greedy"] == laws["spechub"] == "greedy"
    assert {laws[k] for k in ("nss", "rrs", "kseq", "khisti_is", "khisti_lp", "ot", "gls")} == {"with_replacement"}
    assert VERIFIERS["spechub"].max_drafts == VERIFIERS["khisti_lp"].max_drafts == 2
    assert all(v.max_drafts is None for k, v in VERIFIERS.items() if k not in ("spechub", "khisti_lp"))
    assert all(v.lossless is True and v.reference for v in VERIFIERS.values())  # no token verifier is found lossy


def test_the_module_table_lists_every_verifier_with_its_law():
    """The table in ``otbound.token.verifiers``' docstring is whole: one row per registered verifier,
    naming the verifier's own draft law and lossless flag."""
    doc = otbound.token.verifiers.__doc__
    rows = {}
    for line in doc.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in VERIFIERS:
            rows[parts[0]] = (parts[1], next(w for w in parts[2:] if w in ("yes", "no")))
    assert set(rows) == set(VERIFIERS), sorted(set(VERIFIERS) ^ set(rows))
    for name, (law, lossless) in rows.items():
        assert law == VERIFIERS[name].sampling, (name, law)
        assert lossless == ("yes" if VERIFIERS[name].lossless else "no"), name


def test_one_optimal_verifier_at_every_vocabulary_size():
    """``ot`` is the optimal verifier at V = 4 and at V = 151,936 alike (no second name)."""
    assert isinstance(VERIFIERS["ot"], OptimalVerifier) and "ot_fast" not in VERIFIERS
    r = np.random.default_rng(3)
    for v in (4, 151_936):
        p, q = r.dirichlet(np.ones(v)), r.dirichlet(np.ones(v))
        assert abs(VERIFIERS["ot"].acceptance(p, q, 3) - optimal_acceptance(p, q, 3)) < 1e-12


def test_sample_result_and_reproducibility():
    for v in VERIFIERS.values():
        drafts = sample_drafts(Q, 2, v.sampling, 1000, 0)
        a = v.sample(P, Q, drafts, 5)
        b = v.sample(P, Q, drafts, np.random.default_rng(5))
        assert isinstance(a, otbound.VerifierSample)
        assert a.tokens.dtype == np.int64 and a.tokens.shape == (1000,)
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.accepted, (a.tokens[:, None] == drafts).any(axis=1))
        empty = v.sample(P, Q, drafts[:0], 0)
        assert empty.tokens.shape == (0,) and empty.accepted.shape == (0,)


def test_conditional_law_single_row_and_batch():
    for v in VERIFIERS.values():
        drafts = sample_drafts(Q, 2, v.sampling, 5, 1)
        batch = v.conditional_law(P, Q, drafts)
        assert batch.shape == (5, 4)
        for i in range(5):
            np.testing.assert_allclose(v.conditional_law(P, Q, drafts[i]), batch[i], atol=0)


def test_run_result():
    res = run("kseq", P, Q, 3, 5000, 0)
    assert isinstance(res, otbound.VerifierRun)
    assert res.num_samples == 5000 and res.drafts.shape == (5000, 3)
    assert res.ci_low <= res.acceptance <= res.ci_high and res.confidence == 0.95
    assert res.ci_low <= VERIFIERS["kseq"].acceptance(P, Q, 3) <= res.ci_high  # the exact value, independently
    res2 = run(VERIFIERS["kseq"], P, Q, 3, 5000, 0)
    np.testing.assert_array_equal(res.sample.tokens, res2.sample.tokens)


def test_torch_inputs():
    v = VERIFIERS["rrs"]
    drafts = sample_drafts(Q, 2, "with_replacement", 50, 0)
    a = v.sample(torch.tensor(P), torch.tensor(Q), torch.tensor(drafts), 3)
    b = v.sample(P, Q, drafts, 3)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert v.acceptance(torch.tensor(P), torch.tensor(Q), 2) == v.acceptance(P, Q, 2)


def test_other_draft_laws_for_nss_and_ot():
    for sampling in ("without_replacement", "greedy"):
        for v in (NaiveVerifier(sampling), OptimalVerifier(sampling)):
            assert v.sampling == sampling
            res = run(v, P, Q, 2, 2000, 0)
            assert res.drafts.shape == (2000, 2)
    with pytest.raises(InvalidInputError, match="unknown sampling"):
        NaiveVerifier("top_k")


def test_acceptance_none_or_error_when_too_large():
    r = np.random.default_rng(0)
    p, q = r.dirichlet(np.ones(100)), r.dirichlet(np.ones(100))
    assert VERIFIERS["rrs_wor"].acceptance(p, q, 3) is None  # 100^3 tuples: not enumerated
    assert VERIFIERS["rrs"].acceptance(p, q, 3) is not None  # closed form at any size
    with pytest.raises(InvalidInputError, match="LP plan"):
        OptimalVerifier("without_replacement").acceptance(p, q, 3)  # the plan path: small V only
    assert VERIFIERS["ot"].acceptance(p, q, 3) is not None  # i.i.d. drafts: any V
    p, q = r.dirichlet(np.ones(1000)), r.dirichlet(np.ones(1000))
    with pytest.raises(InvalidInputError, match="selected-token law"):
        VERIFIERS["khisti_is"].acceptance(p, q, 3)


@pytest.mark.parametrize("sampling", ["with_replacement", "greedy"])
def test_ot_prepared_cache(sampling):
    v = OptimalVerifier(sampling)
    p, q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    assert v._prepare(p, q, 2) is v._prepare(p, q, 2)
    for i in range(_optimal.CACHE_SIZE + 3):
        pp = np.array([i + 1.0, 1.0]) / (i + 2.0)
        v._prepare(pp, q, 1)
    assert len(v._cache) == _optimal.CACHE_SIZE


@pytest.mark.parametrize("name", ["ot", "ot_wor", "ot_wor_top", "ot_wor_iid"])
def test_clear_cache_empties_every_cache_inside_and_keeps_the_values(name):
    """``clear_cache`` empties the verifier's prepared set-ups and those of the verifiers it holds
    (``ot_wor`` runs ``ot_wor_top`` and ``ot_wor_iid``, which runs ``ot``); the values are the same."""
    from otbound.token.verifiers._base import PreparedCache

    def caches(v):
        out = []
        for value in vars(v).values():
            out += [value] if isinstance(value, PreparedCache) else caches(value) if isinstance(value, Verifier) else []
        return out

    v = type(VERIFIERS[name])()
    p, q = np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.1, 0.2, 0.3, 0.4])
    drafts = np.array([[3, 2], [0, 1]])
    before = v.conditional_law(p, q, drafts)
    assert caches(v) and any(len(c) for c in caches(v))
    v.clear_cache()
    assert all(len(c) == 0 for c in caches(v))
    assert np.array_equal(v.conditional_law(p, q, drafts), before)


@pytest.mark.parametrize(
    "p, q, match",
    [
        ([0.5, 0.6, -0.1, 0.0], Q, "negative"),
        ([0.5, 0.6, 0.1, 0.0], Q, "sum to 1"),
        (P, [0.5, 0.5], "same shape"),
        (np.tile(P, (2, 1)), np.tile(Q, (2, 1)), "1-D"),
        ([np.nan, 0.5, 0.5, 0.0], Q, "NaN"),
    ],
)
def test_bad_laws(p, q, match):
    for v in VERIFIERS.values():
        with pytest.raises(InvalidInputError, match=match):
            v.sample(p, q, np.zeros((1, 1), dtype=np.int64), 0)
        if match == "1-D":  # acceptance takes batches (..., V): one value per row
            assert v.acceptance(p, q, 1).shape == (2,)
            continue
        with pytest.raises(InvalidInputError, match=match):
            v.acceptance(p, q, 1)


@pytest.mark.parametrize(
    "name, drafts, match",
    [
        ("rrs", np.array([[0.0, 1.0]]), "integer"),
        ("rrs", np.array([0, 1]), r"shape \(n, K\)"),
        ("rrs", np.array([[0, 4]]), "not a token id"),
        ("rrs", np.array([[-1, 0]]), "not a token id"),
        ("rrs", np.zeros((3, 0), dtype=np.int64), "at least 1"),
        ("rrs_wor", np.array([[2, 2]]), "repeats a token"),
        ("greedy", np.array([[1, 2]]), "greedy-law tuple"),
        ("greedy", np.array([[0, 0]]), "greedy-law tuple"),
        ("spechub", np.array([[0, 1, 2]]), "at most 2 drafts"),
        ("rrs_wor", np.array([[0, 1, 2, 3, 0]]), "exceeds the support"),
    ],
)
def test_bad_drafts(name, drafts, match):
    with pytest.raises(InvalidInputError, match=match):
        VERIFIERS[name].sample(P, Q, drafts, 0)


def test_drafts_outside_the_draft_law():
    q0 = np.array([0.5, 0.5, 0.0, 0.0])
    for name in ("rrs", "kseq", "khisti_is", "ot", "nss"):
        with pytest.raises(InvalidInputError, match="q = 0"):
            VERIFIERS[name].conditional_law(P, q0, [0, 2])


def test_bad_num_drafts_and_run_arguments():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InvalidInputError, match="num_drafts"):
            VERIFIERS["rrs"].acceptance(P, Q, bad)
    with pytest.raises(InvalidInputError, match="at most 2 drafts"):
        VERIFIERS["spechub"].acceptance(P, Q, 3)
    with pytest.raises(InvalidInputError, match="exceeds the support"):
        VERIFIERS["greedy"].acceptance(P, np.array([1.0, 0, 0, 0]), 2)
    with pytest.raises(InvalidInputError, match="unknown verifier"):
        run("specinfer", P, Q, 2, 10)
    with pytest.raises(InvalidInputError, match="positive integer"):
        run("rrs", P, Q, 2, 0)
    with pytest.raises(InvalidInputError, match="confidence"):
        run("rrs", P, Q, 2, 10, confidence=1.5)
    with pytest.raises(InvalidInputError, match="Verifier"):
        run(object(), P, Q, 2, 10)


@st.composite
def _pair(draw):
    v = draw(st.integers(2, 5))
    raw = st.lists(st.sampled_from([0.0, 0.0, 1e-9, 0.01, 0.3, 1.0, 5.0]), min_size=v, max_size=v)
    p = np.array(draw(raw.filter(lambda x: sum(x) > 0)))
    q = np.array(draw(raw.filter(lambda x: sum(x) > 0)))
    return p / p.sum(), q / q.sum(), draw(st.integers(1, 3))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(_pair())
def test_property_exact_losslessness_and_bound(case):
    """Adversarial small laws (zeros, 1e-9 masses): every verifier is exactly lossless and stays ≤ α*."""
    p, q, k = case
    for v in VERIFIERS.values():
        if (v.max_drafts and k > v.max_drafts) or (v.sampling != "with_replacement" and k > np.count_nonzero(q)):
            continue
        joint = draft_joint(q, k, v.sampling)
        idx = np.argwhere(joint > 0)
        laws = v.conditional_law(p, q, idx)
        np.testing.assert_allclose(joint[tuple(idx.T)] @ laws, p, atol=1e-12)
        assert v.acceptance(p, q, k) <= optimal_acceptance(p, q, k, v.sampling) + 1e-9


def test_lossless_error_agrees_with_every_declared_flag():
    """``lossless_error`` (exact, by enumeration) is 0 to 1e-12 for every registered verifier, which all
    declare ``lossless``; and it sees a lossy one (emit the first draft: law q, not p)."""
    for name, v in VERIFIERS.items():
        for k in (1, 2):
            assert v.lossless_error(P, Q, k) < 1e-12, (name, k)

    class FirstDraft(NaiveVerifier):
        name, reference, lossless = "first_draft", "emits the first draft (lossy on purpose)", False

        def _laws(self, p, q, aux, drafts):
            return np.eye(p.size)[drafts[:, 0]]

    assert FirstDraft().lossless_error(P, Q, 2) == pytest.approx(0.3, abs=1e-15)  # max |q − p| = 0.3
    with pytest.raises(InvalidInputError, match="lossless error enumerates"):
        VERIFIERS["rrs"].lossless_error(np.full(1000, 1e-3), np.full(1000, 1e-3), 3)


def test_kernel_entry_points_run_on_one_cpu_thread_and_restore_the_callers(monkeypatch):
    """optimal_acceptance, a verifier's acceptance, LawBatch and measure_laws sort on one intra-op
    thread (torch's default threads made them 3–10× slower) and leave the caller's setting as it was."""
    from otbound.report import measure_laws
    from otbound.token import LawBatch, _kernel

    seen = []
    original = _kernel.SortedRows.__init__

    def spy(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        original(self, *args, **kwargs)

    def spy_values(values):  # a single α* reads no sorted rows
        def spied(*args, **kwargs):
            seen.append(torch.get_num_threads())
            return values(*args, **kwargs)
        return spied

    def _sorted(batch):  # a batch whose rows are already sorted: rrs reads them (its thresholds)
        batch.sorted  # noqa: B018 (the cached property sorts on the pinned thread)
        return batch

    monkeypatch.setattr(_kernel.SortedRows, "__init__", spy)
    for law in DRAFT_LAWS.values():  # each law's α* kernel
        monkeypatch.setattr(law, "optimal_acceptance", spy_values(law.optimal_acceptance))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        r = np.random.default_rng(1)
        p, q = r.dirichlet(np.ones(50), size=3), r.dirichlet(np.ones(50), size=3)
        calls = [
            lambda: optimal_acceptance(p, q, 2),
            lambda: VERIFIERS["rrs"].batch_acceptance(_sorted(LawBatch(p, q)), 2),
            lambda: LawBatch(p, q).optimal_acceptance(3),
            lambda: VERIFIERS["kseq"].batch_acceptance(LawBatch(p, q), 2),
            lambda: measure_laws(p, q, (2,), verifiers=["nss"]),
        ]
        for call in calls:
            start = len(seen)
            call()
            assert torch.get_num_threads() == 2
            assert len(seen) > start  # it sorted or computed α* in the kernel
        assert set(seen) == {1}
        # a single rrs acceptance of rows not sorted is numpy only (no sort, no torch threads):
        # it leaves the caller's setting as it was and agrees with the sorted kernel
        single = VERIFIERS["rrs"].acceptance(p, q, 2)
        assert torch.get_num_threads() == 2
        np.testing.assert_allclose(single, VERIFIERS["rrs"].batch_acceptance(_sorted(LawBatch(p, q)), 2).numpy(),
                                   rtol=0, atol=1e-14)
    finally:
        torch.set_num_threads(before)
