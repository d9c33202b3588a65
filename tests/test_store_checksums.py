"""The checksums of stored tensors cover dtype, shape and bytes: each field flipped alone (the other
two kept exactly) is refused, by the digest and by a trace store file read back."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from otbound._integrity import CorruptFileError, check_digests, tensor_digest, tensor_digests
from otbound.lm import _store

BASE = np.arange(12, dtype=np.float32).reshape(3, 4) / 7


def flipped_fields(a: np.ndarray) -> dict:
    """Arrays that differ from ``a`` in exactly one covered field."""
    flipped_byte = a.copy()
    flipped_byte.reshape(-1).view(np.uint8)[5] ^= 0x01
    return {
        # the same bytes and shape, read as another dtype of the same width
        "dtype": a.view(np.int32),
        # the same dtype and bytes, another shape (and a 1-D view of them)
        "shape": a.reshape(4, 3),
        "shape-1d": a.reshape(-1),
        # the same dtype and shape, one bit of the data
        "bytes": flipped_byte,
        # the same bytes read in the other byte order: dtype.str differs ('<f4' / '>f4')
        "byte order": a.view(a.dtype.newbyteorder()),
    }


def test_the_fields_of_the_flips_are_what_they_claim():
    # independent of the digest: each flip keeps the two other fields exactly
    for name, b in flipped_fields(BASE).items():
        same_bytes = np.ascontiguousarray(b).tobytes() == BASE.tobytes()
        same_shape = b.shape == BASE.shape
        same_dtype = b.dtype.str == BASE.dtype.str
        assert [same_dtype, same_shape, same_bytes].count(False) == 1, name


@pytest.mark.parametrize("field", list(flipped_fields(BASE)))
def test_digest_changes_with_each_covered_field_alone(field):
    b = flipped_fields(BASE)[field]
    assert tensor_digest(b) != tensor_digest(BASE)
    with pytest.raises(CorruptFileError, match=r"checksum mismatch in \['x'\]"):
        check_digests("f", {"x": b}, tensor_digests({"x": BASE}))
    # and the digest is of the content, not of the object: an equal copy passes
    check_digests("f", {"x": BASE.copy()}, tensor_digests({"x": BASE}))


def test_empty_arrays_of_other_shapes_or_dtypes_differ():
    # no bytes at all: only dtype and shape tell these apart
    e = np.zeros((0, 3), np.float32)
    assert len({tensor_digest(x) for x in (e, np.zeros((3, 0), np.float32), np.zeros((0, 3), np.float16))}) == 3


def _rewrite(path, tensors, meta_text):
    """Replace the tensors of a stored file, keeping its metadata (checksums included) verbatim."""
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata={"otbound": meta_text})


@pytest.mark.parametrize("field", ["dtype", "shape", "shape-1d", "bytes", "name"])
def test_trace_store_refuses_each_field_flipped(tmp_path, field):
    path = tmp_path / "trace.safetensors"
    ids = np.arange(5, dtype=np.int64)
    _store.write_atomic(path, {"target_logits": BASE, "ids": ids}, {"temperature": 0.7})
    tensors, meta = _store.read(path)  # intact: read back equal
    np.testing.assert_array_equal(tensors["target_logits"], BASE)
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as fh:
        meta_text = fh.metadata()["otbound"]
    if field == "name":
        edited = {"draft_logits": BASE, "ids": ids}
    else:
        edited = {"target_logits": flipped_fields(BASE)[field], "ids": ids}
    _rewrite(path, edited, meta_text)
    with pytest.raises(CorruptFileError, match="checksum mismatch|do not match the stored list"):
        _store.read(path)
    # the metadata untouched: the refusal is the tensors' checksum, not the metadata's
    assert json.loads(meta_text)["meta_sha256"]
