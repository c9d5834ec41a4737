"""Prefill matmuls on AMX tiles (backend/c/qamx.h): under activations "auto", a call of more than 8 rows runs its
first rows & ~15 on bfloat16 tiles where the CPU has AMX-BF16. Against the reference (within bfloat16 rounding),
against the same program with the tiles forced off (-DLS_NO_AMX: the float kernels, whose bits the remaining
rows keep), and a row's result the same whatever the other rows of its call."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from cpu_flags import has_flags
from lightspeed.backend.c.compiler import default_flags
from lightspeed.quant import QType, dequant_matrix_graph
from quant_blocks import random_raw

needs_amx = pytest.mark.skipif(not has_flags("amx_tile", "amx_bf16", "avx512_bf16", "avx512f", "avx512bw"),
                               reason="the tile kernels need AMX-BF16 (Intel Sapphire Rapids or later)")
FORCED_OFF = default_flags() + ["-DLS_NO_AMX"]


def _graph(qtype: QType, k: int, n: int, raw: np.ndarray):
    g = ls.Graph()
    x = g.input("x", (ls.dim("seq", 1, 256), k))
    return g, x.linear(dequant_matrix_graph(g.constant(raw), qtype))


@needs_amx
@pytest.mark.parametrize("qtype", [QType.Q8_0, QType.Q4_0, QType.Q4_1], ids=lambda q: q.name)
@pytest.mark.parametrize("k,n", [(32, 16), (576, 37), (18 * 32, 64 + 15)], ids=["1-block", "tail-rows", "panels"])
def test_tile_rows_match_the_reference_within_bfloat16(qtype: QType, k: int, n: int) -> None:
    rng = np.random.default_rng(70 + int(qtype) + k + n)
    g, y = _graph(qtype, k, n, random_raw(qtype, n, k, rng))
    ref = g.compile([y], backend="reference")
    tiles = g.compile([y], backend="c", activations="auto")
    off = g.compile([y], backend="c", activations="auto", flags=FORCED_OFF, plan_cache=False)
    for m in (8, 9, 16, 37, 64, 130):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        (want,) = ref(x=xv)
        (a,) = tiles(x=xv)
        (b,) = off(x=xv)
        first = m & ~15 if m > 8 else 0  # the rows on tiles
        if first:
            err = float(np.linalg.norm(a[:first] - want[:first]) / np.linalg.norm(want[:first]))
            assert 1e-4 < err < 6e-3, (m, err)  # bfloat16 inputs (8 bits each), float32 sums: really the tiles
            err_off = float(np.linalg.norm(b[:first] - want[:first]) / np.linalg.norm(want[:first]))
            assert err_off < 1e-5, (m, err_off)  # float activations where the tiles are off
        np.testing.assert_array_equal(a[first:], b[first:])  # the rest: the float kernels' bits


@needs_amx
def test_a_row_on_tiles_does_not_depend_on_the_other_rows() -> None:
    rng = np.random.default_rng(5)
    k, n = 256, 48
    g, y = _graph(QType.Q4_1, k, n, random_raw(QType.Q4_1, n, k, rng))
    tiles = g.compile([y], backend="c", activations="auto")
    xv = rng.standard_normal((64, k)).astype(np.float32)
    (whole,) = tiles(x=xv)
    (first,) = tiles(x=xv[:16])
    other = xv.copy()
    other[16:] = rng.standard_normal((48, k)).astype(np.float32)
    (mixed,) = tiles(x=other)
    np.testing.assert_array_equal(whole[:16], first)
    np.testing.assert_array_equal(whole[:16], mixed[:16])


@needs_amx
@pytest.mark.parametrize("activations", ["float", "int16"])
def test_explicit_activation_modes_never_take_the_tiles(activations: str) -> None:
    """Only "auto" may round prefill activations to bfloat16: explicit float keeps float32 products, explicit
    int16 its int16 rounding (both far below bfloat16's error)."""
    rng = np.random.default_rng(9)
    k, n = 576, 40
    g, y = _graph(QType.Q4_1, k, n, random_raw(QType.Q4_1, n, k, rng))
    want = g.compile([y], backend="reference")
    prog = g.compile([y], backend="c", activations=activations)
    xv = rng.standard_normal((64, k)).astype(np.float32)
    (w,) = want(x=xv)
    (got,) = prog(x=xv)
    assert float(np.linalg.norm(got - w) / np.linalg.norm(w)) < 1e-4
