"""Which type each tensor gets when a model is requantized, and the conversion of one tensor.

The rule follows llama.cpp's: matrices (two or more axes) become the target type; vectors
(norms, biases) stay as they are, because they are tiny and their precision matters. A
matrix also keeps its type when its rows are not whole blocks of the target, or when its
stored type is one Lightspeed cannot decode (it is then copied unchanged).

Conversion decodes with the numpy dequantizer and encodes with ``quant.quantize``, a
bounded number of rows at a time so that a large matrix (the 49k-row embedding) never
exists in float32 all at once.
"""
from __future__ import annotations

import numpy as np

from ..quant import FORMATS, QType, as_qtype, block_format, dequantize, quantize
from ..quant.quantize import QUANTIZABLE

# the --quant / --type choices, by their command-line names
TARGETS: dict[str, QType] = {"q8_0": QType.Q8_0, "q4_0": QType.Q4_0, "q4_1": QType.Q4_1, "f16": QType.F16,
                             "bf16": QType.BF16, "f32": QType.F32}
CHUNK_VALUES = 1 << 22  # float32 values decoded per step (16 MiB)


def parse_target(name: str | QType) -> QType:
    """The QType of a target name such as ``"q8_0"`` (case-insensitive); ValueError for others."""
    if isinstance(name, QType):
        qtype = name
    else:
        qtype = TARGETS.get(str(name).lower())
        if qtype is None:
            raise ValueError(f"unknown quantization type {name!r}; choose one of: {', '.join(TARGETS)}")
    if qtype not in QUANTIZABLE:
        raise ValueError(f"cannot quantize to {qtype.name}; choose one of: {', '.join(TARGETS)}")
    return qtype


def planned_type(shape: tuple[int, ...], stored: QType, target: QType) -> QType:
    """The type a tensor of ``shape`` stored as ``stored`` gets when requantizing to ``target``."""
    if len(shape) < 2 or stored not in FORMATS:
        return stored
    if shape[-1] % block_format(target).block_elems:
        return stored
    return target


def byte_shape(shape: tuple[int, ...], qtype: QType) -> tuple[int, ...]:
    """The uint8 shape of a tensor of ``shape`` stored as ``qtype``: rows of whole blocks."""
    fmt = block_format(qtype)
    return tuple(shape[:-1]) + (fmt.row_bytes(shape[-1]),)


def convert(raw: np.ndarray, stored: QType | str, target: QType | str, out: np.ndarray | None = None) -> np.ndarray:
    """Re-encode raw bytes ``(..., row_bytes)`` of type ``stored`` as ``target`` (same leading axes),
    into ``out`` when given (uint8, the result's shape). A tensor already of the target type is
    returned as it is (no copy) when there is no ``out``."""
    stored, target = as_qtype(stored), as_qtype(target)
    if stored is target and out is None:
        return raw
    src, dst = block_format(stored), block_format(target)
    lead = raw.shape[:-1]
    cols = raw.shape[-1] // src.block_bytes * src.block_elems
    rows = raw.reshape(-1, raw.shape[-1])
    shape = (rows.shape[0], dst.row_bytes(cols))
    if out is None:
        out = np.empty(shape, dtype=np.uint8)
    elif out.dtype != np.uint8 or out.size != shape[0] * shape[1]:
        raise ValueError(f"convert: out must be uint8 with {shape[0]} x {shape[1]} bytes, got {out.dtype}{out.shape}")
    out = out.reshape(shape)
    if stored is target:
        out[...] = rows
        return out.reshape(lead + (shape[1],))
    step = max(1, CHUNK_VALUES // max(cols, 1))
    for r in range(0, rows.shape[0], step):
        out[r:r + step] = quantize(dequantize(rows[r:r + step], stored), target)
    return out.reshape(lead + (out.shape[-1],))
