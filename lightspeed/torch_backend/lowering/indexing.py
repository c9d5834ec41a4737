"""Lowerings of indexing ops: embedding, index_select, gather, advanced indexing, scatters.

Everything reduces to Lightspeed's Gather (rows of a tensor picked by integer indices) and
Scatter (rows replaced): the indexed axes are moved to the front and flattened into one
axis, and the per-axis indices are combined into one linear row index. Accumulating
scatters (index_put with accumulate, scatter_add) are sums of a one-hot mask instead.
Out-of-range indices, an error in PyTorch, read 0 (Gather's semantics).
"""
from __future__ import annotations

import torch

from ... import dtypes as dt
from ... import frontend as F
from ... import symbolic as sym
from ...tensor import Tensor, _norm_axis, broadcast_shapes
from .registry import Unsupported, as_tensor, lowers, overloads

aten = torch.ops.aten
IDX = dt.int64


def _size_const(ctx, n) -> Tensor | int:
    return n if sym.is_const(n) else ctx.graph.constant_dim(n, IDX)


def wrap_negative(ctx, idx: Tensor, n) -> Tensor:
    """Negative indices count from the end, as in Python."""
    idx = idx.cast(IDX)
    return F.where(idx < 0, idx + _size_const(ctx, n), idx)


def _linear_index(ctx, idxs: list[Tensor], sizes: list) -> Tensor:
    """sum(idx_k * stride_k) for row-major strides over ``sizes``."""
    lin, stride = None, 1
    for idx, n in zip(reversed(idxs), reversed(sizes)):
        term = idx if sym.same(stride, 1) else idx * _size_const(ctx, stride)
        lin = term if lin is None else lin + term
        stride = sym.mul(stride, n)
    return lin


@lowers(aten.embedding.default)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return weight.gather(indices.cast(IDX))


@lowers(aten.index_select.default)
def index_select(ctx, x, dim, index):
    if x.ndim == 0:
        return x
    dim = _norm_axis(dim, x.ndim, "index_select")
    idx = wrap_negative(ctx, index.reshape((-1,)), x.shape[dim])
    order = [dim] + [k for k in range(x.ndim) if k != dim]
    rows = x.permute(order).gather(idx)                      # [len(idx), rest...]
    back = list(range(1, dim + 1)) + [0] + list(range(dim + 1, x.ndim))
    return rows.permute(back)


def _grid(ctx, shape, axis: int) -> Tensor:
    """The coordinate along ``axis`` of every position of ``shape``."""
    n = shape[axis]
    i = ctx.graph.iota(n, IDX)
    return i.reshape(tuple(n if k == axis else 1 for k in range(len(shape)))).expand(tuple(shape))


def _elementwise_index(ctx, x: Tensor, dim: int, index: Tensor) -> Tensor:
    """Linear positions in x for gather/scatter along ``dim``: index replaces the coordinate of ``dim``."""
    shape = index.shape
    coords = [wrap_negative(ctx, index, x.shape[dim]) if k == dim else _grid(ctx, shape, k) for k in range(x.ndim)]
    return _linear_index(ctx, coords, list(x.shape))


@lowers(aten.gather.default)
def gather(ctx, x, dim, index, *, sparse_grad=False):
    if x.ndim == 0:
        return x.reshape(()) if index.ndim == 0 else x.reshape((1,) * index.ndim).expand(index.shape)
    dim = _norm_axis(dim, x.ndim, "gather")
    if index.ndim == 0:
        index = index.reshape((1,) * x.ndim)
    lin = _elementwise_index(ctx, x, dim, index)
    return x.reshape((-1,)).gather(lin)


def _index_plan(ctx, x: Tensor, indices: list):
    """Move indexed axes first and flatten them; return (rows [P, rest...], linear idx of shape B,
    B, positions, adjacent)."""
    pos = [k for k, i in enumerate(indices) if i is not None]
    if not pos:
        raise Unsupported("an index with no index tensors")
    for k in pos:
        if indices[k].dtype is dt.bool_ or indices[k].dtype is dt.uint8:
            raise Unsupported("boolean-mask indexing (the result size depends on the data)")
        if not indices[k].dtype.is_int:
            raise Unsupported(f"index tensors of dtype {indices[k].dtype.name}")
    bshape: tuple = ()
    for k in pos:
        bshape = broadcast_shapes(bshape, indices[k].shape, "index")
    idxs = [wrap_negative(ctx, indices[k], x.shape[k]).broadcast_to(bshape) for k in pos]
    rest = [k for k in range(x.ndim) if k not in pos]
    flat = sym.prod(x.shape[k] for k in pos)
    rows = x.permute(pos + rest).reshape((flat,) + tuple(x.shape[k] for k in rest))
    lin = _linear_index(ctx, idxs, [x.shape[k] for k in pos]) if len(pos) > 1 else idxs[0]
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    return rows, lin, bshape, pos, rest, adjacent


def _result_order(x: Tensor, bshape, pos, rest, adjacent) -> list[int] | None:
    """The permutation from Gather's [B..., rest...] to PyTorch's placement of the indexed dims."""
    if not adjacent:
        return None  # PyTorch puts B first when the indexed axes are not next to each other
    nb = len(bshape)
    before = [r for r in rest if r < pos[0]]
    after = [r for r in rest if r > pos[-1]]
    return ([nb + rest.index(r) for r in before] + list(range(nb)) + [nb + rest.index(r) for r in after])


@lowers(aten.index.Tensor, *overloads(aten._unsafe_index, "Tensor"))
def index(ctx, x, indices):
    indices = list(indices) + [None] * (x.ndim - len(indices))
    rows, lin, bshape, pos, rest, adjacent = _index_plan(ctx, x, indices)
    out = rows.gather(lin)
    order = _result_order(x, bshape, pos, rest, adjacent)
    return out.permute(order) if order is not None and order != list(range(out.ndim)) else out


@lowers(aten.index_put.default, *overloads(aten._unsafe_index_put, "default"))
def index_put(ctx, x, indices, values, accumulate=False):
    indices = list(indices) + [None] * (x.ndim - len(indices))
    d = x.dtype
    values = as_tensor(ctx, values, d)
    masks = [i for i in indices if i is not None and i.dtype is dt.bool_]
    if masks:
        return _masked_put(ctx, x, indices, values, accumulate)
    rows, lin, bshape, pos, rest, adjacent = _index_plan(ctx, x, indices)
    res_shape = tuple(bshape) + tuple(x.shape[k] for k in rest)
    order = _result_order(x, bshape, pos, rest, adjacent)
    if order is not None:
        # values broadcast against PyTorch's result layout; bring it to [B..., rest...]
        torch_shape = tuple(res_shape[o] for o in order)
        inv = [order.index(k) for k in range(len(order))]
        vals = values.broadcast_to(torch_shape).permute(inv)
    else:
        vals = values.broadcast_to(res_shape)
    m = sym.prod(bshape)
    rest_shape = tuple(x.shape[k] for k in rest)
    vals = vals.reshape((m,) + rest_shape)
    lin = lin.reshape((m,))
    if accumulate:
        p = rows.shape[0]
        onehot = lin.reshape((m, 1)).eq(ctx.graph.iota(p, IDX).reshape((1, p)))      # [M, P]
        flat_vals = vals.reshape((m, -1)) if rest_shape else vals.reshape((m, 1))
        added = F.matmul(onehot.cast(dt.float32 if not d.is_float else d).T,
                         flat_vals.cast(dt.float32 if not d.is_float else d))       # [P, R]
        new_rows = rows + added.reshape((p,) + rest_shape).cast(d)
    else:
        new_rows = rows.contiguous().scatter(lin, vals.contiguous())
    inv_perm = [0] * x.ndim
    for new_pos, old in enumerate(pos + rest):
        inv_perm[old] = new_pos
    return new_rows.reshape(tuple(x.shape[k] for k in pos) + rest_shape).permute(inv_perm)


def _masked_put(ctx, x, indices, values, accumulate):
    """x[mask] = v where the mask covers leading axes and v is a single value: a select."""
    pos = [k for k, i in enumerate(indices) if i is not None]
    if len(pos) != 1 or indices[pos[0]].dtype is not dt.bool_ or pos[0] != 0:
        raise Unsupported("boolean-mask index_put other than one leading mask")
    mask = indices[0]
    if not all(sym.same(a, b) for a, b in zip(mask.shape, x.shape)):
        raise Unsupported("boolean-mask index_put with a mask smaller than the tensor")
    if not sym.is_const(values.numel()) or int(values.numel()) != 1:
        raise Unsupported("boolean-mask index_put of more than one value (the count depends on the data)")
    m = mask.reshape(tuple(mask.shape) + (1,) * (x.ndim - mask.ndim)).broadcast_to(x.shape)
    v = values.reshape(()).reshape((1,) * x.ndim).expand(x.shape)
    return F.where(m, x + v if accumulate else v, x)


def _scatter_plan(ctx, x, dim, index):
    dim = _norm_axis(dim, x.ndim, "scatter")
    lin = _elementwise_index(ctx, x, dim, index).reshape((-1,))
    return dim, lin


@lowers(*overloads(aten.scatter, "src", "value"))
def scatter(ctx, x, dim, index, src):
    if x.ndim == 0:
        raise Unsupported("scatter into a 0-d tensor")
    _, lin = _scatter_plan(ctx, x, dim, index)
    if isinstance(src, Tensor):
        # only the leading index.shape block of src is used
        src = src.shrink([(0, n) for n in index.shape])
        vals = src.cast(x.dtype).reshape((-1, 1))
    else:
        vals = ctx.full((lin.shape[0], 1), src, x.dtype)
    rows = x.reshape((-1, 1)).contiguous()
    return rows.scatter(lin, vals.contiguous()).reshape(x.shape)


@lowers(aten.scatter_add.default)
def scatter_add(ctx, x, dim, index, src):
    if x.ndim == 0:
        raise Unsupported("scatter_add into a 0-d tensor")
    _, lin = _scatter_plan(ctx, x, dim, index)
    src = src.shrink([(0, n) for n in index.shape]).cast(x.dtype).reshape((-1,))
    p = sym.prod(x.shape)
    onehot = lin.reshape((-1, 1)).eq(ctx.graph.iota(p, IDX).reshape((1, p)))  # [M, P]
    acc = dt.float32 if not x.dtype.is_float else x.dtype
    added = (onehot * src.cast(acc).reshape((-1, 1))).sum(0)
    return x + added.cast(x.dtype).reshape(x.shape)
