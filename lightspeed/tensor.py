"""The lazy Tensor: a view of a graph node, with primitive ops and movement ops.

Compute methods add primitive nodes to the graph; movement methods only return a
new view of the same node. Every higher-level operation (softmax, matmul, ...)
lives in ``lightspeed.frontend`` and is attached here as a method.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from . import dtypes as dt
from . import symbolic as sym
from .graph import Graph, Node
from .ops import Op
from .shape import ShapeTracker, _shape_str
from .symbolic import sint

_RANK = {d: r for r, d in enumerate((dt.bool_, dt.uint8, dt.int8, dt.uint16, dt.int16, dt.uint32, dt.int32, dt.int64,
                                     dt.float16, dt.bfloat16, dt.float32))}


def promote(a: dt.DType, b: dt.DType) -> dt.DType:
    """The dtype two operands are converted to before a binary op."""
    if a is b:
        return a
    if {a, b} == {dt.float16, dt.bfloat16}:
        return dt.float32
    return a if _RANK[a] >= _RANK[b] else b


def broadcast_shapes(a: Sequence[sint], b: Sequence[sint], what: str) -> tuple[sint, ...]:
    n = max(len(a), len(b))
    pa = (1,) * (n - len(a)) + tuple(a)
    pb = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(pa, pb):
        if sym.same(x, y) or sym.same(y, 1):
            out.append(x)
        elif sym.same(x, 1):
            out.append(y)
        else:
            raise ValueError(f"{what}: shapes {_shape_str(a)} and {_shape_str(b)} cannot be broadcast together")
    return tuple(out)


def _norm_axis(axis: int, ndim: int, what: str) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise ValueError(f"{what}: axis {axis} is out of range for a tensor with {ndim} dimensions")
    return axis % ndim if ndim else 0


class Tensor:
    """A lazy value: node ``node`` seen through view ``st``."""

    __slots__ = ("node", "st")
    __array_priority__ = 1000  # numpy scalars on the left defer to our operators

    def __init__(self, node: Node, st: ShapeTracker):
        self.node, self.st = node, st

    # basic properties -----------------------------------------------------------
    @property
    def graph(self) -> Graph:
        return self.node.graph

    @property
    def shape(self) -> tuple[sint, ...]:
        return self.st.shape

    @property
    def dtype(self) -> dt.DType:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> sint:
        return sym.prod(self.shape)

    def __repr__(self) -> str:
        return f"Tensor({self.node.op.value}, shape={_shape_str(self.shape)}, dtype={self.dtype.name})"

    __hash__ = object.__hash__

    def _view(self, st: ShapeTracker) -> "Tensor":
        return Tensor(self.node, st)

    def const_like(self, value, dtype: dt.DType | None = None) -> "Tensor":
        """A scalar constant broadcast to this tensor's shape."""
        c = self.graph.constant(value, dtype or self.dtype)
        return c.reshape((1,) * self.ndim).expand(self.shape) if self.ndim else c

    def _operand(self, x) -> "Tensor":
        if isinstance(x, Tensor):
            return x
        if isinstance(x, (bool, int, float, np.number)):
            if isinstance(x, float) and not self.dtype.is_float:
                return self.graph.constant(float(x), dt.float32)
            return self.graph.constant(x.item() if isinstance(x, np.number) else x, self.dtype)
        if isinstance(x, np.ndarray):
            return self.graph.constant(x)
        raise TypeError(f"cannot combine a Tensor with {type(x).__name__}")

    # primitive ops --------------------------------------------------------------
    def _unary(self, op: Op) -> "Tensor":
        if not self.dtype.is_float:
            raise ValueError(f"{op.value}: needs a floating-point operand, got {self.dtype.name}")
        n = self.graph.node(op, [(self.node, self.st)], None, self.dtype, self.shape)
        return Tensor(n, ShapeTracker.contiguous(self.shape))

    def log2(self) -> "Tensor": return self._unary(Op.LOG2)
    def exp2(self) -> "Tensor": return self._unary(Op.EXP2)
    def sin(self) -> "Tensor": return self._unary(Op.SIN)
    def sqrt(self) -> "Tensor": return self._unary(Op.SQRT)
    def recip(self) -> "Tensor": return self._unary(Op.RECIP)

    def _broadcast_pair(self, other, op_name: str, reverse: bool = False) -> tuple["Tensor", "Tensor"]:
        a, b = self, self._operand(other)
        if reverse:
            a, b = b, a
        shape = broadcast_shapes(a.shape, b.shape, op_name)
        return a.broadcast_to(shape), b.broadcast_to(shape)

    def _binary(self, op: Op, other, reverse: bool = False) -> "Tensor":
        a, b = self._broadcast_pair(other, op.value, reverse)
        if op is Op.MUL and (a.dtype is dt.bool_) != (b.dtype is dt.bool_):
            out_dtype = b.dtype if a.dtype is dt.bool_ else a.dtype  # a select
        else:
            d = promote(a.dtype, b.dtype)
            a, b = a.cast(d), b.cast(d)
            if op not in (Op.LESS_THAN, Op.MUL) and d is dt.bool_:
                a, b = a.cast(dt.int32), b.cast(dt.int32)  # bool*bool stays bool: logical and
            out_dtype = dt.bool_ if op is Op.LESS_THAN else a.dtype
        n = self.graph.node(op, [(a.node, a.st), (b.node, b.st)], None, out_dtype, a.shape)
        return Tensor(n, ShapeTracker.contiguous(a.shape))

    def add(self, other, reverse: bool = False) -> "Tensor": return self._binary(Op.ADD, other, reverse)
    def mul(self, other, reverse: bool = False) -> "Tensor": return self._binary(Op.MUL, other, reverse)
    def mod(self, other, reverse: bool = False) -> "Tensor": return self._binary(Op.MOD, other, reverse)
    def less_than(self, other, reverse: bool = False) -> "Tensor": return self._binary(Op.LESS_THAN, other, reverse)

    def _reduce(self, op: Op, axis: int) -> "Tensor":
        axis = _norm_axis(axis, self.ndim, op.value)
        if self.dtype is dt.bool_:
            return self.cast(dt.int32)._reduce(op, axis)
        shape = self.shape[:axis] + self.shape[axis + 1:]
        n = self.graph.node(op, [(self.node, self.st)], axis, self.dtype, shape)
        return Tensor(n, ShapeTracker.contiguous(shape))

    def sum_reduce(self, axis: int) -> "Tensor": return self._reduce(Op.SUM_REDUCE, axis)
    def max_reduce(self, axis: int) -> "Tensor": return self._reduce(Op.MAX_REDUCE, axis)

    def cast(self, dtype) -> "Tensor":
        """Convert to ``dtype`` (float to int truncates toward zero; to bool tests != 0)."""
        dtype = dt.as_dtype(dtype)
        if dtype is self.dtype:
            return self
        n = self.graph.node(Op.CAST, [(self.node, self.st)], dtype, dtype, self.shape)
        return Tensor(n, ShapeTracker.contiguous(self.shape))

    def contiguous(self) -> "Tensor":
        """Materialise this view as a dense buffer (a hint to backends; values are unchanged)."""
        n = self.graph.node(Op.CONTIGUOUS, [(self.node, self.st)], None, self.dtype, self.shape)
        return Tensor(n, ShapeTracker.contiguous(self.shape))

    def gather(self, indices: "Tensor") -> "Tensor":
        """Rows of this tensor picked by integer ``indices``: out[i..., r...] = self[indices[i...], r...]."""
        if not isinstance(indices, Tensor) or not indices.dtype.is_int:
            raise ValueError(f"gather: indices must be an integer Tensor, got "
                             f"{getattr(indices, 'dtype', type(indices).__name__)}")
        if self.ndim < 1:
            raise ValueError("gather: the data tensor needs at least one dimension")
        shape = tuple(indices.shape) + tuple(self.shape[1:])
        n = self.graph.node(Op.GATHER, [(self.node, self.st), (indices.node, indices.st)], None, self.dtype, shape)
        return Tensor(n, ShapeTracker.contiguous(shape))

    def scatter(self, indices: "Tensor", src: "Tensor") -> "Tensor":
        """A copy of this tensor whose rows ``indices[m]`` are replaced by ``src[m]``."""
        if not isinstance(indices, Tensor) or not indices.dtype.is_int or indices.ndim != 1:
            raise ValueError("scatter: indices must be a 1-D integer Tensor")
        want = tuple(indices.shape) + tuple(self.shape[1:])
        if len(want) != src.ndim or any(not sym.same(a, b) for a, b in zip(want, src.shape)):
            raise ValueError(f"scatter: src has shape {_shape_str(src.shape)}, expected {_shape_str(want)} "
                             f"(indices {_shape_str(indices.shape)}, dest {_shape_str(self.shape)})")
        src = src.cast(self.dtype)
        n = self.graph.node(Op.SCATTER, [(self.node, self.st), (indices.node, indices.st), (src.node, src.st)],
                            None, self.dtype, self.shape)
        return Tensor(n, ShapeTracker.contiguous(self.shape))

    # movement ops (views) -------------------------------------------------------
    def reshape(self, *shape) -> "Tensor":
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        if sum(1 for s in shape if isinstance(s, int) and s == -1) > 1:
            raise ValueError(f"reshape: at most one -1 in {shape}")
        if any(isinstance(s, int) and s == -1 for s in shape):
            known = sym.prod(s for s in shape if not (isinstance(s, int) and s == -1))
            total = self.numel()
            missing = sym.floordiv(total, known) if not sym.same(known, 0) else 0
            if not sym.same(sym.mul(missing, known), total):
                raise ValueError(f"reshape: cannot view shape {_shape_str(self.shape)} as {shape}")
            shape = tuple(missing if isinstance(s, int) and s == -1 else s for s in shape)
        from .graph import check_shape
        return self._view(self.st.reshape(check_shape(shape, "reshape")))

    def permute(self, *order) -> "Tensor":
        order = tuple(order[0]) if len(order) == 1 and isinstance(order[0], (tuple, list)) else tuple(order)
        order = tuple(_norm_axis(o, self.ndim, "permute") for o in order)
        return self._view(self.st.permute(order))

    def transpose(self, a: int = -2, b: int = -1) -> "Tensor":
        a, b = _norm_axis(a, self.ndim, "transpose"), _norm_axis(b, self.ndim, "transpose")
        order = list(range(self.ndim))
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> "Tensor":
        return self.permute(tuple(reversed(range(self.ndim))))

    def expand(self, *shape) -> "Tensor":
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        if len(shape) < self.ndim:
            raise ValueError(f"expand: cannot expand shape {_shape_str(self.shape)} to {_shape_str(shape)}")
        x = self.reshape((1,) * (len(shape) - self.ndim) + tuple(self.shape)) if len(shape) > self.ndim else self
        shape = tuple(o if isinstance(s, int) and s == -1 else s for s, o in zip(shape, x.shape))
        return x._view(x.st.expand(shape))

    def broadcast_to(self, shape: Sequence[sint]) -> "Tensor":
        shape = tuple(shape)
        if len(shape) == self.ndim and all(sym.same(a, b) for a, b in zip(shape, self.shape)):
            return self
        return self.expand(shape)

    def shrink(self, ranges: Sequence[tuple[sint, sint] | None]) -> "Tensor":
        ranges = tuple((0, s) if r is None else r for r, s in zip(ranges, self.shape))
        return self._view(self.st.shrink(ranges))

    def pad(self, pads: Sequence[tuple[sint, sint] | None], value: float = 0.0) -> "Tensor":
        """Pad each axis by (before, after); the padding reads ``value``."""
        pads = tuple((0, 0) if p is None else p for p in pads)
        if len(pads) != self.ndim:
            raise ValueError(f"pad: {len(pads)} (before, after) pairs for shape {_shape_str(self.shape)}")
        out = self._view(self.st.pad(pads))
        if value != 0:
            inside = self.graph.constant(True, dt.bool_).reshape((1,) * self.ndim).expand(self.shape)
            mask = inside._view(inside.st.pad(pads))
            out = out + (~mask) * out.const_like(value)
        return out

    def flip(self, *axes) -> "Tensor":
        axes = tuple(axes[0]) if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else tuple(axes)
        return self._view(self.st.flip(tuple(_norm_axis(a, self.ndim, "flip") for a in axes)))

    def unsqueeze(self, axis: int) -> "Tensor":
        axis = axis % (self.ndim + 1)
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    def squeeze(self, axis: int | None = None) -> "Tensor":
        if axis is None:
            return self.reshape(tuple(s for s in self.shape if not sym.same(s, 1)))
        axis = _norm_axis(axis, self.ndim, "squeeze")
        if not sym.same(self.shape[axis], 1):
            return self
        return self.reshape(self.shape[:axis] + self.shape[axis + 1:])

    def flatten(self, start: int = 0, end: int = -1) -> "Tensor":
        if self.ndim == 0:
            return self.reshape((1,))
        start, end = _norm_axis(start, self.ndim, "flatten"), _norm_axis(end, self.ndim, "flatten")
        return self.reshape(self.shape[:start] + (sym.prod(self.shape[start:end + 1]),) + self.shape[end + 1:])

    def __getitem__(self, idx) -> "Tensor":
        if not isinstance(idx, tuple):
            idx = (idx,)
        if sum(1 for i in idx if i is Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis")
        n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
        if n_real > self.ndim:
            raise IndexError(f"too many indices ({n_real}) for a tensor of shape {_shape_str(self.shape)}")
        if any(i is Ellipsis for i in idx):
            k = next(p for p, i in enumerate(idx) if i is Ellipsis)
            idx = idx[:k] + (slice(None),) * (self.ndim - n_real) + idx[k + 1:]
        else:
            idx = idx + (slice(None),) * (self.ndim - n_real)
        ranges, final_shape, strides = [], [], []
        axis = 0
        for pos, i in enumerate(idx):
            if i is None:
                final_shape.append(1)
                continue
            size = self.shape[axis]
            if isinstance(i, (int, np.integer, sym.Expr)) and not isinstance(i, bool):
                b = _norm_index(i, size)
                ranges.append((b, sym.add(b, 1)))
            elif isinstance(i, slice):
                step = 1 if i.step is None else i.step
                if step == 0:
                    raise ValueError("slice step cannot be zero")
                if step < 0:
                    if i.start is not None or i.stop is not None:
                        raise NotImplementedError("negative-step slices with bounds are not supported; use flip")
                    return self.flip(axis)[idx[:pos] + (slice(None, None, -step),) + idx[pos + 1:]]
                b = 0 if i.start is None else _norm_index(i.start, size, True)
                e = size if i.stop is None else _norm_index(i.stop, size, True)
                # an omitted bound is exact (0 or the size): clamping it could only loosen what the
                # symbolic bounds can prove (a ':' over a size like s0 - min(s1, s0) failed to slice)
                if i.start is not None:
                    b = sym.smin(b, size) if not sym.is_const(size) or not sym.is_const(b) else min(int(b), int(size))
                if i.stop is not None:
                    if sym.is_const(size) and sym.is_const(e) and sym.is_const(b):
                        e = max(min(int(e), int(size)), int(b))
                    else:
                        e = sym.smax(sym.smin(e, size), b)
                ranges.append((b, e))
                length = sym.add(e, sym.mul(b, -1))
                if step != 1:
                    strides.append((len(final_shape), step, length))
                final_shape.append(length)
            else:
                raise TypeError(f"unsupported index {i!r}; use ints, slices, None or ...")
            axis += 1
        t = self.shrink(ranges)
        # integer indices drop their axis; None adds one
        shape, k = [], 0
        for i in idx:
            if i is None:
                shape.append(1)
            elif isinstance(i, slice):
                shape.append(t.shape[k])
                k += 1
            else:
                k += 1
        t = t.reshape(tuple(shape))
        for pos, step, length in strides:
            t = _step_axis(t, pos, step)
        return t

    # python operators -------------------------------------------------------------
    def __add__(self, o): return self.add(o)
    def __radd__(self, o): return self.add(o, reverse=True)
    def __sub__(self, o): return self.sub(o)
    def __rsub__(self, o):
        return self._operand(o).broadcast_to(self.shape).sub(self) if not isinstance(o, Tensor) else o.sub(self)
    def __mul__(self, o): return self.mul(o)
    def __rmul__(self, o): return self.mul(o, reverse=True)
    def __truediv__(self, o): return self.div(o)
    def __rtruediv__(self, o): return self._operand(o).div(self)
    def __mod__(self, o): return self.mod(o)
    def __neg__(self): return self.neg()
    def __pow__(self, o): return self.pow(o)
    def __matmul__(self, o): return self.matmul(o)
    def __rmatmul__(self, o): return self._operand(o).matmul(self)
    def __lt__(self, o): return self.less_than(o)
    def __gt__(self, o): return self.less_than(o, reverse=True)
    def __le__(self, o): return ~self.less_than(o, reverse=True)
    def __ge__(self, o): return ~self.less_than(o)
    def __eq__(self, o): return self.eq(o)  # type: ignore[override]
    def __ne__(self, o): return self.ne(o)  # type: ignore[override]
    def __invert__(self): return self.logical_not()
    def __and__(self, o): return self.logical_and(o)
    def __or__(self, o): return self.logical_or(o)

    def __bool__(self) -> bool:
        raise TypeError("the truth value of a lazy Tensor is unknown until the graph runs")


def _norm_index(i, size: sint, clamp: bool = False) -> sint:
    if isinstance(i, sym.Expr):
        return sym._simplest(i)
    i = int(i)
    if i < 0:
        return sym.smax(sym.add(size, i), 0) if clamp else sym.add(size, i)
    if not clamp and sym.is_const(size) and i >= int(size):
        raise IndexError(f"index {i} is out of range for an axis of size {size}")
    return i


def _step_axis(t: Tensor, axis: int, step: int) -> Tensor:
    """Every ``step``-th element of ``axis`` (pad to a multiple, split, take the first)."""
    n = t.shape[axis]
    if not sym.is_const(n):
        raise NotImplementedError("strided slices over symbolic dimensions are not supported")
    n = int(n)
    m = -(-n // step)
    pads = [(0, 0)] * t.ndim
    pads[axis] = (0, m * step - n)
    t = t.pad(pads)
    t = t.reshape(t.shape[:axis] + (m, step) + t.shape[axis + 1:])
    ranges = [None] * t.ndim
    ranges[axis + 1] = (0, 1)
    t = t.shrink(ranges)
    return t.reshape(t.shape[:axis + 1] + t.shape[axis + 2:])


def _attach_frontend() -> None:
    from . import frontend
    for name in frontend.TENSOR_METHODS:
        if not hasattr(Tensor, name):
            setattr(Tensor, name, getattr(frontend, name))
