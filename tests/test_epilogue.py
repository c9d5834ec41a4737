"""Epilogue fusion (kernel/epilogue.py): the elementwise sole reader of a matmul runs inside the gemm kernel.
Fused where it should be (bias + activation, a residual add, a convolution's batch norm and ReLU), not fused
where it must not be (two readers, a transposed or broadcast read), and every result equal to the reference
backend, including the few-rows path of a symbolic row count."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.frontend import conv2d, linear, relu, silu

RNG = np.random.default_rng(0)


def _weights(*shape):
    return (RNG.standard_normal(shape) * 0.1).astype(np.float32)


def _check(g, outs, feeds, dims=None, tol=2e-5):
    prog = g.compile(outs, backend="c")
    ref = g.compile(outs, backend="reference")
    for got, want in zip(prog(dims=dims, **feeds), ref(dims=dims, **feeds)):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    return prog.executor.plan


def _kinds(plan):
    return [(k.kind, k.epilogue is not None) for k in plan.kernels]


@pytest.mark.parametrize("rows", [64, 1, 3, 200])
def test_bias_and_activation_fold_into_the_gemm(rows: int) -> None:
    g = ls.Graph()
    seq = ls.dim("seq", 1, 256)
    x = g.input("x", (seq, 96), ls.float32)
    y = silu(linear(x, g.constant(_weights(160, 96)), g.constant(_weights(160))))
    plan = _check(g, [y], {"x": RNG.standard_normal((rows, 96)).astype(np.float32)})
    assert _kinds(plan) == [("gemm", True)]
    assert not plan.temps  # the product's buffer is gone


def test_a_residual_add_folds_in_and_its_input_is_read_in_place() -> None:
    g = ls.Graph()
    x = g.input("x", (128, 64), ls.float32)
    h = g.input("h", (128, 96), ls.float32)
    y = h + linear(x, g.constant(_weights(96, 64)))
    plan = _check(g, [y], {"x": RNG.standard_normal((128, 64)).astype(np.float32),
                           "h": RNG.standard_normal((128, 96)).astype(np.float32)})
    assert _kinds(plan) == [("gemm", True)]


def test_two_readers_or_a_moved_read_keep_the_product_stored() -> None:
    g = ls.Graph()
    x = g.input("x", (64, 48), ls.float32)
    p = linear(x, g.constant(_weights(80, 48)))
    feeds = {"x": RNG.standard_normal((64, 48)).astype(np.float32)}
    plan = _check(g, [relu(p), p * 2.0], feeds)  # two readers
    assert ("gemm", True) not in _kinds(plan)
    g2 = ls.Graph()
    x2 = g2.input("x", (64, 48), ls.float32)
    q = linear(x2, g2.constant(_weights(64, 48)))
    plan = _check(g2, [relu(q.transpose(0, 1))], feeds)  # read at another index than its own
    assert ("gemm", True) not in _kinds(plan)


def test_a_convolution_takes_its_batch_norm_and_relu() -> None:
    g = ls.Graph()
    x = g.input("x", (2, 3, 32, 32), ls.float32)
    y = conv2d(x, g.constant(_weights(16, 3, 3, 3)), g.constant(_weights(16)), padding=1)
    scale = g.constant((1 + _weights(16)).reshape(1, 16, 1, 1))
    shift = g.constant(_weights(16).reshape(1, 16, 1, 1))
    out = relu(y * scale + shift)
    plan = _check(g, [out], {"x": RNG.standard_normal((2, 3, 32, 32)).astype(np.float32)})
    assert ("gemm", True) in _kinds(plan) and len(plan.kernels) == 1


def test_gelu_whose_part_is_stored_once_still_folds_in() -> None:
    """Kernel formation stores gelu's |x| once for the rest of its expression to read: both read the product,
    and both fold into the gemm (the stored part becomes a shared subexpression of the epilogue)."""
    from lightspeed.frontend import gelu
    g = ls.Graph()
    x = g.input("x", (64, 96), ls.float32)
    y = gelu(linear(x, g.constant(_weights(160, 96)), g.constant(_weights(160))))
    plan = _check(g, [y], {"x": RNG.standard_normal((64, 96)).astype(np.float32)})
    assert _kinds(plan) == [("gemm", True)]


def test_two_independent_readers_are_not_merged() -> None:
    g = ls.Graph()
    x = g.input("x", (64, 48), ls.float32)
    p = linear(x, g.constant(_weights(80, 48)))
    plan = _check(g, [relu(p), p * 2.0], {"x": RNG.standard_normal((64, 48)).astype(np.float32)})
    assert len(plan.kernels) == 3  # the product and each reader
