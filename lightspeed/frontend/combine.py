"""Joining tensors: each piece is padded (a view) to the full extent, then the pieces are added.

Padding reads 0 and every position is covered by exactly one piece, so the sum
is the concatenation; no primitive beyond Add is needed.
"""
from __future__ import annotations

from typing import Sequence

from .. import dtypes as dt
from .. import symbolic as sym
from ..shape import _shape_str
from ..tensor import Tensor, _norm_axis, promote
from .elementwise import logical_or


def concatenate(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join tensors along an existing ``axis``; all other dimensions must match (sizes may be symbolic)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("concatenate: needs at least one tensor")
    first = tensors[0]
    if first.ndim == 0:
        raise ValueError("concatenate: zero-dimensional tensors cannot be concatenated")
    axis = _norm_axis(axis, first.ndim, "concatenate")
    for t in tensors[1:]:
        if t.graph is not first.graph:
            raise ValueError("concatenate: tensors come from different graphs")
        if t.ndim != first.ndim or any(not sym.same(a, b) for k, (a, b) in enumerate(zip(t.shape, first.shape))
                                       if k != axis):
            raise ValueError(f"concatenate: shapes {_shape_str(first.shape)} and {_shape_str(t.shape)} differ "
                             f"outside axis {axis}")
    if len(tensors) == 1:
        return first
    dtype = first.dtype
    for t in tensors[1:]:
        dtype = promote(dtype, t.dtype)
    total: sym.sint = 0
    for t in tensors:
        total = sym.add(total, t.shape[axis])
    out, offset = None, 0
    for t in tensors:
        after = sym.add(total, sym.mul(sym.add(offset, t.shape[axis]), -1))
        pads = [(0, 0)] * t.ndim
        pads[axis] = (offset, after)
        piece = t.cast(dtype).pad(pads)
        if out is None:
            out = piece
        else:
            out = logical_or(out, piece) if dtype is dt.bool_ else out + piece
        offset = sym.add(offset, t.shape[axis])
    return out


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join same-shaped tensors along a new ``axis``."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: needs at least one tensor")
    ndim = tensors[0].ndim
    for t in tensors[1:]:
        if t.ndim != ndim or any(not sym.same(a, b) for a, b in zip(t.shape, tensors[0].shape)):
            raise ValueError(f"stack: shapes {_shape_str(tensors[0].shape)} and {_shape_str(t.shape)} differ")
    axis = _norm_axis(axis, ndim + 1, "stack")
    return concatenate([t.unsqueeze(axis) for t in tensors], axis)
