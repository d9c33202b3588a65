"""The checksums of stored tensors cover dtype, shape and bytes: each field flipped alone (the other
two kept exactly) is refused, by the digest and by a trace store file read back; so is each field a
converted model folder's manifest records (the file list, size, modification time, SHA-256)."""

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


def test_folder_manifest_refuses_each_recorded_field_changed_alone(tmp_path):
    import os

    from otbound._integrity import check_manifest, folder_manifest

    (tmp_path / "sub").mkdir()
    files = {"a.bin": b"\x00\x01\x02\x03", "sub/b.txt": b"hello"}
    for rel, data in files.items():
        (tmp_path / rel).write_bytes(data)
    manifest = folder_manifest(tmp_path)
    assert check_manifest(tmp_path, manifest, full=True) is None
    assert check_manifest(tmp_path, manifest, full=False) is None
    target = tmp_path / "sub/b.txt"
    st = target.stat()

    # the bytes alone (same size, modification time put back): the full check's SHA-256 refuses it
    target.write_bytes(b"hellO")
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert check_manifest(tmp_path, manifest, full=True) == (
        "sub/b.txt: SHA-256 differs from the one recorded at conversion")
    # the modification time alone (the bytes put back): the fast check refuses it, the full check passes
    target.write_bytes(b"hello")
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert check_manifest(tmp_path, manifest, full=False) == "sub/b.txt: modified after conversion"
    assert check_manifest(tmp_path, manifest, full=True) is None
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    # the size: both checks
    target.write_bytes(b"hello!")
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    for full in (False, True):
        assert check_manifest(tmp_path, manifest, full=full) == "sub/b.txt: 6 bytes, recorded 5"
    target.write_bytes(b"hello")
    # the list of files: one more, one fewer
    (tmp_path / "extra").write_bytes(b"")
    assert "unexpected ['extra']" in check_manifest(tmp_path, manifest, full=False)
    (tmp_path / "extra").unlink()
    (tmp_path / "a.bin").unlink()
    assert "missing ['a.bin']" in check_manifest(tmp_path, manifest, full=True)
