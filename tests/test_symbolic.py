"""Property and unit tests of lightspeed.symbolic.

The property tests build a random expression tree twice: once through the symbolic constructors
(which simplify as they go) and once as a plain Python evaluator of the same tree. For random
assignments inside the variables' bounds, both must agree, and the simplified expression's bounds
must contain its value.
"""
from __future__ import annotations

import random
import shutil
import subprocess
from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lightspeed.symbolic as sym

# --------------------------------------------------------------------------------------------
# random expression trees


class Scope:
    """The variables of one random case: ``n`` >= 1, a loop variable ``i < n`` (symbolic bound),
    and ``a``, ``b`` with random (possibly negative) bounds."""

    def __init__(self, choose: Callable[[int, int], int]):
        n_lo = choose(1, 8)
        n_hi = n_lo + choose(0, 60)
        self.n = sym.dim("n", n_lo, n_hi)
        self.i = sym.Var("i", 0, n_hi - 1, hi_expr=sym.add(self.n, -1))
        self.bounds = {}
        for name in ("a", "b"):
            lo = choose(-30, 30)
            self.bounds[name] = (lo, lo + choose(0, 80))
        self.a = sym.Var("a", *self.bounds["a"])
        self.b = sym.Var("b", *self.bounds["b"])
        self.vars = {"n": self.n, "i": self.i, "a": self.a, "b": self.b}

    def assignment(self, choose: Callable[[int, int], int]) -> dict[str, int]:
        n = choose(self.n.lo, self.n.hi)
        return {"n": n, "i": choose(0, n - 1), "a": choose(*self.bounds["a"]), "b": choose(*self.bounds["b"])}


BINARY = ("+", "-", "*", "min", "max", "<", "and")


def random_tree(choose: Callable[[int, int], int], depth: int) -> tuple:
    """A random expression tree as nested tuples (leaves: ("c", k) or ("v", name))."""
    if depth == 0 or choose(0, 3) == 0:
        if choose(0, 2) == 0:
            return ("c", choose(-70, 70))
        return ("v", ("n", "i", "a", "b")[choose(0, 3)])
    kind = choose(0, 11)
    if kind <= 6:
        return (BINARY[kind], random_tree(choose, depth - 1), random_tree(choose, depth - 1))
    op = "//" if kind in (7, 8, 10) else "%"
    if kind >= 10:
        # an unravel of a ravel: (x*d + y) // d or % d, the pattern views produce
        d = random_divisor(choose, depth - 1)
        ravel = ("+", ("*", random_tree(choose, depth - 1), d), random_tree(choose, depth - 1))
        return (op, ravel, d)
    return (op, random_tree(choose, depth - 1), random_divisor(choose, depth - 1))


def random_divisor(choose: Callable[[int, int], int], depth: int) -> tuple:
    """A divisor that is never zero: a non-zero constant (often a power of two), n, n*k, or max(tree, k>=1)."""
    kind = choose(0, 5)
    if kind == 0:
        return ("c", (1, 2, 4, 8, 16, 64)[choose(0, 5)])
    if kind == 1:
        c = choose(1, 9)
        return ("c", c if choose(0, 1) else -c)
    if kind == 2:
        return ("v", "n")
    if kind == 3:
        return ("*", ("v", "n"), ("c", choose(1, 8)))
    if kind == 4:
        return ("+", ("v", "i"), ("c", choose(1, 5)))
    return ("max", random_tree(choose, depth), ("c", choose(1, 12)))


def naive(tree: tuple, env: dict[str, int]) -> int:
    """Evaluate a tree with plain Python semantics (floor division and modulo)."""
    tag = tree[0]
    if tag == "c":
        return tree[1]
    if tag == "v":
        return env[tree[1]]
    x, y = naive(tree[1], env), naive(tree[2], env)
    return {
        "+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "//": lambda: x // y, "%": lambda: x % y,
        "min": lambda: min(x, y), "max": lambda: max(x, y), "<": lambda: int(x < y),
        "and": lambda: int(x != 0 and y != 0),
    }[tag]()


def build(tree: tuple, scope: Scope) -> sym.sint:
    """Construct the same tree through the simplifying symbolic constructors."""
    tag = tree[0]
    if tag == "c":
        return tree[1]
    if tag == "v":
        return scope.vars[tree[1]]
    x, y = build(tree[1], scope), build(tree[2], scope)
    return {
        "+": lambda: sym.add(x, y), "-": lambda: sym.add(x, sym.mul(y, -1)), "*": lambda: sym.mul(x, y),
        "//": lambda: sym.floordiv(x, y), "%": lambda: sym.mod(x, y), "min": lambda: sym.smin(x, y),
        "max": lambda: sym.smax(x, y), "<": lambda: sym.lt(x, y), "and": lambda: sym.logical_and(x, y),
    }[tag]()


def show(tree: tuple) -> str:
    tag = tree[0]
    if tag in ("c", "v"):
        return str(tree[1])
    if tag in ("min", "max"):
        return f"{tag}({show(tree[1])}, {show(tree[2])})"
    return f"({show(tree[1])} {tag} {show(tree[2])})"


def drawer(data) -> Callable[[int, int], int]:
    return lambda lo, hi: data.draw(st.integers(lo, hi))


# --------------------------------------------------------------------------------------------
# property tests


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_simplified_expression_matches_naive_evaluation(data):
    choose = drawer(data)
    scope = Scope(choose)
    tree = random_tree(choose, depth=4)
    expr = build(tree, scope)
    for _ in range(4):
        env = scope.assignment(choose)
        want = naive(tree, env)
        got = sym.evaluate(expr, env)
        assert got == want, f"{show(tree)} simplified to {expr}: got {got}, want {want} at {env}"
        if isinstance(expr, sym.Expr):
            assert expr.lo <= got <= expr.hi, f"{expr} = {got} at {env} is outside its bounds [{expr.lo}, {expr.hi}]"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_proofs_and_symbolic_bounds_are_sound(data):
    """What the simplifier relies on: sym_upper/sym_lower bound the value, proven_lt/proven_ge hold."""
    choose = drawer(data)
    scope = Scope(choose)
    ta, tb = random_tree(choose, depth=3), random_tree(choose, depth=3)
    a, b = build(ta, scope), build(tb, scope)
    upper, lower = sym.sym_upper(sym.to_expr(a)), sym.sym_lower(sym.to_expr(a))
    lt, ge = sym.proven_lt(a, b), sym.proven_ge(a, b)
    for _ in range(4):
        env = scope.assignment(choose)
        va, vb = naive(ta, env), naive(tb, env)
        where = f"a = {show(ta)} -> {a}, b = {show(tb)} -> {b} at {env}"
        assert sym.evaluate(lower, env) <= va <= sym.evaluate(upper, env), \
            f"a = {va} is outside its symbolic bounds [{lower}, {upper}]: {where}"
        assert not lt or va < vb, f"proven a < b, but {va} >= {vb}: {where}"
        assert not ge or va >= vb, f"proven a >= b, but {va} < {vb}: {where}"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_vectorised_evaluation_matches_scalar(data):
    """The reference backend evaluates index expressions over numpy arrays: same values as scalars."""
    choose = drawer(data)
    scope = Scope(choose)
    tree = random_tree(choose, depth=3)
    expr = build(tree, scope)
    envs = [scope.assignment(choose) for _ in range(6)]
    # one variable varies as an array, the others stay scalars (as the loop indices do in the backend)
    name = ("i", "a", "b")[choose(0, 2)]
    base = dict(envs[0])
    values = np.array([e[name] for e in envs], dtype=np.int64)
    if name == "i":
        values = np.minimum(values, base["n"] - 1)
    got = np.broadcast_to(np.asarray(sym.evaluate(expr, {**base, name: values})), values.shape)
    want = [naive(tree, {**base, name: int(v)}) for v in values]
    assert got.tolist() == want, f"{show(tree)} -> {expr} over {name}={values.tolist()}"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_substitute_matches_evaluation(data):
    choose = drawer(data)
    scope = Scope(choose)
    expr = sym.to_expr(build(random_tree(choose, depth=3), scope))
    env = scope.assignment(choose)
    # substituting the constant for 'a' and 'b' then evaluating equals evaluating directly
    partial = expr.substitute({scope.a: env["a"], scope.b: env["b"]})
    assert sym.evaluate(partial, env) == sym.evaluate(expr, env)
    assert not ({v.name for v in sym.free_vars(partial)} & {"a", "b"})


# --------------------------------------------------------------------------------------------
# unit tests of the key rules


def test_unravel_of_ravel_simplifies_with_static_bounds():
    i, j = sym.Var("i", 0, 99), sym.Var("j", 0, 63)
    flat = sym.add(sym.mul(i, 64), j)
    assert sym.same(sym.floordiv(flat, 64), i)
    assert sym.same(sym.mod(flat, 64), j)


def test_unravel_of_ravel_simplifies_with_symbolic_loop_bound():
    seq = sym.dim("seq", 1, 4096)
    i = sym.Var("i", 0, 4095, hi_expr=sym.add(seq, -1))
    j = sym.Var("j", 0, 63)
    flat = sym.add(sym.mul(i, 64), j)
    assert sym.same(sym.floordiv(flat, 64), i)
    assert sym.same(sym.mod(flat, 64), j)
    # a symbolic divisor: (i*seq + j) // seq with j < seq
    k = sym.Var("k", 0, 4095, hi_expr=sym.add(seq, -1))
    assert sym.same(sym.floordiv(sym.add(sym.mul(i, seq), k), seq), i)
    assert sym.same(sym.mod(sym.add(sym.mul(i, seq), k), seq), k)


def test_floordiv_does_not_drop_a_remainder_that_can_reach_the_divisor():
    i, j = sym.Var("i", 0, 99), sym.Var("j", 0, 64)  # j may equal 64
    q = sym.floordiv(sym.add(sym.mul(i, 64), j), 64)
    assert not sym.same(q, i)
    assert sym.evaluate(q, {"i": 3, "j": 64}) == 4


def test_mod_rules():
    x = sym.dim("x", 0, 1000)
    assert sym.same(sym.mod(sym.mod(x, 8), 4), sym.mod(x, 4))
    assert sym.mod(sym.add(sym.mul(x, 4), 2), 2) == 0
    assert sym.mod(x, 1) == 0
    assert sym.mod(x, x) == 0
    assert sym.same(sym.mod(sym.add(sym.mul(x, 6), 5), 3), 2)
    small = sym.dim("s", 0, 6)
    assert sym.same(sym.mod(small, 7), small)            # already below the modulus
    assert not sym.same(sym.mod(small, 6), small)        # 6 % 6 == 0


def test_negative_divisors_keep_floor_semantics_in_proofs():
    x = sym.dim("x", 0, 100)
    r = sym.mod(x, -3)                      # in (-3, 0]
    assert sym.lt(r, -3) == 0
    assert sym.lt(-3, r) == 1
    assert sym.mod(x, -1) == 0
    assert sym.evaluate(sym.floordiv(x, -4), {"x": 5}) == -2


def test_divmod_pair_folds_back():
    x = sym.dim("x", 0, 1000)
    rebuilt = sym.add(sym.mul(sym.floordiv(x, 8), 8), sym.mod(x, 8))
    assert sym.same(rebuilt, x)


def test_nested_floordiv_merges():
    x = sym.dim("x", 0, 1000)
    assert sym.same(sym.floordiv(sym.floordiv(x, 4), 8), sym.floordiv(x, 32))


def test_min_max_use_symbolic_bounds():
    n = sym.dim("n", 1, 100)
    i = sym.Var("i", 0, 99, hi_expr=sym.add(n, -1))
    assert sym.same(sym.smin(i, n), i)
    assert sym.same(sym.smax(i, n), n)
    assert sym.lt(i, n) == 1
    assert sym.lt(n, i) == 0


def test_structural_equality_and_hashing():
    a, b = sym.dim("a", 0, 10), sym.dim("b", 0, 10)
    e1 = sym.add(sym.mul(a, 3), sym.add(b, 1))
    e2 = sym.add(1, sym.add(b, sym.mul(3, a)))
    assert e1 == e2 and hash(e1) == hash(e2)
    assert {e1: "x"}[e2] == "x"
    assert sym.same(sym.mul(a, b), sym.mul(b, a))
    assert sym.dim("a", 0, 10) == a
    assert sym.dim("a", 0, 11) != a           # bounds are part of a variable's identity
    assert sym.add(a, sym.mul(a, -1)) == 0    # collapses to a Python int
    assert sym.to_expr(5) == 5 and sym.to_expr(5) != 6
    with pytest.raises(TypeError, match="truth value"):
        bool(sym.add(a, 1))


def test_constructor_errors_name_the_problem():
    with pytest.raises(ValueError, match="lower bound 5 exceeds upper bound 2"):
        sym.Var("v", 5, 2)
    with pytest.raises(ValueError, match="identifier"):
        sym.dim("not a name", 0, 3)
    with pytest.raises(ValueError, match=">= 0"):
        sym.dim("d", -1, 3)
    with pytest.raises(ZeroDivisionError):
        sym.floordiv(sym.dim("d", 0, 3), 0)
    with pytest.raises(ZeroDivisionError):
        sym.mod(sym.dim("d", 0, 3), 0)
    with pytest.raises(ValueError, match="'d' has no value"):
        sym.evaluate(sym.add(sym.dim("d", 0, 3), 1), {})


# --------------------------------------------------------------------------------------------
# render_c: compile the rendered expressions with gcc and compare with Python

C_PRELUDE = r"""
#include <stdint.h>
#include <stdio.h>
/* floor semantics, as Python's // and % (the C backend defines the same helpers) */
static inline int64_t ls_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t ls_floormod(int64_t a, int64_t b) {
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t ls_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t ls_max(int64_t a, int64_t b) { return a > b ? a : b; }
"""


def test_render_c_matches_python_semantics(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    rng = random.Random(1234)
    choose = rng.randint
    cases = []
    while len(cases) < 400:
        scope = Scope(choose)
        tree = random_tree(choose, depth=4)
        expr = build(tree, scope)
        for _ in range(3):
            env = scope.assignment(choose)
            cases.append((sym.render_c(expr), env, naive(tree, env), show(tree)))
    # plus floor division and modulo of negative numerators, by positive and negative divisors
    a = sym.Var("a", -50, 50)
    for num in (sym.add(a, -7), sym.mul(a, 3), a):
        for d in (3, 7, -4, 64):
            for v in (-50, -13, -1, 0, 1, 13, 50):
                env = {"n": 1, "i": 0, "a": v, "b": 0}
                for e, py in ((sym.floordiv(num, d), lambda x: x // d), (sym.mod(num, d), lambda x: x % d)):
                    cases.append((sym.render_c(e), env, py(sym.evaluate(num, env)), f"{num} by {d}"))
    body = []
    for k, (text, env, _, _) in enumerate(cases):
        decls = " ".join(f"int64_t {name} = {val}LL;" for name, val in env.items())
        body.append(f"  {{ {decls} (void)n; (void)i; (void)a; (void)b; "
                    f"printf(\"%lld\\n\", (long long)({text})); }}")
    src = tmp_path / "exprs.c"
    src.write_text(C_PRELUDE + "int main(void) {\n" + "\n".join(body) + "\n  return 0;\n}\n")
    exe = tmp_path / "exprs"
    built = subprocess.run([cc, "-O0", "-std=c99", "-o", str(exe), str(src)], capture_output=True, text=True)
    assert built.returncode == 0, f"rendered C does not compile:\n{built.stderr[:3000]}"
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert len(out) == len(cases)
    for (text, env, want, what), got in zip(cases, out):
        assert int(got) == want, f"C `{text}` = {got}, Python {want} for {what} at {env}"


def test_min_of_dimensions_is_its_own_bound_in_index_proofs():
    """(K*i + j) // (K*c) is 0 for j < K and i < c also when K is a min of dimensions (a KV cache's extent
    min(pos + seq, ctx)); checked against evaluation at every point."""
    from lightspeed.kernel.attention import _var
    pos, seq = sym.dim("pos", 0, 9), sym.dim("seq", 1, 4)
    k = sym.smin(sym.add(pos, seq), 8)
    i, j = _var("i", sym.mul(seq, 2)), _var("j", k)
    q = sym.floordiv(sym.add(sym.mul(k, i), j), sym.mul(sym.mul(k, seq), 2))
    assert sym.same(q, 0)
    for p in range(10):
        for s in range(1, 5):
            kk = min(p + s, 8)
            for ii in range(2 * s):
                for jj in range(kk):
                    assert (kk * ii + jj) // (kk * s * 2) == 0
    assert sym.sym_upper(k) is k and sym.sym_lower(k) is k


@given(st.data())
def test_a_bounded_remainder_under_a_common_factor_splits_off(data):
    """(g*q + s) // (g*e) == q // e and (g*q + s) % (g*e) == g*(q % e) + s for 0 <= s < g: the flat
    index of an unfolded convolution, ``m*27 + k`` with k < 27, over 27*64. Checked at every point."""
    g = data.draw(st.integers(2, 12))
    e = data.draw(st.integers(2, 9))
    k1 = data.draw(st.integers(1, 4)) * g * data.draw(st.sampled_from([1, -1]))
    c = data.draw(st.integers(0, g - 1))
    m = sym.Var("m", 0, data.draw(st.integers(1, 40)))
    s = sym.Var("s", 0, data.draw(st.integers(0, g - 1 - c)))
    n = sym.Var("n", 0, 3)
    k2 = data.draw(st.integers(0, 3)) * g
    a = sym.add(sym.add(sym.add(sym.mul(m, k1), s), sym.mul(n, k2)), c)
    q, r = sym.floordiv(a, g * e), sym.mod(a, g * e)
    for mv in range(m.lo, m.hi + 1):
        for sv in range(s.lo, s.hi + 1):
            for nv in range(4):
                env = {"m": mv, "s": sv, "n": nv}
                flat = mv * k1 + sv + nv * k2 + c
                assert sym.evaluate(q, env) == flat // (g * e), (a, q, env)
                assert sym.evaluate(r, env) == flat % (g * e), (a, r, env)
    if k2 == 0 and c == 0 and k1 == g:
        assert f"//{g * e})" not in str(q), q  # the division is by e alone (or folded away)


@given(st.data())
def test_a_bounded_remainder_under_a_symbolic_factor_splits_off(data):
    """(G*i + j) // (G*e) == i // e and (G*i + j) % (G*e) == G*(i % e) + j for a symbolic extent G and a loop
    index j < G: a row of an expanded mask reshaped to rows x keys, keys = min(start + chunk, ctx), whose
    per-score division by ``G*e`` became a division of the row index by e. Checked at every point."""
    from lightspeed.kernel import ir
    cap = data.draw(st.integers(2, 9))
    e = data.draw(st.integers(1, 4))
    start, chunk = sym.dim("start", 0, data.draw(st.integers(0, 6))), sym.dim("chunk", 1, data.draw(st.integers(1, 4)))
    use_min = data.draw(st.booleans())
    g = sym.smin(sym.add(start, chunk), cap) if use_min else sym.mul(chunk, 2)
    # a min that folds to start + chunk is a sum: dividing by a multiple of a sum is another rule's (not built)
    monomial = not use_min or isinstance(g, sym.Min)
    i, j = ir.loop_var("i", sym.mul(chunk, e + 1)), ir.loop_var("j", g)
    offset = data.draw(st.integers(0, 1))  # j + 1 may reach G: then nothing may split off
    a = sym.add(sym.add(sym.mul(g, i), j), offset)
    q, r = sym.floordiv(a, sym.mul(g, e)), sym.mod(a, sym.mul(g, e))
    if offset == 0 and e > 1 and monomial:
        assert "min(" not in str(q) and "chunk" not in str(q), q  # the row index over e alone
    for sv in range(start.lo, start.hi + 1):
        for cv in range(chunk.lo, chunk.hi + 1):
            gv = sym.evaluate(g, {"start": sv, "chunk": cv})
            for iv in range(cv * (e + 1)):
                for jv in range(gv):
                    env = {"start": sv, "chunk": cv, "i": iv, "j": jv}
                    flat = gv * iv + jv + offset
                    assert sym.evaluate(q, env) == flat // (gv * e), (a, q, env)
                    assert sym.evaluate(r, env) == flat % (gv * e), (a, r, env)


@given(st.data())
def test_coefficients_reduce_modulo_the_divisor(data):
    """(c*q + s) // c == q and % c == s when the residues s of the coefficients stay in [0, c): a padded
    image's row ``(kh*67 + oh) % 66``. Checked at every point, with coefficients above, below and around c."""
    c = data.draw(st.integers(2, 70))
    xs = [sym.Var(f"x{i}", 0, data.draw(st.integers(0, 6))) for i in range(data.draw(st.integers(1, 3)))]
    coefs = [data.draw(st.integers(-3 * c, 3 * c)) for _ in xs]
    const = data.draw(st.integers(-2 * c, 2 * c))
    a = const
    for x, k in zip(xs, coefs):
        a = sym.add(a, sym.mul(x, k))
    q, r = sym.floordiv(a, c), sym.mod(a, c)
    import itertools
    for point in itertools.product(*[range(x.lo, x.hi + 1) for x in xs]):
        env = {x.name: v for x, v in zip(xs, point)}
        flat = const + sum(k * v for k, v in zip(coefs, point))
        assert sym.evaluate(q, env) == flat // c, (a, q, env)
        assert sym.evaluate(r, env) == flat % c, (a, r, env)
