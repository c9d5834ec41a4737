"""The OpenCL backend (backend/gpu kernels in OpenCL C through pyopencl; PoCL on a CPU-only machine).

Every frontend case against the same oracles as the reference and C backends, random graphs against the
reference backend (tests/test_backend_c_random.py's generator, fewer examples), and a tiny Llama whose
greedy tokens must equal the C backend's. Skips, with the reason printed, where no OpenCL platform exists.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import test_backend_c_random as rg  # the module, so its C test is not collected a second time here
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from time_limit import time_limit

from frontend_cases import CASES, Case, run_case
from lightspeed import symbolic as sym
from lightspeed.backend.gpu.gemm import gpu_gemm_sizes
from lightspeed.backend.opencl import unavailable_reason
from lightspeed.graph import Program, describe

BACKEND = "opencl"
ALL_CASES = os.environ.get("LIGHTSPEED_OPENCL_ALL_CASES") == "1"
REASON = unavailable_reason()
if REASON is not None:
    print(f"tests/test_backend_opencl.py: skipped: {REASON}")
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no OpenCL device: {REASON}")


@pytest.fixture(scope="module", autouse=True)
def shared_cache_dir(tmp_path_factory):
    """A private compile cache (pyopencl's and PoCL's caches live under it only when PoCL starts after
    this is set; PoCL's directory is fixed for the process on first use, so this mainly isolates pyopencl)."""
    old = os.environ.get("LIGHTSPEED_CACHE_DIR")
    os.environ["LIGHTSPEED_CACHE_DIR"] = str(tmp_path_factory.mktemp("ls_cache_opencl"))
    yield
    if old is None:
        del os.environ["LIGHTSPEED_CACHE_DIR"]
    else:
        os.environ["LIGHTSPEED_CACHE_DIR"] = old


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_opencl(case: Case, symbolic: bool) -> None:
    if case.torch:
        pytest.importorskip("torch")
    if symbolic and not case.symbolic:
        pytest.skip("this case has no symbolic dims")
    if not symbolic and case.symbolic:
        # PoCL builds a program in ~0.2-0.5 s: where a case has symbolic dims, its symbolic program (run at
        # every size) is the default check; LIGHTSPEED_OPENCL_ALL_CASES=1 adds the static one (first size)
        if not ALL_CASES:
            pytest.skip("static shapes of a symbolic case: set LIGHTSPEED_OPENCL_ALL_CASES=1")
        case = dataclasses.replace(case, sizes=case.sizes[:1])
    run_case(case, BACKEND, symbolic)


# random graphs: the generator of test_backend_c_random.py, compared with the reference backend ---------------
RANDOM_EXAMPLES = int(os.environ.get("LIGHTSPEED_OPENCL_RANDOM_EXAMPLES", "100"))  # issue 14: >= 100


@settings(max_examples=RANDOM_EXAMPLES, deadline=None, phases=rg.PHASES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_random_graph_opencl_matches_reference(data: st.DataObject) -> None:
    built = rg.GraphMaker(data).build()
    outs = [v.t for v in built.outputs]
    program = Program.build(built.graph, outs)
    note("\n".join(built.log) + "\nprogram:\n" + describe(program) + "\noutputs: " + repr(program.outputs))
    with time_limit(rg.COMPILE_LIMIT_S, "compiling a random graph for the OpenCL backend"):
        prog = built.graph.compile(outs, backend=BACKEND)
    ref = built.graph.compile(outs, backend="reference")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    names = {v.name for v in prog.program.dims}
    for env in rg._bindings(built.dims, data):
        arrays = {}
        for spec in built.inputs:
            if spec.name in prog.input_names:
                shape = tuple(int(sym.evaluate(s, env)) for s in spec.shape)
                arrays[spec.name] = np.asarray(spec.gen(rng, shape, env)).astype(spec.dtype.np)
        dims = {k: v for k, v in env.items() if k in names}
        want, got = ref(dims=dims, **arrays), prog(dims=dims, **arrays)
        assert len(got) == len(want)
        for k, (gv, wv, v) in enumerate(zip(got, want, built.outputs)):
            rg._compare(gv, wv, v, f"output {k} at dims {env} (the graph is in the notes above)")


# a tiny Llama: greedy tokens equal to the C backend's ------------------------------------------------------
def _greedy(step, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    caches = step.new_caches()
    logits, caches = step.run(prompt, 0, caches)
    tokens, all_logits = [], [logits[-1]]
    pos = len(prompt)
    for _ in range(steps):
        tokens.append(int(np.argmax(all_logits[-1])))
        logits, caches = step.run([tokens[-1]], pos, caches)
        all_logits.append(logits[-1])
        pos += 1
    return tokens, all_logits


@pytest.mark.parametrize("kv_update", ["rows", "scatter"])
def test_tiny_llama_greedy_tokens_match_c(tmp_path, kv_update: str) -> None:
    from tiny_gguf import write_tiny_llama
    from lightspeed.models import load_model
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, seed=3)
    lm = load_model(path)
    prompt = [5, 17, 42, 99, 3, 64]
    # the GPU kernels take float32 activations and (by default) a float32 cache: so does the C program they are
    # compared with (tests/test_kv_f16.py compares float16 caches on both)
    want, want_logits = _greedy(lm.compile(32, max_chunk=8, backend="c", kv_update=kv_update, activations="float",
                                           kv_dtype="float32"), prompt, 8)
    got, got_logits = _greedy(lm.compile(32, max_chunk=8, backend=BACKEND, kv_update=kv_update), prompt, 8)
    assert got == want
    for k, (g, w) in enumerate(zip(got_logits, want_logits)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"logits after {k} generated tokens")


# gemm kernels: a tile of outputs per work group from panels in local memory (backend/gpu/gemm.py) ---------
def test_gemm_tiles_match_reference() -> None:
    import lightspeed as ls
    seq = ls.dim("seq", 1, 70)
    g = ls.Graph()
    x = g.input("x", (seq, 48))
    w = g.input("w", (40, 48))
    b = g.input("b", (3, 48, 20))
    outs = [x @ w.T,                                                    # a transposed weight
            (x.reshape((1, seq, 48)).expand((3, seq, 48)) @ b).relu(),  # batched, epilogue in its own kernel
            x.pad(((0, 0), (2, 3))) @ w.pad(((0, 0), (1, 4))).T[:53]]   # padded operands (guarded loads)
    prog = g.compile(outs, backend=BACKEND)
    assert sum(k.kind == "gemm" for k in prog.executor.plan.kernels) == 3
    assert "LS_BARRIER" in prog.executor.source
    ref = g.compile(outs, backend="reference")
    rng = np.random.default_rng(0)
    for n in (1, 16, 17, 70):  # partial and whole tiles
        arrays = dict(x=rng.standard_normal((n, 48)).astype(np.float32),
                      w=rng.standard_normal((40, 48)).astype(np.float32),
                      b=rng.standard_normal((3, 48, 20)).astype(np.float32))
        for k, (got, want) in enumerate(zip(prog(**arrays), ref(**arrays))):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"output {k}, seq={n}")


def test_gemm_register_blocks_and_few_rows_match_reference() -> None:
    """Tiles under the device's default schedule across several tiles of m and n, a depth that is not
    a multiple of the panel's, a quantized-looking operand (int8 times a per-row scale), and the
    few-rows form (at most 8 rows: a loop or a work group per output, chosen at launch)."""
    import lightspeed as ls
    seq = ls.dim("seq", 1, 200)
    g = ls.Graph()
    x = g.input("x", (seq, 150))
    w = g.input("w", (130, 150))
    q = g.input("q", (130, 150), ls.int8)
    s = g.input("s", (130, 1))
    outs = [x @ w.T, x @ (q.cast(ls.float32) * s).T]
    prog = g.compile(outs, backend=BACKEND)
    gemms = [k for k in prog.executor.gpu.kernels if k.small is not None]
    threads = {gpu_gemm_sizes(k.schedule)["THREADS"] for k in prog.executor.plan.kernels if k.kind == "gemm"}
    assert len(gemms) == 2 and len(threads) == 1 and all(k.block in threads for k in gemms)
    ref = g.compile(outs, backend="reference")
    rng = np.random.default_rng(1)
    for n in (1, 8, 9, 64, 65, 200):
        arrays = dict(x=rng.standard_normal((n, 150)).astype(np.float32),
                      w=rng.standard_normal((130, 150)).astype(np.float32),
                      q=rng.integers(-128, 128, (130, 150)).astype(np.int8),
                      s=rng.uniform(0.01, 0.02, (130, 1)).astype(np.float32))
        for k, (got, want) in enumerate(zip(prog(**arrays), ref(**arrays))):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"output {k}, seq={n}")


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("small_form", ["rows", "loop"])
def test_quantized_matvec_forms_match_reference(qtype: str, small_form: str) -> None:
    """A product with a quantized weight at few rows, in both few-rows forms: "rows" (a GPU device's default:
    a work group per output, each work item taking whole blocks of 32 with the block's scale decoded once)
    and "loop" (a CPU device's: a work item per output, blocks of contiguous elements)."""
    import lightspeed as ls
    from lightspeed.quant import dequant_matrix_graph, dequantize, quantize
    rng = np.random.default_rng(2)
    w = rng.standard_normal((72, 320)).astype(np.float32)
    raw = quantize(w, qtype)
    seq = ls.dim("seq", 1, 16)
    g = ls.Graph()
    x = g.input("x", (seq, 320))
    y = x @ dequant_matrix_graph(g.constant(raw, ls.uint8), qtype).T
    prog = g.compile([y], backend=BACKEND, small_form=small_form)
    if small_form == "rows":
        (gemm,) = [k for k in prog.executor.gpu.kernels if k.small is not None]
        text = prog.executor.gpu.functions[gemm.small.function]
        assert "const float h" in text and "kr1_hi" in text  # by blocks, the block's scale hoisted
    wd = dequantize(raw, qtype, w.shape).astype(np.float64)
    for n in (1, 3, 8, 12):
        xa = rng.standard_normal((n, 320)).astype(np.float32)
        (got,) = prog(x=xa)
        np.testing.assert_allclose(got, xa.astype(np.float64) @ wd.T, rtol=1e-4, atol=1e-4, err_msg=f"seq={n}")


# long reductions: a work group per output splitting the reduced axis (backend/gpu/reduce.py) --------------
def test_row_reductions_match_reference() -> None:
    import lightspeed as ls
    k = ls.dim("k", 1, 1000)
    g = ls.Graph()
    x = g.input("x", (3, k))
    h = g.input("h", (2, k), ls.float16)
    i = g.input("i", (4, k), ls.int32)
    outs = [x.sum(-1), x.max(-1), h.sum(-1), i.sum(-1), i.max(-1), x.softmax(-1),
            ((x * x).mean(-1) + 1e-5).rsqrt()]  # an epilogue after the reduction
    prog = g.compile(outs, backend=BACKEND)
    assert sum(launch.block == 64 for launch in prog.executor.gpu.kernels) >= 7
    ref = g.compile(outs, backend="reference")
    rng = np.random.default_rng(0)
    for n in (1, 63, 64, 65, 1000):  # fewer elements than work items, a partial last round, many rounds
        xa = rng.standard_normal((3, n)).astype(np.float32)
        xa[1, n // 2] = np.nan  # max propagates NaN through the tree
        arrays = dict(x=xa, h=rng.standard_normal((2, n)).astype(np.float16),
                      i=rng.integers(-2**31, 2**31 - 1, (4, n)).astype(np.int32))  # sums wrap
        for j, (got, want) in enumerate(zip(prog(**arrays), ref(**arrays))):
            if got.dtype.kind in "iu":
                np.testing.assert_array_equal(got, want, err_msg=f"output {j}, k={n}")
            else:
                rtol = 2e-3 if got.dtype == np.float16 else 1e-5
                np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=rtol, atol=1e-5,
                                           err_msg=f"output {j}, k={n}")
