"""llama.cpp built from the pinned source distribution of its Python bindings, once, cached by content.

llama.cpp reaches this project only as source: the source distribution of ``llama-cpp-python`` on
PyPI vendors the whole llama.cpp tree (``vendor/llama.cpp``: ``tools/server``, ``common``,
``examples/speculative``) beside the bindings' pure-Python package (``llama_cpp/``). One build
serves both uses in otbound: the engine audit runs its ``llama-server`` and ``llama-speculative``
binaries, and the language-model backend loads its shared ``libllama`` through the bindings.

Cache layout (root = :func:`otbound.lm.cache_root`)::

    <root>/sdist/llama_cpp_python-<version>.tar.gz     the pinned sdist (SHA-256 checked)
    <root>/llama.cpp/<version>-<key>/                 one build per (sdist, flags, targets)
        src/          the extracted sdist
        build/        cmake's build folder: build/bin/llama-server, build/bin/libllama.so, ...
        build.log     cmake's output
        BUILD.json    written last: version, flags, targets, sdist SHA-256, SHA-256 of each binary

A build folder without ``BUILD.json`` is unfinished (interrupted, or failed): it is removed and built
again; one with ``BUILD.json`` is trusted only while every binary still has its recorded SHA-256.
Concurrent callers wait on one file lock, so two processes never build the same folder.

The flags are portable: ``GGML_NATIVE=OFF`` with AVX2 / AVX-512 and AMX off. A native build uses AMX
tile instructions wherever CPUID advertises them, and dies with SIGILL at the first matrix product on
machines whose kernel does not enable AMX.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from otbound._integrity import file_sha256
from otbound._io import write_text_atomic
from otbound.lm._errors import ModelUnavailableError
from otbound.lm._wheels import cache_root

#: the bindings' release whose source distribution is built (it pins the llama.cpp tree it vendors)
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
#: SHA-256 of ``llama_cpp_python-0.3.36.tar.gz`` as served by PyPI
LLAMA_CPP_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
#: cmake flags: a portable release build (no AMX, no network features), shared libraries for the bindings
BUILD_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DGGML_AVX512=ON",
    "-DGGML_AVX512_VNNI=ON",
    "-DGGML_AVX512_BF16=ON",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
)
#: what is built: the server, the multi-draft and single-draft speculative examples, and libllama
TARGETS = ("llama-server", "llama-speculative", "llama-speculative-simple", "llama")
#: the files whose SHA-256 ``BUILD.json`` records (paths relative to the build folder)
BINARIES = ("bin/llama-server", "bin/llama-speculative", "bin/llama-speculative-simple", "bin/libllama.so")


class BuildError(RuntimeError):
    """llama.cpp could not be fetched or built; the message names the step and where its log is.

    Examples
    --------
    >>> from otbound.lm import BuildError
    >>> str(BuildError("llama.cpp's build failed; see build.log"))
    "llama.cpp's build failed; see build.log"
    """


@dataclass(frozen=True)
class LlamaCppBuild:
    """A finished llama.cpp build (see :func:`llama_cpp_build`).

    Attributes
    ----------
    root : Path
        ``<cache>/llama.cpp/<version>-<key>``.
    version : str
        The ``llama-cpp-python`` release built (it pins the vendored llama.cpp tree).
    key : str
        16 hex digits of SHA-256 over the sdist's SHA-256, the flags and the targets.
    flags : tuple of str
        The cmake flags.

    Examples
    --------
    >>> from pathlib import Path
    >>> from otbound.lm import LlamaCppBuild
    >>> build = LlamaCppBuild(Path("/cache/llama.cpp/0.3.36-abc"), "0.3.36", "abc", ())
    >>> build.bin_dir.as_posix(), build.source.as_posix()
    ('/cache/llama.cpp/0.3.36-abc/build/bin', '/cache/llama.cpp/0.3.36-abc/src/vendor/llama.cpp')
    """

    root: Path
    version: str
    key: str
    flags: tuple[str, ...]

    @property
    def bin_dir(self) -> Path:
        """``build/bin``: the executables and the shared libraries."""
        return self.root / "build" / "bin"

    def binary(self, name: str) -> Path:
        """The path of executable ``name`` (``"llama-server"``, ``"llama-speculative"``, ...)."""
        path = self.bin_dir / name
        if not path.is_file():
            raise BuildError(f"{name} is not part of the llama.cpp build at {self.root} (built: {', '.join(TARGETS)})")
        return path

    @property
    def lib_path(self) -> Path:
        """The folder holding ``libllama.so`` and ``libggml*.so`` (``LLAMA_CPP_LIB_PATH`` of the bindings)."""
        return self.bin_dir

    @property
    def python_path(self) -> Path:
        """The folder holding the bindings' pure-Python package ``llama_cpp`` (put it on ``sys.path``)."""
        return self.root / "src"

    @property
    def source(self) -> Path:
        """The vendored llama.cpp tree."""
        return self.root / "src" / "vendor" / "llama.cpp"

    def describe(self) -> dict:
        """What produced this build, for the records of runs that use it (JSON-ready)."""
        return {"engine": "llama.cpp", "llama_cpp_python": self.version, "build_key": self.key,
                "flags": list(self.flags), "root": str(self.root)}


def build_key(sdist_sha256: str = LLAMA_CPP_SDIST_SHA256, flags=BUILD_FLAGS, targets=TARGETS) -> str:
    """16 hex digits naming one build: SHA-256 of the sdist's SHA-256, the flags and the targets.

    Examples
    --------
    >>> from otbound.lm._llama_cpp import build_key
    >>> len(build_key()), build_key() == build_key(flags=("-DGGML_NATIVE=ON",))
    (16, False)
    """
    text = json.dumps({"sdist": sdist_sha256, "flags": list(flags), "targets": list(targets)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _sdist(download: bool, progress: bool) -> Path:
    """The pinned sdist in the cache, downloaded with pip if missing; its SHA-256 checked."""
    folder = cache_root() / "sdist"
    path = folder / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    spec = f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
    if not path.exists():
        manual = f"{sys.executable} -m pip download --no-deps --no-binary :all: -d {folder} {spec}"
        if not download:
            raise ModelUnavailableError(f"the llama.cpp source ({path.name}) is not in {folder} and download=False; "
                                        f"fetch it with:\n  {manual}")
        folder.mkdir(parents=True, exist_ok=True)
        if progress:
            print(f"otbound: downloading the llama.cpp source ({spec}, 77 MB) into {folder}", file=sys.stderr)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                               "-d", str(folder), spec], capture_output=True, text=True)
        if proc.returncode != 0 or not path.exists():
            raise ModelUnavailableError(f"could not download {spec} from the package index (offline?); fetch it "
                                        f"with:\n  {manual}\npip: {(proc.stdout + proc.stderr)[-1500:]}")
    digest = file_sha256(path)
    if digest != LLAMA_CPP_SDIST_SHA256:
        path.unlink()
        raise BuildError(f"{path.name} has SHA-256 {digest}, not the pinned {LLAMA_CPP_SDIST_SHA256}: removed; "
                         "run again to download it anew")
    return path


def _trusted(root: Path) -> dict | None:
    """The ``BUILD.json`` record of ``root`` if the build is finished and its binaries are unchanged."""
    record_path = root / "BUILD.json"
    if not record_path.exists():
        return None
    try:
        record = json.loads(record_path.read_text())
        ok = all(file_sha256(root / "build" / rel) == digest for rel, digest in record["binaries"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if ok else None


@contextlib.contextmanager
def _build_lock(path: Path, progress: bool):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"otbound: waiting for another process building llama.cpp ({path})", file=sys.stderr)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run_logged(cmd, log, cwd, bar=None) -> int:
    """Run ``cmd``, appending its output to ``log``; advance ``bar`` by cmake's ``[ NN%]`` lines."""
    log.write(f"\n$ {' '.join(map(str, cmd))}\n")
    log.flush()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            log.write(line)
            m = re.match(r"\[\s*(\d+)%\]", line)
            if bar is not None and m:
                bar.update(max(0, int(m.group(1)) - bar.n))
        return proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def llama_cpp_build(*, download: bool = True, progress: bool = True, jobs: int | None = None) -> LlamaCppBuild:
    """Build llama.cpp from the pinned ``llama-cpp-python`` source distribution, once; return the build.

    The sdist (77 MB) is fetched with pip and checked against its pinned SHA-256; cmake builds
    ``llama-server``, ``llama-speculative``, ``llama-speculative-simple`` and the shared ``libllama``
    with portable flags (:data:`BUILD_FLAGS`) into ``<cache>/llama.cpp/<version>-<key>`` (about 20
    minutes on 2 cores, once). A finished build is reused while its binaries keep their recorded SHA-256;
    an unfinished one is removed and built again.

    Parameters
    ----------
    download : bool
        Fetch the sdist if it is not cached (else raise :class:`~otbound.lm.ModelUnavailableError`).
    progress : bool
        Print what happens, with a bar over cmake's percentage.
    jobs : int, optional
        Parallel compile jobs (default: the number of CPUs).

    Returns
    -------
    LlamaCppBuild

    Raises
    ------
    BuildError
        If cmake fails (the message names the step and the log file) or the sdist's checksum differs.

    Examples
    --------
    >>> from otbound.lm._llama_cpp import LLAMA_CPP_PYTHON_VERSION, build_key
    >>> LLAMA_CPP_PYTHON_VERSION, len(build_key())
    ('0.3.36', 16)
    """
    key = build_key()
    root = cache_root() / "llama.cpp" / f"{LLAMA_CPP_PYTHON_VERSION}-{key}"
    build = LlamaCppBuild(root=root, version=LLAMA_CPP_PYTHON_VERSION, key=key, flags=BUILD_FLAGS)
    if _trusted(root) is not None:
        return build
    with _build_lock(root.parent / f".{root.name}.lock", progress):
        if _trusted(root) is not None:  # another process finished it while we waited
            return build
        sdist = _sdist(download, progress)
        shutil.rmtree(root, ignore_errors=True)
        (root / "src").mkdir(parents=True)
        if progress:
            print(f"otbound: building llama.cpp (llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}) into {root}: "
                  "about 20 minutes on 2 cores, once", file=sys.stderr)
        with tarfile.open(sdist) as tar:
            top = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/"
            members = []
            for m in tar.getmembers():
                if not m.name.startswith(top) or "/.git/" in m.name or m.name.endswith("/.git"):
                    continue
                m.name = m.name[len(top):]
                if m.name:
                    members.append(m)
            tar.extractall(root / "src", members=members, filter="data")
        jobs = jobs or os.cpu_count() or 1
        log_path = root / "build.log"
        started = time.time()
        from tqdm.auto import tqdm

        with open(log_path, "w") as log, tqdm(total=100, desc="building llama.cpp", unit="%",
                                               disable=not progress) as bar:
            configure = ["cmake", "-S", str(build.source), "-B", str(root / "build"), *BUILD_FLAGS]
            if _run_logged(configure, log, root) != 0:
                raise BuildError(f"llama.cpp's cmake configure failed; see {log_path}")
            compile_ = ["cmake", "--build", str(root / "build"), "-j", str(jobs), "--target", *TARGETS]
            if _run_logged(compile_, log, root, bar) != 0:
                raise BuildError(f"llama.cpp's build failed; see {log_path}")
        missing = [rel for rel in BINARIES if not (root / "build" / rel).is_file()]
        if missing:
            raise BuildError(f"llama.cpp's build finished without {', '.join(missing)}; see {log_path}")
        record = {"llama_cpp_python": LLAMA_CPP_PYTHON_VERSION, "sdist_sha256": LLAMA_CPP_SDIST_SHA256,
                  "flags": list(BUILD_FLAGS), "targets": list(TARGETS), "key": key,
                  "seconds": round(time.time() - started, 1),
                  "binaries": {rel: file_sha256(root / "build" / rel) for rel in BINARIES}}
        write_text_atomic(root / "BUILD.json", json.dumps(record, indent=2, sort_keys=True))
        if progress:
            print(f"otbound: llama.cpp built in {record['seconds'] / 60:.1f} min", file=sys.stderr)
    return build
