"""Quantized matmul: a lowered kernel offered for the primitive subgraph ``x @ dequant(raw).T``.

The model graph decodes packed GGUF blocks with primitive ops (``quant.dequant_matrix_graph``) and
multiplies with ``linear``. That subgraph is a SumReduce over a Mul whose one operand is the decoded
weight. When the views prove that the reduction computes ``out[m, n] = sum_k x[m, k] * W[n, k]`` with
``W`` the decoded rows of a raw block buffer, a backend may instead run a template that reads the raw
blocks directly (decode in registers, fused with the dot products). The primitive graph is unchanged,
the reference backend still runs it, and tests compare the two.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import dtypes as dt
from .. import symbolic as sym
from ..graph import Node
from ..ops import Op
from ..quant import QType

# how a quantized matmul takes its activations: float32 as given, or quantized per block of 32 once per call
# (int16: scale amax/32639, so each value splits into two signed bytes, ~2e-5 relative error per product; int8:
# scale amax/127, as GGUF's Q8_0 dot products)
ACTIVATION_MODES = ("float", "int16", "int8")
# weight types whose matmul can run with quantized activations (the others keep float activations)
QUANT_ACT_QTYPES = {QType.Q8_0, QType.Q4_0, QType.Q4_1}
# ... and those that take int16 activations in calls of at most FEW_ROWS_QUANTIZED rows only (decode, batched
# decode), longer calls keeping float activations: they have per-row int16 kernels but no wide ones (Q5_0 has the
# 16-row kernels of qdot16x16.h too, and read repacked takes every row count: quantized_rows_bound)
FEW_ROWS_INT16_QTYPES = {QType.Q5_0, QType.Q4_K, QType.Q6_K}
FEW_ROWS_QUANTIZED = 8  # LS_QMM_ROWS in the C backend's qdecode.h


def quantizes_activations(qtype: QType, mode: str) -> bool:
    """Whether a matmul of ``qtype`` weights quantizes its activations in activation mode ``mode``."""
    return mode != "float" and (qtype in QUANT_ACT_QTYPES or (mode == "int16" and qtype in FEW_ROWS_INT16_QTYPES))


def quantized_rows_bound(qtype: QType, rows: int, weights_layout: str = "rows") -> int:
    """The most activation rows a call of at most ``rows`` rows quantizes (its scratch's size). Weights read
    repacked ("r16") take the 16-row kernels at every row count where a build reads them so, whatever the format
    (the GGUF layout's float kernel cannot read them there)."""
    rows = max(int(rows), 1)
    short = qtype in FEW_ROWS_INT16_QTYPES and weights_layout != "r16"
    return min(rows, FEW_ROWS_QUANTIZED) if short else rows


def activation_mode(activations: str = "float", int8_activations: bool = False) -> str:
    """The checked activation mode; ``int8_activations=True`` is the older spelling of ``"int8"``."""
    if activations not in ACTIVATION_MODES:
        raise ValueError(f"activations={activations!r}: expected one of {', '.join(ACTIVATION_MODES)}")
    if int8_activations:
        if activations not in ("float", "int8"):
            raise ValueError(f"int8_activations=True contradicts activations={activations!r}")
        return "int8"
    return activations


def activation_scratch_layout(rows: int, k: int, mode: str = "int8") -> tuple[int, int, int]:
    """Byte offsets of (block scales, block sums, end) in the scratch of quantized activations:
    int8 or int16 values [rows][k], then float scales and float scaled sums (scale * sum of the block's
    integer values) [rows][k/32], each part 64-byte aligned."""
    def up(n: int) -> int:
        return (n + 63) // 64 * 64
    d_off = up(rows * k * (2 if mode == "int16" else 1))
    s_off = d_off + up(rows * (k // 32) * 4)
    return d_off, s_off, s_off + up(rows * (k // 32) * 4)


TEMPLATE_QTYPES = {QType.Q8_0: "q8_0", QType.Q4_0: "q4_0", QType.Q4_1: "q4_1", QType.Q5_0: "q5_0",
                   QType.Q4_K: "q4_k", QType.Q6_K: "q6_k"}
# half-precision weights read as they are stored (``x @ w.cast(float32).T``, w float16 / bfloat16 [N, K])
HALF_QTYPES = {QType.F16: "f16", QType.BF16: "bf16"}
_HALF_DTYPES = {"float16": QType.F16, "bfloat16": QType.BF16}


@dataclass
class QuantizedMatmul:
    """out[m, n] = sum_k x[m, k] * decode(raw)[n, k] for m < rows, n < out_features, k < in_features."""

    reduce: Node
    x: Node  # float32, dense [rows, in_features]
    raw: Node  # uint8 [out_features, row_bytes] (F16/BF16: the weights [out_features, in_features]), input or constant
    qtype: QType
    rows: sym.sint
    in_features: int
    out_features: sym.sint
    activations: str = "float"  # "int16" / "int8": x is quantized into the kernel's scratch once per call
    # how the kernel reads raw: "rows" (GGUF's, row after row) or "r16" (groups of 16 rows interleaved for the
    # 16-row int16 kernels; the C backend makes that copy, backend/c/repack.py)
    weights_layout: str = "rows"


def _identity(st, shape) -> bool:
    return (st.is_contiguous and len(st.shape) == len(shape)
            and all(sym.same(a, b) for a, b in zip(st.shape, shape)))


def match_quantized_matmul(r: Node, lowerings: dict) -> QuantizedMatmul | None:
    """The quantized matmul that reduction ``r`` computes, if the views prove it."""
    if r.op is not Op.SUM_REDUCE or len(r.shape) != 2 or r.arg != 1:
        return None
    mul, st = r.srcs[0]
    if mul.op is not Op.MUL or not _identity(st, mul.shape) or len(mul.shape) != 3:
        return None
    rows, k, n = mul.shape
    if not sym.is_const(k):
        return None
    k = int(k)
    if k <= 0:
        return None
    mv = sym.Var("qm", 0, max(sym.upper_bound(rows) - 1, 0))
    rv = sym.Var("qr", 0, k - 1)
    jv = sym.Var("qj", 0, max(sym.upper_bound(n) - 1, 0))
    operands = list(mul.srcs)
    for wi in (0, 1):
        wnode, wst = operands[wi]
        xnode, xst = operands[1 - wi]
        qtype = _half_weight(wnode, k, n)
        if qtype is not None:  # w.cast(float32) of a dense float16 / bfloat16 [n, k] array
            raw, raw_st = wnode.srcs[0]
        else:
            info = lowerings.get(wnode.id)
            if info is None or info.qtype not in TEMPLATE_QTYPES or info.cols != k or not sym.same(info.rows, n):
                continue
            qtype, raw, raw_st = info.qtype, info.raw_node, info.raw_view
        if raw.op not in (Op.CONST, Op.INPUT) or not _identity(raw_st, raw.shape):
            continue
        w_off, w_ok = wst.index([mv, rv, jv])
        x_off, x_ok = xst.index([mv, rv, jv])
        if not (sym.same(w_ok, 1) and sym.same(x_ok, 1)):
            continue
        if not sym.same(w_off, sym.add(sym.mul(jv, k), rv)):
            continue
        if xnode.dtype.name != "float32" or len(xnode.shape) != 2 or not sym.same(xnode.shape[1], k):
            continue
        # (a single row has no row term: size-1 axes are not indexed)
        if not sym.same(x_off, sym.add(0 if sym.same(rows, 1) else sym.mul(mv, k), rv)):
            continue
        return QuantizedMatmul(r, xnode, raw, qtype, rows, k, n)
    return None


def _half_weight(w: Node, k: int, n: sym.sint) -> QType | None:
    """F16 / BF16 when ``w`` is a float32 cast of a float16 / bfloat16 array of shape [n, k] with k a multiple
    of 8 (the kernels' vector width; other k keep the generic loops); the caller proves the array's view."""
    if w.op is not Op.CAST or w.dtype is not dt.float32 or len(w.srcs) != 1 or k % 8:
        return None
    src = w.srcs[0][0]
    qtype = _HALF_DTYPES.get(src.dtype.name)
    if qtype is None or len(src.shape) != 2 or not sym.same(src.shape[0], n) or not sym.same(src.shape[1], k):
        return None
    return qtype
