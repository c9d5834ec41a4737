"""Rotary position embeddings (RoPE) in the two layouts models use.

Pairs of features are rotated by an angle ``position * inv_freq[i]`` with
``inv_freq[i] = theta ** (-2i / rotary_dim)``:

- rotate-half (``interleaved=False``; Hugging Face Llama/Qwen/Mistral, GPT-NeoX):
  feature ``i`` pairs with feature ``i + rotary_dim/2``;
- interleaved (``interleaved=True``; GPT-J, GGUF/llama.cpp "normal" rope for llama):
  feature ``2i`` pairs with feature ``2i + 1``.

Only the first ``rotary_dim`` features of the head are rotated (partial rotary);
the rest pass through unchanged.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..shape import _shape_str
from ..symbolic import sint
from ..tensor import Tensor
from .combine import concatenate, stack
from .creation import arange


def rope_inv_freq(rotary_dim: int, theta: float = 10000.0) -> np.ndarray:
    """The ``rotary_dim // 2`` inverse frequencies ``theta ** (-2i / rotary_dim)``, float32."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rope: rotary_dim must be a positive even number, got {rotary_dim}")
    exponents = np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim
    return (1.0 / (float(theta) ** exponents)).astype(np.float32)


def rope(x: Tensor, positions: Tensor | None = None, *, pos: sint = 0, theta: float = 10000.0,
         rotary_dim: int | None = None, interleaved: bool = False, seq_axis: int = -3,
         inv_freq: np.ndarray | Tensor | None = None) -> Tensor:
    """Rotate ``x`` by its positions.

    ``x`` is ``[..., seq, heads, head_dim]`` by default (``seq_axis=-3``, the layout of a
    projected q/k before the head transpose); pass ``seq_axis=-2`` for ``[..., heads, seq, head_dim]``.
    ``positions`` is an integer or float tensor ``[seq]`` (or ``[..., seq]`` matching x's leading
    axes); when omitted the positions are ``pos, pos+1, ..., pos+seq-1``, where ``pos`` may be a
    symbolic dim (the number of tokens already in the KV cache). ``inv_freq`` overrides the
    frequencies computed from ``theta`` (for scaled RoPE variants). The result has x's dtype;
    the rotation is computed in float32."""
    if x.ndim < 2 or not -x.ndim <= seq_axis <= -2:
        raise ValueError(f"rope: seq_axis {seq_axis} must be a negative axis before the last, for x of shape "
                         f"{_shape_str(x.shape)}")
    head_dim = x.shape[-1]
    if not sym.is_const(head_dim):
        raise ValueError(f"rope: head_dim must be static, got shape {_shape_str(x.shape)}")
    head_dim = int(head_dim)
    rdim = head_dim if rotary_dim is None else int(rotary_dim)
    if rdim <= 0 or rdim % 2 or rdim > head_dim:
        raise ValueError(f"rope: rotary_dim {rdim} must be even and in [2, {head_dim}] for x of shape "
                         f"{_shape_str(x.shape)}")
    half = rdim // 2
    g = x.graph
    seq = x.shape[seq_axis]
    if positions is None:
        positions = arange(g, pos, sym.add(pos, seq))
    elif not sym.same(pos, 0):
        raise ValueError("rope: pass either positions or pos, not both")
    elif not sym.same(positions.shape[-1], seq):
        raise ValueError(f"rope: positions of shape {_shape_str(positions.shape)} do not match the sequence axis "
                         f"of x {_shape_str(x.shape)} (seq_axis={seq_axis})")
    if inv_freq is None:
        inv_freq = rope_inv_freq(rdim, theta)
    freqs = g.constant(np.ascontiguousarray(inv_freq, dtype=np.float32)) if isinstance(inv_freq, np.ndarray) \
        else inv_freq.cast(dt.float32)
    if freqs.ndim != 1 or not sym.same(freqs.shape[0], half):
        raise ValueError(f"rope: inv_freq has shape {_shape_str(freqs.shape)}, expected ({half},)")
    angles = positions.cast(dt.float32).unsqueeze(-1) * freqs               # [..., seq, half]
    between = -seq_axis - 2                                                # axes between seq and head_dim
    angles = angles.reshape(angles.shape[:-1] + (1,) * between + (half,))
    cos, sin = angles.cos(), angles.sin()

    xf = x.cast(dt.float32)
    if interleaved:
        pairs = xf[..., :rdim].reshape(x.shape[:-1] + (half, 2))
        a, b = pairs[..., 0], pairs[..., 1]
    else:
        a, b = xf[..., :half], xf[..., half:rdim]
    ra = a * cos - b * sin
    rb = a * sin + b * cos
    rotated = stack([ra, rb], -1).reshape(x.shape[:-1] + (rdim,)) if interleaved else concatenate([ra, rb], -1)
    if rdim < head_dim:
        rotated = concatenate([rotated, xf[..., rdim:]], -1)
    return rotated.cast(x.dtype)
