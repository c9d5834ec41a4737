"""Run a compiled candidate of a kernel plan on real buffers: outputs for the reference check and, when
the library was rendered with ``profile=True``, the time of every kernel."""
from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import numpy as np

from .. import symbolic as sym
from ..backend.c.library import FFI as _FFI, repack_layout
from ..backend.c.repack import bind_repacks
from ..kernel.fusion import KernelPlan


class PlanRunner:
    """A loaded shared object for ``plan`` with its buffers bound for one set of inputs and dimensions."""

    def __init__(self, plan: KernelPlan, library_path, inputs: dict[str, np.ndarray], env: dict[str, int],
                 profile: bool):
        self.plan = plan
        self.lib = _FFI.dlopen(str(library_path))
        self.profile = _FFI.cast("int64_t *", _FFI.addressof(self.lib, "ls_profile_ns")) if profile else None
        self.env = dict(env)
        self._inputs = {k: np.ascontiguousarray(v) for k, v in inputs.items()}
        self._work = {k: v.copy() for k, v in self._inputs.items()}  # in-place kernels may write inputs
        slots = len(plan.inputs) + len(plan.consts) + len({id(b) for b in plan.outputs}) + len(plan.repacks)
        self.ptrs = _FFI.new("void *[]", max(slots, 1))
        for b in plan.inputs:
            self.ptrs[b.slot] = _FFI.from_buffer(self._work[b.name])
        for b, c in plan.consts:
            self.ptrs[b.slot] = _FFI.from_buffer(c.array)
        # weights some matmuls read in a layout of their own (backend/c/repack.py), as the executor binds them:
        # the build's repacked copy, or the constant itself where the build reads the GGUF layout
        by_slot = {b.slot: c.array for b, c in plan.consts}
        self._repacked = bind_repacks(plan.repacks, repack_layout(self.lib), by_slot) if plan.repacks else {}
        for r in plan.repacks:
            self.ptrs[r.slot] = _FFI.from_buffer(self._repacked.get(r.slot, by_slot[r.source_slot]))
        self.outs: list[np.ndarray] = []
        made: dict[int, np.ndarray] = {}
        for b in plan.outputs:
            if b.kind == "input":
                self.outs.append(self._work[b.name])
                continue
            if id(b) not in made:
                shape = tuple(int(sym.evaluate(d, env)) for d in b.shape)
                made[id(b)] = np.zeros(shape, dtype=b.dtype.np)
                self.ptrs[b.slot] = _FFI.from_buffer(made[id(b)])
            self.outs.append(made[id(b)])
        self.dims = _FFI.new("int64_t[]", max(len(plan.dims), 1))
        for i, v in enumerate(plan.dims):
            self.dims[i] = env[v.name]
        self._arena = np.zeros(plan.arena_bytes + 64, dtype=np.uint8)
        self.arena = _FFI.cast("char *", (self._arena.ctypes.data + 63) // 64 * 64)

    def outputs(self) -> list[np.ndarray]:
        """One run from fresh inputs; copies of the outputs."""
        for k, v in self._inputs.items():
            np.copyto(self._work[k], v)
        self.lib.ls_graph(self.ptrs, self.dims, self.arena)
        return [o.copy() for o in self.outs]

    def time(self, min_seconds: float = 0.05, max_runs: int = 20) -> tuple[float, list[float]]:
        """(best seconds of a whole run, best seconds of each kernel) over repeated runs."""
        n = len(self.plan.kernels)
        best_total, best = float("inf"), [float("inf")] * n
        self.lib.ls_graph(self.ptrs, self.dims, self.arena)  # warm caches and the thread pool
        start = time.perf_counter()
        for run in range(max_runs):
            if self.profile is not None:
                for i in range(n):
                    self.profile[i] = 0
            t0 = time.perf_counter()
            self.lib.ls_graph(self.ptrs, self.dims, self.arena)
            best_total = min(best_total, time.perf_counter() - t0)
            if self.profile is not None:
                for i in range(n):
                    best[i] = min(best[i], self.profile[i] / 1e9)
            if run >= 2 and time.perf_counter() - start >= min_seconds:
                break
        return best_total, best


def compare(a: PlanRunner, b: PlanRunner, runs: int = 7) -> tuple[float, float]:
    """Best seconds of a whole run of ``a`` and of ``b``, runs alternating so that a noisy machine
    (other processes, frequency changes) affects both alike."""
    ta = tb = float("inf")
    for r in (a, b):
        r.lib.ls_graph(r.ptrs, r.dims, r.arena)
    for _ in range(runs):
        for r in (a, b):
            t0 = time.perf_counter()
            r.lib.ls_graph(r.ptrs, r.dims, r.arena)
            dt = time.perf_counter() - t0
            if r is a:
                ta = min(ta, dt)
            else:
                tb = min(tb, dt)
    return ta, tb


def in_background(fn, *args) -> cf.Future:
    """``fn(*args)`` on a daemon thread: a compile past a search's budget is abandoned, and neither waits for
    it nor keeps the interpreter from exiting (a thread pool's workers are joined at exit)."""
    fut: cf.Future = cf.Future()

    def run():
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
            fut.set_exception(e)
    threading.Thread(target=run, daemon=True).start()
    return fut
