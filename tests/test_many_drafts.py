"""α* of i.i.d. drafts as K grows: its limit p(supp q) with an explicit rate, and the smallest K with
α* = 1, against brute force over every subset H and against optimal_acceptance."""

import itertools

import numpy as np
import pytest

from otbound import drafts_for_certain_acceptance, optimal_acceptance, optimal_acceptance_limit


def _laws(count, seed, vmax=7, zeros=True):
    r = np.random.default_rng(seed)
    out = []
    for i in range(count):
        v = int(r.integers(2, vmax + 1))
        p, q = r.dirichlet(np.full(v, [0.3, 1.0, 3.0][i % 3])), r.dirichlet(np.full(v, [0.3, 1.0, 3.0][i % 3]))
        if zeros and i % 3 == 1:
            q[r.integers(v)] = 0.0
        if zeros and i % 3 == 2:
            p[r.integers(v)] = 0.0
        out.append((p / p.sum(), q / q.sum()))
    return out


def _brute_k1(p, q):
    """Smallest K with p(H) ≥ q(H)^K for every subset H (None if none), by enumeration: a subset with
    p(H) = 0 < q(H), or q(H) = 1 > p(H), rules every K out."""
    k = 1
    for size in range(1, p.size + 1):
        for h in itertools.combinations(range(p.size), size):
            rest = [i for i in range(p.size) if i not in h]
            ph, qh = p[list(h)].sum(), q[list(h)].sum()
            pc, qc = p[rest].sum(), q[rest].sum()  # the complement, for the logs of masses near 1
            if qh == 0 or pc == 0:
                continue
            if ph == 0 or qc == 0:
                return None
            lp = np.log(ph) if ph < 0.5 else np.log1p(-pc)
            lq = np.log(qh) if qh < 0.5 else np.log1p(-qc)
            k = max(k, int(np.ceil(lp / lq - 1e-12)))
    return k


def test_limit_and_its_rate():
    """min(p(S), 1 − (1 − q_min)^K) ≤ α*(K) ≤ p(S), α* nondecreasing in K, for K up to 512."""
    for p, q in _laws(30, 1):
        lim = optimal_acceptance_limit(p, q)
        assert lim == pytest.approx(p[q > 0].sum(), abs=1e-15)
        qmin = q[q > 0].min()
        prev = 0.0
        for k in (1, 2, 3, 5, 8, 16, 64, 512):
            a = optimal_acceptance(p, q, k)
            assert min(lim, 1 - (1 - qmin) ** k) - 1e-12 <= a <= lim + 1e-12
            assert a >= prev - 1e-12
            prev = a


def test_limit_reached_when_drafts_cover_the_support():
    p, q = np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.5, 0.3, 0.2, 0.0])
    assert optimal_acceptance_limit(p, q) == pytest.approx(0.9, abs=1e-15)
    assert optimal_acceptance(p, q, 200) == pytest.approx(0.9, abs=1e-12)


def test_smallest_k_against_brute_force_and_the_bound():
    """K₁ equals the subset enumeration; α*(K₁) = 1 and α*(K₁ − 1) < 1 (optimal_acceptance)."""
    seen = 0
    for p, q in _laws(60, 2) + _laws(30, 3, zeros=False):
        k1, brute = drafts_for_certain_acceptance(p, q), _brute_k1(p, q)
        if k1 is None or k1 < 10**6:
            assert k1 == brute
        else:  # the ratio of two logs near 0, each to float64: its ceiling to 1e-9 relative
            assert brute == pytest.approx(k1, rel=1e-9)
        if k1 is None:
            assert not np.array_equal(p > 0, q > 0)
            # every K falls short: by p(S^c) (emitted, never drafted) or q(Z)^K (drafted, never emitted)
            z = q[p == 0].sum()
            for k in (1, 2, 4):
                assert optimal_acceptance(p, q, k) <= min(p[q > 0].sum(), 1 - z**k) + 1e-12
                assert min(p[q > 0].sum(), 1 - z**k) < 1
            continue
        if k1 > 4096:  # a token q nearly never drafts: K₁ is large (checked by the enumeration above)
            continue
        seen += 1
        assert optimal_acceptance(p, q, k1) == pytest.approx(1.0, abs=1e-12)
        if k1 > 1:
            assert optimal_acceptance(p, q, k1 - 1) < 1 - 1e-12
    assert seen >= 20


def test_worked_examples():
    assert drafts_for_certain_acceptance([0.5, 0.5], [0.9, 0.1]) == 7
    assert optimal_acceptance([0.5, 0.5], [0.9, 0.1], 6) == pytest.approx(1.5 - 0.9**6, abs=1e-15)
    assert drafts_for_certain_acceptance([0.2, 0.8], [0.2, 0.8]) == 1  # p = q: one draft suffices
    assert drafts_for_certain_acceptance([1.0, 0.0], [1.0, 0.0]) == 1
    assert drafts_for_certain_acceptance([0.5, 0.5, 0.0], [0.8, 0.1, 0.1]) is None
    assert drafts_for_certain_acceptance([0.5, 0.4, 0.1], [0.5, 0.5, 0.0]) is None
