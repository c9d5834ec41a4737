"""Knobs: named edits of a kernel's schedule, the vocabulary a kernel-level search and callers tune with.

A knob is a name and a value (``{"TILE": 8}``); it becomes a schedule step of the kernel it applies to
(``Register("n", 8)`` on a "tiled" kernel), appended to the kernel's own ``Schedule`` (kernel/schedule.py), so
one kernel changes and nothing global does. Which knobs a kind of kernel reads is ``BY_KIND``; a knob given
to a kernel that does not read it changes nothing. The renderers hold the defaults (backend/c/render.py,
backend/c/attention.py, kernel/heuristics.py for gemm kernels).
"""
from __future__ import annotations

from .schedule import Grain, Order, Register, Schedule, SplitReduce, Step, Tile, Unroll, Vectorize

# knob name -> (schedule step type, axis). GEMM_ORDER's value is its axes as one string, outermost first
# ("nm": Order(("n", "m"))); ATTENTION_VECTOR_BYTES is in bytes (Vectorize counts floats; 0: the target's own)
KNOB_STEPS = {
    "TILE": (Register, "n"),  # columns a tiled reduction accumulates per step
    "ROW_BLOCK": (Register, "m"),  # rows it accumulates per step
    "PARALLEL_GRAIN": (Grain, None),
    "ATTENTION_ROWS": (Tile, "q"),
    "ATTENTION_KEYS": (Tile, "keys"),
    "ATTENTION_VECTOR_BYTES": (Vectorize, "d"),
    "GEMM_TILE_M": (Tile, "m"),
    "GEMM_TILE_N": (Tile, "n"),
    "GEMM_TILE_K": (Tile, "k"),
    "GEMM_UNROLL_K": (Unroll, "k"),
    "GEMM_SPLIT_K": (SplitReduce, "k"),
    "GEMM_ORDER": (Order, None),
}

# the knobs each kind of kernel reads (the quantized matmul template keeps its own row blocks)
BY_KIND = {
    "gemm": ("GEMM_TILE_M", "GEMM_TILE_N", "GEMM_TILE_K", "GEMM_UNROLL_K", "GEMM_SPLIT_K", "GEMM_ORDER",
             "PARALLEL_GRAIN"),
    "tiled": ("TILE", "ROW_BLOCK", "PARALLEL_GRAIN"),
    "loop": ("PARALLEL_GRAIN",),
    "scatter": ("PARALLEL_GRAIN",),
    "attention": ("ATTENTION_ROWS", "ATTENTION_KEYS", "ATTENTION_VECTOR_BYTES"),
}


def check_knobs(knobs: dict) -> None:
    """A ValueError naming the knobs that are not knobs."""
    unknown = [k for k in knobs if k not in KNOB_STEPS]
    if unknown:
        raise ValueError(f"unknown schedule knobs {unknown}; known: {sorted(KNOB_STEPS)}")


def relevant(kind: str, knobs: dict) -> dict:
    """The part of ``knobs`` that a kernel of ``kind`` reads."""
    names = BY_KIND.get(kind, ())
    return {k: v for k, v in knobs.items() if k in names}


def knob_steps(schedule: Schedule, knobs: dict) -> list[Step]:
    """The steps ``knobs`` append to ``schedule`` (a gemm tile is rounded up to whole register blocks)."""
    steps: list[Step] = []
    for name, value in knobs.items():
        kind, axis = KNOB_STEPS[name]
        if kind is Order:
            steps.append(Order(tuple(str(value))))
        elif kind is Grain:
            steps.append(Grain(int(value)))
        elif kind is Vectorize:
            if int(value):  # 0 bytes: the target's own width, which no step says
                steps.append(Vectorize(axis, max(1, int(value) // 4)))
        elif kind is Tile and name.startswith("GEMM_"):
            r = schedule.size(Register, axis, 1)
            steps.append(Tile(axis, max(r, (int(value) + r - 1) // r * r)))
        else:
            steps.append(kind(axis, int(value)))
    return steps


def with_knobs(schedule: Schedule | None, kind: str, knobs: dict) -> Schedule | None:
    """``schedule`` (None: an empty one) edited by the knobs of ``knobs`` that ``kind`` reads; ``schedule``
    itself when none applies."""
    check_knobs(knobs)
    mine = relevant(kind, knobs)
    if not mine:
        return schedule
    base = schedule if schedule is not None else Schedule()
    steps = knob_steps(base, mine)
    return base.with_steps(*steps) if steps else schedule
