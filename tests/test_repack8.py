"""q4_0 and q4_1 weights repacked in groups of 8 rows for AVX2 builds (repack8.h): the executor's copy is the
documented layout, and the kernels reading it (int16 for up to 8 activation rows at once, qgemm.h's float kernel
for longer calls under activations "auto") give exactly the bits of the builds reading the GGUF layout
(-DLS_NO_REPACK8), at every row count, whole groups and the matrix's last rows alike. On AVX-512 CPUs the kernels
are built with AVX-512 switched off (-mno-avx512f), as on an AVX2-only machine."""
from __future__ import annotations

import numpy as np
import pytest

from cpu_flags import has_flags
from lightspeed.backend.c.compiler import default_flags
from lightspeed.backend.c.library import repack_layout
from lightspeed.backend.c.repack import REPACK_CODES
from lightspeed.quant import QType, block_format
from quant_blocks import random_raw
from test_quantized_matmul import build

needs_avx2 = pytest.mark.skipif(not has_flags("avx2", "fma", "f16c"), reason="needs a CPU with AVX2, FMA and F16C")
AVX2 = default_flags() + (["-mno-avx512f"] if has_flags("avx512f") else [])
# "auto" as an AVX2 CPU resolves it: int16 for calls of up to 8 rows, qgemm.h's float kernel for longer ones
AUTO = ["-DLS_QUANT_ROWS_MAX=8"]
QTYPES = [QType.Q4_0, QType.Q4_1]


def reference_layout(raw: np.ndarray, qtype: QType) -> np.ndarray:
    """repack8.h's layout written with numpy: per whole group of 8 rows, block by block, the 8 rows' float16
    scales (q4_1: then their 8 minimums), then each row's 16 nibble bytes; the last rows as they are."""
    rows, rb = raw.shape
    bb = block_format(qtype).block_bytes
    ns = 2 if qtype is QType.Q4_1 else 1
    out = raw.copy()
    whole = rows // 8 * 8
    blocks = raw[:whole].reshape(rows // 8, 8, rb // bb, bb).transpose(0, 2, 1, 3)  # [group, block, row, bytes]
    fields = [blocks[..., 2 * k:2 * k + 2].reshape(rows // 8, rb // bb, 16) for k in range(ns)]
    quants = blocks[..., 2 * ns:].reshape(rows // 8, rb // bb, 128)
    out[:whole] = np.concatenate(fields + [quants], axis=2).reshape(whole, rb)
    return out


@needs_avx2
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_the_executor_reads_the_documented_layout(qtype: QType) -> None:
    rng = np.random.default_rng(50 + int(qtype))
    k, n = 18 * 32, 44  # five whole groups and four rows in the GGUF layout
    raw = random_raw(qtype, n, k, rng)
    g, y = build(qtype, k, n, raw, with_bias=False)
    prog = g.compile([y], backend="c", activations="int16", flags=AVX2, plan_cache=False)
    ex = prog.executor
    layout = repack_layout(ex._lib)
    assert layout.rows == 8 and ex.reads_repacked(qtype) and not ex.reads_repacked(QType.Q8_0)
    (r,) = ex.plan.repacks
    (copy,) = ex._repacked
    np.testing.assert_array_equal(copy, reference_layout(raw, qtype))
    assert not np.array_equal(copy[:40], raw[:40]) and r.code == REPACK_CODES[qtype]
    dst = np.zeros_like(raw)
    layout.make(raw.ctypes.data, dst.ctypes.data, n, raw.shape[1], REPACK_CODES[qtype])
    np.testing.assert_array_equal(dst, copy)


@needs_avx2
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("n", [16, 40, 100])  # whole groups; several; several and four rows after them
@pytest.mark.parametrize("auto", [False, True], ids=["int16", "auto"])
def test_repacked_weights_give_the_bits_of_the_gguf_layout(qtype: QType, n: int, auto: bool) -> None:
    rng = np.random.default_rng(60 + int(qtype) + n + auto)
    k = 18 * 32
    raw = random_raw(qtype, n, k, rng)
    g, y = build(qtype, k, n, raw, with_bias=False)
    flags = AVX2 + (AUTO if auto else [])
    repacked = g.compile([y], backend="c", activations="int16", flags=flags, plan_cache=False)
    gguf = g.compile([y], backend="c", activations="int16", flags=flags + ["-DLS_NO_REPACK8"], plan_cache=False)
    assert repack_layout(repacked.executor._lib).formats >> REPACK_CODES[qtype] & 1
    assert not repack_layout(gguf.executor._lib).formats
    ref = g.compile([y], backend="reference")
    for m in (1, 2, 3, 8, 9, 33):  # the 8-row kernel, its halves, one row at a time, and longer calls
        xv = rng.standard_normal((m, k)).astype(np.float32)
        (a,), (b,), (want,) = repacked(x=xv), gguf(x=xv), ref(x=xv)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, want, rtol=2e-3, atol=2e-3 * float(np.abs(want).max()))


@needs_avx2
def test_a_row_has_the_same_bits_alone_and_batched() -> None:
    rng = np.random.default_rng(70)
    k, n = 18 * 32, 48
    g, y = build(QType.Q4_1, k, n, random_raw(QType.Q4_1, n, k, rng), with_bias=False)
    prog = g.compile([y], backend="c", activations="int16", flags=AVX2, plan_cache=False)
    assert prog.executor._repacked
    xv = rng.standard_normal((5, k)).astype(np.float32)
    alone = np.concatenate([prog(x=xv[i:i + 1])[0] for i in range(5)])
    for m in (2, 3, 5):
        np.testing.assert_array_equal(prog(x=xv[:m])[0], alone[:m])


@pytest.mark.skipif(not has_flags("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
                    reason="needs a CPU that runs both layouts' kernels (AVX-512 VNNI)")
def test_the_two_layouts_of_one_weight_are_separate_copies() -> None:
    """Copies are shared by the programs over the same weights: an AVX2 build and an AVX-512 one in one process
    must each read a copy in its own layout."""
    rng = np.random.default_rng(80)
    k, n = 18 * 32, 64
    raw = random_raw(QType.Q4_1, n, k, rng)
    g, y = build(QType.Q4_1, k, n, raw, with_bias=False)
    wide = g.compile([y], backend="c", activations="int16", plan_cache=False)
    narrow = g.compile([y], backend="c", activations="int16", flags=AVX2, plan_cache=False)
    assert repack_layout(wide.executor._lib).rows == 16 and repack_layout(narrow.executor._lib).rows == 8
    assert wide.executor._repacked[0] is not narrow.executor._repacked[0]
    ref = g.compile([y], backend="reference")
    xv = rng.standard_normal((2, k)).astype(np.float32)
    (want,) = ref(x=xv)
    for prog in (wide, narrow):
        np.testing.assert_allclose(prog(x=xv)[0], want, rtol=2e-3, atol=2e-3 * float(np.abs(want).max()))
