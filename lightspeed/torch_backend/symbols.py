"""PyTorch's symbolic sizes (sympy expressions over s0, s1, ...) as Lightspeed symbolic dims.

Each sympy symbol becomes one ``lightspeed.symbolic.Var`` with the same name. Its lower
bound comes from the shape environment; its upper bound is chosen by the caller (buffers
are sized from upper bounds, so a bound far above what runs would waste memory) and
grows when a larger size arrives (see runtime.py).
"""
from __future__ import annotations

from typing import Mapping

import sympy
import torch

from .. import symbolic as sym
from ..symbolic import sint

# the smallest upper bound given to a new symbol; small sizes all share one compilation
MIN_UPPER_BOUND = 64


class UnsupportedSymbolicExpr(ValueError):
    pass


def symbol_hint(shape_env, s: sympy.Symbol) -> int | None:
    """The example value PyTorch traced ``s`` with, if it knows one."""
    for table in ("backed_var_to_val", "var_to_val"):
        if not hasattr(shape_env, table):
            continue
        v = getattr(shape_env, table, {}).get(s) if shape_env is not None else None
        if v is not None:
            try:
                return int(v)
            except (TypeError, ValueError):
                pass
    return None


def symbol_range(shape_env, s: sympy.Symbol) -> tuple[int, int | None]:
    """(lower, upper) bounds the shape environment proves for ``s``; upper is None when unbounded."""
    lo, hi = 0, None
    r = getattr(shape_env, "var_to_range", {}).get(s) if shape_env is not None else None
    if r is not None:
        lo = max(_finite_int(r.lower) or 0, 0)
        hi = _finite_int(r.upper)
        if hi is not None and hi >= (1 << 62):
            hi = None
    return lo, hi


def _finite_int(v) -> int | None:
    """``v`` as an int, or None for infinities (sympy's oo, torch's int_oo) and non-numbers."""
    if getattr(v, "is_finite", True) is False or getattr(v, "is_integer", True) is False:
        return None
    try:
        return int(v)
    except Exception:  # noqa: BLE001  (int_oo and friends raise a variety of errors)
        return None


def initial_upper_bound(hint: int | None, proven_hi: int | None) -> int:
    """Room for twice the traced size, rounded up to a power of two (at least MIN_UPPER_BOUND)."""
    want = max(MIN_UPPER_BOUND, 2 * (hint or 1))
    hi = 1
    while hi < want:
        hi *= 2
    return min(hi, proven_hi) if proven_hi is not None else hi


class SymbolTable:
    """Converts sympy size expressions to Lightspeed expressions, creating one Var per symbol.

    ``upper`` maps a symbol name to the upper bound to use; symbols not listed get
    ``initial_upper_bound`` of their traced value."""

    def __init__(self, shape_env=None, upper: Mapping[str, int] | None = None):
        self.shape_env = shape_env
        self.upper = dict(upper or {})
        self.vars: dict[str, sym.Var] = {}
        self.hints: dict[str, int] = {}

    def _adopt_env(self, value) -> None:
        if self.shape_env is None and isinstance(value, torch.SymInt):
            self.shape_env = value.node.shape_env

    def var(self, s: sympy.Symbol) -> sym.Var:
        name = str(s)
        v = self.vars.get(name)
        if v is None:
            if not name.isidentifier():
                raise UnsupportedSymbolicExpr(f"symbol {name!r} is not a valid dimension name")
            if name.startswith("u"):
                raise UnsupportedSymbolicExpr(f"data-dependent size {name} (an unbacked symbol) is not supported")
            lo, proven_hi = symbol_range(self.shape_env, s)
            hint = symbol_hint(self.shape_env, s)
            hi = self.upper.get(name) or initial_upper_bound(hint, proven_hi)
            hi = max(hi, lo, hint or 0)
            v = sym.dim(name, lo, hi)
            self.vars[name] = v
            if hint is not None:
                self.hints[name] = hint
        return v

    def expr(self, e) -> sint:
        """A Lightspeed int or expression equal to sympy expression ``e``."""
        if isinstance(e, (int,)) and not isinstance(e, bool):
            return e
        if isinstance(e, sympy.Integer) or (hasattr(e, "is_Integer") and e.is_Integer):
            return int(e)
        if isinstance(e, sympy.Symbol):
            return self.var(e)
        from torch.utils._sympy import functions as F
        if isinstance(e, sympy.Add):
            out: sint = 0
            for a in e.args:
                out = sym.add(out, self.expr(a))
            return out
        if isinstance(e, sympy.Mul):
            out = 1
            for a in e.args:
                out = sym.mul(out, self.expr(a))
            return out
        if isinstance(e, (sympy.Pow, F.PowByNatural)) and e.args[1].is_Integer and int(e.args[1]) >= 0:
            base, out = self.expr(e.args[0]), 1
            for _ in range(int(e.args[1])):
                out = sym.mul(out, base)
            return out
        if isinstance(e, sympy.floor) and isinstance(e.args[0], sympy.Mul):
            # floor(x * p/q), the form plain sympy gives x // q
            coef, rest = e.args[0].as_coeff_Mul()
            if isinstance(coef, sympy.Rational) and coef.q > 1:
                return sym.floordiv(sym.mul(self.expr(rest), int(coef.p)), int(coef.q))
        if isinstance(e, F.FloorDiv):
            return sym.floordiv(self.expr(e.args[0]), self.expr(e.args[1]))
        if isinstance(e, F.CeilDiv):
            a, b = self.expr(e.args[0]), self.expr(e.args[1])
            return sym.mul(sym.floordiv(sym.mul(a, -1), b), -1)
        if isinstance(e, (F.PythonMod, F.Mod)):
            return sym.mod(self.expr(e.args[0]), self.expr(e.args[1]))
        if isinstance(e, (sympy.Max, F.Max)):
            out = self.expr(e.args[0])
            for a in e.args[1:]:
                out = sym.smax(out, self.expr(a))
            return out
        if isinstance(e, (sympy.Min, F.Min)):
            out = self.expr(e.args[0])
            for a in e.args[1:]:
                out = sym.smin(out, self.expr(a))
            return out
        raise UnsupportedSymbolicExpr(f"symbolic size expression {e} ({type(e).__name__}) is not supported")

    def size(self, s) -> sint:
        """A size that is an int, a torch.SymInt, or a sympy expression."""
        if isinstance(s, torch.SymInt):
            self._adopt_env(s)
            e = s.node.expr
            return self.expr(e)
        if isinstance(s, bool):
            raise UnsupportedSymbolicExpr(f"expected a size, got {s!r}")
        if isinstance(s, int):
            return s
        return self.expr(s)

    def shape(self, t: torch.Tensor) -> tuple[sint, ...]:
        return tuple(self.size(s) for s in t.shape)
