"""Loop IR: the value a kernel computes at one output index, as a small expression tree.

Leaves read buffers through symbolic offsets; interior nodes are primitive ALU ops,
casts, selects (validity of padded views), inner reductions and gathers. Loop
variables are ``symbolic.Var`` objects, so offsets stay symbolic until rendering.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from .. import dtypes as dt
from ..ops import Op
from .. import symbolic as sym
from ..symbolic import Var, sint


@dataclass(eq=False)
class Buffer:
    """A dense buffer: an input, an embedded constant, an output, or a slice of the arena."""

    kind: str  # input | const | output | temp
    dtype: dt.DType
    shape: tuple[sint, ...]
    name: str
    slot: int = -1  # position in the pointer array passed to native code (input/const/output)
    offset: int = 0  # byte offset in the arena (temp)
    nbytes: int = 0  # upper bound of its size in bytes

    def __repr__(self) -> str:
        return f"Buffer({self.kind} {self.name})"


class IR:
    dtype: dt.DType

    def children(self) -> tuple["IR", ...]:
        return ()

    def walk(self) -> Iterator["IR"]:
        yield self
        for c in self.children():
            yield from c.walk()


@dataclass(eq=False)
class Load(IR):
    buf: Buffer
    offset: sint
    dtype: dt.DType


@dataclass(eq=False)
class Bytes(IR):
    """The ``stored`` value (float16 or int8) held little-endian in the bytes of ``buf`` (uint8) from ``offset``,
    as ``dtype`` (float32): a load in place of the primitive decode of those bytes (see
    quant/decode_graph.py, ``half_from_bytes``)."""
    buf: Buffer
    offset: sint
    stored: dt.DType
    dtype: dt.DType


@dataclass(eq=False)
class Const(IR):
    value: Any
    dtype: dt.DType


@dataclass(eq=False)
class Index(IR):
    """The value of an integer index expression (Iota)."""
    expr: sint
    dtype: dt.DType


@dataclass(eq=False)
class Alu(IR):
    op: Op
    args: tuple[IR, ...]
    dtype: dt.DType

    def children(self):
        return self.args


@dataclass(eq=False)
class Cast(IR):
    arg: IR
    dtype: dt.DType

    def children(self):
        return (self.arg,)


@dataclass(eq=False)
class Select(IR):
    """``value`` where the index predicate ``valid`` holds, else 0 (``value`` is not evaluated)."""
    valid: sint
    value: IR
    dtype: dt.DType

    def children(self):
        return (self.value,)


@dataclass(eq=False)
class Reduce(IR):
    """Accumulate ``body`` over ``var`` in [0, size)."""
    op: Op
    var: Var
    size: sint
    body: IR
    dtype: dt.DType

    def children(self):
        return (self.body,)


@dataclass(eq=False)
class Gather(IR):
    """Bind ``var`` to the integer ``index``; ``body`` where 0 <= var < rows, else 0."""
    index: IR
    var: Var
    rows: sint
    body: IR
    dtype: dt.DType

    def children(self):
        return (self.index, self.body)


@dataclass(eq=False)
class Bound(IR):
    """A value the enclosing loop nest computes once, outside the loop that reads it, and holds under
    ``name`` (a renderer's loop-invariant hoisting; see backend/c/gemm.py)."""
    name: str
    dtype: dt.DType


@dataclass(eq=False)
class Kernel:
    """One loop nest computing ``value`` at every index ``loop_vars`` of ``shape`` into ``out``.

    kind: the loop form: "loop" (one output element per iteration, inner reductions in place), "tiled"
    (the top-level reduction accumulates a tile of the last axis at once), "gemm" (a matmul-like
    reduction, see matmul_form.py, run as packed panels and a register block), "scatter" (writes
    ``value`` at rows given by ``scatter_index``) or a lowered kernel's ("qmatmul", "attention").
    schedule: how its loops run (schedule.py); None until a backend's heuristics or a search set it.
    """
    name: str
    out: Buffer
    shape: tuple[sint, ...]
    loop_vars: tuple[Var, ...]
    value: IR
    kind: str = "loop"
    scatter_index: IR | None = None
    scatter_rows: sint = 0
    reads: list[Buffer] = field(default_factory=list)
    template: Any = None  # a lowered kernel (e.g. kernel.quantized.QuantizedMatmul) and its buffers
    template_reads: list[Buffer] = field(default_factory=list)
    scratch: list[Buffer] = field(default_factory=list)  # arena space the kernel uses only while it runs
    schedule: Any = None  # a schedule.Schedule
    # "gemm" only: an elementwise function of the product applied where it is stored (a bias, an activation, a
    # batch norm): ``value``'s result is first stored in ``out``, then ``epilogue`` (which reads ``out`` at
    # the kernel's own index) is stored over it (kernel/epilogue.py)
    epilogue: IR | None = None

    def cost(self) -> int:
        return sum(1 for _ in self.value.walk())

    def roots(self) -> list[IR]:
        """The IR trees the kernel evaluates (value, scatter index, epilogue)."""
        return [x for x in (self.value, self.scatter_index, self.epilogue) if x is not None]


def ir_vars(x: IR) -> set[Var]:
    """The loop variables ``x`` reads (in offsets, indices, selects, reduction and gather sizes)."""
    out: set[Var] = set()
    for y in x.walk():
        if isinstance(y, (Load, Bytes)):
            out |= sym.free_vars(y.offset)
        elif isinstance(y, Index):
            out |= sym.free_vars(y.expr)
        elif isinstance(y, Select):
            out |= sym.free_vars(y.valid)
        elif isinstance(y, Reduce):
            out |= sym.free_vars(y.size)
        elif isinstance(y, Gather):
            out |= sym.free_vars(y.rows)
    return out


def dense_offset(idx, shape) -> sint:
    """The row-major offset of index ``idx`` in a dense array of ``shape`` (size-1 axes add nothing)."""
    off: sint = 0
    acc: sint = 1
    for i, s in zip(reversed(list(idx)), reversed(list(shape))):
        if not sym.same(s, 1):
            off = sym.add(off, sym.mul(i, acc))
        acc = sym.mul(acc, s)
    return off


def loop_var(name: str, size: sint) -> Var:
    """A loop variable over [0, size): its upper bound is ``size - 1`` (symbolic when ``size`` is)."""
    hi = max(sym.upper_bound(size) - 1, 0)
    return sym.Var(name, 0, hi, sym.to_expr(sym.add(size, -1)) if not sym.is_const(size) else sym.Const(hi))


def coefficient(expr: sint, var: sym.Var) -> int | None:
    """The constant coefficient of ``var`` in a linear offset, or None if it is not linear in it."""
    e = sym.to_expr(expr)
    if e == var:
        return 1
    if isinstance(e, sym.Sum):
        for t, k in e.terms:
            if t == var:
                return k
        return 0 if var not in e.vars() else None
    return 0 if var not in e.vars() else None


def substitute(x: IR, mapping: dict, memo: dict | None = None) -> IR:
    """``x`` with every index expression substituted (``mapping``: variable -> expression); shared operands
    stay shared. Reductions (which bind variables of their own) are not handled: TypeError."""
    memo = {} if memo is None else memo
    if id(x) in memo:
        return memo[id(x)]
    if isinstance(x, (Load, Bytes)):
        y = replace(x, offset=sym.to_expr(x.offset).substitute(mapping))
    elif isinstance(x, Index):
        y = replace(x, expr=sym.to_expr(x.expr).substitute(mapping))
    elif isinstance(x, Alu):
        y = replace(x, args=tuple(substitute(a, mapping, memo) for a in x.args))
    elif isinstance(x, Cast):
        y = replace(x, arg=substitute(x.arg, mapping, memo))
    elif isinstance(x, Select):
        y = replace(x, valid=sym.to_expr(x.valid).substitute(mapping), value=substitute(x.value, mapping, memo))
    elif isinstance(x, (Const, Bound)):
        y = x
    elif isinstance(x, Gather) and x.var not in mapping:
        y = replace(x, index=substitute(x.index, mapping, memo), rows=sym.to_expr(x.rows).substitute(mapping),
                    body=substitute(x.body, mapping, memo))
    else:
        raise TypeError(f"ir.substitute: {type(x).__name__} is not handled")
    memo[id(x)] = y
    return y

