"""Index arithmetic for attention proofs: a view's element index, with one extra division rule.

Flattening batch x heads (PyTorch's bmm over ``[B*H, S, S]``) makes the score element's index an
unravelled offset such as ``(4096*b + 64*i + j) // 16384`` for a ``[B, H, S, S]`` node read as
``[B*H, S, S]``. With ``0 <= 64*i + j < 4096`` that is ``b // 4``; the general simplifier does not apply
this rule (taken back there: over expression-sized axes it made kernel formation run out of memory), so
the attention matcher applies it to the few indices it proves things about, once per division.

The rule: if ``a = big + small`` where ``g`` divides every coefficient of ``big`` and the divisor ``d``,
and ``0 <= small < g`` is proven by bounds, then ``a // d = (big / g) // (d / g)`` and
``a % d = g * ((big / g) % (d / g)) + small``.
"""
from __future__ import annotations

import math

from .. import symbolic as sym
from ..graph import Node
from ..shape import ShapeTracker, unravel


def _split(a: sym.Expr, d: int):
    """(big / g, small, g) for the largest g that splits ``a`` (a Sum) against divisor ``d``, or None."""
    if not isinstance(a, sym.Sum) or d <= 1:
        return None
    for g in sorted({math.gcd(k, d) for _, k in a.terms} - {1}, reverse=True):
        big: sym.sint = a.const // g
        small: sym.sint = a.const % g
        for t, k in a.terms:
            if k % g == 0:
                big = sym.add(big, sym.mul(t, k // g))
            else:
                small = sym.add(small, sym.mul(t, k))
        s = sym.to_expr(small)
        if s.lo >= 0 and s.hi < g:
            return big, small, g
    return None


def tidy(e: sym.sint) -> sym.sint:
    """``e`` with the rule of the module docstring applied to its divisions and modulos by constants."""
    if not isinstance(e, sym.Expr):
        return e
    if isinstance(e, (sym.FloorDiv, sym.Mod)) and isinstance(e.b, sym.Const) and e.b.value > 1:
        a = tidy(e.a)
        d = e.b.value
        split = _split(sym.to_expr(a), d)
        if split is None:
            return sym.floordiv(a, d) if isinstance(e, sym.FloorDiv) else sym.mod(a, d)
        big, small, g = split
        if isinstance(e, sym.FloorDiv):
            return sym.floordiv(big, d // g)
        return sym.add(sym.mul(sym.mod(big, d // g), g), small)
    if isinstance(e, sym.Sum):
        out: sym.sint = e.const
        for t, k in e.terms:
            out = sym.add(out, sym.mul(tidy(t), k))
        return out
    return e


def index_through(st: ShapeTracker, idx, src: Node):
    """The element of ``src`` that view ``st`` reads at index ``idx``, or None where the view may pad."""
    off, valid = st.index(idx)
    if not sym.same(valid, 1):
        return None
    return [tidy(x) for x in unravel(off, src.shape)]
