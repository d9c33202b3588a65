"""The llama.cpp backend of the language-model layer: GGUF models run natively, full logits at every position.

A GGUF pair (the registered offline pair's files as assembled, no conversion, or any two GGUF files)
is loaded through llama.cpp's Python bindings, from the one llama.cpp build of
:func:`otbound.lm._llama_cpp.llama_cpp_build` (its shared ``libllama`` and the bindings' pure-Python
package from the same pinned source distribution; nothing is built twice). Quantised weights stay
quantised and memory-mapped; llama.cpp computes in float32 and keeps its KV cache in float32
(:data:`KV_CACHE`; its default float16 cache moved the tiny test models' logits by up to 1.6e-2, the
float32 one by 2e-5, against a float64 forward of the same weights).

Each :class:`LlamaCppModel` evaluates one token sequence at a time in its own context and returns the
float32 logits (all V entries) of exactly the positions asked for: row ``t`` of :meth:`LlamaCppModel.logits`
is the model's logit vector after ``tokens[: t + 1]``, so ``tokens[t + 1]`` is scored by row ``t``, as in
transformers' ``model(ids).logits[0, t]``.

Position 0. The token ids are the ones :func:`otbound.lm.encode_prompt` gives (the Hugging Face
tokenizer read from the same GGUF), evaluated as they are: llama.cpp's tokenizer is never asked, so no
beginning-of-sequence token is added or dropped and the two backends see the same sequence at the same
positions. The first position of a sequence has no context at all; on quantised models llama.cpp's law
there differs most from transformers' dequantised float32 law (total variation 0.84 on the real pair,
against a median of 0.0008 elsewhere). A trace's laws start after the last prompt token, so they use
position 0 only for a one-token prompt, which this backend refuses.

The continuation is sampled exactly as the transformers path samples it
(:func:`otbound.lm._decode.draw_tokens`, the same :class:`otbound.SamplingParams` laws and torch
generator): one prompt per batch, its generator seeded as a batch of one.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from otbound._validation import InvalidInputError
from otbound.lm._decode import draw_tokens
from otbound.lm._errors import ModelUnavailableError
from otbound.lm._llama_cpp import llama_cpp_build

#: the language-model backends of :func:`otbound.lm.load_pair` and ``python -m otbound.compare``
BACKENDS = ("transformers", "llama.cpp")
#: the default context length of a llama.cpp model (prompt + continuation, in tokens)
DEFAULT_CONTEXT = 4096
#: the KV cache's element type (recorded in every trace's ``backend_info``)
KV_CACHE = "f32"
#: tokens per llama.cpp decode call (its output buffer holds this many rows of V logits)
_BATCH = 256


def check_backend(backend: str) -> str:
    """``backend`` if it is one of :data:`BACKENDS`, else :class:`otbound.InvalidInputError`.

    Examples
    --------
    >>> from otbound.lm._llama_backend import check_backend
    >>> check_backend("llama.cpp")
    'llama.cpp'
    >>> check_backend("vllm")
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: backend must be one of ('transformers', 'llama.cpp'), got 'vllm'
    """
    if backend not in BACKENDS:
        raise InvalidInputError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def default_threads() -> int:
    """llama.cpp threads per model: half the CPUs this process may use, at least one (all of them
    spin-wait in llama.cpp's pool, which collapses throughput on busy machines).

    Examples
    --------
    >>> from otbound.lm._llama_backend import default_threads
    >>> default_threads() >= 1
    True
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus // 2)


def bindings(build=None):
    """The ``llama_cpp`` module of the bindings, on the shared library of ``build`` (default: the
    project's build, :func:`otbound.lm._llama_cpp.llama_cpp_build`, built once if missing).

    The bindings' pure-Python package is imported from the build's extracted sdist
    (``build.python_path``) with ``LLAMA_CPP_LIB_PATH`` set to ``build.lib_path``; a ``llama_cpp``
    already imported from elsewhere (an installed ``llama-cpp-python``) is refused, since its
    library would not be the recorded build.

    Raises
    ------
    otbound.lm.ModelUnavailableError
        A run-time dependency of the bindings (``diskcache``, ``jinja2``) is missing, or another
        ``llama_cpp`` is already imported.
    """
    if build is None:
        build = llama_cpp_build()
    package = Path(build.python_path) / "llama_cpp"
    loaded = sys.modules.get("llama_cpp")
    if loaded is not None:
        if Path(loaded.__file__).resolve().parent != package.resolve():
            raise ModelUnavailableError(f"another llama_cpp is already imported ({loaded.__file__}), not the "
                                        f"bindings of the otbound build at {build.root}")
        return loaded
    os.environ["LLAMA_CPP_LIB_PATH"] = str(build.lib_path)
    sys.path.insert(0, str(build.python_path))
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as exc:
        sys.modules.pop("llama_cpp", None)
        raise ModelUnavailableError(f"llama.cpp's Python bindings need {exc.name or exc} at run time: "
                                    "pip install diskcache jinja2") from exc
    finally:
        sys.path.remove(str(build.python_path))


class LlamaCppModel:
    """One GGUF model in llama.cpp: float32 logits of every asked-for position of one token sequence.

    Parameters
    ----------
    path : str or pathlib.Path
        The GGUF file.
    context : int
        Longest sequence (prompt + continuation) in tokens.
    threads : int, optional
        llama.cpp threads (default :func:`default_threads`).
    build : otbound.lm._llama_cpp.LlamaCppBuild, optional
        The llama.cpp build (default: the project's).

    Attributes
    ----------
    vocab_size : int
        The width of the logits.
    generation_config : types.SimpleNamespace
        ``eos_token_id``: the GGUF's end-of-sequence id (or None), read by
        :func:`otbound.lm.stop_token_ids` as for a transformers model.
    """

    backend = "llama.cpp"

    def __init__(self, path, *, context: int = DEFAULT_CONTEXT, threads: int | None = None, build=None):
        llama_cpp = bindings(build)
        threads = threads or default_threads()
        self.path = Path(path)
        self.context = int(context)
        self._llm = llama_cpp.Llama(model_path=str(self.path), n_ctx=self.context, n_batch=_BATCH, n_ubatch=_BATCH,
                                    n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False,
                                    type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
        self.vocab_size = int(self._llm.n_vocab())
        eos = int(self._llm.token_eos())
        self.generation_config = SimpleNamespace(eos_token_id=eos if eos >= 0 else None)
        self.metadata = dict(self._llm.metadata)
        self._tokens: list[int] = []  # the sequence the KV cache holds

    def _decode(self, tokens, keep_from: int) -> np.ndarray:
        """Append ``tokens`` to the sequence; float32 ``(len(tokens) − keep_from, V)``: the logits after
        each appended token from index ``keep_from`` on (llama.cpp computes the output layer only there)."""
        tokens = [int(t) for t in tokens]
        if self._past + len(tokens) > self.context:
            raise InvalidInputError(f"{self.path.name}: a sequence of {self._past + len(tokens)} tokens exceeds the "
                                    f"llama.cpp context of {self.context} (load_pair(..., context=...))")
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidInputError(f"token ids {bad[:5]} lie outside {self.path.name}'s vocabulary of "
                                    f"{self.vocab_size}")
        ctx, batch = self._llm._ctx, self._llm._batch
        rows = []
        for start in range(0, len(tokens), _BATCH):
            chunk = tokens[start:start + _BATCH]
            batch.set_batch(chunk, n_past=self._past, logits_all=False)
            wanted = [start + i >= keep_from for i in range(len(chunk))]
            for i, flag in enumerate(wanted):  # which positions llama.cpp computes logits for
                batch.batch.logits[i] = flag
            ctx.decode(batch)
            self._tokens += chunk
            m = sum(wanted)
            if m:
                flat = np.ctypeslib.as_array(ctx.get_logits(), shape=(m * self.vocab_size,))
                rows.append(flat.reshape(m, self.vocab_size).copy())  # (m, V) float32, out of llama.cpp's buffer
        return np.concatenate(rows) if rows else np.empty((0, self.vocab_size), dtype=np.float32)

    def reset(self) -> None:
        """Forget the sequence (clear the KV cache)."""
        self._llm._ctx.kv_cache_seq_rm(0, 0, -1)
        self._tokens = []

    def logits(self, tokens, start: int = 0) -> np.ndarray:
        """float32 ``(len(tokens) − start, V)``: row ``t`` is the logit vector after ``tokens[: start + t + 1]``.

        The sequence is evaluated from scratch (a fresh KV cache); logits are computed only from
        position ``start`` on.
        """
        if not 0 <= start < len(tokens):
            raise InvalidInputError(f"start must lie in [0, {len(tokens)}), got {start}")
        self.reset()
        return self._decode(tokens, start)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions of the sequence (drop the later ones from the KV cache)."""
        if not 0 <= length <= self._past:
            raise InvalidInputError(f"cannot keep {length} of a sequence of {self._past} tokens")
        self._llm._ctx.kv_cache_seq_rm(0, length, -1)
        del self._tokens[length:]

    @property
    def _past(self) -> int:
        return len(self._tokens)

    def logits_after(self, tokens) -> np.ndarray:
        """float32 ``(V,)``: the logit vector after ``tokens`` (at least one), reusing the KV cache of
        the longest common prefix with the sequence evaluated last: the sequence is cut there and only
        the rest is evaluated. Walking a tree of prefixes depth first costs one token per node."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise InvalidInputError("logits_after needs at least one token")
        common = 0
        for a, b in zip(self._tokens, tokens[:-1]):  # the last token is always evaluated again
            if a != b:
                break
            common += 1
        self.truncate(common)
        return self._decode(tokens[common:], len(tokens) - common - 1)[-1]

    def extend_all(self, tokens) -> np.ndarray:
        """Append ``tokens`` to the sequence: float32 ``(len(tokens), V)``, the logits after each (as a
        decoder's forward over new tokens on its KV cache)."""
        return self._decode(tokens, 0)

    def begin(self, tokens) -> np.ndarray:
        """Start a sequence: float32 ``(V,)``, the logits after its last token."""
        return self.logits(tokens, len(tokens) - 1)[0]

    def extend(self, token: int) -> np.ndarray:
        """Append one token to the sequence: float32 ``(V,)``, the logits after it."""
        return self._decode([token], 0)[0]

    def close(self) -> None:
        """Free llama.cpp's model and context now (else when collected)."""
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is not None:
            llm.close()


def gguf_tokenizer(path: Path):
    """The Hugging Face tokenizer stored in a GGUF file (the transformers path's tokenizer of it)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelUnavailableError(f"cannot read the tokenizer of {path}: {exc}") from exc


def sample_continuation(model: LlamaCppModel, prompt, *, temperature, max_new_tokens: int, vocab_size: int,
                        stop_ids=(), generator=None):
    """Sample a continuation of ``prompt`` (token ids) from ``model`` as
    :func:`otbound.lm._decode.sample_continuations` does for a batch of one: ``x_t`` drawn by
    :func:`otbound.lm._decode.draw_tokens` from the logits ``[:vocab_size]`` after the prompt and the
    earlier tokens; it ends at its first stop token (included) or after ``max_new_tokens``.

    Returns ``(continuation, logits)``: the token list and the float32 torch logits
    ``(len(continuation), vocab_size)`` each token was drawn from.
    """
    import torch

    if len(prompt) < 2:
        raise InvalidInputError("the llama.cpp backend needs prompts of at least 2 tokens: its law at the first "
                                "position of a sequence (no context) is not the transformers path's")
    settings = temperature if hasattr(temperature, "laws") else None
    context = torch.as_tensor([list(prompt)], dtype=torch.long) if settings is not None and settings.needs_context \
        else None
    last = model.begin(prompt)
    cont, rows = [], []
    for step in range(max_new_tokens):
        row = torch.from_numpy(last[:vocab_size].copy())[None]  # (1, V) float32
        rows.append(row[0])
        tok = int(draw_tokens(row, temperature, context, generator)[0])
        cont.append(tok)
        if context is not None:
            context = torch.cat([context, torch.tensor([[tok]])], dim=1)
        if tok in stop_ids or step + 1 == max_new_tokens:
            break
        last = model.extend(tok)
    return cont, torch.stack(rows)


def teacher_forced_logits(model: LlamaCppModel, prompt, continuation, *, vocab_size: int):
    """float32 torch ``(len(continuation), vocab_size)``: row ``t`` is ``model``'s logit vector for
    ``continuation[t]`` after ``prompt + continuation[:t]`` (one evaluation of the sequence)."""
    import torch

    seq = list(prompt) + list(continuation)
    rows = model.logits(seq[:-1], len(prompt) - 1)  # (n, V)
    return torch.from_numpy(np.ascontiguousarray(rows[:, :vocab_size]))
