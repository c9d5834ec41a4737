"""Integer expressions for dimensions and indices.

An expression is built from constants, named variables with bounds, and
``+ - * // % min max <`` and logical and. Expressions are immutable, hashable
and kept in a canonical form by their constructors, so structurally equal
expressions compare equal. ``//`` and ``%`` follow Python's floor semantics;
the C renderer falls back to floor helpers where an operand may be negative.

The canonical form is a sum of ``coef * term`` plus a constant, where a term is
a variable, a product of terms, or one of the non-linear nodes (FloorDiv, Mod,
Min, Max, Lt, And). Simplification uses the numeric bounds of every variable,
and for loop variables whose upper bound is itself an expression (``i < seq``)
a symbolic bound, so that ``(i*64 + j) // 64`` becomes ``i`` when ``j < 64``.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Union

import numpy as np

BIG = 1 << 62


class Expr:
    """Base class of all integer expressions."""

    __slots__ = ("key", "_hash", "lo", "hi", "_sk", "_vars")

    def __init__(self, key: tuple, lo: int, hi: int):
        self.key = key  # holds child expressions themselves: their hashes are cached, so this is O(children)
        self._hash = hash(key)
        self._sk: str | None = None
        self._vars: frozenset | None = None
        self.lo = lo
        self.hi = hi

    # structural identity -------------------------------------------------
    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int) and not isinstance(other, bool):
            return isinstance(self, Const) and self.value == other
        return isinstance(other, Expr) and self._hash == other._hash and self.key == other.key

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def sort_key(self) -> str:
        """A total order for canonical forms, built once per node from the children's keys."""
        if self._sk is None:
            self._sk = self._make_sort_key()
        return self._sk

    def _make_sort_key(self) -> str:
        raise NotImplementedError

    # arithmetic ------------------------------------------------------------
    def __add__(self, o): return add(self, o)
    def __radd__(self, o): return add(o, self)
    def __sub__(self, o): return add(self, mul(o, -1))
    def __rsub__(self, o): return add(o, mul(self, -1))
    def __mul__(self, o): return mul(self, o)
    def __rmul__(self, o): return mul(o, self)
    def __floordiv__(self, o): return floordiv(self, o)
    def __rfloordiv__(self, o): return floordiv(o, self)
    def __mod__(self, o): return mod(self, o)
    def __rmod__(self, o): return mod(o, self)
    def __neg__(self): return mul(self, -1)
    def __lt__(self, o): return lt(self, o)
    def __gt__(self, o): return lt(o, self)
    def __le__(self, o): return lt(self, add(o, 1))
    def __ge__(self, o): return lt(o, add(self, 1))
    def __and__(self, o): return logical_and(self, o)
    def __rand__(self, o): return logical_and(o, self)

    def __int__(self) -> int:
        if isinstance(self, Const):
            return self.value
        raise TypeError(f"symbolic expression {self} has no fixed integer value")

    def __index__(self) -> int:
        return int(self)

    def __bool__(self) -> bool:
        raise TypeError(f"the truth value of symbolic expression {self} is unknown; use == for identity")

    def __repr__(self) -> str:
        return self.render()

    # interface ---------------------------------------------------------------
    def vars(self) -> frozenset["Var"]:
        """The variables this expression mentions (cached per node)."""
        if self._vars is None:
            self._vars = _free_vars_of(self)
        return self._vars

    def eval(self, env: Mapping[str, object]):
        """Evaluate with variable values from ``env`` (ints or numpy integer arrays)."""
        raise NotImplementedError

    def render(self, name: Callable[["Var"], str] | None = None, c: bool = False) -> str:
        """Render as Python-like text, or as C (``c=True``) using int64 arithmetic."""
        raise NotImplementedError

    def substitute(self, mapping: Mapping["Var", "sint"]) -> "Expr":
        raise NotImplementedError


sint = Union[int, Expr]


class Const(Expr):
    __slots__ = ("value",)

    def __init__(self, value: int):
        self.value = int(value)
        super().__init__(("c", self.value), self.value, self.value)

    def _make_sort_key(self) -> str:
        return f"c{self.value}"

    def eval(self, env):
        return self.value

    def render(self, name=None, c=False):
        return f"{self.value}LL" if c and abs(self.value) > 2**31 - 1 else str(self.value)

    def substitute(self, mapping):
        return self


class Var(Expr):
    """A named integer variable with inclusive bounds ``lo <= v <= hi``.

    ``hi_expr`` optionally gives a symbolic inclusive upper bound (for loop
    variables over symbolic ranges); ``hi`` is then its numeric maximum.
    """

    __slots__ = ("name", "hi_expr")

    def __init__(self, name: str, lo: int, hi: int, hi_expr: Expr | None = None):
        if lo > hi:
            raise ValueError(f"variable {name!r}: lower bound {lo} exceeds upper bound {hi}")
        self.name = name
        # a loop variable always has hi_expr (a Const for a fixed range); a dimension has none
        self.hi_expr = hi_expr if isinstance(hi_expr, Expr) else None
        super().__init__(("v", name, int(lo), int(hi), self.hi_expr), int(lo), int(hi))

    def _make_sort_key(self) -> str:
        hi = self.hi_expr.sort_key() if self.hi_expr is not None else ""
        return f"v{self.name}:{self.lo}:{self.hi}:{hi}"

    def eval(self, env):
        try:
            return env[self.name]
        except KeyError:
            raise ValueError(f"symbolic dimension {self.name!r} has no value") from None

    def render(self, name=None, c=False):
        return name(self) if name is not None else self.name

    def substitute(self, mapping):
        return to_expr(mapping[self]) if self in mapping else self


class Sum(Expr):
    __slots__ = ("terms", "const")

    def __init__(self, terms: tuple[tuple[Expr, int], ...], const: int):
        self.terms = terms
        self.const = const
        lo = hi = const
        for t, k in terms:
            a, b = t.lo * k, t.hi * k
            lo += min(a, b)
            hi += max(a, b)
        if any(isinstance(t, Prod) for t, _ in terms):
            lo, hi = _multilinear_bounds(terms, const, lo, hi)
        super().__init__(("+", terms, const), _clip(lo), _clip(hi))

    def _make_sort_key(self) -> str:
        return "+(" + ",".join(f"{t.sort_key()}*{k}" for t, k in self.terms) + f",{self.const})"

    def eval(self, env):
        out = self.const
        for t, k in self.terms:
            out = out + t.eval(env) * k
        return out

    def render(self, name=None, c=False):
        parts = []
        for t, k in self.terms:
            s = t.render(name, c)
            if k == 1:
                parts.append(s)
            elif k > 0:
                parts.append(f"{s}*{Const(k).render(name, c)}")
            else:
                parts.append(f"-{s}" if k == -1 else f"{s}*({Const(k).render(name, c)})")
        if self.const:
            parts.append(Const(self.const).render(name, c))
        text = parts[0]
        for p in parts[1:]:
            text += f"-{p[1:]}" if p.startswith("-") else f"+{p}"
        return f"({text})"

    def substitute(self, mapping):
        out: sint = self.const
        for t, k in self.terms:
            out = add(out, mul(t.substitute(mapping), k))
        return to_expr(out)


def _multilinear_bounds(terms, const: int, lo: int, hi: int, max_atoms: int = 8) -> tuple[int, int]:
    """Tighter bounds for a sum of products, e.g. ``a*b - 2*a`` (a product of sizes after a pad).

    Term by term interval arithmetic forgets that the terms share factors. Where every term is a
    product of distinct atoms, the sum is multilinear in them and its extremes over the box of the
    atoms' bounds lie at the box's corners, so evaluating the corners gives exact bounds (sound even
    where atoms are correlated: the box contains every reachable combination).
    """
    atoms: dict[Expr, int] = {}
    for t, _ in terms:
        fs = t.factors if isinstance(t, Prod) else (t,)
        if len(set(fs)) != len(fs):
            return lo, hi  # a square: not multilinear
        for f in fs:
            atoms.setdefault(f, len(atoms))
    if len(atoms) > max_atoms or any(abs(a.lo) >= BIG or abs(a.hi) >= BIG for a in atoms):
        return lo, hi
    corner_lo, corner_hi = None, None
    for mask in range(1 << len(atoms)):
        val = {a: (a.hi if mask >> k & 1 else a.lo) for a, k in atoms.items()}
        total = const
        for t, c in terms:
            p = c
            for f in (t.factors if isinstance(t, Prod) else (t,)):
                p *= val[f]
            total += p
        corner_lo = total if corner_lo is None else min(corner_lo, total)
        corner_hi = total if corner_hi is None else max(corner_hi, total)
    return max(lo, corner_lo), min(hi, corner_hi)


class Prod(Expr):
    __slots__ = ("factors",)

    def __init__(self, factors: tuple[Expr, ...]):
        self.factors = factors
        lo, hi = factors[0].lo, factors[0].hi
        for f in factors[1:]:
            cands = [lo * f.lo, lo * f.hi, hi * f.lo, hi * f.hi]
            lo, hi = min(cands), max(cands)
        super().__init__(("*", factors), _clip(lo), _clip(hi))

    def _make_sort_key(self) -> str:
        return "*(" + ",".join(f.sort_key() for f in self.factors) + ")"

    def eval(self, env):
        out = 1
        for f in self.factors:
            out = out * f.eval(env)
        return out

    def render(self, name=None, c=False):
        return "(" + "*".join(f.render(name, c) for f in self.factors) + ")"

    def substitute(self, mapping):
        out: sint = 1
        for f in self.factors:
            out = mul(out, f.substitute(mapping))
        return to_expr(out)


class _Binary(Expr):
    __slots__ = ("a", "b")
    tag = "?"

    def __init__(self, a: Expr, b: Expr, lo: int, hi: int):
        self.a, self.b = a, b
        super().__init__((self.tag, a, b), _clip(lo), _clip(hi))

    def substitute(self, mapping):
        return type(self).build(self.a.substitute(mapping), self.b.substitute(mapping))

    def _make_sort_key(self) -> str:
        return f"{self.tag}({self.a.sort_key()},{self.b.sort_key()})"


class FloorDiv(_Binary):
    tag = "//"
    build = staticmethod(lambda a, b: floordiv(a, b))

    def eval(self, env):
        return self.a.eval(env) // self.b.eval(env)

    def render(self, name=None, c=False):
        a, b = self.a.render(name, c), self.b.render(name, c)
        if c and (self.a.lo < 0 or self.b.lo <= 0):
            return f"ls_floordiv({a}, {b})"
        return f"({a}/{b})" if c else f"({a}//{b})"


class Mod(_Binary):
    tag = "%"
    build = staticmethod(lambda a, b: mod(a, b))

    def eval(self, env):
        return self.a.eval(env) % self.b.eval(env)

    def render(self, name=None, c=False):
        a, b = self.a.render(name, c), self.b.render(name, c)
        if c and (self.a.lo < 0 or self.b.lo <= 0):
            return f"ls_floormod({a}, {b})"
        return f"({a}%{b})"


class Min(_Binary):
    tag = "min"
    build = staticmethod(lambda a, b: smin(a, b))

    def eval(self, env):
        a, b = self.a.eval(env), self.b.eval(env)
        return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)

    def render(self, name=None, c=False):
        a, b = self.a.render(name, c), self.b.render(name, c)
        return f"ls_min({a}, {b})" if c else f"min({a}, {b})"


class Max(_Binary):
    tag = "max"
    build = staticmethod(lambda a, b: smax(a, b))

    def eval(self, env):
        a, b = self.a.eval(env), self.b.eval(env)
        return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)

    def render(self, name=None, c=False):
        a, b = self.a.render(name, c), self.b.render(name, c)
        return f"ls_max({a}, {b})" if c else f"max({a}, {b})"


class Lt(_Binary):
    """1 if a < b else 0."""
    tag = "<"
    build = staticmethod(lambda a, b: lt(a, b))

    def eval(self, env):
        r = self.a.eval(env) < self.b.eval(env)
        return r.astype(np.int64) if isinstance(r, np.ndarray) else int(r)

    def render(self, name=None, c=False):
        return f"({self.a.render(name, c)}<{self.b.render(name, c)})"


class And(_Binary):
    """1 if both a and b are non-zero else 0."""
    tag = "&&"
    build = staticmethod(lambda a, b: logical_and(a, b))

    def eval(self, env):
        a, b = self.a.eval(env), self.b.eval(env)
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return ((np.asarray(a) != 0) & (np.asarray(b) != 0)).astype(np.int64)
        return int(bool(a) and bool(b))

    def render(self, name=None, c=False):
        op = "&&" if c else " and "
        return f"({self.a.render(name, c)}{op}{self.b.render(name, c)})"


# --------------------------------------------------------------------------
# construction and simplification


def _clip(v: int) -> int:
    return max(-BIG, min(BIG, v))


def to_expr(x: sint) -> Expr:
    if isinstance(x, Expr):
        return x
    if type(x) is int:
        return Const(x)
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return Const(int(x))
    if isinstance(x, bool):
        return Const(int(x))
    raise TypeError(f"expected an int or a symbolic expression, got {type(x).__name__}")


def _simplest(x: Expr) -> sint:
    """Return a Python int for constants, else the expression."""
    return x.value if isinstance(x, Const) else x


def _as_sum(x: Expr) -> tuple[dict[Expr, int], int]:
    if isinstance(x, Const):
        return {}, x.value
    if isinstance(x, Sum):
        return dict(x.terms), x.const
    return {x: 1}, 0


def _make_sum(terms: Mapping[Expr, int], const: int) -> Expr:
    items = [(t, k) for t, k in terms.items() if k != 0]
    items = _fold_divmod_pairs(items)
    if not items:
        return Const(const)
    if len(items) == 1 and items[0][1] == 1 and const == 0:
        return items[0][0]
    items.sort(key=lambda tk: tk[0].sort_key())
    return Sum(tuple(items), const)


def _fold_divmod_pairs(items: list[tuple[Expr, int]]) -> list[tuple[Expr, int]]:
    """k*(x % c) + k*c*(x // c)  ->  k*x  (undoing an unravel)."""
    mods = [(t, k) for t, k in items if isinstance(t, Mod) and isinstance(t.b, Const)]
    if not mods:
        return items
    coef = dict(items)
    changed = False
    for t, k in mods:
        partner = FloorDiv(t.a, t.b, 0, 0)  # bounds are not part of the key
        if coef.get(t) == k and coef.get(partner) == k * t.b.value:
            del coef[t], coef[partner]
            extra, c0 = _as_sum(t.a)
            if c0:
                return items  # keep it simple: only fold pure terms
            for e, ke in extra.items():
                coef[e] = coef.get(e, 0) + ke * k
            changed = True
    if not changed:
        return items
    return [(t, k) for t, k in coef.items() if k != 0]


def add(a: sint, b: sint) -> sint:
    if type(a) is int and type(b) is int:  # the common case (static shapes) needs no Const objects
        return a + b
    a, b = to_expr(a), to_expr(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return a.value + b.value
    ta, ca = _as_sum(a)
    tb, cb = _as_sum(b)
    for t, k in tb.items():
        ta[t] = ta.get(t, 0) + k
    return _simplest(_make_sum(ta, ca + cb))


def _factors(x: Expr) -> list[Expr]:
    return list(x.factors) if isinstance(x, Prod) else [x]


def _mul_terms(x: Expr, y: Expr) -> Expr:
    fs = _factors(x) + _factors(y)
    fs.sort(key=lambda f: f.sort_key())
    return Prod(tuple(fs))


def mul(a: sint, b: sint) -> sint:
    if type(a) is int and type(b) is int:
        return a * b
    a, b = to_expr(a), to_expr(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return a.value * b.value
    if isinstance(b, Const):
        a, b = b, a
    if isinstance(a, Const):
        if a.value == 0:
            return 0
        tb, cb = _as_sum(b)
        return _simplest(_make_sum({t: k * a.value for t, k in tb.items()}, cb * a.value))
    ta, ca = _as_sum(a)
    tb, cb = _as_sum(b)
    out: dict[Expr, int] = {}
    for t, k in ta.items():
        if cb:
            out[t] = out.get(t, 0) + k * cb
        for u, m in tb.items():
            p = _mul_terms(t, u)
            out[p] = out.get(p, 0) + k * m
    if ca:
        for u, m in tb.items():
            out[u] = out.get(u, 0) + m * ca
    return _simplest(_make_sum(out, ca * cb))


def _monomial(x: Expr) -> tuple[int, tuple[Expr, ...]] | None:
    """x as coef * product of factors, if it is a single term."""
    if isinstance(x, Const):
        return x.value, ()
    if isinstance(x, Sum):
        if len(x.terms) == 1 and x.const == 0:
            t, k = x.terms[0]
            return k, tuple(_factors(t))
        return None
    return 1, tuple(_factors(x))


def _divide_monomial(term: Expr, coef: int, d: tuple[int, tuple[Expr, ...]]) -> sint | None:
    """coef*term / d if it divides exactly, else None."""
    dc, dfs = d
    if dc == 0 or coef % dc:
        return None
    fs = _factors(term)
    for f in dfs:
        if f in fs:
            fs.remove(f)
        else:
            return None
    q: sint = coef // dc
    for f in fs:
        q = mul(q, f)
    return q


def sym_upper(x: Expr) -> sint:
    """A symbolic inclusive upper bound of x, using loop variables' symbolic bounds."""
    if isinstance(x, Var):
        # a loop variable is below its symbolic bound; a dimension is its own best bound
        return x.hi_expr if x.hi_expr is not None else x
    if isinstance(x, Sum):
        out: sint = x.const
        for t, k in x.terms:
            out = add(out, mul(sym_upper(t) if k > 0 else sym_lower(t), k))
        return out
    if isinstance(x, Mod) and x.b.lo > 0:  # floor modulo by a positive divisor is below the divisor
        return add(x.b, -1) if not isinstance(x.b, Const) else min(x.hi, x.b.value - 1)
    if isinstance(x, FloorDiv) and isinstance(x.b, Const) and x.b.value > 0:  # non-decreasing in the dividend
        return floordiv(sym_upper(x.a), x.b.value)
    if isinstance(x, Prod) and all(f.lo >= 0 for f in x.factors):
        out = 1
        for f in x.factors:
            out = mul(out, sym_upper(f))
        return out
    if _loop_invariant(x):  # e.g. min(pos+seq, ctx): fixed while a kernel runs, its own best bound
        return x
    return x.hi


def _loop_invariant(x: Expr) -> bool:
    """True if ``x`` is a min or max of dimensions only (no loop variable)."""
    if not isinstance(x, (Min, Max)):
        return False
    fv = free_vars(x)
    return bool(fv) and all(v.hi_expr is None for v in fv)


def sym_lower(x: Expr) -> sint:
    if isinstance(x, Sum):
        out: sint = x.const
        for t, k in x.terms:
            out = add(out, mul(sym_lower(t) if k > 0 else sym_upper(t), k))
        return out
    if isinstance(x, Var) and x.hi_expr is None:
        return x  # a dimension is its own best bound
    if isinstance(x, Prod) and all(f.lo >= 0 for f in x.factors):
        out = 1
        for f in x.factors:
            out = mul(out, sym_lower(f))
        return out
    if _loop_invariant(x):
        return x
    return x.lo


def proven_lt(a: sint, b: sint) -> bool:
    """True if a < b holds for every value of the variables (a sound, incomplete test)."""
    a, b = to_expr(a), to_expr(b)
    if a.hi < b.lo or to_expr(add(b, mul(a, -1))).lo > 0:
        return True
    diff = to_expr(add(b, mul(sym_upper(a), -1)))
    return diff.lo > 0


def proven_ge(a: sint, b: sint) -> bool:
    """True if a >= b always."""
    a, b = to_expr(a), to_expr(b)
    if a.lo >= b.hi or to_expr(add(a, mul(b, -1))).lo >= 0:
        return True
    if isinstance(b, Min) and (proven_ge(a, b.a) or proven_ge(a, b.b)):  # x >= min(x, y)
        return True
    if isinstance(a, Max) and (proven_ge(a.a, b) or proven_ge(a.b, b)):  # max(x, y) >= x
        return True
    diff = to_expr(add(a, mul(sym_upper(b), -1)))
    return diff.lo >= 0


def sym_is_zero(x: sint) -> bool:
    return isinstance(x, int) and x == 0 or isinstance(x, Const) and x.value == 0


def _poly_divmod(a: Expr, d: "Sum") -> tuple[sint, sint]:
    """(q, r) with a == q*d + r exactly: multivariate division by the leading term of ``d`` (terms of
    ``a`` whose monomial is a multiple of it move into the quotient; coefficients must divide).
    Identical factors commute, but a graded order alone does not bound the steps for every input,
    so the loop is capped; the identity a == q*d + r holds after any number of steps."""
    # the leading term in a graded order (most factors first): each step cancels a term of ``a`` and
    # only introduces terms of lower degree, so the division terminates
    lead_t, lead_k = max(d.terms, key=lambda tk: (len(_factors(tk[0])), tk[0].sort_key()))
    lead = (lead_k, tuple(_factors(lead_t)))
    q: sint = 0
    r: sint = a
    for _ in range(32):
        terms, _ = _as_sum(to_expr(r))
        for t, k in terms.items():
            qt = _divide_monomial(t, k, lead)
            if qt is not None:
                q = add(q, qt)
                r = add(r, mul(mul(qt, -1), d))
                break
        else:
            break
    return q, r


def floordiv(a: sint, b: sint) -> sint:
    if type(a) is int and type(b) is int and b != 0:
        return a // b
    a, b = to_expr(a), to_expr(b)
    if isinstance(b, Const):
        if b.value == 0:
            raise ZeroDivisionError(f"symbolic division of {a} by zero")
        if b.value == 1:
            return _simplest(a)
        if isinstance(a, Const):
            return a.value // b.value
        if b.value < 0:
            return FloorDiv(a, b, -BIG, BIG)
    if isinstance(a, Const) and a.value == 0:
        return 0
    if a == b:
        return 1
    if isinstance(b, Sum) and _monomial(b) is None and b.lo > 0:
        q, r = _poly_divmod(a, b)
        if proven_ge(r, 0) and proven_lt(r, b):
            return q
        if not sym_is_zero(q):  # a node, not floordiv(r, b): dividing r again need not terminate
            r = to_expr(r)
            return add(q, _simplest(FloorDiv(r, b, *_div_bounds(r, b))))
    dm = _monomial(b)
    if dm is not None and dm[0] > 0 and b.lo > 0:
        terms, const = _as_sum(a)
        quotient: sint = 0
        rest: dict[Expr, int] = {}
        for t, k in terms.items():
            q = _divide_monomial(t, k, dm)
            if q is None:
                rest[t] = k
            else:
                quotient = add(quotient, q)
        if not dm[1] and const:
            quotient = add(quotient, const // dm[0])
            const = const % dm[0]
        r = _make_sum(rest, const)
        if isinstance(r, Const) and not dm[1]:
            return add(quotient, r.value // dm[0])
        if proven_ge(r, 0) and proven_lt(r, b):
            return quotient
        # (x // c1) // c2 = x // (c1*c2)
        if isinstance(r, FloorDiv) and isinstance(r.b, Const) and r.b.value > 0 and not dm[1]:
            return add(quotient, floordiv(r.a, r.b.value * dm[0]))
        # divide out a common factor: (6x + 3) // 9 -> (2x + 1) // 3
        if not dm[1]:
            g = dm[0]
            for k in list(rest.values()) + ([const] if const else []):
                g = math.gcd(g, k)
            if g > 1:
                r2 = _make_sum({t: k // g for t, k in rest.items()}, const // g)
                return add(quotient, floordiv(r2, dm[0] // g))
        if r.lo >= 0 and isinstance(b, Const) and r.lo // b.value == r.hi // b.value:
            return add(quotient, r.lo // b.value)
        if not dm[1]:
            reduced = _reduce_coefficients(r, dm[0])
            if reduced is not None:  # (c*q + s) // c = q when 0 <= s < c, s the coefficients' residues
                return add(quotient, reduced[0])
            split = _split_by_factor(r, dm[0])
            if split is not None:  # (g*q + s) // (g*e) = q // e when 0 <= s < g
                g, q, _ = split
                return add(quotient, floordiv(q, dm[0] // g))
        else:
            split = _split_by_dims(r, dm)
            if split is not None:  # (G*q + s) // (G*e) = q // e when 0 <= s < G, G a multiple of dims
                c, q, _ = split
                return add(quotient, floordiv(q, dm[0] // c))
        if quotient != 0:
            return add(quotient, floordiv(r, b))
        a = r
    return _simplest(FloorDiv(a, b, *_div_bounds(a, b)))


def _reduce_coefficients(a: Expr, c: int) -> tuple[sint, sint] | None:
    """(q, s) with a == c*q + s and 0 <= s < c proven, s made of each coefficient's residue modulo c (the
    non-negative residues, else the ones nearest zero); None when neither is proven in range. A padded
    image's row ``(kh*67 + oh) % 66`` (a view of a 66-wide buffer read 67 apart) is ``kh + oh``."""
    terms, const = _as_sum(a)
    if not terms or all(abs(k) < c for k in terms.values()):
        return None
    for balanced in (False, True):
        q_terms, s_terms = {}, {}
        for t, k in terms.items():
            r = k % c
            if balanced and 2 * r > c:
                r -= c
            if (k - r) // c:
                q_terms[t] = (k - r) // c
            if r:
                s_terms[t] = r
        small = _make_sum(s_terms, const % c)
        if proven_ge(small, 0) and proven_lt(small, c):
            return _make_sum(q_terms, const // c), small
    return None


def _split_by_factor(a: Expr, d: int) -> tuple[int, sint, sint] | None:
    """(g, q, s) with a == g*q + s, g a proper divisor of ``d`` greater than 1 and 0 <= s < g proven:
    the terms whose coefficients g divides form g*q, the rest (and the constant) s. The largest such g.
    An unfolded convolution's flat index ``m*27 + k`` (k < 27) over 1728 is the case in point."""
    terms, const = _as_sum(a)
    if len(terms) < 2 and not const:
        return None
    best = None
    for k in set(terms.values()):
        g = math.gcd(abs(k), d)
        if g <= 1 or g == d or (best is not None and g <= best[0]):
            continue
        big = {t: c // g for t, c in terms.items() if c % g == 0}
        small = _make_sum({t: c for t, c in terms.items() if c % g}, const % g)
        if not big or not (proven_ge(small, 0) and proven_lt(small, g)):
            continue
        best = (g, _make_sum(big, const // g), _simplest(to_expr(small)) if not isinstance(small, int) else small)
    return best


def _split_by_dims(a: Expr, d: tuple[int, tuple[Expr, ...]]) -> tuple[int, sint, sint] | None:
    """(c, q, s) with a == G*q + s, G = c * (the product of d's symbolic factors), c a divisor of d's
    coefficient and 0 <= s < G proven: the terms G divides form G*q, the rest s; the largest such c. A row of
    an expanded view reshaped to rows x keys, keys a symbolic extent: ``(keys*i + j) // (keys*3)`` is
    ``i // 3`` for the key index j < keys."""
    coef, factors = d
    dims = prod(factors)
    if coef <= 0 or to_expr(dims).lo <= 0:
        return None
    terms, const = _as_sum(a)
    for c in sorted((c for c in range(1, coef + 1) if coef % c == 0), reverse=True):
        big: sint = 0
        small: dict[Expr, int] = {}
        for t, k in terms.items():
            q = _divide_monomial(t, k, (c, factors))
            if q is None:
                small[t] = k
            else:
                big = add(big, q)
        if sym_is_zero(big):
            continue
        rest = _make_sum(small, const)
        if proven_ge(rest, 0) and proven_lt(rest, mul(dims, c)):
            return c, big, (_simplest(to_expr(rest)) if not isinstance(rest, int) else rest)
    return None


def _div_bounds(a: Expr, b: Expr) -> tuple[int, int]:
    if b.lo > 0:
        cands = [a.lo // b.lo, a.lo // b.hi, a.hi // b.lo, a.hi // b.hi]
        return min(cands), max(cands)
    return -BIG, BIG


def mod(a: sint, b: sint) -> sint:
    if type(a) is int and type(b) is int and b != 0:
        return a % b
    a, b = to_expr(a), to_expr(b)
    if isinstance(b, Const):
        if b.value == 0:
            raise ZeroDivisionError(f"symbolic modulo of {a} by zero")
        if b.value in (1, -1):
            return 0
        if isinstance(a, Const):
            return a.value % b.value
    if a == b:
        return 0
    if isinstance(b, Sum) and _monomial(b) is None and b.lo > 0:
        q, r = _poly_divmod(a, b)
        if proven_ge(r, 0) and proven_lt(r, b):
            return _simplest(r)
        if not sym_is_zero(q):  # a node, not mod(r, b): dividing r again need not terminate
            return Mod(to_expr(r), b, 0, b.hi - 1)
    dm = _monomial(b)
    if dm is not None and dm[0] > 0 and b.lo > 0:
        terms, const = _as_sum(a)
        rest = {t: k for t, k in terms.items() if _divide_monomial(t, k, dm) is None}
        if not dm[1]:
            const = const % dm[0]
        if len(rest) != len(terms) or (not dm[1] and const != _as_sum(a)[1]):
            return mod(_make_sum(rest, const), b)
        if proven_ge(a, 0) and proven_lt(a, b):
            return _simplest(a)
        # (x % (c*k)) % c -> x % c
        if isinstance(a, Mod) and isinstance(a.b, Const) and not dm[1] and a.b.value % dm[0] == 0:
            return mod(a.a, b)
        if isinstance(b, Const) and a.lo >= 0 and a.lo // b.value == a.hi // b.value:
            return add(a, -(a.lo // b.value) * b.value)
        if not dm[1]:
            reduced = _reduce_coefficients(a, dm[0])
            if reduced is not None:  # (c*q + s) % c = s when 0 <= s < c
                return reduced[1]
            split = _split_by_factor(a, dm[0])
            if split is not None:  # (g*q + s) % (g*e) = g*(q % e) + s when 0 <= s < g
                g, q, small = split
                return add(mul(mod(q, dm[0] // g), g), small)
        else:
            split = _split_by_dims(a, dm)
            if split is not None:  # (G*q + s) % (G*e) = G*(q % e) + s when 0 <= s < G
                c, q, small = split
                return add(mul(mod(q, dm[0] // c), mul(prod(dm[1]), c)), small)
    if b.lo > 0:
        lo, hi = (0, b.hi - 1) if a.lo < 0 else (0, min(a.hi, b.hi - 1))
    elif b.hi < 0:  # floor modulo takes the divisor's sign
        lo, hi = b.lo + 1, 0
    else:
        lo, hi = -BIG, BIG
    return _simplest(Mod(a, b, lo, hi))


def smin(a: sint, b: sint) -> sint:
    if type(a) is int and type(b) is int:
        return min(a, b)
    a, b = to_expr(a), to_expr(b)
    if a == b:
        return _simplest(a)
    if a.hi <= b.lo or proven_ge(b, a):
        return _simplest(a)
    if b.hi <= a.lo or proven_ge(a, b):
        return _simplest(b)
    if b.sort_key() < a.sort_key():
        a, b = b, a
    return Min(a, b, min(a.lo, b.lo), min(a.hi, b.hi))


def smax(a: sint, b: sint) -> sint:
    if type(a) is int and type(b) is int:
        return max(a, b)
    a, b = to_expr(a), to_expr(b)
    if a == b:
        return _simplest(a)
    if a.hi <= b.lo or proven_ge(b, a):
        return _simplest(b)
    if b.hi <= a.lo or proven_ge(a, b):
        return _simplest(a)
    if b.sort_key() < a.sort_key():
        a, b = b, a
    return Max(a, b, max(a.lo, b.lo), max(a.hi, b.hi))


def lt(a: sint, b: sint) -> sint:
    if type(a) is int and type(b) is int:
        return int(a < b)
    a, b = to_expr(a), to_expr(b)
    if proven_lt(a, b):
        return 1
    if proven_ge(a, b):
        return 0
    return Lt(a, b, 0, 1)


def logical_and(a: sint, b: sint) -> sint:
    a, b = to_expr(a), to_expr(b)
    if isinstance(a, Const):
        return 0 if a.value == 0 else _simplest(_bool(b))
    if isinstance(b, Const):
        return 0 if b.value == 0 else _simplest(_bool(a))
    if a == b:
        return _simplest(_bool(a))  # x and x is 0 or 1, not x
    if b.sort_key() < a.sort_key():
        a, b = b, a
    return And(a, b, 0, 1)


def _bool(x: Expr) -> Expr:
    if isinstance(x, (Lt, And)) or (x.lo >= 0 and x.hi <= 1):
        return x
    return to_expr(lt(0, x)) if x.lo >= 0 else And(x, Const(1), 0, 1)


def _free_vars_of(x: Expr) -> frozenset:
    if isinstance(x, Var):
        return frozenset([x]) | (x.hi_expr.vars() if x.hi_expr is not None else frozenset())
    if isinstance(x, Sum):
        children = [t for t, _ in x.terms]
    elif isinstance(x, Prod):
        children = list(x.factors)
    elif isinstance(x, _Binary):
        children = [x.a, x.b]
    else:
        return frozenset()
    return frozenset().union(*(c.vars() for c in children))


def _collect_vars(x: Expr, out: set) -> None:
    out |= x.vars()


# --------------------------------------------------------------------------
# public helpers for shapes


def dim(name: str, lo: int, hi: int) -> Var:
    """A symbolic dimension named ``name`` that takes values in ``[lo, hi]``."""
    if not name.isidentifier():
        raise ValueError(f"dimension name {name!r} must be a valid identifier")
    if lo < 0:
        raise ValueError(f"dimension {name!r}: lower bound {lo} must be >= 0")
    return Var(name, lo, hi)


def evaluate(x: sint, env: Mapping[str, object]):
    """Value of an int or expression under ``env``."""
    return x.eval(env) if isinstance(x, Expr) else x


def upper_bound(x: sint) -> int:
    return x.hi if isinstance(x, Expr) else int(x)


def free_vars(*xs: sint) -> set[Var]:
    out: set[Var] = set()
    for x in xs:
        if isinstance(x, Expr):
            _collect_vars(x, out)
    return out


def prod(xs) -> sint:
    out: sint = 1
    for x in xs:
        out = mul(out, x)
    return out


def render_c(x: sint, name: Callable[[Var], str] | None = None) -> str:
    """C text for an int or expression (int64 arithmetic)."""
    return to_expr(x).render(name, c=True)


def same(a: sint, b: sint) -> bool:
    """Structural equality of two ints or expressions."""
    if type(a) is int and type(b) is int:
        return a == b
    return to_expr(a) == to_expr(b)


def is_const(x: sint) -> bool:
    return not isinstance(x, Expr) or isinstance(x, Const)
