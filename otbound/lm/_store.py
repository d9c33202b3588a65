"""Atomic, self-describing safetensors files for traces and block traces.

A file holds named tensors plus string metadata; ``meta`` (a JSON object) is stored under the
metadata key ``"otbound"``. Files are written atomically (:func:`otbound._io.atomic_path`), so an
interrupted run never leaves a file that looks finished.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from otbound._io import atomic_path

STORE_DTYPES = ("float32", "float16")


def write_atomic(path: Path, tensors: dict, meta: dict) -> None:
    from safetensors.numpy import save_file

    with atomic_path(path) as tmp:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp),
                  metadata={"otbound": json.dumps(meta, sort_keys=True)})


def read(path) -> tuple[dict, dict]:
    """``(tensors as numpy arrays, meta)`` of one stored file."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as fh:
        meta = json.loads((fh.metadata() or {}).get("otbound", "{}"))
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    return tensors, meta


def read_meta(path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as fh:
        return json.loads((fh.metadata() or {}).get("otbound", "{}"))


def to_store(logits, dtype_name: str) -> np.ndarray:
    """Torch float32 logits -> numpy in the storage dtype (float32 is lossless for fp32 models)."""
    return logits.detach().to("cpu").float().numpy().astype(dtype_name, copy=False)
