"""The innermost loop of an elementwise kernel is split at a constant divisor of its index arithmetic
(backend/c/loop_split.py): the split is taken where it removes the divisions, and the values stay those of
the reference (and of the flat loop: the same expressions at the same indices)."""
import re

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.backend.c.loop_split import MIN_INNER
from lightspeed.frontend.combine import stack

SPLIT = re.compile(r"for \(int64_t \w+_hi_\d+ = jb / (\d+)")


def _compile_both(g, outs):
    return g.compile(outs, backend="c"), g.compile(outs, backend="reference")


@pytest.mark.parametrize("seq", [1, 5, 64])
def test_permuted_copy_splits_into_contiguous_inner_loops(seq: int) -> None:
    s = ls.dim("s", 1, 64)
    g = ls.Graph()
    x = g.input("x", (3, s, 64))
    y = x.permute(1, 0, 2).reshape((s, 192)).contiguous() * 2.0
    c, ref = _compile_both(g, [y])
    assert [int(d) for d in SPLIT.findall(c.executor.source)] == [64], "the copy was not split at 64"
    xv = np.random.default_rng(0).standard_normal((3, seq, 64)).astype(np.float32)
    np.testing.assert_array_equal(c(x=xv)[0], ref(x=xv)[0])


def test_interleaved_pairs_unroll_the_small_divisor() -> None:
    g = ls.Graph()
    x = g.input("x", (7, 64))
    pairs = x.reshape((7, 32, 2))
    # out[2i] = a[2i] - a[2i+1], out[2i+1] = a[2i] + a[2i+1]: an even/odd interleave of the last axis
    y = stack([pairs[:, :, 0] - pairs[:, :, 1], pairs[:, :, 0] + pairs[:, :, 1]], -1).reshape((7, 64)) * 0.5
    c, ref = _compile_both(g, [y])
    found = [int(d) for d in SPLIT.findall(c.executor.source)]
    assert found and all(d < MIN_INNER for d in found), found
    xv = np.random.default_rng(1).standard_normal((7, 64)).astype(np.float32)
    np.testing.assert_array_equal(c(x=xv)[0], ref(x=xv)[0])


def test_few_rows_chunk_the_split_loop_in_whole_groups() -> None:
    # one row of 4096: ls_chunks cuts the last axis into chunks; they must start at multiples of the divisor
    g = ls.Graph()
    x = g.input("x", (64, 64))
    y = x.T.reshape((1, 4096)).contiguous() + 1.0
    c, ref = _compile_both(g, [y])
    assert SPLIT.findall(c.executor.source), "the transposed copy was not split"
    xv = np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)
    from lightspeed.backend.c.compiler import set_num_threads
    for threads in (1, 2):
        set_num_threads(threads)
        np.testing.assert_array_equal(c(x=xv)[0], ref(x=xv)[0])
    set_num_threads(0)


def test_flat_loops_stay_flat() -> None:
    g = ls.Graph()
    x = g.input("x", (5, 96))
    y = (x * 3.0).exp()  # no division of the loop variable: nothing to split
    c, _ = _compile_both(g, [y])
    assert not SPLIT.findall(c.executor.source)
