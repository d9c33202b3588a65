"""Sharded report runs: the work split into shards, run by an executor, checkpointed per shard.

A report (real-model, synthetic or block) is a list of :class:`Shard` objects — for the
real-model report one per (pair, dataset, prompt chunk, temperature), for the synthetic and block
sections one per cell — each a pure function of its arguments: its random seed is derived from the
run's seed and the shard's own coordinates, never from the worker or the order in which shards run.
:func:`run_shards` runs the shards that have no checkpoint yet on an executor and writes each
result, as it arrives, to ``<out>/shards/<shard id>.json`` (atomically: written to a temporary
name and moved into place). It then reads every shard's checkpoint back in the shards' own order,
so a merged report is the same whether the shards ran in this process (:class:`LocalExecutor`, the
default), on a Ray cluster (:class:`RayExecutor`), partly in an earlier, interrupted run, or twice
(a retried shard overwrites its checkpoint with the same content; the merge reads each id once).

A checkpoint is reused only if its fingerprint (the shard's function, its pair's name and its
arguments) matches, so a rerun with other settings or another pair in the same folder recomputes
instead of mixing runs, and only if its result passes its SHA-256 (``"sha256"``, of the result's
canonical JSON): an edited, truncated or unreadable checkpoint is recomputed, with a line on stderr.

Executors
    :class:`LocalExecutor` runs the shards one after the other in this process.
    :class:`RayExecutor` runs them on one model-holding Ray actor per GPU (``num_gpus=1``) or, on a
    cluster without GPUs, per worker CPU (``num_cpus=1``): each actor loads a model pair the first
    time one of its shards needs it and keeps it for its later shards. An actor killed mid-shard is
    restarted by Ray and the shard is retried (``max_restarts`` / ``max_task_retries``); if
    an actor is lost for good its shards go to the others. ``address=None`` starts a local Ray
    instance (``ray.init(num_cpus=...)``), else connects to the cluster at ``address``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import socket
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from otbound._integrity import CorruptFileError, content_key
from otbound._io import progress_bar, write_text_atomic
from otbound._validation import InvalidInputError, check_positive_int

CHECKPOINT_VERSION = 2
ENGINES = ("local", "ray")


@dataclasses.dataclass(frozen=True)
class Shard:
    """One unit of work: ``fn(**kwargs)``, or ``fn(load_pair, **kwargs)`` when the shard uses a model
    pair: ``pair`` is its stable name (:func:`pair_name`), ``loader`` the pair itself or what loads
    it (a zero-argument callable, a registered name or ``(draft, target)``); ``load_pair()`` returns
    it, loaded once per worker. ``id``: a stable, file-name-safe name, unique within a run.
    ``size``: work units it holds (prompts, instances), counted by the progress bar.
    ``unkeyed``: names of arguments the result does not depend on (left out of the fingerprint).

    Parameters
    ----------
    id : str
        Its name, unique within a run (the checkpoint's file name).
    fn : callable
        The work: ``fn(**kwargs)``, or ``fn(load_pair, **kwargs)`` when ``pair`` is set; its result
        must be JSON-serialisable.
    kwargs : dict
        Its arguments (JSON-serialisable, or dataclasses / paths: they key the checkpoint).
    pair : str, optional
        Stable name of the model pair it uses (:func:`pair_name`).
    loader : object, optional
        The pair or what loads it (not part of the fingerprint).
    size : int
        Work units it holds, for the progress bar.
    unkeyed : tuple of str
        Arguments left out of the fingerprint.

    Examples
    --------
    >>> from otbound.report import Shard
    >>> def square(x):
    ...     return {"square": x * x}
    >>> shard = Shard("square-3", square, {"x": 3})
    >>> shard.fn(**shard.kwargs)
    {'square': 9}
    >>> len(shard.fingerprint()), shard.fingerprint() == Shard("other-id", square, {"x": 3}).fingerprint()
    (64, True)
    >>> shard.fingerprint() == Shard("square-3", square, {"x": 4}).fingerprint()
    False
    """

    id: str
    fn: Callable
    kwargs: dict
    pair: str | None = None
    loader: object = dataclasses.field(default=None, repr=False, compare=False)
    size: int = 1
    unkeyed: tuple = ()

    def fingerprint(self) -> str:
        """SHA-256 of the function, the pair's name and the arguments: what the result depends on.
        The arguments named in ``unkeyed`` (where the shard runs, e.g. its output folder's absolute
        path) are left out, so a folder copied or moved elsewhere keeps its checkpoints."""
        kwargs = {k: v for k, v in self.kwargs.items() if k not in self.unkeyed}
        return content_key([CHECKPOINT_VERSION, f"{self.fn.__module__}.{self.fn.__qualname__}", self.pair, kwargs],
                           default=_plain)


def _plain(obj):
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


class ShardWorker:
    """Runs shards in one process and keeps the model pairs they load, by name, for later shards."""

    def __init__(self):
        self._pairs = {}

    def _load(self, name, spec):
        if name not in self._pairs:
            if hasattr(spec, "target"):
                self._pairs[name] = spec
            elif callable(spec):
                self._pairs[name] = spec()
            else:
                from otbound.lm import load_pair

                self._pairs[name] = load_pair(spec, progress=False)
        return self._pairs[name]

    def run(self, shard: Shard) -> dict:
        """``{"result", "worker": "host:pid", "seconds"}`` of one shard."""
        t0 = time.perf_counter()
        if shard.pair is None:
            result = shard.fn(**shard.kwargs)
        else:
            result = shard.fn(lambda: self._load(shard.pair, shard.loader), **shard.kwargs)
        return {"result": result, "worker": f"{socket.gethostname()}:{os.getpid()}",
                "seconds": time.perf_counter() - t0}

    def pid(self) -> int:
        return os.getpid()


class LocalExecutor:
    """Runs shards in this process, one after the other (the default engine).

    Its ``map(shards, on_done)`` calls ``on_done(shard, {"result", "worker", "seconds"})`` after
    each shard, in order; a model pair a shard loads is kept for the later shards of the same pair.

    Examples
    --------
    >>> from otbound.report import LocalExecutor, Shard
    >>> def square(x):
    ...     return {"square": x * x}
    >>> done = []
    >>> LocalExecutor().map([Shard(f"sq-{x}", square, {"x": x}) for x in (2, 3)],
    ...                     lambda shard, out: done.append((shard.id, out["result"])))
    >>> done
    [('sq-2', {'square': 4}), ('sq-3', {'square': 9})]
    """

    def __init__(self):
        self.worker = ShardWorker()

    def map(self, shards, on_done) -> None:
        for shard in shards:
            on_done(shard, self.worker.run(shard))


class RayExecutor:
    """Runs shards on Ray actors (see the module doc). ``num_workers``: actors (default: one per GPU
    of the cluster, else one per CPU); ``num_cpus``: CPUs of the local Ray instance started when
    ``address`` is None (default: all). ``max_restarts`` / ``max_task_retries``: Ray's restart and
    retry limits for a killed actor. The actors are named (``otbound-worker-<i>``), so every
    executor of one driver process shares them and the models they have loaded.

    Parameters
    ----------
    address : str, optional
        Address of a running Ray cluster (``host:port``, ``ray://host:port`` or ``"auto"``); None
        starts a local Ray instance.
    num_workers : int, optional
        Number of actors.
    num_cpus : int, optional
        CPUs of the local instance.
    max_restarts, max_task_retries : int
        Ray's restart and retry limits of each actor.

    Attributes
    ----------
    gpus : int
        GPUs of the cluster (0: one actor per CPU).
    num_workers : int
        Number of actors.
    actors : list
        The actors' handles.

    Raises
    ------
    InvalidInputError
        Ray is not installed, nothing listens at ``address``, ``num_workers`` is not a positive
        integer or exceeds the cluster's GPUs (or CPUs).

    Examples
    --------
    >>> import inspect
    >>> from otbound.report import RayExecutor
    >>> list(inspect.signature(RayExecutor).parameters)
    ['address', 'num_workers', 'num_cpus', 'max_restarts', 'max_task_retries']
    >>> executor = RayExecutor(num_workers=2, num_cpus=2)  # doctest: +SKIP
    """

    def __init__(self, *, address: str | None = None, num_workers: int | None = None, num_cpus: int | None = None,
                 max_restarts: int = 3, max_task_retries: int = 3):
        ray = require_ray()
        self.ray = ray
        if num_workers is not None:
            num_workers = check_positive_int(num_workers, "num_workers")
        if not ray.is_initialized():  # (a Ray session this process already started is used as it is)
            kwargs = dict(include_dashboard=False, log_to_driver=False)
            if address is None:
                kwargs.update(num_cpus=num_cpus or max(os.cpu_count() or 1, num_workers or 1),
                              runtime_env={"env_vars": {"PYTHONPATH": worker_pythonpath()}})
            else:
                check_reachable(address)
                kwargs.update(address=address)
            ray.init(**kwargs)
        self.gpus = int(ray.cluster_resources().get("GPU", 0))
        slots = self.gpus or int(ray.cluster_resources().get("CPU", 1))
        self.num_workers = num_workers or slots
        if self.num_workers > slots:
            kind = "GPUs" if self.gpus else "CPUs"
            raise InvalidInputError(f"{self.num_workers} workers need {self.num_workers} {kind}; "
                                    f"the Ray cluster has {slots}")
        resources = {"num_gpus": 1} if self.gpus else {"num_cpus": 1}
        cls = ray.remote(ShardWorker)
        self.actors = [cls.options(name=f"otbound-worker-{i}", get_if_exists=True, max_restarts=max_restarts,
                                   max_task_retries=max_task_retries, **resources).remote()
                       for i in range(self.num_workers)]

    def map(self, shards, on_done) -> None:
        from ray.exceptions import RayActorError

        queue = list(reversed(list(shards)))
        if any(hasattr(s.loader, "target") for s in queue):
            raise InvalidInputError("Ray workers load their own copy of a model pair: give a registered name, "
                                    "(draft, target) ids/paths or a picklable loader, not a loaded pair")
        running = {}  # object ref -> (shard, actor)
        idle = list(self.actors)
        while queue or running:
            while queue and idle:
                actor, shard = idle.pop(), queue.pop()
                running[actor.run.remote(shard)] = (shard, actor)
            (ref,), _ = self.ray.wait(list(running), num_returns=1)
            shard, actor = running.pop(ref)
            try:
                done = self.ray.get(ref)
            except RayActorError:  # the actor is gone for good (restarts used up): the shard goes elsewhere
                self.actors.remove(actor)
                if not self.actors:
                    raise
                queue.append(shard)
                continue
            idle.append(actor)
            on_done(shard, done)

    def worker_pids(self) -> list[int]:
        """Process ids of the current actors (for monitoring and fault tests)."""
        return self.ray.get([a.pid.remote() for a in self.actors])


def worker_pythonpath() -> str:
    """``PYTHONPATH`` of local Ray workers: the folder holding the ``otbound`` package this process
    imported (e.g. a source checkout), then this process's ``PYTHONPATH``."""
    import otbound

    root = str(Path(otbound.__file__).resolve().parent.parent)
    return os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def check_reachable(address: str, timeout: float = 3.0) -> None:
    """Refuse at once (:class:`InvalidInputError`) a Ray address ``host:port`` (or ``ray://host:port``)
    where nothing listens, instead of Ray's own retries (tens of seconds); ``"auto"`` and other forms
    are left to Ray. ``timeout``: seconds to wait for the TCP connection.

    Examples
    --------
    >>> check_reachable("auto")  # left to Ray
    """
    if not isinstance(address, str):
        raise InvalidInputError(f"a Ray address must be a string such as '10.0.0.1:6379', got {address!r}")
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        raise InvalidInputError(f"no Ray cluster reachable at {address} ({err.strerror or err}); start one with "
                                "`ray start --head` or omit --address for a local instance") from None


def require_ray():
    try:
        import ray
    except ImportError as exc:
        raise InvalidInputError(
            "engine 'ray' needs Ray: install the extra with  pip install 'otbound[ray]'  (or pip install 'ray>=2.9')"
        ) from exc
    return ray


def make_executor(engine="local", *, address: str | None = None, **kwargs):
    """An executor from an engine name (``"local"`` or ``"ray"``, ``kwargs`` passed to
    :class:`RayExecutor`) or an executor object (returned as is).

    Parameters
    ----------
    engine : {"local", "ray"} or executor
        The engine; an object with a ``map(shards, on_done)`` method is returned unchanged.
    address : str, optional
        Ray cluster address (``engine="ray"`` only).
    **kwargs
        Passed to :class:`RayExecutor`.

    Returns
    -------
    LocalExecutor, RayExecutor or the object given

    Raises
    ------
    InvalidInputError
        An unknown engine name, or an address with ``engine="local"``.

    Examples
    --------
    >>> from otbound.report import LocalExecutor, make_executor
    >>> isinstance(make_executor("local"), LocalExecutor)
    True
    >>> executor = LocalExecutor()
    >>> make_executor(executor) is executor
    True
    >>> make_executor("dask")
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: unknown engine 'dask'; expected one of ('local', 'ray')
    """
    if not isinstance(engine, str):
        return engine
    if engine == "local":
        if address is not None:
            raise InvalidInputError("an address is only meaningful with engine='ray'")
        return LocalExecutor()
    if engine == "ray":
        return RayExecutor(address=address, **kwargs)
    raise InvalidInputError(f"unknown engine {engine!r}; expected one of {ENGINES}")


def pair_name(pair) -> str:
    """A stable name of a model-pair spec (the same in every process): a loaded pair's ``name``,
    a registered name, ``"draft,target"``, or a callable's qualified name and arguments."""
    if hasattr(pair, "target"):
        return str(pair.name)
    if isinstance(pair, str):
        return pair
    if isinstance(pair, (tuple, list)):
        return ",".join(map(str, pair))
    if isinstance(pair, functools.partial):
        return json.dumps([pair_name(pair.func), pair.args, pair.keywords], sort_keys=True, default=_plain)
    if callable(pair):
        return f"{getattr(pair, '__module__', '')}.{getattr(pair, '__qualname__', type(pair).__qualname__)}"
    raise InvalidInputError(f"a model pair must be a loaded pair, a name, (draft, target) or a callable, got {pair!r}")


def checkpoint_path(out, shard: Shard) -> Path:
    return Path(out) / "shards" / f"{shard.id}.json"


def run_shards(shards, out, executor=None, *, progress: bool = True, desc: str = "shards",
               count=None, unit: str = "units") -> list:
    """Results of ``shards`` in their order: from ``<out>/shards/<id>.json`` where a matching
    checkpoint exists, else computed by ``executor`` (default :class:`LocalExecutor`) and
    checkpointed as they arrive (``out=None``: no checkpoints). Every result is read back from its
    checkpoint (a JSON round trip), so fresh, resumed and distributed runs merge the same values.
    The progress bar counts shards' sizes and shows ``count(result)`` ``unit`` per second (default:
    the shards' sizes) and the shards done per worker.

    Parameters
    ----------
    shards : iterable of Shard
        The work, ids unique.
    out : str or pathlib.Path, optional
        Folder of the checkpoints (``<out>/shards``); None: no checkpoints.
    executor : optional
        Runs the missing shards (:func:`make_executor`); default :class:`LocalExecutor`.
    progress : bool
        Show a progress bar.
    desc : str
        Its label.
    count : callable, optional
        Units of work in a result, for the rate shown.
    unit : str
        Name of those units.

    Returns
    -------
    list
        The shards' results, in the shards' order, as read back from JSON.

    Raises
    ------
    InvalidInputError
        Two shards with the same id.

    Examples
    --------
    >>> import tempfile
    >>> from otbound.report import Shard, run_shards
    >>> def square(x):
    ...     return {"square": x * x}
    >>> shards = [Shard(f"sq-{x}", square, {"x": x}) for x in (2, 3)]
    >>> with tempfile.TemporaryDirectory() as out:
    ...     first = run_shards(shards, out, progress=False)
    ...     again = run_shards(shards, out, progress=False)  # every shard read from its checkpoint
    >>> first, again == first
    ([{'square': 4}, {'square': 9}], True)
    """
    shards = list(shards)
    ids = [s.id for s in shards]
    if len(set(ids)) != len(ids):
        twice = sorted(i for i, n in Counter(ids).items() if n > 1)
        raise InvalidInputError(f"shard ids must be unique, got duplicates {twice}")
    executor = executor or LocalExecutor()
    results = {s.id: None if out is None else _read_checkpoint(out, s) for s in shards}
    todo = [s for s in shards if results[s.id] is None]
    bar = progress_bar(sum(s.size for s in shards), desc, progress and bool(todo), unit="")
    bar.update(sum(s.size for s in shards if results[s.id] is not None))
    per_worker, t0, units = Counter(), time.perf_counter(), 0

    def on_done(shard, done):
        nonlocal units
        done = json.loads(json.dumps(done))  # the stored form (JSON keys), checksummed as it is read back
        text = json.dumps({"id": shard.id, "fingerprint": shard.fingerprint(), **done,
                           "sha256": content_key(done["result"])})
        if out is not None:
            write_text_atomic(checkpoint_path(out, shard), text)
        results[shard.id] = json.loads(text)["result"]
        per_worker[done["worker"]] += 1
        units += shard.size if count is None else count(results[shard.id])
        bar.update(shard.size)
        bar.set_postfix_str(f"{units / (time.perf_counter() - t0):.1f} {unit}/s; shards per worker "
                            + ", ".join(f"{w}: {n}" for w, n in sorted(per_worker.items())))

    try:
        executor.map(todo, on_done)
    finally:
        bar.close()
    return [results[i] for i in ids]


def _load_checkpoint(path: Path) -> dict:
    """A checkpoint that passes its checksum; :class:`CorruptFileError` if it is truncated, not
    UTF-8, not JSON, lacks a field or fails the checksum (an edited value)."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        ok = isinstance(stored, dict) and stored.get("sha256") == content_key(stored["result"])
    except (UnicodeDecodeError, ValueError, KeyError) as exc:
        raise CorruptFileError(f"{path}: unreadable checkpoint ({type(exc).__name__})") from None
    if not ok:
        raise CorruptFileError(f"{path}: checksum mismatch (the checkpoint was altered or damaged)")
    return stored


def _read_checkpoint(out, shard: Shard):
    """The stored result of ``shard``, or None (computed again) if there is no checkpoint, its
    fingerprint differs (other settings) or it fails its checksum (then a line on stderr)."""
    path = checkpoint_path(out, shard)
    if not path.exists():
        return None
    try:
        stored = _load_checkpoint(path)
    except CorruptFileError as err:
        print(f"otbound: {err}; recomputing the shard", file=sys.stderr)
        return None
    return stored["result"] if stored.get("fingerprint") == shard.fingerprint() else None


def read_checkpoints(out) -> dict:
    """``{shard id: stored checkpoint}`` of every intact checkpoint under ``<out>/shards``
    (worker, seconds, result and its SHA-256 of each), e.g. to see where each shard ran.

    Parameters
    ----------
    out : str or pathlib.Path
        The run's folder (as given to :func:`run_shards`).

    Returns
    -------
    dict
        Checkpoints by shard id, in file-name order; a damaged checkpoint is left out, and a
        folder without ``shards`` gives ``{}``.

    Examples
    --------
    >>> import tempfile
    >>> from otbound.report import Shard, read_checkpoints, run_shards
    >>> def square(x):
    ...     return {"square": x * x}
    >>> with tempfile.TemporaryDirectory() as out:
    ...     _ = run_shards([Shard(f"sq-{x}", square, {"x": x}) for x in (2, 3)], out, progress=False)
    ...     stored = read_checkpoints(out)
    >>> sorted(stored), sorted(stored["sq-2"])
    (['sq-2', 'sq-3'], ['fingerprint', 'id', 'result', 'seconds', 'sha256', 'worker'])
    >>> stored["sq-3"]["result"]
    {'square': 9}
    """
    folder = Path(out) / "shards"
    out = {}
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(CorruptFileError):  # a damaged checkpoint is not a finished shard
            out[p.stem] = _load_checkpoint(p)
    return out
