"""Reductions over axes, composed from SumReduce and MaxReduce."""
from __future__ import annotations

from typing import Sequence

from .. import dtypes as dt
from .. import symbolic as sym
from ..tensor import Tensor, _norm_axis


def _axes(x: Tensor, axis) -> list[int]:
    if axis is None:
        return list(range(x.ndim))
    if isinstance(axis, int):
        axis = (axis,)
    out = sorted({_norm_axis(a, x.ndim, "reduce") for a in axis})
    return out


def _reduce(x: Tensor, axis, keepdim: bool, prim: str) -> Tensor:
    axes = _axes(x, axis)
    out = x
    for a in reversed(axes):
        out = out.sum_reduce(a) if prim == "sum" else out.max_reduce(a)
    if keepdim:
        out = out.reshape(tuple(1 if k in axes else s for k, s in enumerate(x.shape)))
    return out


def sum(x: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    return _reduce(x, axis, keepdim, "sum")


def max(x: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    return _reduce(x, axis, keepdim, "max")


def min(x: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    return -_reduce(-x, axis, keepdim, "max")


def count(x: Tensor, axis) -> sym.sint:
    n: sym.sint = 1
    for a in _axes(x, axis):
        n = sym.mul(n, x.shape[a])
    return n


def mean(x: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    xf = x if x.dtype.is_float else x.cast(dt.float32)
    s = sum(xf, axis, keepdim)
    n = count(x, axis)
    if sym.is_const(n):
        return s * (1.0 / int(n))
    return s / x.graph.constant_dim(n, s.dtype).broadcast_to(s.shape)


def var(x: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False, correction: int = 0) -> Tensor:
    """Variance; ``correction=1`` gives the unbiased estimate."""
    xf = x if x.dtype.is_float else x.cast(dt.float32)
    mu = mean(xf, axis, keepdim=True)
    d = xf - mu
    s = sum(d * d, axis, keepdim)
    n = sym.add(count(x, axis), -correction)
    if sym.is_const(n):
        return s * (1.0 / int(n)) if int(n) > 0 else s * float("nan")
    return s / x.graph.constant_dim(n, s.dtype).broadcast_to(s.shape)


def argmax(x: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the first maximum along ``axis`` (flattened when ``axis`` is None), as int32."""
    if axis is None:
        return argmax(x.reshape((-1,)), 0, keepdim=False)
    axis = _norm_axis(axis, x.ndim, "argmax")
    n = x.shape[axis]
    mx = max(x, axis, keepdim=True)
    idx = x.graph.iota(n, dt.int32)
    idx = idx.reshape(tuple(n if k == axis else 1 for k in range(x.ndim))).broadcast_to(x.shape)
    # first index where x == max: take the max of (n - idx) over hits
    hits = x.eq(mx)
    rev = hits * (idx * -1 + x.graph.constant_dim(n, dt.int32).broadcast_to(x.shape))
    first = rev.max(axis, keepdim) * -1 + x.graph.constant_dim(n, dt.int32).broadcast_to(rev.max(axis, keepdim).shape)
    return first


def argmin(x: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
    return argmax(-x, axis, keepdim)


def cumsum(x: Tensor, axis: int = 0) -> Tensor:
    """Inclusive prefix sum along ``axis`` (a lower-triangular mask times the input, summed)."""
    axis = _norm_axis(axis, x.ndim, "cumsum")
    xt = x.transpose(axis, -1)
    n = xt.shape[-1]
    i = x.graph.iota(n, dt.int32)
    keep = i.reshape((n, 1)).broadcast_to((n, n)) >= i.reshape((1, n)).broadcast_to((n, n))  # [out, in]
    prod = xt.unsqueeze(-2) * keep  # [..., out, in]
    return prod.sum(-1).transpose(axis, -1)
