"""The register-blocked quantized matmul (lightspeed/backend/c/qgemm.h) for the 32-element formats: against
the reference interpreter for row counts that leave every tail of the micro-kernel (rows, weight rows, K
chunks), on the SIMD and the portable path; each row gives the same bits alone and in any batch; and on an
AVX2 machine the portable path computes the same bits as the SIMD one (one summation order for both)."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.quant import QType
from lightspeed.quant.decode_graph import dequant_matrix_graph
from cpu_flags import has_flags
from quant_blocks import random_raw

TYPES = [QType.Q8_0, QType.Q4_0, QType.Q4_1]
ROWS = (1, 2, 3, 7, 8, 9, 13, 69)  # every micro-kernel height (6, 5, 4, 3, 2, 1 rows) and more than one block
N = 37  # weight rows: not a multiple of the micro-kernel widths (2, 3, 4)


def build(qtype: QType, k: int, rng: np.random.Generator) -> tuple[ls.Graph, object]:
    g = ls.Graph()
    x = g.input("x", (ls.dim("seq", 1, 128), k))
    return g, x.linear(dequant_matrix_graph(g.constant(random_raw(qtype, N, k, rng)), qtype))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("k", [96, 544], ids=["k96", "k544"])  # 3 blocks; 17 blocks = two K chunks (9 + 8)
def test_gemm_matches_reference_and_is_batch_independent(qtype: QType, k: int) -> None:
    rng = np.random.default_rng(100 + int(qtype) + k)
    g, y = build(qtype, k, rng)
    ref = g.compile([y], backend="reference")
    simd = g.compile([y], backend="c")
    portable = g.compile([y], backend="c", portable=True)
    assert f"ls_qgemm_{qtype.name.lower()}(wraw" in simd.executor.source
    xv = rng.standard_normal((max(ROWS), k)).astype(np.float32)
    full = {name: prog(x=xv)[0] for name, prog in (("simd", simd), ("portable", portable))}
    for m in ROWS:
        (want,) = ref(x=xv[:m])
        for name, prog in (("simd", simd), ("portable", portable)):
            (got,) = prog(x=xv[:m])
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.abs(want).max()), err_msg=name)
            np.testing.assert_array_equal(got, full[name][:m], err_msg=f"{name}: rows changed with the batch")
    for r in (0, 5, 6, 12, 68):  # a row alone gives the bits it has in the batch of 69
        for name, prog in (("simd", simd), ("portable", portable)):
            np.testing.assert_array_equal(prog(x=xv[r:r + 1])[0][0], full[name][r], err_msg=name)
    # the AVX2 kernel and the portable form share one summation order
    if has_flags("avx2", "fma", without=("avx512f",)):
        np.testing.assert_array_equal(full["simd"], full["portable"])


def test_long_rows_take_several_k_chunks_and_stay_exact() -> None:
    """K of 35 blocks (three chunks of 12, 12 and 11) against a float64 product of the decoded weight."""
    rng = np.random.default_rng(7)
    k = 35 * 32
    raw = random_raw(QType.Q8_0, N, k, rng)
    g = ls.Graph()
    x = g.input("x", (ls.dim("seq", 1, 16), k))
    y = x.linear(dequant_matrix_graph(g.constant(raw), QType.Q8_0))
    prog = g.compile([y], backend="c")
    blocks = raw.reshape(N, k // 32, 34)
    w = (blocks[:, :, 2:].view(np.int8).astype(np.float64)
         * blocks[:, :, :2].copy().view(np.float16).astype(np.float64)).reshape(N, k)
    xv = rng.standard_normal((11, k)).astype(np.float32)
    want = xv.astype(np.float64) @ w.T
    (got,) = prog(x=xv)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    for r in range(11):
        np.testing.assert_array_equal(prog(x=xv[r:r + 1])[0][0], got[r])
