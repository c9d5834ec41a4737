"""Reductions over axes, composed from SumReduce and MaxReduce."""
from __future__ import annotations

from typing import Sequence

from .. import dtypes as dt
from .. import symbolic as sym
from ..tensor import Tensor, _norm_axis


def _axes(x: Tensor, axis, what: str = "reduce") -> list[int]:
    if axis is None:
        return list(range(x.ndim))
    if isinstance(axis, int):
        axis = (axis,)
    return sorted({_norm_axis(a, x.ndim, what) for a in axis})


def _reduce(x: Tensor, axis, keepdim: bool, prim: str) -> Tensor:
    axes = _axes(x, axis, prim)
    out = x
    for a in reversed(axes):
        out = out.sum_reduce(a) if prim == "sum" else out.max_reduce(a)
    if keepdim:
        out = out.reshape(tuple(1 if k in axes else s for k, s in enumerate(x.shape)))
    return out


def sum(x: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    """Sum over ``axis`` (an int, a sequence of ints, or None for all axes); bools are counted as int32."""
    return _reduce(x, axis, keepdim, "sum")


def max(x: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    """Maximum over ``axis`` (an int, a sequence of ints, or None for all axes)."""
    return _reduce(x, axis, keepdim, "max")


def min(x: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    """Minimum over ``axis``, as -max(-x)."""
    if x.dtype.kind in "ub":  # -x wraps around for unsigned types: compute in int64
        return min(x.cast(dt.int64), axis, keepdim).cast(x.dtype if x.dtype is not dt.bool_ else dt.int32)
    return -_reduce(-x, axis, keepdim, "max")


def count(x: Tensor, axis) -> sym.sint:
    """Number of elements a reduction over ``axis`` combines (may be symbolic)."""
    n: sym.sint = 1
    for a in _axes(x, axis):
        n = sym.mul(n, x.shape[a])
    return n


def mean(x: Tensor, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    """Arithmetic mean over ``axis`` (integers become float32); symbolic sizes are divided at run time."""
    xf = x if x.dtype.is_float else x.cast(dt.float32)
    s = sum(xf, axis, keepdim)
    n = count(x, axis)
    if sym.is_const(n):
        return s * (1.0 / int(n)) if int(n) > 0 else s * float("nan")  # the mean of nothing is NaN, as in numpy
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
        flat = argmax(x.reshape((-1,)), 0, keepdim=False)
        return flat.reshape((1,) * x.ndim) if keepdim else flat
    axis = _norm_axis(axis, x.ndim, "argmax")
    n = x.shape[axis]
    idx = x.graph.iota(n, dt.int32).reshape(tuple(n if k == axis else 1 for k in range(x.ndim)))
    n_t = x.graph.constant_dim(n, dt.int32)
    # the first hit has the largest n - idx: a max-reduce finds it without a min
    hits = x.eq(max(x, axis, keepdim=True))
    best = (hits * (n_t - idx).broadcast_to(x.shape)).max(axis, keepdim)
    return n_t - best


def argmin(x: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the first minimum along ``axis``, as int32."""
    if x.dtype.kind in "ub":
        x = x.cast(dt.int64)
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
