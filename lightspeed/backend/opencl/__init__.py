"""The OpenCL backend: the shared GPU kernels (backend/gpu) in OpenCL C, run through pyopencl.

On a machine without a GPU the device is PoCL on the CPU (see device.py), so every GPU kernel can be
checked against the reference backend anywhere. Running is the shared GPU executor (gpu/executor.py:
weights uploaded once, donated inputs that can stay on the device) over ``OpenCLDevice``: one in-order
command queue, pyopencl buffers, kernels whose buffer arguments are set once.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from ...graph import Program
from ...kernel.heuristics import GpuTarget
from ...search.gpu_schedule import tune_gpu_schedules
from .. import register_backend
from ..gpu import OPENCL, form_plan, render_program
from ..gpu.availability import SEARCH_BUDGET_S, check_search_options, reject_options
from ..gpu.executor import GpuExecutor
from .device import OpenCLUnavailableError, configure_pocl, find_device, unavailable_reason

__all__ = ["OpenCLBackend", "OpenCLDevice", "OpenCLUnavailableError", "configure_pocl", "device_target",
           "find_device", "unavailable_reason"]

# float32 division and sqrt correctly rounded (OpenCL allows 2.5 and 3 ulp otherwise): the reference
# backend's values are numpy's, and exact inputs must give exact results. -w: generated code draws
# warnings that say nothing to a user (the NaN test ``x != x`` of a constant), which pyopencl re-raises
BUILD_OPTIONS = ("-cl-fp32-correctly-rounded-divide-sqrt", "-w")


def device_identity(dev) -> str:
    """What names OpenCL device ``dev``'s compiled code and timings in caches: platform, device, driver."""
    return f"{dev.platform.name} {dev.platform.version} / {dev.name} / {dev.driver_version}"


def device_target(dev) -> GpuTarget:
    """What the GPU schedules need of OpenCL device ``dev`` (a ``pyopencl.Device``): its largest work group,
    its local memory, and whether it is a CPU (PoCL runs a work group as loops over its work items)."""
    import pyopencl as cl
    return GpuTarget(max_group=int(dev.max_work_group_size), local_bytes=int(dev.local_mem_size),
                     cpu=bool(dev.type & cl.device_type.CPU))


class OpenCLDevice:
    """``GpuDevice`` of one OpenCL device: a context, an in-order queue and one built program."""

    def __init__(self, device, source: str, build_options: Sequence[str] = (), share: "OpenCLDevice | None" = None):
        import pyopencl as cl
        from ..c.cache_files import cache_subdir
        self.cl = cl
        self.build_options = tuple(build_options)
        if share is None:
            self.context = cl.Context([device])
            self.queue = cl.CommandQueue(self.context)
        else:  # another program in the same context and queue: buffers and ordering are shared
            self.context, self.queue = share.context, share.queue
        options = list(BUILD_OPTIONS) + list(build_options)
        self.program = cl.Program(self.context, source).build(options=options,
                                                              cache_dir=str(cache_subdir("pyopencl")))
        self._recording: list | None = None

    def sibling(self, source: str) -> "OpenCLDevice":
        """A device over the same context and queue with the kernels of ``source``."""
        return OpenCLDevice(None, source, self.build_options, share=self)

    def alloc(self, nbytes: int):
        return self.cl.Buffer(self.context, self.cl.mem_flags.READ_WRITE, max(int(nbytes), 1))

    def upload(self, dst, a: np.ndarray) -> None:
        self.cl.enqueue_copy(self.queue, dst, a, is_blocking=False)

    def download(self, a: np.ndarray, src) -> None:
        self.cl.enqueue_copy(self.queue, a, src, is_blocking=False)

    def prepare(self, function: str, buffers: Sequence[tuple[Any, int]], n_scalars: int,
                pointers: Sequence[Any] = ()):
        kern = self.cl.Kernel(self.program, function)
        for i, (buf, offset) in enumerate(buffers):
            kern.set_arg(2 * i, buf)
            kern.set_arg(2 * i + 1, np.int64(offset))
        for i, buf in enumerate(pointers):
            kern.set_arg(2 * len(buffers) + i, buf)
        return kern, 2 * len(buffers) + len(pointers)

    def launch(self, kernel, scalars: Sequence[int], groups: int, block: int) -> None:
        kern, at = kernel
        if self._recording is not None:
            if scalars:
                raise ValueError("a recorded launch cannot take scalar arguments (they are read at the launch)")
            self._recording.append((kern, groups, block))
            return
        for i, v in enumerate(scalars):
            kern.set_arg(at + i, np.int64(v))
        self.cl.enqueue_nd_range_kernel(self.queue, kern, (groups * block,), (block,))

    def synchronize(self) -> None:
        self.queue.finish()

    def begin_capture(self) -> None:
        self._recording = []

    def end_capture(self) -> list:
        recording, self._recording = self._recording, None
        return recording

    def replay(self, recording: list) -> None:
        for kern, groups, block in recording:
            self.cl.enqueue_nd_range_kernel(self.queue, kern, (groups * block,), (block,))


@register_backend("opencl")
class OpenCLBackend(GpuExecutor):
    """Executor for ``backend="opencl"``. Options: ``device`` (index over all OpenCL platforms' devices),
    ``block`` (work items per work group), ``build_options`` (extra OpenCL compiler options),
    ``small_form`` (how gemm kernels with few rows run: "rows" or "loop", see ``render_program``; default:
    "loop" on a CPU device such as PoCL's, "rows" on others), ``schedules`` (a function kernel ->
    kernel.schedule.Schedule or None: the schedule of each gemm kernel, default the heuristics' for the
    device, ``device_target``), ``search`` (0: the heuristics; 1: quick, 2: thorough: gemm schedules timed
    on the device, checked and cached, lightspeed/search/gpu_schedule.py), ``search_budget_s`` (its time
    budget), ``search_dims`` (the dimension values to tune at)."""

    def __init__(self, program: Program, device: int = 0, block: int | None = None,
                 build_options: tuple[str, ...] = (), small_form: str | None = None, schedules=None,
                 search: int = 0, search_budget_s: float | None = None, search_dims: dict | None = None,
                 **options):
        reject_options("opencl", options, ("device", "block", "build_options", "small_form", "schedules", "search",
                                           "search_budget_s", "search_dims"))
        check_search_options("opencl", search, schedules)
        t0 = time.perf_counter()
        dev = find_device(device)
        import pyopencl as cl
        self.program = program
        self.target = device_target(dev)
        if small_form is None:
            small_form = "loop" if dev.type & cl.device_type.CPU else "rows"
        self.small_form = small_form
        block = int(block or OPENCL.block)

        def build(choose):
            plan = form_plan(program, self.target, choose)
            gpu = render_program(plan, OPENCL, small_form=small_form)
            return plan, gpu, OpenCLDevice(dev, gpu.source, build_options)

        self.search_report = None
        if search:
            self.search_report = tune_gpu_schedules(
                program, lambda choose: GpuExecutor(*build(choose), block), self.target, device_identity(dev),
                level=search, budget_s=search_budget_s or SEARCH_BUDGET_S, dims=search_dims)
            schedules = self.search_report.choose()
        plan, gpu, self.opencl = build(schedules)
        self.source = gpu.source
        self.compile_seconds = time.perf_counter() - t0
        self.arena_bytes = plan.arena_bytes
        super().__init__(plan, gpu, self.opencl, block)

    @property
    def queue(self):
        return self.opencl.queue

    def graph_device(self, source: str) -> OpenCLDevice:
        """The device of a parameters-in-memory program (graph.py): same context, queue and buffers."""
        return self.opencl.sibling(source)
