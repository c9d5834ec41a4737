"""Short constant reductions (a pooling window) are written out term by term in the C source, so the loop over
outputs around them vectorises; values stay the reference's, NaN and infinities included."""
from __future__ import annotations

import re

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.frontend import relu


def _pool_graph(op: str):
    g = ls.Graph()
    x = g.input("x", (2, 4, 16, 16), ls.float32)
    windows = relu(x).reshape(2, 4, 8, 2, 8, 2).permute(0, 1, 2, 4, 3, 5).reshape(2, 4, 8, 8, 4)
    y = windows.max(-1) if op == "max" else windows.sum(-1)
    return g, y


@pytest.mark.parametrize("op", ["max", "sum"])
def test_a_pooling_window_is_written_out_and_matches_the_reference(op: str) -> None:
    g, y = _pool_graph(op)
    x = np.random.default_rng(0).standard_normal((2, 4, 16, 16)).astype(np.float32)
    x[0, 0, 0, 0] = np.nan          # a NaN inside one window propagates to its output only
    x[1, 2, 5, 7] = np.inf
    x[1, 3, 4, 4] = -np.inf
    prog = g.compile([y], backend="c")
    want = g.compile([y], backend="reference")(x=x)[0]
    got = prog(x=x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.isnan(got[0, 0, 0, 0]) and np.isnan(got).sum() == 1
    # the 4 terms of the window are blocks with a constant index, not a loop
    kernels = prog.executor.source[prog.executor.source.index("static void kfn0("):]
    assert re.search(r"const int64_t kr_\d+ = 3;", kernels) and "omp simd reduction" not in kernels
