"""Default schedules: good first choices per kernel form, from a description of the target, without search.

A matmul-like kernel gets a BLIS-style schedule: a register block of ``MR x NR`` accumulators that fills
most of the vector registers (two vectors of the target's width across ``n``), a k tile whose panel of
``b`` stays in L1 while the register block walks it, and m x n tiles whose panels stay in L2; work items
(one tile each) run in parallel. Only ``b`` is packed per work item: ``a`` is read in place or packed once
per call (``schedule.Pack``). A product of static size with few register blocks of outputs and a long k also
splits k (``SplitReduce``), so its work items are parts of k rather than ever smaller tiles that each pack
all of ``b`` again. The search (``search/``) improves on these by measurement.

A GPU gets the same kind of schedule read another way (``gpu_gemm_schedule``): a work group per tile of
outputs, the k tile as the depth of the panels staged in local (shared) memory, the register block as each
work item's outputs.
"""
from __future__ import annotations

from dataclasses import dataclass

from .schedule import Order, Pack, Parallel, Register, Schedule, SplitReduce, Tile, Unroll, Vectorize


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


def gemm_schedule(target: Target, columns: int | None = None, rows: int | None = None, depth: int | None = None,
                  batch: int | None = 1) -> Schedule:
    """The default schedule of a float32 matmul-like kernel on ``target``; ``columns``: its output width when
    static (a narrow product, e.g. a convolution with few output channels, gets a narrower register block
    with more rows); ``rows``, ``depth`` (k) and ``batch`` (the product of the batch axes) when static decide
    whether k is split (``split_parts``)."""
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
    s = Schedule((Parallel("m"), Parallel("n"), Tile("m", mc), Tile("n", nc), Tile("k", kc),
                  Register("m", mr), Register("n", nr), Vectorize("n", w), Pack("b", "k"), Unroll("k", 4)))
    parts = split_parts(mr, nr, kc, columns, rows, depth, batch)
    return s.with_steps(SplitReduce("k", parts)) if parts > 1 else s


def split_parts(mr: int, nr: int, kc: int, columns: int | None, rows: int | None, depth: int | None,
                batch: int | None) -> int:
    """Parts to split k into (1: none): 4 when a product of static size has at most 16 register blocks of
    outputs (all batches) and at least 16 k tiles. With so few blocks the launcher halves tiles down to
    single register blocks to feed the threads, and every such item packs its columns of b over all of k
    again; parts of k are items that do not.

    Measured on the AVX-512 host (6 x 64 blocks, k tiles of 128), 2 threads, a shared machine, min of 9 runs:
    32x64x8192 2.10 -> 1.13 ms, 48x128x4096 2.15 -> 1.20, 32x64x2048 0.43 -> 0.30, 16x64x8192 1.10 -> 0.98;
    at 128x128x8192 (44 blocks) 4 parts were within noise (8.2 -> 8.0) and 32x64x1024 (8 k tiles) unchanged."""
    if columns is None or rows is None or depth is None or batch is None:
        return 1
    blocks = batch * -(-rows // mr) * -(-columns // nr)
    return 4 if blocks <= 16 and depth >= 16 * kc else 1


def _round_down(x: int, step: int, lo: int, hi: int) -> int:
    x = max(lo, min(hi, x))
    return max(step, x // step * step)


@dataclass(frozen=True)
class GpuTarget:
    """What GPU schedules need to know of a device: work items per work group at most, local (shared) memory
    per work group in bytes, and whether it is a CPU device (PoCL), whose work groups are loops over their
    work items rather than threads."""
    max_group: int = 1024
    local_bytes: int = 48 * 1024
    cpu: bool = False


def gpu_gemm_schedule(target: GpuTarget, columns: int | None = None, rows: int | None = None,
                      a_along: str = "k", b_along: str = "n") -> Schedule:
    """The default GPU schedule of a float32 matmul-like kernel: work groups over tiles of m x n outputs
    (``Parallel``, ``Tile``), panels of ``Tile('k')`` steps of both operands staged in local memory, loaded
    with consecutive work items reading along ``a_along`` / ``b_along`` (``Pack``: the axis along which the
    operand's loads have unit stride, so a group's loads coalesce), and a register block of outputs per work
    item (``Register``). ``columns`` and ``rows``: the output's static sizes, None when symbolic.

    On a GPU: 64 x 64 tiles of 4 x 4 blocks (256 work items, 8 KiB of panels), or 128 x 128 of 8 x 8 where
    both sides are static and at least 1024 (256 work items, 16 KiB: half the local loads per multiply-add;
    the usual choice for large single-precision products, not yet measured here on a GPU), or 32-row tiles
    of 2 x 4 blocks for a static product of at most 32 rows (no work item computes only padding). On a CPU
    device (PoCL) a work group runs as loops over its work items, and fewer items with larger blocks were
    faster: 64 x 64 tiles of 16 x 16 blocks, depth 32 (16 work items; on a Zen 3, two products of 256 x 512
    x 512, 2.6-3.9x the speed of 4 x 4 blocks; benchmarks/README.md)."""
    if target.cpu:
        tm, tn, rm, rn, depth = 64, 64, 16, 16, 32
    elif rows is not None and columns is not None and min(rows, columns) >= 1024 and target.max_group >= 256 \
            and target.local_bytes >= 2 * 128 * 16 * 4:
        tm, tn, rm, rn, depth = 128, 128, 8, 8, 16
    elif rows is not None and rows <= 32:
        tm, tn, rm, rn, depth = 32, 64, 2, 4, 16
    else:
        tm, tn, rm, rn, depth = 64, 64, 4, 4, 16
    # a smaller device: fewer rows of work items, then shallower panels, until the group and its panels fit
    while (tm // rm) * (tn // rn) > target.max_group and tm > rm:
        tm //= 2
    while 4 * (depth + 1) * (tm + tn + 1) > target.local_bytes and depth > 1:  # panels, padding included
        depth //= 2
    return Schedule((Parallel("m"), Parallel("n"), Tile("m", tm), Tile("n", tn), Tile("k", depth),
                     Register("m", rm), Register("n", rn), Pack("a", a_along), Pack("b", b_along),
                     Order(("m", "n"))))
