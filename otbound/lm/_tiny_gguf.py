"""A tiny random GGUF draft/target pair that ``llama-server`` loads, with a reference forward in numpy.

The files are written with the ``gguf`` package's ``GGUFWriter`` (the writer llama.cpp's own
converters use): architecture ``qwen2``, file type F32, a byte-level ``gpt2`` tokenizer with
pre-tokenizer ``qwen2`` (the 256 GPT-2 byte symbols, a few merged tokens, one control token that
ends a text), at least one merge (llama.cpp refuses a BPE vocabulary without merges), and F32
tensors under llama.cpp's Qwen2 names. Both files share one tokenizer, so llama.cpp accepts them as
a draft/target pair (``llama-server -m target.gguf -md draft.gguf``).

The target has random weights with its output layer scaled so that its laws are peaked (logits
of standard deviation ``sharpness``; the byte tokens 0x80–0xFF, never a whole UTF-8 character, get
logit 0, far below the top, since llama-server reports no probabilities for a token that leaves
incomplete UTF-8 text); the draft is the target with every tensor perturbed by
``noise`` × N(0, std²) (std: the tensor's own scale) and its logits sharpened by
``draft_sharpen``: a draft that mostly agrees with the target, so that acceptance is worth testing.
Two independently random models never accept a draft.

:func:`tiny_gguf_logits` is an independent forward of the same weights (Qwen2 as transformers
defines it: RMS norm, NeoX rotary embedding, grouped-query causal attention with q/k/v biases,
SwiGLU), in float64: the laws a test compares with what a llama.cpp engine reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from otbound._io import atomic_path
from otbound._validation import InvalidInputError, check_positive_int

#: merges of byte symbols (GPT-2's byte-to-unicode alphabet; ``Ġ`` is the space), in rank order
_MERGES = (("Ġ", "t"), ("h", "e"), ("i", "n"), ("e", "r"), ("a", "n"), ("o", "n"), ("r", "e"), ("e", "s"),
           ("o", "r"), ("a", "t"), ("e", "n"), ("Ġ", "a"), ("Ġ", "s"), ("e", "d"), ("i", "s"), ("Ġ", "w"))
#: the control token that ends a text (Qwen's name for it)
EOS_TEXT = "<|endoftext|>"


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each of the 256 bytes, in byte order."""
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    symbols, extra = {}, 0
    for b in range(256):
        if b in visible:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


@dataclass(frozen=True)
class TinyGGUFConfig:
    """The hyperparameters of both tiny models (they share them).

    Attributes
    ----------
    vocab_size, n_layer, n_embd, n_head, n_head_kv, n_ff, n_ctx : int
        Vocabulary, blocks, hidden size, attention heads, key/value heads, feed-forward width, context.
    rope_base : float
        Rotary embedding base θ.
    rms_eps : float
        RMS norm ε.

    Examples
    --------
    >>> from otbound.lm import TinyGGUFConfig
    >>> TinyGGUFConfig(vocab_size=264).head_dim
    8
    """

    vocab_size: int
    n_layer: int = 2
    n_embd: int = 32
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 64
    n_ctx: int = 512
    rope_base: float = 10000.0
    rms_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass(frozen=True)
class TinyGGUFPair:
    """A tiny GGUF pair written by :func:`write_tiny_gguf_pair`.

    Attributes
    ----------
    target, draft : Path
        The two ``.gguf`` files.
    target_weights, draft_weights : dict of str to numpy.ndarray
        Every tensor under its GGUF name (``token_embd.weight``, ``blk.0.attn_q.weight``, ...), float32,
        in PyTorch's (out, in) layout: exactly what the files hold.
    config : TinyGGUFConfig
    tokens : list of str
        The token list (byte symbols, merged tokens, then the control token).
    eos_id : int
        The id of ``<|endoftext|>`` (the last token; also the BOS id, never added to a prompt).
    merges : list of str
        The BPE merges (``"a b"``), in rank order.

    Examples
    --------
    >>> import tempfile
    >>> from otbound.lm import write_tiny_gguf_pair
    >>> pair = write_tiny_gguf_pair(tempfile.mkdtemp(), vocab_size=260)
    >>> len(pair.text_ids()), pair.tokens[pair.eos_id]
    (259, '<|endoftext|>')
    """

    target: Path
    draft: Path
    target_weights: dict = field(repr=False)
    draft_weights: dict = field(repr=False)
    config: TinyGGUFConfig
    tokens: list = field(repr=False)
    eos_id: int
    merges: list = field(repr=False)

    def text_ids(self) -> list[int]:
        """The ids of ordinary tokens (every id but the control token's)."""
        return [i for i in range(self.config.vocab_size) if i != self.eos_id]


def _random_weights(cfg: TinyGGUFConfig, rng: np.random.Generator, sharpness: float) -> dict:
    d, hd, V = cfg.n_embd, cfg.head_dim, cfg.vocab_size
    kv = cfg.n_head_kv * hd

    def mat(rows, cols, scale=None):
        scale = 1.0 / np.sqrt(cols) if scale is None else scale
        return (scale * rng.standard_normal((rows, cols))).astype(np.float32)

    w = {"token_embd.weight": mat(V, d, 1.0)}
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        w[b + "attn_norm.weight"] = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        # queries and keys scaled up so that attention is not uniform
        w[b + "attn_q.weight"] = mat(d, d, 2.0 / np.sqrt(d))
        w[b + "attn_q.bias"] = (0.1 * rng.standard_normal(d)).astype(np.float32)
        w[b + "attn_k.weight"] = mat(kv, d, 2.0 / np.sqrt(d))
        w[b + "attn_k.bias"] = (0.1 * rng.standard_normal(kv)).astype(np.float32)
        w[b + "attn_v.weight"] = mat(kv, d)
        w[b + "attn_v.bias"] = (0.1 * rng.standard_normal(kv)).astype(np.float32)
        w[b + "attn_output.weight"] = mat(d, d)
        w[b + "ffn_norm.weight"] = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        w[b + "ffn_gate.weight"] = mat(cfg.n_ff, d)
        w[b + "ffn_up.weight"] = mat(cfg.n_ff, d)
        w[b + "ffn_down.weight"] = mat(d, cfg.n_ff)
    w["output_norm.weight"] = np.ones(d, dtype=np.float32)
    # the normalised hidden state has unit RMS, so logits have standard deviation ≈ sharpness
    w["output.weight"] = mat(V, d, sharpness / np.sqrt(d))
    # bytes 0x80-0xFF (never a whole UTF-8 character) get logit 0, far below the top of the others:
    # llama-server returns no probabilities for a token that leaves incomplete UTF-8 text
    w["output.weight"][0x80:0x100] = 0.0
    return w


def _perturbed(weights: dict, rng: np.random.Generator, noise: float, draft_sharpen: float) -> dict:
    out = {}
    for name, t in weights.items():
        scale = float(np.std(t)) if t.size > 1 and np.std(t) > 0 else 0.1
        out[name] = (t + noise * scale * rng.standard_normal(t.shape)).astype(np.float32)
    out["output.weight"] = (draft_sharpen * out["output.weight"]).astype(np.float32)
    return out


def _write(path: Path, cfg: TinyGGUFConfig, weights: dict, tokens, types, merges, eos_id: int, name: str):
    import gguf

    with atomic_path(path) as tmp:
        writer = gguf.GGUFWriter(str(tmp), "qwen2")
        writer.add_name(name)
        writer.add_context_length(cfg.n_ctx)
        writer.add_embedding_length(cfg.n_embd)
        writer.add_block_count(cfg.n_layer)
        writer.add_feed_forward_length(cfg.n_ff)
        writer.add_head_count(cfg.n_head)
        writer.add_head_count_kv(cfg.n_head_kv)
        writer.add_rope_freq_base(cfg.rope_base)
        writer.add_layer_norm_rms_eps(cfg.rms_eps)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(eos_id)
        writer.add_eos_token_id(eos_id)
        writer.add_add_bos_token(False)
        for tensor_name, array in weights.items():
            writer.add_tensor(tensor_name, np.ascontiguousarray(array, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()


def write_tiny_gguf_pair(folder, *, vocab_size: int = 264, seed: int = 0, sharpness: float = 4.0,
                         noise: float = 0.05, draft_sharpen: float = 1.5, n_layer: int = 2, n_embd: int = 32,
                         n_head: int = 4, n_head_kv: int = 2, n_ff: int = 64, n_ctx: int = 512) -> TinyGGUFPair:
    """Write a tiny random Qwen2 draft/target pair as GGUF files that llama.cpp loads (CPU, < 1 s).

    Parameters
    ----------
    folder : str or Path
        Where ``target.gguf`` and ``draft.gguf`` are written (atomically; created if missing).
    vocab_size : int
        V ≥ 258: the 256 byte symbols, V − 257 merged tokens (at least one, at most 16) and
        ``<|endoftext|>`` (id V − 1).
    seed : int
        Seeds every weight (the same seed writes the same files).
    sharpness : float
        Standard deviation of the target's logits (> 0; larger: more peaked laws).
    noise : float
        The draft's perturbation, relative to each tensor's scale (≥ 0; 0: the draft's weights are
        the target's, up to ``draft_sharpen``).
    draft_sharpen : float
        The draft's logits are multiplied by this (> 0): a confident draft, as real drafts are.
    n_layer, n_embd, n_head, n_head_kv, n_ff, n_ctx : int
        The models' shape (``n_embd`` divisible by ``n_head``, ``n_head`` by ``n_head_kv``, head size even).

    Returns
    -------
    TinyGGUFPair
        The paths, both models' weights (numpy float32, GGUF names), the configuration and the vocabulary.

    Raises
    ------
    InvalidInputError
        On a vocabulary or shape llama.cpp cannot load.

    Examples
    --------
    >>> import tempfile
    >>> from otbound.lm._tiny_gguf import write_tiny_gguf_pair, tiny_gguf_logits
    >>> pair = write_tiny_gguf_pair(tempfile.mkdtemp(), seed=1)
    >>> pair.target.name, pair.draft.name, pair.config.vocab_size, pair.eos_id, pair.merges[0]
    ('target.gguf', 'draft.gguf', 264, 263, 'Ġ t')
    >>> tiny_gguf_logits(pair.target_weights, pair.config, [72, 101, 108]).shape
    (3, 264)
    """
    vocab_size = check_positive_int(vocab_size, "vocab_size")
    n_merges = vocab_size - 257
    if not 1 <= n_merges <= len(_MERGES):
        raise InvalidInputError(f"vocab_size must be between 258 and {257 + len(_MERGES)} (256 byte tokens, "
                                f"1 to {len(_MERGES)} merged tokens and <|endoftext|>), got {vocab_size}")
    for value, name in ((n_layer, "n_layer"), (n_embd, "n_embd"), (n_head, "n_head"), (n_head_kv, "n_head_kv"),
                        (n_ff, "n_ff"), (n_ctx, "n_ctx")):
        check_positive_int(value, name)
    if n_embd % n_head or n_head % n_head_kv or (n_embd // n_head) % 2:
        raise InvalidInputError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head}) with an even head size, "
                                f"and n_head a multiple of n_head_kv ({n_head_kv})")
    for value, name in ((sharpness, "sharpness"), (draft_sharpen, "draft_sharpen")):
        if not (np.isfinite(value) and value > 0):
            raise InvalidInputError(f"{name} must be a positive number, got {value!r}")
    if not (np.isfinite(noise) and noise >= 0):
        raise InvalidInputError(f"noise must be a non-negative number, got {noise!r}")
    cfg = TinyGGUFConfig(vocab_size=vocab_size, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                         n_ff=n_ff, n_ctx=n_ctx)
    import gguf

    merges = [f"{a} {b}" for a, b in _MERGES[:n_merges]]
    tokens = _byte_symbols() + [a + b for a, b in _MERGES[:n_merges]] + [EOS_TEXT]
    types = [gguf.TokenType.NORMAL] * (vocab_size - 1) + [gguf.TokenType.CONTROL]
    eos_id = vocab_size - 1
    rng = np.random.default_rng(seed)
    target = _random_weights(cfg, rng, float(sharpness))
    draft = _perturbed(target, rng, float(noise), float(draft_sharpen))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for role, weights in (("target", target), ("draft", draft)):
        paths[role] = folder / f"{role}.gguf"
        _write(paths[role], cfg, weights, tokens, types, merges, eos_id, f"otbound-tiny-{role}-seed{seed}")
    return TinyGGUFPair(target=paths["target"], draft=paths["draft"], target_weights=target, draft_weights=draft,
                        config=cfg, tokens=tokens, eos_id=eos_id, merges=merges)


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def tiny_gguf_logits(weights: dict, config: TinyGGUFConfig, token_ids) -> np.ndarray:
    """Qwen2's forward of ``weights`` over ``token_ids`` in float64: the (n, V) logits of every position.

    The formula is transformers' Qwen2: x ← E[ids]; per block x ← x + W_o·attn(RMSNorm(x)) with q, k,
    v biased, rotary embedding on halves (NeoX: θ_i = base^(−2i/d_head)), causal grouped-query
    softmax(q·kᵀ/√d_head); x ← x + W_down(silu(W_gate h) ⊙ W_up h) with h = RMSNorm(x); logits =
    W_out RMSNorm(x). Independent of llama.cpp: a test compares the two.

    Parameters
    ----------
    weights : dict
        Tensors under their GGUF names (``TinyGGUFPair.target_weights`` or ``draft_weights``).
    config : TinyGGUFConfig
    token_ids : sequence of int
        The context, first token first (no BOS is added).

    Returns
    -------
    numpy.ndarray
        (n, V) float64 logits; row i is the law of the token after ``token_ids[: i + 1]``.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> from otbound.lm._tiny_gguf import write_tiny_gguf_pair, tiny_gguf_logits
    >>> pair = write_tiny_gguf_pair(tempfile.mkdtemp())
    >>> a = tiny_gguf_logits(pair.target_weights, pair.config, [5, 6, 7])
    >>> b = tiny_gguf_logits(pair.target_weights, pair.config, [5, 6])
    >>> bool(np.allclose(a[:2], b))   # causal: a later token does not change earlier rows
    True
    """
    cfg = config
    ids = np.asarray(token_ids, dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= cfg.vocab_size:
        raise InvalidInputError(f"token_ids must be a non-empty list of ids below {cfg.vocab_size}")
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    n, hd, H, Hkv = ids.size, cfg.head_dim, cfg.n_head, cfg.n_head_kv
    x = w["token_embd.weight"][ids]                                           # (n, d)
    half = hd // 2
    inv_freq = cfg.rope_base ** (-np.arange(half) * 2.0 / hd)                   # (hd/2,)
    angles = np.arange(n)[:, None] * inv_freq[None, :]                          # (n, hd/2)
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]          # (n, 1, hd/2)

    def rope(t):                                                               # t: (n, heads, hd)
        a, b = t[..., :half], t[..., half:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    mask = np.triu(np.full((n, n), -np.inf), k=1)                               # (n, n)
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        h = _rms_norm(x, w[b + "attn_norm.weight"], cfg.rms_eps)
        q = (h @ w[b + "attn_q.weight"].T + w[b + "attn_q.bias"]).reshape(n, H, hd)
        k = (h @ w[b + "attn_k.weight"].T + w[b + "attn_k.bias"]).reshape(n, Hkv, hd)
        v = (h @ w[b + "attn_v.weight"].T + w[b + "attn_v.bias"]).reshape(n, Hkv, hd)
        q, k = rope(q), rope(k)
        group = H // Hkv
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)        # (n, H, hd)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask          # (H, n, n)
        scores -= scores.max(axis=-1, keepdims=True)
        att = np.exp(scores)
        att /= att.sum(axis=-1, keepdims=True)
        out = np.einsum("hqk,khd->qhd", att, v).reshape(n, H * hd)             # (n, d)
        x = x + out @ w[b + "attn_output.weight"].T
        h = _rms_norm(x, w[b + "ffn_norm.weight"], cfg.rms_eps)
        gate = h @ w[b + "ffn_gate.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * (h @ w[b + "ffn_up.weight"].T)) @ w[b + "ffn_down.weight"].T
    return _rms_norm(x, w["output_norm.weight"], cfg.rms_eps) @ w["output.weight"].T
