"""The C backend: kernels rendered as one C function, compiled with the system compiler,
called once per run through ctypes with plain integer addresses."""
from __future__ import annotations

import ctypes
import time

import numpy as np

from ... import symbolic as sym
from ...graph import Program
from ...kernel import form_kernels
from .. import register_backend
from .compiler import (CompilerError, compile_shared, default_flags, find_compiler, get_num_threads,
                       runtime_library, set_num_threads, set_spin_time)
from .render import render_plan

__all__ = ["CBackend", "CompilerError", "set_num_threads", "get_num_threads", "set_spin_time"]


@register_backend("c")
class CBackend:
    """Executor for ``backend="c"``. Options: ``cc`` (compiler command), ``flags`` (list of compiler flags)."""

    def __init__(self, program: Program, cc: str | None = None, flags: list[str] | None = None):
        t0 = time.perf_counter()
        self.program = program
        self.plan = form_kernels(program)
        self.source = render_plan(self.plan)
        runtime_library()  # the thread pool must be loaded (globally) before any kernel library
        self.library_path = compile_shared(self.source, flags if flags is not None else default_flags(),
                                           cc or find_compiler())
        self.lib = ctypes.CDLL(str(self.library_path))
        self._fn = self.lib.ls_graph
        self._fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._fn.restype = None
        self.compile_seconds = time.perf_counter() - t0
        plan = self.plan
        n_slots = len(plan.inputs) + len(plan.consts) + len(set(id(b) for b in plan.outputs))
        self._ptrs = np.zeros(max(n_slots, 1), dtype=np.uint64)
        self._dims = np.zeros(max(len(plan.dims), 1), dtype=np.int64)
        self._consts = [c.array for _, c in plan.consts]  # keep them alive
        for (b, c) in plan.consts:
            self._ptrs[b.slot] = c.array.ctypes.data
        self.arena_bytes = plan.arena_bytes
        self._arena = np.empty(plan.arena_bytes + 64, dtype=np.uint8)
        self._arena_addr = (self._arena.ctypes.data + 63) // 64 * 64
        self._ptrs_addr = self._ptrs.ctypes.data
        self._dims_addr = self._dims.ctypes.data
        self._in_slots = [(b.name, b.slot) for b in plan.inputs]
        self._dim_names = [v.name for v in plan.dims]
        self._outs = []  # (slot, shape exprs, numpy dtype, first index using that buffer)
        seen: dict[int, int] = {}
        for k, b in enumerate(plan.outputs):
            self._outs.append((b.slot, b.shape, b.dtype.np, seen.setdefault(id(b), k)))

    def run(self, inputs: dict[str, np.ndarray], env: dict[str, int]) -> list[np.ndarray]:
        ptrs = self._ptrs
        keep = []
        for name, slot in self._in_slots:
            a = inputs[name]
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
                keep.append(a)
            ptrs[slot] = a.ctypes.data
        for i, name in enumerate(self._dim_names):
            self._dims[i] = env[name]
        outs: list = []
        for k, (slot, shape, npdt, first) in enumerate(self._outs):
            if first == k:
                o = np.empty(tuple(int(sym.evaluate(s, env)) for s in shape), dtype=npdt)
                ptrs[slot] = o.ctypes.data
                outs.append(o)
            else:
                outs.append(None)  # the same buffer as an earlier output: copied after the run
        self._fn(self._ptrs_addr, self._dims_addr, self._arena_addr)
        return [o if o is not None else outs[first].copy() for o, (_, _, _, first) in zip(outs, self._outs)]
