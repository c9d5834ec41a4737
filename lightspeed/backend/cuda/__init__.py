"""The CUDA backend: the shared GPU kernels (backend/gpu) in CUDA C, compiled by NVRTC to a cubin and
launched through the CUDA driver API.

Compiling needs only the NVRTC wheel (no GPU, no driver), so ``g.compile(..., backend="cuda")`` works on
any machine and ``compile_cubins`` checks every kernel of a program; running needs a driver and a device,
and without them raises ``CudaUnavailableError`` saying which is missing. Device memory as in the OpenCL
backend: one allocation per input, constant and output (upper-bound sizes), one arena for temporaries;
kernels are launched in plan order on one stream. Not built yet: CUDA graphs, a device-side KV cache
(inputs and outputs are copied every run), tensor cores, quantized matvec kernels.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ... import symbolic as sym
from ...graph import Program
from ...kernel import form_kernels
from .. import register_backend
from ..gpu import CUDA, render_program
from .driver import CudaError, CudaUnavailableError, Device
from .nvrtc import DEFAULT_ARCH, NvrtcError, available, compile_cubin

__all__ = ["CudaBackend", "CudaError", "CudaUnavailableError", "NvrtcError", "compile_cubins", "available"]


def _program(what) -> Program:
    if isinstance(what, Program):
        return what
    outs = list(what)
    if not outs:
        raise ValueError("compile_cubins: no outputs given")
    return Program.build(outs[0].graph, outs)


def compile_cubins(what: "Program | Sequence", arch: str = DEFAULT_ARCH) -> list[tuple[str, str, bytes]]:
    """(kernel function name, its CUDA source, its cubin) for every distinct kernel of ``what`` (a Program
    or a list of output Tensors), each compiled on its own by NVRTC for ``arch``; no GPU needed."""
    plan = form_kernels(_program(what), use_templates=False)
    gpu = render_program(plan, CUDA)
    prelude = CUDA.prelude()
    out = []
    for name, text in gpu.functions.items():
        source = prelude + "\n" + text
        out.append((name, source, compile_cubin(source, arch, name=f"{name}.cu")))
    return out


@register_backend("cuda")
class CudaBackend:
    """Executor for ``backend="cuda"``. Options: ``device`` (CUDA device index), ``arch`` (the NVRTC
    target, e.g. "sm_90"; default: the device's own, or sm_90 where there is no device), ``block``
    (threads per block)."""

    def __init__(self, program: Program, device: int = 0, arch: str | None = None, block: int | None = None):
        t0 = time.perf_counter()
        self.program = program
        self.plan = form_kernels(program, use_templates=False)
        self.gpu = render_program(self.plan, CUDA)
        self.source = self.gpu.source
        self.block = int(block or CUDA.block)
        self.arena_bytes = self.plan.arena_bytes
        self.device_error: str | None = None
        self._device: Device | None = None
        try:
            self._device = Device(device)
        except CudaUnavailableError as e:
            self.device_error = str(e)  # compiling still works; running raises this
        self.arch = arch or (self._device.arch() if self._device is not None else DEFAULT_ARCH)
        self.cubin = compile_cubin(self.source, self.arch)
        self.compile_seconds = time.perf_counter() - t0
        if self._device is not None:
            self._setup(self._device)

    def _setup(self, dev: Device) -> None:
        plan = self.plan
        self._module = dev.load(self.cubin)
        self._mem: dict[int, object] = {}
        for b in plan.inputs:
            self._mem[id(b)] = dev.alloc(b.nbytes)
        for b, c in plan.consts:
            self._mem[id(b)] = dev.alloc(b.nbytes)
            dev.upload(self._mem[id(b)], np.ascontiguousarray(c.array))
        for b in plan.outputs:
            if id(b) not in self._mem:
                self._mem[id(b)] = dev.alloc(b.nbytes)
        self._arena = dev.alloc(max(plan.arena_bytes, 64))
        self._steps = []  # (function, work items, argument values, argument address array, block size)
        for launch in self.gpu.kernels:
            fn = dev.function(self._module, launch.function)
            values = []
            for b in launch.buffers:
                base, off = (self._arena, b.offset) if b.kind == "temp" else (self._mem[id(b)], 0)
                values += [np.array([int(base)], np.uint64), np.array([off], np.int64)]
            values += [np.zeros(1, np.int64) for _ in range(1 + len(plan.dims))]  # n_items, dims: set per run
            addresses = np.array([v.ctypes.data for v in values], np.uint64)
            self._steps.append((fn, launch.items, values, addresses, launch.block or self.block))
        dev.synchronize()

    def run(self, inputs: dict[str, np.ndarray], env: dict[str, int]) -> list[np.ndarray]:
        if self._device is None:
            raise CudaUnavailableError(f"backend 'cuda' compiled this program ({len(self.gpu.functions)} kernels, "
                                       f"{self.arch} cubin) but cannot run it: {self.device_error}")
        dev, plan = self._device, self.plan
        dev.current()
        keep = []
        for b in plan.inputs:
            a = np.ascontiguousarray(inputs[b.name])
            keep.append(a)
            dev.upload(self._mem[id(b)], a)
        dims = [int(env[v.name]) for v in plan.dims]
        for fn, items, values, addresses, block in self._steps:
            n = int(sym.evaluate(items, env))
            if n <= 0:
                continue
            k = len(values) - 1 - len(dims)
            values[k][0] = n
            for i, d in enumerate(dims):
                values[k + 1 + i][0] = d
            # cuLaunchKernel copies the argument values, and each launch has its own
            dev.launch(fn, (n + block - 1) // block, block, addresses)
        outs = []
        for b in plan.outputs:
            if b.kind == "input":  # a donated input updated in place: the caller's array receives it
                a = inputs[b.name]
                dev.download(a, self._mem[id(b)])
                outs.append(a)
                continue
            o = np.empty(tuple(int(sym.evaluate(s, env)) for s in b.shape), dtype=b.dtype.np)
            dev.download(o, self._mem[id(b)])
            outs.append(o)
        dev.synchronize()  # the copies are asynchronous: ``keep`` holds the uploaded arrays until here
        del keep
        return outs
