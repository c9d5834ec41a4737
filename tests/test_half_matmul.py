"""The fused matmul for float16 / bfloat16 weights (``x @ w.cast(float32).T``, backend/c/hgemm.h): it is
chosen for a dense [N, K] weight, matches the reference interpreter on the SIMD and the portable path, each
row gives the same bits alone and in any batch, on an AVX2 machine the portable path gives the SIMD bits,
and a weight that is not a dense [N, K] view is left to the generic loops (and still computes right)."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed import dtypes as dt
from lightspeed.backend.c.compiler import CompilerError, compile_shared
from cpu_flags import has_flags

DTYPES = {"f16": dt.float16, "bf16": dt.bfloat16}
ROWS = (1, 2, 7, 8, 9, 37)  # decode, batched decode (every few-row width), past it (the panel path)
N = 37  # odd: not a multiple of any kernel's weight-row group


def half_array(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random weights stored as float16, or as bfloat16 bits (uint16), as the graph constant holds them."""
    w = rng.standard_normal(shape).astype(np.float32) * 0.1
    return w.astype(np.float16) if name == "f16" else dt.f32_to_bf16(w)


def build(name: str, wv: np.ndarray, k: int, view=None) -> tuple[ls.Graph, object]:
    g = ls.Graph()
    x = g.input("x", (ls.dim("seq", 1, 64), k))
    w = g.constant(wv, dtype=DTYPES[name])
    if view is not None:
        w = view(w)
    return g, x.linear(w.cast(dt.float32))


KS = (8, 40, 584, 1032)  # one vector; a tail after a cache line; two K chunks (296 + 288); 4 rows of x past L1


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_half_matmul_matches_reference_and_is_batch_independent(name: str) -> None:
    rng = np.random.default_rng(len(name))
    g = ls.Graph()
    seq = ls.dim("seq", 1, 64)
    ys = [g.input(f"x{k}", (seq, k)).linear(g.constant(half_array(name, (N, k), rng), dtype=DTYPES[name])
                                             .cast(dt.float32)) for k in KS]  # one program, one compile per path
    ref = g.compile(ys, backend="reference")
    simd = g.compile(ys, backend="c")
    portable = g.compile(ys, backend="c", portable=True)
    for prog in (simd, portable):  # the lowered kernel is chosen for every matmul
        assert prog.executor.source.count(f"ls_hgemm_{name}(w") == len(KS)
    xv = {f"x{k}": rng.standard_normal((max(ROWS), k)).astype(np.float32) for k in KS}

    def rows(sel) -> dict:
        return {key: v[sel] for key, v in xv.items()}
    full = {tag: prog(**xv) for tag, prog in (("simd", simd), ("portable", portable))}
    for m in ROWS:
        want = ref(**rows(slice(0, m)))
        for tag, prog in (("simd", simd), ("portable", portable)):
            for k, got, w, f in zip(KS, prog(**rows(slice(0, m))), want, full[tag]):
                np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5 * float(np.abs(w).max()),
                                           err_msg=f"{tag} k={k} m={m}")
                np.testing.assert_array_equal(got, f[:m], err_msg=f"{tag} k={k}: rows changed with the batch")
    for r in (0, 5, 8, 36):  # a row alone gives the bits it has in the batch of 37
        for tag, prog in (("simd", simd), ("portable", portable)):
            for k, got, f in zip(KS, prog(**rows(slice(r, r + 1))), full[tag]):
                np.testing.assert_array_equal(got[0], f[r], err_msg=f"{tag} k={k}")
    # the AVX2 kernels (AVX-512 CPUs run them too) and the portable form share one summation order
    if has_flags("avx2", "fma", "f16c"):
        for a, b in zip(full["simd"], full["portable"]):
            np.testing.assert_array_equal(a, b)


def _widen(name: str, a: np.ndarray) -> np.ndarray:
    return (a if name == "f16" else dt.bf16_to_f32(a)).astype(np.float64)


@pytest.mark.parametrize("name", sorted(DTYPES))
@pytest.mark.parametrize("view", ["transposed", "sliced"])
def test_non_dense_weight_view_is_not_lowered(name: str, view: str) -> None:
    """w stored [K, N] and transposed, or a column slice of a wider array: no dense [N, K] rows to stream."""
    rng = np.random.default_rng(3)
    k = 40
    if view == "transposed":
        stored = half_array(name, (k, N), rng)
        dense = stored.T
        fn = lambda w: w.T  # noqa: E731
    else:
        stored = half_array(name, (N, k + 8), rng)
        dense = stored[:, 4:4 + k]
        fn = lambda w: w[:, 4:4 + k]  # noqa: E731
    g, y = build(name, stored, k, fn)
    prog = g.compile([y], backend="c")
    assert "ls_hgemm_" not in prog.executor.source.split("typedef struct { const ls_args")[-1]
    xv = rng.standard_normal((9, k)).astype(np.float32)
    want = xv.astype(np.float64) @ _widen(name, dense).T
    np.testing.assert_allclose(prog(x=xv)[0], want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_k_not_a_multiple_of_8_keeps_generic_loops() -> None:
    rng = np.random.default_rng(5)
    k = 37
    wv = half_array("f16", (N, k), rng)
    g, y = build("f16", wv, k)
    prog = g.compile([y], backend="c")
    assert "ls_hgemm_" not in prog.executor.source.split("typedef struct { const ls_args")[-1]
    xv = rng.standard_normal((3, k)).astype(np.float32)
    want = xv.astype(np.float64) @ wv.astype(np.float64).T
    np.testing.assert_allclose(prog(x=xv)[0], want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.skipif(not has_flags("avx2", "fma", "f16c"), reason="needs a CPU with AVX2, FMA and F16C")
def test_every_avx2_cpu_builds_the_simd_kernels() -> None:
    """On this CPU the source of a half-weight matmul defines hgemm.h's and qgemm.h's AVX2 kernels, AVX-512 CPUs
    included: they once took the portable forms there (SmolLM2 in f16 or bf16 decoded 2-6x slower, and Gemma
    3's Q6_K, Q5_0 and Q4_K matmuls ran a per-block float decode 8-14x slower). The bit-equality check above
    cannot tell the portable form from the SIMD one; the preprocessor can."""
    rng = np.random.default_rng(5)
    g, y = build("f16", half_array("f16", (N, 40), rng), 40)
    prog = g.compile([y], backend="c")
    guard = ("\n#if !defined(LS_HAVE_HGEMM_F16) || !defined(LS_HAVE_HGEMM_BF16) || !defined(LS_HAVE_QGEMM_AVX2)\n"
             "#error the AVX2 kernels of hgemm.h / qgemm.h are not built for this CPU\n#endif\n")
    try:
        compile_shared(prog.executor.source + guard)
    except CompilerError as e:
        pytest.fail(str(e)[:400])
