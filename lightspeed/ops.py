"""The primitive operations: the only compute nodes a frontend graph may hold.

One table, ``OPS``, states each op's kind and meaning; docs/primitive-ops.md is
the long form. The reference backend implements exactly these semantics and is
the oracle for every other backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Op(Enum):
    # sources
    INPUT = "Input"
    CONST = "Constant"
    IOTA = "Iota"
    # unary
    LOG2 = "Log2"
    EXP2 = "Exp2"
    SIN = "Sin"
    SQRT = "Sqrt"
    RECIP = "Recip"
    # binary
    ADD = "Add"
    MUL = "Mul"
    MOD = "Mod"
    LESS_THAN = "LessThan"
    # reductions
    SUM_REDUCE = "SumReduce"
    MAX_REDUCE = "MaxReduce"
    # data movement and types
    GATHER = "Gather"
    SCATTER = "Scatter"
    CAST = "Cast"
    CONTIGUOUS = "Contiguous"

    def __repr__(self) -> str:
        return self.value


@dataclass(frozen=True)
class OpInfo:
    kind: str  # source | unary | binary | reduce | data
    arity: int
    meaning: str


OPS: dict[Op, OpInfo] = {
    Op.INPUT: OpInfo("source", 0, "a named buffer supplied at run time"),
    Op.CONST: OpInfo("source", 0, "a scalar value, or a numpy array embedded in the graph"),
    Op.IOTA: OpInfo("source", 0, "out[i] = i for i in [0, n)"),
    Op.LOG2: OpInfo("unary", 1, "log2(x)"),
    Op.EXP2: OpInfo("unary", 1, "2**x"),
    Op.SIN: OpInfo("unary", 1, "sin(x), radians"),
    Op.SQRT: OpInfo("unary", 1, "sqrt(x)"),
    Op.RECIP: OpInfo("unary", 1, "1/x"),
    Op.ADD: OpInfo("binary", 2, "a + b"),
    Op.MUL: OpInfo("binary", 2, "a * b; with a bool operand: the other operand where true, else 0 (a select)"),
    Op.MOD: OpInfo("binary", 2, "fmod(a, b): remainder with the sign of a (C semantics)"),
    Op.LESS_THAN: OpInfo("binary", 2, "a < b, a bool"),
    Op.SUM_REDUCE: OpInfo("reduce", 1, "sum over one axis, which is removed"),
    Op.MAX_REDUCE: OpInfo("reduce", 1, "max over one axis, which is removed"),
    Op.GATHER: OpInfo("data", 2, "out[i..., r...] = data[idx[i...], r...]; 0 where idx is out of range"),
    Op.SCATTER: OpInfo("data", 3, "dest with rows idx[m] replaced by src[m]; out-of-range rows are dropped"),
    Op.CAST: OpInfo("data", 1, "convert to another dtype (float->int truncates toward zero)"),
    Op.CONTIGUOUS: OpInfo("data", 1, "materialise a view as a dense buffer (identity on values)"),
}

UNARY = frozenset(o for o, i in OPS.items() if i.kind == "unary")
BINARY = frozenset(o for o, i in OPS.items() if i.kind == "binary")
REDUCE = frozenset(o for o, i in OPS.items() if i.kind == "reduce")
ELEMENTWISE = UNARY | BINARY | {Op.CAST, Op.CONTIGUOUS}
