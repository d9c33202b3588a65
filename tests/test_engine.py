"""The token layer's batched kernel (LawBatch, every verifier's batch_acceptance) against
independent per-row references (exact to 1e-12) and, for its Monte Carlo part, against exact
enumeration at a fixed seed."""

import math

import numpy as np
import pytest
from conftest import adversarial_rows as shared_adversarial_rows

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_thread")

import otbound as ob  # noqa: E402
from otbound import InvalidInputError  # noqa: E402
from otbound.report import measure_laws  # noqa: E402
from otbound.token import LawBatch  # noqa: E402
from otbound.token._kernel import SortedRows  # noqa: E402
from otbound.token.verifiers import VERIFIERS, support_tuples  # noqa: E402
from otbound.token.verifiers._rrs import _draw_rejected, _reject, _reject_first_drafts  # noqa: E402

TOL = 1e-12  # the kernel against the independent per-row references (measured: ≤ 1e-14)
LM_VOCAB = 151_936
CLOSED_FORM = ("nss", "rrs", "rrs_wor", "kseq", "spechub", "greedy", "ot")  # rrs_wor: K <= 2


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def lm_rows(rng, n, v, scale=2.5, noise=1.0):
    """Rows shaped like a real draft/target pair: q = softmax(z), p = softmax(z + noise)."""
    z = rng.normal(size=(n, v)) * scale
    return _softmax(z + noise * rng.normal(size=z.shape)), _softmax(z)


def adversarial_rows(v=6):
    """Zeros, disjoint supports, identical laws, near-deterministic laws, ties, a mass-1e-30 tail at V = v,
    then the shared hand-written pairs (:data:`conftest.ADVERSARIAL_PAIRS`) padded to v."""
    rows = []
    u = np.full(v, 1.0 / v)
    rows.append((u, u))  # identical, all tied
    a = np.zeros(v); a[: v // 2] = 1.0  # noqa: E702
    b = np.zeros(v); b[v // 2 :] = 1.0  # noqa: E702
    rows.append((a / a.sum(), b / b.sum()))  # disjoint supports
    rows.append((b / b.sum(), np.full(v, 1.0 / v)))  # p has zeros
    d = np.full(v, 1e-9); d[0] = 1.0  # noqa: E702
    rows.append((u, d / d.sum()))  # near-deterministic draft
    rows.append((d / d.sum(), u))  # near-deterministic target
    t = np.full(v, 1e-30); t[:3] = [0.5, 0.3, 0.2]  # noqa: E702
    rows.append((u, t / t.sum()))  # tiny tail: the greedy law's last draft lives in it (K = 4)
    g = np.array([0.3, 0.3, 0.1, 0.1, 0.1, 0.1][:v] + [0.0] * max(0, v - 6))
    rows.append((np.roll(u, 1), g / g.sum()))  # ties at the edge of the greedy set
    z = np.zeros(v); z[[0, 2, 4]] = [0.2, 0.5, 0.3]  # noqa: E702
    rows.append((z, np.roll(z, 1) * 0.5 + 0.5 * u))  # q > 0 everywhere, p sparse
    p, q = zip(*rows)
    shared_p, shared_q = shared_adversarial_rows(v)  # the token tests' hand-written pairs, padded to v
    return np.vstack([np.array(p), shared_p]), np.vstack([np.array(q), shared_q])


def _ref_nss(p, q, k):
    return float(p @ (1.0 - (1.0 - q) ** k))


def _ref_rrs(p, q, k):
    """The recursion of Thomas et al. (Dynamic Delayed Tree Expansion, Alg. 9) on explicit residuals."""
    from otbound.token.verifiers._base import residual

    seq = [p]
    for _ in range(k):
        seq.append(residual(seq[-1], q))
    p_rej, m = 1.0, np.ones_like(q)
    for i in range(k):
        excess = np.maximum(q - seq[i], 0.0)
        rej = excess.sum()
        if rej <= 0.0:
            return 1.0
        p_rej *= rej
        m *= 1.0 - excess / rej
    return (1.0 - p_rej) + p_rej * float(seq[k] @ (1.0 - m))


def _ref_kseq(p, q, k):
    """K-SEQ's acceptance with its coincidence term (the drafts rejected, then the residual)."""
    aux = VERIFIERS["kseq"]._prepare(p, q, k)
    beta = aux["beta"]
    if beta >= 1.0:
        return 1.0
    rejected_law = (q - np.minimum(q, p / aux["rho"])) / (1.0 - beta)
    with np.errstate(divide="ignore"):
        coincide = float(aux["residual"] @ -np.expm1(k * np.log1p(-np.minimum(rejected_law, 1.0))))
    return aux["p_acc"] + (1.0 - beta) ** k * coincide


def _ref_greedy(p, q, k):
    g, qp = ob.greedy_split(q, k)
    off = np.ones(q.size, dtype=bool)
    off[g] = False
    return min(1.0, float(p[g].sum() + np.minimum(p[off], qp[off]).sum()))


def _ref_spechub(p, q, k):
    """SpecHub's acceptance summed token by token from its own rounds (min(p, q) + min(p_1, Q_2) off
    the hub, all of p(a) at the hub)."""
    if k == 1:
        return float(np.minimum(p, q).sum())
    aux = VERIFIERS["spechub"]._prepare(p, q, k)
    a = aux["a"]
    accepted = np.minimum(p, q) + np.minimum(aux["p1"], aux["q2"])
    accepted[a] = 0.0
    return float(accepted.sum() + p[a])


def _ref_alpha_wr(p, q, k):
    """α* with replacement by numpy's stable sort and extended-precision (long double) prefix sums."""
    with np.errstate(divide="ignore", invalid="ignore"):
        order = np.argsort(np.where(q > 0, p / q, np.inf), kind="stable")
    cp, cq = np.cumsum(p[order].astype(np.longdouble)), np.cumsum(q[order].astype(np.longdouble))
    return 1.0 + min(0.0, float(np.min(cp - cq**k)))


def _ref_ot(p, q, k):
    """The optimal verifier's acceptance is α* (its proof); the coupling's own construction sums
    sequentially in float64 and drifts by up to ~2e-12 at V = 151,936, so the reference is α*."""
    return _ref_alpha_wr(p, q, k)


def _ref_enumerated(name, p, q, k):
    v = VERIFIERS[name]
    weights, tuples = support_tuples(q, k, v.sampling)
    laws = v.conditional_law(p, q, tuples)
    mask = np.zeros(laws.shape, dtype=bool)
    mask[np.arange(tuples.shape[0])[:, None], tuples] = True
    return float(weights @ np.where(mask, laws, 0.0).sum(1))


REFERENCES = {"nss": _ref_nss, "rrs": _ref_rrs, "kseq": _ref_kseq, "greedy": _ref_greedy, "spechub": _ref_spechub,
              "ot": _ref_ot, "rrs_wor": lambda p, q, k: _ref_enumerated("rrs_wor", p, q, k)}


def _ref_optimal(p, q, k, sampling):
    if sampling == "with_replacement":
        return _ref_alpha_wr(p, q, k)
    if sampling == "greedy":
        return _ref_greedy(p, q, k)
    if sampling == "deterministic":  # p of the K largest q, ties to the lower index (a stable sort of -q)
        return float(p[np.argsort(-q, kind="stable")[:k]].sum())
    from otbound.token._search import without_replacement

    if k == 1:
        return _ref_optimal(p, q, 1, "with_replacement")
    return float(np.clip(without_replacement(p[None], q[None], k, False)[0][0], 0.0, 1.0))  # unsorted rows


def per_row(name, p, q, k):
    return np.array([REFERENCES[name](a, b, k) for a, b in zip(p, q)], dtype=float)


def check_against_per_row(p, q, ks, names):
    """VERIFIERS[name].acceptance on the (B, V) batch, numpy and torch, against the per-row references;
    α* of every law likewise."""
    for k in ks:
        for name in names:
            v = VERIFIERS[name]
            if v.max_drafts is not None and k > v.max_drafts:
                continue
            ref = per_row(name, p, q, k)
            got = v.acceptance(p, q, k)
            assert isinstance(got, np.ndarray) and got.shape == (p.shape[0],)
            np.testing.assert_allclose(got, ref, rtol=0, atol=TOL, err_msg=f"{name} K={k}")
            t = v.acceptance(torch.from_numpy(p), torch.from_numpy(q), k)
            assert isinstance(t, torch.Tensor) and t.dtype == torch.float64
            np.testing.assert_allclose(t.numpy(), ref, rtol=0, atol=TOL, err_msg=f"{name} K={k} (torch)")
        for s in ob.SAMPLINGS:
            keep = (q > 0).sum(1) >= k if s != "with_replacement" else np.ones(p.shape[0], bool)
            if not keep.any():
                continue
            ref = np.array([_ref_optimal(a, b, k, s) for a, b in zip(p[keep], q[keep])])
            np.testing.assert_allclose(ob.optimal_acceptance(p[keep], q[keep], k, s), ref, rtol=0, atol=TOL,
                                       err_msg=f"alpha* {s} K={k}")


def test_random_rows_agree_with_per_row_references():
    rng = np.random.default_rng(0)
    for v in (2, 5, 9, 40):
        p, q = lm_rows(rng, 5, v)
        check_against_per_row(p, q, (1, 2), CLOSED_FORM)  # rrs_wor K <= 2 against enumeration
        if v >= 4:
            check_against_per_row(p, q, (3, 4), [n for n in CLOSED_FORM if n != "rrs_wor" or v <= 9])


def test_adversarial_rows_agree_with_per_row_references():
    p, q = adversarial_rows()
    check_against_per_row(p, q, (1, 2), CLOSED_FORM)
    keep = (q > 0).sum(1) >= 4
    check_against_per_row(p[keep], q[keep], (3, 4), CLOSED_FORM)


def test_rrs_without_replacement_k2_is_exact_at_moderate_vocabulary():
    """K = 2 by the sum over first drafts; enumeration (V² tuples) is the independent check."""
    rng = np.random.default_rng(1)
    p, q = lm_rows(rng, 3, 120, scale=1.5)
    np.testing.assert_allclose(VERIFIERS["rrs_wor"].acceptance(p, q, 2), per_row("rrs_wor", p, q, 2), rtol=0, atol=TOL)


def test_optimal_verifier_coupling_attains_alpha_star():
    """The coupling the optimal verifier samples from accepts α* (its construction, per row), the
    value its batched acceptance reports."""
    from otbound.token.verifiers import optimal_coupling

    rng = np.random.default_rng(17)
    p, q = lm_rows(rng, 3, 2000)
    for k in (2, 4):
        built = [optimal_coupling(a, b, k).accepted for a, b in zip(p, q)]
        np.testing.assert_allclose(VERIFIERS["ot"].acceptance(p, q, k), built, rtol=0, atol=1e-13)


def test_rrs_without_replacement_k2_keeps_accuracy_when_the_other_drafts_are_rare():
    """A first draft holding 1 − 3e-9 of q leaves S_2 = 3e-9: ρ_2 as 1 − Qs/S_2 (no cancellation)."""
    q = np.array([[0.0, 3.33333332e-09, 1 - 3.33333332e-09], [0.0, 1e-12, 1 - 1e-12]])
    p = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(VERIFIERS["rrs_wor"].acceptance(p, q, 2), per_row("rrs_wor", p, q, 2), rtol=0, atol=TOL)


def test_full_vocabulary_rows_agree_with_per_row_references():
    rng = np.random.default_rng(2)
    p, q = lm_rows(rng, 2, LM_VOCAB)
    check_against_per_row(p, q, (2, 3, 4), [n for n in CLOSED_FORM if n != "rrs_wor"])


def test_full_vocabulary_tied_rows_keep_float64_accuracy():
    """Integer logits (many tied and near-tied ratios) at V = 151,936: the blocked prefix sums keep
    every closed form within 1e-12 of its per-row reference (sequential sums drifted by ~1e-12)."""
    rng = np.random.default_rng(16)
    p, q = (_softmax(np.round(rng.standard_normal((2, LM_VOCAB)) * 2.5)) for _ in range(2))
    check_against_per_row(p, q, (1, 2, 4), [n for n in CLOSED_FORM if n != "rrs_wor"])


def test_batch_shape_and_types_are_the_callers():
    """(..., V) batches keep their batch shape; 1-D laws give a float; torch input a float64 tensor."""
    rng = np.random.default_rng(14)
    p, q = lm_rows(rng, 6, 9)
    p3, q3 = p.reshape(2, 3, 9), q.reshape(2, 3, 9)
    for name in CLOSED_FORM:
        flat = VERIFIERS[name].acceptance(p, q, 2)
        assert VERIFIERS[name].acceptance(p3, q3, 2).shape == (2, 3)
        np.testing.assert_array_equal(VERIFIERS[name].acceptance(p3, q3, 2).ravel(), flat)
        assert isinstance(VERIFIERS[name].acceptance(p[0], q[0], 2), float)
    t = ob.optimal_acceptance(torch.from_numpy(p3), torch.from_numpy(q3), 3, "without_replacement")
    assert isinstance(t, torch.Tensor) and t.shape == (2, 3) and t.dtype == torch.float64


def test_rejected_draft_law_is_drawn_exactly():
    """The inverse-CDF draw of a rejected draft against its explicit law (q/S − p_i)_+ off R."""
    rng = np.random.default_rng(3)
    p, q = lm_rows(rng, 1, 7, scale=1.0)
    srt = LawBatch(p, q).sorted
    ps, qs, r = srt.ps[0].numpy(), srt.qs[0].numpy(), srt.r[0].numpy()
    # state after rejecting the token at sorted position 0: μ = 1, S = 1 − q_0, h = h(1)
    mu, s = 1.0, 1.0 - qs[0]
    h = np.maximum(ps - mu * qs, 0).sum()
    w = np.maximum(qs / s - np.maximum(ps - mu * qs, 0) / h, 0)
    w[0] = 0.0
    n = 40_000
    shape = (1, n)
    u = torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * w.sum()
    pos = _draw_rejected(srt, torch.full(shape, mu, dtype=torch.float64), torch.full(shape, h, dtype=torch.float64),
                         torch.full(shape, s, dtype=torch.float64), torch.full(shape, mu + h / s, dtype=torch.float64),
                         torch.tensor([[[0]]]).expand(1, n, 1), torch.full((1, n, 1), qs[0], dtype=torch.float64), u)
    freq = np.bincount(pos[0].numpy(), minlength=7) / n
    assert freq[0] == 0 and np.all(freq[r >= mu + h / s] == 0)
    np.testing.assert_allclose(freq, w / w.sum(), atol=0.01)  # 5 standard errors of 40k draws ≤ 0.0125


@pytest.mark.parametrize("k", [3, 4])
def test_rrs_without_replacement_monte_carlo_matches_enumeration(k):
    """200 independent copies × 200 paths of a row: the mean is within 5 standard errors of the
    exact (enumerated) acceptance; a 1% distortion would be ≥ 10 standard errors away."""
    rng = np.random.default_rng(4 + k)
    p, q = lm_rows(rng, 3, 6, scale=1.0)
    for a, b in zip(p, q):
        exact = VERIFIERS["rrs_wor"].acceptance(a, b, k)
        batch = LawBatch(np.tile(a, (200, 1)), np.tile(b, (200, 1)), seed=k)
        # a vocabulary this small is enumerated by batch_acceptance: ask the paths themselves
        from otbound.token.verifiers._rrs import _rrs_wor_paths

        est = (1.0 - _rrs_wor_paths(batch, k, 200)[k - 1].mean(1)).numpy()
        se = est.std(ddof=1) / np.sqrt(est.size)
        assert abs(est.mean() - exact) <= 5 * se + 1e-12, (est.mean(), exact, se)
        assert se < 0.001  # Rao–Blackwellised: far below the 0.5/sqrt(40000) = 0.0025 of counting
        assert np.all(est <= batch.optimal_acceptance(k, "without_replacement").numpy() + 5 * se * np.sqrt(200))


def test_measure_laws_keeps_its_results():
    """measure_laws: every exact value equals the per-row references, every verifier measured."""
    rng = np.random.default_rng(5)
    p, q = lm_rows(rng, 4, 6, scale=1.0)
    res = measure_laws(p, q, (1, 2, 3), mc_samples=16, seed=1)
    for s, by_k in res["optimal"].items():
        for k, vals in by_k.items():
            np.testing.assert_allclose(vals, ob.optimal_acceptance(p, q, k, s), rtol=0, atol=TOL)
    for name, by_k in res["verifiers"].items():
        for k, entry in by_k.items():
            assert entry["sampling"] == VERIFIERS[name].sampling
            assert entry["method"] == "exact"  # V = 6: every verifier is exact (closed form or enumeration)
            ref = per_row(name, p, q, k) if name in REFERENCES else VERIFIERS[name].acceptance(p, q, k)
            np.testing.assert_allclose(entry["acceptance"], ref, rtol=0, atol=TOL)
    assert res["verifiers"]["rrs_wor"][3]["method"] == "exact"  # tiny V: enumerated as before
    assert set(res["skipped"]["spechub"]) == {3}
    assert set(res["verifiers"]) == {n for n, v in VERIFIERS.items() if v.in_default_measurement}
    named_only = {"ot_wor_iid", "ot_wor_top", "ot_wor", "gls"}
    assert {n for n, v in VERIFIERS.items() if not v.in_default_measurement} == named_only


def test_devices_and_inputs_give_the_same_values():
    rng = np.random.default_rng(6)
    p, q = lm_rows(rng, 5, 30)
    a = measure_laws(p, q, (2, 4), batch_size=2, device="cpu")
    b = measure_laws(torch.from_numpy(p), torch.from_numpy(q), (2, 4), batch_size=2)
    assert a == b
    if torch.cuda.is_available():  # the same code on the GPU
        c = measure_laws(p, q, (2, 4), batch_size=2, device="cuda")
        for s in a["optimal"]:
            for k in a["optimal"][s]:
                np.testing.assert_allclose(c["optimal"][s][k], a["optimal"][s][k], rtol=0, atol=TOL)
        for n in a["verifiers"]:
            for k, entry in a["verifiers"][n].items():
                if entry["method"] == "exact":
                    np.testing.assert_allclose(c["verifiers"][n][k]["acceptance"], entry["acceptance"], atol=TOL)


def test_bad_input_is_refused():
    p = np.full((2, 4), 0.25)
    for make in (lambda a, b: LawBatch(a, b), lambda a, b: LawBatch(torch.from_numpy(a), torch.from_numpy(b)),
                 lambda a, b: measure_laws(a, b, (2,))):
        with pytest.raises(InvalidInputError, match="negative"):
            make(p - np.eye(4)[:2] * 0.5, p)
        with pytest.raises(InvalidInputError, match="NaN"):
            make(np.where(np.eye(4)[:2] > 0, np.nan, p), p)
        with pytest.raises(InvalidInputError, match="sum to 1"):
            make(p * 2, p)
        with pytest.raises(InvalidInputError, match="same shape"):
            make(p, np.full((2, 5), 0.2))
    # the measurement drafts the whole support of a row keeping fewer than K tokens (its cap rule),
    # the direct call refuses it
    assert measure_laws(p, np.array([[0.5, 0.5, 0, 0], [0.25] * 4]), (3,))["capped"] == {3: 1}
    with pytest.raises(InvalidInputError, match="support of q"):
        VERIFIERS["rrs_wor"].acceptance(p, np.array([[0.5, 0.5, 0, 0], [0.25] * 4]), 3)
    with pytest.raises(InvalidInputError, match="unknown verifier"):
        measure_laws(p, p, verifiers=["nope"])
    with pytest.raises(InvalidInputError, match="batch_size"):
        measure_laws(p, p, batch_size=0)
    with pytest.raises(InvalidInputError, match="overflows"):
        VERIFIERS["rrs"].acceptance(np.array([[0.5, 0.5]]), np.array([[1.0, 1e-320]]), 2)


def test_device_script_and_benchmark_run_on_the_cpu(tmp_path):
    """The prepared accelerator check (experiments/device_engine.py) and the CPU benchmark, tiny (with
    its per-quantity profile)."""
    import importlib
    import sys
    from pathlib import Path

    import otbound

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    try:
        device = importlib.import_module("device_engine")
        bench = importlib.import_module("bench_engine")
        versions = importlib.import_module("bench_versions")
    finally:
        sys.path.pop(0)
    res = device.main(["--quick", "--device", "cpu", "--out", str(tmp_path / "d.json")])
    assert res["agreement"]["within_1e-9"]
    assert res["engine"]["default_set_positions_per_s"] > 0
    stored = res["collection"]["bytes_per_position"]
    assert stored["float32"] > stored["float16"] > 0 and stored["none"] > 0
    assert res["collection"]["stream_measure_positions"] == res["collection"]["collect_positions"]
    out = bench.main(["--quick", "--repeats", "1", "--profile"])
    assert set(out["families"]) == set(bench.FAMILIES)
    defaults = {name for name, v in otbound.VERIFIERS.items() if v.in_default_measurement}
    for fam in bench.FAMILIES:
        for clock in ("wall", "cpu"):
            r = out["families"][fam][clock]
            assert r["measure_laws_ms"] > 0 and r["wor_k34_ms"] > 0 and r["ratio_to_sort"] > 0
        shares = out["families"][fam]["profile_x_sort"]  # every quantity of the default set, timed alone
        assert {label.split()[1] for label in shares if label.startswith("verifier")} == defaults
        assert shares["sort by ratio (LawBatch.sorted)"] > 0 and shares["alpha* without_replacement K=3,4"] > 0
    import otbound.report

    root = Path(__file__).resolve().parents[1]
    both = versions.main(["--quick", "--against", str(root), "--families", "ties"])
    assert both["max_diff"] == 0.0 and both["ties"]["ratio"] > 0 and both["ties"]["other_ms"] > 0
    alone = versions.main(["--quick", "--against", str(root), "--families", "ties", "--call", "wor_sorted"])
    assert alone["max_diff"] == 0.0 and alone["ties"]["this_ms"] > 0
    # what it timed: α* without replacement at K = 3, 4 of each row, as the single calls on the rows as given find it
    p_ties, q_ties = bench.rows("ties", 4, 2_000)
    single = [ob.optimal_acceptance(p_ties[i], q_ties[i], k, "without_replacement") for k in (3, 4) for i in range(4)]
    np.testing.assert_allclose(alone["ties"]["values"], single, rtol=0, atol=1e-12)
    assert sys.modules["otbound.report"] is otbound.report  # the caller's modules put back
    nan, inf = float("nan"), float("inf")
    a = np.array([0.5, inf, nan, 0.25])
    assert versions._largest_difference(a, a.copy()) == 0.0
    assert versions._largest_difference(a, np.array([0.5, inf, nan, 0.25 + 1e-9])) == pytest.approx(1e-9)
    assert versions._largest_difference(a, np.array([0.5, inf, 0.1, 0.25])) == inf  # a NaN against a number


def test_with_replacement_block_bounds_keep_the_minimum(monkeypatch):
    """α* with replacement evaluated only in the column blocks whose lower bound can hold the
    minimum: the same value and binding set, bit for bit, as every prefix evaluated, on LM-like,
    peaked, flat and tied rows, K = 1..5."""
    from otbound.token import _kernel

    rng = np.random.default_rng(21)
    tie = _softmax(np.round(rng.normal(size=(2, 20_000)) * 2.5))
    parts = [lm_rows(rng, 3, 20_000), lm_rows(rng, 2, 20_000, scale=6.0), lm_rows(rng, 2, 20_000, scale=0.3),
             (tie, np.roll(tie, 3, 1))]
    full_calls = []
    every_column = _kernel._prefix_minimum
    monkeypatch.setattr(_kernel, "_prefix_minimum", lambda *a, **kw: full_calls.append(1) or every_column(*a, **kw))
    blocked = 0
    for p, q in parts:
        batch = LawBatch(p, q)
        srt = batch.sorted
        for k in range(1, 6):
            before = len(full_calls)
            value, sets = _kernel._with_replacement(batch, k, True)
            blocked += len(full_calls) == before
            m = min(srt.prefix_limit(torch.full((batch.rows,), float(k), dtype=torch.float64)), srt.pc.shape[1])
            full = every_column(srt, srt.pc[:, :m] - _kernel.power(srt.qc[:, :m], k), True)
            assert torch.equal(value, full[0]) and torch.equal(sets, full[1])
    assert blocked >= 10  # the block bounds served most of the cases


def test_pair_closed_form_block_bounds_keep_the_minimum(monkeypatch):
    """α* without replacement at K = 2 with f evaluated only in the blocks of prefixes whose lower
    bound can hold the minimum: the value of every prefix evaluated (to 1e-15: a fused multiply-add
    may round the mass differently) and the same binding set, on LM-like, flat, tied and peaked rows."""
    from otbound.token import _kernel

    rng = np.random.default_rng(22)
    tie = _softmax(np.round(rng.normal(size=(2, 20_000)) * 2.5))
    parts = [lm_rows(rng, 3, 20_000), lm_rows(rng, 2, 20_000, scale=0.3), lm_rows(rng, 2, 20_000, noise=0.1),
             (tie, np.roll(tie, 3, 1)), lm_rows(rng, 3, 20_000, scale=6.0)]
    assert (parts[-1][1].max(1) > 0.5).any()  # a draft token of q > 1/2 (its 1 − q summed directly)
    full_calls = []
    every_column = _kernel._prefix_minimum
    monkeypatch.setattr(_kernel, "_prefix_minimum", lambda *a, **kw: full_calls.append(1) or every_column(*a, **kw))
    blocked = 0
    for p, q in parts:
        batch = LawBatch(p, q)
        srt = batch.sorted
        value, sets = _kernel._pair_closed_form(batch, True)
        blocked += not full_calls
        full_calls.clear()
        top = torch.from_numpy(q.max(1))
        m = min(srt.prefix_limit(2.0 / (1.0 - top)), srt.pc.shape[1])
        qs, suffix = srt.qs[:, : m - 1], srt.qsuf_range(1, m)
        odds = torch.cumsum(qs / torch.where(qs > 0.5, srt.qc[:, : m - 1] + suffix, 1.0 - qs), 1)
        mass = (srt.qc[:, 1:m] - suffix * odds).clamp(0.0, 1.0)
        ref_value, ref_sets = every_column(srt, srt.pc[:, 1:m] - mass, True, first=1)
        np.testing.assert_allclose(value.numpy(), ref_value.numpy(), rtol=0, atol=1e-15)
        assert torch.equal(sets, ref_sets)
    assert blocked >= 4  # the block bounds served most of the batches


def test_first_draft_shortcut_equals_the_general_round():
    """rrs_wor K = 2 at V = 151,936: the summed shortcut for first drafts whose μ_3 crosses no ratio
    (and the draft-by-draft sum of the rows where one does) against the general rejection round
    evaluated for every first draft; peaked rows (a draft token of mass near 1) have such drafts."""
    rng = np.random.default_rng(8)
    crossed = 0
    for p, q in (lm_rows(rng, 2, LM_VOCAB), lm_rows(rng, 3, LM_VOCAB, scale=6.0)):
        srt = LawBatch(p, q).sorted
        mu1 = torch.zeros(p.shape[0], 1, dtype=torch.float64)
        h1 = srt.h(mu1)
        mu2 = mu1 + h1
        h2 = srt.h(mu2)
        n_mu2 = srt.count_below(mu2)
        m = int(n_mu2.max())
        qx = srt.qs[:, :m]
        s2 = srt.qc[:, :m] + srt.qsuf_range(1, m + 1)
        general = _reject(srt, mu2.expand(-1, m), h2.expand(-1, m), s2, qx)
        w1 = (qx - srt.ps[:, :m] / h1).clamp_min(0.0)
        fast = _reject_first_drafts(srt, mu2, h2, s2, qx, w1, n_mu2)
        assert fast.shape == (p.shape[0],)
        np.testing.assert_allclose(fast.numpy(), (w1 * general).sum(1).numpy(), rtol=0, atol=1e-12)
        base = srt.count_below(mu2 + h2)
        r_next = torch.gather(srt.r, 1, base.clamp(max=LM_VOCAB - 1))
        crossed += int(((h2 > (r_next - mu2) * s2) & (w1 > 0)).any(1).sum())
    assert crossed  # the draft-by-draft rows were exercised


WOR_TOL = 1e-12  # α* without replacement: the kernel (sorted rows) against the search on the rows as given


def wor_adversarial_rows(v=12):
    """adversarial_rows plus rows aimed at the clock integral: p living in a mass-1e-30 tail of q,
    near-deterministic q (1 − 1e-12), identical laws (every ratio tied), many tied ratios, disjoint
    supports with K within q's support."""
    p0, q0 = adversarial_rows(v)
    rows = list(zip(p0, q0))
    rng = np.random.default_rng(9)
    u = np.full(v, 1.0 / v)
    t = np.full(v, 1e-30); t[:5] = [0.4, 0.3, 0.15, 0.1, 0.05]  # noqa: E702
    t /= t.sum()
    rows.append((np.r_[np.zeros(5), np.full(v - 5, 1.0 / (v - 5))], t))  # p only in q's 1e-30 tail
    rows.append((u, t))
    d = np.full(v, 1e-13); d[0] = 1.0  # noqa: E702
    d /= d.sum()
    rows += [(u, d), (d, d), (np.roll(d, 1), d)]  # near-deterministic draft (and target)
    x = rng.random(v); x /= x.sum()  # noqa: E702
    rows.append((x, x))  # every ratio tied at 1
    y = rng.integers(1, 4, v).astype(float); y /= y.sum()  # noqa: E702
    rows.append((y, np.roll(y, 1)))  # many tied ratios
    a = np.zeros(v); a[::2] = 1.0  # noqa: E702
    rows.append((a / a.sum(), np.roll(a, 1) / a.sum()))  # disjoint supports, q on half the tokens
    p, q = zip(*rows)
    return np.array(p), np.array(q)


def check_without_replacement(p, q, ks):
    for k in ks:
        keep = (q > 0).sum(1) >= k  # without replacement needs K tokens of positive draft mass
        a, b = p[keep], q[keep]
        assert a.shape[0] > 0
        got = ob.optimal_acceptance(torch.from_numpy(a), torch.from_numpy(b), k, "without_replacement")
        ref = np.array([_ref_optimal(x, y, k, "without_replacement") for x, y in zip(a, b)])
        np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=WOR_TOL, err_msg=f"K={k}")


def test_without_replacement_matches_optimal_acceptance_on_random_and_adversarial_rows():
    rng = np.random.default_rng(10)
    for v, scale in ((5, 1.0), (40, 2.5), (300, 2.5), (60, 6.0)):  # scale 6: peaked, near-deterministic q
        check_without_replacement(*lm_rows(rng, 4, v, scale=scale), (2, 3, 4, 5))
    check_without_replacement(*wor_adversarial_rows(), (2, 3, 4))


def test_without_replacement_matches_optimal_acceptance_at_full_vocabulary():
    rng = np.random.default_rng(11)
    p, q = lm_rows(rng, 2, LM_VOCAB)
    t = np.full(LM_VOCAB, 1e-30); t[:6] = [0.3, 0.25, 0.2, 0.15, 0.06, 0.04]  # noqa: E702
    p = np.vstack([p, q[:1]])
    q = np.vstack([q, t / t.sum()])  # a row with a 1e-30 tail holding most of p's mass
    check_without_replacement(p, q, (2, 3, 4))


def test_without_replacement_k3_k4_equal_brute_force_and_lp_at_small_vocabulary():
    """The kernel's α* without replacement (rows sorted once, bucket runs shared by K = 3 and 4),
    numpy and torch, against brute force over all 2^V subsets of the exact draft law (1e-12) and the
    primal LP (HiGHS, 1e-9): random, peaked, tied and adversarial rows at V ≤ 8."""
    rng = np.random.default_rng(30)
    tie = rng.integers(1, 3, (2, 7)).astype(float)
    tie /= tie.sum(1, keepdims=True)
    parts = [lm_rows(rng, 3, 7), lm_rows(rng, 2, 7, scale=6.0), (tie, np.roll(tie, 1, 1)), wor_adversarial_rows(7)]
    p, q = np.vstack([a for a, _ in parts]), np.vstack([b for _, b in parts])
    for k in (3, 4):
        keep = (q > 0).sum(1) >= k
        a, b = p[keep], q[keep]
        batch = LawBatch(a, b)
        got = batch.wrap(batch.optimal_acceptance(k, "without_replacement"))
        got_t = LawBatch(torch.from_numpy(a), torch.from_numpy(b)).optimal_acceptance(k, "without_replacement")
        for i, (x, y) in enumerate(zip(a, b)):
            joint = ob.draft_joint(y, k, "without_replacement")
            brute = ob.optimal_acceptance_brute_force(x, joint).value
            assert abs(got[i] - brute) < 1e-12, (k, i, got[i], brute)
            assert abs(float(got_t[i]) - brute) < 1e-12, (k, i)
            assert abs(ob.optimal_acceptance_lp(x, joint) - brute) < 1e-9


def test_without_replacement_sorted_rows_need_no_second_grid_at_full_vocabulary(monkeypatch):
    """At V = 151,936 on peaked (near-deterministic), tied and LM-like rows the kernel (runs of the
    sorted rows shared by K = 3 and 4, every bucket's horizon known up front) equals the search on
    the rows as given (bincount buckets, the grid lengthened when a bucket needs it) to 1e-12, numpy
    and torch, and builds one quadrature grid per row and K: the peaked rows are those whose
    search as given redoes a row on a longer grid when it takes the bucket ends' grid only (its
    default bounds every bucket's need up front here: one grid per row, the same values)."""
    from otbound.token import _search, _wor

    rng = np.random.default_rng(31)
    p = [lm_rows(rng, 4, LM_VOCAB, scale=6.0), lm_rows(rng, 1, LM_VOCAB)]
    tied = [_softmax(np.round(rng.standard_normal((1, LM_VOCAB)) * 2.5)) for _ in range(2)]
    p, q = np.vstack([a for a, _ in p] + [tied[0]]), np.vstack([b for _, b in p] + [tied[1]])
    grids = []
    make = _wor.ClockMass.__init__

    def counted(self, k, t_end, shared=None):
        grids.append(k)
        make(self, k, t_end, shared)

    monkeypatch.setattr(_wor.ClockMass, "__init__", counted)
    redone = 0
    for k in (3, 4):
        grids.clear()
        upfront = _search.without_replacement(p, q, k, False)[0]  # the grid bound up front: no row redone
        assert len(grids) == p.shape[0]
        grids.clear()
        with monkeypatch.context() as m:
            m.setattr(_search, "_UPFRONT", 0.0)  # the grid of the bucket ends only: lengthened when needed
            ref = _search.without_replacement(p, q, k, False)[0]
        redone += len(grids) - p.shape[0]
        np.testing.assert_allclose(upfront, ref, rtol=0, atol=WOR_TOL, err_msg=f"K={k}")
        grids.clear()
        batch = LawBatch(p, q)
        _ = batch.sorted  # sorted first, as measure_laws does (a single call searches the rows as given)
        got = batch.wrap(batch.optimal_acceptance(k, "without_replacement"))
        assert len(grids) == p.shape[0], "a sorted row was redone on a longer grid"
        np.testing.assert_allclose(got, np.clip(ref, 0, 1), rtol=0, atol=WOR_TOL, err_msg=f"K={k}")
        got_t = ob.optimal_acceptance(torch.from_numpy(p), torch.from_numpy(q), k, "without_replacement")
        np.testing.assert_allclose(got_t.numpy(), got, rtol=0, atol=WOR_TOL)  # renormalised in torch: rounding
    assert redone > 0  # the rows exercise the lengthened grid of the search as given


def test_ratio_order_is_the_stable_order():
    """SortedRows' order (one unsigned sort of ratio bits with the index in the low bits, then an exact
    re-sort of near ties) is numpy's stable argsort of p/q (q = 0 last): ratios 2^-45 apart, exact
    ties, zeros of p and of q, −0."""
    rng = np.random.default_rng(12)
    repaired = 0
    for v in (1, 2, 7, 300, 5000):
        p, q = rng.random((4, v)), rng.random((4, v)) + 0.1
        p[0] = q[0] * (rng.random(v) + 0.5) * (1 + rng.integers(0, 4, v) * 2.0**-45)  # near ties
        q[1, rng.random(v) < 0.3] = 0.0
        p[1, rng.random(v) < 0.3] = 0.0
        p[2] = q[2] * rng.integers(0, 3, v)  # exact ties and p = 0
        if v > 1:
            p[3, ::2] = -0.0  # p[3, 1] > 0 keeps the row a law
        p[1, 0] = q[1, 0] = 1.0  # every row keeps some mass
        p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
        srt = SortedRows(torch.from_numpy(p), torch.from_numpy(q))  # the rows as given, not renormalised
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(q > 0, p / q, np.inf) + 0.0
        order = np.argsort(r, axis=1, kind="stable")
        assert np.array_equal(srt.ps.numpy(), np.take_along_axis(p, order, 1))
        assert np.array_equal(srt.qs.numpy(), np.take_along_axis(q, order, 1))
        assert np.array_equal(srt.r.numpy(), np.take_along_axis(r, order, 1))
        key = np.sort(np.ascontiguousarray(r).view(np.uint64) >> np.uint64(max(1, (v - 1).bit_length())), axis=1)
        with np.errstate(invalid="ignore"):  # inf − inf between q = 0 tokens
            repaired += int((np.diff(np.take_along_axis(r, np.argsort(key, axis=1, kind="stable"), 1)) < 0).any())
    assert repaired  # the near-tie repair was exercised


def test_rrs_wor_paths_serve_every_k():
    """One set of Monte Carlo paths serves K = 3 and 4: each K's estimate is the one a run for that K
    alone gives (the same draws), so each keeps the law checked against enumeration above."""
    rng = np.random.default_rng(13)
    p, q = lm_rows(rng, 3, 500)
    both = VERIFIERS["rrs_wor"].batch_estimate(LawBatch(p, q, seed=7), (2, 3, 4), mc_samples=32)
    for k in (3, 4):
        alone = VERIFIERS["rrs_wor"].batch_estimate(LawBatch(p, q, seed=7), (k,), mc_samples=32)
        assert torch.equal(both[k][0], alone[k][0])
        assert both[k][1] == "monte_carlo"


def test_one_ratio_sort_per_batch_serves_every_quantity(monkeypatch):
    """measure_laws sorts each batch once: α* of every law and K and every verifier read the same
    SortedRows (the optimal verifier's acceptance is α* itself, not a second computation)."""
    from otbound.token import _kernel

    calls = []
    init = _kernel.SortedRows.__init__

    def counting(self, p, q):
        calls.append(p.shape[0])
        init(self, p, q)

    monkeypatch.setattr(_kernel.SortedRows, "__init__", counting)
    rng = np.random.default_rng(15)
    p, q = lm_rows(rng, 5, 300)
    res = measure_laws(p, q, (2, 3, 4), batch_size=3, mc_samples=4)
    assert calls == [3, 2]  # one sort per batch of 3 rows
    assert res["verifiers"]["ot"][3]["acceptance"] == res["optimal"]["with_replacement"][3]


@pytest.mark.parametrize("k", [3, 4])
def test_without_replacement_on_rows_both_laws_truncate(k):
    """Tokens outside both truncated laws (p = q = 0, ratio 0/0) interleaved with tokens only the draft
    truncates (q = 0 < p, ratio inf): the search on the ratio-sorted rows against brute force."""
    from otbound import draft_joint, optimal_acceptance_brute_force

    rng = np.random.default_rng(11 + k)
    for _ in range(6):
        p, q = rng.dirichlet(np.ones(9)), rng.dirichlet(np.ones(9))
        zero_both, zero_q = rng.choice(9, 3, replace=False), rng.integers(0, 9)
        p[zero_both], q[zero_both] = 0.0, 0.0
        if zero_q not in zero_both:
            q[zero_q] = 0.0
        p, q = p / p.sum(), q / q.sum()
        if (q > 0).sum() < k:
            continue
        want = optimal_acceptance_brute_force(p, draft_joint(q, k, "without_replacement")).value
        got = LawBatch(np.stack([p, p]), np.stack([q, q])).optimal_acceptance(k, "without_replacement")
        np.testing.assert_allclose(got.numpy(), [want, want], rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_greedy_alpha_without_the_sort_equals_it_from_the_sorted_rows(k):
    """A lone greedy α* sums min(p, c q) in one pass (no ratio sort); after the batch has sorted its
    rows it reads the prefix sums: the two agree to 1e-12, at V = 151,936 and on adversarial rows."""
    rng = np.random.default_rng(11)
    denormal = np.array([[0.5, 0.5, 5e-324, 0.0], [0.25, 0.25, 0.5, 0.0]])  # q off the top 2: 1/5e-324 = inf
    cases = [lm_rows(rng, 3, LM_VOCAB), adversarial_rows(6), adversarial_rows(12),
             (np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]), denormal)]
    for p, q in cases:
        keep = (q > 0).sum(1) >= k  # rows with K distinct draft tokens
        p, q = p[keep], q[keep]
        lone = LawBatch(p, q)
        direct = lone.optimal_acceptance(k, "greedy")
        assert "sorted" not in lone.__dict__  # no sort was made for it
        shared = LawBatch(p, q)
        _ = shared.sorted
        np.testing.assert_allclose(direct.numpy(), shared.optimal_acceptance(k, "greedy").numpy(), rtol=0, atol=TOL)


# ---------------------------------------------------------------------------------------------
# the measurement's shared passes: near-tie repair, tiny-q rows, greedy split at a tied edge


def _stable_ratio_order(p, q):
    """torch's stable sort of p/q (q = 0 last as +inf, −0 as +0): the order SortedRows must give."""
    return torch.sort(torch.where(q > 0, p / torch.where(q > 0, q, 1.0), torch.inf) + 0.0, dim=1,
                      stable=True).indices


@pytest.mark.parametrize("v", [5000, 70_000])
def test_near_tie_repair_every_path_gives_the_stable_order(v, monkeypatch):
    """The near-tie repair of SortedRows on rows holding few runs of near ties (the runs gathered and
    sorted alone), on rows of a few distinct ratios each broken into near ties by rounding (the
    counting sort by offset within the run) and on rows of a few ratios each perturbed by thousands
    of units of the last place (the key sort), with exact ties, zeros of p and q and −0: the order,
    sorted rows and ratios equal torch's stable sort of p/q exactly; each path is taken by some row (the
    counting sort over all runs at once at V = 5,000, one long run at a time at V = 70,000). The
    counting of rows of few distinct ratios is turned off: such rows never reach the repair."""
    from otbound.token import _kernel

    monkeypatch.setattr(_kernel, "_FEW_RATIOS", 0)

    whole, counted, by_run = [], [], []  # per repaired row: the whole row moved; per counting sort: it applied
    order_fn, buckets_fn, runs_fn = _kernel._near_tie_order, _kernel._near_tie_buckets, _kernel._near_tie_runs

    def near_tie_order(r, descents):
        pos, src = order_fn(r, descents)
        whole.append(pos is None)
        return pos, src

    def near_tie_buckets(bits, starts):
        perm = buckets_fn(bits, starts)
        counted.append(perm is not None)
        return perm

    def near_tie_runs(bits, lo, lens):
        perm = runs_fn(bits, lo, lens)
        by_run.append(perm is not None)
        return perm

    monkeypatch.setattr(_kernel, "_near_tie_order", near_tie_order)
    monkeypatch.setattr(_kernel, "_near_tie_buckets", near_tie_buckets)
    monkeypatch.setattr(_kernel, "_near_tie_runs", near_tie_runs)
    rng = np.random.default_rng(41)
    rows_p, rows_q = [], []
    q = rng.random(v) + 0.1
    p = q * (rng.random(v) + 0.5)  # distinct ratios ...
    near = rng.choice(v, 40, replace=False)
    p[near] = q[near] * 0.75 * (1 + rng.integers(0, 4, 40) * 2.0**-44)  # ... and 40 near ties of 0.75
    rows_p.append(p), rows_q.append(q)
    z_p, z_q = np.round(rng.standard_normal((2, v)) * 2.5)  # rounded logits: few ratios, near ties
    rows_p.append(_softmax(z_p)), rows_q.append(_softmax(z_q))
    p, q = _softmax(z_p), _softmax(z_q)
    q[rng.random(v) < 0.2] = 0.0
    p[rng.random(v) < 0.2] = 0.0
    p[::7] = -0.0
    rows_p.append(p), rows_q.append(q)
    q = rng.random(v) + 0.1
    p = q * rng.integers(1, 6, v) * (1 + rng.integers(0, 4, v) * 2.0**-40)  # 5 ratios, spread ~2^12 ulps
    rows_p.append(p), rows_q.append(q)
    p, q = np.array(rows_p), np.array(rows_q)
    p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
    pt, qt = torch.from_numpy(p), torch.from_numpy(q)
    srt = SortedRows(pt, qt)
    want = _stable_ratio_order(pt, qt)
    assert torch.equal(srt.order, want)
    assert torch.equal(srt.ps, torch.gather(pt, 1, want)) and torch.equal(srt.qs, torch.gather(qt, 1, want))
    assert torch.equal(srt.r, torch.gather(torch.where(qt > 0, pt / torch.where(qt > 0, qt, 1.0), torch.inf) + 0.0,
                                           1, want))
    assert not all(whole)  # the local repair
    # the counting sort: over all runs at once at V = 5,000, one run at a time at V = 70,000 (few long runs)
    assert any(counted) if v == 5000 else any(by_run)
    assert sum(whole) > sum(counted) + sum(by_run)  # and the key sort


def _few_ratio_rows(rng, v):
    """Rows of few distinct ratios: rounded logits, the same truncated (0/0, x/0, 0/x, −0), exactly
    256 and 257 distinct ratios, 40 near ties 2^-44 apart, 1,000 distinct ratios, 0/0 and −0 hidden
    from the sample of the row (a tied row there), one ratio, and one ratio with 0/0 and −0 hidden
    likewise."""
    from otbound.token import _kernel

    z_p, z_q = np.round(rng.standard_normal((2, v)) * 2.5)
    rows_p, rows_q = [_softmax(z_p)], [_softmax(z_q)]
    p, q = _softmax(z_p), _softmax(z_q)
    q[rng.random(v) < 0.3] = 0.0
    p[rng.random(v) < 0.3] = 0.0
    p[::7] = -0.0
    rows_p.append(p), rows_q.append(q)
    q = 2.0 ** -rng.integers(1, 30, v)  # q·ratio and its division by q exact: equal ratios are equal
    for d in (256, 257):
        rows_p.append(q * (1.0 + rng.permutation(np.arange(v) % d))), rows_q.append(q)
    ratio = 0.75 * (1 + rng.integers(0, 40, v) * 2.0**-44)
    rows_p.append(q * ratio), rows_q.append(q)
    ratio = np.full(v, 2.0)
    hidden = np.arange(v) % max(1, v // _kernel._FEW_SAMPLE) > 0  # off the sample's grid
    ratio[hidden] = 1.0 + np.flatnonzero(hidden) % 1000 / 1000
    zero_q, minus_zero = hidden & (np.arange(v) % 97 == 1), hidden & (np.arange(v) % 89 == 3)
    for r in (ratio, 2.0):  # 0/0 and −0 off the sample's grid: found by the full sort
        p_hidden, q_hidden = q * r, q.copy()
        p_hidden[zero_q], q_hidden[zero_q] = 0.0, 0.0
        p_hidden[minus_zero] = -0.0
        rows_p.append(p_hidden), rows_q.append(q_hidden)
    rows_p.insert(-1, q.copy()), rows_q.insert(-1, q)
    return np.array(rows_p), np.array(rows_q)


def test_few_ratio_rows_are_counted_into_the_stable_order(monkeypatch):
    """Rows of at most 256 distinct ratios are sorted by their ranks (a hashed table, then a radix
    argsort): the order, sorted rows and ratios equal numpy's stable argsort of p/q (q = 0 last, −0 as
    +0) exactly; the rows of more ratios than that (257 in all, or more hidden from the sample), and
    every row where no multiplier keeps the ratios apart, are left to the key sort, with the same
    result; the counting itself equals numpy's stable argsort of the bit patterns, made _ratio's
    in place where they held 0/0 or −0 (the sorted patterns with them); every array, prefix sums
    included, equals the accelerator's batched path bit for bit."""
    from otbound._backend import accelerator_paths
    from otbound.token import _kernel

    few = _kernel._few_ratio_order
    counted, odd = [], []

    def spy(bits, ordered, scratch, rank):
        got = few(bits, ordered, scratch, rank)
        counted.append(got[0] is not None)
        odd.append(got[1])
        if got[0] is not None:
            np.testing.assert_array_equal(got[0], np.argsort(bits, kind="stable"))
            np.testing.assert_array_equal(ordered, np.sort(bits))
        return got

    monkeypatch.setattr(_kernel, "_few_ratio_order", spy)
    rng = np.random.default_rng(43)
    v = 20_000
    p, q = _few_ratio_rows(rng, v)  # the rows as given, not renormalised
    grid = slice(None, None, max(1, v // _kernel._FEW_SAMPLE))
    assert (q[1, grid] == 0).any() and (q[-3:, grid] > 0).all() and (p[-3:, grid] > 0).all()  # seen / not
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(q > 0, p / q, np.inf) + 0.0
    order = np.argsort(r, axis=1, kind="stable")
    for multipliers in (_kernel._HASH_MULTIPLIERS, (np.uint64(1),)):  # 1: the top bits, near ties collide
        monkeypatch.setattr(_kernel, "_HASH_MULTIPLIERS", multipliers)
        counted.clear(), odd.clear()
        srt = SortedRows(torch.from_numpy(p), torch.from_numpy(q))
        np.testing.assert_array_equal(srt.order.numpy(), order)
        for got, want in ((srt.ps, p), (srt.qs, q), (srt.r, r)):  # bit for bit: −0 is not +0
            np.testing.assert_array_equal(got.numpy().view(np.int64), np.take_along_axis(want, order, 1).view(np.int64))
        with accelerator_paths():  # the batched path of an accelerator: the same arrays, bit for bit
            dev = SortedRows(torch.from_numpy(p), torch.from_numpy(q))
        for name in ("order", "ps", "qs", "r", "pc", "qc", "_prs", "_qrs"):
            assert torch.equal(getattr(srt, name).view(torch.int64), getattr(dev, name).view(torch.int64)), name
        if len(multipliers) > 1:
            assert counted == [True, True, True, False, True, False, True, True]
        else:
            assert counted == [False, False, False, False, False, False, True, True]  # 0, 2, inf: apart
        assert odd == [False, True, False, False, False, True, False, True]


def test_tiny_q_rows_are_the_rows_with_a_positive_q_below_the_clock_floor():
    """The rows holding 0 < q < CLOCK_FLOOR found from the rows' minima equal the full test, on rows
    with zeros only, a denormal q, a q just above the floor and none, numpy and torch input (whose
    minima come from the check: equal to those of the renormalised rows)."""
    from otbound.token import _wor
    from otbound.token._kernel import _tiny_q_rows

    q = np.full((5, 6), 1 / 6)
    q[1, :2] = 0.0  # zeros only
    q[2, 0], q[2, 1] = 0.0, 5e-324  # a zero and a denormal
    q[3, 0] = 2 * _wor.CLOCK_FLOOR  # above the floor
    q[4, 5] = 0.5 * _wor.CLOCK_FLOOR  # below it, no zero
    q /= q.sum(1, keepdims=True)
    q[0] *= 1 + 3e-7  # renormalised by the check
    for batch in (LawBatch(np.full((5, 6), 1 / 6), q), LawBatch(torch.full((5, 6), 1 / 6), torch.from_numpy(q))):
        assert torch.equal(batch.q_min, batch.q.amin(1))  # torch input: the minima of the check's pass
        want = ((batch.q > 0) & (batch.q < _wor.CLOCK_FLOOR)).any(1)
        assert want.tolist() == [False, False, True, False, True]
        assert torch.equal(_tiny_q_rows(batch), want)


def test_greedy_split_at_a_tied_edge_takes_the_lowest_indices():
    """A row whose q is tied across the edge of the top 8 (the 8th and 9th largest equal), at
    V = 151,936: the batched split's tokens are those of top_tokens (decreasing q, ties to the lower
    index), at m = 3 and m = 8."""
    from otbound.token._kernel import greedy_split_rows, top_tokens

    rng = np.random.default_rng(43)
    p, q = lm_rows(rng, 3, LM_VOCAB)
    q[0, rng.choice(LM_VOCAB, 30, replace=False)] = 0.01  # 30 tokens tied at the 8th largest value
    q[1, [5, 70_000, 9]] = q[1].max()  # ties above the edge only
    q /= q.sum(1, keepdims=True)
    batch = LawBatch(p, q)
    top9 = torch.topk(batch.q, 9, dim=1).values
    assert bool(top9[0, 8] == top9[0, 7]) and not bool(top9[1, 8] == top9[1, 7])  # row 0 is cut at the edge
    idx = greedy_split_rows(batch, 3)[0]
    for i in range(3):
        assert idx[i].tolist() == top_tokens(batch.q[i].numpy(), 8)[:3].tolist()
    assert greedy_split_rows(batch, 8)[0].tolist() == [top_tokens(batch.q[i].numpy(), 8).tolist() for i in range(3)]


# ---------------------------------------------------------------------------------------------
# the measurement's second round of speed-ups: the same values by cheaper passes


def test_crossing_drafts_on_the_cpu_are_the_torch_comparison():
    """The first drafts whose μ_3 crosses r_next (``h_2 > gap · S_2``) found by numpy on the CPU are
    exactly those of torch's comparison, on S_2 with zeros, equal values, values at the boundary
    (``gap · S_2 = h_2`` exactly: not crossing) and next to it, and an infinite gap (r_next past the
    last ratio: ``inf · 0`` is NaN, not crossing)."""
    from otbound.token.verifiers._rrs import _crossing

    rng = np.random.default_rng(7)
    h2 = 0.375
    s2 = np.concatenate([rng.random(1000), [0.0, 0.0, 0.5, 0.5, np.nextafter(0.5, 0), np.nextafter(0.5, 1)]])
    rng.shuffle(s2)
    s2_t = torch.from_numpy(s2)
    for gap in (0.75, 0.3, math.inf, 1e-300, 0.0):
        h_t, g_t = torch.tensor([h2], dtype=torch.float64), torch.tensor([gap], dtype=torch.float64)
        got = _crossing(h_t, g_t, s2_t)
        want = torch.nonzero(h_t > g_t * s2_t)[:, 0]
        assert got.dtype == torch.int64 and torch.equal(got, want)
    # gap 0.75: S_2 = 0.5 lies exactly on the boundary (0.75 · 0.5 = 0.375), the float below it crosses
    got = _crossing(torch.tensor([h2], dtype=torch.float64), torch.tensor([0.75], dtype=torch.float64), s2_t)
    assert set(s2[got.numpy()]) >= {np.nextafter(0.5, 0)} and 0.5 not in set(s2[got.numpy()])


def test_open_columns_list_each_rows_open_blocks_then_its_first_column():
    """The open blocks' columns of every row at once: per row its open blocks' columns in increasing
    order (those past m − 1 of a partial last block replaced), then its first open block's columns
    repeated,
    on rows with one, several and every block open, the partial last block open or not; and the
    first least f over them picks the column that the row's own open columns give."""
    from otbound.token._kernel import _open_columns

    width, m = 4, 18  # blocks [0, 4), [4, 8), [8, 12), [12, 16), [16, 18) of a partial last block
    open_ = torch.tensor([[False, True, False, False, False],
                          [True, False, True, False, True],
                          [True, True, True, True, True],
                          [False, False, False, False, True]])
    cols = _open_columns(open_, width, m)
    assert cols.shape == (4, 5 * width) and cols.dtype == torch.int64
    for i in range(4):
        own = [b * width + o for b in torch.nonzero(open_[i])[:, 0].tolist() for o in range(width)
               if b * width + o < m]
        row = cols[i].tolist()
        assert row[: len(own)] == own and set(row[len(own):]) <= set(own[:width])
    # f with its least value tied at two columns of a row: the first of them, as a row's own evaluation
    f_full = torch.zeros((4, m), dtype=torch.float64)
    f_full[:, [5, 9, 17]] = -1.0
    best, at = f_full.gather(1, cols).min(1)
    got = cols.gather(1, at[:, None])[:, 0]
    for i in range(4):
        own = cols[i].unique()  # sorted: the row's own columns
        j = int(torch.argmin(f_full[i, own]))  # the first least over the increasing own columns
        assert float(best[i]) == float(f_full[i, own].min()) and int(got[i]) == int(own[j])


@pytest.mark.parametrize("runs", [3, 40])
def test_near_tie_counting_run_by_run_is_the_stable_order(runs):
    """The near ties of a few long runs counted one run at a time (the other positions left in place)
    give the stable sort by ratio (numpy's stable argsort of the bit patterns), as does the counting
    over all runs at once; a run wider than the counting sort takes is refused by both."""
    from otbound.token import _kernel

    rng = np.random.default_rng(7 + runs)
    v = 20_000
    cuts = np.sort(rng.choice(np.arange(1, v - 10), runs - 1, replace=False))
    starts = np.concatenate([[0], cuts])  # (R,) run starts
    lens = np.diff(starts, append=v)
    base = (np.arange(runs, dtype=np.uint64) + np.uint64(3)) << np.uint64(30)  # distinct truncated ratios
    bits = np.repeat(base, lens) + rng.integers(0, _kernel._NEAR_SPREAD, v).astype(np.uint64)  # (V,)
    held = np.arange(runs) % 3 != 1  # the runs holding near ties; the others already in order
    for r in np.flatnonzero(~held):
        bits[starts[r] : starts[r] + lens[r]] = np.sort(bits[starts[r] : starts[r] + lens[r]])
    want = np.argsort(bits, kind="stable")
    np.testing.assert_array_equal(_kernel._near_tie_runs(bits, starts[held], lens[held]), want)
    np.testing.assert_array_equal(_kernel._near_tie_buckets(bits, starts), want)
    wide = bits.copy()
    wide[-2:] = base[-1] + np.uint64(_kernel._NEAR_SPREAD), base[-1]  # the last run spans one offset too many
    assert _kernel._near_tie_runs(wide, starts, lens) is None
    assert _kernel._near_tie_buckets(wide, starts) is None


def test_kseq_searched_for_several_k_at_once_equals_one_k_at_a_time():
    """K-SEQ's batch_estimate searches ρ* for every K asked at once ((K, row) pairs in one search):
    on random LM rows (V = 3,000), tied rows (rounded logits), adversarial rows (zeros in p and q,
    disjoint supports, a 1e-30 tail) it gives each K's values of a fresh batch asked one K at a time
    bit for bit, and the per-row reference (K-SEQ's acceptance with its coincidence term) to 1e-12."""
    rng = np.random.default_rng(5)
    z = np.round(rng.normal(size=(2, 4, 3_000)) * 2.5)
    cases = [lm_rows(rng, 4, 3_000), (_softmax(z[0]), _softmax(z[1])), adversarial_rows(6), adversarial_rows(12)]
    ks = [1, 2, 3, 4, 6]
    for p, q in cases:
        joint = VERIFIERS["kseq"].batch_estimate(LawBatch(p, q), ks)
        for k in ks:
            alone = VERIFIERS["kseq"].batch_acceptance(LawBatch(p, q), k)
            values, method = joint[k]
            assert method == "exact"
            assert torch.equal(values, alone.clamp(0.0, 1.0)), f"K={k}"
            np.testing.assert_allclose(values.numpy(), per_row("kseq", p, q, k), rtol=0, atol=TOL, err_msg=f"K={k}")
