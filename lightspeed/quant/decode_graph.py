"""Dequantisation expressed as Lightspeed graph ops on the raw block bytes.

``dequant_graph(raw, qtype)`` takes a uint8 tensor ``(n_blocks, block_bytes)`` and returns
the float32 tensor ``(n_blocks, block_elems)`` using only primitive ops (Cast, Mod, Mul,
Add, LessThan, Exp2) and views (slicing byte columns, reshape/expand to spread a byte or
a scale over the elements that use it). No op reads more than the bytes of its own
block, so a backend can fuse the decode into the kernel that consumes the weights
(the load of ``W[k, j]`` becomes this expression).

Bytes are converted to float32 once; every intermediate is then an integer (or a
power-of-two multiple of one) small enough to be exact in float32, so bit fields are
extracted exactly:

- ``floor(x / 2**s) % 2**w`` gives the w-bit field at bit s of a non-negative byte x
  (``floor(y) = y - fmod(y, 1)``, and multiplying by ``2**-s`` is exact);
- float16 scales are rebuilt from sign, exponent and mantissa as
  ``(mantissa + 1024*[e > 0]) * exp2(max(e, 1) - 25)``, with signed zeros, subnormals,
  infinities and NaN as IEEE has them (``exp2`` of an integer is exact).

The float32 arithmetic that combines scales and quants happens in the same order as in
``lightspeed.quant.dequant`` (and ggml), so the reference backend reproduces the numpy
dequantizer bit for bit. A native backend stays exact as long as it keeps IEEE float32
semantics: flush-to-zero (``-ffast-math``) would zero subnormal scales, and contracting
``d*q + m`` into an FMA changes the last bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..graph import BytesValue
from ..tensor import Tensor
from .formats import QType, block_format


def _const(like: Tensor, values: np.ndarray) -> Tensor:
    return like.graph.constant(np.ascontiguousarray(values, dtype=np.float32))


def _floor(y: Tensor) -> Tensor:
    """floor(y) for y >= 0."""
    return y - y % 1.0


def bit_field(x: Tensor, shift, width: int) -> Tensor:
    """The ``width``-bit field starting at bit ``shift`` of non-negative integer-valued floats ``x``.

    ``shift`` is an int or a float32 constant Tensor of shifts that broadcasts against ``x``
    (given as the factors ``2**-shift``).
    """
    scale = 2.0 ** -shift if isinstance(shift, int) else shift
    shifted = _floor(x * scale) if not (isinstance(scale, float) and scale == 1.0) else x
    return shifted % float(2 ** width)


def ieee_float(negative: Tensor, exponent: Tensor, mantissa: Tensor, exp_bits: int, mant_bits: int) -> Tensor:
    """The IEEE-754 value with the given fields (exponent and mantissa as integer-valued float32)."""
    bias = 2 ** (exp_bits - 1) - 1
    implicit = float(2 ** mant_bits)
    subnormal = exponent < 1.0
    # normal: (2**M + mantissa) * 2**(e - bias - M); subnormal: mantissa * 2**(1 - bias - M)
    significand = mantissa + implicit + subnormal * -implicit
    power = exponent + subnormal * 1.0 + float(-(bias + mant_bits))
    # exponent all ones: exp2(+inf) gives infinity for a zero mantissa, exp2(NaN) = NaN otherwise
    # (inf * 0 is NaN; the bool select keeps both out of the finite case)
    special = (mantissa < 1.0).cast(dt.float32) * float("inf")
    power = power + (float(2 ** exp_bits - 2) < exponent) * special
    return significand * power.exp2() * (1.0 + negative * -2.0)


def half_from_bytes(lo: Tensor, hi: Tensor) -> Tensor:
    """float16 values from their little-endian bytes (as float32 tensors of byte values)."""
    low7 = hi % 128.0
    mant_top = low7 % 4.0
    exponent = (low7 - mant_top) * 0.25
    mantissa = mant_top * 256.0 + lo
    out = ieee_float(127.0 < hi, exponent, mantissa, 5, 10)
    # a backend may read the two bytes as one float16 instead (the same value, NaN payloads aside)
    out.graph.byte_values[out.node.id] = BytesValue(dt.float16, ((lo.node, lo.st), (hi.node, hi.st)))
    return out


def bf16_from_bytes(lo: Tensor, hi: Tensor) -> Tensor:
    """bfloat16 values from their little-endian bytes."""
    mantissa = lo % 128.0
    exponent = (hi % 128.0) * 2.0 + (lo - mantissa) * (1.0 / 128)
    return ieee_float(127.0 < hi, exponent, mantissa, 8, 7)


def f32_from_bytes(b0: Tensor, b1: Tensor, b2: Tensor, b3: Tensor) -> Tensor:
    """float32 values from their little-endian bytes (exact, including subnormals)."""
    m_top = b2 % 128.0
    exponent = (b3 % 128.0) * 2.0 + (b2 - m_top) * (1.0 / 128)
    mantissa = m_top * 65536.0 + b1 * 256.0 + b0
    return ieee_float(127.0 < b3, exponent, mantissa, 8, 23)


def _signed(b: Tensor) -> Tensor:
    """int8 values of bytes (two's complement)."""
    out = b + (127.0 < b) * -256.0
    out.graph.byte_values[out.node.id] = BytesValue(dt.int8, ((b.node, b.st),))  # one signed byte
    return out


def _spread(x: Tensor, n, groups: tuple[int, ...], copies_at: int, copies: int) -> Tensor:
    """View (n, prod(groups)) as (n, *groups), insert an axis of ``copies`` at ``copies_at`` and flatten."""
    shaped = x.reshape((n,) + groups)
    expanded = shaped.unsqueeze(copies_at).expand((n,) + groups[:copies_at - 1] + (copies,) + groups[copies_at - 1:])
    return expanded.reshape((n, int(np.prod(groups)) * copies))


def _nibbles32(qs: Tensor, n) -> Tensor:
    """(n, 16) packed bytes -> (n, 32): the low nibbles, then the high nibbles."""
    shift = _const(qs, np.repeat([1.0, 1.0 / 16], 16).reshape(1, 32))
    return bit_field(_spread(qs, n, (16,), 1, 2), shift, 4)


def _scales(b: Tensor, n, at: int, count: int = 1) -> Tensor:
    """``count`` consecutive float16 values stored from byte ``at`` of each block, shape (n, count),
    decoded together so that the decode appears once in the graph."""
    pairs = b[:, at:at + 2 * count].reshape((n, count, 2))
    return half_from_bytes(pairs[:, :, 0], pairs[:, :, 1])


def _q8_0(b: Tensor, n) -> Tensor:
    return _scales(b, n, 0) * _signed(b[:, 2:34])


def _q4_0(b: Tensor, n) -> Tensor:
    return _scales(b, n, 0) * (_nibbles32(b[:, 2:18], n) + -8.0)


def _q4_1(b: Tensor, n) -> Tensor:
    dm = _scales(b, n, 0, 2)
    return dm[:, 0:1] * _nibbles32(b[:, 4:20], n) + dm[:, 1:2]


def _q5_0(b: Tensor, n) -> Tensor:
    qh = _spread(b[:, 2:6], n, (4,), 2, 8)                           # byte i//8 for element i
    bit = bit_field(qh, _const(b, np.tile(2.0 ** -np.arange(8), 4).reshape(1, 32)), 1)
    q = _nibbles32(b[:, 6:22], n) + bit * 16.0
    return _scales(b, n, 0) * (q + -16.0)


def _cat(a: Tensor, c: Tensor) -> Tensor:
    """Concatenate two (n, k) tensors along axis 1 (two padded views and one Add)."""
    k = a.shape[1]
    return a.pad(((0, 0), (0, k))) + c.pad(((0, 0), (k, 0)))


def _q4_k(b: Tensor, n) -> Tensor:
    dm = _scales(b, n, 0, 2)
    d, dmin = dm[:, 0:1], dm[:, 1:2]
    lo_a, lo_b, hi_c = b[:, 4:8], b[:, 8:12], b[:, 12:16]
    sc_low, mn_low = lo_a % 64.0, lo_b % 64.0
    c_low = hi_c % 16.0
    sc_high = c_low + (lo_a - sc_low) * 0.25                       # (a >> 6) << 4
    mn_high = (hi_c - c_low) * (1.0 / 16) + (lo_b - mn_low) * 0.25
    scale = d * _cat(sc_low, sc_high)                                # (n, 8)
    neg_offset = dmin * _cat(mn_low, mn_high) * -1.0           # negated per block, not per element
    qs = _spread(b[:, 16:144], n, (4, 32), 2, 2)                     # (n, 256): [chunk, nibble, l]
    shift = _const(b, np.broadcast_to(np.array([1.0, 1.0 / 16]).reshape(1, 2, 1), (4, 2, 32)).reshape(1, 256))
    nib = bit_field(qs, shift, 4)
    return _spread(scale, n, (8,), 2, 32) * nib + _spread(neg_offset, n, (8,), 2, 32)


def _q6_k(b: Tensor, n) -> Tensor:
    ql = _spread(b[:, 0:128], n, (2, 2, 32), 2, 2)                   # [half, k//2, k%2, l]
    ql_shift = np.broadcast_to(np.array([1.0, 1.0 / 16]).reshape(1, 2, 1, 1), (2, 2, 2, 32)).reshape(1, 256)
    low = bit_field(ql, _const(b, ql_shift), 4)
    qh = _spread(b[:, 128:192], n, (2, 32), 2, 4)                    # [half, k, l]
    qh_shift = np.broadcast_to((4.0 ** -np.arange(4)).reshape(1, 4, 1), (2, 4, 32)).reshape(1, 256)
    top = bit_field(qh, _const(b, qh_shift), 2)
    q = low + top * 16.0 + -32.0
    scale = _scales(b, n, 208) * _signed(b[:, 192:208])                  # (n, 16): [half, k, l//16]
    return _spread(scale, n, (16,), 2, 16) * q


_GRAPHS = {
    QType.Q8_0: _q8_0,
    QType.Q4_0: _q4_0,
    QType.Q4_1: _q4_1,
    QType.Q5_0: _q5_0,
    QType.Q4_K: _q4_k,
    QType.Q6_K: _q6_k,
    QType.F16: lambda b, n: half_from_bytes(b[:, 0:1], b[:, 1:2]),
    QType.BF16: lambda b, n: bf16_from_bytes(b[:, 0:1], b[:, 1:2]),
    QType.F32: lambda b, n: f32_from_bytes(b[:, 0:1], b[:, 1:2], b[:, 2:3], b[:, 3:4]),
}


def dequant_graph(raw: Tensor, qtype) -> Tensor:
    """Decode ``raw`` (uint8, ``(n_blocks, block_bytes)``; n_blocks may be symbolic) to float32
    ``(n_blocks, block_elems)`` with graph ops only.

    For F32/F16/BF16 weights, an input of that dtype viewed directly is cheaper; the byte
    decode exists for uniformity (and is exact, subnormals included).
    """
    fmt = block_format(qtype)
    if not isinstance(raw, Tensor):
        raise TypeError(f"dequant_graph: raw must be a Tensor, got {type(raw).__name__}")
    if raw.dtype is not dt.uint8 or raw.ndim != 2 or not (isinstance(raw.shape[1], int)
                                                            and raw.shape[1] == fmt.block_bytes):
        raise ValueError(f"dequant_graph {fmt.name}: raw must be uint8 of shape (n_blocks, {fmt.block_bytes}), "
                         f"got {raw.dtype.name}{tuple(raw.shape)}")
    # every matrix of a model has the same decode: built once per view of the raw bytes, then replayed
    return raw.graph.memoised(("dequant", fmt.qtype), (raw,), lambda r: _GRAPHS[fmt.qtype](r.cast(dt.float32),
                                                                                        r.shape[0]))


def dequant_matrix_graph(raw: Tensor, qtype) -> Tensor:
    """Decode a quantized matrix stored as rows of blocks: uint8 ``(rows, row_bytes)`` ->
    float32 ``(rows, row_bytes / block_bytes * block_elems)``. This is the layout of a
    GGUF weight ``[out_features, in_features]`` (``GGUFTensor.raw``)."""
    fmt = block_format(qtype)
    if raw.ndim != 2 or not isinstance(raw.shape[1], int) or raw.shape[1] % fmt.block_bytes:
        raise ValueError(f"dequant_matrix_graph {fmt.name}: raw must be (rows, k*{fmt.block_bytes}) uint8, "
                         f"got {raw.dtype.name}{tuple(raw.shape)}")
    rows, per_row = raw.shape[0], raw.shape[1] // fmt.block_bytes
    blocks = raw.reshape((sym.mul(rows, per_row), fmt.block_bytes))
    out = dequant_graph(blocks, fmt.qtype).reshape((rows, per_row * fmt.block_elems))
    # tell backends which raw blocks this node decodes, so they may read them with a fused
    # quantized-matmul kernel instead of the primitive decode (see lightspeed/kernel/quantized.py)
    out.graph.lowerings[out.node.id] = DequantMatrix(raw.node, raw.st, fmt.qtype, rows, per_row * fmt.block_elems)
    return out


@dataclass(frozen=True)
class DequantMatrix:
    """Node ``out`` of dequant_matrix_graph decodes raw block bytes: out[r, k] (dense, row-major) is
    element k of row r of ``raw`` (a uint8 ``(rows, row_bytes)`` view ``raw_view`` of ``raw_node``)."""

    raw_node: object
    raw_view: object
    qtype: object
    rows: object
    cols: int
