"""Boundary cases through both array libraries: laws full of ties (rational masses, equal draft
probabilities at the top-K boundary, target mass exactly equal to draft mass) give the same α* and
the same verifier acceptance for numpy and torch input, and both equal an independent value."""

import itertools

import numpy as np
import pytest
import torch

import otbound as ob


def tied_instances(n, seed=0):
    """``(p, q, K)``: integer weights in 1..3 (q) and 0..3 (p), so ties everywhere, including at the
    K-th largest q and between p and q."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        v = int(rng.integers(3, 7))
        wq = rng.integers(1, 4, size=v).astype(np.float64)
        wp = rng.integers(0, 4, size=v).astype(np.float64)
        wp[rng.integers(v)] += 1
        yield wp / wp.sum(), wq / wq.sum(), int(rng.integers(1, min(3, v - 1) + 1))


def top_k_lower_index(q, k):
    """G: the k largest q, ties to the lower index (a Python sort by (−q, index))."""
    return sorted(range(q.size), key=lambda i: (-q[i], i))[:k]


def independent_alpha(p, q, k, sampling):
    if sampling == "deterministic":  # α* = p(G)
        return float(p[top_k_lower_index(q, k)].sum())
    if sampling == "greedy":  # α* = p(G) + Σ_{x∉G} min(p, q'), G the K − 1 largest, q' = q / (1 − q(G)) off G
        g = top_k_lower_index(q, k - 1)
        rest = np.setdiff1d(np.arange(q.size), g)
        qp = q[rest] / q[rest].sum()
        return float(p[g].sum() + np.minimum(p[rest], qp).sum())
    # with replacement: α* = min over subsets H of 1 − Q(H) + p(H), Q(H) = P(no draft outside H) = q(H)^K
    best = 1.0
    for r in range(p.size + 1):
        for h in itertools.combinations(range(p.size), r):
            h = list(h)
            best = min(best, 1.0 - q[h].sum() ** k + p[h].sum())
    return best


@pytest.mark.parametrize("sampling", ["with_replacement", "greedy", "deterministic"])
def test_alpha_star_at_ties_numpy_torch_and_independent(sampling):
    for p, q, k in tied_instances(120):
        a = ob.optimal_acceptance(p, q, k, sampling)
        b = ob.optimal_acceptance(torch.tensor(p), torch.tensor(q), k, sampling)
        assert isinstance(b, torch.Tensor)
        expected = independent_alpha(p, q, k, sampling)
        assert a == pytest.approx(expected, abs=1e-12)
        assert float(b) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("name", ["nss", "rrs", "greedy", "onehot", "nss_deterministic"])
def test_verifier_acceptance_at_ties_numpy_and_torch_agree(name):
    v = ob.VERIFIERS[name]
    for p, q, k in tied_instances(60, seed=1):
        a = v.acceptance(p, q, k)
        b = v.acceptance(torch.tensor(p), torch.tensor(q), k)
        assert float(b) == pytest.approx(float(a), abs=1e-12)
        # and never above the bound of its own draft law
        assert float(a) <= ob.optimal_acceptance(p, q, k, v.sampling) + 1e-12
