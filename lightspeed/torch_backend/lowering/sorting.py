"""Lowerings of order-based ops: sort, topk, kthvalue, median, cumulative products/extrema,
bucketize/searchsorted.

Lightspeed has no sort primitive; these ops compare every pair of elements along the axis
(O(n^2) work and, when not fused, memory). The rank of element i is the number of elements
that come before it; the sorted tensor is then a one-hot selection by rank. NaN sorts last,
as in PyTorch. Ties keep their original order (a stable sort). The sorted axis must have
a static size.
"""
from __future__ import annotations

import numpy as np
import torch

from ... import dtypes as dt
from ... import frontend as F
from ... import symbolic as sym
from ...frontend import extra_torch as X
from ...tensor import Tensor, _norm_axis
from .nn import static
from .registry import Unsupported, as_tensor, lowers, overloads

aten = torch.ops.aten
IDX = dt.int64


def _before(a: Tensor, b: Tensor) -> Tensor:
    """a < b with NaN after every number."""
    if not a.dtype.is_float:
        return a < b
    return (a < b) | (X.isnan(b) & F.logical_not(X.isnan(a)))


def _to_last(x: Tensor, axis: int) -> Tensor:
    """Move ``axis`` to the end, keeping the order of the others."""
    return x.permute([k for k in range(x.ndim) if k != axis] + [axis]) if axis != x.ndim - 1 else x


def _from_last(x: Tensor, axis: int) -> Tensor:
    """Undo ``_to_last``."""
    if axis == x.ndim - 1:
        return x
    order = list(range(x.ndim - 1))
    order.insert(axis, x.ndim - 1)
    return x.permute(order)


def _ranks(x: Tensor, descending: bool) -> Tensor:
    """Stable rank of every element along the last axis: [..., n] int64."""
    n = static(x.shape[-1], "sort")
    xi, xj = x.unsqueeze(-1), x.unsqueeze(-2)               # [..., i, 1], [..., 1, j]
    first = _before(xi, xj) if descending else _before(xj, xi)
    tie = F.logical_not(_before(xi, xj) | _before(xj, xi))
    idx = x.graph.iota(n, IDX)
    j_lt_i = idx.reshape((1, n)) < idx.reshape((n, 1))        # [i, j]
    comes_first = first | (tie & j_lt_i)
    return comes_first.cast(IDX).sum(-1)                      # [..., i]


def _select_by_rank(x: Tensor, ranks: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """(values, original indices) of ranks 0 .. count-1 along the last axis."""
    n = x.shape[-1]
    r = x.graph.iota(count, IDX).reshape((count, 1))
    onehot = ranks.unsqueeze(-2).eq(r)                        # [..., r, i]
    values = (onehot * x.unsqueeze(-2)).sum(-1)
    index = x.graph.iota(n, IDX).reshape((1, n))
    indices = (onehot * index).sum(-1)
    return values.cast(x.dtype), indices


def sort_last(x: Tensor, descending: bool, count: int | None = None) -> tuple[Tensor, Tensor]:
    n = static(x.shape[-1], "sort")
    return _select_by_rank(x, _ranks(x, descending), n if count is None else count)


def _sorted_along(x: Tensor, dim: int, descending: bool, count: int | None = None):
    if x.ndim == 0:
        return x, x.graph.constant(0, IDX)
    dim = _norm_axis(dim, x.ndim, "sort")
    v, i = sort_last(_to_last(x, dim), descending, count)
    return _from_last(v, dim), _from_last(i, dim)


@lowers(aten.sort.default)
def sort(ctx, x, dim=-1, descending=False):
    return _sorted_along(x, dim, descending)


@lowers(aten.sort.stable)
def sort_stable(ctx, x, *, stable=None, dim=-1, descending=False):
    return _sorted_along(x, dim, descending)


@lowers(aten.topk.default)
def topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    if not sym.is_const(k):
        raise Unsupported("topk with a symbolic k")
    return _sorted_along(x, dim, largest, int(k))


def _pick(x: Tensor, dim: int, position: int, keepdim: bool) -> tuple[Tensor, Tensor]:
    """The element of ascending rank ``position`` along ``dim`` and its index."""
    if x.ndim == 0:
        return x, x.graph.constant(0, IDX)
    dim = _norm_axis(dim, x.ndim, "select by rank")
    t = _to_last(x, dim)
    ranks = _ranks(t, False)
    v, i = _select_by_rank(t, ranks, position + 1)
    v, i = v[..., position], i[..., position]
    if keepdim:
        v, i = v.unsqueeze(dim), i.unsqueeze(dim)
    return v, i


@lowers(aten.kthvalue.default)
def kthvalue(ctx, x, k, dim=-1, keepdim=False):
    return _pick(x, dim, int(k) - 1, keepdim)


@lowers(aten.median.default)
def median_all(ctx, x):
    flat = x.reshape((-1,))
    n = static(flat.shape[0], "median")
    return _pick(flat, 0, (n - 1) // 2, False)[0]


@lowers(aten.median.dim)
def median_dim(ctx, x, dim, keepdim=False):
    if x.ndim == 0:
        return x, x.graph.constant(0, IDX)
    n = static(x.shape[_norm_axis(dim, x.ndim, "median")], "median")
    return _pick(x, dim, (n - 1) // 2, keepdim)


def _nanmedian_last(t: Tensor) -> tuple[Tensor, Tensor]:
    """Lower median of the non-NaN elements of the last axis (NaN if there are none)."""
    n = static(t.shape[-1], "nanmedian")
    v, i = sort_last(t, False)                                     # NaN last
    valid = F.logical_not(X.isnan(t)).cast(IDX).sum(-1, keepdim=True)  # [..., 1]
    # position (valid - 1) // 2, computed exactly in float32 (n is small)
    pos = X.floor((valid.cast(dt.float32) - 1.0) * 0.5).maximum(0.0).cast(IDX)
    pick = x_iota(t, n).eq(pos)
    value = (pick * v).sum(-1)
    index = (pick * i).sum(-1)
    empty = valid.squeeze(-1).eq(0)
    return F.where(empty, float("nan"), value).cast(t.dtype), F.where(empty, 0, index)


def x_iota(t: Tensor, n: int) -> Tensor:
    return t.graph.iota(n, IDX).reshape((1,) * (t.ndim - 1) + (n,))


@lowers(aten.nanmedian.default)
def nanmedian_all(ctx, x):
    return _nanmedian_last(x.reshape((-1,)))[0]


@lowers(aten.nanmedian.dim)
def nanmedian_dim(ctx, x, dim, keepdim=False):
    if x.ndim == 0:
        return x, x.graph.constant(0, IDX)
    dim = _norm_axis(dim, x.ndim, "nanmedian")
    v, i = _nanmedian_last(_to_last(x, dim))
    return (v.unsqueeze(dim), i.unsqueeze(dim)) if keepdim else (v, i)


# cumulative ops: an [out, in] lower-triangular mask ------------------------------------------

def _prefix(x: Tensor, dim: int):
    """(x moved to the last axis as [..., 1, in], mask [out, in] with in <= out, n)."""
    dim = _norm_axis(dim, x.ndim, "cumulative op")
    t = _to_last(x, dim)
    n = static(t.shape[-1], "cumulative op")
    i = x.graph.iota(n, IDX)
    mask = i.reshape((1, n)) <= i.reshape((n, 1))
    return t.unsqueeze(-2), mask, n, dim


@lowers(aten.cumprod.default)
def cumprod(ctx, x, dim, *, dtype=None):
    if x.ndim == 0:
        return x
    t, mask, n, dim = _prefix(x.cast(ctx.out_dtype()), dim)
    masked = F.where(mask, t, t.const_like(1) if t.ndim else 1)
    return _from_last(X.prod(masked, -1), dim)


@lowers(aten.logcumsumexp.default)
def logcumsumexp(ctx, x, dim):
    if x.ndim == 0:
        return x
    t, mask, n, dim = _prefix(x.cast(dt.float32) if x.dtype is not dt.float32 else x, dim)
    masked = F.where(mask, t, float("-inf"))
    m = masked.max(-1, keepdim=True)
    m_safe = F.where(X.isinf(m), 0.0, m)
    out = F.log(F.exp(masked - m_safe).sum(-1)) + m_safe.squeeze(-1)
    return _from_last(out, dim)


def _cum_extreme(x: Tensor, dim: int, largest: bool):
    if x.ndim == 0:
        return x, x.graph.constant(0, IDX)
    t, mask, n, dim = _prefix(x, dim)
    low = float("-inf") if t.dtype.is_float else int(np.iinfo(t.dtype.np).min)
    signed = t if largest else -t
    masked = F.where(mask, signed, low)
    best = masked.max(-1, keepdim=True)
    if t.dtype.is_float:  # NaN wins, as in PyTorch
        nan_seen = (X.isnan(t) & mask).cast(dt.int32).max(-1, keepdim=True).cast(dt.bool_)
        best = F.where(nan_seen, float("nan"), best)
        hit = mask & (X.eq_ieee(masked, best) | (nan_seen & X.isnan(t)))
    else:
        hit = mask & masked.eq(best)
    idx = x.graph.iota(n, IDX).reshape((1, n))
    index = (hit * (idx + 1)).max(-1) - 1                     # the last position holding the extreme
    value = best.squeeze(-1) if largest else -best.squeeze(-1)
    return _from_last(value, dim), _from_last(index, dim)


@lowers(aten.cummax.default)
def cummax(ctx, x, dim):
    return _cum_extreme(x, dim, True)


@lowers(aten.cummin.default)
def cummin(ctx, x, dim):
    return _cum_extreme(x, dim, False)


# searching sorted sequences ---------------------------------------------------------------

def _count_before(seq: Tensor, values: Tensor, right: bool) -> Tensor:
    """For each value, how many sequence elements are < it (<= it when ``right``); seq on the last axis."""
    s = seq.unsqueeze(-2)           # [..., 1, n]
    v = values.unsqueeze(-1)        # [..., m, 1]
    below = F.logical_not(_before(v, s)) if right else _before(s, v)
    return below.cast(IDX).sum(-1)


@lowers(*overloads(aten.bucketize, "Tensor", "Scalar"))
def bucketize(ctx, x, boundaries, *, out_int32=False, right=False):
    v = as_tensor(ctx, x, boundaries.dtype) if not isinstance(x, Tensor) else x
    if v.dtype is not boundaries.dtype:
        from ...tensor import promote
        d = promote(v.dtype, boundaries.dtype)
        v, boundaries = v.cast(d), boundaries.cast(d)
    flat = v.reshape((-1,)) if v.ndim else v.reshape((1,))
    out = _count_before(boundaries, flat, right)
    return out.reshape(v.shape)


@lowers(*overloads(aten.searchsorted, "Tensor", "Scalar"))
def searchsorted(ctx, seq, x, *, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        raise Unsupported("searchsorted with a sorter")
    right = right or side == "right"
    if seq.ndim == 1:
        return bucketize(ctx, x, seq, out_int32=out_int32, right=right)
    v = x if isinstance(x, Tensor) else as_tensor(ctx, x, seq.dtype)
    if v.dtype is not seq.dtype:
        from ...tensor import promote
        d = promote(v.dtype, seq.dtype)
        v, seq = v.cast(d), seq.cast(d)
    return _count_before(seq, v, right)
