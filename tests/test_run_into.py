"""``CompiledGraph.run(inputs, out=...)``: outputs written into the caller's arrays (e.g. KV-cache rows),
on the C backend (natively) and the reference backend (copied), with clear errors for bad arrays."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls

F32 = np.float32


def program(backend: str):
    n = ls.dim("n", 1, 16)
    g = ls.Graph()
    x = g.input("x", (n, 4))
    y = (x * 2.0).exp()
    return g.compile([y.sum(1), y, x + 0.0, y], backend=backend)  # output 3 repeats output 1


@pytest.mark.parametrize("backend", ["c", "reference"])
def test_outputs_land_in_the_given_arrays(backend):
    prog = program(backend)
    x = np.linspace(-1, 1, 20, dtype=F32).reshape(5, 4)
    want = prog(x=x)
    big = np.full((9, 4), -7.0, F32)  # rows 2..6 receive output 1: a view into a larger array
    dup = np.zeros((5, 4), F32)
    got = prog.run({"x": x}, out={1: big[2:7], 3: dup})
    assert got[1].base is big or np.shares_memory(got[1], big)
    assert got[3] is dup
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(big[2:7], want[1], rtol=1e-6)
    assert (big[:2] == -7).all() and (big[7:] == -7).all()  # nothing outside the view was written
    np.testing.assert_allclose(dup, want[3], rtol=1e-6)


def test_bad_out_arrays_are_refused_by_name():
    prog = program("c")
    x = np.ones((3, 4), F32)
    cases = [({7: np.zeros((3, 4), F32)}, "output index 7"),
             ({1: np.zeros((3, 5), F32)}, r"out\[1\] is float32\[3, 5\], but output 1 is float32\[3, 4\]"),
             ({1: np.zeros((3, 4), np.float64)}, "out\\[1\\] is float64"),
             ({1: np.zeros((4, 3), F32).T}, "C-contiguous"),
             ({1: [[0.0] * 4] * 3}, "must be a numpy array")]
    ro = np.zeros((3, 4), F32)
    ro.flags.writeable = False
    cases.append(({1: ro}, "writable"))
    for out, msg in cases:
        with pytest.raises(ValueError, match=msg):
            prog.run({"x": x}, out=out)


def test_inputs_passed_again_mutated_or_swapped_are_read_afresh():
    """The C executor skips re-binding an input array passed again (its address is unchanged); values
    changed in place, other arrays, and non-contiguous views must still be read correctly."""
    prog = program("c")
    a = np.ones((3, 4), F32)
    b = np.full((3, 4), 2.0, F32)
    wide = np.arange(24, dtype=F32).reshape(3, 8) / 10
    for x in (a, a, b, a, wide[:, ::2], wide[:, ::2], a):
        np.testing.assert_allclose(prog(x=x)[0], np.exp(2 * x).sum(1), rtol=1e-6)
        a += 0.25  # in place: the next call with `a` sees the new values
