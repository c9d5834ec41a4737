"""qgemm.h's kernels for Gemma 3's weight formats (Q5_0, Q4_K, Q6_K; the 256-element ones as 8 blocks of 32):
against the reference interpreter at row counts that leave the register-decoding kernel's tails (1, 2, 7, 8)
and the decoded-panel path (9, 21), for K of one and several K chunks (chunks that split a super-block
included); each row gives the same bits alone and in the batch, and on an AVX2 machine (AVX-512 ones
included) the portable form gives the SIMD bits. Blocks are random bytes with random float16 scales, some
extreme (largest finite, subnormal, zero, negative)."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.quant import QType
from lightspeed.quant.decode_graph import dequant_matrix_graph
from cpu_flags import has_flags
from quant_blocks import random_raw

ROWS = (1, 2, 7, 8, 9, 21)
N = 37  # odd, not a multiple of the micro-kernel widths
# K values: one chunk, a chunk boundary inside a super-block (1280 = 40 blocks = chunks of 20), q5_0 odd blocks
KS = {QType.Q5_0: (96, 256, 512, 544), QType.Q4_K: (256, 512, 1280), QType.Q6_K: (256, 512, 1280)}


@pytest.mark.parametrize("qtype", list(KS), ids=lambda q: q.name)
def test_kquant_gemm_matches_reference_and_is_batch_independent(qtype: QType) -> None:
    rng = np.random.default_rng(300 + int(qtype))
    g = ls.Graph()
    seq = ls.dim("seq", 1, 32)
    ys, weights, names = [], [], []
    for k in KS[qtype]:
        x = g.input(f"x{k}", (seq, k))
        w = dequant_matrix_graph(g.constant(random_raw(qtype, N, k, rng, extreme=0.125)), qtype)
        ys.append(x.linear(w))
        weights.append(w)
        names.append(f"x{k}")
    ref = g.compile(ys + weights, backend="reference")
    simd = g.compile(ys, backend="c")
    portable = g.compile(ys, backend="c", portable=True)
    assert f"ls_qgemm_{qtype.name.lower()}(wraw" in simd.executor.source
    assert f"ls_qgemm_portable_{qtype.name.lower()}(wraw" in portable.executor.source
    xs = {name: rng.standard_normal((max(ROWS), k)).astype(np.float32) for name, k in zip(names, KS[qtype])}
    full = {label: prog(**xs) for label, prog in (("simd", simd), ("portable", portable))}
    for m in ROWS:
        outs = ref(**{name: v[:m] for name, v in xs.items()})
        wants, ws = outs[:len(ys)], outs[len(ys):]
        for label, prog in (("simd", simd), ("portable", portable)):
            gots = prog(**{name: v[:m] for name, v in xs.items()})
            for i, (got, want, w) in enumerate(zip(gots, wants, ws)):
                assert np.isfinite(want).all()
                # float32 error bound of a dot product of length K: a few ulps of sum |x| |w|
                bound = 1e-5 * (np.abs(xs[names[i]][:m]).astype(np.float64) @ np.abs(w).T.astype(np.float64))
                err = np.abs(got.astype(np.float64) - want)
                assert (err <= bound + 1e-30).all(), f"{label} {names[i]} m={m}: max err {err.max()}"
                np.testing.assert_array_equal(got, full[label][i][:m], err_msg=f"{label}: rows changed with the batch")
    for r in (0, 7, 8, 20):  # a row alone gives the bits it has in the batch of 21
        for label, prog in (("simd", simd), ("portable", portable)):
            alone = prog(**{name: v[r:r + 1] for name, v in xs.items()})
            for i in range(len(ys)):
                np.testing.assert_array_equal(alone[i][0], full[label][i][r], err_msg=label)
    # one summation order and the same decoded values in both forms; AVX-512 CPUs run the AVX2 kernel too (these
    # formats have no AVX-512 kernel; the per-block float decode they had before was 8-14x slower)
    if has_flags("avx2", "fma"):
        for i in range(len(ys)):
            np.testing.assert_array_equal(full["simd"][i], full["portable"][i], err_msg=names[i])
