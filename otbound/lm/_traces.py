"""Token-level traces: target-sampled continuations with the target's and draft's laws at every
position, stored so that every bound and verifier reruns exactly without the models.

Collection, per prompt and temperature ``T`` (docs/theory/notation.md: T applies to both models):

1. sample a continuation ``y_1..y_n`` from the target at ``T`` (batched over prompts, KV cache;
   stops at an end-of-sequence token, which is kept, or after ``max_new_tokens``). The target's
   logits ``ℓ^p_t`` at each step, the very logits ``y_t`` was drawn from, are kept: they are the
   target's conditional given the prefix, as a teacher-forced pass would give (up to float
   rounding of the two computation orders, ~1e-6 in fp32), without paying for that pass;
2. one teacher-forced forward of the draft over prompt + continuation (batched) gives the draft
   logits ``ℓ^q_t`` at the same positions.

Format ``otbound-trace-1``: one safetensors file per (prompt, T) at
``<out>/<dataset>/T<T>/<prompt id>.safetensors`` holding

=================  ==========================  =============================================
tensor             shape, dtype                meaning
=================  ==========================  =============================================
``tokens``         (prompt_length + n,) int32  prompt ids then the sampled continuation
``target_logits``  (n, V) float32 or float16   target logits at each continuation position
``draft_logits``   (n, V) float32 or float16   draft logits at the same positions
=================  ==========================  =============================================

and JSON metadata (prompt id, dataset, temperature, prompt_length, the pair and its sources with
SHA-256, model dtype, the backend that ran the models (``backend``: ``"transformers"`` or
``"llama.cpp"``; for llama.cpp ``backend_info`` holds the bindings' version, the build key and its
cmake flags), seed, both models' sampling settings ``target_sampling`` / ``draft_sampling``
(:class:`otbound.SamplingParams` fields; the target sampled its continuation under its own), ...).
The laws are *defined* as the float64 laws of the stored logits under those settings — by default
the softmax of the logits divided by T (:meth:`otbound.SamplingParams.laws`; a repetition
penalty reads each position's prefix) — computed identically on every read, so each row sums to 1
up to float64 rounding (≈1e-16·√V, far inside ``LAW_ATOL = 1e-6``); storing float32 softmax rows
instead would not meet that tolerance in general. Size per position: ``2·V·4`` bytes
(float32; 1,215,488 B for V = 151,936) or half that in float16, plus 4 bytes of token id.
float32 storage of an fp32 model is lossless; float16 rounds logits by up to ~|ℓ|·2⁻¹¹.
``logits_dtype="none"`` (streaming, ``on_trace``) stores the tokens and metadata only; the
per-position measurements made while collecting (:func:`otbound.report.run_real_report`) are then all
that is kept of the laws.
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from otbound._integrity import CorruptFileError
from otbound._io import progress_bar, safe_name, temperature_dir
from otbound._validation import InvalidInputError, check_positive_int, check_temperatures
from otbound.lm import _llama_backend as llama
from otbound.lm import _store
from otbound.lm._decode import (
    prefix_cache,
    require_transformers,
    sample_continuations,
    stop_token_ids,
    teacher_forced_logits,
)
from otbound.lm._prompts import encode_prompt
from otbound.token import SamplingParams, settings_at

TRACE_FORMAT = "otbound-trace-1"


class LogitLaws:
    """``p`` / ``q``: the float64 laws of the stored ``target_logits`` / ``draft_logits`` (last axis =
    vocabulary) under each model's sampling settings (:meth:`sampling_params`: the record's
    ``target_sampling`` / ``draft_sampling``, else ``softmax(logits / T)`` at its temperature),
    computed once on first use. A repetition penalty reads :meth:`contexts`."""

    def sampling_params(self) -> tuple[SamplingParams, SamplingParams]:
        """``(target, draft)`` :class:`otbound.SamplingParams` the laws are defined by."""
        t = float(self.temperature)
        return (getattr(self, "target_sampling", None) or SamplingParams(t),
                getattr(self, "draft_sampling", None) or SamplingParams(t))

    def contexts(self):
        """Token ids before every law row (shape of the logits' leading axes + (n,), ``-1`` padding),
        for a repetition penalty; None where the record has none."""
        return None

    def _laws(self, which: str, rows=None):
        sp, sq = self.sampling_params()
        settings, logits = (sp, self.target_logits) if which == "p" else (sq, self.draft_logits)
        ctx = self.contexts() if settings.needs_context else None
        if ctx is not None:  # the draft's laws along a tree stop one depth earlier than the target's
            ctx = ctx[tuple(slice(0, d) for d in np.shape(logits)[:-1])]
        if rows is not None:
            logits = logits[rows]
            ctx = None if ctx is None else ctx[rows]
        return settings.laws(logits, ctx)  # the sampling settings' law (float64)

    @cached_property
    def p(self) -> np.ndarray:
        return self._laws("p")

    @cached_property
    def q(self) -> np.ndarray:
        return self._laws("q")

    def laws_at(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """``(p[rows], q[rows])`` computed for those rows only (nothing cached): a stride through a
        long trace without the float64 laws of every position."""
        return self._laws("p", rows), self._laws("q", rows)


def prefix_contexts(tokens, start: int, n: int) -> np.ndarray:
    """``(n, start + n − 1)`` int64: row t holds ``tokens[:start + t]`` then ``-1`` padding (the
    context of the law at continuation position t, for a repetition penalty).

    Examples
    --------
    >>> prefix_contexts([5, 6, 7], 1, 2).tolist()
    [[5, -1], [5, 6]]
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    width = max(start + n - 1, 1)
    out = np.full((n, width), -1, dtype=np.int64)
    for t in range(n):
        out[t, : start + t] = tokens[: start + t]
    return out


def record_settings(meta: dict, temperature: float) -> tuple[SamplingParams, SamplingParams]:
    """The ``(target, draft)`` settings a stored file was collected with (files from before the
    settings were recorded: ``softmax(logits / T)`` for both)."""
    t = float(temperature)
    sp = SamplingParams.from_dict(meta["target_sampling"]) if "target_sampling" in meta else SamplingParams(t)
    sq = SamplingParams.from_dict(meta["draft_sampling"]) if "draft_sampling" in meta else SamplingParams(t)
    return sp, sq


def settings_dir(temperature: float, target: SamplingParams | None = None,
                 draft: SamplingParams | None = None) -> str:
    """Folder name of a (temperature, settings) cell: ``T<T>`` when both models sample plain
    ``softmax(logits / T)``, else ``T<T>-<8 hex digits of the settings>`` (runs at other settings
    never share a folder).

    Examples
    --------
    >>> settings_dir(0.7)
    'T0.7'
    >>> settings_dir(0.7, SamplingParams(0.7, top_k=20)).startswith('T0.7-')
    True
    """
    t = float(temperature)
    plain = SamplingParams(t)
    if (target is None or target == plain) and (draft is None or draft == plain):
        return temperature_dir(t)
    key = json.dumps([(target or plain).as_dict(), (draft or plain).as_dict()], sort_keys=True)
    return f"{temperature_dir(t)}-{zlib.crc32(key.encode()):08x}"


@dataclass
class TraceRecord(LogitLaws):
    """One stored trace. ``p``/``q``: float64 laws (positions × V) of target and draft.

    Parameters
    ----------
    prompt_id, dataset : str
        The prompt's id and dataset.
    temperature : float
        T of the trace.
    tokens : numpy.ndarray
        (prompt_length + n,) prompt ids then the sampled continuation.
    prompt_length : int
        Tokens of the prompt.
    target_logits, draft_logits : numpy.ndarray
        (n, V) logits at each continuation position.
    meta : dict
        The stored metadata (configuration, sources, checksums).
    path : pathlib.Path, optional
        The file it was read from.
    target_sampling, draft_sampling : otbound.SamplingParams, optional
        The settings defining ``p`` / ``q`` (default ``softmax(logits / T)``).

    Examples
    --------
    A record as :func:`load_traces` yields it, here built by hand: a prompt of one token, then two
    continuation tokens with the two models' logits over V = 3 (the laws are their softmax at T;
    a repetition penalty in the settings reads each position's prefix).

    >>> import numpy as np
    >>> from otbound import SamplingParams
    >>> from otbound.lm import TraceRecord
    >>> logits = np.log([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    >>> rec = TraceRecord("demo/0", "demo", 1.0, np.array([2, 0, 1]), 1, logits, logits[::-1])
    >>> rec.positions, rec.continuation.tolist(), rec.p.round(3).tolist()
    (2, [0, 1], [[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    >>> rec.q[0].round(3).tolist(), rec.contexts().tolist()   # the draft's laws; the laws' prefixes
    ([0.1, 0.6, 0.3], [[2, -1], [2, 0]])
    >>> hot = TraceRecord("demo/0", "demo", 1.0, rec.tokens, 1, logits, logits, target_sampling=SamplingParams(2.0))
    >>> hot.p[0].round(3).tolist()    # the target's laws at its own settings (T = 2)
    [0.415, 0.322, 0.263]
    """

    prompt_id: str
    dataset: str
    temperature: float
    tokens: np.ndarray
    prompt_length: int
    target_logits: np.ndarray = field(repr=False)
    draft_logits: np.ndarray = field(repr=False)
    meta: dict = field(default_factory=dict, repr=False)
    path: Path | None = None
    target_sampling: SamplingParams | None = None
    draft_sampling: SamplingParams | None = None

    @property
    def positions(self) -> int:
        return int(self.tokens.size - self.prompt_length)

    def contexts(self):
        return prefix_contexts(self.tokens, self.prompt_length, self.positions)

    @property
    def continuation(self) -> np.ndarray:
        return self.tokens[self.prompt_length:]


def _config(pair, max_new_tokens, seed, logits_dtype) -> dict:
    config = {"pair": pair.name, "sources": pair.sources, "model_dtype": str(pair.dtype).removeprefix("torch."),
              "max_new_tokens": int(max_new_tokens), "seed": int(seed), "logits_dtype": logits_dtype,
              "vocab_size": int(pair.vocab_size), "backend": backend_of(pair)}
    if getattr(pair, "backend_info", None):
        config["backend_info"] = pair.backend_info
    return config


def backend_of(pair_or_meta) -> str:
    """The backend that ran a pair, or that collected a trace (its metadata; traces from before the
    backend was recorded were collected by transformers).

    Examples
    --------
    >>> backend_of({"pair": "p"}), backend_of({"backend": "llama.cpp"})
    ('transformers', 'llama.cpp')
    """
    if isinstance(pair_or_meta, dict):
        return pair_or_meta.get("backend", "transformers")
    return getattr(pair_or_meta, "backend", "transformers")


def trace_path(out, prompt, temperature, target=None, draft=None) -> Path:
    """``<out>/<dataset>/<settings_dir>/<prompt id>.safetensors`` (:func:`settings_dir`).

    Parameters
    ----------
    out : str or pathlib.Path
        The trace folder.
    prompt : otbound.lm.Prompt
    temperature : float
    target, draft : otbound.SamplingParams, optional
        Settings besides T (they name the folder).

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> from otbound.lm import Prompt
    >>> trace_path("traces", Prompt("gsm8k/7", "gsm8k", "2 + 2?"), 0.7).as_posix()
    'traces/gsm8k/T0.7/gsm8k_7.safetensors'
    """
    return Path(out) / safe_name(prompt.dataset) / settings_dir(temperature, target, draft) / (
        safe_name(prompt.id) + ".safetensors")


def collect_traces(pair, prompts, out, *, temperatures=(1.0,), max_new_tokens: int = 64,
                   batch_size: int | None = None, seed: int = 0, logits_dtype: str = "float32",
                   progress: bool = True, on_trace=None, target_settings=None,
                   draft_settings=None) -> list[Path]:
    """Collect (or resume) the traces of ``prompts`` for each temperature into folder ``out``.

    ``target_settings`` / ``draft_settings``: the sampling settings besides T (fields of
    :class:`otbound.SamplingParams`, as in :func:`otbound.token.settings_at`: the draft's unset
    fields follow the target's). The target samples its continuation from its law under its
    settings; both settings are stored in the metadata, name the folder (:func:`settings_dir`)
    and define the laws on every read.

    ``pair``: a :class:`ModelPair` (or a callable returning one, called only if some trace is
    missing, so a finished run needs no model). Existing trace files are kept and their
    configuration checked against this call: a different seed, ``max_new_tokens`` or
    ``logits_dtype`` raises instead of mixing runs, and so do a different pair or model dtype
    whenever the pair is loaded (some trace missing). ``batch_size``: prompts per batch (default
    8 on CPU, 32 on CUDA). Returns the paths of all requested traces, in (temperature, prompt)
    order.

    Streaming: ``on_trace(record)`` is called with each new :class:`TraceRecord` before its file is
    written, its logits still torch tensors on the model's device (e.g. to measure them there, as
    :func:`otbound.report.run_real_report` does); ``logits_dtype="none"`` then stores only the tokens
    and metadata (the file still marks the prompt done, so a rerun resumes after it).

    Parameters
    ----------
    pair : otbound.lm.ModelPair or callable
        The models, or a function loading them.
    prompts : sequence of otbound.lm.Prompt
        Prompt ids unique within a dataset.
    out : str or pathlib.Path
        The trace folder.
    temperatures : sequence of float
        Positive temperatures.
    max_new_tokens : int
        Longest continuation.
    batch_size : int, optional
        Prompts per batch.
    seed : int
        Seed of the sampling.
    logits_dtype : {"float32", "float16", "none"}
        Storage of the logits.
    progress : bool
        Show a progress bar.
    on_trace : callable, optional
        Called with each new :class:`TraceRecord`.
    target_settings, draft_settings : dict or otbound.SamplingParams, optional
        Sampling settings besides T.

    Returns
    -------
    list of pathlib.Path

    Raises
    ------
    otbound.InvalidInputError
        Bad arguments, duplicate prompt ids, or stored traces of another configuration or pair.

    Examples
    --------
    >>> import tempfile
    >>> from otbound.lm import Prompt, collect_traces, load_traces, tiny_pair, tiny_prompts
    >>> pair = tiny_pair()
    >>> prompts = [Prompt(f"tiny/{i}", "tiny", "", tuple(ids)) for i, ids in enumerate(tiny_prompts(pair, 2))]
    >>> tmp = tempfile.TemporaryDirectory()
    >>> out = tmp.name
    >>> paths = collect_traces(pair, prompts, out, max_new_tokens=3, progress=False)
    >>> [p.relative_to(out).as_posix() for p in paths]
    ['tiny/T1/tiny_0.safetensors', 'tiny/T1/tiny_1.safetensors']
    >>> collect_traces(None, prompts, out, max_new_tokens=3, progress=False) == paths  # resumed: no model needed
    True
    >>> [(r.prompt_id, r.temperature, r.positions) for r in load_traces(out)]   # read back
    [('tiny/0', 1.0, 3), ('tiny/1', 1.0, 3)]
    >>> from otbound import SamplingParams
    >>> hot = next(load_traces(paths[0], target_settings=SamplingParams(2.0)))  # the target re-measured at T = 2
    >>> hot.sampling_params()[0].temperature, hot.p.shape
    (2.0, (3, 12))
    >>> tmp.cleanup()
    """
    import torch

    temps = check_temperatures(temperatures)
    settings = {t: settings_at(t, target_settings, draft_settings) for t in temps}
    if logits_dtype not in _store.STORE_DTYPES + ("none",):
        raise InvalidInputError(f"logits_dtype must be one of {_store.STORE_DTYPES + ('none',)}, got {logits_dtype!r}")
    if logits_dtype == "none" and on_trace is None:
        raise InvalidInputError("logits_dtype='none' keeps no laws: pass on_trace to measure them while collecting")
    max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens")
    ids = [p.id for p in prompts]
    if len(set((p.dataset, p.id) for p in prompts)) != len(prompts):
        raise InvalidInputError(f"prompt ids must be unique within a dataset, got {ids}")
    paths = [[trace_path(out, p, t, *settings[t]) for p in prompts] for t in temps]
    todo = [(t, p, path) for t, row in zip(temps, paths) for p, path in zip(prompts, row) if not _intact(path)]
    config = {"max_new_tokens": int(max_new_tokens), "seed": int(seed), "logits_dtype": logits_dtype}
    if todo:
        pair = pair() if callable(pair) else pair
        config = _config(pair, max_new_tokens, seed, logits_dtype)
    kept = [(t, p, path) for t, row in zip(temps, paths) for p, path in zip(prompts, row) if path.exists()]
    for t, p, path in kept:
        # plain settings are not compared: files from before the settings were recorded are plain
        plain = settings[t] == (SamplingParams(t), SamplingParams(t))
        _check_config(path, dict(config, format=TRACE_FORMAT, temperature=t, dataset=p.dataset, prompt_id=p.id,
                                 **({} if plain else _settings_meta(*settings[t]))))
    _check_one_pair([path for _, _, path in kept])
    if not todo:
        return [path for row in paths for path in row]
    bs = batch_size or (32 if pair.device.type == "cuda" else 8)
    if backend_of(pair) == "llama.cpp":  # one sequence at a time: a batch of one, seeded as such
        bs = 1
    stops = stop_token_ids(pair.tokenizer, pair.target)
    bar = progress_bar(len(todo), "traces", progress)
    n_pos, t0 = 0, time.perf_counter()
    for temp in temps:
        # batches of similar prompt lengths: left padding then wastes little compute. Batches are formed
        # over all prompts, and a batch with any trace missing is sampled whole, so that a resumed run
        # draws exactly what an uninterrupted one does (the sampler and its seed depend on the batch)
        missing = {path for t, _, path in todo if t == temp}
        row = paths[temps.index(temp)]
        mine = sorted(((p, path, encode_prompt(pair.tokenizer, p)) for p, path in zip(prompts, row)),
                      key=lambda item: len(item[2]))
        for start in range(0, len(mine), bs):
            if not missing.intersection(path for _, path, _ in mine[start:start + bs]):
                continue
            chunk = [(p, path) for p, path, _ in mine[start:start + bs]]
            encoded = [enc for _, _, enc in mine[start:start + bs]]
            batch_seed = zlib.crc32(f"{seed}|{temp!r}|{chunk[0][0].dataset}|{chunk[0][0].id}".encode())
            gen = torch.Generator(device=pair.device).manual_seed(batch_seed)
            if backend_of(pair) == "llama.cpp":
                cont, lt = llama.sample_continuation(pair.target, encoded[0], temperature=settings[temp][0],
                                                     max_new_tokens=max_new_tokens, vocab_size=pair.vocab_size,
                                                     stop_ids=stops, generator=gen)
                conts, tl = [cont], [lt]
                dl = [llama.teacher_forced_logits(pair.draft, encoded[0], cont, vocab_size=pair.vocab_size)]
            else:
                conts, tl = sample_continuations(pair.target, encoded, temperature=settings[temp][0],
                                                 max_new_tokens=max_new_tokens, vocab_size=pair.vocab_size,
                                                 stop_ids=stops, generator=gen)
                dl = teacher_forced_logits(pair.draft, encoded, conts, vocab_size=pair.vocab_size)
            for (prompt, path), enc, cont, lt, ld in zip(chunk, encoded, conts, tl, dl):
                if path not in missing:
                    continue
                meta = dict(config, format=TRACE_FORMAT, prompt_id=prompt.id, dataset=prompt.dataset,
                            temperature=temp, prompt_length=len(enc), batch_seed=batch_seed,
                            stopped=bool(cont and cont[-1] in stops), **_settings_meta(*settings[temp]))
                tokens = np.asarray(enc + cont, dtype=np.int32)
                if on_trace is not None:
                    on_trace(TraceRecord(prompt.id, prompt.dataset, temp, tokens.astype(np.int64), len(enc), lt, ld,
                                         meta, path, *settings[temp]))
                tensors = {"tokens": tokens}
                if logits_dtype != "none":
                    tensors.update(target_logits=_store.to_store(lt, logits_dtype),
                                   draft_logits=_store.to_store(ld, logits_dtype))
                _store.write_atomic(path, tensors, meta)
                n_pos += len(cont)
            bar.update(len(missing.intersection(path for _, path in chunk)))
            bar.set_postfix(pos_per_s=f"{n_pos / (time.perf_counter() - t0):.1f}")
    bar.close()
    return [path for row in paths for path in row]


def _settings_meta(target: SamplingParams, draft: SamplingParams) -> dict:
    return {"target_sampling": target.as_dict(), "draft_sampling": draft.as_dict()}


def _check_config(path: Path, config: dict) -> None:
    meta = _store.read_meta(path)
    meta.setdefault("backend", backend_of(meta))
    diff = {k: (meta.get(k), v) for k, v in config.items() if meta.get(k) != v}
    if diff:
        raise InvalidInputError(
            f"{path} was collected with a different configuration {diff} (stored, requested); "
            f"write to another folder or delete it"
        )


def _intact(path: Path) -> bool:
    """Whether a stored trace exists and passes its checksums; a damaged one is removed (re-collected)."""
    if not path.exists():
        return False
    try:
        _store.read(path)
    except CorruptFileError as err:
        print(f"otbound: {err}; re-collecting it", file=sys.stderr)
        path.unlink()
        return False
    return True


def _check_one_pair(paths) -> None:
    """Every kept trace of a folder comes from one pair, model dtype and vocabulary (also when no model
    is loaded to compare them with)."""
    seen = {}
    for path in paths:
        meta = _store.read_meta(path)
        meta.setdefault("backend", backend_of(meta))
        key = tuple(json.dumps(meta.get(k), sort_keys=True) for k in _PAIR_FIELDS)
        seen.setdefault(key, path)
    if len(seen) > 1:
        (a, pa), (b, pb) = list(seen.items())[:2]
        raise InvalidInputError(
            f"the trace folder mixes runs of different pairs: {pa} has {dict(zip(_PAIR_FIELDS, a))}, {pb} has "
            f"{dict(zip(_PAIR_FIELDS, b))}; write to another folder or delete one"
        )


_PAIR_FIELDS = ("pair", "sources", "model_dtype", "vocab_size", "backend", "backend_info")


def load_traces(path, *, dataset: str | None = None, temperature: float | None = None, target_settings=None,
                draft_settings=None):
    """Yield the :class:`TraceRecord` of a trace file, or of every trace under a folder (sorted by
    path), optionally only those of ``dataset`` / ``temperature``.

    ``target_settings`` / ``draft_settings`` (:class:`otbound.SamplingParams`): re-measure stored
    logits at other settings, without the models — the records' laws are then those settings'
    (the stored ones stay in ``meta``). The positions remain those of the stored continuation,
    which the target sampled at its stored settings.

    Parameters
    ----------
    path : str or pathlib.Path
        A trace file or a folder of them.
    dataset : str, optional
    temperature : float, optional
    target_settings, draft_settings : otbound.SamplingParams, optional
        Settings to re-measure the stored logits at.

    Yields
    ------
    TraceRecord

    Raises
    ------
    otbound.InvalidInputError
        No file or folder at ``path``, a file of another format, settings that are not
        :class:`otbound.SamplingParams`, or (its subclass ``CorruptFileError``) a file failing its
        checksums.

    Examples
    --------
    The round trip (collected, read back, re-measured at other settings) is the example of
    :func:`collect_traces`. A path holding no traces is refused, naming it:

    >>> from otbound.lm import load_traces
    >>> next(load_traces("no/such/folder"))
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: no trace file or folder at no/such/folder
    """
    for which, given in (("target_settings", target_settings), ("draft_settings", draft_settings)):
        if given is not None and not isinstance(given, SamplingParams):
            hint = f" (e.g. SamplingParams(**{given!r}))" if isinstance(given, dict) else ""
            raise InvalidInputError(f"{which} must be an otbound.SamplingParams, got {type(given).__name__}{hint}")
    for file in _files(path, TRACE_FORMAT):
        tensors, meta = _store.read(file)
        if dataset is not None and meta["dataset"] != dataset:
            continue
        if temperature is not None and float(meta["temperature"]) != float(temperature):
            continue
        sp, sq = record_settings(meta, meta["temperature"])
        yield TraceRecord(meta["prompt_id"], meta["dataset"], float(meta["temperature"]),
                          tensors["tokens"].astype(np.int64), int(meta["prompt_length"]),
                          tensors.get("target_logits"), tensors.get("draft_logits"), meta, file,
                          target_settings or sp, draft_settings or sq)


def _files(path, fmt: str):
    path = Path(path)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(path.rglob("*.safetensors"))
    else:
        raise InvalidInputError(f"no trace file or folder at {path}")
    for f in files:
        meta = _store.read_meta(f)
        if meta.get("format") == fmt:
            yield f
        elif path.is_file():
            raise InvalidInputError(f"{f} is not an {fmt} file (format {meta.get('format')!r})")


def collect_at_positions(pair, traces, out, *, config: dict, fmt: str, label: str, positions_per_trace: int,
                         seed: int, progress: bool, measure, check_meta=None,
                         backends=("transformers",)) -> list[Path]:
    """The per-trace driver of :func:`otbound.lm.collect_block_traces` and
    :func:`otbound.lm.collect_draft_trees`: one output file per trace under ``out`` (the trace's
    dataset and settings folders, its file name), resumable (files present are checked against
    ``config`` and kept; ``pair`` may be a callable, called only if a file is missing).

    Per missing file: ``positions_per_trace`` positions t drawn uniformly without replacement by
    ``rng = default_rng([seed, crc32("dataset|prompt_id|temperature")])`` (the same positions for
    both collectors at the same seed), the two models' prefix caches up to the last of them, and
    ``measure(pair, record, ts, rng, layers_d, layers_t) -> (arrays, meta)`` whose arrays are
    stored beside the tokens and positions, its meta beside the trace's (pair, prompt, both
    sampling settings), ``config``, ``format=fmt`` and the trace's name. ``check_meta(meta)``
    vets each trace's metadata before anything runs. ``backends``: those ``measure`` handles; a
    llama.cpp pair gets no prefix caches (``layers_d = layers_t = None``).
    """
    files = list(_files(traces, TRACE_FORMAT))
    targets = []
    for f in files:
        meta = _store.read_meta(f)
        if check_meta is not None:
            check_meta(meta)
        sp, sq = record_settings(meta, meta["temperature"])
        targets.append(Path(out) / safe_name(meta["dataset"]) / settings_dir(meta["temperature"], sp, sq) / f.name)
    for o in targets:
        if o.exists():
            _check_config(o, config)
    todo = [(f, o) for f, o in zip(files, targets) if not o.exists()]
    if todo and callable(pair):
        pair = pair()
    llama_cpp = bool(todo) and backend_of(pair) == "llama.cpp" and "llama.cpp" in backends
    if todo and not llama_cpp:
        require_transformers(pair, label)
    bar = progress_bar(len(todo), label, progress)
    for f, o in todo:
        (record,) = load_traces(f)
        m = min(positions_per_trace, record.positions)
        key = f"{record.dataset}|{record.prompt_id}|{record.temperature!r}"
        rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
        ts = np.sort(rng.choice(record.positions, size=m, replace=False))
        upto = record.prompt_length + int(ts[-1])  # the caches need tokens[:prompt_length + t - 1]
        layers_d = None if llama_cpp else prefix_cache(pair.draft, record.tokens[:upto])
        layers_t = None if llama_cpp else prefix_cache(pair.target, record.tokens[:upto])
        arrays, extra = measure(pair, record, ts, rng, layers_d, layers_t)
        meta = {k: record.meta[k] for k in ("pair", "sources", "model_dtype", "prompt_id", "dataset", "temperature",
                                            "prompt_length", "vocab_size")}
        sp, sq = record.sampling_params()
        meta.update(target_sampling=sp.as_dict(), draft_sampling=sq.as_dict(), **extra)
        meta.update(config, format=fmt, trace=f.name)
        _store.write_atomic(o, {"tokens": record.tokens.astype(np.int32), "positions": ts.astype(np.int32), **arrays},
                            meta)
        bar.update(1)
    bar.close()
    return targets
