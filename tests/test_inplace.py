"""Scatter through a view of its indices, and donated inputs updated in place (the KV-cache pattern)."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.frontend import arange


def cache_graph():
    g = ls.Graph()
    seq, pos = ls.dim("seq", 1, 8), ls.dim("pos", 0, 15)
    cache = g.input("cache", (16, 4))
    x = g.input("x", (seq, 4))
    rows = arange(g, pos, ls.symbolic.add(pos, seq))  # a shrunk view of a longer iota
    updated = cache.scatter(rows, x * 2.0)
    return g, updated.sum(0), updated


@pytest.mark.parametrize("donate", [(), ("cache",)], ids=["copy", "in-place"])
def test_scatter_rows_at_a_symbolic_position(donate) -> None:
    g, total, updated = cache_graph()
    prog = g.compile([total, updated], backend="c", donate=donate)
    ref = g.compile([total, updated], backend="reference")
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((16, 4)).astype(np.float32)
    for pos, seq in [(3, 2), (0, 8), (15, 1)]:
        x = rng.standard_normal((seq, 4)).astype(np.float32)
        want = ref(dims={"pos": pos}, cache=cache.copy(), x=x)
        passed = cache.copy()
        got = prog(dims={"pos": pos}, cache=passed, x=x)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[1], want[1])
        assert (got[1] is passed) == bool(donate)  # donated: the caller's array was updated in place
        cache = want[1]
    kernels = [k.name for k in prog.executor.plan.kernels]
    assert any(k.endswith("_copy") for k in kernels) != bool(donate)


def test_input_read_elsewhere_is_not_updated_in_place() -> None:
    """If another kernel reads the original input, writing it in place would change what it sees."""
    g, _, updated = cache_graph()
    before = g.inputs["cache"]
    from lightspeed.tensor import Tensor
    from lightspeed.shape import ShapeTracker
    original_sum = Tensor(before, ShapeTracker.contiguous(before.shape)).sum(0)
    prog = g.compile([updated, original_sum], backend="c", donate=["cache"])
    cache = np.ones((16, 4), np.float32)
    new, old_sum = prog(dims={"pos": 0}, cache=cache, x=np.zeros((1, 4), np.float32))
    np.testing.assert_array_equal(old_sum, np.full(4, 16.0, np.float32))
    assert new is not cache and cache[0, 0] == 1.0


def test_donate_must_name_inputs() -> None:
    g, total, _ = cache_graph()
    with pytest.raises(ValueError, match="not inputs"):
        g.compile([total], backend="c", donate=["nope"])
