"""Errors a caller can make, when building a graph and when running a compiled one.

Every error is a ValueError whose message names the problem: the input, the dimension, the op,
the shapes, the dtype.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import lightspeed as ls


@pytest.fixture
def prog():
    """y = x @ w + b with x: (seq, 4), w: (4, 3), b: (3,), plus a dim 'pos' that only a view uses."""
    seq = ls.dim("seq", 1, 16)
    pos = ls.dim("pos", 0, 7)
    g = ls.Graph()
    x = g.input("x", (seq, 4), ls.float32)
    w = g.input("w", (4, 3), ls.float32)
    b = g.input("b", (8, 3), ls.float32)
    return g.compile([x @ w + b[pos]], backend="reference")


def good_inputs(n: int = 5) -> dict[str, np.ndarray]:
    return {"x": np.ones((n, 4), np.float32), "w": np.ones((4, 3), np.float32), "b": np.zeros((8, 3), np.float32)}


def test_good_call_runs(prog):
    (y,) = prog(dims={"pos": 2}, **good_inputs())
    assert y.shape == (5, 3)
    np.testing.assert_allclose(y, 4.0)


def test_missing_input(prog):
    inputs = good_inputs()
    del inputs["w"]
    with pytest.raises(ValueError, match=r"missing input.*'w'"):
        prog(dims={"pos": 0}, **inputs)


def test_extra_input(prog):
    with pytest.raises(ValueError, match=r"unexpected input.*'bias'"):
        prog(dims={"pos": 0}, bias=np.zeros(3, np.float32), **good_inputs())


def test_wrong_dtype(prog):
    inputs = good_inputs()
    inputs["w"] = inputs["w"].astype(np.float64)
    with pytest.raises(ValueError, match=r"input 'w' has dtype float64, expected float32"):
        prog(dims={"pos": 0}, **inputs)


def test_not_an_array(prog):
    inputs = good_inputs()
    inputs["w"] = inputs["w"].tolist()
    with pytest.raises(ValueError, match=r"input 'w' must be a numpy array, got list"):
        prog(dims={"pos": 0}, **inputs)


@pytest.mark.parametrize("name, shape", [("w", (4, 4)), ("w", (4,)), ("b", (3, 8)), ("x", (5, 4, 1))])
def test_wrong_shape(prog, name, shape):
    inputs = good_inputs()
    inputs[name] = np.ones(shape, np.float32)
    with pytest.raises(ValueError, match=rf"input '{name}' has shape {re.escape(str(shape))}, expected"):
        prog(dims={"pos": 0}, **inputs)


def test_unbound_symbolic_dim(prog):
    with pytest.raises(ValueError, match=r"dimension 'pos' is unbound.*dims="):
        prog(**good_inputs())


@pytest.mark.parametrize("n", [0, 17])
def test_input_dim_outside_bounds(prog, n):
    with pytest.raises(ValueError, match=rf"dimension 'seq' = {n} is outside its bounds \[1, 16\]"):
        prog(dims={"pos": 0}, **good_inputs(n))


@pytest.mark.parametrize("p", [-1, 8])
def test_passed_dim_outside_bounds(prog, p):
    with pytest.raises(ValueError, match=rf"dimension 'pos' = {p} is outside its bounds \[0, 7\]"):
        prog(dims={"pos": p}, **good_inputs())


def test_unknown_or_non_int_dim(prog):
    with pytest.raises(ValueError, match=r"unknown dimension 'len'.*\['pos', 'seq'\]"):
        prog(dims={"pos": 0, "len": 3}, **good_inputs())
    with pytest.raises(ValueError, match=r"dimension 'pos' must be an int, got float"):
        prog(dims={"pos": 1.0}, **good_inputs())


def test_inconsistent_symbolic_dim_between_inputs():
    seq = ls.dim("seq", 1, 16)
    g = ls.Graph()
    x = g.input("x", (seq, 2), ls.float32)
    m = g.input("m", (seq,), ls.float32)
    prog = g.compile([x * m.unsqueeze(-1)], backend="reference")
    with pytest.raises(ValueError, match=r"input 'm' .*size 4.*'seq' is 3"):
        prog(x=np.ones((3, 2), np.float32), m=np.ones(4, np.float32))


def test_passed_dim_contradicting_an_input():
    seq = ls.dim("seq", 1, 16)
    g = ls.Graph()
    x = g.input("x", (seq,), ls.float32)
    prog = g.compile([x + 1.0], backend="reference")
    with pytest.raises(ValueError, match=r"input 'x' axis 0 has size 3, but dimension 'seq' is 4"):
        prog(x=np.ones(3, np.float32), dims={"seq": 4})


def test_expression_shaped_input_checks_the_evaluated_shape():
    n = ls.dim("n", 1, 8)
    g = ls.Graph()
    x = g.input("x", (n,), ls.float32)
    y = g.input("y", (n * 2,), ls.float32)
    prog = g.compile([x.unsqueeze(-1).expand(n, 2).reshape(n * 2) + y], backend="reference")
    with pytest.raises(ValueError, match=r"input 'y' has shape \(5,\), expected \(6,\)"):
        prog(x=np.ones(3, np.float32), y=np.ones(5, np.float32))
    (out,) = prog(x=np.ones(3, np.float32), y=np.ones(6, np.float32))
    np.testing.assert_array_equal(out, np.full(6, 2.0, np.float32))


# --------------------------------------------------------------------------------------------
# building: incompatible shapes name the op and both shapes


@pytest.mark.parametrize("op, name", [
    (lambda a, b: a + b, "Add"),
    (lambda a, b: a * b, "Mul"),
    (lambda a, b: a % b, "Mod"),
    (lambda a, b: a < b, "LessThan"),
    (lambda a, b: a - b, "sub"),
    (lambda a, b: a / b, "div"),
    (lambda a, b: a.maximum(b), "maximum"),
])
def test_incompatible_shapes_name_op_and_shapes(op, name):
    g = ls.Graph()
    a = g.input("a", (2, 3), ls.float32)
    b = g.input("b", (4,), ls.float32)
    with pytest.raises(ValueError, match=rf"{name}: shapes \(2, 3\) and \(4,\) cannot be broadcast"):
        op(a, b)


def test_incompatible_symbolic_shapes_name_both_dims():
    s1, s2 = ls.dim("s1", 1, 8), ls.dim("s2", 1, 8)
    g = ls.Graph()
    a = g.input("a", (s1, 3), ls.float32)
    b = g.input("b", (s2, 3), ls.float32)
    with pytest.raises(ValueError, match=r"Add: shapes \(s1, 3\) and \(s2, 3\)"):
        a + b


def test_matmul_mismatch_names_shapes():
    g = ls.Graph()
    a = g.input("a", (2, 3), ls.float32)
    with pytest.raises(ValueError, match=r"matmul: shapes \(2, 3\) and \(2, 3\) do not align"):
        a @ a


def test_unary_on_integers_names_op_and_dtype():
    g = ls.Graph()
    i = g.input("i", (3,), ls.int32)
    with pytest.raises(ValueError, match=r"Sin: needs a floating-point operand, got int32"):
        i.sin()


def test_gather_and_scatter_argument_errors():
    g = ls.Graph()
    data = g.input("data", (5, 2), ls.float32)
    with pytest.raises(ValueError, match=r"gather: indices must be an integer Tensor, got (ls\.)?float32"):
        data.gather(g.input("fidx", (3,), ls.float32))
    idx = g.input("idx", (3,), ls.int32)
    with pytest.raises(ValueError, match=r"scatter: src has shape \(3, 4\), expected \(3, 2\)"):
        data.scatter(idx, g.input("src", (3, 4), ls.float32))


def test_unknown_backend_lists_the_available_ones():
    g = ls.Graph()
    x = g.input("x", (2,), ls.float32)
    with pytest.raises(ValueError, match=r"unknown backend 'tpu'.*reference"):
        g.compile([x + 1.0], backend="tpu")
