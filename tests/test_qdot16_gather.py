"""The AVX-512 int16-activation dot products with the scales of 16 blocks gathered at once (qdecode.h) against
the per-block form they replace (-DLS_NO_QDOT16_GATHER forces it) and the exact product: both stay within int16
rounding, agree with each other to float rounding, and give a row the same bits alone and in any batch."""
from __future__ import annotations

import numpy as np
import pytest

from cpu_flags import has_flags
from lightspeed.backend.c.activations import resolve_activations
from lightspeed.backend.c.compiler import default_flags
from lightspeed.quant import QType
from quant_blocks import random_raw
from test_quantized_matmul import build

ONE_ROW = default_flags() + ["-DLS_NO_QDOT16X16"]  # these kernels, not the 16-row ones of qdot16x16.h
FORCED_OFF = ONE_ROW + ["-DLS_NO_QDOT16_GATHER"]
needs_avx512 = pytest.mark.skipif(not has_flags("avx512f", "avx512bw"), reason="the kernels are AVX-512 ones")


@needs_avx512
@pytest.mark.parametrize("qtype", [QType.Q8_0, QType.Q4_0, QType.Q4_1], ids=lambda q: q.name)
@pytest.mark.parametrize("k", [32, 18 * 32, 48 * 32 + 32], ids=["1-block", "18-blocks", "49-blocks"])
def test_gathered_scales_match_the_per_block_form(qtype: QType, k: int) -> None:
    rng = np.random.default_rng(60 + int(qtype) + k)
    n = 29
    g, y = build(qtype, k, n, random_raw(qtype, n, k, rng), with_bias=False)
    ref = g.compile([y], backend="reference")
    fast = g.compile([y], backend="c", activations="int16", flags=ONE_ROW, plan_cache=False)
    per_block = g.compile([y], backend="c", activations="int16", flags=FORCED_OFF, plan_cache=False)
    for m in (1, 2, 7, 8, 11):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        (want,) = ref(x=xv)
        (a,) = fast(x=xv)
        (b,) = per_block(x=xv)
        assert not np.array_equal(a, b) or k == 32  # really two kernels (one block: the same sums)
        for got in (a, b):
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            assert 1e-7 < err < 6e-5, (m, err)
        # the same integer products and scales, summed in another order
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-6 * float(np.abs(b).max()))


@needs_avx512
@pytest.mark.parametrize("qtype", [QType.Q8_0, QType.Q4_1], ids=lambda q: q.name)
def test_gathered_scales_give_a_row_the_same_bits_in_any_batch(qtype: QType) -> None:
    rng = np.random.default_rng(70 + int(qtype))
    k, n = 21 * 32, 33
    g, y = build(qtype, k, n, random_raw(qtype, n, k, rng), with_bias=False)
    prog = g.compile([y], backend="c", activations="int16", flags=ONE_ROW, plan_cache=False)
    xv = rng.standard_normal((8, k)).astype(np.float32)
    (full,) = prog(x=xv)
    for r in range(8):
        np.testing.assert_array_equal(prog(x=xv[r:r + 1])[0][0], full[r])
    np.testing.assert_array_equal(prog(x=xv[:5])[0], full[:5])


@pytest.mark.skipif(not has_flags("avx2", "fma"), reason="an AVX2 build needs an AVX2 CPU")
@pytest.mark.parametrize("qtype", [QType.Q8_0, QType.Q4_1], ids=lambda q: q.name)
def test_an_avx2_build_keeps_int16_and_auto_takes_its_kernels(qtype: QType) -> None:
    """-mno-avx512f builds the AVX2 kernels on any AVX2 CPU: int16 stays within its rounding there, and "auto"
    gives int16's bits for calls of at most its row limit and, past it, the float kernel's (qgemm.h), or int16's
    at every row count where this CPU's "auto" has no limit (AVX-512 VNNI without AMX)."""
    rng = np.random.default_rng(80 + int(qtype))
    k, n = 18 * 32, 21
    g, y = build(qtype, k, n, random_raw(qtype, n, k, rng), with_bias=False)
    avx2 = default_flags() + ["-mno-avx512f"]
    ref = g.compile([y], backend="reference")
    progs = {mode: g.compile([y], backend="c", activations=mode, flags=avx2, plan_cache=False)
             for mode in ("int16", "float", "auto")}
    mode, limit = resolve_activations("auto")
    assert ("#define LS_QUANT_ROWS_MAX" in progs["auto"].executor.source) == (limit is not None)
    for m in (1, 8, 9, 20):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        (want,) = ref(x=xv)
        got = {name: p(x=xv)[0] for name, p in progs.items()}
        err = float(np.linalg.norm(got["int16"] - want) / np.linalg.norm(want))
        assert 1e-7 < err < 6e-5, (m, err)
        expected = mode if limit is None or m <= limit else "float"
        np.testing.assert_array_equal(got["auto"], got[expected], err_msg=f"{m} rows")
