"""Weights stored in the order a kernel consumes them ("repacked"), made when a program is loaded.

The 16-row int16 kernels of qdot16x16.h (AVX-512 VNNI) multiply 16 weight rows at once, one per 32-bit lane.
From the GGUF layout every block costs them 16 strided loads, in-lane transposes and a gather of the scales:
one decode row was compute-bound at about the speed of the memory stream. From the repacked layout
(``ls_repack16`` in qdot16x16.h: per group of 16 rows, their scales, then each block's quant bytes lane by lane)
a block is a few aligned loads, ~3x less work, and decode is bound by memory again.

AVX2 builds without AVX-512 read Q4_0 and Q4_1 repacked too, in groups of 8 rows (repack8.h: per block the 8 rows'
scales, their minimums, then each row's nibbles), by their int16 kernels and by qgemm.h's float kernel of longer
calls; the library names its layout (``ls_repack_rows``: 16 or 8, ``library.RepackLayout``), and copies are shared
within one layout only.

The choice has three parts that must agree:

- ``add_repacks`` (a plan pass): every int16 Q8_0 / Q4_0 / Q4_1 / Q5_0 matmul whose weights are a constant that
  nothing else reads and that is not already in huge-page memory reads them through a new pointer slot (a
  ``Repack``) and renders the repacked kernel call (``weights_layout="r16"``); the plan cache's key says which
  constants lie in huge-page memory. Q5_0 otherwise quantizes short calls only (longer ones run the float kernel
  over the GGUF layout); read repacked it takes the 16-row kernel at every row count, so its scratch grows to the
  call's rows;
- the rendered source says which formats this build reads repacked (``ls_repack16_formats``: the build has the
  16-row kernel of the format and nothing that reads the weights in the GGUF layout: no float rows, no AMX tiles;
  or, on AVX2, repack8.h's kernels for every row count);
- the executor (``bind_repacks``) fills each slot with a repacked copy where the build reads it repacked, else
  with the constant itself, so every other build (AVX2, portable) runs exactly as before.

The repacked copy takes the place of the copy into huge-page memory every large weight gets (lightspeed/memory.py):
it is made group by group and the file pages under each part of the original are handed back as it goes, so a
weight is not resident twice; the original is never read again. A constant that other kernels read too (a tied
embedding's row gather) and one already in huge-page memory (requantized at load, ``--quant``) are read as they
are: either way a repacked copy would hold the weight twice. Copies are shared by the programs compiled over
the same weights.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ... import memory
from ... import symbolic as sym
from ...kernel import ir
from ...kernel.fusion import KernelPlan, plan_memory
from ...kernel.quantized import activation_scratch_layout, quantized_rows_bound
from ...quant import QType, block_format
from .library import RepackLayout

GROUP = 16  # weight rows per group of the repacked layout (qdot16x16.h)
# the formats with a repacked layout, by the code qdot16x16.h's ls_repack16 takes (bit k of ls_repack16_formats)
REPACK_CODES = {QType.Q8_0: 0, QType.Q4_0: 1, QType.Q4_1: 2, QType.Q5_0: 3, QType.Q4_K: 4}
COPY_CHUNK = 16 << 20  # bytes repacked before the file pages under them are handed back


@dataclass(frozen=True)
class Repack:
    """Pointer ``slot`` holds constant ``source_slot`` (``rows`` rows of ``row_bytes``) repacked for format
    ``code`` (a value of REPACK_CODES), or the constant itself where the build does not read it repacked."""

    slot: int
    source_slot: int
    code: int
    rows: int
    row_bytes: int


def _eligible(k: ir.Kernel, in_place: set[int]) -> bool:
    """Whether kernel ``k`` is an int16 matmul of a REPACK_CODES format over a whole constant of at least GROUP
    rows."""
    q = k.template
    if k.kind != "qmatmul" or q.activations != "int16" or q.qtype not in REPACK_CODES or not k.scratch:
        return False
    raw = k.template_reads[1]
    if raw.kind != "const" or raw.slot in in_place or len(raw.shape) != 2 \
            or not all(isinstance(d, int) for d in raw.shape):
        return False
    rows, row_bytes = raw.shape
    return rows >= GROUP and row_bytes % block_format(q.qtype).block_bytes == 0


def add_repacks(plan: KernelPlan) -> KernelPlan:
    """``plan`` with every int16 Q8_0/Q4_0/Q4_1/Q5_0 matmul over a constant of at least GROUP rows, which no other
    kernel reads, reading it through a repack slot (one per constant, shared by its matmuls). A constant other
    kernels read too (a tied embedding's row gather) stays in the GGUF layout for all: the original would have to
    stay resident beside the copy, and a gather from a file mapping maps the pages around each row it reads."""
    slots = [b.slot for b in plan.inputs] + [b.slot for b, _ in plan.consts] + [b.slot for b in plan.outputs]
    next_slot = max(slots, default=-1) + 1
    # a constant already in huge-page memory (requantized at load) is read in place: a copy would hold it twice
    in_place = {b.slot for b, c in plan.consts if memory.in_region(c.array)}
    readers: dict[int, list[ir.Kernel]] = {}
    for k in plan.kernels:
        for b in k.reads:
            if b.kind == "const":
                readers.setdefault(b.slot, []).append(k)
    by_source: dict[int, ir.Buffer] = {}
    grown = False
    for k in plan.kernels:
        if not _eligible(k, in_place):
            continue
        x_buf, raw = k.template_reads
        if not all(_eligible(other, in_place) for other in readers[raw.slot]):
            continue
        twin = by_source.get(raw.slot)
        if twin is None:
            twin = ir.Buffer("const", raw.dtype, raw.shape, f"{raw.name}_r16", next_slot, nbytes=raw.nbytes)
            by_source[raw.slot] = twin
            plan.repacks.append(Repack(next_slot, raw.slot, REPACK_CODES[k.template.qtype], *raw.shape))
            next_slot += 1
        q = k.template = replace(k.template, weights_layout="r16")
        k.template_reads = [x_buf, twin]
        k.reads = [twin if b is raw else b for b in k.reads]
        # where every row count now quantizes its activations (quantized_rows_bound), the scratch holds them all
        rows = quantized_rows_bound(q.qtype, sym.upper_bound(q.rows), q.weights_layout)
        need = activation_scratch_layout(rows, q.in_features, q.activations)[-1]
        if need > k.scratch[0].nbytes:
            k.scratch[0].nbytes = need
            grown = True
    if grown:  # the arena's places of its buffers, again
        plan.arena_bytes = plan_memory(plan)
    return plan


# repacked copies of read-only weights, by source and layout: programs over the same weights share one
_COPIES = memory.SharedCopies()


def _kind(r: Repack, layout: RepackLayout) -> tuple:
    return (f"r{layout.rows}", r.code, r.rows, r.row_bytes)


def repacked_copy(source: np.ndarray, r: Repack, layout: RepackLayout, region: memory.HugePageRegion) -> np.ndarray:
    """The repacked copy of ``source`` (uint8, ``r.rows`` x ``r.row_bytes``) taken from ``region``, made by
    ``layout.make`` (the library's ls_repack16) a chunk of groups at a time; the file pages under each chunk of a
    read-only source are handed back once it is copied."""
    if source.dtype != np.uint8 or source.shape != (r.rows, r.row_bytes) or not source.flags.c_contiguous:
        raise ValueError(f"repack: constant of {source.dtype}{source.shape} is not the uint8 "
                         f"({r.rows}, {r.row_bytes}) matrix the plan expects")
    out = region.take(source.nbytes, np.uint8, source.shape)
    maps = memory.read_mappings() if not source.flags.writeable else None
    step = max(GROUP, COPY_CHUNK // r.row_bytes // GROUP * GROUP)
    for lo in range(0, r.rows, step):
        n = min(step, r.rows - lo)  # whole groups, but for the last chunk's rows after the last group
        layout.make(source.ctypes.data + lo * r.row_bytes, out.ctypes.data + lo * r.row_bytes, n, r.row_bytes,
                    r.code)
        if maps is not None:
            memory.release_file_pages([source[lo:lo + n]], maps)
    _COPIES.put(source, out, *_kind(r, layout))
    return out


def bind_repacks(repacks: list[Repack], layout: RepackLayout, consts: dict[int, np.ndarray]
                 ) -> dict[int, np.ndarray]:
    """The repacked copy of every repack slot whose format the build reads repacked (``layout``: the library's,
    ``library.repack_layout``); ``consts``: the constants' arrays by slot, as the program holds them. The other
    slots must point where their source constant's slot points (the caller binds them after its own copies). The
    new copies share one huge-page region (each region is at least one 2 MiB page)."""
    arrays, todo = {}, []
    for r in repacks:
        if not layout.formats >> r.code & 1:  # this build reads the GGUF layout
            continue
        shared = _COPIES.get(consts[r.source_slot], *_kind(r, layout))
        if shared is not None:
            arrays[r.slot] = shared
        else:
            todo.append(r)
    if todo:
        region = memory.HugePageRegion(memory.region_bytes(consts[r.source_slot] for r in todo))
        for r in todo:
            arrays[r.slot] = repacked_copy(consts[r.source_slot], r, layout, region)
    return arrays
