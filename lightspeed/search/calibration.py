"""Calibration of the cost model: the machine's rates measured with the C backend, once per CPU and version.

A copy gives the byte rate, a chain of multiply-adds the flop rate, and each lowered kernel and its
primitive form, timed alternately on a small problem, the lowered kernels' rates and how far the generic
estimate is from the primitive form's real time (search/cost.py holds the model; this module measures it).
"""
from __future__ import annotations

import json
import time

import numpy as np

from .. import __version__
from .. import frontend as F
from ..backend.c.compiler import cache_dir, cpu_signature
from ..graph import Graph, Program
from ..quant import QType, block_format
from ..quant.decode_graph import dequant_matrix_graph
from .cost import CostModel, program_cost
from .lowering import find_alternatives


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
    rng = np.random.default_rng(0)
    g = Graph()
    q, k, v = (g.input(name, (2, 512, 64)) for name in "qkv")
    o = F.scaled_dot_product_attention(q, k, v, causal=True)
    inputs = {name: rng.standard_normal((2, 512, 64)).astype(np.float32) for name in "qkv"}
    return g, [o], inputs, "attention"
