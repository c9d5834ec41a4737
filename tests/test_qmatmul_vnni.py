"""The AVX-512 VNNI kernels of int8-activation quantized matmuls (backend/c/qvnni.h): two weight rows a
pass in one zmm, vpdpbusd with activations offset by 128. They must give the bits of the int8 path with
VNNI forced off (-DLS_NO_VNNI: maddubs/madd integer sums, one weight row at a time) and stay within int8
rounding of the exact product."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.backend.c import compile_shared, default_flags
from lightspeed.backend.c.render import PRELUDE
from lightspeed.quant import QType
from lightspeed.quant.decode_graph import dequant_matrix_graph
from cpu_flags import has_flags
from quant_blocks import random_raw

QTYPES = [QType.Q8_0, QType.Q4_0, QType.Q4_1]
VNNI = has_flags("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
needs_vnni = pytest.mark.skipif(not VNNI, reason="the CPU lacks AVX-512 VNNI (avx512_vnni with F/BW/VL): "
                                                  "the VNNI kernels are not compiled in")
NO_VNNI = default_flags() + ["-DLS_NO_VNNI"]


def build(qtype: QType, k: int, n: int, raw: np.ndarray):
    g = ls.Graph()
    x = g.input("x", (ls.dim("seq", 1, 64), k))
    return g, x.linear(dequant_matrix_graph(g.constant(raw), qtype))


def kernels_compiled_in(flags: list[str]) -> bool:
    """Whether the C prelude compiled with ``flags`` defines LS_HAVE_QDOT8X2 (the VNNI pair kernels)."""
    src = PRELUDE + "\n".join(["", "int ls_vnni_probe(void) {", "#if defined(LS_HAVE_QDOT8X2)", "    return 1;",
                                 "#else", "    return 0;", "#endif", "}", ""])
    lib = ctypes.CDLL(str(compile_shared(src, flags)))
    return bool(lib.ls_vnni_probe())


@needs_vnni
def test_vnni_kernels_are_selected_by_the_cpu_and_forced_off_by_a_define() -> None:
    assert kernels_compiled_in(default_flags())
    assert not kernels_compiled_in(NO_VNNI)
    assert not kernels_compiled_in(default_flags() + ["-DLS_PORTABLE"])


@needs_vnni
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
# (7 blocks, 37 weight rows: one work item, pairs and an odd last row; 2 rows: one pair, activations offset
# per load; 32 blocks: items of 15 rows; 80 blocks: 8 rows exceed the buffer of pre-offset activations)
@pytest.mark.parametrize("k,n", [(224, 37), (96, 2), (1024, 45), (2560, 9)],
                         ids=["7blocks-37rows", "3blocks-2rows", "32blocks", "80blocks"])
def test_vnni_gives_the_bits_of_the_int8_path_without_it(qtype: QType, k: int, n: int) -> None:
    """Random blocks (a few extreme scales), 1..8 activation rows (one pass) and more (several), odd weight
    row counts (a pair kernel and the one-row kernel for the last): equal bit for bit with VNNI off."""
    rng = np.random.default_rng(50 + int(qtype) + k)
    raw = random_raw(qtype, n, k, rng, extreme=0.02)
    g, y = build(qtype, k, n, raw)
    on = g.compile([y], backend="c", activations="int8")
    off = g.compile([y], backend="c", activations="int8", flags=NO_VNNI)
    assert "ls_qdot8x2_" + qtype.name.lower() + "(wraw" in on.executor.source
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 17):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        np.testing.assert_array_equal(on(x=xv)[0], off(x=xv)[0], err_msg=f"{m} rows")


@needs_vnni
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_vnni_stays_within_int8_rounding_of_the_reference(qtype: QType) -> None:
    rng = np.random.default_rng(60 + int(qtype))
    k, n = 256, 29
    g, y = build(qtype, k, n, random_raw(qtype, n, k, rng))
    ref = g.compile([y], backend="reference")
    on = g.compile([y], backend="c", activations="int8")
    for m in (1, 2, 5, 8, 11):
        xv = rng.standard_normal((m, k)).astype(np.float32)
        want, got = ref(x=xv)[0], on(x=xv)[0]
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        assert 1e-5 < err < 2e-2, (m, err)  # quantised, but only by int8 rounding of the activations


@needs_vnni
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_vnni_gives_a_row_the_same_bits_alone_and_in_any_batch(qtype: QType) -> None:
    rng = np.random.default_rng(70 + int(qtype))
    k, n = 160, 45
    g, y = build(qtype, k, n, random_raw(qtype, n, k, rng))
    prog = g.compile([y], backend="c", activations="int8")
    xv = rng.standard_normal((19, k)).astype(np.float32)
    (full,) = prog(x=xv)
    for m in (1, 2, 3, 7, 8, 9, 16):
        np.testing.assert_array_equal(prog(x=xv[:m])[0], full[:m])
    for r in (0, 7, 8, 18):
        np.testing.assert_array_equal(prog(x=xv[r:r + 1])[0][0], full[r])


def test_no_vnni_define_keeps_the_int8_path_working() -> None:
    """-DLS_NO_VNNI builds on any CPU and keeps int8 activations within their rounding (AVX2 kernels)."""
    rng = np.random.default_rng(80)
    k, n = 128, 11
    g, y = build(QType.Q8_0, k, n, random_raw(QType.Q8_0, n, k, rng))
    ref = g.compile([y], backend="reference")
    off = g.compile([y], backend="c", activations="int8", flags=NO_VNNI)
    xv = rng.standard_normal((3, k)).astype(np.float32)
    want, got = ref(x=xv)[0], off(x=xv)[0]
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert err < 2e-2, err
