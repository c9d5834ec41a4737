"""Random GPU gemm schedules and matmul-like programs to run them on (tests/test_gpu_schedule.py on OpenCL,
tests/test_backend_cuda.py through NVRTC and, where a device exists, on CUDA)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import lightspeed as ls
from lightspeed.kernel.schedule import Order, Pack, Parallel, Register, Schedule, Tile, Unroll, Vectorize


@st.composite
def gpu_gemm_schedules(draw, max_group: int = 256) -> Schedule:
    """A schedule the GPU gemm renderer applies: tiles that are multiples of their register blocks, at most
    ``max_group`` work items, any panel depth, load order, tile order, run width and unroll."""
    while True:
        rm, rn = draw(st.sampled_from([1, 2, 3, 4, 8])), draw(st.sampled_from([1, 2, 4, 5, 8]))
        sm, sn = draw(st.sampled_from([1, 2, 4, 8, 16])), draw(st.sampled_from([1, 2, 4, 8, 16]))
        if sm * sn <= max_group:
            break
    steps = [Parallel("m"), Parallel("n"), Tile("m", rm * sm), Tile("n", rn * sn),
             Tile("k", draw(st.sampled_from([1, 3, 8, 16, 32]))), Register("m", rm), Register("n", rn),
             Pack("a", draw(st.sampled_from(["k", "m"]))), Pack("b", draw(st.sampled_from(["n", "k"])))]
    vn = draw(st.sampled_from([w for w in (1, 2, 4, 5, 8) if rn % w == 0]))
    if vn > 1:
        steps.append(Vectorize("n", vn))
    if draw(st.booleans()):
        steps.append(Order(draw(st.sampled_from([("m", "n"), ("n", "m"), ("n", "m", "k")]))))
    u = draw(st.sampled_from([1, 2, 4]))
    if u > 1:
        steps.append(Unroll("k", u))
    return Schedule(tuple(steps))


@st.composite
def matmul_cases(draw) -> tuple:
    """(graph, outputs, a function seq -> input arrays, the sequence lengths to run): matmul-like products with
    a symbolic row count, odd sizes, a transposed weight, a batched product and a decoded int8 weight."""
    k = draw(st.integers(16, 70))  # gemm kernels are formed for operands of at least 8 x 16 x 16
    n = draw(st.integers(16, 45))
    seq = ls.dim("seq", 1, 80)
    g = ls.Graph()
    x = g.input("x", (seq, k))
    w = g.input("w", (n, k))
    v = g.input("v", (2, k, n))
    q = g.input("q", (n, k), ls.int8)
    s = g.input("s", (n, 1))
    outs = [x @ w.T, x.reshape((1, seq, k)).expand((2, seq, k)) @ v, x @ (q.cast(ls.float32) * s).T]
    seed = draw(st.integers(0, 2**16))
    # more than 8 rows: at most 8 run the few-rows form instead of the tiles
    lengths = [draw(st.integers(9, 80))] + draw(st.lists(st.integers(1, 80), max_size=1))

    def arrays(rows: int) -> dict:
        rng = np.random.default_rng(seed + rows)
        return dict(x=rng.standard_normal((rows, k)).astype(np.float32),
                    w=rng.standard_normal((n, k)).astype(np.float32),
                    v=rng.standard_normal((2, k, n)).astype(np.float32),
                    q=rng.integers(-128, 128, (n, k)).astype(np.int8),
                    s=rng.uniform(0.01, 0.02, (n, 1)).astype(np.float32))
    return g, outs, arrays, lengths


def check_against_reference(g, outs, prog, arrays, lengths) -> None:
    """``prog``'s outputs equal the reference backend's at every row count of ``lengths`` (float32 sums in
    another order: within 2e-4)."""
    ref = g.compile(outs, backend="reference")
    for rows in lengths:
        for i, (got, want) in enumerate(zip(prog(**arrays(rows)), ref(**arrays(rows)))):
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=f"output {i}, seq={rows}")
