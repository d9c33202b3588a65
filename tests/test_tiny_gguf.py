"""The tiny GGUF pair: what the files hold, and the numpy forward against transformers' Qwen2."""

import numpy as np
import pytest
from conftest import gguf_names_of_qwen2

from otbound._validation import InvalidInputError
from otbound.lm._tiny_gguf import EOS_TEXT, tiny_gguf_logits, write_tiny_gguf_pair


def test_files_hold_the_weights_and_the_tokenizer(tmp_path):
    import gguf

    pair = write_tiny_gguf_pair(tmp_path, vocab_size=260, seed=3)
    for path, weights in ((pair.target, pair.target_weights), (pair.draft, pair.draft_weights)):
        reader = gguf.GGUFReader(str(path))
        tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
        assert set(tensors) == set(weights)
        for name, array in weights.items():
            assert tensors[name].dtype == np.float32
            np.testing.assert_array_equal(tensors[name].reshape(array.shape), array)
        fields = reader.fields
        assert bytes(fields["general.architecture"].parts[-1]).decode() == "qwen2"
        assert bytes(fields["tokenizer.ggml.model"].parts[-1]).decode() == "gpt2"
        assert bytes(fields["tokenizer.ggml.pre"].parts[-1]).decode() == "qwen2"
        tokens, merges = ([bytes(fields[key].parts[i]).decode() for i in fields[key].data]
                          for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))
        assert len(tokens) == 260 and tokens[-1] == EOS_TEXT and tokens[256] == "Ġt"
        assert tokens[65] == "A" and tokens[32] == "Ġ" and tokens[10] == "Ċ"
        assert merges == ["Ġ t", "h e", "i n"]
        assert int(fields["tokenizer.ggml.eos_token_id"].parts[-1][0]) == 259
    # the same seed writes the same weights; the draft differs from the target but stays close
    again = write_tiny_gguf_pair(tmp_path / "again", vocab_size=260, seed=3)
    np.testing.assert_array_equal(again.draft_weights["output.weight"], pair.draft_weights["output.weight"])
    assert not np.array_equal(pair.draft_weights["blk.0.attn_q.weight"], pair.target_weights["blk.0.attn_q.weight"])


def test_numpy_forward_matches_transformers_qwen2(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pair = write_tiny_gguf_pair(tmp_path, seed=5)
    c = pair.config
    config = transformers.Qwen2Config(vocab_size=c.vocab_size, hidden_size=c.n_embd, intermediate_size=c.n_ff,
                                      num_hidden_layers=c.n_layer, num_attention_heads=c.n_head,
                                      num_key_value_heads=c.n_head_kv, rope_theta=c.rope_base, rms_norm_eps=c.rms_eps,
                                      max_position_embeddings=c.n_ctx, tie_word_embeddings=False)
    config._attn_implementation = "eager"
    model = transformers.Qwen2ForCausalLM(config).double().eval()
    names = gguf_names_of_qwen2(c.n_layer)
    state = model.state_dict()
    assert set(names) == {k for k in state if "rotary" not in k}
    model.load_state_dict({**state, **{hf: torch.tensor(pair.draft_weights[gg], dtype=torch.float64)
                                       for hf, gg in names.items()}})
    ids = [72, 101, 108, 108, 111, 256, 3, 200, 17]
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    got = tiny_gguf_logits(pair.draft_weights, c, ids)
    # transformers computes the rotary angles in float32 even in a float64 model: ~4e-6 on logits of size ~5;
    # a wrong formula (rope layout, GQA grouping, a missing bias) moves them by O(1)
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5)


@pytest.mark.parametrize("kwargs", [dict(vocab_size=257), dict(vocab_size=300), dict(n_embd=30),
                                    dict(n_head=3, n_head_kv=2), dict(sharpness=0.0), dict(noise=-1.0)])
def test_bad_shapes_are_refused(tmp_path, kwargs):
    with pytest.raises(InvalidInputError):
        write_tiny_gguf_pair(tmp_path, **kwargs)
    assert not list(tmp_path.iterdir())


def test_forward_refuses_ids_outside_the_vocabulary(tmp_path):
    pair = write_tiny_gguf_pair(tmp_path)
    with pytest.raises(InvalidInputError):
        tiny_gguf_logits(pair.target_weights, pair.config, [0, 264])
