"""Convolutions as an unfold (a chain of views) followed by a matmul.

``unfold`` turns the last axis of length L into windows ``[Lout, K]`` with
``out[o, k] = x[o*stride + k*dilation]`` using only expand, reshape, shrink and
pad: the axis is repeated, flattened, and re-cut into rows of length
``L + dilation`` so that row k starts at ``k*dilation``; then every stride-th
column is kept. No data is copied until the matmul reads it.
"""
from __future__ import annotations

from typing import Sequence

from .. import symbolic as sym
from ..shape import _shape_str
from ..tensor import Tensor, _norm_axis
from .linalg import matmul


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def unfold(x: Tensor, axis: int, kernel: int, stride: int = 1, dilation: int = 1) -> Tensor:
    """Sliding windows along ``axis``: that axis (length L) becomes two axes ``[Lout, kernel]`` with
    ``out[..., o, k, ...] = x[..., o*stride + k*dilation, ...]`` and
    ``Lout = (L - dilation*(kernel-1) - 1) // stride + 1``. A view; L may be symbolic when stride is 1."""
    axis = _norm_axis(axis, x.ndim, "unfold")
    if kernel < 1 or stride < 1 or dilation < 1:
        raise ValueError(f"unfold: kernel, stride and dilation must be >= 1, got {kernel}, {stride}, {dilation}")
    length = x.shape[axis]
    span = dilation * (kernel - 1) + 1
    if not sym.proven_ge(length, span):
        hint = "" if sym.is_const(length) else "; give its symbolic dimension a lower bound that guarantees it"
        raise ValueError(f"unfold: axis {axis} of shape {_shape_str(x.shape)} may be shorter than the kernel span "
                         f"{span} (kernel {kernel}, dilation {dilation}){hint}")
    if not sym.is_const(length) and stride != 1:
        raise NotImplementedError(f"unfold: stride {stride} over a symbolic length ({_shape_str(x.shape)}) is not "
                                  "supported; only stride 1 is")
    order = [a for a in range(x.ndim) if a != axis] + [axis]
    t = x.permute(order)                                        # the axis is last
    batch = t.shape[:-1]
    n_out = sym.add(sym.floordiv(sym.add(length, -span), stride), 1)
    row = sym.add(length, dilation)
    # repeat the axis often enough that `kernel` rows of length L + dilation fit
    lo = max(sym.to_expr(length).lo, 1)
    copies = _cdiv(kernel * (lo + dilation), lo)
    if sym.is_const(length):
        copies = _cdiv(kernel * (int(length) + dilation), int(length))
    t = t.unsqueeze(-2).expand(batch + (copies, length)).reshape(batch + (sym.mul(copies, length),))
    t = t.shrink([None] * len(batch) + [(0, sym.mul(kernel, row))]).reshape(batch + (kernel, row))
    # row k is x[k*dilation:], now keep columns 0, stride, 2*stride, ... (n_out of them)
    if stride == 1:
        t = t.shrink([None] * (len(batch) + 1) + [(0, n_out)])
    else:
        need = int(n_out) * stride
        cols = int(row)
        t = t.pad([None] * (len(batch) + 1) + [(0, need - cols)]) if need > cols else \
            t.shrink([None] * (len(batch) + 1) + [(0, need)])
        t = t.reshape(batch + (kernel, int(n_out), stride))
        t = t.shrink([None] * (len(batch) + 2) + [(0, 1)]).reshape(batch + (kernel, int(n_out)))
    t = t.transpose(-1, -2)                                     # [..., Lout, kernel]
    # move the two new axes back to where the old one was
    nb = len(batch)
    back = list(range(axis)) + [nb, nb + 1] + list(range(axis, nb))
    return t.permute(back)


def _pair(v, n: int, what: str) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(a) for a in v)
    if len(v) != n:
        raise ValueError(f"{what}: expected {n} values, got {v}")
    return v


def _conv(x: Tensor, weight: Tensor, bias: Tensor | None, stride, padding, dilation, groups: int,
          nd: int, what: str) -> Tensor:
    unbatched = x.ndim == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    if x.ndim != nd + 2 or weight.ndim != nd + 2:
        raise ValueError(f"{what}: expected input [N, C, {'L' if nd == 1 else 'H, W'}] and weight "
                         f"[O, C/groups, {'K' if nd == 1 else 'KH, KW'}], got input {_shape_str(x.shape)} and "
                         f"weight {_shape_str(weight.shape)}")
    stride, dilation = _pair(stride, nd, what), _pair(dilation, nd, what)
    if isinstance(padding, int):
        pads = [(padding, padding)] * nd
    else:
        padding = tuple(padding)
        if len(padding) != nd:
            raise ValueError(f"{what}: padding {padding} needs {nd} entries")
        pads = [(p, p) if isinstance(p, int) else (int(p[0]), int(p[1])) for p in padding]
    n, c = x.shape[0], x.shape[1]
    o, cg = weight.shape[0], weight.shape[1]
    ks = [int(k) for k in weight.shape[2:]]
    if groups < 1 or not sym.is_const(o) or int(o) % groups or not sym.same(sym.mul(cg, groups), c):
        raise ValueError(f"{what}: input {_shape_str(x.shape)} and weight {_shape_str(weight.shape)} do not match "
                         f"with groups={groups} (need C == weight.shape[1] * groups and O % groups == 0)")
    og = int(o) // groups
    if bias is not None and (bias.ndim != 1 or not sym.same(bias.shape[0], o)):
        raise ValueError(f"{what}: bias of shape {_shape_str(bias.shape)} does not match {o} output channels")
    t = x.pad([None, None] + pads) if any(p != (0, 0) for p in pads) else x
    t = t.reshape((n, groups, cg) + t.shape[2:])                   # [N, G, Cg, *spatial]
    for d in range(nd):                                           # each spatial axis -> [out_d, k_d]
        t = unfold(t, 3 + 2 * d, ks[d], stride[d], dilation[d])
    # t: [N, G, Cg, o1, k1, (o2, k2)] -> [N, G, Cg, k1, (k2), o1, (o2)]
    outs = [3 + 2 * d for d in range(nd)]
    kers = [4 + 2 * d for d in range(nd)]
    t = t.permute([0, 1, 2] + kers + outs)
    out_sizes = tuple(t.shape[3 + nd:])
    red = int(cg) * _prod(ks)
    cols = t.reshape((n, groups, red, sym.prod(out_sizes)))
    # weights [Og, Cg*K] times the windows [Cg*K, P]: the output positions are the matmul's columns, so the
    # result is already [N, O, *spatial] (no transpose) and its long axis is the one a micro-kernel vectorises
    w = weight.reshape((1, groups, og, red))
    y = matmul(w, cols)                                            # [N, G, Og, P]
    y = y.reshape((n, o) + out_sizes)
    if bias is not None:
        y = y + bias.reshape((o,) + (1,) * nd)
    return y.squeeze(0) if unbatched else y


def _prod(xs: Sequence[int]) -> int:
    out = 1
    for v in xs:
        out *= v
    return out


def conv1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int = 1,
           padding: int | tuple[int, int] | Sequence = 0, dilation: int = 1, groups: int = 1) -> Tensor:
    """1-D convolution as in PyTorch: x ``[N, C, L]`` (or ``[C, L]``), weight ``[O, C/groups, K]``,
    bias ``[O]`` -> ``[N, O, Lout]``. ``padding`` is an int (both sides) or a ``(left, right)`` pair,
    e.g. ``(K - 1, 0)`` for a causal convolution. L may be symbolic when stride is 1."""
    if isinstance(padding, tuple) and len(padding) == 2 and all(isinstance(p, int) for p in padding):
        padding = (padding,)
    return _conv(x, weight, bias, stride, padding, dilation, groups, 1, "conv1d")


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | tuple[int, int] = 1,
           padding: int | Sequence = 0, dilation: int | tuple[int, int] = 1, groups: int = 1) -> Tensor:
    """2-D convolution as in PyTorch: x ``[N, C, H, W]`` (or ``[C, H, W]``), weight
    ``[O, C/groups, KH, KW]``, bias ``[O]`` -> ``[N, O, Hout, Wout]``. ``padding`` is an int, or one
    entry per spatial axis (an int or a ``(before, after)`` pair)."""
    return _conv(x, weight, bias, stride, padding, dilation, groups, 2, "conv2d")
