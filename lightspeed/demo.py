"""A small end-to-end demo: build a graph with a symbolic dimension, compile it once, run it at two sizes.

The graph is one transformer-ish block: ``softmax(rms_norm(x) @ w, axis=-1)`` with ``x`` of shape
``(seq, 64)`` where ``seq`` is symbolic. Every result is checked against the same computation in numpy.
"""
from __future__ import annotations

import time
from typing import Sequence, TextIO

import numpy as np

from . import dtypes as dt
from . import symbolic as sym
from .backend import get_backend
from .graph import Graph

HIDDEN = 64
EPS = 1e-6


def pick_backend(preferred: str = "auto") -> str:
    """``preferred`` itself, or for ``"auto"``: ``"c"`` where the C backend imports, else ``"reference"``."""
    if preferred != "auto":
        return preferred
    try:
        get_backend("c")
    except (ImportError, ValueError):
        return "reference"
    return "c"


def _missing_compiler(e: Exception) -> bool:
    try:
        from .backend.c import CompilerError
    except ImportError:
        return False
    return isinstance(e, CompilerError)


def build(graph: Graph, seq: sym.Var):
    """The demo graph: returns (inputs by name, output tensor)."""
    x = graph.input("x", (seq, HIDDEN), dt.float32)
    g = graph.input("g", (HIDDEN,), dt.float32)
    w = graph.input("w", (HIDDEN, HIDDEN), dt.float32)
    y = (x.rms_norm(g, eps=EPS) @ w).softmax(axis=-1)
    return {"x": x, "g": g, "w": w}, y


def numpy_reference(x: np.ndarray, g: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The demo computation in plain numpy (float64, cast back at the end)."""
    x64 = x.astype(np.float64)
    normed = x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + EPS) * g
    logits = normed @ w.astype(np.float64)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def run(backend: str = "auto", sizes: Sequence[int] = (3, 17), seed: int = 0, out: TextIO | None = None) -> bool:
    """Compile the demo graph with ``backend`` and run it at each of ``sizes``; True if every check passes."""
    import sys
    out = out or sys.stdout
    name = pick_backend(backend)
    seq = sym.dim("seq", 1, 4096)
    graph = Graph()
    _, y = build(graph, seq)
    t0 = time.perf_counter()
    try:
        prog = graph.compile([y], backend=name)
    except Exception as e:
        if backend != "auto" or not _missing_compiler(e):
            raise
        # "auto" prefers C; a machine without a C compiler still runs the demo, and says why
        print(f"C backend unavailable ({e}); using the reference backend", file=out)
        name = "reference"
        prog = graph.compile([y], backend=name)
    compile_s = time.perf_counter() - t0
    print(f"backend: {name}   graph: {len(prog.program.nodes)} primitive nodes   "
          f"compile: {compile_s * 1e3:.1f} ms", file=out)

    rng = np.random.default_rng(seed)
    g = rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32)
    w = (rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32)
    ok = True
    for n in sizes:
        x = rng.standard_normal((n, HIDDEN)).astype(np.float32)
        t0 = time.perf_counter()
        (got,) = prog(x=x, g=g, w=w)
        run_ms = (time.perf_counter() - t0) * 1e3
        want = numpy_reference(x, g, w)
        err = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf")
        passed = got.shape == want.shape and err < 1e-5
        ok &= passed
        print(f"seq={n:<4} out shape {got.shape}  run {run_ms:7.2f} ms  row sums {got.sum(-1)[:3].round(5)}  "
              f"max |diff| vs numpy {err:.2e}  {'OK' if passed else 'MISMATCH'}", file=out)
    return ok
