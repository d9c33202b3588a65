"""The code written for an accelerator, run on the CPU under ``accelerator_paths()`` (CI has no
accelerator): the same numbers as the CPU's own paths, and both equal to an independent value."""

import itertools

import numpy as np
import pytest
import torch

from otbound import VERIFIERS
from otbound._backend import accelerator_paths, on_accelerator
from otbound.token import LawBatch
from otbound.token.verifiers import _rrs

FAMILIES = {"peaked": 0.05, "mid": 0.3, "flat": 1.0}


def laws(conc, rows=6, vocab=300, seed=0):
    rng = np.random.default_rng([seed, int(conc * 100)])
    return rng.dirichlet(np.full(vocab, conc), rows), rng.dirichlet(np.full(vocab, conc), rows)


def both_paths(name, p, q, ks, mc_samples=64):
    cpu = VERIFIERS[name].batch_estimate(LawBatch(p, q, seed=3), ks, mc_samples=mc_samples)
    with accelerator_paths():
        device = VERIFIERS[name].batch_estimate(LawBatch(p, q, seed=3), ks, mc_samples=mc_samples)
    return cpu, device


def test_the_switch_is_scoped():
    x = torch.zeros(2)
    assert not on_accelerator(x)
    with pytest.raises(RuntimeError), accelerator_paths():
        assert on_accelerator(x)
        raise RuntimeError
    assert not on_accelerator(x)  # restored on the error path too


@pytest.mark.parametrize("family", FAMILIES)
def test_nss_batched_path_equals_rows_and_the_closed_form(family):
    p, q = laws(FAMILIES[family])
    ks = (1, 2, 3, 5)
    cpu, device = both_paths("nss", p, q, ks)
    for k in ks:
        independent = 1.0 - (p * (1.0 - q) ** k).sum(-1)  # Σ_t p(t) (1 − (1 − q(t))^K)
        np.testing.assert_allclose(device[k][0].numpy(), cpu[k][0].numpy(), rtol=0, atol=1e-14)
        np.testing.assert_allclose(device[k][0].numpy(), independent, rtol=0, atol=1e-13)


def _enumerated_rrs_wor_k2(p, q):
    """α of RRS without replacement at K = 2 by enumerating the ordered draft pairs, each with its
    exact conditional law (the verifier's per-draft rounds, not the sorted-rows kernel)."""
    v = VERIFIERS["rrs_wor"]
    pairs = [(a, b) for a, b in itertools.permutations(range(p.size), 2) if q[a] > 0 and q[b] > 0]
    prob = np.array([q[a] * q[b] / (1.0 - q[a]) for a, b in pairs])
    law = v.conditional_law(p, q, np.array(pairs))
    hit = np.array([law[i, a] + law[i, b] for i, (a, b) in enumerate(pairs)])
    return float(prob @ hit)


@pytest.mark.parametrize("family", FAMILIES)
def test_rrs_wor_exact_k2_batched_path_equals_rows_and_enumeration(family):
    p, q = laws(FAMILIES[family], rows=4, vocab=7)
    cpu, device = both_paths("rrs_wor", p, q, (2,))
    assert cpu[2][1] == device[2][1] == "exact"
    np.testing.assert_allclose(device[2][0].numpy(), cpu[2][0].numpy(), rtol=0, atol=1e-14)
    independent = [_enumerated_rrs_wor_k2(p[i], q[i]) for i in range(p.shape[0])]
    np.testing.assert_allclose(device[2][0].numpy(), independent, rtol=0, atol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_rrs_wor_monte_carlo_torch_search_and_crossings_equal_the_cpu(family, monkeypatch):
    p, q = laws(FAMILIES[family])
    calls = {"torch search": 0}
    search = _rrs._bisect_rejected_torch

    def counted(*args, **kwargs):
        calls["torch search"] += 1
        return search(*args, **kwargs)

    monkeypatch.setattr(_rrs, "_bisect_rejected_torch", counted)
    cpu, device = both_paths("rrs_wor", p, q, (3, 4))
    assert calls["torch search"] > 0  # the accelerator's search did run (never on the CPU path)
    for k in (3, 4):
        assert cpu[k][1] == device[k][1] == "monte_carlo"
        # the same paths (one generator, one seed): the same estimate, to rounding
        np.testing.assert_allclose(device[k][0].numpy(), cpu[k][0].numpy(), rtol=0, atol=1e-13)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sampling", ["with_replacement", "without_replacement", "greedy", "deterministic"])
def test_kernel_accelerator_paths_equal_the_cpu_paths_and_the_brute_force(family, sampling):
    """α* of the batched kernel (the sort on the device, the block bound over whole columns, the
    top-K selection by torch.topk, the batched min-sum) under ``accelerator_paths()`` equals the CPU
    paths (single calls and sorted batches), and both equal the LP of a brute-force enumeration at
    small V. Tolerance 1e-12 (float64 sums in another order)."""
    from otbound import draft_joint, optimal_acceptance, optimal_acceptance_brute_force
    from otbound.report import measure_laws

    p, q = laws(FAMILIES[family], rows=4, vocab=7, seed=5)
    for k in (2, 3):
        cpu_single = np.array([optimal_acceptance(p[i], q[i], k, sampling=sampling) for i in range(len(p))])
        cpu_batch = np.asarray(optimal_acceptance(torch.from_numpy(p), torch.from_numpy(q), k, sampling=sampling))
        with accelerator_paths():
            dev = np.asarray(optimal_acceptance(torch.from_numpy(p), torch.from_numpy(q), k, sampling=sampling))
            dev_sets = optimal_acceptance(torch.from_numpy(p), torch.from_numpy(q), k, sampling=sampling,
                                          return_certificate=True)
        brute = np.array([optimal_acceptance_brute_force(p[i], draft_joint(q[i], k, sampling)).value
                          for i in range(len(p))])
        np.testing.assert_allclose(dev, cpu_single, rtol=0, atol=1e-12)
        np.testing.assert_allclose(cpu_batch, cpu_single, rtol=0, atol=1e-12)
        np.testing.assert_allclose(dev, brute, rtol=0, atol=1e-9)
        np.testing.assert_allclose(np.asarray(dev_sets.value), brute, rtol=0, atol=1e-9)
    # the measurement (sorted rows) on both paths, full-size rows
    p, q = laws(FAMILIES[family], rows=3, vocab=2000, seed=6)
    cpu = measure_laws(p, q, (2, 4), samplings=(sampling,), verifiers=())
    with accelerator_paths():
        dev = measure_laws(p, q, (2, 4), samplings=(sampling,), verifiers=())
    for k in (2, 4):
        np.testing.assert_allclose(np.asarray(dev["optimal"][sampling][k]), np.asarray(cpu["optimal"][sampling][k]),
                                   rtol=0, atol=1e-12)
