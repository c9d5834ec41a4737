"""kernel/index_values.py: integer IR as index expressions, with index-valued buffers resolved.

The shapes are aten's (what torch.compile'd Hugging Face masks look like after kernel formation): positions
``wrap(iota) + offset`` stored in buffers and read through gathers of an iota. Each rule must keep the value:
a gather whose index may leave its rows, a buffer that is not index-valued and a sum that may wrap around are
left alone.
"""
from __future__ import annotations

import numpy as np

from lightspeed import dtypes as dt
from lightspeed import symbolic as sym
from lightspeed.kernel import ir
from lightspeed.kernel.attention_mask import split_mask
from lightspeed.kernel.index_values import as_index, simplify
from lightspeed.ops import Op

N = sym.dim("n", 1, 512)
QI, J = ir.loop_var("i", N), ir.loop_var("j", N)
B = ir.loop_var("b", sym.mul(N, 4))  # e.g. batch x heads, 4 heads
I64, BOOL = dt.int64, dt.bool_


def alu(op, *args, dtype=I64):
    return ir.Alu(op, tuple(args), dtype)


def wrap(v: sym.sint, size) -> ir.IR:
    """aten's negative-index wrap of an iota: v < 0 ? v + size : v, as primitives."""
    neg = alu(Op.LESS_THAN, ir.Index(v, I64), ir.Const(0, I64), dtype=BOOL)
    pos = alu(Op.LESS_THAN, neg, ir.Const(True, BOOL), dtype=BOOL)
    return alu(Op.ADD, alu(Op.MUL, neg, alu(Op.ADD, ir.Index(v, I64), ir.Cast(ir.Index(size, dt.int32), I64))),
               alu(Op.MUL, pos, ir.Index(v, I64)))


def buffers():
    """Two position buffers (wrap(iota) + offset * n) and a scalar offset buffer holding wrap(0), with the
    resolver that reads them as the kernel that stores them computes them."""
    k = ir.loop_var("k", N)
    pos, off = ir.Buffer("temp", I64, (N,), "pos"), ir.Buffer("temp", I64, (), "off")
    defs = {off: lambda o: wrap(0, 1),
            pos: lambda o: ir.substitute(alu(Op.ADD, wrap(k, N), alu(Op.MUL, ir.Load(off, 0, I64),
                                                                   ir.Index(N, I64))), {k: o})}
    return pos, (lambda ld: defs[ld.buf](ld.offset) if ld.buf in defs else None)


def gathered(pos: ir.Buffer, v: sym.Var, rows, name: str) -> ir.Gather:
    g = ir.loop_var(name, rows)
    return ir.Gather(ir.Load(pos, v, I64), g, rows, ir.Index(g, I64), I64)


def causal_score(pos, rows):
    """q.k + where(pos[i] < pos[j], -inf, 0): aten's additive causal mask over gathered positions."""
    later = alu(Op.LESS_THAN, gathered(pos, QI, rows, "g1"), gathered(pos, J, rows, "g2"), dtype=BOOL)
    visible = alu(Op.LESS_THAN, later, ir.Const(True, BOOL), dtype=BOOL)
    hidden = alu(Op.LESS_THAN, visible, ir.Const(True, BOOL), dtype=BOOL)
    qk = ir.Load(ir.Buffer("temp", dt.float32, (N, N), "s"), sym.add(sym.mul(QI, N), J), dt.float32)
    return alu(Op.ADD, qk, alu(Op.MUL, hidden, ir.Const(float("-inf"), dt.float32), dtype=dt.float32),
               dtype=dt.float32)


def test_wrapped_iota_plus_a_zero_offset_is_the_index():
    pos, resolve = buffers()
    assert sym.same(as_index(ir.Load(pos, J, I64), resolve), J)
    assert as_index(ir.Load(pos, J, I64), lambda ld: None) is None  # not index-valued: unknown


def test_the_causal_conjunct_of_gathered_positions_is_proven():
    pos, resolve = buffers()
    score = causal_score(pos, N)
    assert split_mask(score, J, 1.0) is None  # loads of positions: nothing is monotone
    mask = split_mask(simplify(score, resolve), J, 1.0)
    assert mask is not None and len(mask.upper) == 1 and not mask.lower and mask.masked == -np.inf
    (upper,) = mask.upper
    env = {"n": 300}
    for i, j in ((0, 0), (5, 4), (5, 6), (299, 299)):  # visible exactly where j <= i
        cmp = upper.args[0]
        a, b = (sym.evaluate(sym.to_expr(x.expr).substitute({QI: i, J: j}), env) for x in cmp.args)
        assert (not a < b) == (j <= i)


def test_a_gather_that_may_leave_its_rows_is_kept():
    """Rows n - 1: the index n - 1 (the last position) is out of range and gathers 0, so nothing folds."""
    pos, resolve = buffers()
    short = sym.add(N, -1)
    score = causal_score(pos, short)
    out = simplify(score, resolve)
    assert any(isinstance(x, ir.Gather) for x in out.walk())
    assert split_mask(out, J, 1.0) is None


def test_a_batch_offset_through_a_floor_division_is_in_range():
    """Index j + (b // 4) * n into rows 4 * n // 4 * n = n * n_batch: in range by the floor division's bound."""
    batch = sym.floordiv(B, 4)
    rows = sym.mul(N, N)
    g = ir.loop_var("g", rows)
    x = ir.Gather(ir.Index(sym.add(J, sym.mul(batch, N)), I64), g, rows, ir.Index(sym.mod(g, N), I64), I64)
    assert sym.same(as_index(x, lambda ld: None), J)


def test_sums_that_may_wrap_are_not_taken_over():
    big = ir.Const(2**62, I64)
    x = alu(Op.ADD, alu(Op.ADD, ir.Index(J, I64), big), big)
    assert as_index(x, lambda ld: None) is None
    assert simplify(x, lambda ld: None) is x
