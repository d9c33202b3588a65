"""Property suite over the public token-level API.

Random shapes, dtypes (float32/float64, numpy and torch), tiny and denormal entries (1e-300,
5e-324, 1e-310) and near-deterministic laws. Every call either returns a value satisfying the
invariants below or raises :class:`otbound.InvalidInputError`; anything else (an OverflowError, a
NaN, a value off brute force) fails.

Invariants (docs/theory/token-bounds.md and token-verifiers.md), tolerances stated per check:
* K = 1 gives 1 − TV(p, q) for every draft law (1e-12);
* α* ≤ 1, α* non-decreasing in K for a fixed law (1e-12);
* without replacement ≥ with replacement (1e-12);
* α* equals brute force over all 2^V subsets of the enumerated joint law (1e-12; V ≤ 6, K ≤ 4);
* every verifier's exact acceptance ≤ its law's α* (1e-9).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otbound as ob

LAWS = ("with_replacement", "without_replacement", "greedy")
TINY = (1e-300, 5e-324, 1e-310, 1e-200, 1e-100, 1e-30, 1e-16)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def law(draw, v: int):
    """A law over v tokens: Dirichlet, near-deterministic or one-hot, with tiny/denormal/zero entries."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["dirichlet", "sparse", "near_deterministic"]))
    x = rng.dirichlet(np.full(v, 1.0 if kind == "dirichlet" else 0.2))
    if kind == "near_deterministic":
        x = np.full(v, 0.0)
        x[rng.integers(v)] = 1.0
    n_tiny = draw(st.integers(0, v - 1))
    idx = rng.choice(v, n_tiny, replace=False)
    x[idx] = [draw(st.sampled_from(TINY + (0.0,))) for _ in idx]
    if x.sum() == 0:
        x[rng.integers(v)] = 1.0
    big = int(np.argmax(x))
    x[big] += 1.0 - x.sum()  # exact sum 1 with tiny entries left untouched
    return x


@st.composite
def pair(draw, v_max: int = 6):
    v = draw(st.integers(1, v_max))
    return draw(law(v)), draw(law(v))


def bound_or_refusal(p, q, k, sampling):
    """α* or None when the input is refused with InvalidInputError (the only allowed failure)."""
    try:
        value = ob.optimal_acceptance(p, q, k, sampling)
    except ob.InvalidInputError:
        return None
    assert np.isfinite(value), (p, q, k, sampling)
    return float(value)


@SETTINGS
@given(pair(), st.integers(1, 4), st.sampled_from(LAWS))
def test_bound_matches_brute_force_on_tiny_and_denormal_laws(pq, k, sampling):
    p, q = pq
    value = bound_or_refusal(p, q, k, sampling)
    if value is None:
        with pytest.raises(ob.InvalidInputError):  # refused consistently, never a wrong number
            ob.optimal_acceptance(p, q, k, sampling)
        return
    brute = ob.optimal_acceptance_brute_force(p, ob.draft_joint(q, k, sampling)).value
    assert value == pytest.approx(brute, abs=1e-12)


@SETTINGS
@given(pair(), st.sampled_from(LAWS))
def test_one_draft_is_one_minus_total_variation(pq, sampling):
    p, q = pq
    value = bound_or_refusal(p, q, 1, sampling)
    assert value == pytest.approx(1.0 - 0.5 * np.abs(p - q).sum(), abs=1e-12)


@SETTINGS
@given(pair(v_max=8))
def test_monotone_in_k_bounded_by_one_and_without_above_with(pq):
    p, q = pq
    support = int(np.count_nonzero(q > 0))
    previous = {law: 0.0 for law in LAWS}
    for k in range(1, min(support, 5) + 1):
        values = {law: bound_or_refusal(p, q, k, law) for law in LAWS}
        for law, value in values.items():
            if value is not None:
                assert value <= 1.0 + 1e-12
                assert value >= previous[law] - 1e-12, (law, k)
                previous[law] = value
        if values["without_replacement"] is not None:
            assert values["without_replacement"] >= values["with_replacement"] - 1e-12


@settings(max_examples=25, deadline=None)
@given(pair(v_max=5), st.integers(1, 3), st.sampled_from(["float32", "float64", "torch"]))
def test_dtypes_and_batches_agree_with_rows(pq, k, kind):
    """A (2, V) batch in float32/float64/torch gives the row-by-row float64 values of its cast laws."""
    p, q = pq
    rows_p, rows_q = np.stack([p, q]), np.stack([q, p])
    if kind == "float32":
        rows_p, rows_q = rows_p.astype(np.float32), rows_q.astype(np.float32)
    cast = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    for sampling in LAWS:
        try:
            batch = ob.optimal_acceptance(
                torch.tensor(rows_p) if kind == "torch" else rows_p,
                torch.tensor(rows_q) if kind == "torch" else rows_q,
                k,
                sampling,
            )
        except ob.InvalidInputError:
            continue
        batch = np.asarray(batch.numpy() if kind == "torch" else batch)
        for i in range(2):
            assert batch[i] == pytest.approx(
                ob.optimal_acceptance(cast(rows_p[i]), cast(rows_q[i]), k, sampling), abs=1e-12
            )


@settings(max_examples=30, deadline=None)
@given(pair(v_max=5), st.integers(1, 3))
def test_every_verifier_at_most_its_bound(pq, k):
    p, q = pq
    for name, ver in ob.VERIFIERS.items():
        try:
            acc = ver.acceptance(p, q, k)
        except ob.InvalidInputError:
            continue
        if acc is None:
            continue
        bound = bound_or_refusal(p, q, k, ver.sampling)
        if bound is not None:  # the bound may refuse a law whose denormal tokens it cannot resolve
            assert acc <= bound + 1e-9, (name, acc, bound)


@pytest.mark.parametrize("tiny", [1e-300, 5e-324, 1e-310])
def test_denormal_draft_entries_right_or_refused(tiny):
    """The issue's cases: K = 3 and 4 with a tiny/denormal token; right against brute force or a
    clear refusal naming the entries below the clock floor."""
    p = np.array([0.1, 0.2, 0.3, 0.4])
    q = np.array([0.5, 0.3, 0.2, tiny])
    q[0] += 1.0 - q.sum()
    for k in (3, 4):
        value = bound_or_refusal(p, q, k, "without_replacement")
        if value is None:
            with pytest.raises(ob.InvalidInputError, match="below 1e-300"):
                ob.optimal_acceptance(p, q, k, "without_replacement")
            continue
        brute = ob.optimal_acceptance_brute_force(p, ob.draft_joint(q, k, "without_replacement")).value
        assert value == pytest.approx(brute, abs=1e-12)


def test_cancellation_in_the_candidate_cut_is_gone():
    """1 − M (mass outside the K − 1 largest q's) was computed as 1 − Σ top: with tiny tokens it
    cancelled to ~1e-16 and the binding token was cut (α* = 1 returned for a true 0.133)."""
    q = np.array(
        [0.006525929424594212, 9.639201114146892e-31, 0.39805312078356225, 6.430799828706642e-32, 0.5954209497918435]
    )
    p = np.array(
        [0.008700517963943772, 4.5942994387135124e-10, 0.0008578240133309323, 0.9294999112707113, 0.06094174629258411]
    )
    brute = ob.optimal_acceptance_brute_force(p, ob.draft_joint(q, 4, "without_replacement")).value
    assert brute == pytest.approx(0.1330426293195468, abs=1e-12)
    assert ob.optimal_acceptance(p, q, 4, "without_replacement") == pytest.approx(brute, abs=1e-12)


@pytest.mark.parametrize("tiny", [5e-324, 1e-310, 1e-300])
def test_closed_form_pair_never_overflows_to_a_wrong_value(tiny):
    """K = 2 closed form: 1/(1 − q_big) overflowed for a denormal remainder and Q(H) became 0
    (α* = 1 returned for a true 0.9). Now right or refused."""
    q, p = np.array([1.0, tiny, tiny]), np.array([0.4, 0.0, 0.6])
    value = bound_or_refusal(p, q, 2, "without_replacement")
    assert value is None or value == pytest.approx(0.9, abs=1e-12)
