"""Reference dequantizers in numpy: raw block bytes -> float32.

These follow the layouts documented in ``lightspeed.quant.formats`` and perform the
float32 arithmetic in the same order as ``dequant_graph`` (and as ggml), so the graph
version can be checked against them bit for bit.
"""
from __future__ import annotations

import numpy as np

from .formats import QType, block_format


def _f16(lo_hi: np.ndarray) -> np.ndarray:
    """Two bytes per value (little-endian float16) -> float32, shape (n, k*2) -> (n, k)."""
    return np.ascontiguousarray(lo_hi).view("<f2").astype(np.float32)


def _nibbles32(qs: np.ndarray) -> np.ndarray:
    """(n, 16) packed bytes -> (n, 32) values: low nibbles first, then high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)


def _q8_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    q = b[:, 2:34].view(np.int8).astype(np.float32)
    return d * q


def _q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    return d * (_nibbles32(b[:, 2:18]) - np.float32(8))


def _q4_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    return d * _nibbles32(b[:, 4:20]) + m


def _q5_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    qh = np.ascontiguousarray(b[:, 2:6]).view("<u4")                      # (n, 1)
    high = (qh >> np.arange(32, dtype=np.uint32)) & 1                      # bit i of qh is element i's 5th bit
    q = _nibbles32(b[:, 6:22]) + high.astype(np.float32) * np.float32(16)
    return d * (q - np.float32(16))


def q4_k_scales(sc_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack Q4_K's 12 scale bytes into 8 six-bit scales and 8 six-bit mins (as uint8)."""
    a, b, c = sc_bytes[:, 0:4], sc_bytes[:, 4:8], sc_bytes[:, 8:12]
    scale = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=1)
    mins = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return scale, mins


def _q4_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = q4_k_scales(b[:, 4:16])
    qs = b[:, 16:144].reshape(n, 4, 1, 32)
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)
    scale = (d * sc.astype(np.float32))[:, :, None]
    offset = (dmin * mn.astype(np.float32))[:, :, None]
    return (scale * nib - offset).reshape(n, 256)


def _q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 1, 2, 32)                               # [half, -, k%2, l]
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(n, 2, 4, 32)  # [half, k, l]
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    top = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3
    q = (low | (top << 4)).astype(np.float32) - np.float32(32)             # [n, 2, 4, 32]
    sc = b[:, 192:208].view(np.int8).astype(np.float32).reshape(n, 2, 4, 2, 1)
    d = _f16(b[:, 208:210]).reshape(n, 1, 1, 1, 1)
    return ((d * sc) * q.reshape(n, 2, 4, 2, 16)).reshape(n, 256)


_DECODERS = {
    QType.Q8_0: _q8_0,
    QType.Q4_0: _q4_0,
    QType.Q4_1: _q4_1,
    QType.Q5_0: _q5_0,
    QType.Q4_K: _q4_k,
    QType.Q6_K: _q6_k,
}


def dequantize_blocks(blocks: np.ndarray, qtype) -> np.ndarray:
    """(n_blocks, block_bytes) uint8 -> (n_blocks, block_elems) float32."""
    fmt = block_format(qtype)
    blocks = np.asarray(blocks)
    if blocks.dtype != np.uint8 or blocks.ndim != 2 or blocks.shape[1] != fmt.block_bytes:
        raise ValueError(f"dequantize {fmt.name}: expected uint8 blocks of shape (n, {fmt.block_bytes}), "
                         f"got {blocks.dtype}{tuple(blocks.shape)}")
    if fmt.qtype is QType.F32:
        return np.ascontiguousarray(blocks).view("<f4").astype(np.float32)
    if fmt.qtype is QType.F16:
        return _f16(blocks)
    if fmt.qtype is QType.BF16:
        bits = np.ascontiguousarray(blocks).view("<u2").astype(np.uint32) << 16
        return bits.view(np.float32)
    with np.errstate(all="ignore"):
        return _DECODERS[fmt.qtype](blocks)


def dequantize(raw: np.ndarray, qtype, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Decode raw bytes of whole blocks into float32.

    ``raw`` is a uint8 array whose last axis holds whole blocks (for example a GGUF
    tensor's byte view, shape ``(rows, row_bytes)``). The result has the same leading
    axes and ``row_bytes / block_bytes * block_elems`` values on the last axis, or
    ``shape`` if given.
    """
    fmt = block_format(qtype)
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise ValueError(f"dequantize {fmt.name}: expected raw uint8 bytes, got {raw.dtype}")
    if raw.ndim == 0 or raw.shape[-1] % fmt.block_bytes:
        raise ValueError(f"dequantize {fmt.name}: the last axis ({raw.shape[-1] if raw.ndim else 0} bytes) "
                         f"is not a whole number of {fmt.block_bytes}-byte blocks")
    lead = raw.shape[:-1]
    n_per_row = raw.shape[-1] // fmt.block_bytes
    out = dequantize_blocks(raw.reshape(-1, fmt.block_bytes), fmt.qtype)
    out = out.reshape(lead + (n_per_row * fmt.block_elems,))
    return out.reshape(shape) if shape is not None else out
