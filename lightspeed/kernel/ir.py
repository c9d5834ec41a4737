"""Loop IR: the value a kernel computes at one output index, as a small expression tree.

Leaves read buffers through symbolic offsets; interior nodes are primitive ALU ops,
casts, selects (validity of padded views), inner reductions and gathers. Loop
variables are ``symbolic.Var`` objects, so offsets stay symbolic until rendering.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from .. import dtypes as dt
from ..ops import Op
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
class Kernel:
    """One loop nest computing ``value`` at every index ``loop_vars`` of ``shape`` into ``out``.

    schedule: "loop" (one output element per iteration, inner reductions in place) or
    "tiled" (the top-level reduction accumulates a tile of the last axis at once).
    A "scatter" kernel writes ``value`` at rows given by ``scatter_index``.
    """
    name: str
    out: Buffer
    shape: tuple[sint, ...]
    loop_vars: tuple[Var, ...]
    value: IR
    schedule: str = "loop"
    scatter_index: IR | None = None
    scatter_rows: sint = 0
    reads: list[Buffer] = field(default_factory=list)
    template: Any = None  # a lowered kernel (e.g. kernel.quantized.QuantizedMatmul) and its buffers
    template_reads: list[Buffer] = field(default_factory=list)
    scratch: list[Buffer] = field(default_factory=list)  # arena space the kernel uses only while it runs

    def cost(self) -> int:
        return sum(1 for _ in self.value.walk())
