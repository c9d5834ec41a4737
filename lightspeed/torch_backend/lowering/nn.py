"""Lowerings of matrix products, convolutions, normalisations, pooling and dropout."""
from __future__ import annotations

import numpy as np
import torch

from ... import dtypes as dt
from ... import frontend as F
from ... import symbolic as sym
from ...frontend import extra_torch as X
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

def _pool_out(size, k: int, s: int, p: int, dil: int, ceil_mode: bool):
    """Output length of a pooling window, PyTorch's formula (a last window must start inside)."""
    span = dil * (k - 1) + 1
    if not sym.is_const(size):
        if ceil_mode:
            raise Unsupported("ceil_mode pooling over a symbolic size")
        return sym.add(sym.floordiv(sym.add(size, 2 * p - span), s), 1)
    size = int(size)
    num = size + 2 * p - span
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _windows(x: Tensor, ks, stride, padding, dilation, ceil_mode, fill: float):
    """[N, C, H, W] -> [N, C, Ho, Wo, kh, kw] windows over an input padded with ``fill``."""
    spatial = list(x.shape[-2:])
    outs = [_pool_out(spatial[d], ks[d], stride[d], padding[d], dilation[d], ceil_mode) for d in range(2)]
    pads = []
    for d in range(2):
        if sym.is_const(spatial[d]):
            need = (outs[d] - 1) * stride[d] + dilation[d] * (ks[d] - 1) + 1
            pads.append((padding[d], max(need - int(spatial[d]) - padding[d], 0)))
        else:
            pads.append((padding[d], padding[d]))
    t = x.pad([(0, 0)] * (x.ndim - 2) + pads, value=fill) if any(p != (0, 0) for p in pads) else x
    nb = x.ndim - 2
    t = X.windows(t, nb, ks[0], stride[0], dilation[0])          # [.., Ho, kh, W']
    t = X.windows(t, nb + 2, ks[1], stride[1], dilation[1])      # [.., Ho, kh, Wo, kw]
    if all(sym.is_const(o) for o in outs):
        t = t[tuple([slice(None)] * nb + [slice(0, outs[0]), slice(None), slice(0, outs[1]), slice(None)])]
    return t.permute(list(range(nb)) + [nb, nb + 2, nb + 1, nb + 3]), spatial, outs


def _pair(v, n=2):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


def _dim_value(ctx, n, d=dt.int64):
    return ctx.scalar(n, d)


@lowers(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    ks = _pair(kernel_size)
    stride = _pair(stride) if stride else ks
    padding, dilation = _pair(padding), _pair(dilation)
    win, (h, w), (ho, wo) = _windows(x, ks, stride, padding, dilation, ceil_mode, float("-inf"))
    kk = ks[0] * ks[1]
    flat = win.reshape(tuple(win.shape[:-2]) + (kk,))
    values = flat.max(-1)
    # the flat input position h*W + w of the first maximum in each window
    first = F.argmax(flat, -1).cast(dt.int64)                    # [.., Ho, Wo] in [0, kk)
    kh = None
    for r in range(1, ks[0]):
        step = (first >= r * ks[1]).cast(dt.int64)
        kh = step if kh is None else kh + step
    kh = first.const_like(0) if kh is None else kh
    kw = first - kh * ks[1]
    g = ctx.graph
    rows = (g.iota(ho, dt.int64) * stride[0] - padding[0]).reshape((ho, 1)) + kh * dilation[0]
    cols = (g.iota(wo, dt.int64) * stride[1] - padding[1]).reshape((1, wo)) + kw * dilation[1]
    return values, rows * _dim_value(ctx, w) + cols


def _axis_divisor(ctx, size, k, s, p, out, include_pad) -> Tensor:
    """How many elements each window along one axis averages (PyTorch's rule)."""
    g = ctx.graph
    starts = g.iota(out, dt.int64) * s - p
    ends = (starts + k).minimum(_dim_value(ctx, size) + p)
    if include_pad:
        return (ends - starts).cast(dt.float32)
    return (ends.minimum(_dim_value(ctx, size)) - starts.maximum(0)).cast(dt.float32)


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
    if count_include_pad and not ceil_mode:
        return total * (1.0 / (ks[0] * ks[1]))
    ch = _axis_divisor(ctx, h, ks[0], stride[0], padding[0], ho, count_include_pad)
    cw = _axis_divisor(ctx, w, ks[1], stride[1], padding[1], wo, count_include_pad)
    return total / (ch.reshape((ho, 1)) * cw.reshape((1, wo))).cast(d)


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


@lowers(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(ctx, x, output_size):
    oh, ow = _pair(output_size)
    h, w = static(x.shape[-2], "adaptive_max_pool2d"), static(x.shape[-1], "adaptive_max_pool2d")
    # window membership [Ho, H] x [Wo, W] as one static mask over the flattened [H*W] input
    inside = (_adaptive_matrix(h, oh)[:, None, :, None] > 0) & (_adaptive_matrix(w, ow)[None, :, None, :] > 0)
    mask = ctx.graph.constant(inside.reshape(oh, ow, h * w))
    flat = x.reshape(tuple(x.shape[:-2]) + (1, 1, h * w))
    low = float("-inf") if x.dtype.is_float else int(np.iinfo(x.dtype.np).min)
    masked = F.where(mask, flat, low)                                  # [.., Ho, Wo, H*W]
    return masked.max(-1), F.argmax(masked, -1).cast(dt.int64)


def _batch_stats(t: Tensor):
    axes = [0] + list(range(2, t.ndim))
    n = 1
    for a in axes:
        n = sym.mul(n, t.shape[a])
    mean = t.mean(axes, keepdim=True)
    c = t - mean
    var = (c * c).mean(axes, keepdim=True)
    return mean, var, n


def _batch_norm_train(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    """Batch norm with batch statistics; also returns the updated running statistics."""
    d = float_compute(ctx.out_dtype(0))
    t = x.cast(d)
    mean, var, n = _batch_stats(t)
    invstd = F.rsqrt(var + eps)
    out = (t - mean) * invstd
    if weight is not None:
        out = out * _channel_param(weight, x.ndim, d)
    if bias is not None:
        out = out + _channel_param(bias, x.ndim, d)
    c = x.shape[1]
    stats = (mean.reshape((c,)), invstd.reshape((c,)))
    if running_mean is None:
        return out, stats
    if not sym.is_const(n):
        raise Unsupported("running-statistics update with a symbolic batch size")
    n = int(n)
    unbiased = var.reshape((c,)) * (n / max(n - 1, 1))
    new_mean = running_mean * (1.0 - momentum) + mean.reshape((c,)) * momentum
    new_var = running_var * (1.0 - momentum) + unbiased * momentum
    return out, stats, (new_mean, new_var)


@lowers(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    if not training:
        out, m, s = _batch_norm_eval(ctx, x, weight, bias, running_mean, running_var, eps)
        return out, m, s, running_mean, running_var
    out, (mean, invstd), (rm, rv) = _batch_norm_train(ctx, x, weight, bias, running_mean, running_var,
                                                      momentum, eps)
    return out, mean, invstd, rm, rv


@lowers(*overloads(aten._native_batch_norm_legit, "no_stats"))
def batch_norm_no_stats(ctx, x, weight, bias, training, momentum, eps):
    out, (mean, invstd) = _batch_norm_train(ctx, x, weight, bias, None, None, momentum, eps)
    return out, mean, invstd


@lowers(*overloads(aten._batch_norm_with_update_functional, "default"))
def batch_norm_with_update(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    out, (mean, invstd), (rm, rv) = _batch_norm_train(ctx, x, weight, bias, running_mean, running_var,
                                                      momentum, eps)
    reserve = ctx.full(ctx.out_shape(3), 0, ctx.out_dtype(3))
    return out, mean, invstd, reserve, rm, rv


def _p_norm(diff: Tensor, p: float) -> Tensor:
    """The p-norm over the last axis."""
    from .elementwise import pow_general
    a = diff.abs()
    if p == 0:
        return F.logical_not(a.eq(0.0)).cast(diff.dtype).sum(-1)
    if p == 1:
        return a.sum(-1)
    if p == 2:
        return F.sqrt((a * a).sum(-1))
    if p == float("inf"):
        return a.max(-1)
    s = pow_general(a, a.const_like(p)).sum(-1)
    return pow_general(s, s.const_like(1.0 / p))


@lowers(aten._cdist_forward.default)
def cdist(ctx, x1, x2, p, compute_mode=None):
    d = float_compute(ctx.out_dtype())
    diff = x1.cast(d).unsqueeze(-2) - x2.cast(d).unsqueeze(-3)       # [.., P, R, M]
    return _p_norm(diff, float(p))


@lowers(aten._pdist_forward.default)
def pdist(ctx, x, p=2.0):
    n = static(x.shape[0], "pdist")
    full = cdist(ctx, x, x, p).reshape((n * n,))
    pairs = np.array([i * n + j for i in range(n) for j in range(i + 1, n)], np.int64)
    if not len(pairs):
        return ctx.full((0,), 0, full.dtype)
    return full.reshape((n * n, 1)).gather(ctx.graph.constant(pairs)).reshape((len(pairs),))


@lowers(aten.addbmm.default)
def addbmm(ctx, bias, b1, b2, *, beta=1, alpha=1):
    x, y = _mm_operands(ctx, b1, b2)
    return _add_scaled(ctx, F.matmul(x, y).sum(0), bias, beta, alpha)
