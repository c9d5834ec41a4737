"""q4_k and q6_k with int16 activations (qdot16k.h): calls of at most 8 rows quantize their activations and
take integer dot products, longer calls keep float activations' bits; the AVX2 kernels (built on AVX-512 CPUs
too, and with AVX-512 switched off as on an AVX2-only machine) and the portable form give the same bits; a row
rounds the same alone and batched; the largest weights and activations do not overflow the integer sums. With
AVX-512 VNNI q4_k takes qdot16x16.h's 16-row kernels instead (test_repack.py): PER_ROW builds keep these."""
from __future__ import annotations

import numpy as np
import pytest

from cpu_flags import has_flags
from lightspeed.backend.c.compiler import CompilerError, compile_shared, default_flags
from lightspeed.quant import QType
from quant_blocks import random_raw
from test_quantized_matmul import build

KQUANTS = [QType.Q4_K, QType.Q6_K]
needs_avx2 = pytest.mark.skipif(not has_flags("avx2", "fma", "f16c"), reason="needs a CPU with AVX2, FMA and F16C")
AVX2_ONLY = default_flags() + (["-mno-avx512f"] if has_flags("avx512f") else [])
PER_ROW = default_flags() + ["-DLS_NO_QDOT16X16"]  # the per-row kernels where the 16-row ones would take q4_k


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("qtype", KQUANTS, ids=lambda q: q.name)
@pytest.mark.parametrize("portable", [False, True], ids=["simd", "portable"])
def test_few_rows_quantize_and_long_calls_stay_float(qtype: QType, portable: bool) -> None:
    rng = np.random.default_rng(700 + int(qtype))
    k, n = 4 * 256, 21
    g, y = build(qtype, k, n, random_raw(qtype, n, k, rng), with_bias=False)
    ref = g.compile([y], backend="reference")
    flags = None if portable else PER_ROW
    i16 = g.compile([y], backend="c", activations="int16", portable=portable, flags=flags, plan_cache=False)
    flt = g.compile([y], backend="c", activations="float", portable=portable, flags=flags, plan_cache=False)
    assert [bool(kk.scratch) for kk in i16.executor.plan.kernels if kk.kind == "qmatmul"] == [True]
    assert f"ls_qdot16_{qtype.name.lower()}(" in i16.executor.source and not i16.executor.reads_repacked(qtype)
    for m in (1, 2, 3, 8, 9, 13):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        (want,) = ref(x=xv)
        (a,) = i16(x=xv)
        if m <= 8:
            assert not np.array_equal(a, flt(x=xv)[0])  # the integer path ran
            assert rel_err(a, want) < 1e-3  # int16 rounding of the activations
        else:
            np.testing.assert_array_equal(a, flt(x=xv)[0])


@pytest.mark.parametrize("qtype", KQUANTS, ids=lambda q: q.name)
def test_int8_mode_leaves_k_quants_float(qtype: QType) -> None:
    rng = np.random.default_rng(710)
    g, y = build(qtype, 256, 8, random_raw(qtype, 8, 256, rng), with_bias=False)
    for mode in ("int8", "float"):
        prog = g.compile([y], backend="c", activations=mode, plan_cache=False)
        assert [bool(kk.scratch) for kk in prog.executor.plan.kernels if kk.kind == "qmatmul"] == [False]


@needs_avx2
@pytest.mark.parametrize("qtype", KQUANTS, ids=lambda q: q.name)
@pytest.mark.parametrize("flags", ["native", "avx2-only"])
def test_simd_and_portable_give_the_same_bits(qtype: QType, flags: str) -> None:
    rng = np.random.default_rng(720 + int(qtype))
    k, n = 3 * 256, 19
    g, y = build(qtype, k, n, random_raw(qtype, n, k, rng, extreme=0.05), with_bias=False)
    simd = g.compile([y], backend="c", activations="int16", plan_cache=False,
                     flags=PER_ROW if flags == "native" else AVX2_ONLY)
    port = g.compile([y], backend="c", activations="int16", portable=True, plan_cache=False)
    for m in (1, 2, 5, 8):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        np.testing.assert_array_equal(simd(x=xv)[0], port(x=xv)[0])


@pytest.mark.parametrize("qtype", KQUANTS, ids=lambda q: q.name)
def test_a_row_has_the_same_bits_alone_and_batched(qtype: QType) -> None:
    rng = np.random.default_rng(730 + int(qtype))
    k, n = 2 * 256, 40
    g, y = build(qtype, k, n, random_raw(qtype, n, k, rng), with_bias=False)
    prog = g.compile([y], backend="c", activations="int16", plan_cache=False)
    xv = rng.standard_normal((8, k)).astype(np.float32)
    alone = np.concatenate([prog(x=xv[i:i + 1])[0] for i in range(8)])
    np.testing.assert_array_equal(prog(x=xv)[0], alone)
    np.testing.assert_array_equal(prog(x=xv[:3])[0], alone[:3])


def _largest_blocks(qtype: QType, rows: int, k: int) -> np.ndarray:
    """Blocks whose every weight has the largest magnitude the format allows, of one sign: q4_k nibbles 15 at
    scale 63 (and min 0); q6_k values 0 (q - 32 = -32) at scale -128."""
    nb = k // 256
    if qtype == QType.Q4_K:
        blk = np.zeros(144, np.uint8)
        blk[0:2] = np.array([0.01], np.float16).view(np.uint8)
        blk[4:8] = 63  # scales of blocks 0-3 (top bits of 4-7: the high two bits, set too)
        blk[4:8] |= 0xC0
        blk[12:16] = 0x0F  # low bits of scales 4-7; mins 0
        blk[16:] = 0xFF
    else:
        blk = np.zeros(210, np.uint8)
        blk[192:208] = np.array([-128] * 16, np.int8).view(np.uint8)
        blk[208:210] = np.array([0.01], np.float16).view(np.uint8)
    return np.tile(blk, (rows, nb))


@pytest.mark.parametrize("qtype", KQUANTS, ids=lambda q: q.name)
@pytest.mark.parametrize("portable", [False, True], ids=["simd", "portable"])
def test_the_largest_products_do_not_overflow(qtype: QType, portable: bool) -> None:
    k, n = 2 * 256, 8
    g, y = build(qtype, k, n, _largest_blocks(qtype, n, k), with_bias=False)
    ref = g.compile([y], backend="reference")
    prog = g.compile([y], backend="c", activations="int16", portable=portable, plan_cache=False)
    xv = np.full((2, k), 3.0, np.float32)  # sin(1.5) everywhere: every int16 activation at its largest
    (want,) = ref(x=xv)
    assert np.all(np.abs(want) > 1.0)
    assert rel_err(prog(x=xv)[0], want) < 1e-4


@needs_avx2
def test_the_avx2_kernels_are_built() -> None:
    """The bit checks cannot tell whether the SIMD kernels were compiled at all; the preprocessor can."""
    rng = np.random.default_rng(740)
    g, y = build(QType.Q4_K, 256, 8, random_raw(QType.Q4_K, 8, 256, rng), with_bias=False)
    source = g.compile([y], backend="c", activations="int16", plan_cache=False).executor.source
    guard = "\n#if !defined(LS_HAVE_QDOT16_AVX2)\n#error the AVX2 int16 kernels are not built\n#endif\n"
    for flags in (default_flags(), AVX2_ONLY):
        try:
            compile_shared(source + guard, flags=flags)
        except CompilerError as e:
            pytest.fail(str(e)[:400])
    with pytest.raises(CompilerError):
        compile_shared(source + guard, flags=default_flags() + ["-DLS_PORTABLE"])
