"""Lowerings of reductions: sums, means, extrema, variance, norms, softmax, scans."""
from __future__ import annotations

import torch

from ... import dtypes as dt
from ... import frontend as F
from ... import symbolic as sym
from ...frontend import extra_torch as X
from ...tensor import Tensor, _norm_axis
from .elementwise import compute_dtype, float_compute, pow_general
from .registry import lowers, overloads

aten = torch.ops.aten


def reduce_axes(x: Tensor, dim) -> list[int]:
    """PyTorch's ``dim`` argument as a sorted list of axes (None or [] means every axis)."""
    if x.ndim == 0:
        return []
    if dim is None:
        return list(range(x.ndim))
    if isinstance(dim, int):
        dim = [dim]
    dim = list(dim)
    if not dim:
        return list(range(x.ndim))
    return sorted({_norm_axis(d, x.ndim, "reduce") for d in dim})


def _keep(x: Tensor, out: Tensor, axes: list[int], keepdim: bool) -> Tensor:
    if keepdim and x.ndim:
        return out.reshape(tuple(1 if k in axes else s for k, s in enumerate(x.shape)))
    return out


def _sum(x: Tensor, axes: list[int]) -> Tensor:
    for a in reversed(axes):
        x = x.sum_reduce(a)
    return x


def _nan_propagating(x: Tensor, out: Tensor, axes: list[int]) -> Tensor:
    """NaN where any reduced element is NaN (MaxReduce alone need not propagate it)."""
    if not x.dtype.is_float or not axes:
        return out
    has_nan = X.isnan(x).cast(dt.int32)
    for a in reversed(axes):
        has_nan = has_nan.max_reduce(a)
    return F.where(has_nan.cast(dt.bool_), float("nan"), out)


def mean_axes(t: Tensor, axes: list[int], keepdim: bool) -> Tensor:
    """Mean over ``axes``; NaN when they hold no elements (as PyTorch)."""
    n: sym.sint = 1
    for a in axes:
        n = sym.mul(n, t.shape[a])
    if sym.is_const(n) and int(n) == 0:
        return _keep(t, _sum(t, axes), axes, keepdim) * float("nan")
    return F.mean(t, axes, keepdim)


def amax_axes(x: Tensor, axes: list[int]) -> Tensor:
    out = x
    for a in reversed(axes):
        out = out.max_reduce(a)
    return _nan_propagating(x, out, axes)


def amin_axes(x: Tensor, axes: list[int]) -> Tensor:
    if x.dtype.kind in "ub":
        x = x.cast(dt.int64)
    return -amax_axes(-x, axes)


@lowers(*overloads(aten.sum, "dim_IntList", "default"))
def sum_(ctx, x, dim=None, keepdim=False, *, dtype=None):
    axes = reduce_axes(x, dim)
    t = x.cast(compute_dtype(ctx.out_dtype()))
    return _keep(x, _sum(t, axes), axes, keepdim)


@lowers(*overloads(aten.mean, "dim", "default"))
def mean(ctx, x, dim=None, keepdim=False, *, dtype=None):
    axes = reduce_axes(x, dim)
    t = x.cast(float_compute(ctx.out_dtype()))
    if not axes:
        return t
    return mean_axes(t, axes, keepdim)


@lowers(aten.amax.default)
def amax(ctx, x, dim=(), keepdim=False):
    axes = reduce_axes(x, dim)
    return _keep(x, amax_axes(x.cast(compute_dtype(x.dtype)), axes), axes, keepdim)


@lowers(aten.amin.default)
def amin(ctx, x, dim=(), keepdim=False):
    axes = reduce_axes(x, dim)
    return _keep(x, amin_axes(x.cast(compute_dtype(x.dtype)), axes), axes, keepdim)


@lowers(*overloads(aten.max, "default"))
def max_all(ctx, x):
    return amax_axes(x, reduce_axes(x, None))


@lowers(*overloads(aten.min, "default"))
def min_all(ctx, x):
    return amin_axes(x, reduce_axes(x, None))


def _arg_extreme(x: Tensor, dim, keepdim: bool, largest: bool) -> Tensor:
    if x.ndim == 0:
        return x.graph.constant(0, dt.int64)
    t = x.cast(compute_dtype(x.dtype)) if x.dtype.is_float else x
    if dim is None:
        return (F.argmax if largest else F.argmin)(t.reshape((-1,)), 0, False)
    return (F.argmax if largest else F.argmin)(t, dim, keepdim)


@lowers(*overloads(aten.max, "dim"))
def max_dim(ctx, x, dim, keepdim=False):
    axes = reduce_axes(x, dim)
    return (_keep(x, amax_axes(x, axes), axes, keepdim), _arg_extreme(x, dim, keepdim, True))


@lowers(*overloads(aten.min, "dim"))
def min_dim(ctx, x, dim, keepdim=False):
    axes = reduce_axes(x, dim)
    return (_keep(x, amin_axes(x, axes), axes, keepdim), _arg_extreme(x, dim, keepdim, False))


@lowers(aten.argmax.default)
def argmax(ctx, x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, True)


@lowers(aten.argmin.default)
def argmin(ctx, x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, False)


def _variance(ctx, x: Tensor, dim, correction, keepdim: bool) -> tuple[Tensor, Tensor]:
    axes = reduce_axes(x, dim)
    t = x.cast(float_compute(ctx.out_dtype(0) if isinstance(ctx.meta, (tuple, list)) else ctx.out_dtype()))
    if not axes:
        n: sym.sint = 1
        mu = t
    else:
        mu = mean_axes(t, axes, keepdim=True)
        n = 1
        for a in axes:
            n = sym.mul(n, x.shape[a])
    d = t - mu
    s = _keep(x, _sum(d * d, axes), axes, keepdim)
    c = 1 if correction is None else correction
    if sym.is_const(n):
        var = s / max(float(int(n)) - float(c), 0.0)
    else:
        var = s / (x.graph.constant_dim(n, dt.float32) - float(c)).cast(t.dtype).maximum(0.0)
    mean = mean_axes(t, axes, keepdim) if axes else t
    return var, mean


@lowers(*overloads(aten.var, "correction"))
def var(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _variance(ctx, x, dim, correction, keepdim)[0]


@lowers(*overloads(aten.var_mean, "correction"))
def var_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _variance(ctx, x, dim, correction, keepdim)


@lowers(*overloads(aten.std, "correction"))
def std(ctx, x, dim=None, *, correction=None, keepdim=False):
    return F.sqrt(_variance(ctx, x, dim, correction, keepdim)[0])


def _any(x: Tensor, dim, keepdim: bool) -> Tensor:
    axes = reduce_axes(x, dim)
    if not axes:
        return x.cast(dt.bool_) if x.dtype is dt.bool_ else F.logical_not(X.eq_ieee(x, x.const_like(0)))
    return _keep(x, X.any_true(x, axes), axes, keepdim)


@lowers(*overloads(aten.any, "dim", "dims", "default"))
def any_(ctx, x, dim=None, keepdim=False):
    return _any(x, dim, keepdim)


@lowers(*overloads(aten.all, "dim", "dims", "default"))
def all_(ctx, x, dim=None, keepdim=False):
    nonzero = x if x.dtype is dt.bool_ else F.logical_not(X.eq_ieee(x, x.const_like(0)))
    return F.logical_not(_any(F.logical_not(nonzero), dim, keepdim))


@lowers(*overloads(aten.prod, "dim_int", "default"))
def prod(ctx, x, dim=None, keepdim=False, *, dtype=None):
    t = x.cast(compute_dtype(ctx.out_dtype()))
    axes = reduce_axes(x, dim)
    for a in reversed(axes):
        t = X.prod(t, a, keepdim=True)
    if not keepdim and axes:
        t = t.reshape(tuple(s for k, s in enumerate(t.shape) if k not in axes))
    return t


@lowers(aten.logsumexp.default)
def logsumexp(ctx, x, dim, keepdim=False):
    t = x.cast(float_compute(ctx.out_dtype()))
    axes = reduce_axes(x, dim)
    if not axes:
        return t
    m = amax_axes(t, axes)
    m = m.reshape(tuple(1 if k in axes else s for k, s in enumerate(t.shape)))
    m_safe = F.where(X.isinf(m), 0.0, m)  # all -inf (or +inf) rows: no inf - inf
    out = F.log(_sum(F.exp(t - m_safe), axes)) + m_safe.reshape(tuple(s for k, s in enumerate(m.shape)
                                                                       if k not in axes))
    return _keep(x, out, axes, keepdim)


@lowers(aten.cumsum.default)
def cumsum(ctx, x, dim, *, dtype=None):
    t = x.cast(compute_dtype(ctx.out_dtype()))
    if t.ndim == 0:
        return t
    return F.cumsum(t, dim)


@lowers(aten._softmax.default)
def softmax(ctx, x, dim, half_to_float):
    if x.ndim == 0:
        return x.const_like(1.0).cast(float_compute(ctx.out_dtype()))
    return F.softmax(x.cast(float_compute(ctx.out_dtype())), dim)


@lowers(aten._log_softmax.default)
def log_softmax(ctx, x, dim, half_to_float):
    if x.ndim == 0:
        return x.const_like(0.0).cast(float_compute(ctx.out_dtype()))
    return F.log_softmax(x.cast(float_compute(ctx.out_dtype())), dim)


@lowers(aten.linalg_vector_norm.default)
def vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    t = x.cast(float_compute(ctx.out_dtype()))
    axes = reduce_axes(x, dim)
    a = t.abs()
    if ord == float("inf"):
        out = amax_axes(a, axes)
    elif ord == float("-inf"):
        out = amin_axes(a, axes)
    elif ord == 0:
        out = _sum(F.logical_not(X.eq_ieee(a, 0.0)).cast(t.dtype), axes)
    elif ord == 1:
        out = _sum(a, axes)
    elif ord == 2:
        out = F.sqrt(_sum(a * a, axes))
    else:
        p = float(ord)
        s = _sum(pow_general(a, a.const_like(p)), axes)
        out = pow_general(s, s.const_like(1.0 / p))
    if not axes:
        return out
    return _keep(x, out, axes, keepdim)


@lowers(*overloads(aten.dist, "default"))
def dist(ctx, a, b, p=2):
    d = float_compute(ctx.out_dtype())
    x, y = a.cast(d)._broadcast_pair(b.cast(d), "dist")
    return vector_norm(ctx, x - y, p)
