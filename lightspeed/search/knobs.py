"""Schedule knobs: what a kernel-level search may change, per kind of kernel.

Every knob edits the kernel's own schedule (``kernel.schedule``; the vocabulary is
kernel/schedule_knobs.py: a tiled reduction's blocks, a gemm kernel's tile sizes, the unroll of k, the parts
k is split into and the order of the tiles, a streaming attention's query and key blocks and vector width,
any kernel's parallel grain), so nothing global changes: rendering a kernel inside ``override(knobs,
kernel)`` renders it with other values, and concurrent renders do not interfere. The defaults are the
renderers' (``render.TILE``, ``attention.ROWS``, ...), which nothing writes.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Iterator

from ..backend.c import attention as c_attention
from ..backend.c import render as c_render
from ..kernel import ir
from ..kernel.schedule import Schedule
from ..kernel.schedule_knobs import BY_KIND, check_knobs, knob_steps, with_knobs

# the renderers' defaults of the knobs that are not gemm schedule steps (gemm kernels' come from heuristics)
DEFAULTS = {
    "TILE": c_render.TILE,
    "ROW_BLOCK": c_render.ROW_BLOCK,
    "PARALLEL_GRAIN": c_render.PARALLEL_GRAIN,
    "ATTENTION_ROWS": c_attention.ROWS,
    "ATTENTION_KEYS": c_attention.KEYS,
    "ATTENTION_VECTOR_BYTES": c_attention.VECTOR_BYTES,
}
BY_SCHEDULE = BY_KIND  # knobs that matter for each kind of kernel

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


def defaults() -> dict[str, int]:
    """The renderers' default values of the knobs that are not gemm steps."""
    return dict(DEFAULTS)


def relevant(kernel: ir.Kernel, knobs: dict) -> dict:
    """The part of ``knobs`` that changes how ``kernel`` renders."""
    names = BY_SCHEDULE.get(kernel.kind, ())
    return {k: v for k, v in knobs.items() if k in names}


def schedule_steps(schedule: Schedule, knobs: dict) -> Schedule:
    """``schedule`` edited by ``knobs`` (tiles rounded up to whole register blocks; the order from its string
    of axes)."""
    steps = knob_steps(schedule, knobs)
    return schedule.with_steps(*steps) if steps else schedule


@contextlib.contextmanager
def override(knobs: dict, kernel: ir.Kernel) -> Iterator[None]:
    """Render ``kernel`` with ``knobs`` (name -> value; those its kind reads) appended to its schedule,
    restoring the schedule afterwards. Unknown knob names raise ValueError."""
    check_knobs(knobs)
    saved = kernel.schedule
    kernel.schedule = with_knobs(saved, kernel.kind, knobs)
    try:
        yield
    finally:
        kernel.schedule = saved


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
