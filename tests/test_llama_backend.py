"""The llama.cpp backend of the language-model layer on a tiny GGUF pair written with the ``gguf`` package.

Independent references: the float64 numpy forward of the same weights (:func:`tiny_gguf_logits`) for the
logits, and the transformers path (a Qwen2 model holding the same weights, float32) for the sampled tokens and
the trace format. The llama.cpp build is the project's one (:func:`llama_cpp_build`: about 20 minutes on 2
cores the first time, cached after).
"""

import json

import numpy as np
import pytest
from conftest import gguf_names_of_qwen2

from otbound._validation import InvalidInputError
from otbound.lm import ModelPair, Prompt, collect_traces, load_pair, load_traces
from otbound.lm._tiny_gguf import tiny_gguf_logits, write_tiny_gguf_pair
from otbound.token import SamplingParams

torch = pytest.importorskip("torch")

#: |llama.cpp float32 logits − float64 numpy logits| on the tiny models (logits up to ~25 in size): 2e-5 seen
#: with the float32 KV cache (1.6e-2 with llama.cpp's default float16 one), so 1e-3 leaves a 50× margin; a
#: wrong position (an added BOS, an off-by-one row) or a wrong formula moves the logits by O(1)
LOGIT_ATOL = 1e-3


@pytest.fixture(scope="module")
def build():
    from otbound.lm._llama_cpp import llama_cpp_build

    return llama_cpp_build()


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return write_tiny_gguf_pair(tmp_path_factory.mktemp("gguf"), seed=7)


@pytest.fixture(scope="module")
def llama(build, gguf):
    pair = load_pair((str(gguf.draft), str(gguf.target)), backend="llama.cpp", progress=False, context=256)
    yield pair
    pair.draft.close()
    pair.target.close()


def _hf_model(weights, c, eos_id):
    """A transformers Qwen2 holding ``weights`` (GGUF names), float32: the transformers path of the same model."""
    import transformers

    config = transformers.Qwen2Config(vocab_size=c.vocab_size, hidden_size=c.n_embd, intermediate_size=c.n_ff,
                                      num_hidden_layers=c.n_layer, num_attention_heads=c.n_head,
                                      num_key_value_heads=c.n_head_kv, rope_theta=c.rope_base, rms_norm_eps=c.rms_eps,
                                      max_position_embeddings=c.n_ctx, tie_word_embeddings=False,
                                      bos_token_id=eos_id, eos_token_id=eos_id)
    model = transformers.Qwen2ForCausalLM(config).float().eval()
    names = gguf_names_of_qwen2(c.n_layer)
    state = model.state_dict()
    model.load_state_dict({**state, **{hf: torch.tensor(weights[gg]) for hf, gg in names.items()}})
    return model


def _prompts(gguf, n=3):
    rng = np.random.default_rng(0)
    ids = gguf.text_ids()
    return [Prompt(f"tiny/{i}", "tiny", "", tuple(int(t) for t in rng.choice(ids, size=4 + i))) for i in range(n)]


def test_logits_of_every_position_equal_an_independent_forward(llama, gguf):
    rng = np.random.default_rng(1)
    seq = [int(t) for t in rng.choice(gguf.text_ids(), size=40)]
    for model, weights in ((llama.target, gguf.target_weights), (llama.draft, gguf.draft_weights)):
        expected = tiny_gguf_logits(weights, gguf.config, seq)                  # (40, V) float64
        got = model.logits(seq)                                                 # (40, V) float32, row 0 included
        assert got.shape == expected.shape == (40, gguf.config.vocab_size)
        np.testing.assert_allclose(got, expected, rtol=0, atol=LOGIT_ATOL)
        # a suffix of the rows, and the incremental calls the sampler makes, give the same rows
        np.testing.assert_allclose(model.logits(seq, 30), expected[30:], rtol=0, atol=LOGIT_ATOL)
        first = model.begin(seq[:10])
        steps = [model.extend(t) for t in seq[10:14]]
        np.testing.assert_allclose(np.stack([first, *steps]), expected[9:14], rtol=0, atol=LOGIT_ATOL)


def test_the_pair_records_its_backend_and_stop_tokens(llama, gguf, build):
    assert llama.backend == "llama.cpp"
    assert llama.name.endswith(" [llama.cpp]")
    assert llama.vocab_size == gguf.config.vocab_size
    assert llama.backend_info == {"engine": "llama.cpp", "llama_cpp_python": build.version, "build_key": build.key,
                                  "flags": list(build.flags), "kv_cache": "f32"}
    assert llama.target.generation_config.eos_token_id == gguf.eos_id
    assert len(llama.sources["target"]["sha256"]) == 64
    # the tokenizer is read from the GGUF: text the merges cover becomes the merged tokens
    assert llama.tokenizer("he", add_special_tokens=False).input_ids == [gguf.tokens.index("he")]


def test_traces_match_the_transformers_path_on_the_same_weights(llama, gguf, tmp_path):
    prompts = _prompts(gguf)
    target = _hf_model(gguf.target_weights, gguf.config, gguf.eos_id)
    draft = _hf_model(gguf.draft_weights, gguf.config, gguf.eos_id)
    hf = ModelPair("tiny-gguf", draft, target, None, torch.device("cpu"), torch.float32, gguf.config.vocab_size)
    kw = dict(temperatures=(1.0,), max_new_tokens=12, seed=3, progress=False, target_settings={"top_k": 50})
    paths_l = collect_traces(llama, prompts, tmp_path / "llama", **kw)
    paths_h = collect_traces(hf, prompts, tmp_path / "hf", batch_size=1, **kw)
    assert [p.relative_to(tmp_path / "llama") for p in paths_l] == [p.relative_to(tmp_path / "hf") for p in paths_h]
    for pl, ph in zip(paths_l, paths_h):
        (rl,), (rh,) = load_traces(pl), load_traces(ph)   # read back through their checksums
        assert rl.meta["backend"] == "llama.cpp" and rh.meta["backend"] == "transformers"
        assert rl.meta["backend_info"] == llama.backend_info and "backend_info" not in rh.meta
        assert rl.meta["model_dtype"] == "gguf"
        assert rl.meta["target_sampling"] == rh.meta["target_sampling"]
        assert rl.meta["batch_seed"] == rh.meta["batch_seed"]
        same = set(rl.meta) - {"backend", "backend_info", "pair", "sources", "model_dtype", "sha256"}
        assert {k: rl.meta[k] for k in same} == {k: rh.meta[k] for k in same}
        # the same sampling code and seed on logits equal to ~1e-5: the same tokens
        np.testing.assert_array_equal(rl.tokens, rh.tokens)
        assert rl.positions >= 1
        # the stored logits are each model's logits after the prefix (independent float64 forward)
        seq = rl.tokens.tolist()
        n, start = rl.positions, rl.prompt_length - 1
        np.testing.assert_allclose(rl.target_logits, tiny_gguf_logits(gguf.target_weights, gguf.config,
                                                                      seq[:-1])[start:start + n], atol=LOGIT_ATOL)
        np.testing.assert_allclose(rl.draft_logits, tiny_gguf_logits(gguf.draft_weights, gguf.config,
                                                                     seq[:-1])[start:start + n], atol=LOGIT_ATOL)
        # laws of the same settings (top-k 50), hence the same support, agree with transformers'
        assert np.abs(rl.p - rh.p).sum(axis=1).max() / 2 < 1e-3
        assert np.abs(rl.q - rh.q).sum(axis=1).max() / 2 < 1e-3


def test_continuations_follow_the_target_law_and_stop_at_eos(llama, gguf):
    from otbound.lm._llama_backend import sample_continuation

    prompt = _prompts(gguf, 1)[0].token_ids
    gen = torch.Generator().manual_seed(11)
    cont, rows = sample_continuation(llama.target, prompt, temperature=1.0, max_new_tokens=30,
                                     vocab_size=llama.vocab_size, stop_ids=[gguf.eos_id], generator=gen)
    assert rows.shape == (len(cont), llama.vocab_size) and rows.dtype == torch.float32
    assert gguf.eos_id not in cont[:-1]
    # each token is the draw of torch.multinomial from the settings' float64 law of the row (T = 1)
    # with the generator's stream
    replay = torch.Generator().manual_seed(11)
    law = SamplingParams(1.0).laws(rows)  # (n, V) float64
    drawn = [int(torch.multinomial(law[i:i + 1], 1, generator=replay)) for i in range(len(rows))]
    assert drawn == cont


def test_traces_of_one_backend_are_never_served_for_the_other(llama, gguf, tmp_path):
    prompts = _prompts(gguf, 1)
    collect_traces(llama, prompts, tmp_path, max_new_tokens=4, progress=False)
    target = _hf_model(gguf.target_weights, gguf.config, gguf.eos_id)
    draft = _hf_model(gguf.draft_weights, gguf.config, gguf.eos_id)
    hf = ModelPair(llama.name, draft, target, None, torch.device("cpu"), "gguf", gguf.config.vocab_size,
                   llama.sources)  # everything as the llama.cpp pair's but the backend
    with pytest.raises(InvalidInputError, match="backend"):
        collect_traces(hf, [*prompts, Prompt("tiny/x", "tiny", "", (5, 6, 7))], tmp_path, max_new_tokens=4,
                       progress=False)


def test_a_report_names_its_backend_and_refuses_a_folder_of_the_other(llama, gguf, tmp_path):
    from otbound.report import run_real_report

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}", "token_ids": list(p.token_ids)}) + "\n"
                            for i, p in enumerate(_prompts(gguf, 2))))
    kw = dict(datasets=[data], num_prompts=2, max_new_tokens=3, temperatures=(1.0,), num_drafts=(2,),
              out=tmp_path / "out", progress=False, verifiers=["rrs"], samplings=("with_replacement",),
              store_logits="none")
    spec = (str(gguf.draft), str(gguf.target))
    rows = run_real_report(spec, backend="llama.cpp", **kw)
    assert {r["positions"] for r in rows} == {6}
    marker = json.loads((tmp_path / "out" / "traces" / ".pair.json").read_text())
    assert marker["pair"].endswith("[llama.cpp]")
    with pytest.raises(InvalidInputError, match="another model pair"):
        run_real_report(spec, backend="transformers", **kw)


def test_forward_costs_are_measured_on_the_llama_cpp_kernels(llama):
    from otbound.plan import measure_forward_costs

    curve = measure_forward_costs(llama.target, vocab_size=llama.vocab_size, device="cpu", sizes=(1, 4, 16),
                                  context=32, repeats=2)
    assert curve.sizes == [1.0, 4.0, 16.0] and all(s > 0 for s in curve.seconds)
    assert curve.fitted == sorted(curve.fitted)


@pytest.mark.parametrize("kwargs, match", [
    (dict(dtype="bfloat16"), "dtype does not apply"),
    (dict(dtype="float32"), "dtype does not apply"),
    (dict(device="cuda"), "device does not apply"),
    (dict(context=1), "context must be"),
    (dict(threads=0), "threads must be"),
])
def test_load_pair_refuses_what_does_not_apply(gguf, kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        load_pair((str(gguf.draft), str(gguf.target)), backend="llama.cpp", progress=False, **kwargs)


def test_load_pair_refuses_unknown_backends_and_llama_options_elsewhere():
    with pytest.raises(InvalidInputError, match="backend must be one of"):
        load_pair("qwen2.5-coder", backend="vllm")
    with pytest.raises(InvalidInputError, match="llama.cpp backend only"):
        load_pair("qwen2.5-coder", context=512)


def test_missing_gguf_files_and_one_token_prompts_are_refused(llama, gguf, tmp_path):
    from otbound.lm import ModelUnavailableError

    with pytest.raises(ModelUnavailableError, match="does not exist"):
        load_pair((str(tmp_path / "no.gguf"), str(gguf.target)), backend="llama.cpp", progress=False)
    with pytest.raises(InvalidInputError, match="at least 2 tokens"):
        collect_traces(llama, [Prompt("one", "tiny", "", (5,))], tmp_path / "t", max_new_tokens=2, progress=False)
    with pytest.raises(InvalidInputError, match="exceeds the llama.cpp context"):
        llama.target.logits(list(range(5)) * 60)
    with pytest.raises(InvalidInputError, match="outside"):
        llama.target.logits([1, gguf.config.vocab_size])


def test_decoders_and_tree_collectors_refuse_the_llama_pair(llama, tmp_path):
    from otbound.lm import collect_block_traces, greedy_decode, speculative_sample

    with pytest.raises(InvalidInputError, match="needs the transformers backend"):
        greedy_decode(llama, [1, 2, 3], 4)
    with pytest.raises(InvalidInputError, match="needs the transformers backend"):
        speculative_sample(llama, [1, 2, 3], num_drafts=2, block_len=2, max_new_tokens=4)
    collect_traces(llama, [Prompt("a", "tiny", "", (1, 2, 3))], tmp_path / "t", max_new_tokens=3, progress=False)
    with pytest.raises(InvalidInputError, match="needs the transformers backend"):
        collect_block_traces(llama, tmp_path / "t", tmp_path / "b", num_drafts=2, block_length=2, progress=False)


def test_compare_runs_on_the_llama_cpp_backend_from_text_prompts(llama, gguf, tmp_path):
    from otbound import compare

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("hello there", "the rest is here")))
    out = compare.main(["--backend", "llama.cpp", "--pair", f"{gguf.draft},{gguf.target}", "--datasets", str(data),
                        "--num-prompts", "2", "--max-new-tokens", "4", "--temperature", "1.0", "--num-drafts", "2",
                        "--verifiers", "rrs", "--out", str(tmp_path / "out")])
    report = json.loads((out / "report.json").read_text())
    assert "llama.cpp" in json.dumps(report)
    records = list(load_traces(out / "traces"))
    assert len(records) == 2 and {r.meta["backend"] for r in records} == {"llama.cpp"}
    # the prompts were encoded by the GGUF's tokenizer: "hello there" is he·l·l·o·Ġt·he·re
    first = next(r for r in records if r.prompt_length == 7)
    assert first.tokens[:7].tolist() == llama.tokenizer("hello there", add_special_tokens=False).input_ids


@pytest.mark.parametrize("argv, match", [
    (["--backend", "llama.cpp", "--dtype", "float32"], "--dtype does not apply to --backend llama.cpp"),
    (["--backend", "llama.cpp", "--device", "cpu"], "--device does not apply to --backend llama.cpp"),
    (["--backend", "llama.cpp", "--synthetic"], "synthetic"),
    (["--backend", "llama.cpp", "--end-to-end"], "--end-to-end"),
    (["--backend", "llama.cpp", "--pair", "no.gguf,also-no.gguf"], "GGUF file"),
    (["--backend", "vllm"], "invalid choice"),
])
def test_compare_refuses_flags_that_do_not_apply(argv, match, tmp_path, capsys):
    from otbound.cli import compare

    with pytest.raises(SystemExit) as exc:
        compare.parse_args([*argv, "--out", str(tmp_path / "r")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err


@pytest.mark.realmodel
def test_the_real_pair_where_the_cache_holds_its_gguf_files(build):
    """The registered pair in llama.cpp, from GGUF files already assembled in the cache (never downloaded here)."""
    from otbound.lm import OFFLINE_MODELS, PAIRS, encode_prompt, load_prompts
    from otbound.lm._offline import gguf_path

    models = [OFFLINE_MODELS[m] for m in PAIRS["qwen2.5-coder"]]
    if not all(gguf_path(m).is_file() and gguf_path(m).stat().st_size == m.size for m in models):
        pytest.skip("the real pair's GGUF files are not in the cache (otbound.lm._offline.ensure_gguf assembles them)")
    pair = load_pair("qwen2.5-coder", backend="llama.cpp", progress=False, download=False, context=1024)
    try:
        assert pair.vocab_size == 151_936 and pair.name == "qwen2.5-coder [llama.cpp]"
        prompt = load_prompts("humaneval", 1)[0]
        ids = encode_prompt(pair.tokenizer, prompt)
        rows = pair.target.logits(ids, len(ids) - 8)                          # (8, V)
        assert rows.shape == (8, 151_936) and np.isfinite(rows).all()
        # a code model continues a prompt's own tokens: its argmax after each prefix is often the next token
        hits = np.mean(rows[:-1].argmax(axis=1) == np.asarray(ids[len(ids) - 7:]))
        assert hits >= 0.25
    finally:
        pair.draft.close()
        pair.target.close()


def _fake_model(tmp_path, monkeypatch, payload: bytes, sha256: str | None = None):
    """An offline model of two part wheels holding ``payload`` in a temporary cache (no network)."""
    import hashlib
    import zipfile

    from otbound.lm._offline import OfflineModel, _parts

    monkeypatch.setenv("OTBOUND_CACHE", str(tmp_path / "cache"))
    parts = _parts("fake-gguf-part", "1.0", 2)
    (tmp_path / "cache" / "wheels").mkdir(parents=True)
    half = len(payload) // 2
    for i, (part, chunk) in enumerate(zip(parts, (payload[:half], payload[half:])), start=1):
        with zipfile.ZipFile(tmp_path / "cache" / "wheels" / f"{part.module}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{part.module}/data/part0{i}.bin", chunk)
    digest = sha256 or hashlib.sha256(payload).hexdigest()
    return OfflineModel("fake", "fake.gguf", parts, len(payload), digest, "none")


def test_ensure_gguf_assembles_once_checks_and_reassembles_a_damaged_file(tmp_path, monkeypatch):
    from otbound.lm import ensure_gguf

    payload = bytes(range(256)) * 40
    model = _fake_model(tmp_path, monkeypatch, payload)
    path = ensure_gguf(model, download=False, progress=False)
    assert path.read_bytes() == payload
    mtime = path.stat().st_mtime_ns
    assert ensure_gguf(model, download=False, progress=False) == path and path.stat().st_mtime_ns == mtime
    damaged = bytearray(payload)
    damaged[7] ^= 1
    path.write_bytes(bytes(damaged))                        # same size: only a rehash sees it
    assert ensure_gguf(model, download=False, progress=False).read_bytes() == bytes(damaged)
    assert ensure_gguf(model, download=False, progress=False, verify_file=True).read_bytes() == payload


def test_ensure_gguf_refuses_bytes_of_another_checksum(tmp_path, monkeypatch):
    from otbound.lm import HashMismatchError, ensure_gguf

    model = _fake_model(tmp_path, monkeypatch, b"not the pinned model" * 10, sha256="0" * 64)
    with pytest.raises(HashMismatchError, match="Refusing to load it"):
        ensure_gguf(model, download=False, progress=False)
    assert [f.name for f in (tmp_path / "cache" / "gguf").iterdir()] == [".fake.gguf.lock"]   # no bytes kept


def test_logits_after_reuses_the_common_prefix_and_equals_an_independent_forward(llama, gguf):
    """Prefixes of a tree asked in an order that jumps between branches: every answer is the float64
    reference's row for that prefix (a stale KV cache entry or a wrong cut moves the logits by O(1))."""
    rng = np.random.default_rng(5)
    ids = gguf.text_ids()
    base = [int(t) for t in rng.choice(ids, size=6)]
    branches = [[int(t) for t in rng.choice(ids, size=3)] for _ in range(3)]
    asks = [base, base + branches[0][:2], base + branches[1], base + branches[1][:1], base + branches[0],
            base[:4], base + branches[2], base + branches[2]]   # deeper, sideways, shorter, repeated
    model = llama.target
    for seq in asks:
        expected = tiny_gguf_logits(gguf.target_weights, gguf.config, seq)[-1]
        np.testing.assert_allclose(model.logits_after(seq), expected, rtol=0, atol=LOGIT_ATOL)
    assert model._tokens == asks[-1]                               # the cache holds the last sequence
    with pytest.raises(InvalidInputError, match="at least one token"):
        model.logits_after([])


def _tree_pairs(llama, gguf):
    target = _hf_model(gguf.target_weights, gguf.config, gguf.eos_id)
    draft = _hf_model(gguf.draft_weights, gguf.config, gguf.eos_id)
    return ModelPair("tiny-gguf", draft, target, None, torch.device("cpu"), torch.float32, gguf.config.vocab_size)


def test_draft_trees_match_the_transformers_path_on_the_same_weights(llama, gguf, tmp_path):
    """The draft trees collected through llama.cpp (a depth-first walk on one KV cache) and through
    transformers (batched, cache repeated) on the same traces: the same children and laws."""
    from otbound.lm import collect_draft_trees, load_draft_trees

    hf = _tree_pairs(llama, gguf)
    traces = tmp_path / "traces"
    collect_traces(llama, _prompts(gguf, 2), traces, temperatures=(1.0,), max_new_tokens=8, seed=3, progress=False)
    kw = dict(width=3, depth=3, positions_per_trace=2, variants=[{}, {"top_k": 5}], progress=False)
    collect_draft_trees(llama, traces, tmp_path / "llama", **kw)
    collect_draft_trees(hf, traces, tmp_path / "hf", **kw)
    got, ref = list(load_draft_trees(tmp_path / "llama")), list(load_draft_trees(tmp_path / "hf"))
    assert len(got) == len(ref) >= 3                               # 2 positions a trace, 1 in a trace that stops at 1
    for a, b in zip(got, ref):
        assert (a.prompt_id, a.position) == (b.prompt_id, b.position)
        np.testing.assert_array_equal(a.children, b.children)
        assert a.target.shape == (2, 1 + 3 + 9, 4)
        # probabilities of float32 logits ~1e-5 apart (LOGIT_ATOL bounds them by 1e-3 in the logits)
        np.testing.assert_allclose(a.target, b.target, rtol=0, atol=2e-3)
        np.testing.assert_allclose(a.draft, b.draft, rtol=0, atol=2e-3)
        assert a.target[1, :, 3].max() < 1 and abs(a.target.sum(axis=2) - 1).max() < 1e-12


def test_live_block_models_and_the_oracle_script_run_on_llama_cpp(llama, gguf, tmp_path):
    """lm_block_models on a llama.cpp pair gives the transformers path's laws; experiments/oracle_tree.py
    collects draft trees and computes the true oracle through llama.cpp, equal to the oracle computed
    on the transformers path of the same weights."""
    import importlib
    import sys
    from pathlib import Path

    from otbound.block import oracle_tree_bound
    from otbound.lm import lm_block_models, load_draft_trees

    hf = _tree_pairs(llama, gguf)
    context = [int(t) for t in np.random.default_rng(2).choice(gguf.text_ids(), size=5)]
    lt, ld = lm_block_models(llama, context, 0.8)
    ht, hd = lm_block_models(hf, context, 0.8)
    for prefix in [(), (7,), (7, 9), (3,), (7,)]:
        np.testing.assert_allclose(lt(prefix), ht(prefix), rtol=0, atol=2e-3)
        np.testing.assert_allclose(ld(prefix), hd(prefix), rtol=0, atol=2e-3)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    script = importlib.import_module("oracle_tree")
    traces, trees = tmp_path / "traces", tmp_path / "trees"
    collect_traces(llama, _prompts(gguf, 2), traces, temperatures=(1.0,), max_new_tokens=6, seed=1, progress=False)
    res = script.main(["--trees", str(trees), "--collect", str(traces), "--pair", f"{gguf.draft},{gguf.target}",
                       "--backend", "llama.cpp", "--width", "2", "--depth", "2", "--budgets", "1", "2", "4",
                       "--temperature", "1.0", "--out", str(tmp_path), "--results", str(tmp_path)])
    rows = res["panels"]["stored draft trees, T = 1"]
    assert rows["trees"] == 2 and res["meta"]["backend"] == "llama.cpp"
    expected = np.mean([oracle_tree_bound(lm_block_models(hf, rec.prefix.tolist(), 1.0)[0], 4,
                                          max_depth=2).curve[[0, 1, 3]] for rec in load_draft_trees(trees)], axis=0)
    np.testing.assert_allclose(rows["oracle"], expected, rtol=0, atol=5e-3)
    assert (np.array(rows["static"]) <= np.array(rows["oracle"]) + 5e-3).all()
    # a rerun reads every tree's rows from the checkpoint (nothing appended) and gives the same values
    checkpoint = trees / "oracle_tree_rows.jsonl"
    lines = checkpoint.read_text().splitlines()
    assert len(lines) == 2
    checkpoint.write_text("\n".join(lines) + "\n" + '{"key": "torn')              # a torn last line is dropped
    again = script.main(["--trees", str(trees), "--pair", f"{gguf.draft},{gguf.target}", "--backend", "llama.cpp",
                         "--budgets", "1", "2", "4", "--temperature", "1.0", "--out", str(tmp_path), "--results",
                         str(tmp_path)])
    assert again["panels"]["stored draft trees, T = 1"]["oracle"] == rows["oracle"]
    assert checkpoint.read_text().splitlines() == lines                           # the torn line removed
