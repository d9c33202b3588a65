"""Sampling settings through the language-model layer on a tiny random pair: traces record both
models' settings and define their laws by them (repetition penalty over each prefix), re-measure at
new settings without the models; one iteration is exactly lossless for the target's truncated law at
T ∈ {0.5, 0.8, 1.3}, and the speculative decoder passes a G-test on its first two tokens (power
shown by a lossy verifier at the same sample size)."""

from __future__ import annotations

import numpy as np
import pytest
from test_specsample import PROMPTS, TrustFirstDraft, g_test

from otbound import SamplingParams
from otbound.block import prefix_law
from otbound.lm import Prompt, collect_traces, forward, lm_block_models, load_traces, speculative_sample, tiny_pair
from otbound.lm._specsample import resolve_settings

LEVEL = 1e-3
TARGET = {"top_k": 5, "top_p": 0.9, "repetition_penalty": 1.3}


@pytest.fixture(scope="module")
def pair8():
    return tiny_pair(8, noise=0.5, seed=1)


def test_traces_record_settings_and_their_laws(pair8, tmp_path):
    prompts = [Prompt("a", "toy", "", (1, 2, 3)), Prompt("b", "toy", "", (5, 0, 5, 5))]
    paths = collect_traces(pair8, prompts, tmp_path, temperatures=[0.8], max_new_tokens=6, progress=False,
                           target_settings=TARGET, draft_settings={"temperature": 0.6, "top_k": 3})
    assert all("T0.8-" in str(p) for p in paths)  # the folder is keyed by the settings
    (rec, *_) = load_traces(paths[0])
    sp, sq = rec.sampling_params()
    assert sp == SamplingParams(0.8, top_k=5, top_p=0.9, repetition_penalty=1.3)
    assert sq == SamplingParams(0.6, top_k=3, top_p=0.9, repetition_penalty=1.3)
    assert rec.meta["target_sampling"] == sp.as_dict() and rec.meta["draft_sampling"] == sq.as_dict()
    # the laws by hand: each position's logits under the settings, the penalty over its own prefix
    for t in range(rec.positions):
        ctx = rec.tokens[: rec.prompt_length + t]
        np.testing.assert_allclose(rec.p[t], sp.laws(rec.target_logits[t], ctx), atol=1e-15)
        np.testing.assert_allclose(rec.q[t], sq.laws(rec.draft_logits[t], ctx), atol=1e-15)
        assert (rec.q[t] > 0).sum() <= 3
        # the continuation was sampled from the truncated target law
        assert rec.p[t][rec.tokens[rec.prompt_length + t]] > 0
    # stored logits re-measure at other settings, without the models
    other = SamplingParams(1.3, top_p=0.5)
    (again, *_) = load_traces(paths[0], target_settings=other, draft_settings=other)
    np.testing.assert_allclose(again.p, other.laws(rec.target_logits), atol=1e-15)
    assert again.meta["target_sampling"] == sp.as_dict()
    # resuming with other settings writes elsewhere, never mixes
    more = collect_traces(pair8, prompts, tmp_path, temperatures=[0.8], max_new_tokens=6, progress=False)
    assert {p.parent.name for p in more} == {"T0.8"}


def test_resolve_settings_rules():
    sp, sq = resolve_settings(0.7, {"top_p": 0.8}, {"temperature": 0.9})
    assert sp == SamplingParams(0.7, top_p=0.8) and sq == SamplingParams(0.9, top_p=0.8)
    assert resolve_settings(1.0, SamplingParams(0.5, top_k=3))[1] == SamplingParams(0.5, top_k=3)
    with pytest.raises(ValueError, match="disagrees"):
        resolve_settings(0.7, SamplingParams(0.5))


def _target_law(pair, prompt, sp):
    """Exact law of the first two tokens of the target under its settings (all V prefixes)."""
    return prefix_law(lm_block_models(pair, prompt, sp.temperature, settings=(sp, sp))[0], 2)


def _first_two(pair, verifier, k, length, sp, sq, n=150):
    return [[tuple(speculative_sample(pair, prompt, verifier=verifier, num_drafts=k, block_len=length,
                                      target_settings=sp, draft_settings=sq, max_new_tokens=2, seed=[j, s]).tokens)
             for s in range(n)] for j, prompt in enumerate(PROMPTS)]


@pytest.mark.parametrize("t", [0.5, 0.8, 1.3])
@pytest.mark.parametrize("name", ["multipath_rrs", "static_tree"])
def test_one_iteration_exactly_lossless_on_truncated_lm_laws(pair8, t, name):
    """Exact: one iteration on the tiny pair's laws under truncated settings (every draft tuple and
    decision enumerated), the emitted block continued by the target has the target's law."""
    from otbound import BLOCK_VERIFIERS

    sp = SamplingParams(t, **TARGET)
    sq = SamplingParams(0.9 * t, top_k=4, repetition_penalty=1.3)
    tgt, drf = lm_block_models(pair8, PROMPTS[0], t, settings=(sp, sq))
    ver = BLOCK_VERIFIERS[name]
    assert ver.lossless_error(tgt, drf, vocab_size=8, num_drafts=2, block_len=2) < 1e-12


def test_decoder_lossless_for_truncated_target(pair8):
    """The decoder itself (deterministic drafting, one-hot verification at every tree node), by
    G-test on the first two tokens against the target's truncated law."""
    sp = SamplingParams(0.8, **TARGET)
    sq = SamplingParams(0.72, top_k=4, repetition_penalty=1.3)
    laws = [_target_law(pair8, prompt, sp) for prompt in PROMPTS]
    pv = g_test(_first_two(pair8, "onehot", 2, 2, sp, sq), laws)
    assert pv > LEVEL, f"G-test p = {pv:.2e}"


def test_the_g_test_rejects_a_lossy_verifier_at_these_settings(pair8):
    sp = SamplingParams(0.8, **TARGET)
    sq = SamplingParams(0.72, top_k=4, repetition_penalty=1.3)
    laws = [_target_law(pair8, prompt, sp) for prompt in PROMPTS]
    assert g_test(_first_two(pair8, TrustFirstDraft(), 2, 2, sp, sq), laws) < LEVEL


def test_decoder_laws_along_the_tree_follow_the_settings(pair8):
    sp = SamplingParams(0.8, **TARGET)
    sq = SamplingParams(0.7, top_k=3)
    r = speculative_sample(pair8, [3, 1, 4], verifier="rrs", num_drafts=2, block_len=2, target_settings=sp,
                           draft_settings=sq, max_new_tokens=8, seed=3, keep_laws=True)
    assert r.target_sampling == sp and r.draft_sampling == sq
    import torch

    for i, it in enumerate(r.iterations):
        ctx = r.context(i)
        for row in range(it.drafts.shape[0]):
            for ell in range(it.drafts.shape[1] + 1):
                pre = ctx + it.drafts[row, :ell].tolist()
                logits = forward(pair8.target, torch.tensor([pre]))[0, -1].numpy()
                np.testing.assert_allclose(it.p[row, ell], sp.laws(logits, pre), atol=1e-5)
            assert (it.q[row] > 0).sum(axis=-1).max() <= 3


def test_block_traces_follow_the_trace_settings(pair8, tmp_path):
    from otbound.lm import collect_block_traces, load_block_traces

    prompts = [Prompt("a", "toy", "", (1, 2, 3))]
    collect_traces(pair8, prompts, tmp_path / "t", temperatures=[0.8], max_new_tokens=6, progress=False,
                   target_settings=TARGET, draft_settings={"top_k": 3})
    out = collect_block_traces(pair8, tmp_path / "t", tmp_path / "b", num_drafts=2, block_length=2,
                               positions_per_trace=2, progress=False)
    assert all("T0.8-" in str(p) for p in out)
    sp, sq = SamplingParams(0.8, **TARGET), SamplingParams(0.8, top_k=3, top_p=0.9, repetition_penalty=1.3)
    for rec in load_block_traces(tmp_path / "b"):
        assert rec.sampling_params() == (sp, sq)
        for k in range(2):
            for ell in range(3):
                ctx = list(rec.prefix) + rec.drafts[k, :ell].tolist()
                np.testing.assert_allclose(rec.p[k, ell], sp.laws(rec.target_logits[k, ell], ctx), atol=1e-15)
                if ell < 2:
                    np.testing.assert_allclose(rec.q[k, ell], sq.laws(rec.draft_logits[k, ell], ctx), atol=1e-15)
                    assert rec.q[k, ell][rec.drafts[k, ell]] > 0  # drafted from the truncated law
                    assert (rec.q[k, ell] > 0).sum() <= 3
