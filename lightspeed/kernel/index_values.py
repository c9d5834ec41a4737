"""Integer values of loop IR as symbolic index expressions, for proofs about attention masks.

A mask that reaches the compiler from an aten graph compares positions that were computed into buffers: a
wrapped iota (``i < 0 ? i + n : i``) plus an offset, read back through gathers (``arange[pos[i]]``). Such a
buffer depends on indices only, so its value at the offset a kernel reads is a symbolic expression of that
kernel's loop variables. ``simplify`` rewrites a score's IR with those values: every integer subexpression that
is such an expression (loads of index-valued buffers included, see ``Resolve``) becomes one ``ir.Index``, a
comparison of two becomes a comparison of ``ir.Index`` values without their common terms, and a gather whose
index is provably in range reads its row directly. What ``kernel/attention_mask.py`` then proves monotone in
the key index are plain index comparisons.

Every step keeps the value exactly: integer arithmetic is taken over only where the symbolic bounds of each
intermediate value fit its dtype (no wrap-around), a C ``fmod`` only where it equals the floor modulo
(a non-negative dividend, a positive divisor), and a gather's row only where its index is proven in range.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..ops import Op
from ..symbolic import sint
from . import ir

# the IR a load of an index-valued buffer reads (in the reading kernel's variables), or None if it is not one
Resolve = Callable[[ir.Load], "ir.IR | None"]

_RANGE = {d: (int(np.iinfo(d.np).min), int(np.iinfo(d.np).max)) for d in (dt.int32, dt.int64)}
_RANGE[dt.bool_] = (0, 1)


def _fits(e: sint, dtype: dt.DType) -> bool:
    """Whether every value of ``e`` is representable in ``dtype`` (so computing it there cannot wrap)."""
    lo, hi = _RANGE[dtype]
    x = sym.to_expr(e)
    # (symbolic bounds saturate at +-BIG, so one that reaches it is no bound)
    return max(lo, 1 - sym.BIG) <= x.lo and x.hi <= min(hi, sym.BIG - 1)


def _in_range(index: sint, rows: sint) -> bool:
    """0 <= index < rows for every value of the variables."""
    return sym.proven_ge(index, 0) and sym.proven_lt(index, rows)


def _alu_value(x: ir.Alu, args: list[sint]) -> sint | None:
    """The value of a binary ALU op on integer (or 0/1 bool) operands."""
    a, b = args
    if x.op is Op.ADD:
        return sym.add(a, b)
    if x.op is Op.MUL:  # integer product; with a bool operand a select, which for 0/1 is the product too
        return sym.mul(a, b)
    if x.op is Op.LESS_THAN:
        return sym.lt(a, b)
    if x.op is Op.MOD and sym.proven_ge(a, 0) and sym.proven_ge(b, 1):  # fmod equals floor modulo here
        return sym.mod(a, b)
    return None


def as_index(x: ir.IR, resolve: Resolve, memo: dict | None = None) -> sint | None:
    """The value of the integer or bool IR ``x`` as a symbolic expression (bools as 0/1), or None when no rule
    gives one exactly."""
    memo = {} if memo is None else memo
    if id(x) in memo:
        return memo[id(x)][1]
    out = _as_index(x, resolve, memo)
    if out is not None and not _fits(out, x.dtype):
        out = None
    memo[id(x)] = (x, out)  # (x kept alive: ids of temporaries may be reused)
    return out


def _as_index(x: ir.IR, resolve: Resolve, memo: dict) -> sint | None:
    if x.dtype not in _RANGE:
        return None
    if isinstance(x, ir.Const):
        return int(x.value)
    if isinstance(x, ir.Index):
        return x.expr
    if isinstance(x, ir.Cast):
        return as_index(x.arg, resolve, memo) if x.arg.dtype in _RANGE else None
    if isinstance(x, ir.Select):
        v = as_index(x.value, resolve, memo)
        return None if v is None else sym.mul(x.valid, v)
    if isinstance(x, ir.Load):
        value = resolve(x)
        return None if value is None else as_index(value, resolve, memo)
    if isinstance(x, ir.Gather):
        index = as_index(x.index, resolve, memo)
        if index is None or not _in_range(index, x.rows):
            return None
        body = as_index(x.body, resolve, memo)
        return None if body is None else sym.to_expr(body).substitute({x.var: index})
    if isinstance(x, ir.Alu) and len(x.args) == 2:
        args = [as_index(a, resolve, memo) for a in x.args]
        if any(a is None for a in args):
            return None
        return _alu_value(x, args)
    return None


def _terms(e: sint) -> dict:
    x = sym.to_expr(e)
    if isinstance(x, sym.Sum):
        return dict(x.terms)
    return {} if isinstance(x, sym.Const) else {x: 1}


def _cancel(a: sint, b: sint) -> tuple[sint, sint]:
    """``a`` and ``b`` less the terms they share (an offset common to both sides of a comparison)."""
    ta, tb = _terms(a), _terms(b)
    for t, k in ta.items():
        if tb.get(t) == k:
            a, b = sym.add(a, sym.mul(t, -k)), sym.add(b, sym.mul(t, -k))
    return a, b


def simplify(x: ir.IR, resolve: Resolve) -> ir.IR:
    """``x`` with its integer subexpressions as index expressions (see the module docstring); the same value at
    every index. Parts that no rule simplifies are kept as they are (the same objects)."""
    return _Simplifier(resolve).run(x)


class _Simplifier:
    def __init__(self, resolve: Resolve):
        self.resolve = resolve
        self.values: dict = {}  # as_index memo
        self.done: dict[int, tuple[ir.IR, ir.IR]] = {}

    def run(self, x: ir.IR) -> ir.IR:
        got = self.done.get(id(x))
        if got is None:
            got = self.done[id(x)] = (x, self._rewrite(x))
        return got[1]

    def _index(self, x: ir.IR) -> ir.IR | None:
        """``x`` as one Index (or Const), or None."""
        e = as_index(x, self.resolve, self.values)
        if e is None:
            return None
        if sym.is_const(e):
            v = int(sym.to_expr(e).value)
            return ir.Const(bool(v) if x.dtype is dt.bool_ else v, x.dtype)
        return ir.Index(e, x.dtype) if x.dtype is not dt.bool_ else None

    def _rewrite(self, x: ir.IR) -> ir.IR:
        if x.dtype in _RANGE and not isinstance(x, (ir.Const, ir.Index)):
            folded = self._index(x)
            if folded is not None:
                return folded
        if isinstance(x, ir.Alu):
            if x.op is Op.LESS_THAN and all(a.dtype in (dt.int32, dt.int64) for a in x.args):
                cmp = self._comparison(x)
                if cmp is not None:
                    return cmp
            args = tuple(self.run(a) for a in x.args)
            return x if all(a is b for a, b in zip(args, x.args)) else ir.Alu(x.op, args, x.dtype)
        if isinstance(x, ir.Cast):
            arg = self.run(x.arg)
            return x if arg is x.arg else ir.Cast(arg, x.dtype)
        if isinstance(x, ir.Select):
            value = self.run(x.value)
            return x if value is x.value else ir.Select(x.valid, value, x.dtype)
        if isinstance(x, ir.Reduce):
            body = self.run(x.body)
            return x if body is x.body else ir.Reduce(x.op, x.var, x.size, body, x.dtype)
        if isinstance(x, ir.Gather):
            return self._gather(x)
        return x

    def _comparison(self, x: ir.Alu) -> ir.IR | None:
        """``a < b`` of two index values as a comparison of Index values without their common terms."""
        a, b = (as_index(y, self.resolve, self.values) for y in x.args)
        if a is None or b is None:
            return None
        a, b = _cancel(a, b)
        folded = sym.lt(a, b)
        if sym.is_const(folded):
            return ir.Const(bool(sym.to_expr(folded).value), dt.bool_)
        wide = dt.int64 if _fits(a, dt.int64) and _fits(b, dt.int64) else None
        if wide is None:
            return None
        return ir.Alu(Op.LESS_THAN, (ir.Index(a, wide), ir.Index(b, wide)), x.dtype)

    def _gather(self, x: ir.Gather) -> ir.IR:
        """A gather whose index is proven in range reads its row: the body with the row variable bound."""
        index = as_index(x.index, self.resolve, self.values)
        if index is not None and _in_range(index, x.rows):
            try:
                return self.run(ir.substitute(x.body, {x.var: index}))
            except TypeError:  # a reduction inside (it binds variables of its own): keep the gather
                pass
        idx, body = self.run(x.index), self.run(x.body)
        return x if idx is x.index and body is x.body else ir.Gather(idx, x.var, x.rows, body, x.dtype)
