"""The AVX-512 VNNI int16-activation kernels that do 16 weight rows at once (qdot16x16.h) against the exact
product and against the one-row kernels they replace (-DLS_NO_QDOT16X16 forces those): both stay within int16
rounding and, computing the same integer products, agree with each other to float rounding; a weight row gets
the same bits alone and in any batch, and whatever the group of 16 (or the masked tail) it fell in."""
from __future__ import annotations

import numpy as np
import pytest

from cpu_flags import has_flags
from lightspeed.backend.c.compiler import CompilerError, compile_shared, default_flags
from lightspeed.quant import QType
from quant_blocks import random_raw
from test_quantized_matmul import build

FORCED_OFF = default_flags() + ["-DLS_NO_QDOT16X16"]
Q8_0_OFF = default_flags() + ["-DLS_NO_QDOT16X16_Q8_0"]  # q8_0 alone back on its per-row kernel
needs_vnni = pytest.mark.skipif(not has_flags("avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
                                reason="the kernels are AVX-512 VNNI ones")
QTYPES = [QType.Q8_0, QType.Q4_0, QType.Q4_1]


def wide_flags(qtype: QType) -> list[str] | None:
    return None  # every format's 16-row kernel is built by default


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@needs_vnni
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("k", [32, 18 * 32, 49 * 32], ids=["1-block", "18-blocks", "49-blocks"])
@pytest.mark.parametrize("n", [2, 15, 16, 17, 29, 40])  # (one row is not a quantized-matmul kernel)
def test_sixteen_rows_match_the_reference_and_the_one_row_kernels(qtype: QType, k: int, n: int) -> None:
    rng = np.random.default_rng(90 + int(qtype) + k + n)
    g, y = build(qtype, k, n, random_raw(qtype, n, k, rng), with_bias=False)
    ref = g.compile([y], backend="reference")
    wide = g.compile([y], backend="c", activations="int16", flags=wide_flags(qtype), plan_cache=False)
    one = g.compile([y], backend="c", activations="int16", flags=FORCED_OFF, plan_cache=False)
    for m in (1, 2, 7, 8):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        (want,) = ref(x=xv)
        (a,) = wide(x=xv)
        (b,) = one(x=xv)
        assert not np.array_equal(a, b) or k == 32  # really two kernels (one block: maybe the same sums)
        for got in (a, b):  # int16's rounding (int8's would be ~250x larger); a few outputs vary more
            assert 1e-7 < rel_err(got, want) < (6e-5 if a.size >= 64 else 1.5e-4), (m, rel_err(got, want))
        # the same integer products and scales, summed in another order
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-6 * float(np.abs(b).max()))


@needs_vnni
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_a_row_has_the_same_bits_in_any_batch(qtype: QType) -> None:
    rng = np.random.default_rng(100 + int(qtype))
    k, n = 21 * 32, 37
    g, y = build(qtype, k, n, random_raw(qtype, n, k, rng), with_bias=False)
    prog = g.compile([y], backend="c", activations="int16", flags=wide_flags(qtype), plan_cache=False)
    xv = rng.standard_normal((8, k)).astype(np.float32)
    (full,) = prog(x=xv)
    for r in range(8):
        np.testing.assert_array_equal(prog(x=xv[r:r + 1])[0][0], full[r])
    np.testing.assert_array_equal(prog(x=xv[:5])[0], full[:5])


@needs_vnni
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_a_weight_row_has_the_same_bits_in_any_group(qtype: QType) -> None:
    """The first 17 rows of a 40-row matrix fall in groups of 16 (0-15, 16-31) and a tail of 8; alone they are
    a group of 16 and a tail of 1; rows 23..39 alone are one group and a tail at other offsets: the same bits."""
    rng = np.random.default_rng(110 + int(qtype))
    k, n = 18 * 32, 40
    raw = random_raw(qtype, n, k, rng)
    progs = {}
    for lo, hi in ((0, 40), (0, 17), (23, 40), (5, 7)):
        g, y = build(qtype, k, hi - lo, np.ascontiguousarray(raw[lo:hi]), with_bias=False)
        progs[lo, hi] = g.compile([y], backend="c", activations="int16", flags=wide_flags(qtype), plan_cache=False)
    for m in (1, 3, 8):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        (full,) = progs[0, 40](x=xv)
        for (lo, hi), prog in progs.items():
            np.testing.assert_array_equal(prog(x=xv)[0], full[:, lo:hi])


@needs_vnni
def test_auto_takes_the_sixteen_row_kernels_for_short_calls() -> None:
    """"auto": a call of up to 8 rows gets int16's bits (the 16-row kernels); a longer one leaves the activations
    unquantized in the scratch (the 16-row kernels hand those rows back to the per-row ones) and stays close to
    the exact product."""
    rng = np.random.default_rng(120)
    k, n = 18 * 32, 33
    g, y = build(QType.Q4_1, k, n, random_raw(QType.Q4_1, n, k, rng), with_bias=False)
    auto = g.compile([y], backend="c", activations="auto")
    int16 = g.compile([y], backend="c", activations="int16")
    ref = g.compile([y], backend="reference")
    for m in (1, 8):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        np.testing.assert_array_equal(auto(x=xv)[0], int16(x=xv)[0])
    xv = rng.standard_normal((40, k)).astype(np.float32)
    assert rel_err(auto(x=xv)[0], ref(x=xv)[0]) < 5e-3


@needs_vnni
def test_q8_0_can_be_sent_back_to_its_per_row_kernel() -> None:
    """-DLS_NO_QDOT16X16_Q8_0 keeps q8_0 on ls_qdot16_q8_0 (the q4 formats stay on 16 rows): other sums of the
    same integer products, so the two agree to float rounding but not to the bit."""
    rng = np.random.default_rng(130)
    k, n = 18 * 32, 40
    g, y = build(QType.Q8_0, k, n, random_raw(QType.Q8_0, n, k, rng), with_bias=False)
    wide = g.compile([y], backend="c", activations="int16")
    per_row = g.compile([y], backend="c", activations="int16", flags=Q8_0_OFF, plan_cache=False)
    assert "LS_NO_QDOT16X16_Q8_0" not in " ".join(default_flags())
    xv = rng.standard_normal((8, k)).astype(np.float32)
    a, b = wide(x=xv)[0], per_row(x=xv)[0]
    assert not np.array_equal(a, b)
    np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-6 * float(np.abs(b).max()))


@needs_vnni
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_embedded_broadcasts_give_the_plain_forms_bits(qtype: QType) -> None:
    """With gcc the activation dwords are vpdpbusd's {1to16} memory operands in four chains (LS_Q16_EMBCAST):
    the same exact integer sums, so every row count and tail has the bits of -DLS_NO_Q16_EMBCAST's form; the
    preprocessor confirms the usual build took that path."""
    rng = np.random.default_rng(140 + int(qtype))
    k, n = 21 * 32, 37
    g, y = build(qtype, k, n, random_raw(qtype, n, k, rng), with_bias=False)
    usual = g.compile([y], backend="c", activations="int16", plan_cache=False)
    plain = g.compile([y], backend="c", activations="int16", flags=default_flags() + ["-DLS_NO_Q16_EMBCAST"],
                      plan_cache=False)
    guard = ("\n#if defined(__GNUC__) && !defined(__clang__) && !defined(LS_Q16_EMBCAST)\n"
             "#error gcc did not build the embedded-broadcast form\n#endif\n")
    compile_shared(usual.executor.source + guard, flags=default_flags())
    with pytest.raises(CompilerError):
        compile_shared(plain.executor.source + guard, flags=default_flags() + ["-DLS_NO_Q16_EMBCAST"])
    for m in range(1, 9):
        xv = (rng.standard_normal((m, k)) * rng.uniform(0.1, 30.0, (m, 1))).astype(np.float32)
        np.testing.assert_array_equal(usual(x=xv)[0], plain(x=xv)[0])
