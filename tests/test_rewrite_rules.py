"""Every rewrite rule, property-tested: a random graph that contains the rule's pattern and its rewritten
form agree under the reference interpreter, on random inputs with NaN, inf, -0.0 and extreme values.

Each rule has a case builder below (a test fails if a rule has none). A case draws dtypes, shapes,
views (transposes, broadcasts, pads) and constants, builds a graph in which the rule's pattern occurs,
and says how closely the results must agree: EXACT rules bit for bit, VALUE rules as values (-0.0 ==
0.0), ROUNDING rules within a few ulps on finite, moderate inputs. The rule must fire in every example
(so a pattern that silently stops matching fails the test).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lightspeed as ls
from lightspeed import dtypes as dt
from lightspeed.backend.reference import interpret
from lightspeed.graph import Program
from lightspeed.ops import BINARY, UNARY, Op
from lightspeed.rewrite import EXACT, ROUNDING, rewrite_program, rules

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
FLOATS = (dt.float32, dt.float16, dt.bfloat16)
INTS = (dt.int8, dt.uint8, dt.int16, dt.uint16, dt.int32, dt.uint32, dt.int64)
SIGNED = (dt.int8, dt.int16, dt.int32, dt.int64)
SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -3e38, 65504.0, 1.0, -1.0], np.float32)


class Case:
    """Builds one random graph; ``inputs`` fills its input arrays."""

    def __init__(self, draw, special: bool):
        self.draw, self.special = draw, special
        self.g = ls.Graph()
        self.specs: list[tuple[str, tuple, dt.DType]] = []
        self.dims: dict[str, int] = {}

    def dtype(self, choices) -> dt.DType:
        return self.draw(st.sampled_from(choices))

    def shape(self, ndim: int = 2) -> tuple[int, ...]:
        return tuple(self.draw(st.integers(1, 4)) for _ in range(ndim))

    def operand(self, dtype: dt.DType, shape: tuple) -> ls.Tensor:
        """An input seen through a random view of ``shape``: plain, transposed, broadcast or padded."""
        kind = self.draw(st.sampled_from(["plain", "transposed", "broadcast", "padded"]))
        name = f"in{len(self.specs)}"
        if kind == "transposed" and len(shape) >= 2:
            t = self._input(name, tuple(reversed(shape)), dtype)
            return t.permute(tuple(reversed(range(len(shape)))))
        if kind == "broadcast" and len(shape) >= 1:
            small = (1,) + tuple(shape[1:])
            return self._input(name, small, dtype).expand(shape)
        if kind == "padded" and len(shape) >= 1 and shape[0] >= 2:
            t = self._input(name, (shape[0] - 1,) + tuple(shape[1:]), dtype)
            return t.pad(((1, 0),) + ((0, 0),) * (len(shape) - 1))
        return self._input(name, shape, dtype)

    def _input(self, name, shape, dtype) -> ls.Tensor:
        self.specs.append((name, shape, dtype))
        return self.g.input(name, shape, dtype)

    def const(self, value, dtype: dt.DType) -> ls.Tensor:
        return self.g.constant(value, dtype)

    def inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        out = {}
        for name, shape, d in self.specs:
            out[name] = random_array(rng, shape, d, self.special)
        return out


def random_array(rng, shape, d: dt.DType, special: bool) -> np.ndarray:
    if d is dt.bool_:
        return rng.random(shape) < 0.5
    if d.is_int:
        info = np.iinfo(d.np)
        a = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=d.np)
        small = rng.integers(max(info.min, -5), 6, size=shape).astype(d.np)
        return np.where(rng.random(shape) < 0.5, small, a)
    x = rng.uniform(-4, 4, size=shape).astype(np.float32)
    if special:
        pick = rng.random(shape) < 0.3
        x = np.where(pick, rng.choice(SPECIAL, size=shape), x).astype(np.float32)
    if d is dt.bfloat16:
        return dt.f32_to_bf16(x)
    return x.astype(d.np)


# --- one case per rule: (draw) -> (case, outputs); ``special`` says whether NaN/inf/extremes are fair --

def c_mul_one(c: Case):
    d = c.dtype(FLOATS + INTS + (dt.bool_,))
    x = c.operand(d, c.shape())
    one = c.const(True, dt.bool_) if c.draw(st.booleans()) else c.const(1, d)
    return [x * one if c.draw(st.booleans()) else one * x]


def c_add_zero(c: Case):
    d = c.dtype(FLOATS + INTS)
    x = c.operand(d, c.shape())
    zero = c.const(c.draw(st.sampled_from([0.0, -0.0])) if d.is_float else 0, d)
    return [x + zero]


def c_mul_zero(c: Case):
    kind = c.draw(st.sampled_from(["int", "select-false", "bool-operand"]))
    if kind == "int":
        x = c.operand(c.dtype(INTS), c.shape())
        return [x * c.const(0, x.dtype)]
    if kind == "select-false":
        x = c.operand(c.dtype(FLOATS), c.shape())
        return [x * c.const(False, dt.bool_)]
    b = c.operand(dt.bool_, c.shape())
    return [b * c.const(0.0, c.dtype(FLOATS))]


def c_neg_neg(c: Case):
    d = c.dtype(FLOATS + SIGNED)
    x = c.operand(d, c.shape())
    return [(x * c.const(-1, d)) * c.const(-1, d)]


def c_not_not(c: Case):
    b = c.operand(dt.bool_, c.shape())
    return [b.less_than(True).less_than(True)]


def c_lt_self(c: Case):
    x = c.operand(c.dtype(FLOATS + INTS), c.shape())
    return [x.less_than(x)]


LOSSLESS = [(s, m) for s in INTS + FLOATS + (dt.bool_,) for m in INTS + FLOATS + (dt.bool_,)
            if s is m or s is dt.bool_ or (s, m) in {
                (dt.int8, dt.int16), (dt.int8, dt.int64), (dt.int8, dt.float16), (dt.int8, dt.bfloat16),
                (dt.int8, dt.float32), (dt.uint8, dt.int16), (dt.uint8, dt.uint32), (dt.uint8, dt.bfloat16),
                (dt.uint8, dt.float32), (dt.int16, dt.int32), (dt.int16, dt.float32), (dt.uint16, dt.int32),
                (dt.uint16, dt.float32), (dt.int32, dt.int64), (dt.uint32, dt.int64), (dt.float16, dt.float32),
                (dt.bfloat16, dt.float32)}]


def c_cast_chain(c: Case):
    src, mid = c.draw(st.sampled_from([p for p in LOSSLESS if p[0] is not p[1]]))
    to = c.dtype(tuple(d for d in FLOATS + INTS + (dt.bool_,) if d is not mid))
    if to.is_int and src.is_float != mid.is_float:
        to = dt.bool_  # the rule declines such chains (tested separately below)
    x = c.operand(src, c.shape())
    return [x.cast(mid).cast(to)]


def c_recip_recip(c: Case):
    x = c.operand(dt.float32, c.shape())
    return [x.recip().recip()]


def _const_chain(c: Case, dtypes, op, lo, hi):
    d = c.dtype(dtypes)
    x = c.operand(d, c.shape())
    if d.is_int:
        info = np.iinfo(d.np)
        a, b = (c.draw(st.integers(max(info.min, -(2**40)), min(info.max, 2**40))) for _ in range(2))
    else:
        a, b = (c.draw(st.floats(lo, hi)) for _ in range(2))
    ca, cb = c.const(a, d), c.const(b, d)
    return [(x * ca) * cb if op == "mul" else (x + ca) + cb]


def c_mul_consts_int(c): return _const_chain(c, INTS, "mul", 0, 0)
def c_add_consts_int(c): return _const_chain(c, INTS, "add", 0, 0)
def c_mul_consts_float(c): return _const_chain(c, (dt.float32,), "mul", 0.25, 4.0)
def c_add_consts_float(c): return _const_chain(c, (dt.float32,), "add", -4.0, 4.0)


def c_fold(op: Op | str):
    def build(c: Case):
        shape = c.shape()
        if op == "cast":
            src = c.dtype(FLOATS + INTS + (dt.bool_,))
            to = c.dtype(tuple(d for d in FLOATS + INTS + (dt.bool_,) if d is not src))
            v = random_array(np.random.default_rng(c.draw(st.integers(0, 2**31))), (), src, True)
            v = dt.bf16_to_f32(v) if src is dt.bfloat16 else v
            return [c.const(v.item(), src).cast(to).reshape((1, 1)).expand(shape)]
        d = c.dtype(FLOATS if op in UNARY else FLOATS + INTS)
        rng = np.random.default_rng(c.draw(st.integers(0, 2**31)))
        vals = []
        for _ in range(1 if op in UNARY else 2):
            v = random_array(rng, (), d, True)
            vals.append(c.const((dt.bf16_to_f32(v) if d is dt.bfloat16 else v).item(), d))
        if op in UNARY:
            out = vals[0]._unary(op)
        else:
            out = vals[0]._binary(op, vals[1])
        return [out.reshape((1, 1)).expand(shape) + c.operand(out.dtype if out.dtype is not dt.bool_ else dt.int32,
                                                                 shape)]
    return build


def c_unit_axis(kind: str):
    def build(c: Case):
        d = c.dtype(FLOATS + INTS)
        a, b = c.shape()
        x = c.operand(d, (a, b)).reshape((a, 1, b))
        return [x.sum_reduce(1) if kind == "sum" else x.max_reduce(1)]
    return build


def c_broadcast_axis(kind: str, dtypes):
    def build(c: Case):
        d = c.dtype(dtypes)
        a = c.draw(st.integers(1, 4))
        n = ls.dim("n", 1, 8)
        c.dims["n"] = c.draw(st.integers(1, 8))
        x = c.operand(d, (a, 1)).expand((a, n))
        return [x.sum_reduce(1) if kind == "sum" else x.max_reduce(1)]
    return build


def c_max_then(op: str):
    def build(c: Case):
        d = c.dtype(FLOATS)
        x = c.operand(d, c.shape(3))
        v = c.draw(st.floats(0.01, 100.0) if op == "mul" else st.floats(-100.0, 100.0))
        y = x * c.const(v, d) if op == "mul" else x + c.const(v, d)
        return [y.max_reduce(c.draw(st.integers(0, 2)))]
    return build


def c_sum_times(dtypes, lo, hi):
    def build(c: Case):
        d = c.dtype(dtypes)
        x = c.operand(d, c.shape(3))
        if d.is_int:
            info = np.iinfo(d.np)
            v = c.draw(st.integers(max(info.min, -1000), min(info.max, 1000)))
        else:
            v = c.draw(st.floats(lo, hi))
        return [(x * c.const(v, d)).sum_reduce(c.draw(st.integers(0, 2)))]
    return build


def c_sum_sum(dtypes):
    def build(c: Case):
        d = c.dtype(dtypes)
        x = c.operand(d, c.shape(3))
        a = c.draw(st.integers(0, 1))
        return [x.sum_reduce(a).sum_reduce(a)]
    return build


CASES = {
    "mul-one": c_mul_one, "add-zero": c_add_zero, "mul-zero": c_mul_zero, "neg-neg": c_neg_neg,
    "not-not": c_not_not, "lt-self": c_lt_self, "cast-chain": c_cast_chain, "recip-recip": c_recip_recip,
    "mul-consts-int": c_mul_consts_int, "add-consts-int": c_add_consts_int,
    "mul-consts-float": c_mul_consts_float, "add-consts-float": c_add_consts_float,
    "fold-cast": c_fold("cast"),
    "sum-unit-axis": c_unit_axis("sum"), "max-unit-axis": c_unit_axis("max"),
    "max-broadcast-axis": c_broadcast_axis("max", FLOATS + INTS),
    "sum-broadcast-axis-int": c_broadcast_axis("sum", INTS),
    "sum-broadcast-axis-float": c_broadcast_axis("sum", (dt.float32,)),
    "max-add-const": c_max_then("add"), "max-mul-const": c_max_then("mul"),
    "sum-mul-const-int": c_sum_times(INTS, 0, 0), "sum-mul-const-float": c_sum_times((dt.float32,), -4.0, 4.0),
    "sum-sum-adjacent-int": c_sum_sum(INTS), "sum-sum-adjacent-float": c_sum_sum((dt.float32,)),
}
for _op in UNARY | BINARY:
    CASES[f"fold-{_op.value.lower()}"] = c_fold(_op)


def test_every_rule_has_a_case():
    missing = [r.name for r in rules.ALL if r.name not in CASES]
    assert not missing, f"rewrite rules without a property test case: {missing}"


def _agree(a: np.ndarray, b: np.ndarray, exactness: str, d: dt.DType) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if d is dt.bfloat16:
        a, b = dt.bf16_to_f32(a), dt.bf16_to_f32(b)
    if not (a.dtype.kind == "f"):
        return np.array_equal(a, b)
    if exactness == ROUNDING:
        tol = 1e-5 if d is dt.float32 else 1e-2
        return np.allclose(a, b, rtol=tol, atol=tol, equal_nan=True)
    same = np.array_equal(a, b, equal_nan=True)
    if exactness == EXACT:
        same = same and np.array_equal(np.signbit(a[a == 0]), np.signbit(b[b == 0]))
    return same


@pytest.mark.parametrize("rule", rules.ALL, ids=lambda r: r.name)
@SETTINGS
@given(data=st.data())
def test_rule_preserves_values(rule, data):
    c = Case(data.draw, special=rule.exactness != ROUNDING)
    outs = CASES[rule.name](c)
    program = Program.build(c.g, outs)
    result = rewrite_program(program, [rule])
    assert result.fired[rule.name] >= 1, f"{rule.name} did not fire"
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    inputs = c.inputs(rng)
    before = interpret(program, inputs, dict(c.dims))
    after = interpret(result.program, inputs, dict(c.dims))
    for o, a, b in zip(outs, before, after):
        assert _agree(a, b, rule.exactness, o.dtype), (rule.name, a, b)


def test_cast_chain_declines_kind_changes():
    """uint8 -> float32 -> int8 saturates; uint8 -> int8 would wrap: the rule must not fire."""
    g = ls.Graph()
    x = g.input("x", (3,), ls.uint8)
    program = Program.build(g, [x.cast(ls.float32).cast(ls.int8)])
    assert rewrite_program(program, [rules.by_name("cast-chain")]).fired["cast-chain"] == 0


def test_mul_zero_declines_floats():
    g = ls.Graph()
    x = g.input("x", (3,))
    program = Program.build(g, [x * 0.0])
    assert rewrite_program(program, rules.ALL).fired["mul-zero"] == 0


def test_max_mul_declines_negative_constant():
    g = ls.Graph()
    x = g.input("x", (3, 2))
    program = Program.build(g, [(x * -2.0).max_reduce(1)])
    assert rewrite_program(program, rules.ALL).fired["max-mul-const"] == 0


def test_fixpoint_composes_rules_and_keeps_inputs():
    """Rules feed each other across passes (folding the constants a chain rule produced); an input that
    no output reads any more stays an input of the rewritten program."""
    g = ls.Graph()
    x = g.input("x", (2, 3), ls.int32)
    unused = g.input("u", (2, 3), ls.int32)
    y = ((x * 3) * 5 + 0) + unused * 0
    result = rewrite_program(Program.build(g, [y]), rules.SAFE)
    ops = [n.op for n in result.program.nodes]
    assert ops.count(Op.MUL) == 1 and Op.ADD not in ops, ops
    assert [n.arg for n in result.program.inputs] == ["x", "u"]
    xs = np.arange(6, dtype=np.int32).reshape(2, 3)
    (out,) = interpret(result.program, {"x": xs, "u": xs}, {})
    np.testing.assert_array_equal(out, xs * 15)
    assert result.passes >= 2


def test_compiled_rewritten_program_runs_on_c_backend(tmp_path, monkeypatch):
    """The rewritten program is an ordinary program: the C backend compiles it and agrees."""
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))
    from lightspeed.backend import get_backend
    from lightspeed.runtime import CompiledGraph
    g = ls.Graph()
    x = g.input("x", (4, 5))
    y = ((x * 1.0).max(-1) * 2.0 + 0.0).recip().recip()
    program = Program.build(g, [y])
    new = rewrite_program(program, rules.ALL).program
    prog = CompiledGraph(new, get_backend("c")(new))
    xs = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(prog(x=xs)[0], xs.max(-1) * 2.0, rtol=1e-6)
    assert math.isfinite(float(prog(x=xs)[0].sum()))
