"""The C renderer names a repeated subexpression once (lightspeed/backend/c/cse.py), and never where the
plain text would not have evaluated it: not outside a Select's value, a Gather's body, a Reduce's loop,
an integer modulo's dividend or the right side of ``&&``."""
from __future__ import annotations

import random

import pytest

from lightspeed import dtypes as dt
from lightspeed import symbolic as sym
from lightspeed.backend.c import cse
from lightspeed.backend.c.render import KernelRenderer
from lightspeed.kernel import ir
from lightspeed.kernel.fusion import KernelPlan
from lightspeed.kernel.ir import loop_var
from lightspeed.ops import Op

N = sym.dim("n", 2, 64)
KO = loop_var("ko", N)
R = loop_var("kr", N)


def renderer(*bufs: ir.Buffer) -> KernelRenderer:
    r = KernelRenderer(KernelPlan([], [], [], [], dims=[N]))
    for k, b in enumerate(bufs):
        r.kbufs[id(b)] = k + 1
    return r


def buf(name: str, d: dt.DType = dt.float32) -> ir.Buffer:
    return ir.Buffer("input", d, (N, N), name)


def long_offset(v: sym.Var) -> sym.sint:
    """An index long enough that two uses are worth a name."""
    return sym.add(sym.mod(sym.floordiv(sym.add(sym.mul(v, N), 7), sym.add(N, 3)), sym.add(N, -1)), sym.mul(v, 5))


def load_(b: ir.Buffer, offset: sym.sint) -> ir.Load:
    return ir.Load(b, offset, b.dtype)


def mul(a: ir.IR, b: ir.IR) -> ir.Alu:
    return ir.Alu(Op.MUL, (a, b), a.dtype)


@pytest.fixture(autouse=True)
def name_everything_repeated(monkeypatch):
    monkeypatch.setattr(cse, "MIN_SAVED", 0)


def test_index_text_is_the_same_as_render_c_when_nothing_is_named(monkeypatch) -> None:
    monkeypatch.setattr(cse, "MIN_SAVED", 1 << 30)
    rng = random.Random(0)
    m, t = sym.dim("m", 0, 9), sym.Var("t", -6, 5)
    leaves = [N, m, t, KO, 3, -2, 1 << 40]

    def build(depth: int) -> sym.sint:
        if depth == 0:
            return rng.choice(leaves)
        a, b = build(depth - 1), build(depth - 1)
        op = rng.choice(["add", "sub", "mul", "div", "mod", "min", "max", "lt", "and"])
        if op in ("div", "mod"):
            b = rng.choice([sym.add(N, 1), 4, -3, sym.smax(sym.add(m, -2), 1), m, t])
            if sym.is_const(b) and int(b) == 0:
                b = 5
            return (sym.floordiv if op == "div" else sym.mod)(a, b)
        return {"add": sym.add, "sub": lambda x, y: sym.add(x, sym.mul(y, -1)), "mul": sym.mul, "min": sym.smin,
                "max": sym.smax, "lt": sym.lt, "and": sym.logical_and}[op](a, b)

    seen = 0
    for _ in range(400):
        e = build(rng.randint(1, 4))
        r = renderer()
        assert r.idx(e) == sym.render_c(e, r.var), e
        seen += cse.is_node(e)
    assert seen > 300


def test_a_repeated_index_is_named_once() -> None:
    x = buf("x")
    off = long_offset(KO)
    r = renderer(x)
    text = r.expr(mul(load_(x, off), load_(x, off)))
    plain = sym.render_c(off, r.var)
    assert text.count(plain) == 1 and text.startswith("({ const "), text


def test_a_load_under_a_select_is_named_inside_it_only() -> None:
    x = buf("x")
    load = load_(x, long_offset(KO))
    guarded = ir.Select(sym.lt(KO, 5), mul(load, load), dt.float32)
    text = renderer(x).expr(ir.Alu(Op.ADD, (guarded, ir.Const(1.0, dt.float32)), dt.float32))
    assert "const float" in text and text.index("const float") > text.index("?"), text
    # evaluated unconditionally next to the select as well: named once, before it, and read inside it
    text = renderer(x).expr(ir.Alu(Op.ADD, (guarded, load), dt.float32))
    assert text.startswith("({ const float _x") and text.count("bp1[") == 1, text


def test_a_loop_invariant_operand_of_a_reduce_stays_in_its_loop() -> None:
    x = buf("x")
    load = load_(x, long_offset(KO))  # does not read the reduced variable, but the loop may run 0 times
    text = renderer(x).expr(ir.Reduce(Op.SUM_REDUCE, R, N, mul(load, load), dt.float32))
    assert text.index("const float") > text.index("for ("), text


def test_a_gather_body_names_its_operands_inside_the_row_check() -> None:
    x, idx = buf("x"), buf("idx", dt.int32)
    g = loop_var("kg", N)
    row = load_(x, sym.add(long_offset(g), KO))
    other = load_(x, long_offset(KO))  # does not read the gathered row, but is evaluated only when it is valid
    body = ir.Alu(Op.ADD, (mul(row, row), mul(other, other)), dt.float32)
    text = renderer(x, idx).expr(ir.Gather(load_(idx, KO), g, N, body, dt.float32))
    assert text.count("const float") == 2 and text.index("const float") > text.index("?"), text


def test_an_integer_modulo_names_its_dividend_only_where_it_is_evaluated() -> None:
    x, y = buf("x", dt.int32), buf("y", dt.int32)
    a = load_(x, long_offset(KO))
    dividend = ir.Alu(Op.ADD, (mul(a, a), ir.Const(1, dt.int32)), dt.int32)
    text = renderer(x, y).expr(ir.Alu(Op.MOD, (dividend, load_(y, KO)), dt.int32))
    assert text.index("const int32_t") > text.index("_m == -1"), text


def test_the_right_side_of_and_is_named_after_the_left() -> None:
    q = sym.floordiv(sym.add(sym.mul(KO, N), 11), sym.add(N, 1))
    e = sym.logical_and(sym.lt(sym.mod(KO, 2), 1), sym.lt(KO, sym.add(sym.mod(q, 7), sym.floordiv(q, 3))))
    assert isinstance(e, sym.And) and q in _subterms(e.b) and q not in _subterms(e.a)
    text = renderer().idx(e)
    assert text.index("const int64_t") > text.index("&&"), text


def _subterms(e: sym.sint) -> set:
    out, todo = set(), [e]
    while todo:
        x = todo.pop()
        if isinstance(x, sym.Expr) and x not in out:
            out.add(x)
            todo += cse.edges(x)[0] + [c for c, _ in cse.edges(x)[1]]
    return out


def test_a_variable_rebound_by_an_inner_loop_is_not_shared() -> None:
    x = buf("x")
    load = load_(x, long_offset(R))
    inner = ir.Reduce(Op.SUM_REDUCE, R, N, mul(load, load), dt.float32)  # the same variable, rebound
    outer = ir.Reduce(Op.SUM_REDUCE, R, N, ir.Alu(Op.ADD, (mul(load, load), inner), dt.float32), dt.float32)
    text = renderer(x).expr(outer)
    assert text.count("bp1[") == 2, text  # one declaration per loop
    first, second = text.index("bp1["), text.rindex("bp1[")
    assert text.index("for (", first) < second  # the inner loop declares its own


def test_rendering_is_deterministic() -> None:
    x = buf("x")
    load = load_(x, long_offset(KO))
    value = ir.Alu(Op.ADD, (ir.Select(sym.lt(KO, 5), mul(load, load), dt.float32), mul(load, load)), dt.float32)
    assert len({renderer(x).expr(value) for _ in range(3)}) == 1


def test_the_plan_cache_key_follows_the_naming_threshold(monkeypatch) -> None:
    """Cached sources are keyed by the package's code and its constants: a changed threshold misses."""
    import lightspeed as ls
    from lightspeed.backend.c.plan_cache import plan_key
    from lightspeed.graph import Program
    g = ls.Graph()
    x = g.input("x", (N, 3), ls.float32)
    program = Program.build(g, [(x * x).sum(1)])
    before = plan_key(program, {})
    monkeypatch.setattr(cse, "MIN_SAVED", 7)
    assert plan_key(program, {}) != before
