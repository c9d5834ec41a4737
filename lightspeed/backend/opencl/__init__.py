"""The OpenCL backend: the shared GPU kernels (backend/gpu) in OpenCL C, run through pyopencl.

On a machine without a GPU the device is PoCL on the CPU (see device.py), so every GPU kernel can be
checked against the reference backend anywhere. Device memory: one buffer per input, constant and output
(sized from the upper bounds of the symbolic dimensions), one arena buffer for every temporary
(``plan.arena_bytes``, each at its ``Buffer.offset``). A run copies the inputs in, enqueues the kernels
in plan order on one in-order queue and copies the outputs back.
"""
from __future__ import annotations

import time

import numpy as np

from ... import symbolic as sym
from ...graph import Program
from ...kernel import form_kernels
from .. import register_backend
from ..gpu import OPENCL, render_program
from .device import OpenCLUnavailableError, configure_pocl, find_device, unavailable_reason

__all__ = ["OpenCLBackend", "OpenCLUnavailableError", "configure_pocl", "unavailable_reason"]

# float32 division and sqrt correctly rounded (OpenCL allows 2.5 and 3 ulp otherwise): the reference
# backend's values are numpy's, and exact inputs must give exact results. -w: generated code draws
# warnings that say nothing to a user (the NaN test ``x != x`` of a constant), which pyopencl re-raises
BUILD_OPTIONS = ("-cl-fp32-correctly-rounded-divide-sqrt", "-w")


@register_backend("opencl")
class OpenCLBackend:
    """Executor for ``backend="opencl"``. Options: ``device`` (index over all OpenCL platforms' devices),
    ``block`` (work items per work group), ``build_options`` (extra OpenCL compiler options)."""

    def __init__(self, program: Program, device: int = 0, block: int | None = None,
                 build_options: tuple[str, ...] = ()):
        t0 = time.perf_counter()
        dev = find_device(device)
        import pyopencl as cl
        from ..c.cache_files import cache_subdir
        self.program = program
        self.plan = form_kernels(program, use_templates=False)
        self.gpu = render_program(self.plan, OPENCL)
        self.source = self.gpu.source
        self.block = int(block or OPENCL.block)
        self.context = cl.Context([dev])
        self.queue = cl.CommandQueue(self.context)
        options = list(BUILD_OPTIONS) + list(build_options)
        self._cl = cl.Program(self.context, self.source).build(options=options,
                                                               cache_dir=str(cache_subdir("pyopencl")))
        self.compile_seconds = time.perf_counter() - t0
        plan = self.plan
        mf = cl.mem_flags
        self._bufs: dict[int, object] = {}  # id(Buffer) -> device buffer
        for b in plan.inputs:
            self._bufs[id(b)] = cl.Buffer(self.context, mf.READ_WRITE, max(b.nbytes, 1))
        for b, c in plan.consts:
            a = np.ascontiguousarray(c.array)
            if a.nbytes:
                self._bufs[id(b)] = cl.Buffer(self.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
            else:
                self._bufs[id(b)] = cl.Buffer(self.context, mf.READ_ONLY, 1)
        for b in plan.outputs:
            if id(b) not in self._bufs:
                self._bufs[id(b)] = cl.Buffer(self.context, mf.READ_WRITE, max(b.nbytes, 1))
        self.arena_bytes = plan.arena_bytes
        self._arena = cl.Buffer(self.context, mf.READ_WRITE, max(plan.arena_bytes, 64))
        self._steps = []  # (kernel object, work items expression, index of its n_items argument, group size)
        for launch in self.gpu.kernels:
            kern = cl.Kernel(self._cl, launch.function)
            for i, b in enumerate(launch.buffers):
                if b.kind == "temp":
                    kern.set_arg(2 * i, self._arena)
                    kern.set_arg(2 * i + 1, np.int64(b.offset))
                else:
                    kern.set_arg(2 * i, self._bufs[id(b)])
                    kern.set_arg(2 * i + 1, np.int64(0))
            self._steps.append((kern, launch.items, 2 * len(launch.buffers), launch.block or self.block))
        self._dim_names = [v.name for v in plan.dims]

    def run(self, inputs: dict[str, np.ndarray], env: dict[str, int]) -> list[np.ndarray]:
        import pyopencl as cl
        plan, q = self.plan, self.queue
        for b in plan.inputs:
            a = np.ascontiguousarray(inputs[b.name])
            if a.nbytes:
                cl.enqueue_copy(q, self._bufs[id(b)], a, is_blocking=False)
        dims = [np.int64(env[n]) for n in self._dim_names]
        for kern, items, at, block in self._steps:
            n = int(sym.evaluate(items, env))
            if n <= 0:
                continue
            kern.set_arg(at, np.int64(n))
            for i, d in enumerate(dims):
                kern.set_arg(at + 1 + i, d)
            groups = (n + block - 1) // block
            cl.enqueue_nd_range_kernel(q, kern, (groups * block,), (block,))
        outs = []
        for b in plan.outputs:
            if b.kind == "input":  # a donated input updated in place: the caller's array receives it
                a = inputs[b.name]
                if a.nbytes:
                    cl.enqueue_copy(q, a, self._bufs[id(b)])
                outs.append(a)
                continue
            shape = tuple(int(sym.evaluate(s, env)) for s in b.shape)
            o = np.empty(shape, dtype=b.dtype.np)
            if o.nbytes:
                cl.enqueue_copy(q, o, self._bufs[id(b)])
            outs.append(o)
        q.finish()
        return outs
