"""The cost model of graph-level search: seconds ~ flops / flop_rate + bytes / byte_rate.

Flops count elementwise work (transcendental ops weighted as kernel formation weighs them) and
reduction work; bytes count the data an op must read from memory that is not recomputed: leaves
(inputs, constants, materialised values) once each, and the output of a reduction written and
read once. The two rates default to values typical of generic fused loops on the project's
machines and can be calibrated on this machine (``calibrate``), which compiles and times two small
kernels with the C backend and caches the result on disk.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from .. import symbolic as sym
from ..ops import Op

OP_FLOPS = {Op.ADD: 1, Op.MUL: 1, Op.MOD: 4, Op.RECIP: 2, Op.SQRT: 2, Op.EXP2: 4, Op.LOG2: 4, Op.SIN: 8,
            Op.SUM_REDUCE: 1, Op.MAX_REDUCE: 1, Op.LESS_THAN: 1, Op.CAST: 1}


@dataclass(frozen=True)
class CostModel:
    flop_rate: float = 4e9  # elementwise ops per second in generated loops (one thread, vectorised)
    byte_rate: float = 10e9  # bytes per second from memory

    def seconds(self, flops: float, nbytes: float) -> float:
        return flops / self.flop_rate + nbytes / self.byte_rate


def numel(shape) -> int:
    """Element count at the upper bounds of symbolic dimensions."""
    return max(sym.upper_bound(sym.prod(shape)), 1) if shape else 1


def _time(fn, repeat: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def calibrate(use_cache: bool = True) -> CostModel:
    """Measure the two rates with the C backend (one thread of work each; cached per CPU and version)."""
    from .. import __version__
    from .. import Graph
    from ..backend.c.compiler import cache_dir, cpu_signature
    path = cache_dir() / f"costmodel-{__version__}-{cpu_signature()}.json"
    if use_cache and path.exists():
        try:
            d = json.loads(path.read_text())
            return CostModel(float(d["flop_rate"]), float(d["byte_rate"]))
        except (ValueError, KeyError):
            pass
    n = 1 << 22
    g = Graph()
    x = g.input("x", (n,))
    y = g.input("y", (n,))
    copy = g.compile([x + y], backend="c")
    g2 = Graph()
    x2 = g2.input("x", (n // 16,))
    t = x2
    for _ in range(16):  # 16 multiply-adds per element read: compute bound
        t = t * 1.0001 + 0.5
    chain = g2.compile([t], backend="c")
    a = np.random.rand(n).astype(np.float32)
    byte_rate = 3 * 4 * n / _time(lambda: copy(x=a, y=a))
    flop_rate = 32 * (n // 16) / _time(lambda: chain(x=a[: n // 16]))
    model = CostModel(flop_rate, byte_rate)
    path.write_text(json.dumps({"flop_rate": flop_rate, "byte_rate": byte_rate}))
    return model


def program_cost(program, model: CostModel) -> float:
    """Estimated seconds of ``program`` under ``model`` (each node once; see the module docstring)."""
    from ..graph import ArrayConst
    total = 0.0
    for n in program.nodes:
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
