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


def _time(fn, repeat: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def calibrate(use_cache: bool = True) -> CostModel:
    """Measure the rates with the C backend (cached per CPU and version): a copy (bytes), a chain of
    multiply-adds (flops), and each lowered kernel and its primitive form on a small problem."""
    from .. import __version__
    from .. import Graph
    from ..backend.c.compiler import cache_dir, cpu_signature
    path = cache_dir() / f"costmodel-{__version__}-{cpu_signature()}.json"
    fields = ("flop_rate", "byte_rate", "qmatmul_flop_rate", "attention_flop_rate", "qmatmul_primitive_factor",
              "attention_primitive_factor")
    if use_cache and path.exists():
        try:
            d = json.loads(path.read_text())
            return CostModel(*(float(d[f]) for f in fields))
        except (ValueError, KeyError, TypeError):
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
    generic = CostModel(flop_rate, byte_rate)
    q_rate, q_factor = _lowered_rates(generic, *_qmatmul_problem())
    a_rate, a_factor = _lowered_rates(generic, *_attention_problem())
    model = CostModel(flop_rate, byte_rate, q_rate, a_rate, q_factor, a_factor)
    path.write_text(json.dumps({f: getattr(model, f) for f in fields}))
    return model


def _lowered_rates(generic: CostModel, graph, outputs, inputs: dict, kind: str) -> tuple[float, float]:
    """(counted work per second of the lowered kernel of ``kind`` in ``outputs``, measured time of its
    primitive form over ``generic``'s estimate of it). Both forms are compiled and timed alternately (the
    best of several runs each), so load on a shared machine hits both alike."""
    from ..graph import Program
    from .lowering import find_alternatives
    program = Program.build(graph, outputs)
    (alt,) = [a for a in find_alternatives(program) if a.kind == kind]
    estimate = program_cost(program, generic) - program_cost(program, generic, skip=alt.region)
    lowered = graph.compile(outputs, backend="c")
    primitive = graph.compile(outputs, backend="c", templates=False)
    t_low = t_prim = float("inf")
    for _ in range(4):
        t_low = min(t_low, _time(lambda: lowered(**inputs), 3))
        t_prim = min(t_prim, _time(lambda: primitive(**inputs), 3))
    return alt.flops / t_low, max(t_prim / estimate, 1e-3)


def _qmatmul_problem():
    """4 rows times a Q4_1 matrix of 512 x 1024 (the default model's weight type; a few rows like a
    short prefill)."""
    from .. import Graph
    from ..quant import QType, block_format
    from ..quant.decode_graph import dequant_matrix_graph
    rng = np.random.default_rng(0)
    rows, k, n = 4, 1024, 512
    fmt = block_format(QType.Q4_1)
    raw = rng.integers(0, 256, size=(n, k // fmt.block_elems, fmt.block_bytes), dtype=np.uint8)
    raw[:, :, 0:2] = np.array([0.01], np.float16).view(np.uint8)  # finite scales: no NaN or subnormal arithmetic
    raw[:, :, 2:4] = np.array([-0.05], np.float16).view(np.uint8)
    g = Graph()
    x = g.input("x", (rows, k))
    y = x.linear(dequant_matrix_graph(g.constant(raw.reshape(n, -1)), QType.Q4_1))
    return g, [y], {"x": rng.standard_normal((rows, k)).astype(np.float32)}, "qmatmul"


def _attention_problem():
    """Causal attention, 2 heads of 512 positions and head size 64 (long enough that the primitive form's
    seq x seq values leave the L1/L2 caches, as they do in a model's prefill)."""
    from .. import Graph
    from .. import frontend as F
    rng = np.random.default_rng(0)
    g = Graph()
    q, k, v = (g.input(name, (2, 512, 64)) for name in "qkv")
    o = F.scaled_dot_product_attention(q, k, v, causal=True)
    inputs = {name: rng.standard_normal((2, 512, 64)).astype(np.float32) for name in "qkv"}
    return g, [o], inputs, "attention"


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
