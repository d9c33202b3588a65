"""Atomic, self-describing safetensors files for traces and block traces.

A file holds named tensors plus string metadata; ``meta`` (a JSON object) is stored under the
metadata key ``"otbound"``, with a SHA-256 per tensor under ``"sha256"`` and one of the metadata
under ``"meta_sha256"`` that :func:`read` checks (:class:`otbound._integrity.CorruptFileError` on a
mismatch or an unreadable, e.g. truncated, file). Files are written atomically
(:func:`otbound._io.atomic_path`), so an interrupted run never leaves a file that looks finished.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from otbound._integrity import CorruptFileError, check_digests, content_key, tensor_digests
from otbound._io import atomic_path

STORE_DTYPES = ("float32", "float16")


def write_atomic(path: Path, tensors: dict, meta: dict) -> None:
    from safetensors.numpy import save_file

    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    meta = dict(meta, sha256=tensor_digests(tensors))
    meta["meta_sha256"] = content_key(meta)  # the metadata (temperature, seed, ...) is checked too
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"otbound": json.dumps(meta, sort_keys=True)})


def read(path) -> tuple[dict, dict]:
    """``(tensors as numpy arrays, meta)`` of one stored file, its checksums verified."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as fh:
            meta = json.loads((fh.metadata() or {}).get("otbound", "{}"))
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception as err:  # safetensors raises its own errors for truncated or garbled files
        raise CorruptFileError(f"{path}: unreadable ({type(err).__name__}: {err})") from err
    if "sha256" not in meta:
        raise CorruptFileError(f"{path}: no checksums stored (written before they were; re-collect it)")
    check_digests(path, tensors, meta["sha256"])
    stored = meta.pop("meta_sha256", None)
    if stored != content_key(meta):
        raise CorruptFileError(f"{path}: metadata checksum mismatch (the metadata was edited or damaged)")
    return tensors, meta


def read_meta(path) -> dict:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as fh:
            return json.loads((fh.metadata() or {}).get("otbound", "{}"))
    except Exception as err:
        raise CorruptFileError(f"{path}: unreadable ({type(err).__name__}: {err})") from err


def to_store(logits, dtype_name: str) -> np.ndarray:
    """Torch float32 logits -> numpy in the storage dtype (float32 is lossless for fp32 models)."""
    return logits.detach().to("cpu").float().numpy().astype(dtype_name, copy=False)
