"""The CUDA backend: the shared GPU kernels (backend/gpu) in CUDA C, compiled by NVRTC to a cubin and
launched through the CUDA driver API (the shared GPU executor, gpu/executor.py, over ``CudaDevice``).

Compiling needs only the NVRTC wheel (no GPU, no driver), so ``g.compile(..., backend="cuda")`` works on
any machine and ``compile_cubins`` checks every kernel of a program; running needs a driver and a device,
and without them raises ``CudaUnavailableError`` saying which is missing. Device memory as in the OpenCL
backend: weights uploaded once, one allocation per input and output (upper-bound sizes), one arena for
temporaries, donated inputs that can stay on the device; kernels are launched in plan order on one stream,
or replayed from a CUDA graph (gpu/graph.py: ResidentLM's one-token steps). Not built yet: tensor cores,
quantized matvec kernels of their own.
"""
from __future__ import annotations

import time
from typing import Sequence

from ...graph import Program
from ...kernel.heuristics import GpuTarget
from ...search.gpu_schedule import tune_gpu_schedules
from .. import register_backend
from ..gpu import CUDA, form_plan, render_program
from ..gpu.availability import SEARCH_BUDGET_S, check_search_options, reject_options
from ..gpu.executor import GpuExecutor
from .driver import CudaError, CudaUnavailableError, Device
from .launch import CudaDevice
from .nvrtc import DEFAULT_ARCH, NvrtcError, available, compile_cubin, nvrtc_version

# every architecture NVRTC targets here (sm_70 and later) runs blocks of 1024 threads and gives a block 48 KiB
# of static shared memory (more only through a dynamic allocation the kernels do not make)
CUDA_TARGET = GpuTarget(max_group=1024, local_bytes=48 * 1024, cpu=False)

__all__ = ["CUDA_TARGET", "CudaBackend", "CudaError", "CudaUnavailableError", "NvrtcError", "compile_cubins",
           "available", "device_unavailable_reason"]


def _program(what) -> Program:
    if isinstance(what, Program):
        return what
    outs = list(what)
    if not outs:
        raise ValueError("compile_cubins: no outputs given")
    return Program.build(outs[0].graph, outs)


def compile_cubins(what: "Program | Sequence", arch: str = DEFAULT_ARCH,
                   params_in_memory: bool = False) -> list[tuple[str, str, bytes]]:
    """(kernel function name, its CUDA source, its cubin) for every distinct kernel of ``what`` (a Program
    or a list of output Tensors), each compiled on its own by NVRTC for ``arch``; no GPU needed.
    ``params_in_memory``: the kernels as a recorded step runs them (gpu/graph.py)."""
    plan = form_plan(_program(what), CUDA_TARGET)
    gpu = render_program(plan, CUDA, params_in_memory=params_in_memory)
    prelude = CUDA.prelude()
    out = []
    for name, text in gpu.functions.items():
        source = prelude + "\n" + text
        out.append((name, source, compile_cubin(source, arch, name=f"{name}.cu")))
    return out


def device_unavailable_reason(device: int = 0) -> str | None:
    """Why CUDA kernels cannot run here (no cuda-bindings, no driver, no device ``device``), or None."""
    try:
        Device(device)
    except CudaUnavailableError as e:
        return str(e)
    return None


@register_backend("cuda")
class CudaBackend(GpuExecutor):
    """Executor for ``backend="cuda"``. Options: ``device`` (CUDA device index), ``arch`` (the NVRTC
    target, e.g. "sm_90"; default: the device's own, or sm_90 where there is no device), ``block``
    (threads per block), ``schedules`` (a function kernel -> kernel.schedule.Schedule or None: the schedule of
    each gemm kernel; default the heuristics' for ``CUDA_TARGET``), ``search`` (0: the heuristics; 1: quick,
    2: thorough: gemm schedules timed on the device, checked and cached, lightspeed/search/gpu_schedule.py;
    needs a device), ``search_budget_s`` (its time budget), ``search_dims`` (the dimension values to tune at).
    Compiling needs no device; running (or searching) without one raises CudaUnavailableError."""

    def __init__(self, program: Program, device: int = 0, arch: str | None = None, block: int | None = None,
                 schedules=None, search: int = 0, search_budget_s: float | None = None,
                 search_dims: dict | None = None, **options):
        reject_options("cuda", options, ("device", "arch", "block", "schedules", "search", "search_budget_s",
                                         "search_dims"))
        check_search_options("cuda", search, schedules)
        t0 = time.perf_counter()
        self.program = program
        self.device_error: str | None = None
        found: Device | None = None
        try:
            found = Device(device)
        except CudaUnavailableError as e:
            self.device_error = str(e)  # compiling still works; running raises this
        self.arch = arch or (found.arch() if found is not None else DEFAULT_ARCH)
        block = int(block or CUDA.block)

        def build(choose):
            plan = form_plan(program, CUDA_TARGET, choose)
            gpu = render_program(plan, CUDA)
            return plan, gpu, compile_cubin(gpu.source, self.arch)

        self.search_report = None
        if search:
            if found is None:
                raise CudaUnavailableError(f"backend 'cuda': search={search} times schedules on the device, and "
                                           f"there is none: {self.device_error}")
            identity = f"{found.name()} {self.arch} nvrtc {nvrtc_version()}"

            def executor(choose) -> GpuExecutor:
                plan, gpu, cubin = build(choose)
                return GpuExecutor(plan, gpu, CudaDevice(found, cubin), block)
            self.search_report = tune_gpu_schedules(program, executor, CUDA_TARGET, identity, level=search,
                                                    budget_s=search_budget_s or SEARCH_BUDGET_S, dims=search_dims)
            schedules = self.search_report.choose()
        plan, gpu, self.cubin = build(schedules)
        self.source = gpu.source
        self.arena_bytes = plan.arena_bytes
        self.compile_seconds = time.perf_counter() - t0
        self.plan, self.gpu = plan, gpu
        self._ready = found is not None
        if found is not None:
            super().__init__(plan, gpu, CudaDevice(found, self.cubin), block)

    def graph_device(self, source: str) -> CudaDevice:
        """The device of a parameters-in-memory program (graph.py): its own cubin, the same memory."""
        return self.device.sibling(compile_cubin(source, self.arch, name="lightspeed_graph.cu"))

    def run(self, inputs, env, out=None, resident=(), fetch=None, launch=None):
        if not self._ready:
            raise CudaUnavailableError(f"backend 'cuda' compiled this program ({len(self.gpu.functions)} kernels, "
                                       f"{self.arch} cubin) but cannot run it: {self.device_error}")
        self.device.device.current()
        return super().run(inputs, env, out=out, resident=resident, fetch=fetch, launch=launch)
