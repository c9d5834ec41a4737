"""Statements of one GPU kernel, with scopes, and the GPU rendering of ``lightspeed.symbolic`` expressions.

A kernel body is written as straight-line statements: every value the renderer names is a ``const`` local
declared in the innermost block that needs it, and remembered there, so a value used twice is computed
once and nothing computed under a guard (a padded view's validity, a gather's row check) or inside a loop
leaks out of it. Index expressions are rendered here rather than by ``symbolic.render``, so the GPU
dialects get their own integer type, literal suffix and floor-division helpers.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from ... import symbolic as sym
from .dialect import Dialect, int_literal

INLINE_MAX = 40  # an index expression whose text is longer than this is named (declared once)


class Emitter:
    """Lines of a kernel body, a stack of scopes and fresh local names."""

    def __init__(self, dialect: Dialect, dims: list[sym.Var], indent: int = 1, names: str = ""):
        self.dialect = dialect
        self.names = names  # a prefix of every fresh name (two emitters of one function never collide)
        self.dims = {v: f"D_{v.name}" for v in dims}
        self.lines: list[str] = []
        self.depth = indent
        self.scopes: list[dict] = [{}]
        self.count = 0

    # statements and scopes ----------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{self.names}{prefix}{self.count}"

    def lookup(self, key):
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    def remember(self, key, value) -> None:
        self.scopes[-1][key] = value

    @contextmanager
    def block(self, header: str) -> Iterator[None]:
        """``header { ... }``: what is named inside stays inside."""
        self.line(header + " {")
        self.depth += 1
        self.scopes.append({})
        try:
            yield
        finally:
            self.scopes.pop()
            self.depth -= 1
            self.line("}")

    def bind(self, v: sym.Var, name: str) -> None:
        """Loop, gather and work-item variables: ``v`` is the local ``name`` in the current scope."""
        self.remember(("var", v), name)

    def var(self, v: sym.Var) -> str:
        name = self.lookup(("var", v))
        if name is not None:
            return name
        if v in self.dims:
            return self.dims[v]
        raise ValueError(f"GPU renderer: variable {v.name!r} is not bound here")

    # symbolic expressions -----------------------------------------------------------------------------
    def literal(self, v: int) -> str:
        return int_literal(int(v), self.dialect.long_suffix)

    def sym(self, e: sym.sint) -> str:
        """Text of an integer index expression (64-bit), long subexpressions named once per scope."""
        if not isinstance(e, sym.Expr) or isinstance(e, sym.Const):
            v = int(e)
            return self.literal(v) if v >= 0 else f"({self.literal(v)})"
        if isinstance(e, sym.Var):
            return self.var(e)
        key = ("sym", e)
        got = self.lookup(key)
        if got is not None:
            return got
        text = self._sym_text(e)
        if len(text) > INLINE_MAX:
            name = self.fresh("x")
            self.line(f"const ls_i64 {name} = {text};")
            text = name
        self.remember(key, text)
        return text

    def _sym_text(self, e: sym.Expr) -> str:
        if isinstance(e, sym.Sum):
            parts = []
            for t, k in e.terms:
                s = self.sym(t)
                if k == 1:
                    parts.append(("+", s))
                elif k == -1:
                    parts.append(("-", s))
                else:
                    parts.append(("+" if k > 0 else "-", f"{s} * {self.literal(abs(k))}"))
            if e.const:
                parts.append(("+" if e.const > 0 else "-", self.literal(abs(e.const))))
            text = ("-" if parts[0][0] == "-" else "") + parts[0][1]
            for op, p in parts[1:]:
                text += f" {op} {p}"
            return f"({text})"
        if isinstance(e, sym.Prod):
            return "(" + " * ".join(self.sym(f) for f in e.factors) + ")"
        if isinstance(e, (sym.FloorDiv, sym.Mod)):
            a, b = self.sym(e.a), self.sym(e.b)
            if e.a.lo >= 0 and e.b.lo > 0:  # both non-negative: C's truncating operators are floor's
                return f"({a} {'/' if isinstance(e, sym.FloorDiv) else '%'} {b})"
            return f"{'ls_floordiv' if isinstance(e, sym.FloorDiv) else 'ls_floormod'}({a}, {b})"
        if isinstance(e, sym.Min):
            return f"ls_min({self.sym(e.a)}, {self.sym(e.b)})"
        if isinstance(e, sym.Max):
            return f"ls_max({self.sym(e.a)}, {self.sym(e.b)})"
        if isinstance(e, sym.Lt):
            return f"((ls_i64)({self.sym(e.a)} < {self.sym(e.b)}))"
        if isinstance(e, sym.And):
            return f"((ls_i64)({self.sym(e.a)} && {self.sym(e.b)}))"
        raise NotImplementedError(f"GPU renderer: symbolic {type(e).__name__}")
