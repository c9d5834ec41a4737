"""Schedule knobs: what a kernel-level search may change, per kind of kernel.

A gemm kernel's knobs edit its own schedule (``kernel.schedule``: tile sizes, the unroll of k, the parts k
is split into and the order of the tiles), so nothing global changes. The older kinds still have knobs that
are module-level constants of a C renderer (``render.TILE``, ``attention.ROWS``, ...), read when a kernel
renders, so rendering one kernel inside ``override(knobs)`` renders it with other values. Which knobs apply
depends on the kernel's kind: a tiled reduction has a tile width and a row block, the streaming attention a
query block and a key block; the quantized matmul template is left alone (its decode helpers assume its row
block).
"""
from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Iterator

from ..backend.c import attention as c_attention
from ..backend.c import render as c_render
from ..kernel import ir
from ..kernel.schedule import Order, Register, Schedule, SplitReduce, Tile, Unroll

# knob name -> (module, attribute)
KNOBS = {
    "TILE": (c_render, "TILE"),
    "ROW_BLOCK": (c_render, "ROW_BLOCK"),
    "PARALLEL_GRAIN": (c_render, "PARALLEL_GRAIN"),
    "ATTENTION_ROWS": (c_attention, "ROWS"),
    "ATTENTION_KEYS": (c_attention, "KEYS"),
    "ATTENTION_VECTOR_BYTES": (c_attention, "VECTOR_BYTES"),
}

# knobs that edit a kernel's own schedule (kernel.schedule.Schedule) instead of a module constant: name ->
# (schedule step type, axis); a search's choice for a kernel becomes steps appended to its schedule. The
# order's value is its axes as one string, outermost first ("nm": Order(("n", "m"))), so it stores as JSON
SCHEDULE_KNOBS = {
    "GEMM_TILE_M": (Tile, "m"),
    "GEMM_TILE_N": (Tile, "n"),
    "GEMM_TILE_K": (Tile, "k"),
    "GEMM_UNROLL_K": (Unroll, "k"),
    "GEMM_SPLIT_K": (SplitReduce, "k"),
    "GEMM_ORDER": (Order, None),
}

# knobs that matter for each kernel schedule
BY_SCHEDULE = {
    "gemm": ("GEMM_TILE_M", "GEMM_TILE_N", "GEMM_TILE_K", "GEMM_UNROLL_K", "GEMM_SPLIT_K", "GEMM_ORDER",
             "PARALLEL_GRAIN"),
    "tiled": ("TILE", "ROW_BLOCK", "PARALLEL_GRAIN"),
    "loop": ("PARALLEL_GRAIN",),
    "scatter": ("PARALLEL_GRAIN",),
    "attention": ("ATTENTION_ROWS", "ATTENTION_KEYS", "ATTENTION_VECTOR_BYTES"),
}

# values tried, per knob (level 2 tries all combinations; level 1 the QUICK configurations)
VALUES = {
    "TILE": (8, 16, 32, 64),
    "ROW_BLOCK": (1, 2, 4, 6, 8),
    "PARALLEL_GRAIN": (1 << 12, 1 << 15, 1 << 18),
    "ATTENTION_ROWS": (8, 16, 32, 64),
    "ATTENTION_KEYS": (16, 32, 64, 128),
    "ATTENTION_VECTOR_BYTES": (0, 16, 32),
    # multiples of the register block (rounded by ``schedule_steps``)
    "GEMM_TILE_M": (48, 96, 192),
    "GEMM_TILE_N": (128, 256, 512),
    "GEMM_TILE_K": (64, 128, 256, 384),
    "GEMM_UNROLL_K": (1, 2, 4, 8),
    "GEMM_SPLIT_K": (1, 2, 4, 8),  # parts of k (1: unsplit): for calls with few tiles and a long k
    "GEMM_ORDER": ("mn", "nm"),
}
QUICK = [
    {"TILE": 32, "ROW_BLOCK": 4, "ATTENTION_ROWS": 16, "ATTENTION_KEYS": 64, "GEMM_TILE_K": 128, "GEMM_SPLIT_K": 4},
    {"TILE": 16, "ROW_BLOCK": 2, "ATTENTION_ROWS": 64, "ATTENTION_KEYS": 32, "ATTENTION_VECTOR_BYTES": 16,
     "GEMM_TILE_M": 96, "GEMM_TILE_K": 384},
    {"TILE": 8, "ROW_BLOCK": 6, "ATTENTION_ROWS": 32, "ATTENTION_KEYS": 128, "PARALLEL_GRAIN": 1 << 12,
     "GEMM_TILE_N": 128, "GEMM_UNROLL_K": 1, "GEMM_ORDER": "nm"},
    {"TILE": 32, "ROW_BLOCK": 2, "ATTENTION_ROWS": 8, "ATTENTION_KEYS": 16, "PARALLEL_GRAIN": 1 << 18,
     "GEMM_TILE_N": 512, "GEMM_UNROLL_K": 8},
]

_LOCK = threading.RLock()  # knobs are module globals: one rendering at a time may override them


def defaults() -> dict[str, int]:
    """The knobs' current (heuristic) values."""
    return {name: getattr(mod, attr) for name, (mod, attr) in KNOBS.items()}


def relevant(kernel: ir.Kernel, knobs: dict) -> dict:
    """The part of ``knobs`` that changes how ``kernel`` renders."""
    names = BY_SCHEDULE.get(kernel.kind, ())
    return {k: v for k, v in knobs.items() if k in names}


def schedule_steps(schedule: Schedule, knobs: dict) -> Schedule:
    """``schedule`` edited by the schedule knobs in ``knobs`` (tiles rounded up to whole register blocks; the
    order from its string of axes)."""
    steps = []
    for name, value in knobs.items():
        if name not in SCHEDULE_KNOBS:
            continue
        kind, axis = SCHEDULE_KNOBS[name]
        if kind is Order:
            steps.append(Order(tuple(str(value))))
            continue
        if kind is Tile and axis in ("m", "n"):
            r = schedule.size(Register, axis, 1)
            value = max(r, (int(value) + r - 1) // r * r)
        steps.append(kind(axis, int(value)))
    return schedule.with_steps(*steps) if steps else schedule


@contextlib.contextmanager
def _edited_schedule(kernel: ir.Kernel | None, knobs: dict) -> Iterator[None]:
    """``kernel.schedule`` edited by ``knobs`` while the block runs (the kernel object alone changes)."""
    if kernel is None or kernel.schedule is None or not any(k in SCHEDULE_KNOBS for k in knobs):
        yield
        return
    saved = kernel.schedule
    kernel.schedule = schedule_steps(saved, knobs)
    try:
        yield
    finally:
        kernel.schedule = saved


@contextlib.contextmanager
def override(knobs: dict, kernel: ir.Kernel | None = None) -> Iterator[None]:
    """Render with ``knobs`` (name -> value) in place of the defaults, restoring them afterwards; schedule
    knobs (SCHEDULE_KNOBS) edit ``kernel``'s schedule instead."""
    unknown = [k for k in knobs if k not in KNOBS and k not in SCHEDULE_KNOBS]
    if unknown:
        raise ValueError(f"unknown schedule knobs {unknown}; known: {sorted(KNOBS) + sorted(SCHEDULE_KNOBS)}")
    with _LOCK, _edited_schedule(kernel, knobs):
        saved = {}
        try:
            for name, value in knobs.items():
                if name in SCHEDULE_KNOBS:
                    continue
                mod, attr = KNOBS[name]
                saved[name] = getattr(mod, attr)
                setattr(mod, attr, value)
            yield
        finally:
            for name, value in saved.items():
                mod, attr = KNOBS[name]
                setattr(mod, attr, value)


def per_kernel(choice: dict[str, dict]):
    """A ``schedule`` for ``render_plan``: kernel -> context that renders it with ``choice[kernel.name]``."""
    def schedule(kernel: ir.Kernel):
        return override(relevant(kernel, choice.get(kernel.name, {})), kernel)
    return schedule


def uniform(knobs: dict):
    """A ``schedule`` that renders every kernel with ``knobs`` (where they apply to it)."""
    def schedule(kernel: ir.Kernel):
        return override(relevant(kernel, knobs), kernel)
    return schedule


def configurations(level: int) -> list[dict]:
    """Knob settings to measure: the defaults first, then QUICK (level 1) or a grid (level 2)."""
    out = [{}]
    if level <= 1:
        return out + [dict(c) for c in QUICK]
    tiles = list(itertools.product(VALUES["TILE"], VALUES["ROW_BLOCK"]))
    attn = list(itertools.product(VALUES["ATTENTION_ROWS"], VALUES["ATTENTION_KEYS"]))
    grains = VALUES["PARALLEL_GRAIN"]
    gemm = list(itertools.product(VALUES["GEMM_TILE_M"], VALUES["GEMM_TILE_N"], VALUES["GEMM_TILE_K"]))
    for k in range(max(len(tiles), len(attn), len(gemm))):
        t, a, m = tiles[k % len(tiles)], attn[k % len(attn)], gemm[k % len(gemm)]
        widths, unrolls = VALUES["ATTENTION_VECTOR_BYTES"], VALUES["GEMM_UNROLL_K"]
        # the split and the order change at other rates than the unroll, so the grid pairs each with each
        splits, orders = VALUES["GEMM_SPLIT_K"], VALUES["GEMM_ORDER"]
        out.append({"TILE": t[0], "ROW_BLOCK": t[1], "ATTENTION_ROWS": a[0], "ATTENTION_KEYS": a[1],
                    "PARALLEL_GRAIN": grains[k % len(grains)], "ATTENTION_VECTOR_BYTES": widths[k % len(widths)],
                    "GEMM_TILE_M": m[0], "GEMM_TILE_N": m[1], "GEMM_TILE_K": m[2],
                    "GEMM_UNROLL_K": unrolls[k % len(unrolls)], "GEMM_SPLIT_K": splits[k // 4 % len(splits)],
                    "GEMM_ORDER": orders[k // 16 % len(orders)]})
    return out
