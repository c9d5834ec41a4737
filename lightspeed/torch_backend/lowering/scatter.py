"""Lowerings of reducing scatters and data-dependent writes: scatter_reduce, index_reduce,
put, masked_scatter, slice_scatter.

Reducing scatters combine source elements that land on the same position. They are
written with a one-hot matrix [sources, positions] (Gather/Scatter alone cannot
reduce): sums are a masked sum, extrema a masked max, products a masked product.
"""
from __future__ import annotations

import numpy as np
import torch

from ... import dtypes as dt
from ... import frontend as F
from ... import symbolic as sym
from ...frontend import extra_torch as X
from ...tensor import Tensor, _norm_axis
from .indexing import IDX, _elementwise_index, wrap_negative
from .nn import static
from .registry import Unsupported, lowers, overloads

aten = torch.ops.aten

REDUCE_ALIASES = {"add": "sum", "multiply": "prod"}


def reduce_into(ctx, x: Tensor, lin: Tensor, src: Tensor, reduce: str, include_self: bool) -> Tensor:
    """x (flattened) with src[m] combined into position lin[m] by ``reduce``."""
    reduce = REDUCE_ALIASES.get(reduce, reduce)
    flat = x.reshape((-1,))
    p = flat.shape[0]
    m = lin.shape[0]
    if static(m, "scatter") == 0:
        return x
    onehot = lin.reshape((m, 1)).eq(ctx.graph.iota(p, IDX).reshape((1, p)))   # [M, P]
    touched = onehot.cast(dt.int32).max(0).cast(dt.bool_)
    vals = src.reshape((m, 1)).cast(x.dtype)
    acc = x.dtype if x.dtype.is_float else dt.int64
    if reduce in ("sum", "mean"):
        total = (onehot * vals.cast(acc)).sum(0)
        if reduce == "sum":
            base = flat.cast(acc) if include_self else F.where(touched, 0, flat.cast(acc))
            return (base + total).cast(x.dtype).reshape(x.shape)
        if not x.dtype.is_float:
            raise Unsupported("scatter mean on integers (needs integer division)")
        count = onehot.cast(acc).sum(0) + (1.0 if include_self else 0.0)
        base = flat if include_self else flat.const_like(0)
        out = F.where(touched, (base + total) / F.where(touched, count, 1.0), flat)
        return out.reshape(x.shape)
    if reduce in ("amax", "amin"):
        largest = reduce == "amax"
        low = float("-inf") if x.dtype.is_float else int(np.iinfo(x.dtype.np).min)
        signed = vals if largest else -vals
        best = F.where(onehot, signed.broadcast_to((m, p)), low).max(0)
        best = best if largest else -best
        combined = (X.maximum_nan(best, flat) if largest else X.minimum_nan(best, flat)) if include_self else best
        return F.where(touched, combined, flat).reshape(x.shape)
    if reduce == "prod":
        factors = F.where(onehot, vals.broadcast_to((m, p)), 1 if not x.dtype.is_float else 1.0)
        prod = X.prod(factors, 0)
        combined = prod * flat if include_self else prod
        return F.where(touched, combined, flat).reshape(x.shape)
    raise Unsupported(f"scatter reduction {reduce!r}")


def _scatter_sources(ctx, x, dim, index, src):
    dim = _norm_axis(dim, x.ndim, "scatter")
    lin = _elementwise_index(ctx, x, dim, index).reshape((-1,))
    if isinstance(src, Tensor):
        vals = src.shrink([(0, n) for n in index.shape]).reshape((-1,))
    else:
        vals = ctx.full((lin.shape[0],), src, x.dtype)
    return lin, vals


@lowers(aten.scatter_reduce.two)
def scatter_reduce(ctx, x, dim, index, src, reduce, *, include_self=True):
    if x.ndim == 0:
        raise Unsupported("scatter_reduce into a 0-d tensor")
    lin, vals = _scatter_sources(ctx, x, dim, index, src)
    return reduce_into(ctx, x, lin, vals, reduce, include_self)


@lowers(*overloads(aten.scatter, "reduce", "value_reduce"))
def scatter_with_reduce(ctx, x, dim, index, src, *, reduce):
    if x.ndim == 0:
        raise Unsupported("scatter into a 0-d tensor")
    lin, vals = _scatter_sources(ctx, x, dim, index, src)
    return reduce_into(ctx, x, lin, vals, reduce, True)


@lowers(aten.index_reduce.default)
def index_reduce(ctx, x, dim, index, source, reduce, *, include_self=True):
    if x.ndim == 0:
        raise Unsupported("index_reduce into a 0-d tensor")
    dim = _norm_axis(dim, x.ndim, "index_reduce")
    # a per-element index: index[j] along dim, broadcast over the other axes of source
    full = index.reshape(tuple(index.shape[0] if k == dim else 1 for k in range(source.ndim)))
    full = full.expand(tuple(source.shape))
    lin = _elementwise_index(ctx, x, dim, full).reshape((-1,))
    return reduce_into(ctx, x, lin, source.reshape((-1,)), reduce, include_self)


@lowers(aten.put.default)
def put(ctx, x, index, source, accumulate=False):
    flat = x.reshape((-1,))
    lin = wrap_negative(ctx, index.reshape((-1,)), flat.shape[0])
    vals = source.reshape((-1,)).cast(x.dtype)
    if accumulate:
        return reduce_into(ctx, x, lin, vals, "sum", True)
    rows = flat.reshape((-1, 1)).contiguous()
    return rows.scatter(lin, vals.reshape((-1, 1)).contiguous()).reshape(x.shape)


@lowers(aten.masked_scatter.default)
def masked_scatter(ctx, x, mask, source):
    m = mask.cast(dt.bool_).broadcast_to(x.shape).reshape((-1,))
    # the k-th True position takes source[k]: k is the running count of Trues before it
    pos = F.cumsum(m.cast(IDX), 0) - 1
    vals = source.reshape((-1,)).cast(x.dtype).reshape((-1, 1)).gather(pos).reshape((-1,))
    return F.where(m, vals, x.reshape((-1,))).reshape(x.shape)


def _spread(t: Tensor, axis: int, step: int) -> Tensor:
    """Insert step-1 zeros between elements along ``axis`` (a view)."""
    if step == 1:
        return t
    n = t.shape[axis]
    u = t.unsqueeze(axis + 1)
    pads = [(0, 0)] * u.ndim
    pads[axis + 1] = (0, step - 1)
    u = u.pad(pads).reshape(t.shape[:axis] + (sym.mul(n, step),) + t.shape[axis + 1:])
    keep = [None] * u.ndim
    keep[axis] = (0, sym.add(sym.mul(n, step), -(step - 1)))
    return u.shrink(keep)


@lowers(aten.slice_scatter.default)
def slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    dim = _norm_axis(dim, x.ndim, "slice_scatter")
    n = x.shape[dim]
    start = 0 if start is None else start
    if isinstance(start, int) and start < 0:
        start = sym.add(n, start)
    k = src.shape[dim]
    if sym.same(k, 0):
        return x
    placed = _spread(src.cast(x.dtype), dim, step)
    ones = _spread(ctx.full(src.shape, True, dt.bool_), dim, step)
    used = sym.add(sym.mul(sym.add(k, -1), step), 1)
    after = sym.add(n, sym.mul(sym.add(start, used), -1))
    pads = [(0, 0)] * x.ndim
    pads[dim] = (start, after)
    return F.where(ones.pad(pads), placed.pad(pads), x)

