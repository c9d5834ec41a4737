"""Integer block sums in generated kernels: the IntegerDot schedule step (kernel/schedule.py), its C form in the
few-rows matvec (backend/c/matvec.py) and the builtin layer it calls (backend/c/idot.h).

The SIMD forms of ``ls_idot16x32`` must give the portable form's bits (every lane an exact integer sum); the
integer form must agree with the reference within int16 activation rounding, keep NaN, and be chosen only when
the activations may be rounded; schedules that ask for what no renderer applies are refused by name.
"""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from cpu_flags import has_flags
from lightspeed.backend.c.compiler import CompilerError, compile_shared, default_flags
from lightspeed.quant import QType
from lightspeed.quant.decode_graph import dequant_matrix_graph
from lightspeed.kernel.schedule import IntegerDot, Schedule, ScheduleError

PORTABLE = default_flags() + ["-DLS_NO_IDOT_SIMD"]
RNG = np.random.default_rng(7)


def _q8_program(k: int = 256, n: int = 96, rows_hi: int = 64):
    """``rms_norm(x) @ dequant(Q8_0).T`` with symbolic rows: the activation factor is itself an expression
    (the norm fused into the matvec), the weight a Q8_0 block decode read from its bytes."""
    from quant_blocks import random_raw
    raw = random_raw(QType.Q8_0, n, k, RNG)
    g = ls.Graph()
    seq = ls.dim("seq", 1, rows_hi)
    x = g.input("x", (seq, k))
    normed = x.rms_norm(eps=1e-5)
    return g, [normed.linear(dequant_matrix_graph(g.constant(raw), QType.Q8_0))]


def _compile(g, outs, activations: str, flags=None):
    return g.compile(outs, backend="c", templates=False, activations=activations, flags=flags, plan_cache=False)


def test_integer_form_matches_the_reference_within_int16_rounding() -> None:
    g, outs = _q8_program()
    prog = _compile(g, outs, "int16")
    assert "KFN" not in prog.executor.source and "_int(void *vctx" in prog.executor.source
    assert any(isinstance(s, IntegerDot) for k in prog.executor.plan.kernels if k.schedule for s in k.schedule)
    floats = _compile(g, outs, "float")
    assert "ls_idot_launch" not in floats.executor.source  # float activations: the float form only
    ref = g.compile(outs, backend="reference")
    for rows in (1, 2, 40):  # 40 rows: the tiles, in float
        x = RNG.standard_normal((rows, 256)).astype(np.float32)
        (want,) = ref(x=x)
        (got,) = prog(x=x)
        (exact,) = floats(x=x)
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, atol=1e-4 * scale, rtol=0)
        if rows <= 2:  # the integer form ran: int16 rounding, not float's bits
            assert not np.array_equal(got, exact)
            np.testing.assert_allclose(exact, want, atol=2e-6 * scale, rtol=0)


def test_simd_and_portable_builds_give_the_same_bits() -> None:
    g, outs = _q8_program()
    simd, portable = _compile(g, outs, "int16"), _compile(g, outs, "int16", PORTABLE)
    for rows in (1, 2):
        x = (RNG.standard_normal((rows, 256)) * 50).astype(np.float32)
        (a,), (b,) = simd(x=x), portable(x=x)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{rows} rows"


@pytest.mark.skipif(not has_flags("avx2"), reason="needs a CPU with AVX2")
def test_the_preprocessor_confirms_the_simd_path_is_built() -> None:
    """The bit check above cannot tell whether a SIMD form was compiled; the preprocessor can."""
    g, outs = _q8_program()
    source = _compile(g, outs, "int16").executor.source
    compile_shared(source + "\n#if LS_IDOT_PATH < 1\n#error no SIMD path\n#endif\n", flags=default_flags())
    with pytest.raises(CompilerError):  # and the guard can fail: the portable build has no SIMD path
        compile_shared(source + "\n#if LS_IDOT_PATH < 1\n#error no SIMD path\n#endif\n", flags=PORTABLE)


def test_nan_and_infinity_reach_the_output() -> None:
    g, outs = _q8_program()
    prog = _compile(g, outs, "int16")
    x = RNG.standard_normal((1, 256)).astype(np.float32)
    x[0, 3] = np.nan
    (got,) = prog(x=x)
    assert np.isnan(got).all()  # the norm spreads the NaN over the row; every block of every output reads it


def test_a_large_call_takes_the_float_form() -> None:
    """Past INTEGER_MAX activation elements the launcher takes the float form (no stack array that large)."""
    from lightspeed.backend.c import matvec
    g, outs = _q8_program(k=matvec.INTEGER_MAX // 2 + 32 * 8, n=8, rows_hi=2)
    prog, floats = _compile(g, outs, "int16"), _compile(g, outs, "float")
    assert "_int(void *vctx" in prog.executor.source
    x = RNG.standard_normal((2, matvec.INTEGER_MAX // 2 + 32 * 8)).astype(np.float32)
    (got,), (exact,) = prog(x=x), floats(x=x)
    assert np.array_equal(got, exact)  # the float form's bits
    (one,), (one_exact,) = prog(x=x[:1]), floats(x=x[:1])  # half the elements: the integer form
    assert not np.array_equal(one, one_exact)


def test_integer_dot_in_schedules() -> None:
    from lightspeed.backend.c.gemm import gemm_sizes
    from lightspeed.backend.gpu.gemm import gpu_gemm_sizes
    from lightspeed.kernel.heuristics import Target, gemm_schedule
    s = gemm_schedule(Target()).with_steps(IntegerDot("k", 16))
    assert Schedule.from_json(s.to_json()) == s.canonical()
    gemm_sizes(s)
    with pytest.raises(ScheduleError, match="does not apply IntegerDot"):
        gemm_sizes(s.with_steps(IntegerDot("k", 8)))
    with pytest.raises(ScheduleError, match="IntegerDot.*not applied"):
        gpu_gemm_sizes(Schedule((IntegerDot("k", 16),)))
