"""Lowering of aten.convolution: 1-d and 2-d, grouped, dilated, strided and transposed.

The frontend's conv1d/conv2d (an unfold of views feeding a matmul) does the work; for
a symbolic spatial size with stride > 1, which the frontend's unfold does not cover, the
same computation is built here on ``extra_torch.windows``.
"""
from __future__ import annotations

import torch

from ... import frontend as F
from ... import symbolic as sym
from ...frontend import extra_torch as X
from ...tensor import Tensor
from .elementwise import compute_dtype
from .nn import static
from .registry import Unsupported, lowers

aten = torch.ops.aten


def _dilate(x: Tensor, axis: int, stride: int) -> Tensor:
    """Insert stride-1 zeros between the elements of ``axis`` (a view: pad, reshape, shrink)."""
    if stride == 1:
        return x
    n = x.shape[axis]
    t = x.unsqueeze(axis + 1)
    pads = [(0, 0)] * t.ndim
    pads[axis + 1] = (0, stride - 1)
    t = t.pad(pads)
    t = t.reshape(t.shape[:axis] + (sym.mul(n, stride),) + t.shape[axis + 2:])
    keep = [None] * t.ndim
    keep[axis] = (0, sym.add(sym.mul(n, stride), -(stride - 1)))
    return t.shrink(keep)


def _conv_transposed(x, w, bias, stride, padding, dilation, output_padding, groups, nd):
    # a transposed convolution is a plain one over the input dilated by `stride`, with the
    # kernel flipped and its in/out channel axes swapped (per group)
    cin = static(w.shape[0], "conv_transpose")
    cout_g = static(w.shape[1], "conv_transpose")
    ks = [static(k, "conv_transpose") for k in w.shape[2:]]
    wt = w.reshape((groups, cin // groups, cout_g) + tuple(ks)).transpose(1, 2)
    wt = wt.reshape((groups * cout_g, cin // groups) + tuple(ks)).flip(tuple(range(2, 2 + nd)))
    t = x
    for d in range(nd):
        t = _dilate(t, t.ndim - nd + d, stride[d])
    pads = []
    for d in range(nd):
        full = dilation[d] * (ks[d] - 1)
        pads.append((full - padding[d], full - padding[d] + output_padding[d]))
    # negative padding crops the dilated input
    crop = [None] * t.ndim
    for d, (b, e) in enumerate(pads):
        ax = t.ndim - nd + d
        if b < 0 or e < 0:
            n = t.shape[ax]
            crop[ax] = (max(-b, 0), sym.add(n, -max(-e, 0)))
    if any(c is not None for c in crop):
        t = t.shrink(crop)
    pads = [(max(b, 0), max(e, 0)) for b, e in pads]
    conv = F.conv1d if nd == 1 else F.conv2d
    return conv(t, wt, bias, 1, pads if nd == 2 else pads[0], dilation[0] if nd == 1 else tuple(dilation), groups)


@lowers(aten.convolution.default)
def convolution(ctx, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    nd = w.ndim - 2
    if nd not in (1, 2):
        raise Unsupported(f"{nd}-d convolution (1-d and 2-d are supported)")
    d = compute_dtype(ctx.out_dtype())
    x, w = x.cast(d), w.cast(d)
    bias = bias.cast(d) if bias is not None else None
    stride, padding, dilation = list(stride), list(padding), list(dilation)
    if len(padding) == 1 and nd == 2:
        padding = padding * 2
    if transposed:
        return _conv_transposed(x, w, bias, stride, padding, dilation, list(output_padding), groups, nd)
    symbolic_strided = any(not sym.is_const(s) for s in x.shape[2:]) and any(st != 1 for st in stride)
    if symbolic_strided:
        return conv_windows(x, w, bias, stride, [(p, p) for p in padding], dilation, groups)
    if nd == 1:
        return F.conv1d(x, w, bias, stride[0], padding[0], dilation[0], groups)
    return F.conv2d(x, w, bias, tuple(stride), list(padding), tuple(dilation), groups)


def conv_windows(x: Tensor, w: Tensor, bias, stride, pads, dilation, groups: int) -> Tensor:
    """Convolution of x [N, C, *spatial] with w [O, C/groups, *kernel] via sliding windows."""
    nd = w.ndim - 2
    n = x.shape[0]
    o, cg = static(w.shape[0], "convolution"), static(w.shape[1], "convolution")
    ks = [static(k, "convolution") for k in w.shape[2:]]
    og = o // groups
    t = x.pad([(0, 0), (0, 0)] + list(pads)) if any(p != (0, 0) for p in pads) else x
    t = t.reshape((n, groups, cg) + tuple(t.shape[2:]))
    for d in range(nd):
        t = X.windows(t, 3 + 2 * d, ks[d], stride[d], dilation[d])
    outs = [3 + 2 * d for d in range(nd)]
    kers = [4 + 2 * d for d in range(nd)]
    t = t.permute([0, 1] + outs + [2] + kers)                       # [N, G, *out, Cg, *k]
    out_sizes = tuple(t.shape[2:2 + nd])
    red = cg
    for k in ks:
        red *= k
    cols = t.reshape((n, groups, sym.prod(out_sizes), red))
    wm = w.reshape((groups, og, red)).transpose(-1, -2)             # [G, Cg*K, Og]
    y = F.matmul(cols, wm).reshape((n, groups) + out_sizes + (og,))
    y = y.permute([0, 1, 2 + nd] + [2 + d for d in range(nd)]).reshape((n, o) + out_sizes)
    return y + bias.reshape((o,) + (1,) * nd) if bias is not None else y
