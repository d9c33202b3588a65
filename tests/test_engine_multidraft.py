"""llama.cpp's multi-draft example (examples/speculative/speculative.cpp) is not lossless: its port,
checked exactly by the conformance kit, against closed forms computed here independently."""

import itertools

import numpy as np
import pytest

from otbound import draft_joint
from otbound.conformance import check_token_verifier
from otbound.engine._multidraft import llama_speculative_verify, output_law, port_output_law, top_k_law


def _mixture(p, q, k, sampling):
    """The verifier's output law averaged over its draft tuples (the kit's definition of losslessness)."""
    joint = draft_joint(q, k, sampling)
    law = np.zeros(p.size)
    for xs in itertools.product(range(p.size), repeat=k):
        if joint[xs] > 0:
            law += joint[xs] * output_law(llama_speculative_verify, p, q, xs)
    return law


def test_top_draft_verified_as_if_sampled_is_lossy_at_full_vocabulary():
    """The example drafts the draft's most likely token and accepts it with probability min(1, p/q):
    output law a·δ_x + (1 − a)·(p − q)₊/Z, x = argmax q, a = min(1, p_x/q_x)."""
    rng = np.random.default_rng(3)
    for _ in range(5):
        p, q = rng.dirichlet(np.ones(7)), rng.dirichlet(np.ones(7))
        x = int(np.argmax(q))
        a = min(1.0, p[x] / q[x])
        res = np.maximum(p - q, 0.0)
        expected = (1 - a) * res / res.sum()
        expected[x] += a
        got = output_law(llama_speculative_verify, p, q, [x])
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
        assert 0.5 * np.abs(got - p).sum() > 0.05
    # the kit, with the example's drafting (the top-K of q: the "greedy" draft law), finds it
    res = check_token_verifier(llama_speculative_verify, vocab_size=5, num_drafts=2, sampling="greedy", instances=8)
    assert not res.passed and res.lossless_error > 0.05 and res.counterexample is not None


def test_entry_by_entry_residual_is_right_only_when_both_lists_hold_the_same_tokens():
    rng = np.random.default_rng(4)
    # full vocabulary, drafts sampled from q: recursive rejection sampling, lossless (exact, 1e-12)
    for k in (1, 2):
        p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
        np.testing.assert_allclose(_mixture(p, q, k, "with_replacement"), p, rtol=0, atol=1e-12)
    # top-k truncation keeping different tokens: the residual subtracts another token's draft mass
    p = np.array([0.5, 0.5])
    q = np.array([0.0, 1.0])
    # by hand: draft 1 is accepted w.p. p1/q1 = 0.5; the residual pairs target token 0 with draft
    # token 1 (1 − 1 → 0) and keeps token 1's 0.5 → residual [0, 1]: token 0 is never emitted
    np.testing.assert_allclose(_mixture(p, q, 1, "with_replacement"), [0.0, 1.0], atol=1e-12)
    # top-4 of a target and top-4 of a draft over 12 tokens, sharing 3 of them
    target = np.array([0.3, 0.2, 0.15, 0.1, 0.08, 0.06, 0.04, 0.03, 0.02, 0.01, 0.005, 0.005])
    draft = np.array([0.25, 0.05, 0.2, 0.1, 0.15, 0.05, 0.05, 0.05, 0.04, 0.03, 0.02, 0.01])
    pt, qt = top_k_law(target, 4), top_k_law(draft, 4)
    assert set(np.flatnonzero(pt)) != set(np.flatnonzero(qt))
    for k in (1, 2):
        tv = 0.5 * np.abs(_mixture(pt, qt, k, "with_replacement") - pt).sum()
        assert tv > 0.01, tv
    res = check_token_verifier(llama_speculative_verify, vocab_size=12, num_drafts=2, instances=[(pt, qt)])
    assert not res.passed and res.lossless_error > 0.01


@pytest.mark.parametrize("k", [1, 2])
def test_the_kit_catches_the_residual_on_its_adversarial_instances(k):
    res = check_token_verifier(llama_speculative_verify, vocab_size=4, num_drafts=k, instances=6)
    assert not res.passed
    failing = {r.label for r in res.instances if not r.passed}
    assert "zero in q where p has mass" in failing


def test_the_closed_form_of_the_ports_law_is_the_ports_law():
    rng = np.random.default_rng(7)
    for V, k in ((4, 1), (5, 2), (6, 3)):
        p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
        for pp, qq in ((p, q), (top_k_law(p, 3), top_k_law(q, 3))):
            drafts = np.argsort(-qq, kind="stable")[:k]
            np.testing.assert_allclose(port_output_law(pp, qq, drafts),
                                       output_law(llama_speculative_verify, pp, qq, drafts), rtol=0, atol=1e-12)


# -- the shipped binary, on the tiny GGUF pair -------------------------------------------------------------

TOPK4 = {"temperature": 1.0, "top_k": 4, "top_p": 1.0, "min_p": 0.0}
PROMPT = "Hello wor"
PROMPT_IDS = [72, 101, 108, 108, 111, 32, 119, 111, 114]  # the tiny vocabulary's byte tokens: no merge applies


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    from otbound.engine import build_llama_speculative_kvu, build_log_flush_shim
    from otbound.lm import llama_cpp_build, write_tiny_gguf_pair

    build = llama_cpp_build(progress=False)
    folder = tmp_path_factory.mktemp("llama-speculative")
    pair = write_tiny_gguf_pair(folder / "pair", seed=0)
    return (build.binary("llama-speculative"), pair, build_log_flush_shim(build, folder),
            build_llama_speculative_kvu(build, folder))


def test_the_shipped_example_fails_with_several_draft_sequences_and_the_unified_kv_cache_fixes_it(shipped):
    from otbound.engine import run_llama_speculative

    binary, pair, shim, kvu = shipped
    kw = {"num_seqs": 3, "p_split": 0.05, "n_max": 3, "sampling": TOPK4, "seed": 1, "n_predict": 8, "flush_shim": shim}
    as_shipped = run_llama_speculative(binary, pair.target, pair.draft, PROMPT, **kw)
    assert as_shipped["failed_decodes"] > 0
    fixed = run_llama_speculative(kvu, pair.target, pair.draft, PROMPT, **kw)
    assert fixed["failed_decodes"] == 0 and fixed["returncode"] == 0 and len(fixed["tokens"]) >= 8


def test_the_shipped_example_emits_the_ports_law_not_the_targets(shipped):
    from otbound.engine import speculative_output_test

    binary, pair, shim, _ = shipped
    res = speculative_output_test(binary, pair, PROMPT, PROMPT_IDS, num_seqs=1, p_split=0.05, n_max=3,
                                  sampling=TOPK4, samples=200, flush_shim=shim)
    assert res["runs_with_failed_decodes"] == 0 and res["nonzero_exit"] == 0
    assert res["port_vs_target_tv"] > 0.1  # the exact distance of the port's law from the target's
    assert res["vs_target"]["p_value"] < 1e-4
    assert res["vs_port"]["p_value"] >= 0.01
