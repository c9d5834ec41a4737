"""Default schedules: good first choices per kernel form, from a description of the target, without search.

A matmul-like kernel gets a BLIS-style schedule: a register block of ``MR x NR`` accumulators that fills
most of the vector registers (two vectors of the target's width across ``n``), a k tile whose panel of
``b`` stays in L1 while the register block walks it, and m x n tiles whose panels stay in L2; work items
(one tile each) run in parallel. Only ``b`` is packed per work item: ``a`` is read in place or packed once
per call (``schedule.Pack``). The search (``search/``) improves on these by measurement.
"""
from __future__ import annotations

from dataclasses import dataclass

from .schedule import Pack, Parallel, Register, Schedule, Tile, Unroll, Vectorize


@dataclass(frozen=True)
class Target:
    """What the heuristics need to know of a machine: SIMD width, registers, cache sizes (bytes)."""
    vector_bytes: int = 32
    vector_registers: int = 16
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 512 * 1024

    @property
    def float_lanes(self) -> int:
        return max(self.vector_bytes // 4, 1)


def gemm_schedule(target: Target, columns: int | None = None) -> Schedule:
    """The default schedule of a float32 matmul-like kernel on ``target``; ``columns``: its output width when
    static (a narrow product, e.g. a convolution with few output channels, gets a narrower register block
    with more rows)."""
    w = target.float_lanes
    # vectors of b per row: 4 with 32 registers (6 x 64 on AVX-512 measured 1.13x faster than 12 x 32: fewer
    # broadcasts per FMA), else 2 (6 x 16 on AVX2); the rows' accumulators, the b vectors and a broadcast
    # must fit the register file
    nv = 4 if target.vector_registers >= 32 else 2
    if columns is not None:
        nv = max(1, min(nv, -(-columns // w)))
    nr = nv * w
    mr = max(1, min((target.vector_registers - nv - 1) // nv, 12))
    # a micro-panel of b takes two thirds of L1, leaving room for the a panel's rows and the c block (on the
    # AVX-512 Xeon, 48 KiB L1: k tiles of 128 against 192 (all of L1) measured 1.0-1.9x, most at 128x768x768)
    kc = _round_down(2 * target.l1_bytes // (3 * nr * 4), 16, lo=64, hi=512)
    # large tiles: every work item packs its own panels of b, so the packing per flop falls with the tile size
    mc = max(mr, _round_down(target.l2_bytes // 4 // (kc * 4), mr, lo=mr, hi=64 * mr))
    nc = max(nr, _round_down(target.l2_bytes // 4 // (kc * 4), nr, lo=nr, hi=8 * nr))
    return Schedule((Parallel("m"), Parallel("n"), Tile("m", mc), Tile("n", nc), Tile("k", kc),
                     Register("m", mr), Register("n", nr), Vectorize("n", w), Pack("b", "k"), Unroll("k", 4)))


def _round_down(x: int, step: int, lo: int, hi: int) -> int:
    x = max(lo, min(hi, x))
    return max(step, x // step * step)
