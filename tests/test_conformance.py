"""The conformance kit: the kit checks the package's verifiers, the package's exact laws
check the kit, and three defects found in public code are caught with minimal counterexamples.

Tolerances: exact-mode laws are float64 sums over draft tuples and branches, compared to 1e-12;
sample mode is a G-test at family-wise level 1e-3 with power ≥ 0.99 against a 0.01 total-variation
distortion (fixed seeds, so every run is the same).
"""

import json
import re

import numpy as np
import pytest
import scipy.stats

import otbound.conformance as oc
from otbound import BLOCK_VERIFIERS, VERIFIERS, InvalidInputError, greedy_split, optimal_acceptance
from otbound.conformance import examples as ex
from otbound.conformance.__main__ import main
from otbound.token.verifiers import (
    BestWithoutReplacementVerifier,
    OptimalWithoutReplacementVerifier,
    kseq_rho,
    truncated_coupling,
)

EXACT = 1e-12
K = 2
V = 3


# -- the kit on the package's token verifiers ---------------------------------------------------


@pytest.mark.parametrize("name", list(VERIFIERS))
def test_package_token_laws_pass_exact_mode(name):
    """The package's exact conditional laws through the kit: lossless to 1e-12, α ≤ α*, and the
    kit's α equals the package's own exact acceptance."""
    ver = VERIFIERS[name]
    res = oc.check_token_verifier(
        oc.token_law_adapter(ver), vocab_size=V, num_drafts=K, sampling=ver.sampling, instances=12
    )
    assert res.passed and res.counterexample is None
    assert res.lossless_error < EXACT
    assert np.all(res.acceptance <= res.optimal + 1e-9)
    insts = oc.token_instances(V, K, ver.sampling, 12, 0)
    own = np.array([ver.acceptance(t.p, t.q, K) for t in insts])
    assert np.abs(res.acceptance - own).max() < EXACT
    # these attain their law's bound (an LP plan, to 1e-9); the truncation of ot_wor_top holds all of V = 3
    if name in ("ot", "greedy", "spechub", "ot_wor_top", "ot_wor"):
        assert np.abs(res.acceptance - res.optimal).max() < 1e-9


@pytest.mark.parametrize("name", list(VERIFIERS))
def test_package_token_samplers_pass_sample_mode(name):
    """The package's samplers as black boxes: no G-test rejects, at power ≥ 0.99 per instance."""
    ver = VERIFIERS[name]
    res = oc.check_token_verifier(
        oc.token_sample_adapter(ver),
        vocab_size=V,
        num_drafts=K,
        sampling=ver.sampling,
        instances=3,
        mode="sample",
        batch=True,
        seed=1,
    )
    assert res.passed, res.summary()
    assert res.power >= 0.99
    assert all(r.samples >= 500 and r.p_value >= res.level_alpha for r in res.instances)


@pytest.mark.parametrize("name", ["ot_wor_top", "ot_wor_iid", "ot_wor"])
def test_optimal_verifiers_without_replacement_pass_both_modes_off_their_exact_cases(name):
    """The optimal verifiers without replacement at V = 6, K = 3 with a top-m truncation smaller than
    the support (m = K + 1 = 4: ``max_sets`` 15), where neither is the optimum: the kit finds their
    exact laws lossless (1e-12) with the package's own exact acceptance (ot_wor_iid's by enumeration
    at K = 3), at most α* without replacement and, for ot_wor, at least both parts' floors; their
    samplers pass sample mode."""
    ver = {"ot_wor_top": OptimalWithoutReplacementVerifier(max_sets=15), "ot_wor_iid": VERIFIERS["ot_wor_iid"],
           "ot_wor": BestWithoutReplacementVerifier(max_sets=15)}[name]
    res = oc.check_token_verifier(oc.token_law_adapter(ver), vocab_size=6, num_drafts=3, sampling=ver.sampling,
                                  instances=6, seed=4)
    assert res.passed and res.lossless_error < EXACT
    assert np.all(res.acceptance <= res.optimal + 1e-9)
    insts = oc.token_instances(6, 3, ver.sampling, 6, 4)
    own = np.array([ver.acceptance(t.p, t.q, 3) for t in insts])
    assert np.abs(res.acceptance - own).max() < EXACT
    if name != "ot_wor_iid":
        assert any(truncated_coupling(t.p, t.q, 3, 15).top.size < np.count_nonzero(t.q) for t in insts)
    if name == "ot_wor":
        top = np.array([OptimalWithoutReplacementVerifier(max_sets=15).acceptance(t.p, t.q, 3) for t in insts])
        assert np.all(res.acceptance >= top - 1e-12)
        assert np.all(res.acceptance >= [optimal_acceptance(t.p, t.q, 3) - 1e-12 for t in insts])
    sampled = oc.check_token_verifier(oc.token_sample_adapter(ver), vocab_size=6, num_drafts=3,
                                      sampling=ver.sampling, instances=3, mode="sample", batch=True, seed=5)
    assert sampled.passed, sampled.summary()
    assert sampled.power >= 0.99


def _residual(a, b):
    """``norm((a − b)_+)``, ``a`` when that is empty: the re-implementations' own, independent of the
    package's ``residual``."""
    d = np.maximum(a - b, 0.0)
    s = d.sum()
    return d / s if s > 0 else a


def _rrs_wor(p, q, drafts, coin, draw):
    cur_p, cur_q = np.array(p), np.array(q)
    for x in drafts:
        if coin(min(1.0, cur_p[x] / cur_q[x])):
            return int(x)
        cur_p = _residual(cur_p, cur_q)
        cur_q[x] = 0.0
        cur_q = cur_q / cur_q.sum() if cur_q.sum() > 0 else cur_q
    return draw(cur_p)


def _kseq(p, q, drafts, coin, draw):
    rho = kseq_rho(p, q, len(drafts))
    low = np.minimum(p / rho, q)
    beta = low.sum()
    gamma = (1.0 - (1.0 - beta) ** len(drafts)) / beta if beta > 0 else 0.0
    for x in drafts:
        if coin(min(1.0, p[x] / (rho * q[x]))):
            return int(x)
    return draw(_residual(p, gamma * low))


def _greedy(p, q, drafts, coin, draw):
    g, qp = greedy_split(q, len(drafts))
    x = drafts[-1]
    if coin(min(1.0, p[x] / qp[x])):
        return int(x)
    base = qp.copy()
    base[g] = 0.0
    return draw(_residual(p, base))


@pytest.mark.parametrize(
    "name,mine",
    [
        ("nss", lambda p, q, d, coin, draw: draw(p)),
        ("rrs", ex.rrs),
        ("rrs_wor", _rrs_wor),
        ("kseq", _kseq),
        ("greedy", _greedy),
    ],
)
def test_kit_enumeration_reproduces_package_conditional_laws(name, mine):
    """Coin/draw re-implementations enumerated by the kit give the package's exact law for every
    draft tuple of every instance (the package's laws checking the kit), and they pass the kit."""
    ver = VERIFIERS[name]
    for t in oc.token_instances(4, 3, ver.sampling, 12, 3):
        weights, tuples = oc._token.support_tuples(t.q, 3, ver.sampling)
        for tup in tuples:
            law = np.zeros(4)
            for prob, y in oc.enumerate_outcomes(lambda coin, draw, t=t, tup=tup: mine(t.p, t.q, tup, coin, draw)):
                law[y] += prob
            assert np.abs(law - ver.conditional_law(t.p, t.q, tup)).max() < EXACT, (t.label, tup)
    assert oc.check_token_verifier(mine, vocab_size=4, num_drafts=3, sampling=ver.sampling, instances=12, seed=3).passed


# -- the kit on the package's block verifiers --------------------------------------------------

BLOCK_LOSSLESS = [  # K i.i.d. draft blocks; univer (its own tree law) has its own tests below
    n for n, v in BLOCK_VERIFIERS.items() if v.lossless and v.sampling == "with_replacement"
]


@pytest.mark.parametrize("name", BLOCK_LOSSLESS)
def test_package_block_verifiers_pass_exact_mode(name):
    """Each block verifier's own walk, branch by branch: lossless, E[τ] equal to the package's exact
    acceptance E[τ], never above U_causal (attained by causal_optimal)."""
    ver = BLOCK_VERIFIERS[name]
    res = oc.check_block_verifier(oc.block_adapter(ver), vocab_size=2, num_drafts=2, block_len=2, instances=8)
    assert res.passed and res.lossless_error < EXACT
    for t, r in zip(oc.block_instances(2, 2, 8, 0), res.instances, strict=True):
        tg, dr = t.models()
        assert abs(r.acceptance - ver.acceptance(tg, dr, vocab_size=2, num_drafts=2, block_len=2)) < EXACT
        assert r.acceptance <= r.optimal + 1e-9 and r.optimal <= r.joint_bound + 1e-9
    if name == "causal_optimal":
        assert np.abs(res.acceptance - res.optimal).max() < 1e-8


def univer_instances():
    """The kit's V = 3, L = 2 family where UniVer's m = 2 tree exists (≥ 2 drafted tokens of positive
    probability at every expanded prefix), and the first one where it does not."""
    insts = oc.block_instances(3, 2, 12, 0)
    ok = [t for t in insts if all(np.count_nonzero(q > 0) >= 2 for pre, q in t.draft.items() if len(pre) < 2)]
    return ok, next(t for t in insts if t not in ok)


def test_univer_passes_exact_mode_on_its_own_tree_law():
    """UniVer through the kit with ``drafting``: every tree of its law enumerated, branch by branch;
    lossless, E[τ] equal to the package's exact value and never above U_causal of its tree law (LP
    tolerance 1e-9), on the adversarial family (near-deterministic laws included) and random models."""
    ver = BLOCK_VERIFIERS["univer"]
    ok, refused = univer_instances()
    assert len(ok) >= 10 and "near-deterministic models" in [t.label for t in ok]
    res = oc.check_block_verifier(
        oc.block_adapter(ver), vocab_size=3, num_drafts=2, block_len=2, instances=ok, drafting=ver
    )
    assert res.passed and res.lossless_error < EXACT and res.sampling == "univer_tree"
    for t, r in zip(ok, res.instances, strict=True):
        tg, dr = t.models()
        assert abs(r.acceptance - ver.acceptance(tg, dr, vocab_size=3, num_drafts=2, block_len=2)) < EXACT
        assert r.acceptance <= r.optimal + 1e-9 and r.optimal <= r.joint_bound + 1e-9
    assert max(r.optimal - r.acceptance for r in res.instances) > 1e-3  # strictly below its U_causal at L = 2
    with pytest.raises(InvalidInputError, match="at least 2 draft tokens"):
        oc.check_block_verifier(oc.block_adapter(ver), vocab_size=3, num_drafts=2, block_len=2, instances=[refused],
                                drafting=ver)
    # without drafting the kit hands it K i.i.d. blocks, which are not UniVer trees
    with pytest.raises(InvalidInputError, match="UniVer"):
        oc.check_block_verifier(oc.block_adapter(ver), vocab_size=3, num_drafts=2, block_len=2, instances=ok[:1])


def test_univer_passes_sample_mode_on_its_own_tree_law():
    """The package's UniVer sampler on trees drawn by its own ``draw_drafts``: G-test over V^(L+1) = 27
    cells at the kit's power (≥ 0.99 against a 1% distortion), one random instance."""
    ver = BLOCK_VERIFIERS["univer"]
    ok, _ = univer_instances()
    res = oc.check_block_verifier(
        oc.block_sample_adapter(ver), vocab_size=3, num_drafts=2, block_len=2, instances=ok[-1:], mode="sample",
        batch=True, drafting=ver,
    )
    assert res.passed and res.power >= 0.99


def test_spectr_gbv_is_reported_lossy_with_a_minimal_counterexample():
    ver = BLOCK_VERIFIERS["spectr_gbv"]
    res = oc.check_block_verifier(oc.block_adapter(ver), vocab_size=2, num_drafts=2, block_len=2, instances=8)
    assert not res.passed and res.lossless_error > 1e-3
    assert res.declared_lossless is False  # the registry declares it lossy: the summary says they agree
    assert "declared lossless: no (agrees with this check)" in res.summary()
    c = res.counterexample
    # the smallest: one draft of two tokens on Sun et al.'s context-free toy p = (1/3, 2/3), q = (2/3, 1/3)
    assert (c.vocab_size, c.num_drafts, c.block_len) == (2, 1, 2)
    assert np.allclose(c.target[()], [1 / 3, 2 / 3]) and np.allclose(c.draft[()], [2 / 3, 1 / 3])
    assert c.lossless_error == pytest.approx(2 / 27, abs=EXACT)
    inst = oc.BlockInstance("cex", c.vocab_size, c.block_len, c.target, c.draft)
    tg, dr = inst.models()
    own = ver.lossless_error(tg, dr, vocab_size=c.vocab_size, num_drafts=c.num_drafts, block_len=c.block_len)
    assert abs(own - c.lossless_error) < EXACT  # the package's exact law agrees with the kit's
    worst_seq, out, want = c.worst
    assert abs(out - want) == pytest.approx(c.lossless_error, abs=EXACT)
    # its recovered sub-block test is not even a probability on these instances (the package clips it)
    with pytest.raises(oc.ConformanceError, match="outside"):
        oc.check_block_verifier(oc.block_adapter(ver, clip=False), vocab_size=2, num_drafts=2, block_len=2, instances=8)


def test_hsd_is_reported_lossy_with_the_same_minimal_counterexample():
    """HSD (2601.05724) fails on the same smallest instance as SpecTr-GBV: Sun et al.'s toy, K = 1, L = 2,
    where it emits (1, 0, 1) with probability 2/9 against the target's 4/27."""
    ver = BLOCK_VERIFIERS["hsd"]
    res = oc.check_block_verifier(oc.block_adapter(ver), vocab_size=2, num_drafts=2, block_len=2, instances=8)
    assert not res.passed and res.declared_lossless is False
    c = res.counterexample
    assert (c.vocab_size, c.num_drafts, c.block_len) == (2, 1, 2)
    assert np.allclose(c.target[()], [1 / 3, 2 / 3]) and np.allclose(c.draft[()], [2 / 3, 1 / 3])
    assert c.lossless_error == pytest.approx(2 / 27, abs=EXACT)
    worst_seq, out, want = c.worst
    assert worst_seq == (1, 0, 1)
    assert out == pytest.approx(2 / 9, abs=EXACT) and want == pytest.approx(4 / 27, abs=EXACT)
    tg, dr = oc.BlockInstance("cex", c.vocab_size, c.block_len, c.target, c.draft).models()
    assert abs(ver.lossless_error(tg, dr, vocab_size=2, num_drafts=1, block_len=2) - c.lossless_error) < EXACT


def test_block_sample_mode_passes_the_package_sampler():
    res = oc.check_block_verifier(
        oc.block_sample_adapter(BLOCK_VERIFIERS["block"]),
        vocab_size=2,
        num_drafts=1,
        block_len=2,
        instances=2,
        mode="sample",
        batch=True,
    )
    assert res.passed and res.power >= 0.99


# -- three defects found in public code -------------------------------------------------------


def test_skipped_repeat_rrs_reproduces_the_issue_marginal():
    p, q = np.array([0.1, 0.4, 0.5]), np.array([0.6, 0.2, 0.2])
    res = oc.check_token_verifier(ex.rrs_skip_repeats, vocab_size=3, num_drafts=2, instances=[(p, q)], shrink=False)
    assert not res.passed
    assert np.abs(res.counterexample.output_law - [0.1, 0.42, 0.48]).max() < EXACT
    assert oc.check_token_verifier(ex.rrs, vocab_size=3, num_drafts=2, instances=[(p, q)]).lossless_error < EXACT


def test_skipped_repeat_rrs_minimal_counterexample_and_inflated_acceptance():
    res = oc.check_token_verifier(ex.rrs_skip_repeats, vocab_size=4, num_drafts=3)
    assert not res.passed
    c = res.counterexample
    assert (c.vocab_size, c.num_drafts) == (3, 2)  # one draft cannot repeat; on two tokens the skipped round is a no-op
    assert oc.check_token_verifier(ex.rrs_skip_repeats, vocab_size=2, num_drafts=3).passed
    assert oc.check_token_verifier(ex.rrs_skip_repeats, vocab_size=4, num_drafts=1).passed
    assert np.any(res.acceptance > res.optimal + 1e-3)  # above α*: only a lossy verifier can


def test_skipped_repeat_rrs_caught_in_sample_mode():
    """The same defect as a black box (coin/draw answered by a generator): the G-test rejects it
    (a 0.02 total-variation distortion), while correct RRS passes on the same instance and seed."""
    p, q = np.array([0.1, 0.4, 0.5]), np.array([0.6, 0.2, 0.2])
    bad = oc.check_token_verifier(
        oc.as_sampler(ex.rrs_skip_repeats), vocab_size=3, num_drafts=2, instances=[(p, q)], mode="sample"
    )
    good = oc.check_token_verifier(oc.as_sampler(ex.rrs), vocab_size=3, num_drafts=2, instances=[(p, q)], mode="sample")
    assert not bad.passed and good.passed
    assert bad.power >= 0.99 and bad.instances[0].total_variation == pytest.approx(0.02, abs=0.004)


def test_shared_uniform_block_verification_is_lossy():
    res = oc.check_block_verifier(ex.block_shared_uniform, vocab_size=3, num_drafts=1, block_len=3, instances=8)
    assert not res.passed
    c = res.counterexample
    assert (c.vocab_size, c.num_drafts, c.block_len) == (2, 1, 2)  # one level has nothing to share
    assert oc.check_block_verifier(ex.block_shared_uniform, vocab_size=3, num_drafts=1, block_len=1, instances=8).passed
    assert np.all(res.acceptance <= res.optimal + 1e-9)  # lossy yet below U_causal here: the bound cannot catch it


def test_cumulative_product_block_verification_is_lossy_and_beats_the_bound():
    res = oc.check_block_verifier(ex.block_cumulative_products, vocab_size=3, num_drafts=1, block_len=3, instances=8)
    assert not res.passed
    assert np.any(res.acceptance > res.optimal + 0.1)  # E[τ] above U_causal
    c = res.counterexample
    assert (c.vocab_size, c.num_drafts, c.block_len) == (2, 1, 2)  # at L = 1 it is speculative sampling


def test_stay_above_matches_monte_carlo():
    rng = np.random.default_rng(0)
    a = [-0.3, 0.5, 0.2, 1.4]
    s = np.cumsum(rng.exponential(size=(400_000, 4)), axis=1)
    mc = [(s[:, : i + 1] >= np.array(a[: i + 1])).all(axis=1).mean() for i in range(4)]
    assert np.abs(np.array(ex.stay_above(a)) - mc).max() < 5 * 0.5 / np.sqrt(400_000)
    assert ex.stay_above([np.log(2.0)]) == pytest.approx([0.5], abs=1e-15)  # P(U ≤ 1/2)


# -- the enumerator and the statistics ---------------------------------------------------------


def test_enumerate_outcomes_is_exact():
    def f(coin, draw):
        if coin(0.3):
            return draw([0.2, 0.0, 0.8])
        return 10 + int(coin(1.0)) + int(coin(0.0))

    out = {}
    for prob, y in oc.enumerate_outcomes(f):
        out[y] = out.get(y, 0.0) + prob
    assert out == pytest.approx({0: 0.06, 2: 0.24, 11: 0.7}, abs=1e-16)


@pytest.mark.parametrize(
    "fn,match",
    [
        (lambda coin, draw: coin(1.5), "outside"),
        (lambda coin, draw: draw([0.5, 0.6]), "summing"),
        (lambda coin, draw: draw([0.5, -0.1, 0.6]), "negative"),
        (lambda coin, draw: sum(coin(0.5) for _ in range(20)), "branches"),
    ],
)
def test_enumerate_outcomes_contract_errors(fn, match):
    with pytest.raises(oc.ConformanceError, match=match):
        oc.enumerate_outcomes(fn, max_branches=1000)


def test_nondeterministic_verifier_is_refused():
    calls = iter(range(100))

    def f(coin, draw):
        return coin(0.5) if next(calls) % 2 == 0 else draw([0.5, 0.5])

    with pytest.raises(oc.ConformanceError, match="not deterministic"):
        oc.enumerate_outcomes(f)


def test_bad_outputs_and_arguments():
    with pytest.raises(oc.ConformanceError, match="outside the vocabulary"):
        oc.check_token_verifier(lambda p, q, d, coin, draw: 7, vocab_size=3, num_drafts=1, instances=1)
    with pytest.raises(oc.ConformanceError, match="not a prefix"):
        oc.check_block_verifier(
            lambda t, d, b, coin, draw: [1 - b[0][0], 0], vocab_size=2, num_drafts=1, block_len=2, instances=1
        )
    with pytest.raises(InvalidInputError, match="mode"):
        oc.check_token_verifier(ex.rrs, vocab_size=3, num_drafts=2, mode="fast")
    with pytest.raises(InvalidInputError, match="vocab_size"):
        oc.check_token_verifier(ex.rrs, vocab_size=1, num_drafts=2)
    with pytest.raises(InvalidInputError, match="expected vocab_size"):
        oc.check_token_verifier(ex.rrs, vocab_size=3, num_drafts=2, instances=[([0.5, 0.5], [0.5, 0.5])])
    with pytest.raises(InvalidInputError, match="callable"):
        oc.check_token_verifier("rrs", vocab_size=3, num_drafts=2)


def test_explosion_guards():
    with pytest.raises(InvalidInputError, match="draft tuples"):
        oc.check_token_verifier(ex.rrs, vocab_size=60, num_drafts=3, instances=1)
    with pytest.raises(InvalidInputError, match="draft tuples"):
        oc.check_block_verifier(ex.block_verification, vocab_size=4, num_drafts=4, block_len=2, instances=1)


def test_sample_mode_reports_the_power_of_a_fixed_sample_size():
    """A black-box block verifier with a user-fixed, too small sample: it runs, passes (it is
    lossless), and the power it reports is honest — far below 0.99."""
    res = oc.check_block_verifier(
        oc.as_sampler(ex.block_verification), vocab_size=2, num_drafts=1, block_len=2, instances=1, mode="sample",
        samples=3000,
    )  # fmt: skip
    r = res.instances[0]
    assert res.passed and r.samples == 3000
    assert r.power == pytest.approx(oc.power(3000, 7, 0.01, 1e-3), abs=1e-15) and r.power < 0.2
    assert "power below 0.99: this pass rules out only distortions much larger than 0.01" in res.summary()


def test_stated_power_is_honest():
    """Against the least detectable distortion of total-variation size δ (λ = 4nδ² exactly), the
    G-test at the size samples_for_power picks rejects with the stated power (Monte Carlo)."""
    level, delta = 1e-3, 0.01
    n = oc.samples_for_power(1, delta, level, 0.99)
    assert oc.power(n, 1, delta, level) >= 0.99 > oc.power(n - 1, 1, delta, level)
    rng = np.random.default_rng(5)
    counts = rng.multinomial(n, [0.5 + delta, 0.5 - delta], size=3000)
    expected = np.full(2, n / 2)
    pvals = scipy.stats.power_divergence(counts, expected, axis=1, lambda_="log-likelihood").pvalue
    assert (pvals < level).mean() > 0.985  # 0.99 minus 3.5 binomial standard errors


# -- the CLI ------------------------------------------------------------------------------------


def test_cli_pass_and_fail(tmp_path, capsys):
    ok = tmp_path / "ok"
    assert (
        main(
            [
                "otbound.conformance.examples:rrs",
                "--level",
                "token",
                "--num-drafts",
                "2",
                "--instances",
                "6",
                "--out",
                str(ok),
            ]
        )
        == 0
    )
    report = json.loads((ok / "report.json").read_text())
    assert report["passed"] is True and len(report["instances"]) == 6
    assert "PASS" in (ok / "report.md").read_text()
    bad = tmp_path / "bad"
    args = [
        "otbound.conformance.examples:block_cumulative_products",
        "--level",
        "block",
        "--num-drafts",
        "1",
        "--out",
        str(bad),
    ]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "counterexample (V = 2, K = 1, L = 2" in out
    assert json.loads((bad / "report.json").read_text())["counterexample"]["block_len"] == 2


@pytest.mark.parametrize(
    "args,match",
    [
        (["nosuchmodule:f", "--level", "token", "--num-drafts", "2"], "cannot import module"),
        (["otbound.conformance.examples:nope", "--level", "token", "--num-drafts", "2"], "no attribute"),
        (["otbound.conformance.examples", "--level", "token", "--num-drafts", "2"], "MODULE:FUNCTION"),
        (["otbound.conformance.examples:rrs", "--level", "tokens", "--num-drafts", "2"], "invalid choice"),
        (["otbound.conformance.examples:rrs", "--level", "token"], "required"),
        (["otbound.conformance.examples:rrs", "--level", "token", "--num-drafts", "0"], "num_drafts"),
    ],
)
def test_cli_usage_errors_are_one_line(args, match, capsys, tmp_path):
    assert main(args + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err


def test_summary_shows_the_declared_flag_and_a_disagreement():
    """The package's lossless verifiers pass with their declaration shown; a callable without a flag shows
    none; a verifier declared lossless that fails is called out."""
    ver = BLOCK_VERIFIERS["block"]
    res = oc.check_block_verifier(oc.block_adapter(ver), vocab_size=2, num_drafts=1, block_len=2, instances=2)
    assert res.passed and res.declared_lossless is True
    assert "declared lossless: yes (agrees with this check)" in res.summary()
    tok = oc.check_token_verifier(oc.token_law_adapter(VERIFIERS["rrs"]), vocab_size=3, num_drafts=2, instances=2)
    assert tok.passed and tok.declared_lossless is True
    gbv = BLOCK_VERIFIERS["spectr_gbv"]

    def claims_lossless(target, draft, blocks, coin, draw):
        return oc.block_adapter(gbv)(target, draft, blocks, coin, draw)

    claims_lossless.lossless = True
    bad = oc.check_block_verifier(claims_lossless, vocab_size=2, num_drafts=1, block_len=2, instances=4)
    assert not bad.passed and "declared lossless: yes (DISAGREES with this check)" in bad.summary()

    def plain(target, draft, blocks, coin, draw):
        return oc.block_adapter(ver)(target, draft, blocks, coin, draw)

    res = oc.check_block_verifier(plain, vocab_size=2, num_drafts=1, block_len=2, instances=2)
    assert res.declared_lossless is None and "declared lossless" not in res.summary()


# -- randomness routing ---------------------------------------------------------------------------


def _law(run, size=None):
    out = {}
    for prob, y in oc.enumerate_outcomes(run):
        out[y] = out.get(y, 0.0) + prob
    return out


def test_routed_uniform_comparisons_are_exact_and_consistent():
    """u < t on either side, with numbers and tensors; a uniform compared twice (u < 0.3, then
    u < 0.6) is conditioned on the first answer, so the law of the pair is exact."""
    import torch

    def run(coin, draw):
        with oc.route_randomness(coin, draw):
            u = torch.rand(2)
            a = bool(u[0] < 0.3)
            # the same uniform again: P(b | a) = 1, P(b | not a) = 3/7
            b = bool(torch.tensor(0.6, dtype=torch.float64) > u[0])
            c = bool(torch.le(u[1], torch.tensor(0.25)))  # 0.25 is exact in float32
            return a, b, c

    law = _law(run)
    assert law == pytest.approx({(True, True, True): 0.3 * 0.25, (True, True, False): 0.3 * 0.75,
                                 (False, True, True): 0.3 * 0.25, (False, True, False): 0.3 * 0.75,
                                 (False, False, True): 0.4 * 0.25, (False, False, False): 0.4 * 0.75}, abs=1e-15)


def test_routed_multinomial_categorical_choice_bernoulli_and_race():
    import torch

    w = torch.tensor([[1.0, 0.0, 3.0], [2.0, 2.0, 0.0]])

    def run(coin, draw):
        with oc.route_randomness(coin, draw) as rng:
            m = tuple(torch.multinomial(w, 1).ravel().tolist())
            c = int(torch.distributions.Categorical(probs=torch.tensor([0.5, 0.5])).sample())
            ch = int(rng.choice(3, p=[0.0, 0.2, 0.8]))
            b = int(torch.bernoulli(torch.tensor([0.1], dtype=torch.float64)).item())
            r = int(oc.exponential_race(torch.tensor([0.0, 1.0, 1.0])))
            return m, c, ch, b, r

    law = _law(run)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-15) and len(law) == 2 * 2 * 2 * 2 * 2 * 2
    assert law[((2, 0), 1, 2, 1, 1)] == pytest.approx(0.75 * 0.5 * 0.5 * 0.8 * 0.1 * 0.5, abs=1e-15)
    # without replacement: the second draw from the renormalised rest
    def two(coin, draw):
        with oc.route_randomness(coin, draw):
            return tuple(torch.multinomial(torch.tensor([2.0, 1.0, 1.0]), 2).tolist())

    assert _law(two) == pytest.approx({(0, 1): 0.5 * 0.5, (0, 2): 0.5 * 0.5, (1, 0): 0.25 * 2 / 3, (1, 2): 0.25 / 3,
                                       (2, 0): 0.25 * 2 / 3, (2, 1): 0.25 / 3}, abs=1e-15)
    # the router restores torch on exit: a real draw again
    assert torch.multinomial(torch.tensor([0.0, 1.0]), 1).item() == 1 and torch.rand(3).shape == (3,)


@pytest.mark.parametrize(
    "body,match",
    [
        (lambda torch, rng: torch.rand(2) * 2.0 < 1.0, "\\* was applied to a uniform drawn by torch.rand"),
        (lambda torch, rng: torch.log(torch.rand_like(torch.ones(2))) < 0, "torch.log was applied .* torch.rand_like"),
        (lambda torch, rng: 1.0 - rng.random() < 0.5, "- was applied to a uniform drawn by rng.random"),
        (lambda torch, rng: torch.rand(()).item(), "\\.item was applied"),
        (lambda torch, rng: float(torch.rand(())) < 0.5, "float\\(\\) was applied"),
        (lambda torch, rng: torch.empty(3).exponential_(), "Tensor.exponential_ .*exponential_race"),
        (lambda torch, rng: torch.randn(3), "torch.randn"),
    ],
)
def test_unroutable_uses_name_the_call(body, match):
    import torch

    def run(coin, draw):
        with oc.route_randomness(coin, draw) as rng:
            return body(torch, rng)

    with pytest.raises(oc.ConformanceError, match=match):
        oc.enumerate_outcomes(run)
    assert torch.rand(2).shape == (2,)  # restored after the error


def _sample_style_rrs(p, q, drafts, rng):
    """RRS written against a numpy Generator (a sample-mode verifier)."""
    cur = np.array(p)
    for x in drafts:
        if rng.random() < min(1.0, cur[x] / q[x]):
            return int(x)
        cur = _residual(cur, q)
    return int(rng.choice(len(p), p=cur))


def test_routed_generator_runs_a_sample_mode_verifier_exactly():
    def verify(p, q, drafts, coin, draw):
        with oc.route_randomness(coin, draw) as rng:
            return _sample_style_rrs(p, q, drafts, rng)

    res = oc.check_token_verifier(verify, vocab_size=3, num_drafts=2, instances=8)
    assert res.passed and res.lossless_error < EXACT
    ref = oc.check_token_verifier(ex.rrs, vocab_size=3, num_drafts=2, instances=8)
    assert np.abs(res.acceptance - ref.acceptance).max() < EXACT


# -- the installed transformers verifier ---------------------------------------------------------


@pytest.mark.parametrize("length", [1, 2, 3])
def test_transformers_speculative_sampling_is_lossless_exactly(length):
    """transformers' _speculative_sampling, unmodified, under the router: every branch of its own
    code enumerated; lossless to float64 round-off and E[τ] equal to U_causal at K = 1 (speculative
    sampling is optimal for one draft block, Sun et al. 2403.10444 only improve it at L ≥ 2)."""
    from otbound.conformance.adapters import transformers_speculative_sampling

    res = oc.check_block_verifier(
        transformers_speculative_sampling(), vocab_size=2, num_drafts=1, block_len=length, instances=8
    )
    assert res.passed and res.lossless_error < EXACT, res.summary()
    ref = oc.check_block_verifier(oc.block_adapter(BLOCK_VERIFIERS["token"]), vocab_size=2, num_drafts=1,
                                  block_len=length, instances=8)
    assert np.abs(res.acceptance - ref.acceptance).max() < EXACT  # the same E[τ] as the package's token-wise SD
    if length == 1:
        assert np.abs(res.acceptance - res.optimal).max() < 1e-9


def _broken_transformers(new="p_prime = p_n_plus_1.clone()"):
    """A copy of the installed _speculative_sampling whose residual line is ``new`` (default: p
    instead of (p − q)+)."""
    import inspect
    import textwrap

    import transformers.generation.utils as tgu

    src = textwrap.dedent(inspect.getsource(tgu._speculative_sampling))
    good = "p_prime = torch.clamp((p_n_plus_1 - q_n_plus_1), min=0)"
    assert good in src, "transformers changed its residual line; update this broken copy"
    namespace = dict(vars(tgu))
    exec(src.replace(good, new), namespace)  # noqa: S102 — a test-only mutant
    return namespace["_speculative_sampling"]


def test_broken_transformers_copy_fails_with_its_minimal_counterexample():
    """The residual drawn from p instead of (p − q)+: caught exactly, shrunk to V = 2, K = 1, L = 1,
    where the output law is min(p, q) + (1 − α) p (α = Σ min(p, q))."""
    from otbound.conformance.adapters import transformers_speculative_sampling

    res = oc.check_block_verifier(
        transformers_speculative_sampling(_broken_transformers()), vocab_size=2, num_drafts=1, block_len=3,
        instances=8,
    )  # fmt: skip
    assert not res.passed
    c = res.counterexample
    assert (c.vocab_size, c.num_drafts, c.block_len) == (2, 1, 1)
    p, q = c.target[()], c.draft[()]
    first = np.minimum(p, q) + (1.0 - np.minimum(p, q).sum()) * p  # the law of the first emitted token
    want = max(abs(first[y] - p[y]) * c.target[(y,)][z] for y in range(2) for z in range(2))
    assert c.lossless_error == pytest.approx(want, abs=EXACT) and c.lossless_error > 1e-3


# -- honest verdicts ------------------------------------------------------------------------------


def test_float32_rounding_is_named_and_precision_float32_accepts_it():
    """transformers' verifier in float32 (as generation runs it): errors of a few 1e-9 fail the
    float64 tolerance, and the verdict says they are float32 rounding and names tolerance= and
    precision='float32'; at precision='float32' (tolerance 1e-6) it passes."""
    from otbound.conformance.adapters import transformers_speculative_sampling

    f32 = transformers_speculative_sampling(dtype="float32")
    res = oc.check_block_verifier(f32, vocab_size=2, num_drafts=1, block_len=2, instances=5)
    assert not res.passed and 1e-10 < res.lossless_error < 1e-7 and res.within_float32_rounding
    text = res.summary()
    assert "within float32 rounding" in text and "tolerance=" in text and "precision='float32'" in text
    assert "difference -" in text or "difference +" in text  # the worst cell's difference, not two equal numbers
    ok = oc.check_block_verifier(f32, vocab_size=2, num_drafts=1, block_len=2, instances=5, precision="float32")
    assert ok.passed and ok.tolerance == 1e-6 and ok.precision == "float32"
    # a residual clamped at 1e-5 (a defect an older rejection sampler had) fails even at float32 precision
    clamped = transformers_speculative_sampling(
        _broken_transformers("p_prime = torch.clamp((p_n_plus_1 - q_n_plus_1), min=1e-5)"), dtype="float32"
    )
    res = oc.check_block_verifier(clamped, vocab_size=2, num_drafts=1, block_len=2, instances=5, precision="float32")
    assert not res.passed and not res.within_float32_rounding and 1e-6 < res.lossless_error < 1e-4
    # a real defect is not excused as rounding
    bad = oc.check_block_verifier(ex.block_cumulative_products, vocab_size=2, num_drafts=1, block_len=2, instances=4)
    assert not bad.within_float32_rounding and "float32 rounding" not in bad.summary()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(tolerance=1e-6, precision="float32"), "not both"),
        (dict(precision="float16"), "precision must be"),
        (dict(tolerance=-1.0), "non-negative"),
        (dict(samples=100), "samples apply to mode='sample'"),
        (dict(batch=True), "batch apply to mode='sample'"),
        (dict(level=0.01), "level apply to mode='sample'"),
        (dict(mode="sample", tolerance=1e-3), "tolerance apply to mode='exact'"),
        (dict(mode="sample", precision="float32"), "precision apply to mode='exact'"),
    ],
)
def test_options_of_the_other_mode_are_refused(kwargs, match):
    verify = oc.as_sampler(ex.rrs) if kwargs.get("mode") == "sample" else ex.rrs
    with pytest.raises(InvalidInputError, match=match):
        oc.check_token_verifier(verify, vocab_size=3, num_drafts=2, instances=2, **kwargs)


def _assert_clean(text):
    assert "inf" not in text and "-0.0000" not in text and "-0.00e" not in text and "nan" not in text.lower()
    assert all(abs(float(x)) < 100 for x in re.findall(r"-?\d+\.\d+(?!e)", text))  # no huge cells


def test_summary_skips_instances_with_a_vanishing_bound_and_marks_lossy_efficiency():
    """E[τ] = 1.5e-9 over U_causal = 2.5e-9 measures nothing: such instances are listed, not
    averaged; a lossy verifier's efficiency is 'not meaningful'; no inf, -0.0000 or huge cell."""
    good = oc.check_block_verifier(ex.block_verification, vocab_size=2, num_drafts=1, block_len=2, instances=8)
    tiny = [r for r in good.instances if r.optimal < 1e-6]
    assert {r.label for r in tiny} == {"disjoint supports at the root", "near-deterministic models"}
    assert all(r.efficiency is None for r in tiny) and np.isnan(good.efficiency[[5, 6]]).all()
    kept = [r.efficiency for r in good.instances if r.efficiency is not None]
    text = good.summary()
    assert f"mean {np.mean(kept):.4f}, min {np.min(kept):.4f}" in text and f"over {len(kept)} instances" in text
    assert "not averaged (U_causal < 1e-06): disjoint supports at the root; near-deterministic models" in text
    _assert_clean(text)
    _assert_clean(good.to_markdown())
    lossy = oc.check_block_verifier(ex.block_cumulative_products, vocab_size=2, num_drafts=1, block_len=2, instances=8)
    assert "efficiency E[τ]/U_causal: not meaningful" in lossy.summary() and "mean " not in lossy.efficiency_lines()[0]
    _assert_clean(lossy.summary())
    assert json.loads(json.dumps(good.to_dict()))["instances"][5]["efficiency"] is None


def test_sample_mode_efficiency_has_intervals():
    """n = 500: the estimated α/α* can exceed 1 from noise; the summary shows 95% intervals (α ± 1.96
    standard errors over α*) that cover 1 for a lossless, optimal-on-this-instance verifier."""
    p, q = np.array([0.2, 0.3, 0.5]), np.array([0.5, 0.3, 0.2])
    res = oc.check_token_verifier(oc.as_sampler(ex.rrs), vocab_size=3, num_drafts=1, instances=[(p, q)],
                                  mode="sample", samples=500, seed=3)
    r = res.instances[0]
    assert r.acceptance_se == pytest.approx(np.sqrt(r.acceptance * (1 - r.acceptance) / 500), rel=1e-12)
    lo, hi = r.efficiency_interval
    assert lo < 1.0 < hi and hi - lo == pytest.approx(2 * 1.959963984540054 * r.acceptance_se / r.optimal)
    text = res.summary()
    assert f"[{lo:.3f},{hi:.3f}]" in text and "at 95%" in text
    _assert_clean(text)


def test_sample_verdict_is_p_value_against_the_corrected_level():
    """A batched black box emitting a fixed histogram: counts (554, 446) and (555, 445) of n = 1000
    against p = (1/2, 1/2) have G-test p-values 6.29e-4 and 4.98e-4; with two instances at level
    1e-3 the per-instance level is 5e-4, so the first passes (it would fail uncorrected) and the
    second fails."""
    n = 1000

    def fixed(p, q, drafts, rng):
        c = 554 if q[0] == 0.5 else 555
        return np.array([0] * c + [1] * (n - c))

    half = np.array([0.5, 0.5])
    res = oc.check_token_verifier(fixed, vocab_size=2, num_drafts=1, instances=[(half, half), (half, [0.4, 0.6])],
                                  mode="sample", batch=True, samples=n)
    assert res.level_alpha == pytest.approx(5e-4)
    for r, c in zip(res.instances, (554, 555), strict=True):
        want = scipy.stats.power_divergence([c, n - c], [n / 2, n / 2], lambda_="log-likelihood").pvalue
        assert r.p_value == pytest.approx(want, rel=1e-12)
        assert r.passed == (want >= 5e-4)
    assert [r.passed for r in res.instances] == [True, False] and res.instances[0].p_value < 1e-3


# -- the CLI: every misuse exits 2 with one line --------------------------------------------------

USER_FILE = '''
import numpy as np


def token_rrs(p, q, drafts, coin, draw):
    cur = np.array(p)
    for x in drafts:
        if coin(min(1.0, cur[x] / q[x])):
            return int(x)
        d = np.maximum(cur - q, 0.0)
        cur = d / d.sum() if d.sum() > 0 else cur
    return draw(cur)


def block_first(target, draft, blocks, coin, draw):
    return [t for t in blocks[0]][:0] + [draw(target(()))]


def sampler(p, q, drafts, rng):
    return int(rng.choice(len(p), p=p))


def skip_repeats(p, q, drafts, coin, draw):
    return token_rrs(p, q, list(dict.fromkeys(int(x) for x in drafts)), coin, draw)


def spins(p, q, drafts, coin, draw):
    while True:
        pass


def endless(p, q, drafts, coin, draw):
    while True:
        coin(0.5)
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "adapters" / "my.py"
    path.parent.mkdir()
    path.write_text(USER_FILE)
    return path


def test_cli_file_path_and_as_sampler(user_file, tmp_path, capsys):
    out = tmp_path / "rep"
    assert main([f"{user_file}:token_rrs", "--level", "token", "--num-drafts", "2", "--instances", "4",
                 "--out", str(out)]) == 0  # fmt: skip
    assert json.loads((out / "report.json").read_text())["passed"] is True
    assert main([f"{user_file}:skip_repeats", "--level", "token", "--num-drafts", "2", "--mode", "sample",
                 "--as-sampler", "--instances", "1", "--out", str(out)]) == 1  # fmt: skip
    text = capsys.readouterr().out
    assert "FAIL" in text and "sample mode" in text


def _one_line_exit_2(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize(
    "fn,extra,match",
    [
        ("token_rrs", ["--mode", "sample"], "cannot be called as verify\\(p, q, drafts, rng\\).*--as-sampler"),
        ("sampler", [], "cannot be called as verify\\(p, q, drafts, coin, draw\\).*use --mode sample"),
        ("block_first", [], "raised TypeError.*at token level.*needs --level block"),
        ("token_rrs", ["--block-len", "3"], "--block-len applies to --level block only"),
        ("token_rrs", ["--batch"], "--batch applies to --mode sample only"),
        ("token_rrs", ["--as-sampler"], "--as-sampler applies to --mode sample only"),
        ("token_rrs", ["--mode", "sample", "--as-sampler", "--precision", "float32"], "--precision applies to --mode"),
        ("token_rrs", ["--mode", "sample", "--as-sampler", "--batch"], "cannot be combined with --batch"),
        ("token_rrs", ["--precision", "float32", "--tolerance", "1e-3"], "not both"),
        ("token_rrs", ["--num-drafts", "4", "--sampling", "without_replacement"], "num_drafts=4 > vocab_size=3"),
        ("token_rrs", ["--vocab-size", "1000000000"], "draft tuples"),
        ("token_rrs", ["--instances", "0"], "instances must be a positive integer"),
        ("token_rrs", ["--instances", "100000000"], "at most 10000"),
        ("spins", ["--instances", "1", "--time-limit", "1"], "did not finish within --time-limit 1 s"),
        ("endless", ["--instances", "1"], "more than 2000 coin/draw decisions"),
    ],
)
def test_cli_token_misuse_exits_2_with_one_line(fn, extra, match, user_file, tmp_path, capsys):
    argv = [f"{user_file}:{fn}", "--level", "token", "--num-drafts", "1", "--out", str(tmp_path / "o")] + extra
    line = _one_line_exit_2(argv, capsys)
    assert re.search(match, line), line


def test_cli_block_misuse_and_bad_out(user_file, tmp_path, capsys):
    tok = [f"{user_file}:token_rrs", "--level", "block", "--num-drafts", "1", "--instances", "2"]
    line = _one_line_exit_2(tok + ["--out", str(tmp_path / "o")], capsys)
    assert "at block level" in line and "needs --level token" in line
    line = _one_line_exit_2(tok + ["--sampling", "greedy", "--out", str(tmp_path / "o")], capsys)
    assert "--sampling applies to --level token only" in line
    ok = [f"{user_file}:block_first", "--level", "block", "--num-drafts", "1", "--instances", "2"]
    assert "is a file" in _one_line_exit_2(ok + ["--out", str(user_file)], capsys)
    assert "not a writable directory" in _one_line_exit_2(ok + ["--out", str(user_file / "sub")], capsys)
    assert "not a writable directory" in _one_line_exit_2(ok + ["--out", "/proc/otbound-report"], capsys)
    assert "no such file" in _one_line_exit_2(["nowhere/x.py:f", "--level", "block", "--num-drafts", "1"], capsys)


TREE_WALK = '''
import numpy as np


def tree_walk(target, draft, blocks, coin, draw):
    rows, prefix = [tuple(map(int, r)) for r in blocks], ()
    while len(prefix) < len(rows[0]):
        r = np.array(target(prefix))
        for c in dict.fromkeys(row[len(prefix)] for row in rows if row[: len(prefix)] == prefix):
            if coin(min(1.0, r[c] / r.sum())):
                prefix += (c,)
                break
            r[c] = 0.0
        else:
            return list(prefix) + [draw(r / r.sum())]
    return list(prefix) + [draw(target(prefix))]
'''


def test_cli_drafting_top_k(tmp_path, capsys):
    path = tmp_path / "tw.py"
    path.write_text(TREE_WALK)
    args = [f"{path}:tree_walk", "--level", "block", "--num-drafts", "2", "--vocab-size", "2", "--instances", "4",
            "--out", str(tmp_path / "o")]  # fmt: skip
    assert main(args + ["--drafting", "top-k"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "top_2_tree" in json.loads((tmp_path / "o" / "report.json").read_text())["sampling"]
    assert "mean 1.0000, min 1.0000" in out  # it attains U_causal of the tree it is run with
    assert "must be None, a DraftingScheme" in _one_line_exit_2(args + ["--drafting", f"{path}:np"], capsys)
    tok = [f"{path}:tree_walk", "--level", "token", "--num-drafts", "2", "--drafting", "top-k"]
    assert "--drafting applies to --level block only" in _one_line_exit_2(tok, capsys)


def test_cli_help_states_defaults(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: ./conformance-report)" in text and "default 600" in text
    assert "exit status: 0 lossless" in text.lower()


# -- user-described drafting ----------------------------------------------------------------------


def tree_walk(target, draft, blocks, coin, draw):
    """A lossless verifier for a deterministic draft tree (the sampling branch of EAGLE-style tree
    verification): at each node try its distinct children in row order, accepting child c with
    probability r(c) of the current residual r (the draft is deterministic, q(c) = 1), else zero c
    in r and renormalise; on acceptance descend with r = target(prefix); if every child is
    rejected, emit a draw from r; at depth L draw the bonus from the target."""
    rows = [tuple(int(t) for t in row) for row in blocks]
    prefix = ()
    while len(prefix) < len(rows[0]):
        r = np.array(target(prefix), dtype=np.float64)
        children = list(dict.fromkeys(row[len(prefix)] for row in rows if row[: len(prefix)] == prefix))
        for c in children:
            if coin(min(1.0, r[c] / r.sum())):
                prefix += (c,)
                break
            r[c] = 0.0
        else:
            return list(prefix) + [draw(r / r.sum())]
    return list(prefix) + [draw(target(prefix))]


def _tree_instances():
    return [t for t in oc.block_instances(3, 2, 10, 0) if all(np.count_nonzero(q > 0) >= 2 for q in t.draft.values())]


def test_user_drafting_top_k_tree_is_bounded_by_its_own_law():
    """EAGLE's deterministic top-2 tree, described with drafting=: the tree-walk verifier is
    lossless, its E[τ] is the target probability of the tree's nodes (Σ over non-root nodes of the
    target's path probability — it accepts exactly what a target sample would follow) and equals
    U_causal of the tree's law (one deterministic tree: nothing better is possible); the bound of K
    i.i.d. blocks (what the kit used without drafting=) is a different number."""
    insts = _tree_instances()
    assert len(insts) >= 5
    tree = oc.top_k_tree(2)
    res = oc.check_block_verifier(tree_walk, vocab_size=3, num_drafts=2, block_len=2, instances=insts, drafting=tree)
    assert res.passed and res.lossless_error < EXACT and res.sampling == "top_2_tree"
    for t, r in zip(insts, res.instances, strict=True):
        tg, dr = t.models()
        (_, rows), = tree.law(dr, 2, 2)
        nodes = {row[:d] for row in rows for d in (1, 2)}
        want = sum(np.prod([tg(node[:i])[node[i]] for i in range(len(node))]) for node in nodes)
        assert r.acceptance == pytest.approx(want, abs=EXACT)
        assert r.acceptance == pytest.approx(r.optimal, abs=1e-8) and r.optimal <= r.joint_bound + 1e-9
    iid = oc.check_block_verifier(oc.block_adapter(BLOCK_VERIFIERS["block"]), vocab_size=3, num_drafts=2, block_len=2,
                                  instances=insts)
    assert np.abs(iid.optimal - res.optimal).max() > 0.05


def test_user_drafting_as_a_pair_and_in_sample_mode():
    """(draw, law) as a pair; sample mode draws trees with the user's draw; a law not summing to 1 and
    rows of the wrong length are refused."""
    insts = _tree_instances()[:1]
    tree = oc.top_k_tree(2)

    def draw(draft, num, k, length, rng):
        (_, rows), = tree.law(draft, k, length)
        return np.broadcast_to(np.array(rows), (num, len(rows), length))

    pair = (draw, tree.law)
    ex_res = oc.check_block_verifier(tree_walk, vocab_size=3, num_drafts=2, block_len=2, instances=insts, drafting=pair)
    assert ex_res.passed and ex_res.sampling == "user drafting"
    sm = oc.check_block_verifier(oc.as_sampler(tree_walk), vocab_size=3, num_drafts=2, block_len=2, instances=insts,
                                 drafting=pair, mode="sample", samples=20_000)
    assert sm.passed and sm.instances[0].optimal == pytest.approx(ex_res.instances[0].optimal, abs=1e-12)
    assert abs(sm.instances[0].acceptance - ex_res.instances[0].acceptance) < 5 * sm.instances[0].acceptance_se
    half = oc.DraftingScheme("half", law=lambda d, k, n: [(0.5, tree.law(d, k, n)[0][1])])
    with pytest.raises(InvalidInputError, match="sum to 0.5"):
        oc.check_block_verifier(tree_walk, vocab_size=3, num_drafts=2, block_len=2, instances=insts, drafting=half)
    short = oc.DraftingScheme("short", law=lambda d, k, n: [(1.0, ((0,), (1,)))])
    with pytest.raises(InvalidInputError, match="rows of 2 tokens"):
        oc.check_block_verifier(tree_walk, vocab_size=3, num_drafts=2, block_len=2, instances=insts, drafting=short)
    with pytest.raises(InvalidInputError, match="drafting must be"):
        oc.check_block_verifier(tree_walk, vocab_size=3, num_drafts=2, block_len=2, instances=insts, drafting="top2")


def test_the_guide_examples_run():
    """Every ```python block of docs/guide/conformance.md runs, in order, in one namespace."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "conformance.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 5
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "conformance.md", "exec"), namespace)  # noqa: S102 — the guide's own examples


def test_transformers_adapter_checks_the_signature():
    from otbound.conformance.adapters import transformers_speculative_sampling

    def renamed(input_ids, candidate_logits, candidate_length, new_logits):
        raise AssertionError("never called")

    with pytest.raises(oc.ConformanceError, match="does not start with"):
        transformers_speculative_sampling(renamed)

    def extra(candidate_input_ids, candidate_logits, candidate_length, new_logits, must):
        raise AssertionError("never called")

    with pytest.raises(oc.ConformanceError, match="changed it"):
        transformers_speculative_sampling(extra)


def test_routed_slices_default_rng_and_race_outside_the_router():
    """Uniforms re-drawn on a slice with a generator (as engines seed per request), a generator made
    inside the routed code, and exponential_race sampling for real outside the router."""
    import torch

    def run(coin, draw):
        with oc.route_randomness(coin, draw):
            u = torch.rand((3,))
            u[0:2].uniform_(generator=torch.Generator())
            ratio = torch.tensor([0.5, 1.0, 0.25], dtype=torch.float64)
            acc = tuple((ratio >= u).tolist())
            pick = int(np.random.default_rng(0).choice(2, p=[0.25, 0.75]))
            return acc, pick

    law = _law(run)
    assert law[((True, True, True), 1)] == pytest.approx(0.5 * 0.25 * 0.75, abs=1e-15)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-15) and len(law) == 8
    picks = oc.exponential_race(torch.tensor([[0.0, 1.0, 3.0]]).repeat(4000, 1))
    assert picks.shape == (4000,) and (picks != 0).all()
    assert abs(float((picks == 2).double().mean()) - 0.75) < 5 * np.sqrt(0.75 * 0.25 / 4000)


def test_a_lossy_verifier_far_above_a_small_bound_prints_no_huge_cell():
    p, q = np.array([1 - 1e-5, 1e-5]), np.array([1e-5, 1 - 1e-5])  # α* = 2e-5 (K = 1)
    res = oc.check_token_verifier(lambda p, q, d, coin, draw: int(d[0]), vocab_size=2, num_drafts=1,
                                  instances=[(p, q)])
    r = res.instances[0]
    assert not res.passed and r.efficiency == pytest.approx(1 / 2e-5, rel=1e-6)
    text = res.summary()
    assert "> 10" in text and "not meaningful" in text
    _assert_clean(text)


# -- the engine recipes, on engine-style code written here ------------------------------------------


def _engine_rejection_sampler(draft_ids, draft_probs, target_probs, recover_from_target=False):
    """Batched rejection sampling written the way serving engines write it (one request): uniforms
    ``torch.rand((L,))`` re-drawn per request slice, accept while ``target / draft >= u``, the
    recovered token an exponential race over ``(p − q)+`` (or, defective, over p), the bonus a
    multinomial draw. draft_ids (L,), draft_probs (L, V), target_probs (L + 1, V)."""
    import torch

    length = draft_ids.shape[0]
    u = torch.rand((length,), dtype=torch.float32)
    u[0:length].uniform_(generator=None)
    rows = torch.arange(length)
    ratio = target_probs[rows, draft_ids] / draft_probs[rows, draft_ids]  # (L,)
    accepted = ratio >= u  # (L,)
    out = []
    for i in range(length):
        if not bool(accepted[i]):
            base = target_probs[i] if recover_from_target else torch.clamp(target_probs[i] - draft_probs[i], min=0)
            out.append(int(oc.exponential_race(base[None])[0]))
            return out
        out.append(int(draft_ids[i]))
    return out + [int(torch.multinomial(target_probs[length], 1))]


def _engine_adapter(recover_from_target=False):
    import torch

    def verify(target, draft, blocks, coin, draw):
        x = tuple(int(t) for t in blocks[0])
        q = torch.tensor(np.stack([draft(x[:i]) for i in range(len(x))]))
        p = torch.tensor(np.stack([target(x[:i]) for i in range(len(x) + 1)]))
        with oc.route_randomness(coin, draw):
            return _engine_rejection_sampler(torch.tensor(x), q, p, recover_from_target)

    return verify


def test_engine_style_rejection_sampler_through_the_recipe():
    """The vLLM recipe's calls (torch.rand, slice uniform_, ratio >= u with the uniform on the right,
    the exponential race, multinomial) on engine-style code: lossless at L = 1, 2 with the package's
    speculative sampling's E[τ]; recovering from p instead of (p − q)+ is caught."""
    for length in (1, 2):
        res = oc.check_block_verifier(_engine_adapter(), vocab_size=2, num_drafts=1, block_len=length, instances=6)
        ref = oc.check_block_verifier(oc.block_adapter(BLOCK_VERIFIERS["token"]), vocab_size=2, num_drafts=1,
                                      block_len=length, instances=6)
        assert res.passed and res.lossless_error < EXACT
        assert np.abs(res.acceptance - ref.acceptance).max() < EXACT
    bad = oc.check_block_verifier(_engine_adapter(True), vocab_size=2, num_drafts=1, block_len=2, instances=6)
    assert not bad.passed and (bad.counterexample.block_len, bad.counterexample.vocab_size) == (1, 2)


def test_python_random_tree_verifier_through_the_recipe():
    """The EAGLE recipe's calls: Python's random.random() compared with the residual mass of each
    child of a deterministic tree, the residual zeroed and renormalised, the final token drawn with
    torch.multinomial — exact under the router, lossless on the top-2 tree."""
    import random

    import torch

    def tree_posterior(target, rows):
        prefix = ()
        while len(prefix) < len(rows[0]):
            gtp = torch.tensor(target(prefix))
            for c in dict.fromkeys(row[len(prefix)] for row in rows if row[: len(prefix)] == prefix):
                if random.random() <= float(gtp[c] / gtp.sum()):
                    prefix += (c,)
                    break
                gtp[c] = 0
                gtp = gtp / gtp.sum()
            else:
                return list(prefix) + [int(torch.multinomial(gtp, 1))]
        return list(prefix) + [int(torch.multinomial(torch.tensor(target(prefix)), 1))]

    def verify(target, draft, blocks, coin, draw):
        with oc.route_randomness(coin, draw):
            return tree_posterior(target, [tuple(int(t) for t in r) for r in blocks])

    insts = _tree_instances()[:4]
    res = oc.check_block_verifier(verify, vocab_size=3, num_drafts=2, block_len=2, instances=insts,
                                  drafting=oc.top_k_tree(2))
    ref = oc.check_block_verifier(tree_walk, vocab_size=3, num_drafts=2, block_len=2, instances=insts,
                                  drafting=oc.top_k_tree(2))
    assert res.passed and res.lossless_error < EXACT and np.abs(res.acceptance - ref.acceptance).max() < EXACT


def test_transformers_verifier_sampled_through_as_sampler_matches_exact():
    """The same unmodified function in sample mode (coins and draws from a generator via as_sampler,
    still routed): no rejection, and E[τ] within 5 standard errors of the exact value."""
    from otbound.conformance.adapters import transformers_speculative_sampling

    inst = oc.block_instances(2, 2, 1, 0)
    exact = oc.check_block_verifier(transformers_speculative_sampling(), vocab_size=2, num_drafts=1, block_len=2,
                                    instances=inst)
    sampled = oc.check_block_verifier(oc.as_sampler(transformers_speculative_sampling()), vocab_size=2, num_drafts=1,
                                      block_len=2, instances=inst, mode="sample", samples=4000, seed=2)
    r = sampled.instances[0]
    assert sampled.passed and abs(r.acceptance - exact.instances[0].acceptance) < 5 * r.acceptance_se


def test_tuple_law_bounds_of_iid_blocks_are_the_block_bounds():
    """tuple_law_bounds over the law of K i.i.d. blocks equals block_bound's U_causal and U_joint
    (two formulations of the same LPs), on the kit's adversarial and random models."""
    from otbound import block_bound
    from otbound.block.law_bounds import tuple_law_bounds

    ver = BLOCK_VERIFIERS["block"]
    for t in oc.block_instances(2, 2, 8, 1):
        tg, dr = t.models()
        law = list(ver.draft_tuple_law(dr, 2, 2))
        b = tuple_law_bounds(tg, dr, law, vocab_size=2, block_len=2)
        kw = dict(vocab_size=2, num_drafts=2, block_len=2)
        assert b.causal == pytest.approx(block_bound(tg, dr, kind="causal", **kw).value, abs=1e-8)
        assert b.joint == pytest.approx(block_bound(tg, dr, kind="joint", **kw).value, abs=1e-8)
    with pytest.raises(InvalidInputError, match="same positive number of rows"):
        tuple_law_bounds(tg, dr, [(0.5, [(0, 1)]), (0.5, [(0, 1), (1, 1)])], vocab_size=2, block_len=2)
