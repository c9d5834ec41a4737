"""Reference quantizers in numpy: float32 -> raw block bytes (for ``--quant`` requantization).

Supported targets: F32, F16, BF16, Q8_0, Q4_0, Q4_1. The rounding rules are ggml's
reference ones (``quantize_row_*_ref``), so the bytes match files that llama.cpp writes:

- Q8_0: d = max|x| / 127, q = round-half-away-from-zero(x / d).
- Q4_0: d = m / -8 where m is the value of largest magnitude (first one on ties),
  q = min(15, trunc(x / d + 8.5)).
- Q4_1: d = (max - min) / 15, q = min(15, trunc((x - min) / d + 0.5)), stored min.

Scales are computed in float32 and stored as float16; the quants use the float32 scale.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .formats import QType, block_format


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C ``roundf``: halves go away from zero (numpy's ``round`` goes to even)."""
    a = np.abs(v)
    whole = np.trunc(a)
    up = (a - whole) >= np.float32(0.5)  # exact: a - trunc(a) has no rounding error
    return np.copysign(whole + up.astype(np.float32), v)


def _inverse(d: np.ndarray) -> np.ndarray:
    """1/d, or 0 where d is 0 (an all-zero block quantizes to zeros)."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype("<f2").view(np.uint8).reshape(x.shape[0], -1)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values in 0..15 -> (n, 16) bytes: element i in the low nibble, i+16 in the high."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def _q8_0(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    q = _round_half_away(x * _inverse(d)).astype(np.int8)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1)


def _q4_0(x: np.ndarray) -> np.ndarray:
    pick = np.abs(x).argmax(axis=1)[:, None]          # argmax returns the first maximum
    extreme = np.take_along_axis(x, pick, axis=1)
    d = extreme / np.float32(-8)
    q = np.minimum(np.trunc(x * _inverse(d) + np.float32(8.5)), 15)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=1)


def _q4_1(x: np.ndarray) -> np.ndarray:
    lo = x.min(axis=1, keepdims=True)
    hi = x.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    q = np.minimum(np.trunc((x - lo) * _inverse(d) + np.float32(0.5)), 15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q)], axis=1)


_ENCODERS = {QType.Q8_0: _q8_0, QType.Q4_0: _q4_0, QType.Q4_1: _q4_1}
QUANTIZABLE = (QType.F32, QType.F16, QType.BF16) + tuple(_ENCODERS)


def quantize(x: np.ndarray, qtype) -> np.ndarray:
    """Encode float values into raw block bytes.

    ``x`` has shape ``(..., k)`` with ``k`` a multiple of the block size; the result is
    uint8 with shape ``(..., k / block_elems * block_bytes)``, the layout GGUF stores.
    """
    fmt = block_format(qtype)
    if fmt.qtype not in QUANTIZABLE:
        raise NotImplementedError(f"quantize: no encoder for {fmt.name}; supported: "
                                  f"{', '.join(q.name for q in QUANTIZABLE)}")
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % fmt.block_elems:
        raise ValueError(f"quantize {fmt.name}: the last axis ({x.shape[-1] if x.ndim else 0}) is not a "
                         f"multiple of the block size {fmt.block_elems}")
    lead, k = x.shape[:-1], x.shape[-1]
    out_shape = lead + (k // fmt.block_elems * fmt.block_bytes,)
    if fmt.qtype is QType.F32:
        return np.ascontiguousarray(x, dtype="<f4").view(np.uint8).reshape(out_shape)
    if fmt.qtype is QType.F16:
        with np.errstate(over="ignore"):
            return np.ascontiguousarray(x.astype("<f2")).view(np.uint8).reshape(out_shape)
    if fmt.qtype is QType.BF16:
        return dt.f32_to_bf16(x).astype("<u2").view(np.uint8).reshape(out_shape)
    blocks = np.ascontiguousarray(x).reshape(-1, fmt.block_elems)
    with np.errstate(invalid="ignore", over="ignore"):
        return _ENCODERS[fmt.qtype](blocks).reshape(out_shape)
