"""The C backend: kernels rendered as one C function, compiled with the system compiler,
called once per run through ctypes with plain integer addresses."""
from __future__ import annotations

import time
import weakref


import numpy as np

from ... import memory
from ... import symbolic as sym
from ...graph import Program
from .. import register_backend
from .activations import resolve_activations, source_prefix
from .compiler import (CompilerError, compile_shared, default_flags, find_compiler, get_num_threads,
                       runtime_library, set_num_threads, set_spin_time)
from .plan_cache import lookup as lookup_plan
from .library import FFI as _FFI, repack_layout
from .repack import REPACK_CODES, bind_repacks
from .render import render_plan
from .scheduling import form_c_plan

try:  # the backend's from_buffer skips a Python-level wrapper (about 0.4 us per buffer)
    _from_buffer_raw = _FFI._backend.from_buffer
    _CHAR_ARRAY = _FFI.typeof("char[]")

    def _from_buffer(a):
        return _from_buffer_raw(_CHAR_ARRAY, a, False)
except AttributeError:  # pragma: no cover - other cffi versions
    _from_buffer = _FFI.from_buffer


def _shape_function(shape):
    def concrete(env):
        return tuple(int(sym.evaluate(d, env)) for d in shape)
    return concrete


__all__ = ["CBackend", "CompilerError", "set_num_threads", "get_num_threads", "set_spin_time"]


HUGE_PAGE_MIN_BYTES = 64 << 10  # smaller constants stay where they are


# copies in huge-page memory of read-only weights: a second program over the same weights (e.g. serve's batched
# step next to the single-sequence one) reads the same copy instead of making another
_COPIES = memory.SharedCopies()


def _weights_on_huge_pages(arrays: list[np.ndarray], keep: frozenset[int] = frozenset()) -> list[np.ndarray]:
    """``arrays`` with the large ones not yet in huge-page memory replaced by copies that are (one region
    for all new copies); the file pages of the originals are released (see lightspeed/memory.py). The arrays
    at the indices ``keep`` stay where they are."""
    out = list(arrays)
    todo = []
    for k, a in enumerate(arrays):
        if a.nbytes < HUGE_PAGE_MIN_BYTES or memory.in_region(a) or k in keep:
            continue
        copy = _COPIES.get(a)
        if copy is not None:
            out[k] = copy
        else:
            todo.append(k)
    if not todo:
        return out
    region = memory.HugePageRegion(memory.region_bytes(arrays[k] for k in todo))
    maps = memory.read_mappings()  # once for every copy: the file mappings do not change while they run
    for k in todo:
        # chunk by chunk, so a large weight is not resident twice while it is copied
        out[k] = region.copy(arrays[k], release=True, maps=maps)
        _COPIES.put(arrays[k], out[k])
    return out


class _RowTargets:
    """What ``run_rows`` needs of a RowStep: the output slots it points into rows of caller arrays (held
    here, so they stay alive), the other outputs, and the inputs that change between calls."""

    def __init__(self, slots: list[int], bases: list[int], row_bytes: list[int], arrays: list[np.ndarray],
                 others: list[tuple], varying: list[tuple[int, str, int]], n_outputs: int):
        self.slots = np.array(slots, dtype=np.intp)
        self.bases = np.array(bases, dtype=np.uintp)
        self.row_bytes = np.array(row_bytes, dtype=np.uintp)
        self.arrays, self.others, self.varying, self.n_outputs = arrays, others, varying, n_outputs


@register_backend("c")
class CBackend:
    """Executor for ``backend="c"``. Options: ``cc`` (compiler command), ``flags`` (list of compiler flags),
    ``templates`` (False runs every subgraph as generic fused loops, without lowered kernels such as the
    quantized matmul), ``profile`` (time every kernel; read with ``kernel_times()``), ``portable`` (use
    only the portable C paths of the kernels, not the ones for CPU features such as AVX-512),
    ``activations`` (how quantized matmuls of Q8_0/Q4_0/Q4_1 weights take their activations: "float", the default, keeps
    them float32, which reproduces a float reference such as transformers token for token; "int16" quantizes them
    per block of 32 to int16, ~2e-5 relative error in each product; "int8" to int8, as GGUF's Q8_0 dot products do,
    ~0.5% relative error in each product; "auto" (the language models' default, see models/base.py) by the CPU:
    int16 on AVX-512 VNNI without AMX, int16 for calls of up to 8 rows and float for longer ones on other AVX-512
    CPUs and AVX2, float elsewhere (activations.py); ``int8_activations=True`` is the older spelling of "int8"),
    ``search`` (0: heuristics; 1: quick, 2: thorough search of rewrites and kernel schedules, measured on this machine
    and cached; see lightspeed/search/driver.py), ``search_budget_s`` (its time budget), ``search_dims``
    (dimension values to tune at), ``huge_pages`` (copy constants of at least 64 KiB, i.e. weights, once
    into memory advised for 2 MiB pages, releasing the pages of a read-only file mapping they came from;
    see lightspeed/memory.py), ``plan_cache`` (reuse the rendered source of a structurally identical
    program compiled before, skipping kernel formation and rendering; see plan_cache.py), ``gemm`` (False
    keeps matmul-like reductions in plain loops instead of packed, register-blocked "gemm" kernels),
    ``schedules`` (a function kernel -> kernel.schedule.Schedule or None: the schedule of each gemm kernel
    in place of the heuristics' default; see docs/architecture.md, "Schedules"), ``knobs`` (name -> value, e.g.
    ``{"TILE": 8, "ATTENTION_KEYS": 64}``: edits of every kernel's schedule that reads them,
    kernel/schedule_knobs.py)."""

    writes_into = True  # run(..., out=) writes outputs into the caller's arrays

    def __init__(self, program: Program, cc: str | None = None, flags: list[str] | None = None,
                 templates: bool = True, profile: bool = False, portable: bool = False,
                 activations: str = "float", int8_activations: bool = False, search: int = 0,
                 search_budget_s: float | None = None, search_dims: dict | None = None, huge_pages: bool = True,
                 plan_cache: bool = True, gemm: bool = True, schedules=None, knobs: dict | None = None):
        t0 = time.perf_counter()
        self.program = program
        # a program compiled before (same structure, options and code) skips formation and rendering
        # fuse_reduced: a value only one reduction reads, element by element, is computed inside it however
        # expensive (a product with a Q4_1 weight's decode was otherwise stored as a [seq, k, n] temporary:
        # a 435 MB arena for SmolLM2 with templates=False)
        mode, quant_rows_max = resolve_activations(activations, int8_activations)
        form_options = dict(use_templates=templates, activations=mode, gemm=gemm, byte_loads=True, fuse_reduced=True)
        cached = lookup_plan(program, form_options, enabled=plan_cache and not search and schedules is None
                             and not knobs,
                             profile=profile, portable=portable, quant_rows_max=quant_rows_max)
        self.plan = cached.plan or form_c_plan(program, form_options, choose=schedules, knobs=knobs)
        self.profile = profile
        schedule, self.search_report = None, None
        if search:  # --- search hook (lightspeed/search): graph rewrites, then measured kernel schedules
            from ...search.driver import search_compile
            self.plan, schedule, self.search_report = search_compile(
                program, self.plan, search, search_budget_s, cc=cc, flags=flags, dims=search_dims,
                form_options=form_options)
        self.source = cached.source or ("#define LS_PORTABLE 1\n" if portable else "") + source_prefix(
            quant_rows_max) + render_plan(
            self.plan, profile=profile, schedule=schedule)
        cached.store(self.plan, self.source)
        runtime_library()  # the thread pool must be loaded (globally) before any kernel library
        self.library_path = compile_shared(self.source, flags if flags is not None else default_flags(),
                                           cc or find_compiler())
        # cffi (ABI mode) passes buffer addresses several times cheaper than ctypes
        self._lib = _FFI.dlopen(str(self.library_path))
        self._fn = self._lib.ls_graph
        self.compile_seconds = time.perf_counter() - t0
        self._profile = _FFI.cast("int64_t *", _FFI.addressof(self._lib, "ls_profile_ns")) if profile else None
        plan = self.plan
        n_slots = len(plan.inputs) + len(plan.consts) + len(set(id(b) for b in plan.outputs)) + len(plan.repacks)
        self._ptrs = _FFI.new("void *[]", max(n_slots, 1))
        self._dims = _FFI.new("int64_t[]", max(len(plan.dims), 1))
        # the slots as integers, so run_rows sets many addresses in one numpy assignment
        self._slot_view = np.frombuffer(_FFI.buffer(self._ptrs), dtype=np.uintp)
        self._consts = [c.array for _, c in plan.consts]  # keep them alive
        # weights the build reads repacked (repack.py): the copies, made before any other copy of their source,
        # which the matmuls then no longer read; a repack slot of a format the build reads in the GGUF layout
        # points where its source's slot does
        repacked = {}
        if plan.repacks:
            by_slot = {b.slot: a for (b, _), a in zip(plan.consts, self._consts)}
            repacked = bind_repacks(plan.repacks, repack_layout(self._lib), by_slot)
        kept = frozenset(r.source_slot for r in plan.repacks if r.slot in repacked)
        if huge_pages:
            self._consts = _weights_on_huge_pages(
                self._consts, frozenset(k for k, (b, _) in enumerate(plan.consts) if b.slot in kept))
        by_slot = {b.slot: a for (b, _), a in zip(plan.consts, self._consts)}
        for r in plan.repacks:
            repacked.setdefault(r.slot, by_slot[r.source_slot])
        self._repacked = list(repacked.values())  # keep them alive
        for slot, a in list(by_slot.items()) + list(repacked.items()):
            self._ptrs[slot] = _FFI.from_buffer(a)
        self.arena_bytes = plan.arena_bytes
        memory.release_freed_heap()  # forming and rendering freed many objects; return their pages
        self._arena = np.empty(plan.arena_bytes + 64, dtype=np.uint8)
        self._arena_ptr = _FFI.cast("char *", (self._arena.ctypes.data + 63) // 64 * 64)
        self._in_slots = [(b.name, b.slot) for b in plan.inputs]
        self._last_inputs: list[np.ndarray | None] = [None] * len(self._in_slots)
        self._rows_owner = None  # the row targets whose fixed inputs the slots hold (run_rows)
        self._dim_names = [v.name for v in plan.dims]
        self._outs = []  # (slot, shape exprs, numpy dtype, first index using that buffer)
        seen: dict[int, int] = {}
        for k, b in enumerate(plan.outputs):
            if b.kind == "input":  # a donated input updated in place: the output is the caller's array
                self._outs.append((b.slot, b.name, None, seen.setdefault(id(b), k)))
                continue
            static = all(sym.is_const(d) for d in b.shape)
            shape = tuple(int(d) for d in b.shape) if static else _shape_function(b.shape)
            self._outs.append((b.slot, shape, b.dtype.np, seen.setdefault(id(b), k)))
        self._has_duplicates = len(seen) != len(self._outs)
        self._has_in_place = any(o[2] is None for o in self._outs)

    def reads_repacked(self, qtype) -> bool:
        """Whether this build's matmuls read weights of ``qtype`` (a lightspeed.quant.QType) repacked (repack.py)."""
        code = REPACK_CODES.get(qtype)
        return code is not None and bool(int(self._lib.ls_repack16_formats) >> code & 1)

    def kernel_times(self, reset: bool = True) -> list[tuple[str, float]]:
        """(kernel name, seconds spent) accumulated since the last reset; needs ``profile=True``."""
        if self._profile is None:
            raise ValueError("kernel_times: compile with backend options profile=True")
        out = []
        for i, k in enumerate(self.plan.kernels):
            out.append((f"{k.name}:{k.kind}", self._profile[i] / 1e9))
            if reset:
                self._profile[i] = 0
        return out

    def prepare_rows(self, targets: dict[int, np.ndarray], varying: list[str]) -> "_RowTargets | None":
        """For ``lightspeed.row_step.RowStep``: output k goes into rows of ``targets[k]`` (checked by the
        caller: writable, C-contiguous, same dtype and row shape); only the inputs named in ``varying`` change
        between calls. A donated input updated in place (not a target) comes back as None, as a target does.
        None where another output has no buffer of its own (a duplicate, a donated input as a target), which
        the ordinary path handles."""
        slots, bases, row_bytes, others = [], [], [], []
        for k, (slot, shape, npdt, first) in enumerate(self._outs):
            if npdt is None and first == k and k not in targets:
                continue  # written into the input's own array, whose slot holds it
            if npdt is None or first != k:
                return None
            if k in targets:
                slots.append(slot)
                bases.append(targets[k].ctypes.data)
                row_bytes.append(targets[k].strides[0])
            else:
                others.append((k, slot, shape, npdt))
        names = set(varying)
        moving = [(k, name, slot) for k, (name, slot) in enumerate(self._in_slots) if name in names]
        return _RowTargets(slots, bases, row_bytes, list(targets.values()), others, moving, len(self._outs))

    def run_rows(self, inputs: dict[str, np.ndarray], env: dict[str, int], targets: _RowTargets,
                 row: int) -> list[np.ndarray | None]:
        """Run once with the outputs of ``targets`` written at ``row`` of their arrays (None in the result);
        the caller checked everything, as for ``run``."""
        ptrs = self._ptrs
        last = self._last_inputs
        # the fixed inputs' addresses are in their slots unless another call ran since the last one of these
        slots = targets.varying if self._rows_owner is targets else [
            (k, name, slot) for k, (name, slot) in enumerate(self._in_slots)]
        copies = []  # contiguous copies of non-contiguous inputs, alive until the call returns
        for k, name, slot in slots:
            a = inputs[name]
            if a is not last[k]:
                if a.flags.c_contiguous:
                    last[k] = a
                else:
                    a = np.ascontiguousarray(a)
                    copies.append(a)
                    last[k] = None
                ptrs[slot] = _from_buffer(a)
        # a copy dies with this call: then the next one sets every slot again
        self._rows_owner = None if copies else targets
        dims = self._dims
        for i, name in enumerate(self._dim_names):
            dims[i] = env[name]
        self._slot_view[targets.slots] = targets.bases + targets.row_bytes * np.uintp(row)
        outs: list = [None] * targets.n_outputs
        for k, slot, shape, npdt in targets.others:
            o = np.empty(shape if type(shape) is tuple else shape(env), dtype=npdt)
            ptrs[slot] = _from_buffer(o)
            outs[k] = o
        self._fn(ptrs, dims, self._arena_ptr)
        return outs

    def run(self, inputs: dict[str, np.ndarray], env: dict[str, int],
            out: dict[int, np.ndarray] | None = None) -> list[np.ndarray]:
        """Run once; ``out`` maps output indices to arrays (checked by the caller: shape, dtype, C order)
        that the program writes into instead of new ones."""
        self._rows_owner = None
        ptrs = self._ptrs
        used = {}  # the arrays native code sees (contiguous copies of non-contiguous inputs)
        last = self._last_inputs
        for k, (name, slot) in enumerate(self._in_slots):
            a = inputs[name]
            if a is last[k]:  # the slot still holds this array's address (a KV cache passed every step)
                continue
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
                used[name] = a
                last[k] = None
            else:
                last[k] = a  # held, so the address cannot be reused by another array
            ptrs[slot] = _from_buffer(a)
        dims = self._dims
        for i, name in enumerate(self._dim_names):
            dims[i] = env[name]
        outs: list = []
        for k, (slot, shape, npdt, first) in enumerate(self._outs):
            if npdt is None:
                outs.append(None)  # filled after the run
            elif first == k:
                o = out.get(k) if out else None
                if o is None:
                    o = np.empty(shape if type(shape) is tuple else shape(env), dtype=npdt)
                ptrs[slot] = _from_buffer(o)
                outs.append(o)
            else:
                outs.append(None)  # the same buffer as an earlier output: copied after the run
        self._fn(ptrs, dims, self._arena_ptr)
        if self._has_in_place:
            for k, (slot, name, npdt, first) in enumerate(self._outs):
                if npdt is None and first == k:
                    outs[k] = used.get(name, inputs[name])
        if self._has_duplicates:
            outs = [o if o is not None else outs[first].copy() for o, (_, _, _, first) in zip(outs, self._outs)]
        if out:  # outputs that had no buffer of their own (duplicates, donated inputs) are copied in
            for k, o in out.items():
                if outs[k] is not o:
                    o[...] = outs[k]
                    outs[k] = o
        return outs
