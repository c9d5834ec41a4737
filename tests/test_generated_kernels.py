"""The compiler's own fast paths for what the templates used to own: float16 bytes read as one load, whole-number
modulos as integer arithmetic, loop-invariant parts of a block hoisted, and blocked dot products for calls
with few rows; each checked against numpy or the reference backend."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed import dtypes as dt
from lightspeed import symbolic as sym
from lightspeed.backend.c.loop_split import hoist_invariants
from lightspeed.backend.c.render import whole_range
from lightspeed.kernel import ir
from lightspeed.kernel.ir import loop_var
from lightspeed.ops import Op
from lightspeed.quant import QType
from lightspeed.quant.decode_graph import dequant_matrix_graph, half_from_bytes

RNG = np.random.default_rng(1)


def _same_bits(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))


def test_every_float16_read_from_its_bytes_is_exact():
    g = ls.Graph()
    raw = g.input("raw", (65536, 2), ls.uint8)
    b = raw.cast(ls.float32)
    prog = g.compile([half_from_bytes(b[:, 0], b[:, 1])], backend="c")
    assert "ls_f16_at(" in prog.executor.source  # one load and conversion, not the primitive arithmetic
    values = np.arange(65536, dtype=np.uint16)
    (got,) = prog(raw=values.view(np.uint8).reshape(65536, 2))
    want = values.view(np.float16).astype(np.float32)
    assert _same_bits(got, want).all()
    ref = g.compile([half_from_bytes(b[:, 0], b[:, 1])], backend="reference")
    assert _same_bits(ref(raw=values.view(np.uint8).reshape(65536, 2))[0], want).all()


def test_float_modulo_of_whole_numbers_is_integer_arithmetic_and_exact():
    byte = ir.Cast(ir.Load(ir.Buffer("input", dt.uint8, (4,), "x"), 0, dt.uint8), dt.float32)
    c128, c4 = ir.Const(128.0, dt.float32), ir.Const(4.0, dt.float32)
    low7 = ir.Alu(Op.MOD, (byte, c128), dt.float32)
    assert whole_range(low7) == (0, 127)
    assert whole_range(ir.Alu(Op.MOD, (low7, c4), dt.float32)) == (0, 3)
    assert whole_range(ir.Alu(Op.MOD, (byte, ir.Const(0.5, dt.float32)), dt.float32)) is None  # not whole
    signed = ir.Cast(ir.Load(ir.Buffer("input", dt.int8, (4,), "y"), 0, dt.int8), dt.float32)
    assert whole_range(signed) is None  # negative values: fmodf keeps its sign rules
    g = ls.Graph()
    x = g.input("x", (256,), ls.uint8)
    y = g.input("y", (256,), ls.float32)
    xf = x.cast(ls.float32)
    outs = [xf % 128.0 % 4.0 * 256.0 + xf, y % 3.0]
    prog = g.compile(outs, backend="c")
    assert "fmodf(" in prog.executor.source and "% (uint32_t)" in prog.executor.source
    xv = np.arange(256, dtype=np.uint8)
    yv = RNG.uniform(-10, 10, 256).astype(np.float32)
    got = prog(x=xv, y=yv)
    want = g.compile(outs, backend="reference")(x=xv, y=yv)
    for a, b in zip(got, want):
        assert _same_bits(a, b).all()


def test_hoisting_takes_the_invariant_part_and_nothing_under_a_condition():
    buf = ir.Buffer("input", dt.float32, (64,), "w")
    v, h = loop_var("lo", 32), loop_var("hi", 2)
    scale = ir.Alu(Op.MUL, (ir.Load(buf, h, dt.float32), ir.Const(2.0, dt.float32)), dt.float32)
    elem = ir.Load(buf, v, dt.float32)
    guarded = ir.Select(sym.lt(h, 1), ir.Alu(Op.ADD, (ir.Load(buf, h, dt.float32), scale), dt.float32),
                        dt.float32)
    x = ir.Alu(Op.MUL, (ir.Alu(Op.MUL, (scale, elem), dt.float32), guarded), dt.float32)
    rest, hoisted = hoist_invariants(x, v, "h")
    assert hoisted == [("h0", scale)]  # computed once before the loop over v
    assert isinstance(rest.args[0].args[0], ir.Bound) and rest.args[0].args[0].name == "h0"
    assert rest.args[1] is guarded  # evaluated only under its condition: stays in the loop as it was


@pytest.mark.parametrize("qtype", [QType.Q8_0, QType.Q4_0, QType.Q4_1, QType.Q4_K, QType.Q6_K])
def test_generated_quantized_matmuls_match_the_reference_for_one_row_and_many(qtype):
    from quant_blocks import random_raw
    k = 256
    raw = random_raw(qtype, 96, k, RNG)
    g = ls.Graph()
    seq = ls.dim("seq", 1, 64)
    x = g.input("x", (seq, k))
    outs = [x.linear(dequant_matrix_graph(g.constant(raw), qtype))]
    prog = g.compile(outs, backend="c", templates=False)
    src = prog.executor.source
    assert "ls_f16_at(" in src and "qgemm" not in src.split("ls_graph")[-1]
    if qtype in (QType.Q8_0, QType.Q6_K):  # their signed bytes are read as int8 (one sign extension)
        assert "(const int8_t *)" in src
    ref = g.compile(outs, backend="reference")
    for rows in (1, 2, 33):
        xv = RNG.standard_normal((rows, k)).astype(np.float32)
        (got,) = prog(x=xv)
        (want,) = ref(x=xv)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def test_a_float_matvec_runs_as_blocked_dot_products():
    g = ls.Graph()
    x = g.input("x", (1, 80), ls.float32)
    w = g.input("w", (300, 80), ls.float32)  # a linear layer's weight, read along k
    prog = g.compile([x @ w.T], backend="c", templates=False)
    assert "acc[4][16]" in prog.executor.source
    xv = RNG.standard_normal((1, 80), dtype=np.float32)
    wv = RNG.standard_normal((300, 80), dtype=np.float32)
    (got,) = prog(x=xv, w=wv)
    np.testing.assert_allclose(got, xv.astype(np.float64) @ wv.T, rtol=1e-5, atol=1e-4)
