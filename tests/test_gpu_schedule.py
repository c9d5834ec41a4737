"""The GPU renderer reads each gemm kernel's Schedule (backend/gpu/gemm.py, backend/gpu/scheduling.py).

Random schedules (tile sizes, register blocks, panel depths, load orders, tile orders, runs of columns,
unrolls) on random matmul-like programs (symbolic rows, odd sizes, transposed, batched and decoded operands)
must match the reference on OpenCL; the rendered kernels must follow the schedule; the heuristics pick by
device and shape; schedules the renderer cannot apply are refused by name, before anything is compiled.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import lightspeed as ls
from gpu_schedules import check_against_reference, gpu_gemm_schedules, matmul_cases
from lightspeed.backend.gpu import form_plan
from lightspeed.backend.gpu.gemm import gpu_gemm_sizes
from lightspeed.backend.opencl import unavailable_reason
from lightspeed.graph import Program
from lightspeed.kernel.heuristics import GpuTarget, gpu_gemm_schedule
from lightspeed.kernel.schedule import (Order, Pack, Register, Schedule, ScheduleError, SplitReduce, Tile,
                                        Unroll, Vectorize)

REASON = unavailable_reason()
if REASON is not None:
    print(f"tests/test_gpu_schedule.py: OpenCL tests skipped: {REASON}")
needs_opencl = pytest.mark.skipif(REASON is not None, reason=f"no OpenCL device: {REASON}")


def _gemm_kernels(plan) -> list:
    return [k for k in plan.kernels if k.kind == "gemm"]


@needs_opencl
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_schedules_match_reference_on_opencl(data: st.DataObject) -> None:
    g, outs, arrays, lengths = data.draw(matmul_cases())
    schedule = data.draw(gpu_gemm_schedules())
    note(f"schedule {schedule}")
    prog = g.compile(outs, backend="opencl", schedules=lambda k: schedule)
    kernels = _gemm_kernels(prog.executor.plan)
    assert len(kernels) == 3 and all(k.schedule is schedule for k in kernels)
    threads = gpu_gemm_sizes(schedule)["THREADS"]
    tiled = [launch for launch in prog.executor.gpu.kernels if launch.name in {k.name for k in kernels}]
    assert len(tiled) == 3 and all(launch.block == threads for launch in tiled)
    check_against_reference(g, outs, prog, arrays, lengths)


def _program(k: int = 48) -> tuple:
    seq = ls.dim("seq", 1, 4096)
    g = ls.Graph()
    x = g.input("x", (seq, k))
    w = g.input("w", (40, k))  # read along k: its panel loads along k
    v = g.input("v", (k, 40))  # read along n
    return g, [x @ w.T, x @ v]


def test_rendered_kernel_follows_its_schedule() -> None:
    """Panel sizes, register blocks, the work-group size, the load order of each panel and the unroll pragma
    come from the schedule: a mutation of the renderer that ignores a step changes the text checked here."""
    from lightspeed.backend.gpu import CUDA, render_program
    g, outs = _program()
    s = Schedule((Tile("m", 24), Tile("n", 20), Tile("k", 8), Register("m", 3), Register("n", 5),
                  Vectorize("n", 5), Pack("a", "m"), Pack("b", "k"), Order(("n", "m")), Unroll("k", 4)))
    plan = form_plan(Program.build(g, outs), GpuTarget(), lambda k: s)
    gpu = render_program(plan, CUDA)
    text = gpu.source
    assert "As[24][9]" in text and "Bs[8][21]" in text  # loaded across rows: padded
    assert "float acc[3][5]" in text and "#pragma unroll 4" in text
    assert "ty = lid / 4, tx = lid % 4" in text  # 20 / 5 work items along n
    assert "pr = q % 24, pc = q / 24" in text  # Pack("a", "m"): consecutive items walk a's rows
    assert "pr = q % 8, pc = q / 8" in text  # Pack("b", "k"): b's panel rows are k
    assert "((j / 5) * 4 + tx) * 5 + j % 5" in text  # runs of 5 columns
    m0 = text.index("const ls_i64 m0")
    assert m0 < text.index("const ls_i64 n0")  # Order(("n", "m")): m is the fastest group index
    gemms = {k.name for k in _gemm_kernels(plan)}
    tiled = [launch for launch in gpu.kernels if launch.name in gemms]
    assert len(tiled) == 2 and all(launch.block == 8 * 4 for launch in tiled)


def test_default_schedule_loads_along_unit_stride() -> None:
    """The heuristics load each operand's panel along the axis its loads walk contiguously: x @ w.T reads w
    along k, x @ v reads v along n; x along k in both."""
    g, outs = _program()
    plan = form_plan(Program.build(g, outs), GpuTarget())
    packs = sorted((k.schedule.find(Pack, "a").along, k.schedule.find(Pack, "b").along) for k in _gemm_kernels(plan))
    assert packs == [("k", "k"), ("k", "n")]


def test_heuristics_choose_by_device_and_shape() -> None:
    gpu, cpu = GpuTarget(), GpuTarget(max_group=4096, local_bytes=256 * 1024, cpu=True)

    def sizes(target, **kw):
        z = gpu_gemm_sizes(gpu_gemm_schedule(target, **kw), target)
        return z["TM"], z["TN"], z["RM"], z["RN"], z["D"]
    assert sizes(gpu) == (64, 64, 4, 4, 16)  # symbolic sizes
    assert sizes(gpu, rows=2048, columns=4096) == (128, 128, 8, 8, 16)
    assert sizes(gpu, rows=16, columns=4096) == (32, 64, 2, 4, 16)
    small = GpuTarget(max_group=128, local_bytes=4096)  # 256 items too many, panels of 8 KiB too large
    assert sizes(small, rows=2048, columns=4096) == (32, 64, 4, 4, 8)
    assert sizes(cpu) == (64, 64, 16, 16, 32)


@pytest.mark.parametrize("step, message", [
    (SplitReduce("k", 2), "is not applied"),
    (Register("k", 2), "is not applied"),
    (Vectorize("m", 4), "is not applied"),
    (Unroll("m", 2), "is not applied"),
    (Order(("k", "m", "n")), "is not applied"),
    (Pack("a", "n"), "loads along one of"),
    (Register("m", 5), "not multiples of the register block"),
    (Vectorize("n", 3), "not a multiple of Vectorize"),
    (Tile("q", 4), "names axis"),
])
def test_schedules_the_renderer_cannot_apply_are_refused(step, message: str) -> None:
    g, outs = _program()
    s = gpu_gemm_schedule(GpuTarget()).with_steps(step)
    with pytest.raises(ScheduleError, match=message) as e:
        form_plan(Program.build(g, outs), GpuTarget(), lambda k: s)
    assert "kernel " in str(e.value)  # names the kernel


def test_device_limits_are_checked() -> None:
    g, outs = _program()
    big = Schedule((Tile("m", 64), Tile("n", 64), Register("m", 1), Register("n", 1)))  # 4096 work items
    with pytest.raises(ScheduleError, match="4096 work items per group.*allows 1024"):
        form_plan(Program.build(g, outs), GpuTarget(), lambda k: big)
    deep = Schedule((Tile("m", 128), Tile("n", 128), Tile("k", 64), Register("m", 8), Register("n", 8)))
    with pytest.raises(ScheduleError, match="panels of 65536 bytes.*49152 bytes of local memory"):
        form_plan(Program.build(g, outs), GpuTarget(), lambda k: deep)
    plan = form_plan(Program.build(g, outs), GpuTarget(max_group=4096, local_bytes=1 << 20), lambda k: big)
    assert all(k.schedule is big for k in _gemm_kernels(plan))


def test_a_kernel_the_choice_leaves_alone_gets_the_default() -> None:
    g, outs = _program()
    s = Schedule((Tile("m", 32), Tile("n", 32), Register("m", 2), Register("n", 2)))
    plan = form_plan(Program.build(g, outs), GpuTarget(), lambda k: s if any(b.name == "w" for b in k.reads) else None)
    got = {k.schedule is s for k in _gemm_kernels(plan)}
    assert got == {True, False}


# measured schedules (lightspeed/search/gpu_schedule.py) -------------------------------------------------------
def _search_program() -> tuple:
    seq = ls.dim("seq", 1, 128)
    g = ls.Graph()
    x = g.input("x", (seq, 96))
    w = g.input("w", (80, 96))
    v = g.input("v", (96, 48))
    return g, [(x @ w.T).relu(), x @ v]


@needs_opencl
def test_search_checks_times_and_caches(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))
    g, outs = _search_program()
    prog = g.compile(outs, backend="opencl", search=1, search_dims={"seq": 64})
    report = prog.executor.search_report
    assert report.stopped_by in ("done", "no-gain") and report.tried >= 3 and report.rejected == 0
    assert report.env == {"seq": 64}
    for k in (k for k in prog.executor.plan.kernels if k.kind == "gemm"):
        assert k.schedule is report.choice.get(k.name, k.schedule)
    ref = g.compile(outs, backend="reference")
    x = np.random.default_rng(0).standard_normal((50, 96)).astype(np.float32)
    arrays = dict(x=x, w=np.ones((80, 96), np.float32), v=np.ones((96, 48), np.float32))
    for got, want in zip(prog(**arrays), ref(**arrays)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    again = g.compile(outs, backend="opencl", search=1, search_dims={"seq": 64}).executor.search_report
    assert again.stopped_by == "cached" and again.tried == 0 and again.from_cache == 2
    assert {n: s.canonical() for n, s in again.choice.items()} == {n: s.canonical() for n, s in report.choice.items()}


class _Rigged:
    """A real executor whose kernel timings (and, if asked, outputs) are replaced: what the search must see
    through. ``factor`` scales the reported kernel times."""

    def __init__(self, ex, factor: float = 1.0, wrong: bool = False):
        self.ex, self.factor, self.wrong = ex, factor, wrong
        self.plan, self.gpu = ex.plan, ex.gpu

    def run(self, inputs, env):
        outs = self.ex.run(inputs, env)
        return [o + 1.0 for o in outs] if self.wrong else outs

    def time_kernels(self, env, names, **kw):
        return {n: t * self.factor for n, t in self.ex.time_kernels(env, names, **kw).items()}


def _tune(build, tmp_path, monkeypatch):
    from lightspeed.search.gpu_schedule import tune_gpu_schedules
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))
    g, outs = _search_program()
    target = GpuTarget(max_group=4096, local_bytes=256 * 1024, cpu=True)
    return tune_gpu_schedules(Program.build(g, outs), lambda choose: build(g, outs, choose, target), target,
                              "rigged device", dims={"seq": 64})


def _executor(g, outs, choose, target):
    from lightspeed.backend.gpu import OPENCL, render_program
    from lightspeed.backend.gpu.executor import GpuExecutor
    from lightspeed.backend.opencl import OpenCLDevice, find_device
    plan = form_plan(Program.build(g, outs), target, choose)
    gpu = render_program(plan, OPENCL, small_form="loop")
    return GpuExecutor(plan, gpu, OpenCLDevice(find_device(), gpu.source), 64)


@needs_opencl
def test_search_rejects_a_candidate_with_wrong_outputs(tmp_path, monkeypatch) -> None:
    """Every candidate computes wrong outputs (and claims to be 100x faster): none is chosen."""
    res = _tune(lambda g, o, c, t: _executor(g, o, c, t) if c is None else _Rigged(_executor(g, o, c, t), 0.01, True),
                tmp_path, monkeypatch)
    assert res.choice == {} and res.rejected == res.tried >= 3


@needs_opencl
def test_search_never_picks_a_slower_candidate(tmp_path, monkeypatch) -> None:
    res = _tune(lambda g, o, c, t: _executor(g, o, c, t) if c is None else _Rigged(_executor(g, o, c, t), 50.0),
                tmp_path, monkeypatch)
    assert res.choice == {} and res.rejected == 0 and res.tried >= 3


@needs_opencl
def test_search_keeps_the_heuristics_when_the_whole_program_is_not_faster(tmp_path, monkeypatch) -> None:
    """Candidates that claim faster kernels are chosen per kernel, but the whole program, timed, must beat the
    heuristics' build: a program slowed on purpose does not, and the heuristics stay."""
    class Slow(_Rigged):
        def run(self, inputs, env):
            import time
            time.sleep(0.05)
            return self.ex.run(inputs, env)
    res = _tune(lambda g, o, c, t: _executor(g, o, c, t) if c is None else Slow(_executor(g, o, c, t), 0.01),
                tmp_path, monkeypatch)
    assert res.choice == {} and res.stopped_by == "no-gain" and res.tuned_seconds > res.default_seconds


@pytest.mark.parametrize("options, message", [
    (dict(search=3), "search must be 0, 1 or 2"),
    (dict(search=1, schedules=lambda k: None), "schedules or search, not both"),
])
@needs_opencl
def test_search_options_are_checked(options, message: str) -> None:
    g, outs = _search_program()
    with pytest.raises(ValueError, match=message):
        g.compile(outs, backend="opencl", **options)
