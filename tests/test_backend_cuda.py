"""The CUDA backend without a GPU: every kernel of several programs compiles through NVRTC to an sm_90
cubin, and running where there is no driver or device raises a clear CudaUnavailableError.

Skips, with the reason printed, where NVRTC (pip install nvidia-cuda-nvrtc cuda-bindings) is missing.
Where a CUDA device exists, the frontend cases and random graphs (``LIGHTSPEED_CUDA_RANDOM_EXAMPLES``,
default 100) also run on it against the reference (scripts/gpu_check.py runs these).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import test_backend_c_random as rg  # the module, so its C test is not collected a second time here
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import lightspeed as ls
from lightspeed import symbolic as sym
from lightspeed.graph import Program, describe
from frontend_cases import CASES, DIM_BOUNDS, build_graph
from gpu_schedules import check_against_reference, gpu_gemm_schedules, matmul_cases
from lightspeed.backend.cuda import CudaUnavailableError, available, compile_cubins
from lightspeed.backend.cuda.driver import Device

REASON = available()
if REASON is not None:
    print(f"tests/test_backend_cuda.py: skipped: {REASON}")
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"NVRTC unavailable: {REASON}")


def _device_reason() -> str | None:
    try:
        Device(0)
    except CudaUnavailableError as e:
        return str(e)
    return None


DEVICE_REASON = _device_reason() if REASON is None else REASON
ELF = b"\x7fELF"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ls_cache_cuda"))


def _check_cubins(results) -> None:
    assert results
    for name, source, cubin in results:
        assert f"LS_KERNEL {name}(" in source
        assert cubin[:4] == ELF, f"{name}: not an ELF cubin"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_frontend_case_kernels_compile_to_sm90_cubins(case) -> None:
    """The graph with symbolic dims where the case has them (as run_case builds it), else static."""
    names = set().union(*(s.keys() for s in case.sizes))
    dims = {k: ls.dim(k, *DIM_BOUNDS[k]) for k in names} if case.symbolic else case.sizes[0]
    g, out, _ = build_graph(case, dims)
    _check_cubins(compile_cubins([out], arch="sm_90"))


def test_tiny_llama_kernels_compile_to_sm90_cubins(tmp_path) -> None:
    """Every kernel of a tiny Llama's step program (prefill and decode in one, symbolic seq and pos)."""
    from tiny_gguf import write_tiny_llama
    from lightspeed.models import load_model
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path)
    lm = load_model(path)
    g, outputs, _ = lm.build(32, 8, True, "rows", "float32")
    results = compile_cubins(outputs, arch="sm_90")
    _check_cubins(results)
    assert len(results) >= 8  # norms, projections, rotary, attention, MLP, logits
    assert any("LS_SHARED" in source for _, source, _ in results)  # projections as tiled gemm kernels


def test_float16_and_bfloat16_kernels_compile() -> None:
    g = ls.Graph()
    n = ls.dim("n", 1, 64)
    x = g.input("x", (n, 16), ls.float16)
    w = g.input("w", (16, 8), ls.bfloat16)
    y = (x.cast(ls.float32) @ w.cast(ls.float32)).cast(ls.float16).exp() + x[:, :8]
    _check_cubins(compile_cubins([y.cast(ls.int8), y.max(-1)]))


@pytest.mark.skipif(DEVICE_REASON is None, reason="a CUDA device is present")
def test_running_without_a_device_says_what_is_missing() -> None:
    g = ls.Graph()
    x = g.input("x", (4,))
    prog = g.compile([x.exp()], backend="cuda")  # compiling needs no device
    assert prog.executor.cubin[:4] == ELF
    with pytest.raises(CudaUnavailableError, match="cannot run it: no NVIDIA driver|cannot run it: .*device") as e:
        prog(x=np.ones(4, np.float32))
    assert "Traceback" not in str(e.value)


@pytest.mark.skipif(DEVICE_REASON is not None, reason=f"no CUDA device: {DEVICE_REASON}")
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_cuda_on_device(case, symbolic: bool) -> None:
    from frontend_cases import run_case
    if case.torch:
        pytest.importorskip("torch")
    if symbolic and not case.symbolic:
        pytest.skip("this case has no symbolic dims")
    run_case(case, "cuda", symbolic)


def test_long_reductions_compile() -> None:
    """Row reductions (a block per output, a tree in shared memory: backend/gpu/reduce.py)."""
    g = ls.Graph()
    k = ls.dim("k", 1, 4096)
    x = g.input("x", (3, k))
    i = g.input("i", (3, k), ls.int8)
    results = compile_cubins([x.max(-1), x.sum(-1), i.sum(-1), x.softmax(-1), (x * x).mean(-1).rsqrt()])
    _check_cubins(results)
    assert sum("part[lid]" in source for _, source, _ in results) >= 4


# random graphs on the device against the reference backend (tests/test_backend_c_random.py's generator) ----
RANDOM_EXAMPLES = int(os.environ.get("LIGHTSPEED_CUDA_RANDOM_EXAMPLES", "100"))


@pytest.mark.skipif(DEVICE_REASON is not None, reason=f"no CUDA device: {DEVICE_REASON}")
@settings(max_examples=RANDOM_EXAMPLES, deadline=None, phases=rg.PHASES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_random_graph_cuda_matches_reference(data: st.DataObject) -> None:
    built = rg.GraphMaker(data).build()
    outs = [v.t for v in built.outputs]
    program = Program.build(built.graph, outs)
    note("\n".join(built.log) + "\nprogram:\n" + describe(program) + "\noutputs: " + repr(program.outputs))
    prog = built.graph.compile(outs, backend="cuda")
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
        for k, (gv, wv, v) in enumerate(zip(got, want, built.outputs)):
            rg._compare(gv, wv, v, f"output {k} at dims {env} (the graph is in the notes above)")


# gemm kernels under random schedules (backend/gpu/gemm.py reads each kernel's Schedule) ----------------------
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_gemm_schedules_compile(data: st.DataObject) -> None:
    """Any schedule the renderer takes compiles for sm_90, at up to 1024 threads per block."""
    g, outs, _, _ = data.draw(matmul_cases())
    schedule = data.draw(gpu_gemm_schedules(max_group=1024))
    note(f"schedule {schedule}")
    prog = g.compile(outs, backend="cuda", arch="sm_90", schedules=lambda k: schedule)
    assert prog.executor.cubin[:4] == ELF
    assert all(k.schedule is schedule for k in prog.executor.plan.kernels if k.kind == "gemm")


@pytest.mark.skipif(DEVICE_REASON is not None, reason=f"no CUDA device: {DEVICE_REASON}")
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_gemm_schedules_on_device(data: st.DataObject) -> None:
    g, outs, arrays, lengths = data.draw(matmul_cases())
    schedule = data.draw(gpu_gemm_schedules(max_group=1024))
    note(f"schedule {schedule}")
    prog = g.compile(outs, backend="cuda", schedules=lambda k: schedule)
    check_against_reference(g, outs, prog, arrays, lengths)


@pytest.mark.skipif(DEVICE_REASON is None, reason="a CUDA device is present")
def test_search_without_a_device_says_so() -> None:
    g = ls.Graph()
    x = g.input("x", (64, 64))
    with pytest.raises(CudaUnavailableError, match="search=1 times schedules on the device, and there is none"):
        g.compile([x @ x], backend="cuda", search=1)


@pytest.mark.skipif(DEVICE_REASON is not None, reason=f"no CUDA device: {DEVICE_REASON}")
def test_search_on_device(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))
    seq = ls.dim("seq", 1, 2048)
    g = ls.Graph()
    x, w = g.input("x", (seq, 1024)), g.input("w", (1024, 1024))
    prog = g.compile([x @ w.T], backend="cuda", search=1, search_dims={"seq": 1024})
    report = prog.executor.search_report
    assert report.rejected == 0 and report.tried >= 3
    a = np.random.default_rng(0).standard_normal((300, 1024)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((1024, 1024)).astype(np.float32)
    np.testing.assert_allclose(prog(x=a, w=b)[0], a @ b.T, rtol=1e-3, atol=1e-3)
