"""Small helpers that rule builders share."""
from __future__ import annotations

import math

from ... import dtypes as dt
from ...tensor import Tensor
from ..pattern import Match


def full(m: Match, value) -> Tensor:
    """A constant of the matched node's shape and dtype."""
    n = m.node
    c = m.graph.constant(value, n.dtype)
    return c.reshape((1,) * len(n.shape)).expand(n.shape) if n.shape else c


def keeps_dtype(m: Match, name: str) -> bool:
    """True if binding ``name`` has the matched node's dtype (the op is not a bool select or a cast)."""
    return m.bindings[name].dtype is m.node.dtype


def finite(v) -> bool:
    return not isinstance(v, float) or math.isfinite(v)


def is_float(t: Tensor) -> bool:
    return t.dtype.is_float


def is_int(t: Tensor) -> bool:
    return t.dtype.is_int


def float_node(m: Match) -> bool:
    return m.node.dtype.is_float


# Casts that represent every value of the source exactly (so a second cast sees the same number)
_EXACT_INTO: dict[dt.DType, set[dt.DType]] = {
    dt.int8: {dt.int16, dt.int32, dt.int64, dt.float16, dt.bfloat16, dt.float32},
    dt.uint8: {dt.int16, dt.uint16, dt.int32, dt.uint32, dt.int64, dt.float16, dt.bfloat16, dt.float32},
    dt.int16: {dt.int32, dt.int64, dt.float32},
    dt.uint16: {dt.int32, dt.uint32, dt.int64, dt.float32},
    dt.int32: {dt.int64},
    dt.uint32: {dt.int64},
    dt.float16: {dt.float32},
    dt.bfloat16: {dt.float32},
}


def lossless(src: dt.DType, to: dt.DType) -> bool:
    """True if casting ``src`` to ``to`` keeps every value exactly."""
    return src is to or src is dt.bool_ or to in _EXACT_INTO.get(src, set())
