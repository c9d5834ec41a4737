"""``lightspeed quantize IN OUT --type TYPE``: a new GGUF file with the matrices requantized.

The output is written with the ``gguf`` package's ``GGUFWriter`` (the writer llama.cpp's
own tools use), so llama.cpp and Lightspeed both read it. Every metadata key is copied
with its stored GGUF value type (``general.file_type`` is updated to the new type), the
tensors keep their names and order, and tensors are converted and written one at a time,
so memory holds one tensor's worth of data beyond the mapped input.

Lightspeed's GGUF reader validates the input and gives the values; the value *types*, which
that reader does not keep, come from one more pass over the header (``metadata_types``).
"""
from __future__ import annotations

import mmap
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..io import ModelFormatError, load_gguf
from ..quant import QType, type_size
from .plan import convert, parse_target, planned_type

# general.file_type values (llama.cpp's llama_ftype) of a file whose matrices are all of one type
FILE_TYPES = {QType.F32: 0, QType.F16: 1, QType.Q4_0: 2, QType.Q4_1: 3, QType.Q8_0: 7, QType.BF16: 32}
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # fixed-size GGUF value types
_STRING, _ARRAY = 8, 9


def metadata_types(path: str) -> dict[str, tuple[int, int | None]]:
    """``key -> (value type, item type of an array or None)`` for every metadata key of a GGUF
    file that ``load_gguf`` has already validated (so lengths are trusted here)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        u32, u64 = struct.Struct("<I").unpack_from, struct.Struct("<Q").unpack_from
        n_kv = u64(buf, 16)[0]
        pos = 24
        out: dict[str, tuple[int, int | None]] = {}

        def skip(vtype: int, pos: int) -> int:
            if vtype == _STRING:
                return pos + 8 + u64(buf, pos)[0]
            if vtype == _ARRAY:
                item, count = u32(buf, pos)[0], u64(buf, pos + 4)[0]
                pos += 12
                if item in _SIZES:
                    return pos + count * _SIZES[item]
                for _ in range(count):
                    pos = skip(item, pos)
                return pos
            return pos + _SIZES[vtype]

        for _ in range(n_kv):
            n = u64(buf, pos)[0]
            key = bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8")
            vtype = u32(buf, pos + 8 + n)[0]
            pos += 12 + n
            out[key] = (vtype, u32(buf, pos)[0] if vtype == _ARRAY else None)
            pos = skip(vtype, pos)
        return out


@dataclass
class QuantizeReport:
    """What ``quantize_gguf`` wrote."""

    target: str
    converted: list[str] = field(default_factory=list)   # tensors re-encoded as the target
    kept: list[str] = field(default_factory=list)        # tensors copied unchanged (vectors, already target, ...)
    dropped_keys: list[str] = field(default_factory=list)  # metadata the writer cannot store (empty arrays)
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0


def quantize_gguf(src: str | os.PathLike[str], dst: str | os.PathLike[str], target: str | QType,
                  progress: Callable[[str, int, int], None] | None = None) -> QuantizeReport:
    """Write ``dst``: the GGUF file ``src`` with its matrices requantized to ``target`` (q8_0, q4_0,
    q4_1, f16, bf16, f32). ``progress(name, index, count)`` is called before each tensor."""
    import gguf  # the writer; an optional dependency of Lightspeed

    t0 = time.perf_counter()
    src, dst = os.fspath(src), os.fspath(dst)
    qtarget = parse_target(target)
    if os.path.exists(dst) and os.path.samefile(src, dst):
        raise ValueError(f"quantize: the output {dst!r} is the input file; choose another path")
    gf = load_gguf(src)
    if gf.architecture is None:
        raise ModelFormatError(src, "missing metadata key 'general.architecture'")
    types = metadata_types(src)
    report = QuantizeReport(qtarget.name)
    tmp = f"{dst}.partial-{os.getpid()}"
    writer = gguf.GGUFWriter(tmp, gf.architecture)
    try:
        for key, value in gf.metadata.items():
            vtype, item = types[key]
            if key == "general.architecture":
                continue  # the writer's constructor adds it
            if key == "general.alignment":
                writer.add_custom_alignment(int(value))
            elif key == "general.file_type":  # the new type, in the key's place and with its value type
                writer.add_key_value(key, FILE_TYPES[qtarget], gguf.GGUFValueType(vtype))
            elif vtype == _ARRAY and len(value) == 0:
                report.dropped_keys.append(key)
            else:
                writer.add_key_value(key, value, gguf.GGUFValueType(vtype),
                                     gguf.GGUFValueType(item) if item is not None else None)
        if "general.file_type" not in gf.metadata:
            writer.add_uint32("general.file_type", FILE_TYPES[qtarget])
        plan = []
        for name, t in gf.tensors.items():
            to = planned_type(tuple(t.shape), t.qtype, qtarget)
            elems, block_bytes = type_size(to)
            shape = tuple(t.shape[:-1]) + (t.shape[-1] // elems * block_bytes,)
            writer.add_tensor_info(name, shape, np.dtype(np.uint8), int(np.prod(shape, dtype=np.int64)),
                                   raw_dtype=gguf.GGMLQuantizationType(int(to)))
            plan.append((name, t, to))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, (name, t, to) in enumerate(plan):
            if progress is not None:
                progress(name, i, len(plan))
            data = convert(t.raw, t.qtype, to) if to is not t.qtype else t.raw
            (report.converted if to is not t.qtype else report.kept).append(name)
            report.bytes_in += int(t.n_bytes)
            report.bytes_out += int(data.nbytes)
            writer.write_tensor_data(np.ascontiguousarray(data))
        writer.close()
        os.replace(tmp, dst)
    finally:
        writer.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
        gf.close()
    report.seconds = time.perf_counter() - t0
    return report
