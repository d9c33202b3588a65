"""Files the package writes: one atomic-write helper, the file-name helpers of stored results, and the
progress bar of long runs.

Every file otbound writes (traces, prompt sets, measurement caches, reports, figures, converted
models) goes through :func:`atomic_path`: it is written under a unique temporary name beside its
target and moved into place with ``os.replace`` (atomic on POSIX), so an interrupted or concurrent
run never leaves a file that looks finished, and two writers never share a temporary file.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path) -> Iterator[Path]:
    """Yield a fresh temporary path beside ``path`` (same suffix, not created); when the block exits
    normally, move what was written there onto ``path`` with ``os.replace``; on an exception,
    remove it. The parent folder is created. A directory may be written too (an existing target
    directory is replaced).

    Parameters
    ----------
    path : str or Path
        The final path.

    Yields
    ------
    pathlib.Path
        The temporary path to write (``.<stem>.tmp-<pid>-<random><suffix>``, beside ``path``).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from otbound._io import atomic_path
    >>> folder = Path(tempfile.mkdtemp())
    >>> with atomic_path(folder / "a.txt") as tmp:
    ...     _ = tmp.write_text("x")
    ...     print(tmp.name.startswith(".a.tmp-"), (folder / "a.txt").exists())
    True False
    >>> sorted(p.name for p in folder.iterdir()), (folder / "a.txt").read_text()
    (['a.txt'], 'x')
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}{path.suffix}")
    try:
        yield tmp
        if tmp.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


def write_text_atomic(path, text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; return the path.

    The text goes to a unique temporary file beside ``path`` (``.<stem>.tmp-<pid>-<random><suffix>``),
    which is then moved onto ``path`` with ``os.replace`` (atomic on POSIX): a reader sees the old
    file or the new one, never a partial one, and an interrupted or concurrent writer never leaves a
    file that looks finished. The parent folder is created. Every file otbound writes goes this way.

    Parameters
    ----------
    path : str or pathlib.Path
        The file to write (replaced if it exists).
    text : str
        Its content.
    encoding : str
        The text encoding, default UTF-8.

    Returns
    -------
    pathlib.Path
        ``path``.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> import otbound as ob
    >>> folder = Path(tempfile.mkdtemp())
    >>> ob.write_text_atomic(folder / "sub" / "b.txt", "hello").read_text()
    'hello'
    >>> ob.write_text_atomic(folder / "sub" / "b.txt", "again").read_text(), len(list((folder / "sub").iterdir()))
    ('again', 1)
    """
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding=encoding)
    return Path(path)


def finite_json(obj, nulled: list | None = None, _where: str = ""):
    """``obj`` with every non-finite float (NaN, ±inf) replaced by ``None`` and numpy scalars and
    arrays turned into Python numbers and lists, so that it is strict JSON (RFC 8259 has no NaN).
    The places replaced are appended to ``nulled`` (as ``key[index].key`` paths), for the writer to
    state why they are empty.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound._io import finite_json
    >>> where = []
    >>> finite_json({"a": [1.0, float("nan")], "b": np.float64(np.inf), "c": np.arange(2)}, where)
    {'a': [1.0, None], 'b': None, 'c': [0, 1]}
    >>> where
    ['a[1]', 'b']
    """
    if isinstance(obj, dict):
        return {k: finite_json(v, nulled, f"{_where}.{k}" if _where else str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v, nulled, f"{_where}[{i}]") for i, v in enumerate(obj)]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy scalar or array
        return finite_json(obj.tolist(), nulled, _where)
    if isinstance(obj, float) and not math.isfinite(obj):
        if nulled is not None:
            nulled.append(_where)
        return None
    return obj


def json_text(obj, *, indent=None, nulled: list | None = None, **kwargs) -> str:
    """Strict JSON text of ``obj``: non-finite floats written as ``null`` (:func:`finite_json`, the
    places listed in ``nulled``), ``allow_nan=False`` so nothing else slips through. Every JSON file
    otbound writes goes this way.

    Examples
    --------
    >>> from otbound._io import json_text
    >>> json_text({"efficiency": float("nan"), "acceptance": 0.0})
    '{"efficiency": null, "acceptance": 0.0}'
    """
    return json.dumps(finite_json(obj, nulled), indent=indent, allow_nan=False, **kwargs)


def safe_name(text: str) -> str:
    """File-name form of a prompt id (``HumanEval/0`` -> ``HumanEval_0``).

    Examples
    --------
    >>> from otbound._io import safe_name
    >>> safe_name("HumanEval/0"), safe_name("mtbench/81 x"), safe_name("///")
    ('HumanEval_0', 'mtbench_81_x', 'prompt')
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "prompt"


def temperature_dir(temperature: float) -> str:
    """Folder name of a temperature (``1.0`` -> ``T1``).

    Examples
    --------
    >>> from otbound._io import temperature_dir
    >>> temperature_dir(1.0), temperature_dir(0.7)
    ('T1', 'T0.7')
    """
    return f"T{float(temperature):g}"


def progress_bar(total: int, desc: str, progress: bool, unit: str = "prompt"):
    """A tqdm bar on stderr, disabled unless ``progress``.

    Examples
    --------
    >>> from otbound._io import progress_bar
    >>> with progress_bar(3, "prompts", progress=False) as bar:
    ...     bar.disable
    True
    """
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not progress, file=sys.stderr)
