"""Integrity of stored results: content keys, per-tensor checksums and the output-folder lock.

* :func:`content_key` — SHA-256 of a canonical JSON form: caches are keyed by the content they were
  computed from (never by a file name), so re-collected inputs are never answered from stale results.
* :func:`tensor_digests` — SHA-256 per tensor (dtype, shape and bytes); stored with every trace and
  checked on load (:class:`CorruptFileError` on a mismatch or an unreadable file).
* :func:`output_lock` — an exclusive lock file ``<folder>/.otbound.lock`` holding the holder's PID,
  host and start time, created with ``O_CREAT | O_EXCL``; a second run gets :class:`FolderLockedError`
  naming the holder; the lock of a dead process on this host is taken over.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
from pathlib import Path

import numpy as np

from otbound._validation import InvalidInputError

LOCK_NAME = ".otbound.lock"


class CorruptFileError(InvalidInputError):
    """A stored file whose checksum does not match or that cannot be read (truncated, edited).

    A subclass of :class:`otbound.InvalidInputError`; readers recompute what they can.

    Examples
    --------
    A checksum that does not match, caught as the bad input it is:

    >>> import numpy as np
    >>> from otbound import InvalidInputError
    >>> from otbound._integrity import check_digests, tensor_digests
    >>> try:
    ...     check_digests("trace.safetensors", {"p": np.ones(2)}, tensor_digests({"p": np.zeros(2)}))
    ... except InvalidInputError as err:
    ...     print(type(err).__name__)
    CorruptFileError
    """


class FolderLockedError(RuntimeError):
    """Another live run holds the output folder (:func:`output_lock`; the message names it).

    Examples
    --------
    A busy folder is no bad input: not an :class:`otbound.InvalidInputError`.

    >>> from otbound import InvalidInputError
    >>> from otbound._integrity import FolderLockedError
    >>> issubclass(FolderLockedError, RuntimeError), issubclass(FolderLockedError, InvalidInputError)
    (True, False)
    """


def content_key(obj, *, default=repr) -> str:
    """SHA-256 (hex) of ``obj`` as canonical JSON: the content key of a configuration.

    ``sha256(json.dumps(obj, sort_keys=True, default=default))``: keys sorted at every level, floats
    as Python writes them (``repr``, shortest round-trip), anything JSON cannot hold by
    ``default(x)`` (its ``repr`` unless told otherwise). The one implementation of the package's
    canonical hash: caches, stored results, plans and checkpoints all call it.
    Caches and stored results are keyed by the content they were computed from (never by a file
    name), and stored files carry the key of their content as their checksum.

    Parameters
    ----------
    obj : JSON-able object
        The configuration (dicts, lists, strings, numbers, None).
    default : callable, optional
        What an object JSON cannot hold is written as (``json.dumps``'s ``default``); ``repr``.

    Returns
    -------
    str
        64 hex digits.

    Examples
    --------
    >>> import otbound as ob
    >>> ob.content_key({"b": 1, "a": [1.5]}) == ob.content_key({"a": [1.5], "b": 1})   # key order is irrelevant
    True
    >>> ob.content_key({"a": 1})[:12], ob.content_key({"a": 1.0}) == ob.content_key({"a": 1})
    ('f9d86028c6e0', False)
    >>> ob.content_key({"a": {1, 2}}, default=sorted) == ob.content_key({"a": [1, 2]})
    True
    """
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=default).encode()).hexdigest()


def tensor_digest(array) -> str:
    """SHA-256 (hex) of an array's dtype, shape and bytes.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound._integrity import tensor_digest
    >>> tensor_digest(np.zeros(2)) == tensor_digest(np.zeros(2, dtype=np.float32))   # dtype counts
    False
    """
    a = np.ascontiguousarray(array)
    h = hashlib.sha256(f"{a.dtype.str}|{a.shape}|".encode())
    h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
    return h.hexdigest()


def tensor_digests(tensors: dict) -> dict:
    """``{name: SHA-256 of (dtype, shape, bytes)}`` for every tensor (:func:`tensor_digest`).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound._integrity import tensor_digests
    >>> digests = tensor_digests({"p": np.zeros(3), "q": np.ones(3)})
    >>> sorted(digests), len(digests["p"])
    (['p', 'q'], 64)
    """
    return {name: tensor_digest(t) for name, t in tensors.items()}


def check_digests(path, tensors: dict, expected: dict) -> None:
    """Raise :class:`CorruptFileError` unless every tensor matches its stored digest (and the names agree).

    Parameters
    ----------
    path : str or Path
        Named in the message.
    tensors : dict
        ``{name: array}`` as read.
    expected : dict
        ``{name: digest}`` as stored.

    Raises
    ------
    CorruptFileError
        On different names or a checksum mismatch.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound._integrity import check_digests, tensor_digests
    >>> stored = tensor_digests({"p": np.zeros(3)})
    >>> check_digests("trace.safetensors", {"p": np.zeros(3)}, stored)      # silent when intact
    >>> check_digests("trace.safetensors", {"p": np.ones(3)}, stored)
    Traceback (most recent call last):
        ...
    otbound._integrity.CorruptFileError: trace.safetensors: checksum mismatch in ['p'] (the file was altered or damaged)
    """
    if set(expected) != set(tensors):
        raise CorruptFileError(f"{path}: tensors {sorted(tensors)} do not match the stored list {sorted(expected)}")
    bad = [name for name, t in tensors.items() if tensor_digest(t) != expected[name]]
    if bad:
        raise CorruptFileError(f"{path}: checksum mismatch in {bad} (the file was altered or damaged)")


def _holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def output_lock(folder):
    """Hold ``<folder>/.otbound.lock`` for the duration of the block (see the module docstring).

    Parameters
    ----------
    folder : str or Path
        Created if missing.

    Yields
    ------
    pathlib.Path
        The lock file (removed on exit).

    Raises
    ------
    FolderLockedError
        If another live run holds the folder (the message names its PID, host and start time).

    Examples
    --------
    >>> import tempfile
    >>> from otbound._integrity import FolderLockedError, output_lock
    >>> folder = tempfile.mkdtemp()
    >>> with output_lock(folder) as lock:
    ...     try:
    ...         with output_lock(folder):
    ...             pass
    ...     except FolderLockedError as err:
    ...         print("refused:", "is in use by another otbound run" in str(err))
    refused: True
    >>> lock.exists()
    False
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(path)
            pid, host = holder.get("pid"), holder.get("host")
            if host == me["host"] and isinstance(pid, int) and not _alive(pid):
                # stale: its process is gone. Remove it only if it is still that same lock file.
                with contextlib.suppress(FileNotFoundError):
                    if _holder(path) == holder:
                        path.unlink()
                continue
            raise FolderLockedError(
                f"{folder} is in use by another otbound run (pid {pid} on host {host}, started "
                f"{holder.get('started')}); wait for it, or delete {path} if that run is gone"
            ) from None
        with os.fdopen(fd, "w") as fh:
            json.dump(me, fh)
        break
    else:
        raise FolderLockedError(f"could not take the lock {path} (it keeps reappearing)")
    try:
        yield path
    finally:
        if _holder(path).get("pid") == me["pid"]:
            path.unlink(missing_ok=True)


def file_sha256(path) -> str:
    """SHA-256 (hex) of a file's bytes, read in 16 MiB chunks.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from otbound._integrity import file_sha256
    >>> path = Path(tempfile.mkdtemp()) / "b.txt"
    >>> _ = path.write_text("hello")
    >>> file_sha256(path)
    '2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824'
    """
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def folder_manifest(folder, *, exclude=()) -> dict:
    """``{relative path: {"size", "mtime_ns", "sha256"}}`` of every file under ``folder``.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from otbound._integrity import folder_manifest
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "b.txt").write_text("hello")
    >>> manifest = folder_manifest(folder)
    >>> list(manifest), manifest["b.txt"]["size"]
    (['b.txt'], 5)
    """
    folder = Path(folder)
    out = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = f.relative_to(folder).as_posix()
        if rel not in exclude:
            st = f.stat()
            out[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": file_sha256(f)}
    return out


def check_manifest(folder, manifest: dict, *, full: bool, exclude=()) -> str | None:
    """None if ``folder`` matches ``manifest``, else what differs. Fast (``full=False``): the same
    files with the same sizes and modification times; full: also every file's SHA-256.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from otbound._integrity import check_manifest, folder_manifest
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "b.txt").write_text("hello")
    >>> manifest = folder_manifest(folder)
    >>> print(check_manifest(folder, manifest, full=True))
    None
    >>> _ = (folder / "b.txt").write_text("hellO")             # same size, other bytes
    >>> check_manifest(folder, manifest, full=True)
    'b.txt: SHA-256 differs from the one recorded at conversion'
    """
    folder = Path(folder)
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - set(exclude)
    if present != set(manifest):
        missing, unexpected = sorted(set(manifest) - present)[:3], sorted(present - set(manifest))[:3]
        return f"files differ: missing {missing}, unexpected {unexpected}"
    for rel, want in manifest.items():
        st = (folder / rel).stat()
        if st.st_size != want["size"]:
            return f"{rel}: {st.st_size} bytes, recorded {want['size']}"
        if full and file_sha256(folder / rel) != want["sha256"]:
            return f"{rel}: SHA-256 differs from the one recorded at conversion"
        if not full and st.st_mtime_ns != want["mtime_ns"]:
            return f"{rel}: modified after conversion"
    return None
