"""Scaled dot-product attention with causal masking and grouped-query heads."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..shape import _shape_str
from ..tensor import Tensor, broadcast_shapes
from .creation import causal_mask
from .elementwise import where
from .linalg import matmul
from .nn import softmax

# Masked scores are set to the lowest finite float32: exp() of it is 0, and unlike -inf it
# cannot produce inf - inf = NaN, even in a row where every key is masked.
MASKED_SCORE = float(np.finfo(np.float32).min)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
                                 causal: bool = False, scale: float | None = None) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v.

    Shapes follow PyTorch: ``q [..., Hq, Sq, D]``, ``k [..., Hkv, Skv, D]``, ``v [..., Hkv, Skv, Dv]``
    -> ``[..., Hq, Sq, Dv]``. When ``Hkv`` divides ``Hq`` (grouped-query attention) each KV head
    serves ``Hq // Hkv`` consecutive query heads; KV heads are broadcast (a view), never copied.
    ``mask`` broadcasts to ``[..., Hq, Sq, Skv]``: a bool mask selects the keys to attend (True =
    attend), a float mask is added to the scores. ``causal=True`` aligns queries to the end of the
    keys: query ``i`` sits at position ``Skv - Sq + i`` and sees keys ``j <= Skv - Sq + i`` (the
    KV-cache convention; for ``Sq == Skv`` this is PyTorch's ``is_causal``). ``scale`` defaults
    to ``1/sqrt(D)``. Scores and softmax are computed in float32."""
    what = "scaled_dot_product_attention"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(f"{what}: {name} needs at least 2 dimensions, got shape {_shape_str(t.shape)}")
    shapes = f"q {_shape_str(q.shape)}, k {_shape_str(k.shape)}, v {_shape_str(v.shape)}"
    if not sym.same(q.shape[-1], k.shape[-1]):
        raise ValueError(f"{what}: q and k feature sizes differ ({shapes})")
    if not sym.same(k.shape[-2], v.shape[-2]):
        raise ValueError(f"{what}: k and v sequence lengths differ ({shapes})")
    if k.ndim != v.ndim or (k.ndim >= 3 and not sym.same(k.shape[-3], v.shape[-3])):
        raise ValueError(f"{what}: k and v head counts differ ({shapes})")
    sq, skv = q.shape[-2], k.shape[-2]
    if scale is None:
        d = q.shape[-1]
        if not sym.is_const(d):
            raise ValueError(f"{what}: pass scale= when the feature size is symbolic ({shapes})")
        scale = 1.0 / math.sqrt(int(d))

    # grouped-query heads: q [..., Hkv, rep, Sq, D] against k [..., Hkv, 1, Skv, D]
    rep = 1
    if q.ndim >= 3 and k.ndim >= 3 and not sym.same(q.shape[-3], k.shape[-3]):
        hq, hkv = q.shape[-3], k.shape[-3]
        if not (sym.is_const(hq) and sym.is_const(hkv)) or int(hkv) == 0 or int(hq) % int(hkv):
            raise ValueError(f"{what}: the number of KV heads must divide the number of query heads ({shapes})")
        rep = int(hq) // int(hkv)
    if rep > 1:
        qg = q.reshape(q.shape[:-3] + (k.shape[-3], rep) + q.shape[-2:])
        kg, vg = k.unsqueeze(-3), v.unsqueeze(-3)
    else:
        qg, kg, vg = q, k, v

    scores = matmul(qg.cast(dt.float32), kg.cast(dt.float32).transpose(-1, -2)) * float(scale)
    if causal:
        if not sym.proven_ge(skv, sq):
            raise ValueError(f"{what}: causal attention needs at least as many keys as queries ({shapes})")
        allowed = causal_mask(q.graph, sq, sym.add(skv, sym.mul(sq, -1)))
        scores = where(allowed, scores, MASKED_SCORE)
    if mask is not None:
        full = q.shape[:-1] + (skv,)
        try:
            mshape = broadcast_shapes(mask.shape, full, what)
        except ValueError:
            raise ValueError(f"{what}: mask of shape {_shape_str(mask.shape)} does not broadcast to the scores "
                             f"{_shape_str(full)} ({shapes})") from None
        m = mask.broadcast_to(mshape)
        if rep > 1:
            m = m.reshape(mshape[:-3] + (k.shape[-3], rep) + mshape[-2:])
        if m.dtype is dt.bool_:
            scores = where(m, scores, MASKED_SCORE)
        else:
            scores = scores + m.cast(dt.float32)
    weights = softmax(scores, -1)
    out = matmul(weights.cast(v.dtype) if v.dtype.is_float else weights, vg)
    if rep > 1:
        out = out.reshape(q.shape[:-1] + (v.shape[-1],))
    return out.cast(v.dtype) if v.dtype.is_float else out
