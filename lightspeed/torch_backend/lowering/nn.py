"""Lowerings of matrix products, convolutions, normalisations, pooling and dropout."""
from __future__ import annotations

import numpy as np
import torch

from ... import dtypes as dt
from ... import frontend as F
from ... import symbolic as sym
from ...tensor import Tensor
from .elementwise import compute_dtype, float_compute
from .registry import Unsupported, as_tensor, lowers, overloads

aten = torch.ops.aten


def static(n, what: str) -> int:
    """A size the lowering needs as a number; symbolic sizes are unsupported here."""
    if not sym.is_const(n):
        raise Unsupported(f"{what} needs a static size, got the symbolic size {n}")
    return int(n)


# matrix products ----------------------------------------------------------------------

def _mm_operands(ctx, a, b):
    d = compute_dtype(ctx.out_dtype())
    return a.cast(d), b.cast(d)


@lowers(aten.mm.default, aten.bmm.default, *overloads(aten.matmul, "default"), *overloads(aten.mv, "default"),
        *overloads(aten.dot, "default"))
def mm(ctx, a, b):
    x, y = _mm_operands(ctx, a, b)
    return F.matmul(x, y)


def _add_scaled(ctx, acc: Tensor, bias, beta, alpha) -> Tensor:
    if alpha != 1:
        acc = acc * float(alpha)
    if beta == 0:
        return acc  # PyTorch ignores the bias entirely (NaN in it does not propagate)
    b = as_tensor(ctx, bias, acc.dtype)
    return acc + (b * float(beta) if beta != 1 else b)


@lowers(aten.addmm.default, aten.baddbmm.default, *overloads(aten.addmv, "default"))
def addmm(ctx, bias, a, b, *, beta=1, alpha=1):
    x, y = _mm_operands(ctx, a, b)
    return _add_scaled(ctx, F.matmul(x, y), bias, beta, alpha)


# convolution ---------------------------------------------------------------------------

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
    if nd == 1:
        return F.conv1d(x, w, bias, stride[0], padding[0], dilation[0], groups)
    return F.conv2d(x, w, bias, tuple(stride), list(padding), tuple(dilation), groups)


# normalisation ---------------------------------------------------------------------------

def _channel_param(p: Tensor | None, ndim: int, d: dt.DType) -> Tensor | None:
    """A per-channel [C] parameter shaped to broadcast against [N, C, ...]."""
    if p is None:
        return None
    return p.cast(d).reshape((1, p.shape[0]) + (1,) * (ndim - 2))


def _batch_norm_eval(ctx, x, weight, bias, mean, var, eps):
    d = float_compute(ctx.out_dtype(0))
    t = x.cast(d)
    if x.ndim < 2:
        raise Unsupported("batch norm of a tensor with fewer than 2 dimensions")
    scale = F.rsqrt(_channel_param(var, x.ndim, d) + eps)
    out = (t - _channel_param(mean, x.ndim, d)) * scale
    if weight is not None:
        out = out * _channel_param(weight, x.ndim, d)
    if bias is not None:
        out = out + _channel_param(bias, x.ndim, d)
    empty = [ctx.full(ctx.out_shape(i), 0, ctx.out_dtype(i)) for i in (1, 2)]
    return (out, *empty)


@lowers(aten._native_batch_norm_legit_no_training.default)
def batch_norm_no_training(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm_eval(ctx, x, weight, bias, running_mean, running_var, eps)


@lowers(*overloads(aten._native_batch_norm_legit, "default"))
def batch_norm_legit(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training:
        raise Unsupported("batch norm in training mode (it updates running statistics); call model.eval()")
    return _batch_norm_eval(ctx, x, weight, bias, running_mean, running_var, eps)


@lowers(aten.native_layer_norm.default)
def native_layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    k = len(normalized_shape)
    axes = list(range(x.ndim - k, x.ndim))
    d = float_compute(ctx.out_dtype(0))
    t = x.cast(d)
    mu = F.mean(t, axes, keepdim=True)
    c = t - mu
    rstd = F.rsqrt(F.mean(c * c, axes, keepdim=True) + eps)
    out = c * rstd
    if weight is not None:
        out = out * weight.cast(d)
    if bias is not None:
        out = out + bias.cast(d)
    return out, mu, rstd


@lowers(aten.native_group_norm.default)
def native_group_norm(ctx, x, weight, bias, n, c, hxw, group, eps):
    d = float_compute(ctx.out_dtype(0))
    t = x.cast(d)
    g = t.reshape((n, group, -1))
    mu = g.mean(-1, keepdim=True)
    cen = g - mu
    rstd = F.rsqrt((cen * cen).mean(-1, keepdim=True) + eps)
    out = (cen * rstd).reshape(x.shape)
    if weight is not None:
        out = out * _channel_param(weight, x.ndim, d)
    if bias is not None:
        out = out + _channel_param(bias, x.ndim, d)
    return out, mu.reshape((n, group)), rstd.reshape((n, group))


@lowers(*overloads(aten._fused_rms_norm, "default"))
def fused_rms_norm(ctx, x, normalized_shape, weight, eps):
    k = len(normalized_shape)
    axes = list(range(x.ndim - k, x.ndim))
    d = float_compute(ctx.out_dtype(0))
    t = x.cast(d)
    rstd = F.rsqrt(F.mean(t * t, axes, keepdim=True) + (1e-6 if eps is None else eps))
    out = t * rstd
    if weight is not None:
        out = out * weight.cast(d)
    return out, rstd


@lowers(*overloads(aten.native_dropout, "default"))
def native_dropout(ctx, x, p, train):
    if train and p > 0:
        raise Unsupported("dropout in training mode (random numbers); call model.eval()")
    return x, ctx.full(x.shape, True, dt.bool_)


# pooling ----------------------------------------------------------------------------------

def _pool_geometry(size: int, k: int, s: int, p: int, dil: int, ceil_mode: bool) -> int:
    """Output length of a pooling window, PyTorch's formula (a last window must start inside)."""
    span = dil * (k - 1) + 1
    num = size + 2 * p - span
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _windows(x: Tensor, ks, stride, padding, dilation, ceil_mode, fill: float):
    """[N, C, H, W] -> [N, C, Ho, Wo, kh, kw] windows over an input padded with ``fill``."""
    spatial = [static(s, "pooling") for s in x.shape[-2:]]
    outs = [_pool_geometry(spatial[d], ks[d], stride[d], padding[d], dilation[d], ceil_mode) for d in range(2)]
    pads = []
    for d in range(2):
        need = (outs[d] - 1) * stride[d] + dilation[d] * (ks[d] - 1) + 1
        pads.append((padding[d], max(need - spatial[d] - padding[d], 0)))
    t = x.pad([(0, 0)] * (x.ndim - 2) + pads, value=fill) if any(p != (0, 0) for p in pads) else x
    nb = x.ndim - 2
    t = F.unfold(t, nb, ks[0], stride[0], dilation[0])          # [.., Ho, kh, W']
    t = F.unfold(t, nb + 2, ks[1], stride[1], dilation[1])      # [.., Ho, kh, Wo, kw]
    t = t[tuple([slice(None)] * nb + [slice(0, outs[0]), slice(None), slice(0, outs[1]), slice(None)])]
    return t.permute(list(range(nb)) + [nb, nb + 2, nb + 1, nb + 3]), spatial, outs


def _pair(v, n=2):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


@lowers(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    ks = _pair(kernel_size)
    stride = _pair(stride) if stride else ks
    padding, dilation = _pair(padding), _pair(dilation)
    win, (h, w), (ho, wo) = _windows(x, ks, stride, padding, dilation, ceil_mode, float("-inf"))
    kk = ks[0] * ks[1]
    flat = win.reshape(tuple(win.shape[:-2]) + (kk,))
    values = flat.max(-1)
    # indices: the flat input position of the first maximum in each window (a static table)
    first = F.argmax(flat, -1).cast(dt.int64)                   # [.., Ho, Wo] in [0, kk)
    oh = np.arange(ho).reshape(ho, 1, 1, 1)
    ow = np.arange(wo).reshape(1, wo, 1, 1)
    kh = np.arange(ks[0]).reshape(1, 1, ks[0], 1)
    kw = np.arange(ks[1]).reshape(1, 1, 1, ks[1])
    rows = oh * stride[0] - padding[0] + kh * dilation[0]
    cols = ow * stride[1] - padding[1] + kw * dilation[1]
    table = (rows * w + cols).reshape(ho, wo, kk).astype(np.int64)
    tab = ctx.graph.constant(table)
    pick = first.unsqueeze(-1).eq(ctx.graph.iota(kk, dt.int64))  # [.., Ho, Wo, kk] one-hot
    indices = (pick * tab.expand(tuple(pick.shape))).sum(-1)
    return values, indices


def _axis_counts(size, k, s, p, out, include_pad):
    starts = np.arange(out) * s - p
    ends = np.minimum(starts + k, size + p)
    if include_pad:
        return (ends - starts).astype(np.float64)
    return (np.minimum(ends, size) - np.maximum(starts, 0)).astype(np.float64)


@lowers(aten.avg_pool2d.default)
def avg_pool2d(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    ks = _pair(kernel_size)
    stride = _pair(stride) if stride else ks
    padding = _pair(padding)
    d = float_compute(ctx.out_dtype())
    win, (h, w), (ho, wo) = _windows(x.cast(d), ks, stride, padding, [1, 1], ceil_mode, 0.0)
    total = win.sum((-2, -1))
    if divisor_override:
        return total / float(divisor_override)
    ch = _axis_counts(h, ks[0], stride[0], padding[0], ho, count_include_pad)
    cw = _axis_counts(w, ks[1], stride[1], padding[1], wo, count_include_pad)
    div = ctx.graph.constant((1.0 / np.outer(ch, cw)).astype(np.float32)).cast(d)
    return total * div


def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    """[out, size] averaging weights of PyTorch's adaptive pooling windows."""
    m = np.zeros((out, size), np.float64)
    for i in range(out):
        start = (i * size) // out
        end = -(-((i + 1) * size) // out)
        m[i, start:end] = 1.0 / (end - start)
    return m.astype(np.float32)


@lowers(aten._adaptive_avg_pool2d.default, *overloads(aten.adaptive_avg_pool2d, "default"))
def adaptive_avg_pool2d(ctx, x, output_size):
    d = float_compute(ctx.out_dtype())
    t = x.cast(d)
    oh, ow = _pair(output_size)
    if oh == 1 and ow == 1:
        return t.mean((-2, -1), keepdim=True)  # also for symbolic sizes
    h, w = static(x.shape[-2], "adaptive_avg_pool2d"), static(x.shape[-1], "adaptive_avg_pool2d")
    ah = ctx.graph.constant(_adaptive_matrix(h, oh)).cast(d)
    aw = ctx.graph.constant(_adaptive_matrix(w, ow)).cast(d)
    return F.matmul(F.matmul(ah, t), aw.T)
