"""Patterns over the primitive graph, written with Python operators, and the matcher that binds them.

    P.x * 1                  a Mul of anything and the scalar constant 1 (either operand order)
    P.x.recip().recip()      Recip of Recip of anything
    (P.x * P.c).sum(name="s") a SumReduce over a Mul; ``P.c`` binds the other operand

A variable (``P.x``) binds a ``Tensor``: the matched source node seen through the views on the edges
from the pattern's root down to it. Views on inner edges of a pattern must be total (no padding mask):
an elementwise op commutes with a mask-free view, but not with a mask, whose padding reads 0 before the
op is applied. Below a reduction, variables are bound in the shape of the reduction's input. A variable
used twice must bind the same node through the same view. Constants match scalar ``Constant`` nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .. import dtypes as dt
from ..graph import ArrayConst, Node
from ..ops import REDUCE, Op
from ..shape import ShapeTracker
from ..tensor import Tensor
from .views import compose, dense, is_total

COMMUTATIVE = frozenset({Op.ADD, Op.MUL})


class Pattern:
    """Base of all patterns; Python operators build op patterns."""

    name: str | None = None

    def __mul__(self, o) -> "OpPat": return OpPat(Op.MUL, (self, lift(o)))
    def __rmul__(self, o) -> "OpPat": return OpPat(Op.MUL, (lift(o), self))
    def __add__(self, o) -> "OpPat": return OpPat(Op.ADD, (self, lift(o)))
    def __radd__(self, o) -> "OpPat": return OpPat(Op.ADD, (lift(o), self))
    def __mod__(self, o) -> "OpPat": return OpPat(Op.MOD, (self, lift(o)))

    def less_than(self, o) -> "OpPat": return OpPat(Op.LESS_THAN, (self, lift(o)))
    def recip(self, name: str | None = None) -> "OpPat": return OpPat(Op.RECIP, (self,), name=name)
    def exp2(self, name: str | None = None) -> "OpPat": return OpPat(Op.EXP2, (self,), name=name)
    def log2(self, name: str | None = None) -> "OpPat": return OpPat(Op.LOG2, (self,), name=name)
    def sqrt(self, name: str | None = None) -> "OpPat": return OpPat(Op.SQRT, (self,), name=name)
    def sin(self, name: str | None = None) -> "OpPat": return OpPat(Op.SIN, (self,), name=name)

    def sum(self, axis: int | None = None, name: str | None = None) -> "OpPat":
        """A SumReduce; ``axis=None`` matches any axis (read it from ``match.node.arg``)."""
        return OpPat(Op.SUM_REDUCE, (self,), axis, name)

    def max(self, axis: int | None = None, name: str | None = None) -> "OpPat":
        return OpPat(Op.MAX_REDUCE, (self,), axis, name)

    def cast(self, dtype: dt.DType | None = None, name: str | None = None) -> "OpPat":
        """A Cast to ``dtype`` (None: to any dtype)."""
        return OpPat(Op.CAST, (self,), dtype, name)

    def named(self, name: str) -> "Pattern":
        """This pattern, binding what it matches to ``name``."""
        self.name = name
        return self


@dataclass(eq=False)
class VarPat(Pattern):
    """Matches any value; ``where`` (a predicate on the bound Tensor) may restrict it."""
    name: str
    where: Callable[[Tensor], bool] | None = None


@dataclass(eq=False)
class ConstPat(Pattern):
    """A scalar constant: equal to ``value`` (None: any), satisfying ``where`` (a predicate on the value)."""
    value: Any = None
    name: str | None = None
    where: Callable[[Any], bool] | None = None


@dataclass(eq=False)
class OpPat(Pattern):
    op: Op
    srcs: tuple[Pattern, ...]
    arg: Any = None  # reduce axis or cast dtype; None matches any
    name: str | None = None


def lift(x) -> Pattern:
    if isinstance(x, Pattern):
        return x
    if isinstance(x, (bool, int, float)):
        return ConstPat(x)
    raise TypeError(f"pattern: cannot use {type(x).__name__} {x!r} in a pattern")


class _Vars:
    """``P.x`` is the variable named x; ``P.var``/``P.const`` build restricted ones."""

    def __getattr__(self, name: str) -> VarPat:
        if name.startswith("_"):
            raise AttributeError(name)
        return VarPat(name)

    @staticmethod
    def var(name: str, where: Callable[[Tensor], bool] | None = None) -> VarPat:
        return VarPat(name, where)

    @staticmethod
    def const(value=None, name: str | None = None, where: Callable[[Any], bool] | None = None) -> ConstPat:
        return ConstPat(value, name, where)


P = _Vars()


@dataclass
class Match:
    """A successful match at ``node``: ``bindings`` (name -> Tensor) and constant ``values``."""

    node: Node
    bindings: dict[str, Tensor] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Tensor:
        try:
            return self.__dict__["bindings"][name]
        except KeyError:
            raise AttributeError(f"pattern match has no binding {name!r}") from None

    @property
    def graph(self):
        return self.node.graph


def scalar_value(node: Node):
    """The Python value of a scalar Constant node, or None for anything else."""
    if node.op is Op.CONST and not isinstance(node.arg, ArrayConst) and not node.shape:
        return node.arg
    return None


def match(pat: Pattern, node: Node) -> Match | None:
    """Bindings if ``pat`` matches ``node`` (read densely), else None."""
    m = Match(node)
    return m if _match(pat, node, None, m) else None


def _view(node: Node, outer: ShapeTracker | None) -> ShapeTracker:
    return outer if outer is not None else dense(node.shape)


def _same_value(a: Tensor, b: Tensor) -> bool:
    return a.node is b.node and a.st == b.st


def _match(pat: Pattern, node: Node, outer: ShapeTracker | None, m: Match) -> bool:
    if isinstance(pat, VarPat):
        t = Tensor(node, _view(node, outer))
        if pat.where is not None and not pat.where(t):
            return False
        old = m.bindings.get(pat.name)
        if old is not None:
            return _same_value(old, t)
        m.bindings[pat.name] = t
        return True
    if isinstance(pat, ConstPat):
        v = scalar_value(node)
        if v is None or (outer is not None and not is_total(outer)):
            return False
        if pat.value is not None and not (v == pat.value and not (isinstance(v, float) and v != v)):
            return False
        if pat.where is not None and not pat.where(v):
            return False
        if pat.name is not None:
            m.bindings[pat.name] = Tensor(node, _view(node, outer))
            m.values[pat.name] = v
        return True
    assert isinstance(pat, OpPat)
    if node.op is not pat.op or len(node.srcs) != len(pat.srcs):
        return False
    if pat.arg is not None and node.arg != pat.arg and node.arg is not pat.arg:
        return False
    orders = [pat.srcs]
    if pat.op in COMMUTATIVE:
        orders.append(tuple(reversed(pat.srcs)))
    for order in orders:
        saved_b, saved_v = dict(m.bindings), dict(m.values)
        if all(_match_edge(p, s, st, node, outer, m) for p, (s, st) in zip(order, node.srcs)):
            if pat.name is not None:
                m.bindings[pat.name] = Tensor(node, _view(node, outer))
            return True
        m.bindings, m.values = saved_b, saved_v
    return False


def _match_edge(p: Pattern, src: Node, st: ShapeTracker, parent: Node, outer: ShapeTracker | None,
                m: Match) -> bool:
    if not isinstance(p, VarPat) and not is_total(st):
        return False  # an op does not commute with padding (see the module docstring)
    if parent.op in REDUCE or outer is None:
        child_outer = st  # below a reduction, values live in the shape of the reduction's input
    else:
        child_outer = compose(st, outer)
    return _match(p, src, child_outer, m)
