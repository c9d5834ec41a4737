"""Structural properties of frontend graphs: which primitives an op uses, and what stays a view."""
from __future__ import annotations

import math

import lightspeed as ls
from lightspeed import frontend as F
from lightspeed.graph import ArrayConst, Program
from lightspeed.ops import Op


def _program(*outs) -> Program:
    return Program.build(outs[0].graph, list(outs))


def _ops(*outs) -> set[str]:
    return {n.op.value for n in _program(*outs).nodes}


def test_gqa_reads_kv_heads_through_a_broadcast_view() -> None:
    g = ls.Graph()
    seq = ls.dim("seq", 1, 64)
    q = g.input("q", (1, 8, seq, 16))
    k = g.input("k", (1, 2, seq, 16))
    v = g.input("v", (1, 2, seq, 16))
    out = F.scaled_dot_product_attention(q, k, v, causal=True)
    assert out.shape == (1, 8, seq, 16)
    readers = [(n, st) for n in _program(out).nodes for s, st in n.srcs if s is k.node or s is v.node]
    assert readers, "k and v must be read"
    for node, st in readers:
        assert node.op is Op.MUL, f"k/v should feed the products directly, not {node.op}"
        view = st.views[-1]
        # [batch, kv_head, rep, ...]: the repeated query-head axis has stride 0 (no copy of KV heads)
        assert view.shape[2] == 4 and view.strides[2] == 0
    assert "Contiguous" not in _ops(out) and "Gather" not in _ops(out)


def test_masks_use_selects_and_no_infinite_constants() -> None:
    g = ls.Graph()
    seq, pos = ls.dim("seq", 1, 64), ls.dim("pos", 0, 64)
    q = g.input("q", (2, seq, 8))
    kv = g.input("kv", (2, pos + seq, 8))
    out = F.scaled_dot_product_attention(q, kv, kv, causal=True)
    for n in _program(out).nodes:
        if n.op is Op.CONST and not isinstance(n.arg, ArrayConst):
            assert math.isfinite(n.arg), f"constant {n.arg} in an attention graph"


def test_concatenate_is_padded_views_and_adds() -> None:
    g = ls.Graph()
    n = ls.dim("n", 1, 8)
    a, b, c = g.input("a", (n, 3)), g.input("b", (2, 3)), g.input("c", (1, 3))
    assert _ops(F.concatenate([a, b, c])) == {"Input", "Add"}


def test_conv_is_views_and_a_matmul() -> None:
    g = ls.Graph()
    x, w = g.input("x", (1, 4, 6, 7)), g.input("w", (6, 2, 3, 3))
    out = F.conv2d(x, w, padding=1, stride=2, groups=2)
    assert _ops(out) == {"Input", "Mul", "SumReduce"}


def test_rope_with_symbolic_offset_needs_the_offset_at_run_time() -> None:
    g = ls.Graph()
    seq, pos = ls.dim("seq", 1, 64), ls.dim("pos", 0, 4096)
    x = g.input("x", (seq, 2, 8))
    out = x.rope(pos=pos)
    assert {v.name for v in _program(out).dims} == {"seq", "pos"}
    assert "Gather" not in _ops(out)
