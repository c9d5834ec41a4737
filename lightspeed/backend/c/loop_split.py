"""Split the innermost loop of an elementwise kernel at a constant divisor of its index arithmetic.

A copy through a permuted view (``[heads, seq, d] -> [seq, heads * d]``) or an interleaved rotation indexes
its inputs with ``j // 64`` and ``j % 64`` (or ``j // 2``, ``j % 2``) of the innermost loop variable ``j``:
evaluated per element, those divisions keep the loop from vectorising (a 512-token prefill of SmolLM2 spent
~26 ms of 1.5 s single-thread in its interleaved K rotation). Writing ``j = c * h + e`` with ``0 <= e < c``
lets the symbolic simplifier drop the divisions (``(64 h + e) // 64 = h``, ``(2 h + 1) % 2 = 1``), after which:

- ``c >= MIN_INNER``: the inner loop runs over ``e`` (contiguous, vectorised) inside a loop over ``h``;
- a smaller ``c`` (an even/odd interleave): the loop runs over ``h`` (vectorised) with the ``c`` values of
  ``e`` unrolled as constants in its body.

Only a split after which no division or modulo involves the vectorised variable is taken; otherwise the
kernel keeps its flat loop. Values are unchanged (the same expressions at the same indices).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ... import symbolic as sym
from ...kernel import ir
from ...kernel.ir import substitute
from ...ops import Op

MIN_INNER = 8  # a divisor at least this large becomes the inner (vectorised) loop; smaller ones are unrolled


def _index_exprs(x: ir.IR) -> list[sym.Expr]:
    out = []
    for y in x.walk():
        if isinstance(y, (ir.Load, ir.Bytes)):
            out.append(sym.to_expr(y.offset))
        elif isinstance(y, ir.Index):
            out.append(sym.to_expr(y.expr))
        elif isinstance(y, ir.Select):
            out.append(sym.to_expr(y.valid))
    return out


def _divmods(e: sym.Expr) -> list[sym.Expr]:
    """The floor divisions and modulos inside ``e``."""
    out, stack, seen = [], [e], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, (sym.FloorDiv, sym.Mod)):
            out.append(x)
        if isinstance(x, sym.Sum):
            stack += [t for t, _ in x.terms]
        elif isinstance(x, sym.Prod):
            stack += list(x.factors)
        elif isinstance(x, sym._Binary):
            stack += [x.a, x.b]
    return out


def _clean(exprs: list[sym.Expr], v: sym.Var) -> bool:
    """No division or modulo in ``exprs`` involves ``v``."""
    return all(v not in d.vars() for e in exprs for d in _divmods(e))


@dataclass
class Split:
    """``j = c * hi + lo``: ``unrolled`` when the loop runs over ``hi`` with the ``c`` values of ``lo`` as
    constants in its body; else over ``lo`` inside a loop over ``hi``."""
    c: int
    hi: sym.Var
    lo: sym.Var
    unrolled: bool


def split_inner(value: ir.IR, offset: sym.sint, j: sym.Var, size: sym.sint, make_var) -> Split | None:
    """How to split the innermost loop (``j`` over ``size`` elements) of a kernel computing ``value`` into
    ``offset``, or None. ``make_var(name, size)`` makes a loop variable."""
    if not sym.is_const(size) or any(isinstance(y, (ir.Reduce, ir.Gather)) for y in value.walk()):
        return None
    n = int(size)
    exprs = _index_exprs(value) + [sym.to_expr(offset)]
    divisors = set()
    for e in exprs:
        for d in _divmods(e):
            if isinstance(d.b, sym.Const) and j in d.a.vars() and 1 < d.b.value < n and n % d.b.value == 0:
                divisors.add(d.b.value)
    if not divisors or _clean(exprs, j):
        return None
    for c in sorted(divisors):
        hi, lo = make_var(f"{j.name}_hi", n // c), make_var(f"{j.name}_lo", c)
        mapping = {j: sym.add(sym.mul(hi, c), lo)}
        if c >= MIN_INNER:
            if _clean([e.substitute(mapping) for e in exprs], lo):
                return Split(c, hi, lo, unrolled=False)
        elif all(_clean([e.substitute({j: sym.add(sym.mul(hi, c), r)}) for e in exprs], hi) for r in range(c)):
            return Split(c, hi, lo, unrolled=True)
    return None


def split_reduction(x: ir.Reduce, make_var) -> ir.Reduce | None:
    """A float sum over ``v`` whose body divides ``v`` by a constant ``c`` (a quantized block index
    ``v // 32``, ``v % 32``) as a sum over blocks of a sum over ``c`` contiguous elements, or None:
    ``v = c * hi + lo`` drops the divisions, so the inner loop vectorises and the per-block loads (a
    block's scale) move out of it. Taken only when no division involves ``lo`` afterwards."""
    if x.op is not Op.SUM_REDUCE or not x.dtype.is_float or not sym.is_const(x.size):
        return None
    if any(isinstance(y, (ir.Reduce, ir.Gather)) for y in x.body.walk()):
        return None
    n, v = int(x.size), x.var
    found = block_split(x.body, v, n, make_var)
    if found is None:
        return None
    c, hi, lo, body = found
    return ir.Reduce(x.op, hi, n // c, ir.Reduce(x.op, lo, c, body, x.dtype), x.dtype)


def block_split(x: ir.IR, v: sym.Var, n: int, make_var) -> tuple[int, sym.Var, sym.Var, ir.IR] | None:
    """The largest block size ``c`` (>= MIN_INNER, dividing ``n``) by which ``x`` divides ``v``, such that with
    ``v = c * hi + lo`` no division involves ``lo``: (c, hi, lo, x rewritten over hi and lo), or None."""
    exprs = _index_exprs(x)
    divisors = {d.b.value for e in exprs for d in _divmods(e)
                if isinstance(d.b, sym.Const) and v in d.a.vars() and MIN_INNER <= d.b.value < n and n % d.b.value == 0}
    for c in sorted(divisors, reverse=True):
        hi, lo = make_var(f"{v.name}_hi", n // c), make_var(f"{v.name}_lo", c)
        body = substitute(x, {v: sym.add(sym.mul(hi, c), lo)})
        if _clean(_index_exprs(body), lo):
            return c, hi, lo, body
    return None


def split_reductions(value: ir.IR, make_var, memo: dict | None = None) -> ir.IR:
    """``value`` with every reduction ``split_reduction`` applies to split into blocks (shared operands stay
    shared; everything else is unchanged)."""
    memo = {} if memo is None else memo
    if id(value) in memo:
        return memo[id(value)]
    out = value
    if isinstance(value, ir.Reduce):
        out = split_reduction(value, make_var)
        if out is None:
            body = split_reductions(value.body, make_var, memo)
            out = value if body is value.body else replace(value, body=body)
    elif isinstance(value, ir.Alu):
        args = tuple(split_reductions(a, make_var, memo) for a in value.args)
        out = value if all(a is b for a, b in zip(args, value.args)) else replace(value, args=args)
    elif isinstance(value, (ir.Cast, ir.Select)):
        child = value.arg if isinstance(value, ir.Cast) else value.value
        new = split_reductions(child, make_var, memo)
        if new is not child:
            out = replace(value, arg=new) if isinstance(value, ir.Cast) else replace(value, value=new)
    elif isinstance(value, ir.Gather):
        index, body = split_reductions(value.index, make_var, memo), split_reductions(value.body, make_var, memo)
        if index is not value.index or body is not value.body:
            out = replace(value, index=index, body=body)
    memo[id(value)] = out
    return out


def hoist_invariants(x: ir.IR, v: sym.Var, prefix: str) -> tuple[ir.IR, list[tuple[str, ir.IR]]]:
    """``x`` with its largest arithmetic subexpressions that do not read ``v`` replaced by ``ir.Bound``
    names, and the (name, subexpression) pairs to compute before a loop over ``v``. Only operands the C
    text always evaluates are hoisted (nothing under a select, gather, reduction, integer modulo or a
    product with a bool), so hoisting never evaluates anything the loop would not."""
    hoisted: list[tuple[str, ir.IR]] = []
    memo: dict[int, ir.IR] = {}

    def visit(y: ir.IR) -> ir.IR:
        if id(y) in memo:
            return memo[id(y)]
        out = y
        if isinstance(y, (ir.Alu, ir.Cast, ir.Bytes)) and v not in ir.ir_vars(y) and y.dtype.is_float:
            name = f"{prefix}{len(hoisted)}"
            hoisted.append((name, y))
            out = ir.Bound(name, y.dtype)
        elif isinstance(y, ir.Alu) and not _conditional(y):
            args = tuple(visit(a) for a in y.args)
            out = y if all(a is b for a, b in zip(args, y.args)) else replace(y, args=args)
        elif isinstance(y, ir.Cast):
            arg = visit(y.arg)
            out = y if arg is y.arg else replace(y, arg=arg)
        memo[id(y)] = out
        return out
    return visit(x), hoisted


def _conditional(x: ir.Alu) -> bool:
    """Whether the C text evaluates an operand of ``x`` only under a condition (see render.operands)."""
    bools = [a.dtype.kind == "b" for a in x.args]
    return (x.op is Op.MOD and not x.dtype.is_float) or (x.op is Op.MUL and bools[0] != bools[1])
