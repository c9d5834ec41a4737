"""The cost model of graph-level search: seconds ~ flops / flop_rate + bytes / byte_rate.

Flops count elementwise work (transcendental ops weighted as kernel formation weighs them) and
reduction work; bytes count the data an op must read from memory that is not recomputed: leaves
(inputs, constants, materialised values) once each, and the output of a reduction written and
read once. The two rates default to values typical of generic fused loops on the project's
machines and can be calibrated on this machine (``calibrate``), which compiles and times small
kernels with the C backend and caches the result on disk.

A lowered kernel (``search/lowering.py``) does the work of the primitive nodes it replaces, counted
the same way, at its own rate (``qmatmul_flop_rate``, ``attention_flop_rate``: that counted work per
second, measured on the lowered kernel itself), and writes its output once; it moves none of the
intermediate values of its region (no decoded weight, no seq x seq scores), so their bytes are not
counted. The values it reads are the children of its e-node and are counted there. The primitive
form of the same region is costed by the generic model above, which knows nothing of how kernel
formation runs it (a decoded weight is decoded again for every row of a matmul; softmax values read
twice are stored): ``*_primitive_factor`` is the primitive form's measured time over the generic
model's estimate on the same calibration problem, and scales that estimate when extraction compares
the two forms.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import symbolic as sym
from ..ops import Op

OP_FLOPS = {Op.ADD: 1, Op.MUL: 1, Op.MOD: 4, Op.RECIP: 2, Op.SQRT: 2, Op.EXP2: 4, Op.LOG2: 4, Op.SIN: 8,
            Op.SUM_REDUCE: 1, Op.MAX_REDUCE: 1, Op.LESS_THAN: 1, Op.CAST: 1}


@dataclass(frozen=True)
class CostModel:
    flop_rate: float = 4e9  # elementwise ops per second in generated loops (one thread, vectorised)
    byte_rate: float = 10e9  # bytes per second from memory
    # lowered kernels: their counted work per second, and how far the generic estimate of the primitive
    # form they replace is from its measured time (defaults: ratios measured on the project's machines)
    qmatmul_flop_rate: float = 6e9
    attention_flop_rate: float = 4e9
    qmatmul_primitive_factor: float = 50.0
    attention_primitive_factor: float = 1.1

    def seconds(self, flops: float, nbytes: float) -> float:
        return flops / self.flop_rate + nbytes / self.byte_rate

    def lowered_seconds(self, kind: str, flops: float, nbytes: float) -> float:
        """Seconds of a lowered kernel of ``kind`` doing ``flops`` of counted work and moving ``nbytes``."""
        return flops / getattr(self, f"{kind}_flop_rate") + nbytes / self.byte_rate

    def primitive_factor(self, kind: str) -> float:
        """Measured time of the primitive form a lowered kernel of ``kind`` replaces, over its estimate."""
        return getattr(self, f"{kind}_primitive_factor")


def numel(shape) -> int:
    """Element count at the upper bounds of symbolic dimensions."""
    return max(sym.upper_bound(sym.prod(shape)), 1) if shape else 1


def program_cost(program, model: CostModel, skip: set[int] | frozenset[int] = frozenset()) -> float:
    """Estimated seconds of ``program`` under ``model`` (each node once; see the module docstring), leaving
    out the nodes in ``skip`` (those a lowered kernel replaces)."""
    from ..graph import ArrayConst
    total = 0.0
    for n in program.nodes:
        if n.id in skip:
            continue
        out = numel(n.shape)
        if n.op is Op.INPUT or (n.op is Op.CONST and isinstance(n.arg, ArrayConst)):
            total += model.seconds(0, out * n.dtype.itemsize)
        elif n.op is Op.CONST:
            continue
        elif n.op in (Op.SUM_REDUCE, Op.MAX_REDUCE):
            total += model.seconds(numel(n.srcs[0][1].shape), 2 * out * n.dtype.itemsize)
        else:
            total += model.seconds(out * OP_FLOPS.get(n.op, 1), 0)
    return total
