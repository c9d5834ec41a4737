"""Lowerings of movement ops (views in Lightspeed: no data is copied), joins, splits,
conversions and tensor creation."""
from __future__ import annotations

import torch

from ... import dtypes as dt
from ... import frontend as F
from ... import symbolic as sym
from ...tensor import Tensor, _norm_axis
from ..tensors import carrier_dtype
from .registry import Unsupported, as_tensor, lowers, overloads

aten = torch.ops.aten
prims = torch.ops.prims


def _sizes(size) -> tuple:
    if isinstance(size, (int, sym.Expr)):
        return (size,)
    return tuple(size)


# views -------------------------------------------------------------------------------

@lowers(aten.view.default, aten._unsafe_view.default, *overloads(aten.reshape, "default"),
        *overloads(aten._reshape_alias, "default"), *overloads(aten.view_copy, "default"))
def view(ctx, x, size, *stride):
    return x.reshape(_sizes(size))


@lowers(aten.permute.default, *overloads(aten.permute_copy, "default"))
def permute(ctx, x, dims):
    return x.permute(tuple(dims)) if x.ndim else x


@lowers(*overloads(aten.transpose, "int"))
def transpose(ctx, x, dim0, dim1):
    return x.transpose(dim0, dim1) if x.ndim > 1 else x


@lowers(*overloads(aten.t, "default"))
def t(ctx, x):
    return x.T


@lowers(aten.expand.default)
def expand(ctx, x, size, *, implicit=False):
    size = _sizes(size)
    return x.expand(size) if size else x


@lowers(aten.slice.Tensor)
def slice_(ctx, x, dim=0, start=None, end=None, step=1):
    if x.ndim == 0:
        raise Unsupported("slice of a 0-d tensor")
    dim = _norm_axis(dim, x.ndim, "slice")
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(start, end, step)
    return x[tuple(idx)]


@lowers(aten.select.int)
def select(ctx, x, dim, index):
    dim = _norm_axis(dim, x.ndim, "select")
    idx = [slice(None)] * x.ndim
    idx[dim] = index
    return x[tuple(idx)]


@lowers(*overloads(aten.squeeze, "default", "dim", "dims"))
def squeeze(ctx, x, dim=None):
    if x.ndim == 0:
        return x
    if dim is None:
        return x.squeeze()
    dims = [dim] if isinstance(dim, int) else list(dim)
    keep = [k for k, s in enumerate(x.shape)
            if not (k in {_norm_axis(d, x.ndim, "squeeze") for d in dims} and sym.same(s, 1))]
    return x.reshape(tuple(x.shape[k] for k in keep))


@lowers(aten.unsqueeze.default)
def unsqueeze(ctx, x, dim):
    return x.unsqueeze(dim)


@lowers(aten.flip.default)
def flip(ctx, x, dims):
    return x.flip(tuple(dims)) if dims and x.ndim else x


@lowers(aten.alias.default, aten.clone.default, aten.lift_fresh_copy.default, aten.detach.default,
        *overloads(aten.contiguous, "default"), *overloads(aten.lift_fresh, "default"))
def identity(ctx, x, *args, **kwargs):
    return x


@lowers(aten.unfold.default)
def unfold(ctx, x, dimension, size, step):
    if x.ndim == 0:
        return x.reshape((1,))
    d = _norm_axis(dimension, x.ndim, "unfold")
    w = F.unfold(x, d, size, step)  # [..., Lout, size, ...]: the window axis follows Lout
    order = [k for k in range(w.ndim) if k != d + 1] + [d + 1]
    return w.permute(order)


@lowers(aten.diagonal.default)
def diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    d1, d2 = _norm_axis(dim1, x.ndim, "diagonal"), _norm_axis(dim2, x.ndim, "diagonal")
    rest = [k for k in range(x.ndim) if k not in (d1, d2)]
    t = x.permute(rest + [d1, d2])
    n, m = t.shape[-2], t.shape[-1]
    if not (sym.is_const(n) and sym.is_const(m)):
        raise Unsupported("diagonal of symbolic-size axes")
    n, m = int(n), int(m)
    if offset >= 0:
        t = t[..., :, min(offset, m):]
    else:
        t = t[..., min(-offset, n):, :]
    n, m = int(t.shape[-2]), int(t.shape[-1])
    k = max(min(n, m), 0)
    batch = t.shape[:-2]
    if k == 0:
        return ctx.full(tuple(batch) + (0,), 0, x.dtype)
    # element (i, i) sits at i*(m+1) in the flattened matrix: cut rows of length m+1, keep column 0
    flat = t.reshape(tuple(batch) + (n * m,))
    need = k * (m + 1)
    pads = [(0, 0)] * len(batch) + [(0, max(need - n * m, 0))]
    flat = flat.pad(pads) if need > n * m else flat[..., :need]
    return flat.reshape(tuple(batch) + (k, m + 1))[..., 0]


@lowers(aten.repeat.default)
def repeat(ctx, x, repeats):
    repeats = list(repeats)
    t = x.reshape((1,) * (len(repeats) - x.ndim) + tuple(x.shape))
    shape = []
    for r, s in zip(repeats, t.shape):
        shape.append(sym.mul(r, s))
    # each axis [s] -> [r, s] (a broadcast), then flattened to [r*s]
    inter = []
    for r, s in zip(repeats, t.shape):
        inter += [1, s]
    t = t.reshape(tuple(inter))
    full = []
    for r, s in zip(repeats, t.shape[1::2]):
        full += [r, s]
    return t.expand(tuple(full)).reshape(tuple(shape))


@lowers(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, x, pad, value=0):
    pad = list(pad)
    pads = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        pads[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    # negative padding crops
    crop = [(max(-b, 0) if sym.is_const(b) else 0, sym.add(s, -max(-e, 0)) if sym.is_const(e) else s)
            for (b, e), s in zip(pads, x.shape)]
    t = x.shrink(crop) if any(c != (0, s) for c, s in zip(crop, x.shape)) else x
    pos = [(max(b, 0) if sym.is_const(b) else b, max(e, 0) if sym.is_const(e) else e) for b, e in pads]
    if all(p == (0, 0) for p in pos):
        return t
    return t.pad(pos, value=value)


# joins and splits --------------------------------------------------------------------

@lowers(aten.cat.default)
def cat(ctx, tensors, dim=0):
    out = ctx.out_dtype()
    ts = [t for t in tensors if not (t.ndim == 1 and sym.same(t.shape[0], 0))] or list(tensors)[:1]
    if ts[0].ndim == 0:
        raise Unsupported("cat of 0-d tensors")
    return F.concatenate([t.cast(out) for t in ts], _norm_axis(dim, ts[0].ndim, "cat"))


@lowers(aten.split_with_sizes.default, *overloads(aten.split_with_sizes_copy, "default"))
def split_with_sizes(ctx, x, split_sizes, dim=0):
    dim = _norm_axis(dim, x.ndim, "split")
    out, start = [], 0
    for s in split_sizes:
        idx = [slice(None)] * x.ndim
        idx[dim] = slice(start, sym.add(start, s))
        out.append(x[tuple(idx)])
        start = sym.add(start, s)
    return out


@lowers(aten.split.Tensor)
def split(ctx, x, split_size, dim=0):
    dim = _norm_axis(dim, x.ndim, "split")
    n = x.shape[dim]
    if not (sym.is_const(n) and sym.is_const(split_size)):
        raise Unsupported("split of a symbolic-size axis")
    n, split_size = int(n), int(split_size)
    sizes = [min(split_size, n - s) for s in range(0, n, split_size)] or [0]
    return split_with_sizes(ctx, x, sizes, dim)


@lowers(*overloads(aten.narrow_copy, "default"), *overloads(aten.narrow, "default"))
def narrow(ctx, x, dim, start, length):
    return slice_(ctx, x, dim, start, sym.add(start, length))


@lowers(*overloads(aten.unbind, "int"), *overloads(aten.unbind_copy, "int"))
def unbind(ctx, x, dim=0):
    dim = _norm_axis(dim, x.ndim, "unbind")
    n = x.shape[dim]
    if not sym.is_const(n):
        raise Unsupported("unbind of a symbolic-size axis")
    return [select(ctx, x, dim, i) for i in range(int(n))]


# conversions ----------------------------------------------------------------------------

def _check_device(device) -> None:
    if device is not None and torch.device(device).type != "cpu":
        raise Unsupported(f"a copy to device {device}")


@lowers(aten._to_copy.default)
def to_copy(ctx, x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    _check_device(device)
    return x.cast(ctx.out_dtype())


@lowers(prims.convert_element_type.default)
def convert_element_type(ctx, x, dtype):
    return as_tensor(ctx, x, carrier_dtype(dtype))


@lowers(aten.copy.default)
def copy(ctx, dst, src, non_blocking=False):
    s = as_tensor(ctx, src, dst.dtype)
    return s.broadcast_to(dst.shape)


# creation ------------------------------------------------------------------------------

def _fill(ctx, shape, value, dtype=None):
    d = ctx.out_dtype() if dtype is None else dtype
    if isinstance(value, Tensor):
        return value.cast(d).reshape(()).reshape((1,) * len(shape)).expand(tuple(shape)) if shape else \
            value.cast(d).reshape(())
    return ctx.full(tuple(shape), value, d)


@lowers(aten.full.default, *overloads(aten.new_full, "default"))
def full(ctx, *args, dtype=None, layout=None, device=None, pin_memory=None, **kw):
    _check_device(device)
    size, value = (args[0], args[1]) if len(args) == 2 else (args[1], args[2])
    return _fill(ctx, _sizes(size), value)


@lowers(aten.full_like.default)
def full_like(ctx, x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None):
    _check_device(device)
    return _fill(ctx, x.shape, fill_value)


@lowers(*overloads(aten.zeros_like, "default"), *overloads(aten.empty_like, "default"))
def zeros_like(ctx, x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_device(device)
    return _fill(ctx, x.shape, 0)


@lowers(*overloads(aten.ones_like, "default"))
def ones_like(ctx, x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_device(device)
    return _fill(ctx, x.shape, 1)


@lowers(*overloads(aten.zeros, "default"), *overloads(aten.empty, "memory_format"),
        *overloads(aten.new_zeros, "default"), *overloads(aten.new_empty, "default"))
def zeros(ctx, *args, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_device(device)
    size = args[-1]
    return _fill(ctx, _sizes(size), 0)


@lowers(*overloads(aten.ones, "default"), *overloads(aten.new_ones, "default"))
def ones(ctx, *args, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device)
    return _fill(ctx, _sizes(args[-1]), 1)


@lowers(*overloads(aten.empty_permuted, "default"))
def empty_permuted(ctx, size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device)
    return _fill(ctx, _sizes(size), 0)  # uninitialised in PyTorch: any value is right


@lowers(aten.empty_strided.default, *overloads(aten.new_empty_strided, "default"))
def empty_strided(ctx, *args, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device)
    size = args[0] if len(args) == 2 else args[1]
    return _fill(ctx, _sizes(size), 0)  # uninitialised in PyTorch: any value is right


@lowers(*overloads(aten.fill, "Scalar", "Tensor"))
def fill(ctx, x, value):
    return _fill(ctx, x.shape, value)


@lowers(aten.scalar_tensor.default)
def scalar_tensor(ctx, s, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device)
    return ctx.scalar(s, ctx.out_dtype())


@lowers(*overloads(aten.arange, "start_step", "default", "start"))
def arange(ctx, *args, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device)
    start = 0 if len(args) == 1 else args[0]
    step = args[2] if len(args) > 2 else 1
    (n,) = ctx.out_shape()  # PyTorch's own length formula
    d = ctx.out_dtype()
    i = ctx.graph.iota(n, dt.int64 if not d.is_float else dt.int32)
    if d.is_float:
        return i.cast(dt.float32) * float(step) + _num(ctx, start, dt.float32)
    if any(isinstance(v, float) for v in (start, step)):
        vals = i.cast(dt.float32) * float(step) + float(start)
        return vals.cast(d)
    out = i * step if step != 1 else i
    return out + _num(ctx, start, dt.int64) if not (sym.is_const(start) and int(start) == 0) else out


def _num(ctx, v, d):
    return ctx.scalar(v, d) if isinstance(v, sym.Expr) else (float(v) if d.is_float else v)


@lowers(*overloads(prims.iota, "default"))
def iota(ctx, length, *, start, step, dtype, device, requires_grad):
    _check_device(device)
    i = ctx.graph.iota(length, dt.int64)
    return i * step + start if (step != 1 or start != 0) else i
