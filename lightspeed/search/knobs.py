"""Schedule knobs: the rendering constants a kernel-level search may change, per kind of kernel.

A knob is a module-level constant of a C renderer (``render.TILE``, ``attention.ROWS``, ...). The
renderer reads them when it renders a kernel, so rendering one kernel inside ``override(knobs)``
renders it with other values. Which knobs apply depends on the kernel's schedule: a tiled reduction
has a tile width and a row block, the streaming attention a query block and a key block; the
quantized matmul template is left alone (its decode helpers assume its row block).
"""
from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Iterator

from ..backend.c import attention as c_attention
from ..backend.c import render as c_render
from ..kernel import ir

# knob name -> (module, attribute)
KNOBS = {
    "TILE": (c_render, "TILE"),
    "ROW_BLOCK": (c_render, "ROW_BLOCK"),
    "PARALLEL_GRAIN": (c_render, "PARALLEL_GRAIN"),
    "ATTENTION_ROWS": (c_attention, "ROWS"),
    "ATTENTION_KEYS": (c_attention, "KEYS"),
    "ATTENTION_VECTOR_BYTES": (c_attention, "VECTOR_BYTES"),
}

# knobs that matter for each kernel schedule
BY_SCHEDULE = {
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
}
QUICK = [
    {"TILE": 32, "ROW_BLOCK": 4, "ATTENTION_ROWS": 16, "ATTENTION_KEYS": 64},
    {"TILE": 16, "ROW_BLOCK": 2, "ATTENTION_ROWS": 64, "ATTENTION_KEYS": 32, "ATTENTION_VECTOR_BYTES": 16},
    {"TILE": 8, "ROW_BLOCK": 6, "ATTENTION_ROWS": 32, "ATTENTION_KEYS": 128, "PARALLEL_GRAIN": 1 << 12},
    {"TILE": 32, "ROW_BLOCK": 2, "ATTENTION_ROWS": 8, "ATTENTION_KEYS": 16, "PARALLEL_GRAIN": 1 << 18},
]

_LOCK = threading.RLock()  # knobs are module globals: one rendering at a time may override them


def defaults() -> dict[str, int]:
    """The knobs' current (heuristic) values."""
    return {name: getattr(mod, attr) for name, (mod, attr) in KNOBS.items()}


def relevant(kernel: ir.Kernel, knobs: dict) -> dict:
    """The part of ``knobs`` that changes how ``kernel`` renders."""
    names = BY_SCHEDULE.get(kernel.schedule, ())
    return {k: v for k, v in knobs.items() if k in names}


@contextlib.contextmanager
def override(knobs: dict) -> Iterator[None]:
    """Render with ``knobs`` (name -> value) in place of the defaults, restoring them afterwards."""
    unknown = [k for k in knobs if k not in KNOBS]
    if unknown:
        raise ValueError(f"unknown schedule knobs {unknown}; known: {sorted(KNOBS)}")
    with _LOCK:
        saved = {}
        try:
            for name, value in knobs.items():
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
        return override(relevant(kernel, choice.get(kernel.name, {})))
    return schedule


def uniform(knobs: dict):
    """A ``schedule`` that renders every kernel with ``knobs`` (where they apply to it)."""
    def schedule(kernel: ir.Kernel):
        return override(relevant(kernel, knobs))
    return schedule


def configurations(level: int) -> list[dict]:
    """Knob settings to measure: the defaults first, then QUICK (level 1) or a grid (level 2)."""
    out = [{}]
    if level <= 1:
        return out + [dict(c) for c in QUICK]
    tiles = list(itertools.product(VALUES["TILE"], VALUES["ROW_BLOCK"]))
    attn = list(itertools.product(VALUES["ATTENTION_ROWS"], VALUES["ATTENTION_KEYS"]))
    grains = VALUES["PARALLEL_GRAIN"]
    for k in range(max(len(tiles), len(attn))):
        t, a = tiles[k % len(tiles)], attn[k % len(attn)]
        widths = VALUES["ATTENTION_VECTOR_BYTES"]
        out.append({"TILE": t[0], "ROW_BLOCK": t[1], "ATTENTION_ROWS": a[0], "ATTENTION_KEYS": a[1],
                    "PARALLEL_GRAIN": grains[k % len(grains)], "ATTENTION_VECTOR_BYTES": widths[k % len(widths)]})
    return out
