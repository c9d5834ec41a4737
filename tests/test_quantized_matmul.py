"""The quantized-matmul kernel (a lowered alternative for x @ dequant(raw).T) against the primitive graph
run by the reference backend, for every GGUF block type it handles, odd sizes and symbolic rows; and the
generic fused path (templates disabled) against the same oracle."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.quant import QType, block_format
from lightspeed.quant.decode_graph import dequant_matrix_graph
from quant_blocks import SCALE_FIELDS, random_raw

def build(qtype: QType, k: int, n: int, raw: np.ndarray, with_bias: bool):
    g = ls.Graph()
    seq = ls.dim("seq", 1, 64)
    x = g.input("x", (seq, k))
    w = dequant_matrix_graph(g.constant(raw), qtype)
    h = (x * 0.5).sin()  # the activation is an expression: it must be materialised for the kernel
    y = h.linear(w, g.constant(np.linspace(-1, 1, n).astype(np.float32)) if with_bias else None)
    return g, y


@pytest.mark.parametrize("qtype", list(SCALE_FIELDS), ids=lambda q: q.name)
@pytest.mark.parametrize("templates,portable", [(True, False), (True, True), (False, False)],
                         ids=["template", "template-portable", "generic"])
def test_quantized_linear_matches_reference(qtype: QType, templates: bool, portable: bool) -> None:
    """``portable`` forces the plain-C path of the template (what CPUs without AVX2/AVX-512 run)."""
    rng = np.random.default_rng(int(qtype))
    k = 2 * block_format(qtype).block_elems if block_format(qtype).block_elems > 32 else 96
    n = 37  # not a multiple of anything the kernel tiles by
    raw = random_raw(qtype, n, k, rng)
    g, y = build(qtype, k, n, raw, with_bias=True)
    ref = g.compile([y], backend="reference")
    nat = g.compile([y], backend="c", templates=templates, portable=portable)
    schedules = [kern.kind for kern in nat.executor.plan.kernels]
    assert ("qmatmul" in schedules) == templates, schedules
    for m in (1, 3, 8, 13):  # one row (decode), a partial row group, a whole one, more than one
        xv = rng.standard_normal((m, k)).astype(np.float32)
        (want,) = ref(x=xv)
        (got,) = nat(x=xv)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.abs(want).max()))


def test_template_reads_raw_blocks_without_decoding_them_to_memory() -> None:
    rng = np.random.default_rng(1)
    k, n = 256, 300
    raw = random_raw(QType.Q8_0, n, k, rng)
    g, y = build(QType.Q8_0, k, n, raw, with_bias=False)
    prog = g.compile([y], backend="c")
    # only the activation rows (64 at most, float32) live in the arena: the decoded weight never exists
    assert prog.arena_bytes == 64 * k * 4 < n * k * 4
    xv = rng.standard_normal((2, k)).astype(np.float32)
    (got,) = prog(x=xv)
    (want,) = g.compile([y], backend="reference")(x=xv)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-4)


def test_single_row_activation_uses_the_template() -> None:
    """A [1, k] activation (the last position's hidden state before the logits) has no row index."""
    rng = np.random.default_rng(3)
    k, n = 64, 50
    raw = random_raw(QType.Q8_0, n, k, rng)
    g = ls.Graph()
    x = g.input("x", (1, k))
    y = x.linear(dequant_matrix_graph(g.constant(raw), QType.Q8_0))
    prog = g.compile([y], backend="c")
    assert [kern.kind for kern in prog.executor.plan.kernels] == ["qmatmul"]
    xv = rng.standard_normal((1, k)).astype(np.float32)
    np.testing.assert_allclose(prog(x=xv)[0], g.compile([y])(x=xv)[0], rtol=2e-5, atol=1e-4)


def test_weight_read_through_another_view_is_not_matched() -> None:
    """x @ W (not W.T) reads the decoded weight along its columns: the template must not claim it."""
    rng = np.random.default_rng(2)
    k = 64
    raw = random_raw(QType.Q8_0, k, k, rng)
    g = ls.Graph()
    x = g.input("x", (3, k))
    w = dequant_matrix_graph(g.constant(raw), QType.Q8_0)
    y = x @ w
    prog = g.compile([y], backend="c")
    assert all(kern.kind != "qmatmul" for kern in prog.executor.plan.kernels)
    xv = rng.standard_normal((3, k)).astype(np.float32)
    np.testing.assert_allclose(prog(x=xv)[0], g.compile([y])(x=xv)[0], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("qtype", [QType.Q8_0, QType.Q4_0, QType.Q4_1], ids=lambda q: q.name)
@pytest.mark.parametrize("portable", [False, True], ids=["simd", "portable"])
def test_int8_activations_stay_close_to_the_float_product(qtype: QType, portable: bool) -> None:
    """int8 activations (per-32-block scales) approximate the exact product within quantisation error;
    the portable build ignores the option and stays exact."""
    rng = np.random.default_rng(10 + int(qtype))
    k, n = 256, 29
    raw = random_raw(qtype, n, k, rng)
    g, y = build(qtype, k, n, raw, with_bias=False)
    ref = g.compile([y], backend="reference")
    fast = g.compile([y], backend="c", int8_activations=True, portable=portable)
    assert [kern.scratch != [] for kern in fast.executor.plan.kernels] == [False, True]  # sin(x/2), qmatmul
    for m in (1, 5, 8, 11):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        (want,) = ref(x=xv)
        (got,) = fast(x=xv)
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        if portable:
            assert err < 1e-5
        else:
            assert 1e-5 < err < 2e-2  # quantised, but only by int8 rounding of the activations


@pytest.mark.parametrize("qtype", list(SCALE_FIELDS), ids=lambda q: q.name)
@pytest.mark.parametrize("portable", [False, True], ids=["simd", "portable"])
def test_int16_activations_stay_within_their_rounding_of_the_float_product(qtype: QType, portable: bool) -> None:
    """int16 activations (per-32-block scales amax/32767) apply to Q8_0/Q4_0/Q4_1, on every path, and to Q5_0,
    Q4_K and Q6_K in calls of up to 8 rows (Q5_0 at every row count where the build reads it repacked), and stay
    within int16 rounding of the exact product (~2e-5, 1/258 of int8's); the other types, and the longer calls of
    those three, keep float."""
    rng = np.random.default_rng(30 + int(qtype))
    be = block_format(qtype).block_elems
    k, n = (3 * be if be > 32 else 7 * 32), 37  # odd block counts and output rows
    raw = random_raw(qtype, n, k, rng)
    g, y = build(qtype, k, n, raw, with_bias=True)
    ref = g.compile([y], backend="reference")
    prog = g.compile([y], backend="c", activations="int16", portable=portable)
    few_rows_type = qtype in (QType.Q5_0, QType.Q4_K, QType.Q6_K)
    quantized = few_rows_type or qtype in (QType.Q8_0, QType.Q4_0, QType.Q4_1)
    short_only = few_rows_type and not prog.executor.reads_repacked(qtype)
    assert [kern.scratch != [] for kern in prog.executor.plan.kernels if kern.kind == "qmatmul"] == [quantized]
    assert ("ls_qdot16_" + qtype.name.lower() + "(wraw") in prog.executor.source if quantized else True
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 13, 33, 64):  # decode and batched rows, prefill sizes
        xv = rng.standard_normal((m, k)).astype(np.float32)
        (want,) = ref(x=xv)
        (got,) = prog(x=xv)
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        if quantized and (not short_only or m <= 8):
            assert 1e-6 < err < 6e-5, (m, err)
        else:
            assert err < 2e-6, (m, err)


def test_activation_modes_are_checked_and_compile_apart() -> None:
    """Unknown modes fail naming the choices; a program compiled under one mode is not reused (plan cache)
    for another; ``int8_activations=True`` is the older spelling of int8."""
    rng = np.random.default_rng(40)
    k, n = 64, 9
    g, y = build(QType.Q8_0, k, n, random_raw(QType.Q8_0, n, k, rng), with_bias=False)
    with pytest.raises(ValueError, match="float, int16, int8"):
        g.compile([y], backend="c", activations="int4")
    with pytest.raises(ValueError, match="contradicts"):
        g.compile([y], backend="c", activations="int16", int8_activations=True)
    calls = ["ls_qdot_q8_0(wraw", "ls_qdot16_q8_0(wraw", "ls_qdot8_q8_0(wraw"]
    # the calls each mode renders (int8 keeps the float path for CPUs without its SIMD kernels)
    wanted = {"float": [True, False, False], "int16": [False, True, False], "int8": [True, False, True]}
    for opts, mode in [({}, "float"), (dict(activations="int16"), "int16"), (dict(activations="int8"), "int8"),
                       (dict(int8_activations=True), "int8"), (dict(activations="int16"), "int16"), ({}, "float")]:
        src = g.compile([y], backend="c", **opts).executor.source
        assert [c in src for c in calls] == wanted[mode], (opts, mode)


@pytest.mark.parametrize("qtype", [QType.Q8_0, QType.Q4_0, QType.Q4_1], ids=lambda q: q.name)
@pytest.mark.parametrize("mode,portable", [("float", False), ("int8", False), ("int16", False), ("int16", True)],
                         ids=["float", "int8", "int16", "int16-portable"])
def test_a_row_gives_the_same_bits_alone_and_in_any_batch(qtype: QType, mode: str, portable: bool) -> None:
    """Batched decoding must not change a sequence's result: each activation row's dot products are
    bit-identical whatever the number of rows (1 to 8 share one pass over the weights, more take several)."""
    rng = np.random.default_rng(20 + int(qtype))
    k, n = 160, 45  # 5 blocks: an odd count
    raw = random_raw(qtype, n, k, rng)
    g, y = build(qtype, k, n, raw, with_bias=False)
    prog = g.compile([y], backend="c", activations=mode, portable=portable)
    xv = rng.standard_normal((19, k)).astype(np.float32)
    (full,) = prog(x=xv)
    for m in (1, 2, 5, 8, 9, 16):
        (part,) = prog(x=xv[:m])
        np.testing.assert_array_equal(part, full[:m])
    for r in (0, 7, 8, 18):
        (alone,) = prog(x=xv[r:r + 1])
        np.testing.assert_array_equal(alone[0], full[r])
