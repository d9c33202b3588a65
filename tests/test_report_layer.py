"""The report layer against independent computations.

* cluster-robust intervals (:func:`otbound.report.cluster_mean_ci`) against statsmodels' cluster-robust
  standard errors of an intercept-only OLS, with UNEQUAL cluster sizes (means instead of sums, or
  the wrong degrees of freedom, differ there): to 1e-10 relative;
* the efficiency and its interval in :func:`otbound.report.aggregate` against a cluster bootstrap of the
  ratio of means (resampling prompts, 4000 replicates, fixed seed): efficiency to 1e-12, half-width
  within 15% (the bootstrap's own Monte Carlo error at 4000 replicates is about 2%; a half-width not
  divided by α*, or from the wrong residuals, is off by far more);
* the synthetic report's intervals (independent instances) against scipy's Student t interval of
  the same instances' values, recomputed from the instances themselves;
* the greedy law's tie convention (ties go to the lower token index) pinned by its α*.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

import otbound as ob
from otbound.report import aggregate, cluster_mean_ci

statsmodels = pytest.importorskip("statsmodels.api")


def _clustered(seed, clusters=12):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 40, clusters)  # unequal
    groups = np.repeat(np.arange(clusters), sizes)
    effect = rng.normal(0.0, 0.2, clusters)[groups]
    return 0.6 + effect + rng.normal(0.0, 0.1, groups.size), groups


@pytest.mark.parametrize("seed", range(5))
def test_cluster_interval_matches_statsmodels_with_unequal_clusters(seed):
    x, groups = _clustered(seed)
    mean, half = cluster_mean_ci(x, groups)
    fit = statsmodels.OLS(x, np.ones((x.size, 1))).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)
    lo, hi = fit.conf_int(alpha=0.05)[0]
    assert mean == pytest.approx(fit.params[0], rel=1e-12)
    assert half == pytest.approx((hi - lo) / 2, rel=1e-10)


def _results(seed, prompts=60):
    """measure_trace-shaped results: per prompt a few positions with α* and a verifier's acceptance."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(prompts):
        n = int(rng.integers(2, 30))
        opt = np.clip(rng.beta(8, 2) + rng.normal(0, 0.05, n), 0.05, 1.0)
        acc = opt * np.clip(rng.beta(20, 3) + rng.normal(0, 0.03, n), 0.0, 1.0)
        out.append(
            {
                "dataset": "d",
                "temperature": 1.0,
                "prompt_id": str(i),
                "positions": n,
                "model_dtype": None,
                "optimal": {"with_replacement": {2: opt.tolist()}},
                "verifiers": {
                    "v": {
                        2: {
                            "sampling": "with_replacement",
                            "acceptance": acc.tolist(),
                            "method": "exact",
                            "mc_samples": None,
                        }
                    }
                },
                "skipped": {},
            }
        )
    return out


def test_efficiency_and_its_interval_match_a_cluster_bootstrap():
    results = _results(0)
    (row,) = [r for r in aggregate(results) if r["verifier"] == "v"]
    acc = [np.asarray(r["verifiers"]["v"][2]["acceptance"]) for r in results]
    opt = [np.asarray(r["optimal"]["with_replacement"][2]) for r in results]
    eff = np.concatenate(acc).mean() / np.concatenate(opt).mean()
    assert row["efficiency"] == pytest.approx(eff, abs=1e-12)
    assert row["acceptance"] <= row["optimal"]
    rng = np.random.default_rng(1)
    sums_a = np.array([a.sum() for a in acc])
    sums_o = np.array([o.sum() for o in opt])
    boot = []
    for _ in range(4000):
        pick = rng.integers(0, len(results), len(results))
        boot.append(sums_a[pick].sum() / sums_o[pick].sum())
    half = scipy.stats.t.ppf(0.975, len(results) - 1) * np.std(boot, ddof=1)
    assert row["efficiency_ci"] == pytest.approx(half, rel=0.15)


def test_synthetic_intervals_are_the_t_interval_of_independent_instances():
    """Each synthetic row's acceptance_ci and gap_ci: the half width of scipy's 95% Student t interval
    (N − 1 dof) of the per-instance values, the instances redrawn from the cell's generator."""
    import zlib

    from otbound.report import synthetic_pair, synthetic_rows

    n, v, temp, k, seed = 7, 6, 0.8, 2, 3
    rows, _ = synthetic_rows(["zipf"], v, [temp], [k], n, 16, seed, progress=False)
    rng = np.random.default_rng([seed, zlib.crc32(f"zipf|{temp!r}".encode())])  # the cell's generator
    pairs = [synthetic_pair("zipf", v, temp, rng) for _ in range(n)]
    opt = np.array([ob.optimal_acceptance(p, q, k, "with_replacement") for p, q in pairs])
    acc = np.array([ob.VERIFIERS["rrs"].acceptance(p, q, k) for p, q in pairs])  # exact: no random draws
    for name, values in (("optimal", opt), ("rrs", acc)):
        row = next(r for r in rows if r["verifier"] == name and r["sampling"] == "with_replacement")
        lo, hi = scipy.stats.t.interval(0.95, n - 1, loc=values.mean(), scale=scipy.stats.sem(values))
        assert row["acceptance"] == pytest.approx(values.mean(), rel=1e-12)
        assert row["acceptance_ci"] == pytest.approx((hi - lo) / 2, rel=1e-10)
        assert row["acceptance_ci"] > 1.96 * scipy.stats.sem(values) * 1.1  # not the normal interval (t_6 ≈ 2.45)
    gaps = acc - opt
    lo, hi = scipy.stats.t.interval(0.95, n - 1, loc=gaps.mean(), scale=scipy.stats.sem(gaps))
    rrs = next(r for r in rows if r["verifier"] == "rrs")
    assert rrs["gap"] == pytest.approx(gaps.mean(), rel=1e-12, abs=1e-15)
    assert rrs["gap_ci"] == pytest.approx((hi - lo) / 2, rel=1e-10)


def test_greedy_tie_convention_is_pinned():
    """q has a tie for the top token: G takes the lower index (0), whose p is 0, so α*_greedy =
    p(G) + Σ_{x∉G} min(p, q') = 0 + min(1, 2/3) = 2/3; the other tie rule (index 1) would give 1.0."""
    q = np.array([0.4, 0.4, 0.2])
    p = np.array([0.0, 1.0, 0.0])
    g, qp = ob.greedy_split(q, 2)
    assert g.tolist() == [0]
    np.testing.assert_allclose(qp, [0.0, 2 / 3, 1 / 3], atol=1e-15)
    assert ob.optimal_acceptance(p, q, 2, "greedy") == pytest.approx(2 / 3, abs=1e-15)
    assert ob.optimal_acceptance(p[[1, 0, 2]], q, 2, "greedy") == pytest.approx(1.0, abs=1e-15)
