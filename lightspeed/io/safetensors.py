"""Reading .safetensors files as memory-mapped numpy views.

    st = load_safetensors("model.safetensors")
    t = st.tensors["model.embed_tokens.weight"]
    t.dtype, t.shape        # "BF16", (49152, 576)
    t.numpy()               # a view of the mapped file, no copy; BF16 is uint16 bit patterns
    t.ls_dtype              # lightspeed dtype (ls.bfloat16), for g.input(..., dtype) / g.constant(arr, dtype)
    t.to_float32()          # a float32 copy
    st.metadata             # the "__metadata__" strings

The format is an 8-byte little-endian header length, a JSON header, then the data.
The header is parsed here (the ``safetensors`` package's numpy loader copies every
tensor and rejects bfloat16); every field is validated before use and problems raise
``ModelFormatError`` naming the file and tensor. The tests check values against the
``safetensors`` package.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
from typing import Any

import numpy as np

from .. import dtypes as dt
from .errors import ModelFormatError
from .files import open_regular

MAX_HEADER_BYTES = 100_000_000  # the limit the reference implementation enforces

# safetensors dtype name -> (numpy dtype used to hold it, lightspeed dtype or None)
DTYPES: dict[str, tuple[str, Any]] = {
    "F64": ("<f8", None), "F32": ("<f4", dt.float32), "F16": ("<f2", dt.float16), "BF16": ("<u2", dt.bfloat16),
    "I64": ("<i8", dt.int64), "I32": ("<i4", dt.int32), "I16": ("<i2", dt.int16), "I8": ("i1", dt.int8),
    "U64": ("<u8", None), "U32": ("<u4", dt.uint32), "U16": ("<u2", dt.uint16), "U8": ("u1", dt.uint8),
    "BOOL": ("?", dt.bool_),
}


class SafeTensor:
    """One tensor of a safetensors file, backed by the memory-mapped file."""

    __slots__ = ("name", "dtype", "shape", "offset", "n_bytes", "_file")

    def __init__(self, name: str, dtype: str, shape: tuple[int, ...], offset: int, n_bytes: int, file):
        self.name, self.dtype, self.shape, self.offset, self.n_bytes, self._file = \
            name, dtype, shape, offset, n_bytes, file

    @property
    def ls_dtype(self) -> "dt.DType | None":
        """The Lightspeed dtype of the values (None for F64/U64, which Lightspeed does not compute in)."""
        return DTYPES[self.dtype][1]

    def numpy(self) -> np.ndarray:
        """A read-only view of the mapped bytes with the tensor's dtype and shape (BF16 as uint16 bits)."""
        np_dtype = np.dtype(DTYPES[self.dtype][0])
        count = self.n_bytes // np_dtype.itemsize
        return np.frombuffer(self._file._map, dtype=np_dtype, count=count, offset=self.offset).reshape(self.shape)

    def to_float32(self) -> np.ndarray:
        """The values converted to a new float32 array."""
        a = self.numpy()
        return dt.bf16_to_f32(a) if self.dtype == "BF16" else a.astype(np.float32)

    def __repr__(self) -> str:
        return f"SafeTensor({self.name!r}, {self.dtype}, shape={self.shape})"


class SafetensorsFile:
    """A parsed safetensors file: ``tensors`` (name -> SafeTensor, header order) and ``metadata``."""

    def __init__(self, path: str, metadata: dict[str, str], tensors: dict[str, SafeTensor], mapping):
        self.path, self.metadata, self.tensors, self._map = path, metadata, tensors, mapping

    def close(self) -> None:
        """Release the mapping (it stays open while arrays from ``numpy()`` are alive)."""
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SafetensorsFile({self.path!r}, {len(self.tensors)} tensors)"


def load_safetensors(path: "str | os.PathLike[str]") -> SafetensorsFile:
    """Parse and validate a .safetensors file; tensor data stays in the memory-mapped file."""
    path = os.fspath(path)
    with open_regular(path) as f:  # a FIFO or a directory is refused, never waited on
        try:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise ModelFormatError(path, f"too short ({size} bytes) to be a safetensors file")
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise ModelFormatError(path, f"cannot map: {e.strerror or e}") from None
    try:
        return _parse(path, mapping, size)
    except ModelFormatError:
        mapping.close()
        raise


def _parse(path: str, buf: mmap.mmap, size: int) -> SafetensorsFile:
    def fail(problem: str) -> ModelFormatError:
        return ModelFormatError(path, problem)

    (n,) = struct.unpack_from("<Q", buf, 0)
    if n > size - 8:
        raise fail(f"header length {n} exceeds the file size {size} (truncated or not a safetensors file)")
    if n > MAX_HEADER_BYTES:
        raise fail(f"header length {n} is larger than the {MAX_HEADER_BYTES}-byte limit")
    try:
        header = json.loads(buf[8:8 + n].decode("utf-8"))
    except UnicodeDecodeError as e:
        raise fail(f"header is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    except (ValueError, RecursionError) as e:
        raise fail(f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise fail(f"header must be a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise fail("__metadata__ must map strings to strings")
    data_start, data_size = 8 + n, size - 8 - n
    file = SafetensorsFile(path, metadata, {}, buf)
    spans = []
    for name, info in header.items():
        t = _tensor(name, info, data_start, data_size, file, fail)
        file.tensors[name] = t
        spans.append((t.offset, t.offset + t.n_bytes, name))
    spans.sort()
    for (s0, e0, a), (s1, e1, b) in zip(spans, spans[1:]):
        if s1 < e0:
            raise fail(f"tensors {a!r} and {b!r} overlap (corrupt data_offsets)")
    return file


def _tensor(name: str, info: Any, data_start: int, data_size: int, file: SafetensorsFile, fail) -> SafeTensor:
    if not isinstance(info, dict):
        raise fail(f"entry {name!r} must be an object with dtype, shape and data_offsets")
    missing = {"dtype", "shape", "data_offsets"} - set(info)
    if missing:
        raise fail(f"tensor {name!r} lacks {', '.join(sorted(missing))}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in DTYPES:
        raise fail(f"tensor {name!r} has unknown or unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise fail(f"tensor {name!r} has an invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise fail(f"tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise fail(f"tensor {name!r} data_offsets [{begin}, {end}) lie outside the {data_size}-byte data section"
                   f"{' (truncated?)' if end > data_size else ''}")
    itemsize = np.dtype(DTYPES[dtype][0]).itemsize
    want = int(np.prod(shape, dtype=object)) * itemsize if shape else itemsize
    if end - begin != want:
        raise fail(f"tensor {name!r} of {dtype}{shape} needs {want} bytes but data_offsets span {end - begin}")
    return SafeTensor(name, dtype, tuple(shape), data_start + begin, end - begin, file)
