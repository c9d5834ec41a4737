"""Running a rendered GPU program on a device: the part the OpenCL and CUDA backends share.

A backend supplies a ``GpuDevice`` (device memory, its kernels, launches); ``GpuExecutor`` does the rest:

- **Weights stay on the device.** Every constant of the plan (embedded arrays: a model's weights) is
  uploaded once, when the program is set up, and never again.
- Device buffers for the inputs and outputs are allocated once, at the upper bounds of the symbolic
  dimensions; every temporary lives in one arena buffer at its ``Buffer.offset``.
- A run uploads the inputs, launches the kernels in plan order (a gemm kernel with few output rows takes
  its row form: ``GpuKernel.launch_for``) and downloads the outputs, into ``out`` arrays where given.
- **Donated inputs can stay on the device** (``resident``): a donated input's device buffer holds its
  updated value after a run (a KV cache written in place by Scatter), so a caller that keeps passing the
  same state can name it in ``resident``: it is not uploaded, and ``fetch`` limits which outputs come back
  (a decode step then moves only token ids in and logits out).

``uploads`` and ``uploaded_bytes`` count host-to-device copies (what the tests check residency with).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Collection, Mapping, Protocol, Sequence

import numpy as np

from ... import symbolic as sym
from ...kernel.fusion import KernelPlan
from .render import SMALL_ROWS, GpuKernel, GpuProgram


class GpuDevice(Protocol):
    """Device memory and kernels of one device (``OpenCLDevice``, ``CudaDevice``)."""

    def alloc(self, nbytes: int) -> Any:
        """A device buffer of ``nbytes`` (at least 1)."""

    def upload(self, dst: Any, a: np.ndarray) -> None:
        """Copy ``a`` (C-contiguous) to the start of ``dst``; may be asynchronous until ``synchronize``."""

    def download(self, a: np.ndarray, src: Any) -> None:
        """Copy the first ``a.nbytes`` of ``src`` into ``a``; may be asynchronous until ``synchronize``."""

    def prepare(self, function: str, buffers: Sequence[tuple[Any, int]], n_scalars: int,
                pointers: Sequence[Any] = ()) -> Any:
        """A launchable kernel ``function`` bound to its (buffer, byte offset) arguments and then to the
        plain buffer arguments ``pointers``, taking ``n_scalars`` 64-bit integers after them (the work
        items, then the program's dimensions)."""

    def launch(self, kernel: Any, scalars: Sequence[int], groups: int, block: int) -> None:
        """Launch a prepared kernel on ``groups`` work groups of ``block`` work items."""

    def synchronize(self) -> None:
        """Wait for every copy and launch so far."""

    def begin_capture(self) -> None:
        """Record the launches that follow instead of running them (a CUDA graph; a list elsewhere)."""

    def end_capture(self) -> Any:
        """The recording since ``begin_capture``, ready to ``replay``."""

    def replay(self, recording: Any) -> None:
        """Run a recording's launches again, in order, on the device's queue."""


class GpuExecutor:
    """Runs ``gpu`` (rendered from ``plan``) on ``device``; ``block``: work-group size of kernels that leave
    it to the launcher."""

    writes_into = True  # run(..., out=) downloads into the caller's arrays (CompiledGraph.run)

    def __init__(self, plan: KernelPlan, gpu: GpuProgram, device: GpuDevice, block: int):
        self.plan, self.gpu, self.device, self.block = plan, gpu, device, int(block)
        self.uploads = self.uploaded_bytes = 0
        self._mem: dict[int, Any] = {}  # id(Buffer) -> device buffer
        for b in plan.inputs:
            self._mem[id(b)] = device.alloc(b.nbytes)
        for b, c in plan.consts:  # the weights: uploaded once, here
            self._mem[id(b)] = device.alloc(b.nbytes)
            self._upload(self._mem[id(b)], np.ascontiguousarray(c.array))
        for b in plan.outputs:
            if id(b) not in self._mem:
                self._mem[id(b)] = device.alloc(b.nbytes)
        self._arena = device.alloc(max(plan.arena_bytes, 64))
        self._dim_names = [v.name for v in plan.dims]
        self.donated = plan_donated(plan)
        self._prepared: dict[int, Any] = {}  # id(GpuKernel) -> the device's prepared kernel
        for launch in gpu.kernels:
            for variant in (launch, launch.small):
                if variant is not None:
                    self._prepared[id(variant)] = device.prepare(variant.function, self.buffer_arguments(variant),
                                                                 1 + len(plan.dims))
        device.synchronize()

    def buffer_arguments(self, launch: GpuKernel) -> list[tuple[Any, int]]:
        """The (device buffer, byte offset) arguments of ``launch``'s buffers."""
        return [(self._arena, b.offset) if b.kind == "temp" else (self._mem[id(b)], 0) for b in launch.buffers]

    def upload(self, dst: Any, a: np.ndarray) -> None:
        """Copy ``a`` to device buffer ``dst``, counted in ``uploads`` and ``uploaded_bytes``."""
        self._upload(dst, a)

    def _upload(self, dst: Any, a: np.ndarray) -> None:
        if a.nbytes:
            self.device.upload(dst, a)
            self.uploads += 1
            self.uploaded_bytes += a.nbytes

    def graph_device(self, source: str) -> GpuDevice:
        """The device over this executor's memory and queue with the kernels of ``source`` (graph.py)."""
        raise NotImplementedError(f"{type(self).__name__} cannot record launches")

    def run(self, inputs: Mapping[str, np.ndarray], env: Mapping[str, int],
            out: Mapping[int, np.ndarray] | None = None, resident: Collection[str] = (),
            fetch: Collection[int] | None = None, launch: Callable[[], None] | None = None) -> list[np.ndarray | None]:
        """The outputs at dimension values ``env``. ``out``: output index -> array that receives it;
        ``resident``: donated inputs whose device buffers already hold the value to use (not uploaded;
        their arrays may be absent from ``inputs``); ``fetch``: the output indices to copy back (None: all;
        the others are None in the result); ``launch``: what runs the kernels, between the uploads and the
        downloads (a recording's replay, graph.py; default: every kernel launched in plan order)."""
        plan = self.plan
        for name in resident:
            if name not in self.donated:
                raise ValueError(f"resident input {name!r} is not an input this program updates in place "
                                 f"(those are: {sorted(self.donated) or 'none'})")
        keep = []  # the uploaded arrays live until the copies are done
        for b in plan.inputs:
            if b.name in resident:
                continue
            a = np.ascontiguousarray(inputs[b.name])
            keep.append(a)
            self._upload(self._mem[id(b)], a)
        if launch is not None:
            launch()
        else:
            self._launch_all(env)
        return self._fetch(inputs, env, out, resident, fetch, keep)

    def _launches(self, env: Mapping[str, int], names: Collection[str] | None = None) -> list[tuple[str, tuple]]:
        """(plan kernel name, ``GpuDevice.launch`` arguments) of each launch at dimension values ``env`` in plan
        order (those of ``names`` only, when given): its form for ``env`` (a gemm kernel with few rows takes its
        row form), launches with no work items left out."""
        dims = [int(env[n]) for n in self._dim_names]
        values: dict = {}  # a run evaluates each distinct work-item expression once (launch overhead)

        def evaluate(e) -> int:
            if not isinstance(e, sym.Expr):
                return int(e)
            got = values.get(e)
            if got is None:
                got = values[e] = int(sym.evaluate(e, env))
            return got

        out = []
        for launch in self.gpu.kernels:
            if names is not None and launch.name not in names:
                continue
            variant = launch.small if launch.small is not None and evaluate(launch.rows) <= SMALL_ROWS else launch
            n = evaluate(variant.items)
            if n <= 0:
                continue
            block = variant.block or self.block
            out.append((launch.name, (self._prepared[id(variant)], [n] + dims, (n + block - 1) // block, block)))
        return out

    def _launch_all(self, env: Mapping[str, int]) -> None:
        for _, args in self._launches(env):
            self.device.launch(*args)

    def time_kernels(self, env: Mapping[str, int], names: Collection[str], min_seconds: float = 0.01,
                     rounds: int = 3) -> dict[str, float]:
        """Seconds per launch of each plan kernel in ``names`` at dimension values ``env`` (the form it takes
        there), the best of ``rounds`` rounds of back-to-back launches lasting at least ``min_seconds`` each.
        Run the program once before, so every buffer a kernel reads holds valid values."""
        dev = self.device
        out: dict[str, float] = {}
        for name, args in self._launches(env, names):
            dev.synchronize()
            t0 = time.perf_counter()
            dev.launch(*args)
            dev.synchronize()
            once = max(time.perf_counter() - t0, 1e-7)
            repeats = max(1, min(1000, int(min_seconds / once)))
            best = once
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(repeats):
                    dev.launch(*args)
                dev.synchronize()
                best = min(best, (time.perf_counter() - t0) / repeats)
            out[name] = best
        return out

    def _fetch(self, inputs, env, out, resident, fetch, keep) -> list[np.ndarray | None]:
        plan, dev = self.plan, self.device
        outs: list[np.ndarray | None] = []
        for k, b in enumerate(plan.outputs):
            if fetch is not None and k not in fetch:
                outs.append(None)
                continue
            if b.kind == "input" and b.name not in resident:  # a donated input updated in place
                o = inputs[b.name]
            elif out is not None and k in out:
                o = out[k]
            else:
                o = np.empty(tuple(int(sym.evaluate(s, env)) for s in b.shape), dtype=b.dtype.np)
            if o.nbytes:
                dev.download(o, self._mem[id(b)])
            outs.append(o)
        dev.synchronize()
        del keep
        return outs


def plan_donated(plan: KernelPlan) -> set[str]:
    """Names of the inputs a plan updates in place (outputs stored in an input's buffer)."""
    return {b.name for b in plan.outputs if b.kind == "input"}
