"""Tensors made from indices: ranges, triangular masks, causal attention masks."""
from __future__ import annotations

import math

from .. import dtypes as dt
from .. import symbolic as sym
from ..graph import Graph
from ..shape import _shape_str
from ..symbolic import sint
from ..tensor import Tensor
from .elementwise import where


def _graph_of(g: Graph | Tensor, what: str) -> Graph:
    if isinstance(g, Tensor):
        return g.graph
    if isinstance(g, Graph):
        return g
    raise TypeError(f"{what}: the first argument must be a Graph (or a Tensor of the graph), got {type(g).__name__}")


def _is_int(v) -> bool:
    return isinstance(v, (int, sym.Expr)) and not isinstance(v, bool)


def arange(g: Graph | Tensor, start: sint | float, stop: sint | float | None = None, step: int | float = 1,
           dtype=None) -> Tensor:
    """``start, start+step, ...`` below ``stop`` (numpy's arange), as a 1-D tensor of ``graph``.

    ``arange(g, n)`` counts from 0. ``start``/``stop`` may be symbolic dims (then the length is
    symbolic and ``step`` must be an int). The dtype is int32 for integer arguments, else float32."""
    g = _graph_of(g, "arange")
    if stop is None:
        start, stop = 0, start
    ints = _is_int(start) and _is_int(stop) and _is_int(step)
    dtype = dt.as_dtype(dtype) if dtype is not None else (dt.int32 if ints else dt.float32)
    if step == 0:
        raise ValueError("arange: step must not be zero")
    if ints:
        if step > 0:
            length = sym.floordiv(sym.add(sym.add(stop, sym.mul(start, -1)), step - 1), step)
        else:
            length = sym.floordiv(sym.add(sym.add(start, sym.mul(stop, -1)), -step - 1), -step)
        if not sym.proven_ge(length, 0):
            if sym.is_const(length):
                length = 0
            else:
                raise ValueError(f"arange: the length of [{start}, {stop}) with step {step} may be negative; "
                                 "pass bounds whose difference is known to be >= 0")
        if step == 1 and isinstance(start, sym.Expr) and sym.to_expr(start).lo >= 0:
            # a symbolic offset: a shifted view of a longer iota, no extra node
            return g.iota(sym.add(start, length), dt.int32)[start:].cast(dtype)
        out = g.iota(length, dt.int32)
        if step != 1:
            out = out * step
        if isinstance(start, sym.Expr):
            out = out + g.constant_dim(start, dt.int32)
        elif start != 0:
            out = out + start
        return out.cast(dtype)
    if any(isinstance(v, sym.Expr) for v in (start, stop, step)):
        raise ValueError("arange: symbolic bounds need integer start, stop and step")
    length = max(0, math.ceil((float(stop) - float(start)) / float(step)))
    out = g.iota(length, dt.int32).cast(dtype if dtype.is_float else dt.float32) * float(step) + float(start)
    return out.cast(dtype)


def _keep_mask(x: Tensor, diagonal: int, lower: bool, what: str) -> Tensor:
    if x.ndim < 2:
        raise ValueError(f"{what}: needs at least 2 dimensions, got shape {_shape_str(x.shape)}")
    n, m = x.shape[-2], x.shape[-1]
    rows = x.graph.iota(n, dt.int32).reshape((n, 1))
    cols = x.graph.iota(m, dt.int32).reshape((1, m))
    if diagonal:
        rows = rows + diagonal
    # tril keeps col <= row + diagonal; triu keeps col >= row + diagonal
    return (cols <= rows) if lower else (cols >= rows)


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two axes (``col <= row + diagonal``); the rest is 0."""
    return where(_keep_mask(x, diagonal, True, "tril"), x, x.const_like(0) if x.ndim else 0)


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two axes (``col >= row + diagonal``); the rest is 0."""
    return where(_keep_mask(x, diagonal, False, "triu"), x, x.const_like(0) if x.ndim else 0)


def causal_mask(g: Graph | Tensor, seq: sint, pos: sint = 0, window: int | None = None) -> Tensor:
    """A bool mask ``[seq, pos + seq]``: query ``i`` (at position ``pos + i``) may see key ``j``
    iff ``j <= pos + i`` (and ``j > pos + i - window`` for a sliding window). True means attend.

    ``seq`` and ``pos`` may be symbolic (a decode step: ``seq = 1``, ``pos`` = tokens in the cache)."""
    g = _graph_of(g, "causal_mask")
    total = sym.add(pos, seq)
    keys = g.iota(total, dt.int32)
    queries = keys[pos:] if not sym.same(pos, 0) else keys   # positions pos .. pos+seq-1, a view
    q = queries.reshape((seq, 1))
    k = keys.reshape((1, total))
    allowed = k <= q
    if window is not None:
        if window < 1:
            raise ValueError(f"causal_mask: window must be >= 1, got {window}")
        allowed = allowed & (q - window < k)
    return allowed

