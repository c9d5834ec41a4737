"""Reductions: over an axis of size one or along which the input is a broadcast; moving constants out
of a reduction (max commutes with monotone maps); merging two sums over adjacent axes."""
from __future__ import annotations

from ... import symbolic as sym
from ..pattern import P
from ..rule import EXACT, ROUNDING, VALUE, Rule
from ..views import broadcast_axes
from ._build import finite, keeps_dtype


def _axis(m) -> int:
    return m.node.arg


def _drop_unit_axis(m):
    x = m.x
    if not sym.same(x.shape[_axis(m)], 1):
        return None
    return x.reshape(m.node.shape)


def _broadcast_axis(m) -> bool:
    """The reduced axis is a broadcast of one element, and not empty."""
    ax = _axis(m)
    return ax in broadcast_axes(m.x.st) and sym.to_expr(m.x.shape[ax]).lo >= 1


def _max_of_broadcast(m):
    if not _broadcast_axis(m):
        return None
    x = m.x
    ranges = [(0, 1) if k == _axis(m) else (0, s) for k, s in enumerate(x.shape)]
    return x.shrink(ranges).reshape(m.node.shape)


def _sum_of_broadcast(float_ok: bool):
    def build(m):
        if not _broadcast_axis(m) or m.node.dtype.is_float != float_ok:
            return None
        x = m.x
        n = x.shape[_axis(m)]
        ranges = [(0, 1) if k == _axis(m) else (0, s) for k, s in enumerate(x.shape)]
        one = x.shrink(ranges).reshape(m.node.shape)
        return one * m.graph.constant_dim(n, m.node.dtype)  # the scalar count broadcasts
    return build


def _max_then(op: str):
    def build(m):
        if not m.node.dtype.is_float or not keeps_dtype(m, "x"):
            return None  # integer arithmetic wraps around, which is not monotone
        c = m.values["c"]
        if not finite(c) or (op == "mul" and not c > 0):
            return None
        r = m.x.max_reduce(_axis(m))
        return r + c if op == "add" else r * c
    return build


def _sum_times_const(float_ok: bool):
    def build(m):
        if m.node.dtype.is_float != float_ok or not keeps_dtype(m, "x"):
            return None
        return m.x.sum_reduce(_axis(m)) * m.values["c"]
    return build


def _merge_sums(float_ok: bool):
    def build(m):
        inner = m.inner.node
        a = inner.arg
        if m.node.arg != a or m.node.dtype.is_float != float_ok or len(m.x.shape) < a + 2:
            return None
        if not m.inner.st.is_contiguous:
            return None
        shp = m.x.shape
        merged = shp[:a] + (sym.mul(shp[a], shp[a + 1]),) + shp[a + 2:]
        return m.x.reshape(merged).sum_reduce(a)
    return build


RULES = [
    Rule("sum-unit-axis", P.x.sum(), _drop_unit_axis, VALUE, "a sum of one element is that element (-0.0 + 0 aside)"),
    Rule("max-unit-axis", P.x.max(), _drop_unit_axis, EXACT),
    Rule("max-broadcast-axis", P.x.max(), _max_of_broadcast, EXACT, "the axis must be provably non-empty"),
    Rule("sum-broadcast-axis-int", P.x.sum(), _sum_of_broadcast(False), EXACT,
         "integers: n copies of x sum to n*x, both wrapping"),
    Rule("sum-broadcast-axis-float", P.x.sum(), _sum_of_broadcast(True), ROUNDING,
         "floats: n*x rounds once, a sum n-1 times"),
    Rule("max-add-const", (P.x + P.const(name="c")).max(), _max_then("add"), VALUE,
         "floats and finite c: rounding is monotone, so max(x + c) = max(x) + c"),
    Rule("max-mul-const", (P.x * P.const(name="c")).max(), _max_then("mul"), VALUE,
         "floats and finite c > 0: max(x * c) = max(x) * c"),
    Rule("sum-mul-const-int", (P.x * P.const(name="c")).sum(), _sum_times_const(False), EXACT,
         "integers: multiplication distributes over wrapping sums"),
    Rule("sum-mul-const-float", (P.x * P.const(name="c")).sum(), _sum_times_const(True), ROUNDING,
         "floats: sum(x*c) vs sum(x)*c round differently (and may overflow differently)"),
    Rule("sum-sum-adjacent-int", P.x.sum(name="inner").sum(), _merge_sums(False), EXACT,
         "sums over axes a and a+1 (in that order) become one sum over the merged axis"),
    Rule("sum-sum-adjacent-float", P.x.sum(name="inner").sum(), _merge_sums(True), ROUNDING,
         "the merged sum adds in a different order"),
]
