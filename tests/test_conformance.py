"""The conformance kit (issue 16): the kit checks the package's verifiers, the package's exact laws
check the kit, and the three public-code defects of issue 16 are caught with minimal counterexamples.

Tolerances: exact-mode laws are float64 sums over draft tuples and branches, compared to 1e-12;
sample mode is a G-test at family-wise level 1e-3 with power ≥ 0.99 against a 0.01 total-variation
distortion (fixed seeds, so every run is the same).
"""

import json

import numpy as np
import pytest
import scipy.stats

import otbound.conformance as oc
from otbound import BLOCK_VERIFIERS, VERIFIERS, InvalidInputError, greedy_split
from otbound.conformance import examples as ex
from otbound.conformance.__main__ import main
from otbound.token.verifiers import kseq_rho

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
    if name in ("ot", "greedy", "spechub"):  # these attain their law's bound (the OT plan: an LP, to 1e-9)
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


def _rrs_wor(p, q, drafts, coin, draw):
    cur_p, cur_q = np.array(p), np.array(q)
    for x in drafts:
        if coin(min(1.0, cur_p[x] / cur_q[x])):
            return int(x)
        cur_p = ex._residual(cur_p, cur_q)
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
    return draw(ex._residual(p, gamma * low))


def _greedy(p, q, drafts, coin, draw):
    g, qp = greedy_split(q, len(drafts))
    x = drafts[-1]
    if coin(min(1.0, p[x] / qp[x])):
        return int(x)
    base = qp.copy()
    base[g] = 0.0
    return draw(ex._residual(p, base))


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


# -- the three defects of issue 16 ------------------------------------------------------------


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
