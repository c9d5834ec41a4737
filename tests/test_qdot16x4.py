"""The AVX2 int16-activation kernels that do four weight rows at once for one or two activation rows
(qdot16x4.h): they must give exactly the bits of the one-row kernels of qdecode.h they replace (-DLS_NO_QDOT16X4
forces those), so a row gets the same result in a group of four, in a last group of fewer rows, alone or
batched, and both stay within int16 rounding of the exact product. On AVX-512 CPUs the kernels are built with
AVX-512 switched off (-mno-avx512f), as on an AVX2-only machine."""
from __future__ import annotations

import numpy as np
import pytest

from cpu_flags import has_flags
from lightspeed.backend.c.compiler import CompilerError, compile_shared, default_flags
from lightspeed.quant import QType
from quant_blocks import random_raw
from test_quantized_matmul import build

needs_avx2 = pytest.mark.skipif(not has_flags("avx2", "fma", "f16c"), reason="needs a CPU with AVX2, FMA and F16C")
AVX2 = default_flags() + (["-mno-avx512f"] if has_flags("avx512f") else [])
FORCED_OFF = AVX2 + ["-DLS_NO_QDOT16X4"]
# q5_0's per-row and four-row kernels as AVX-512 CPUs without VNNI build them: with VNNI the 16-row kernels of
# qdot16x16.h take q5_0 too (test_repack.py)
PER_ROW = default_flags() + ["-DLS_NO_QDOT16X16"]
QTYPES = [QType.Q8_0, QType.Q4_0, QType.Q4_1]


def four_row_flags(qtype: QType) -> list[str]:
    """q8_0's four-row kernel is built only on request (qdot16x4.h says why)."""
    return AVX2 + (["-DLS_QDOT16X4_Q8_0"] if qtype == QType.Q8_0 else [])


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@needs_avx2
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("k", [32, 18 * 32, 49 * 32], ids=["1-block", "18-blocks", "49-blocks"])
@pytest.mark.parametrize("n", [4, 7, 37])  # a whole group, a group and a tail, many groups and a tail
def test_four_rows_give_the_one_row_kernels_bits(qtype: QType, k: int, n: int) -> None:
    rng = np.random.default_rng(300 + int(qtype) + k + n)
    g, y = build(qtype, k, n, random_raw(qtype, n, k, rng), with_bias=False)
    ref = g.compile([y], backend="reference")
    four = g.compile([y], backend="c", activations="int16", flags=four_row_flags(qtype), plan_cache=False)
    one = g.compile([y], backend="c", activations="int16", flags=FORCED_OFF, plan_cache=False)
    assert "ls_qdot16x4_" in four.executor.source
    for m in (1, 2, 3):  # the kernel's row counts, and one it leaves to the per-row kernel
        xv = rng.standard_normal((m, k)).astype(np.float32)
        (want,) = ref(x=xv)
        (a,) = four(x=xv)
        (b,) = one(x=xv)
        np.testing.assert_array_equal(a, b)
        assert rel_err(a, want) < 1e-3  # int16 rounding of the activations


@needs_avx2
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_a_row_has_the_same_bits_alone_and_batched(qtype: QType) -> None:
    """Rows 0-1 of a 3-row call (the per-row kernel) and of a 2-row call (four weight rows at once) equal the
    same rows run one at a time."""
    rng = np.random.default_rng(400 + int(qtype))
    k, n = 18 * 32, 42
    g, y = build(qtype, k, n, random_raw(qtype, n, k, rng), with_bias=False)
    prog = g.compile([y], backend="c", activations="int16", flags=four_row_flags(qtype), plan_cache=False)
    xv = rng.standard_normal((3, k)).astype(np.float32)
    alone = np.concatenate([prog(x=xv[i:i + 1])[0] for i in range(3)])
    np.testing.assert_array_equal(prog(x=xv)[0], alone)
    np.testing.assert_array_equal(prog(x=xv[:2])[0], alone[:2])


@needs_avx2
def test_every_avx2_cpu_builds_the_four_row_kernels() -> None:
    """The bit checks above cannot tell whether the four-row kernels were compiled at all; the preprocessor can
    (they are meant for every AVX2 build without AVX-512, and off with LS_NO_QDOT16X4)."""
    rng = np.random.default_rng(7)
    g, y = build(QType.Q4_1, 64, 8, random_raw(QType.Q4_1, 8, 64, rng), with_bias=False)
    source = g.compile([y], backend="c", activations="int16", flags=AVX2, plan_cache=False).executor.source
    guard = ("\n#if !defined(LS_HAVE_QDOT16X4_q4_0) || !defined(LS_HAVE_QDOT16X4_q4_1)\n"
             "#error the four-row kernels of qdot16x4.h are not built\n#endif\n")
    q8_guard = "\n#if !defined(LS_HAVE_QDOT16X4_q8_0)\n#error no q8_0 kernel\n#endif\n"
    try:
        compile_shared(source + guard, flags=AVX2)
        compile_shared(source + q8_guard, flags=four_row_flags(QType.Q8_0))
    except CompilerError as e:
        pytest.fail(str(e)[:400])
    with pytest.raises(CompilerError):
        compile_shared(source + guard, flags=FORCED_OFF)
    with pytest.raises(CompilerError):  # q8_0 keeps its per-row kernel by default
        compile_shared(source + q8_guard, flags=AVX2)


@needs_avx2
@pytest.mark.parametrize("n", [4, 7, 37])
def test_q5_0_four_rows_give_the_one_row_kernels_bits(n: int) -> None:
    """q5_0 takes int16 activations for calls of up to 8 rows (qdot16x4.h's q5_0 section), on AVX-512 CPUs without
    VNNI too."""
    _q5_0_builds_agree(500 + n, 18 * 32, n, "LS_NO_QDOT16X4", (1, 2, 3))


def _q5_0_builds_agree(seed: int, k: int, n: int, macro: str, rows: tuple[int, ...], guard: str = "") -> None:
    """A q5_0 int16 matmul gives the same bits built with the per-row kernels (PER_ROW) and with -D``macro`` too,
    at each row count; ``guard``: preprocessor lines the first build must compile with (that it took the path
    under test)."""
    rng = np.random.default_rng(seed)
    g, y = build(QType.Q5_0, k, n, random_raw(QType.Q5_0, n, k, rng), with_bias=False)
    usual = g.compile([y], backend="c", activations="int16", flags=PER_ROW, plan_cache=False)
    other = g.compile([y], backend="c", activations="int16", flags=PER_ROW + [f"-D{macro}"], plan_cache=False)
    if guard:
        compile_shared(usual.executor.source + guard, flags=PER_ROW)
    for m in rows:
        xv = rng.standard_normal((m, k)).astype(np.float32)
        np.testing.assert_array_equal(usual(x=xv)[0], other(x=xv)[0])


@pytest.mark.parametrize("portable", [False, True], ids=["simd", "portable"])
def test_q5_0_quantizes_few_rows_and_keeps_long_calls_float(portable: bool) -> None:
    """Calls of at most 8 rows run int16 (within its rounding of the exact product, not float's bits); longer
    ones give float activations' bits exactly (where the weights are read in the GGUF layout: the per-row kernels,
    the portable form; the 16-row kernels read them repacked and take every row count, test_repack.py); "int8"
    leaves q5_0 float; the portable form has the per-row SIMD kernels' bits."""
    rng = np.random.default_rng(600)
    k, n = 18 * 32, 21
    g, y = build(QType.Q5_0, k, n, random_raw(QType.Q5_0, n, k, rng), with_bias=False)
    ref = g.compile([y], backend="reference")
    flags = None if portable else PER_ROW
    i16 = g.compile([y], backend="c", activations="int16", portable=portable, flags=flags, plan_cache=False)
    flt = g.compile([y], backend="c", activations="float", portable=portable, flags=flags, plan_cache=False)
    assert [bool(kk.scratch) for kk in i16.executor.plan.kernels if kk.kind == "qmatmul"] == [True]
    assert not i16.executor.reads_repacked(QType.Q5_0)
    i8 = g.compile([y], backend="c", activations="int8", plan_cache=False)
    assert [bool(kk.scratch) for kk in i8.executor.plan.kernels if kk.kind == "qmatmul"] == [False]
    simd = g.compile([y], backend="c", activations="int16", flags=PER_ROW, plan_cache=False) if portable else i16
    for m in (1, 3, 8, 9, 13):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        (want,) = ref(x=xv)
        (a,) = i16(x=xv)
        if m <= 8:
            assert not np.array_equal(a, flt(x=xv)[0])
            assert rel_err(a, want) < 1e-3
        else:
            np.testing.assert_array_equal(a, flt(x=xv)[0])
        np.testing.assert_array_equal(a, simd(x=xv)[0])


@pytest.mark.skipif(not has_flags("avx512bw", "avx512vl"), reason="needs a CPU with AVX-512 BW and VL")
@pytest.mark.parametrize("n", [4, 37])
def test_q5_0_masked_high_bits_give_the_avx2_bits(n: int) -> None:
    """With AVX-512 BW/VL a q5_0 block's high bits are the masks of two masked subtractions: the same weights, so
    the same bits as the AVX2 form (-DLS_NO_Q5_0_MASKS), in the four-row and the per-row kernel."""
    _q5_0_builds_agree(800 + n, 20 * 32, n, "LS_NO_Q5_0_MASKS", (1, 2, 3, 8),
                       guard="\n#if !defined(__AVX512BW__)\n#error not an AVX-512 BW build\n#endif\n")

