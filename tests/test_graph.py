"""The graph: hash-consing of nodes, what a Program holds, and constants."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lightspeed as ls
from lightspeed.graph import ArrayConst, Program, describe
from lightspeed.ops import Op


def node_count(g: ls.Graph) -> int:
    return len(g.order)


# --------------------------------------------------------------------------------------------
# hash-consing


def test_identical_subgraphs_are_one_node():
    g = ls.Graph()
    x = g.input("x", (4, 8), ls.float32)
    y = g.input("y", (4, 8), ls.float32)
    a = (x * y + x).sin()
    n = node_count(g)
    b = (x * y + x).sin()
    assert a.node is b.node
    assert node_count(g) == n


def test_different_views_or_args_are_different_nodes():
    g = ls.Graph()
    x = g.input("x", (4, 4), ls.float32)
    assert (x + x).node is not (x + x.T).node                   # same source node, different view
    assert x.sum_reduce(0).node is not x.sum_reduce(1).node     # different arg
    assert x.cast(ls.int32).node is not x.cast(ls.int16).node   # different dtype
    assert x.sin().node is not x.sqrt().node                    # different op
    assert g.iota(3).node is not g.iota(6).node                 # different shape


def test_operand_order_matters_for_the_node_but_not_the_value():
    g = ls.Graph()
    x = g.input("x", (3,), ls.float32)
    y = g.input("y", (3,), ls.float32)
    a, b = x + y, y + x
    assert a.node is not b.node   # no commutativity canonicalisation at build time
    prog = g.compile([a, b], backend="reference")
    xa, ya = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    ra, rb = prog(x=xa, y=ya)
    np.testing.assert_array_equal(ra, rb)


def _random_expr(x: ls.Tensor, y: ls.Tensor, ops: list[int]) -> ls.Tensor:
    t = x
    for k in ops:
        t = (t + y, t * x, t.sin(), t.sqrt(), t.sum(-1, keepdim=True).expand(t.shape), t.T.T, t - y)[k]
    return t


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=8))
def test_building_the_same_random_expression_twice_adds_no_nodes(ops):
    g = ls.Graph()
    x = g.input("x", (3, 3), ls.float32)
    y = g.input("y", (3, 3), ls.float32)
    a = _random_expr(x, y, ops)
    n = node_count(g)
    b = _random_expr(x, y, ops)
    assert a.node is b.node and node_count(g) == n
    # and every node is unique: no two nodes share (op, arg, dtype, sources)
    keys = [(nd.op, repr(nd.arg), nd.dtype, tuple((s.id, st) for s, st in nd.srcs)) for nd in g.order]
    assert len(set(keys)) == len(keys)


def test_operands_from_different_graphs_are_rejected():
    g1, g2 = ls.Graph(), ls.Graph()
    x = g1.input("x", (2,), ls.float32)
    y = g2.input("y", (2,), ls.float32)
    with pytest.raises(ValueError, match="different graphs"):
        x + y
    with pytest.raises(ValueError, match="Tensor of this graph"):
        g1.compile([y], backend="reference")


def test_duplicate_or_invalid_input_names_are_rejected():
    g = ls.Graph()
    g.input("x", (2,), ls.float32)
    with pytest.raises(ValueError, match="'x' is already defined"):
        g.input("x", (2,), ls.float32)
    with pytest.raises(ValueError, match="identifier"):
        g.input("not valid", (2,), ls.float32)
    with pytest.raises(ValueError, match="negative dimension -1"):
        g.input("z", (2, -1), ls.float32)


# --------------------------------------------------------------------------------------------
# Program contents


def test_program_holds_only_what_the_outputs_need_in_topological_order():
    seq = ls.dim("seq", 1, 64)
    g = ls.Graph()
    x = g.input("x", (seq, 8), ls.float32)
    w = g.input("w", (8, 8), ls.float32)
    unused = g.input("unused", (3,), ls.float32)
    dead = (x * 2.0).sin()                      # built, but not an output
    y = (x @ w).sum(-1)
    prog = Program.build(g, [y])
    ids = {n.id for n in prog.nodes}
    assert dead.node.id not in ids and unused.node.id not in ids
    assert [n.arg for n in prog.inputs] == ["x", "w"]
    assert [v.name for v in prog.dims] == ["seq"]
    position = {n.id: k for k, n in enumerate(prog.nodes)}
    for n in prog.nodes:
        for s, _ in n.srcs:
            assert position[s.id] < position[n.id], f"{s} is used by {n} before it is computed"
    assert prog.outputs == [(y.node, y.st)]
    used = {s.id for n in prog.nodes for s, _ in n.srcs} | {y.node.id}
    assert all(n.id in used for n in prog.nodes), "the program holds a node nothing uses"
    # the listing names every node once
    assert len(describe(prog).splitlines()) == len(prog.nodes)


def test_program_dims_include_dims_that_only_views_use():
    g = ls.Graph()
    x = g.input("x", (16, 4), ls.float32)
    pos = ls.dim("pos", 0, 15)
    y = x[pos]                                  # a symbolic index: only the view mentions pos
    prog = Program.build(g, [y])
    assert [v.name for v in prog.dims] == ["pos"]
    compiled = g.compile([y], backend="reference")
    a = np.arange(64, dtype=np.float32).reshape(16, 4)
    (row,) = compiled(x=a, dims={"pos": 5})
    np.testing.assert_array_equal(row, a[5])


def test_outputs_that_share_nodes_share_work():
    g = ls.Graph()
    x = g.input("x", (5,), ls.float32)
    e = x.exp()
    a, b = e + 1.0, e * 2.0
    prog = Program.build(g, [a, b])
    assert sum(1 for n in prog.nodes if n is e.node) == 1
    out_a, out_b = g.compile([a, b], backend="reference")(x=np.zeros(5, np.float32))
    np.testing.assert_allclose(out_a, 2.0)
    np.testing.assert_allclose(out_b, 2.0)


def test_an_output_can_be_an_input_seen_through_a_view():
    g = ls.Graph()
    x = g.input("x", (2, 3), ls.int32)
    prog = g.compile([x.T, x], backend="reference")
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    t, same = prog(x=a)
    np.testing.assert_array_equal(t, a.T)
    np.testing.assert_array_equal(same, a)
    assert t.flags.writeable and not np.shares_memory(same, a)  # outputs are fresh arrays


# --------------------------------------------------------------------------------------------
# constants


def test_scalar_constants_are_shared_and_typed():
    g = ls.Graph()
    assert g.constant(2.0).node is g.constant(2.0).node
    assert g.constant(0.0).node is not g.constant(-0.0).node    # keyed by bits: -0.0 is kept
    assert g.constant(1).dtype is ls.int32
    assert g.constant(1.0).dtype is ls.float32
    assert g.constant(True).dtype is ls.bool_
    assert g.constant(1).node is not g.constant(1.0).node
    assert g.constant(3, ls.float16).dtype is ls.float16
    c = g.constant(2.5)
    assert c.shape == () and c.node.op is Op.CONST and c.node.arg == 2.5


def test_python_scalar_operands_become_broadcast_views_of_one_scalar_node():
    g = ls.Graph()
    x = g.input("x", (4, 5), ls.float32)
    y = x * 3.0
    scalar, view = y.node.srcs[1]
    assert scalar.op is Op.CONST and scalar.shape == ()
    assert view.shape == (4, 5) and all(s == 0 for s in view.views[-1].strides)
    assert (x + 3.0).node.srcs[1][0] is scalar                  # the same constant node, reused


def test_scalar_operand_dtype_promotion():
    g = ls.Graph()
    i = g.input("i", (3,), ls.int32)
    assert (i + 1).dtype is ls.int32
    assert (i + 1.5).dtype is ls.float32                       # a float scalar promotes an int tensor
    h = g.input("h", (3,), ls.float16)
    assert (h * 2.0).dtype is ls.float16                       # a Python float keeps the tensor's float type
    prog = g.compile([i + 1.5], backend="reference")
    (out,) = prog(i=np.array([1, 2, 3], np.int32))
    np.testing.assert_array_equal(out, np.array([2.5, 3.5, 4.5], np.float32))


def test_array_constants_small_by_content_large_by_identity_and_keep_their_values():
    g = ls.Graph()
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    a1, a2 = g.constant(arr), g.constant(arr)
    assert a1.node is a2.node
    copy = g.constant(arr.copy())
    assert copy.node is a1.node                                 # a small table: equal content is one node
    assert g.constant(arr + 1).node is not a1.node
    assert g.constant(arr.astype(np.int32)).node is not a1.node  # same values, other dtype
    big = np.zeros(4096, np.float32)
    assert g.constant(big.copy()).node is not g.constant(big).node  # large: identity, no hashing of weights
    assert isinstance(a1.node.arg, ArrayConst) and a1.shape == (2, 3) and a1.dtype is ls.float32
    (out,) = g.compile([a1 + g.constant(arr + 1)], backend="reference")()
    np.testing.assert_array_equal(out, arr * 2 + 1)


def test_array_constant_dtype_conversion_and_bfloat16_bits():
    g = ls.Graph()
    ints = g.constant(np.array([1, 2, 3], dtype=np.int64), ls.int32)
    assert ints.dtype is ls.int32
    bits = np.array([0x3F80, 0x4000, 0xC040], dtype=np.uint16)  # 1.0, 2.0, -3.0 as bfloat16
    bf = g.constant(bits, ls.bfloat16)
    assert bf.dtype is ls.bfloat16
    out_i, out_bf = g.compile([ints, bf.cast(ls.float32)], backend="reference")()
    assert out_i.dtype == np.int32 and out_i.tolist() == [1, 2, 3]
    assert out_bf.tolist() == [1.0, 2.0, -3.0]


def test_iota_and_constant_dim():
    n = ls.dim("n", 1, 32)
    g = ls.Graph()
    x = g.input("x", (n,), ls.float32)
    idx = g.iota(n)
    count = g.constant_dim(n, ls.float32)
    prog = g.compile([idx, x * 0.0 + count], backend="reference")
    for size in (1, 7):
        got_idx, got_count = prog(x=np.zeros(size, np.float32))
        assert got_idx.dtype == np.int32 and got_idx.tolist() == list(range(size))
        assert got_count.tolist() == [float(size)] * size
