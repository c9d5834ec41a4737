"""benchmarks/attention_layout.py: both cache layouts compute the same attention (the layout is all that differs
between the two timings), and a run times the kernel in each."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location("attention_layout_bench",
                                               Path(__file__).resolve().parents[1] / "benchmarks" /
                                               "attention_layout.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


# SmolLM2's heads (more keys than one part of the split) and Gemma 3 270M's (one KV head of 256, 4 query rows)
@pytest.mark.parametrize("ctx, pos, rows, heads, dim", [(320, 290, 3, bench.KV_HEADS, bench.HEAD_DIM),
                                                        (300, 280, 4, 1, 256)], ids=["smollm2", "gemma3"])
def test_both_layouts_give_one_attention_and_are_timed(ctx: int, pos: int, rows: int, heads: int, dim: int) -> None:
    rng = np.random.default_rng(2)
    interleaved, shape_i = bench.build("interleaved", ctx, rows, heads, dim)
    head_major, shape_h = bench.build("head-major", ctx, rows, heads, dim)
    assert shape_i == (ctx, heads, dim) and shape_h == (heads, ctx, dim)
    q = rng.standard_normal((heads, rows, dim)).astype(np.float32)
    k, v = (rng.standard_normal(shape_i).astype(np.float16) for _ in range(2))
    (a,) = interleaved(dims={"pos": pos}, q=q, k=k, v=v)
    kh, vh = (np.ascontiguousarray(x.transpose(1, 0, 2)) for x in (k, v))
    (b,) = head_major(dims={"pos": pos}, q=q, k=kh, v=vh)
    assert a.shape == (heads, rows, dim)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    caches = [kh, vh, kh.copy(), vh.copy()]
    assert bench.per_layer(head_major, caches, q, pos, hot=False) > 0
    assert bench.per_layer(head_major, caches, q, pos, hot=True) > 0
