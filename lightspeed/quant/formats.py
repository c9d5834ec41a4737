"""GGUF/ggml tensor storage formats as data: block size, bytes per block, byte layout.

A quantized row is a sequence of blocks; each block stores ``block_elems`` values in
``block_bytes`` bytes. Float formats are blocks of one element. The ``QType`` values
are the ggml type ids written in GGUF tensor headers.

Byte layouts (all multi-byte fields little-endian, ``f16`` is IEEE half precision):

========  =====  =====  ==========================================================
format    elems  bytes  layout and value of element ``i``
========  =====  =====  ==========================================================
F32       1      4      float32
F16       1      2      float16
BF16      1      2      bfloat16 (upper half of a float32)
Q8_0      32     34     d:f16, q:int8[32];               x[i] = d*q[i]
Q4_0      32     18     d:f16, qs:u8[16];                x[i] = d*(nib[i]-8)
Q4_1      32     20     d:f16, m:f16, qs:u8[16];         x[i] = d*nib[i] + m
Q5_0      32     22     d:f16, qh:u8[4], qs:u8[16];      x[i] = d*((nib[i] | bit_i(qh)<<4) - 16)
Q4_K      256    144    d:f16, dmin:f16, scales:u8[12], qs:u8[128]
Q6_K      256    210    ql:u8[128], qh:u8[64], scales:int8[16], d:f16
========  =====  =====  ==========================================================

For the 32-element formats, ``nib[i]`` is the low nibble of ``qs[i]`` for i < 16 and
the high nibble of ``qs[i-16]`` for i >= 16; Q5_0's fifth bit of element i is bit i of
``qh`` read as a little-endian uint32.

Q4_K: 8 sub-blocks of 32. Sub-block j has a 6-bit scale ``sc[j]`` and 6-bit min
``mn[j]`` packed in ``scales``: for j < 4, ``sc = scales[j] & 63``, ``mn = scales[j+4] & 63``;
for j >= 4, the low 4 bits come from ``scales[j+4]`` (low nibble: sc, high nibble: mn)
and the top 2 bits from bits 6-7 of ``scales[j-4]`` (sc) and ``scales[j]`` (mn).
Element ``i`` = 64*c + 32*h + l (c < 4, h < 2, l < 32) is nibble ``h`` of ``qs[32c+l]``
in sub-block j = 2c+h: ``x = (d*sc[j])*nib - (dmin*mn[j])``.

Q6_K: two halves of 128; in half n, element 32*k + l (k < 4, l < 32) takes nibble
``k // 2`` of ``ql[64n + 32*(k%2) + l]`` as its low 4 bits, bits 2k..2k+1 of
``qh[32n + l]`` as its top 2 bits, and scale ``scales[8n + 2k + l//16]``:
``x = (d*scale)*(q6 - 32)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class QType(IntEnum):
    """ggml tensor type ids (the numbers stored in GGUF tensor headers). Types that only exist
    inside ggml's compute (Q8_1, Q8_K) are left out: files never store them."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


@dataclass(frozen=True)
class BlockFormat:
    """How one storage format packs values: ``block_elems`` values in ``block_bytes`` bytes."""

    qtype: QType
    block_elems: int
    block_bytes: int

    @property
    def name(self) -> str:
        return self.qtype.name

    @property
    def is_quantized(self) -> bool:
        return self.qtype not in (QType.F32, QType.F16, QType.BF16)

    def row_bytes(self, n_elems: int) -> int:
        """Bytes that ``n_elems`` values take (``n_elems`` must be a multiple of the block size)."""
        if n_elems % self.block_elems:
            raise ValueError(f"{self.name}: {n_elems} elements is not a multiple of the block size "
                             f"{self.block_elems}")
        return n_elems // self.block_elems * self.block_bytes

    def __repr__(self) -> str:
        return f"BlockFormat({self.name}, {self.block_elems} elems in {self.block_bytes} bytes)"


# The formats Lightspeed can decode (numpy reference and graph).
FORMATS: dict[QType, BlockFormat] = {f.qtype: f for f in (
    BlockFormat(QType.F32, 1, 4),
    BlockFormat(QType.F16, 1, 2),
    BlockFormat(QType.BF16, 1, 2),
    BlockFormat(QType.Q8_0, 32, 34),
    BlockFormat(QType.Q4_0, 32, 18),
    BlockFormat(QType.Q4_1, 32, 20),
    BlockFormat(QType.Q5_0, 32, 22),
    BlockFormat(QType.Q4_K, 256, 144),
    BlockFormat(QType.Q6_K, 256, 210),
)}

# Sizes of ggml types that files may contain but that we do not decode; used only to
# validate tensor extents when reading a file.
OTHER_SIZES: dict[QType, tuple[int, int]] = {
    QType.Q5_1: (32, 24),
    QType.Q2_K: (256, 84),
    QType.Q3_K: (256, 110),
    QType.Q5_K: (256, 176),
    QType.IQ2_XXS: (256, 66),
    QType.IQ2_XS: (256, 74),
    QType.IQ3_XXS: (256, 98),
    QType.IQ1_S: (256, 50),
    QType.IQ4_NL: (32, 18),
    QType.IQ3_S: (256, 110),
    QType.IQ2_S: (256, 82),
    QType.IQ4_XS: (256, 136),
    QType.IQ1_M: (256, 56),
    QType.TQ1_0: (256, 54),
    QType.TQ2_0: (256, 66),
    QType.MXFP4: (32, 17),
    QType.I8: (1, 1),
    QType.I16: (1, 2),
    QType.I32: (1, 4),
    QType.I64: (1, 8),
    QType.F64: (1, 8),
}


def as_qtype(q: "QType | int | str") -> QType:
    """Accept a QType, a ggml type id (also gguf's GGMLQuantizationType) or a name such as ``"q4_0"``."""
    if isinstance(q, QType):
        return q
    if isinstance(q, str):
        try:
            return QType[q.upper()]
        except KeyError:
            raise ValueError(f"unknown tensor type name {q!r}; known: {', '.join(t.name for t in QType)}") from None
    try:
        return QType(int(q))
    except (ValueError, TypeError):
        raise ValueError(f"unknown ggml tensor type id {q!r}") from None


def block_format(q: "QType | int | str") -> BlockFormat:
    """The BlockFormat of a type Lightspeed can decode; a clear error for the others."""
    qt = as_qtype(q)
    fmt = FORMATS.get(qt)
    if fmt is None:
        raise NotImplementedError(f"tensor type {qt.name} is not supported; supported: "
                                  f"{', '.join(f.name for f in FORMATS.values())}")
    return fmt


def type_size(q: "QType | int | str") -> tuple[int, int]:
    """(block_elems, block_bytes) of any known ggml type, decodable or not."""
    qt = as_qtype(q)
    if qt in FORMATS:
        return FORMATS[qt].block_elems, FORMATS[qt].block_bytes
    return OTHER_SIZES[qt]
