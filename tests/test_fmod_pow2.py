"""A float remainder by a constant power of two renders without the library call (``ls_fmod_pow2``) and gives
fmod's bits: signs of zero, infinities (NaN), NaN, values far beyond the divisor and fractions."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls


@pytest.mark.parametrize("divisor", [1.0, 16.0, 0.25, 1024.0])
def test_remainder_by_a_power_of_two_is_bit_exact(divisor: float) -> None:
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(500) * 100, rng.standard_normal(200) * 1e7, np.arange(-40, 40) / 4,
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 2.0 ** 24 + 2, -(2.0 ** 30), 1e-40, -1e-40,
                         divisor, -divisor, 3 * divisor]]).astype(np.float32)
    g = ls.Graph()
    t = g.input("x", x.shape, ls.float32)
    y = t % divisor  # the primitive Mod: C's fmod (numpy's) for floats
    prog = g.compile([y], backend="c")
    got = prog(x=x)[0]
    want = np.fmod(x, np.float32(divisor))
    assert np.array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.isnan(got[np.isnan(want)]).all()
    kernels = prog.executor.source[prog.executor.source.index("static void kfn0("):]
    assert "ls_fmod_pow2(" in kernels and "fmodf(" not in kernels


def test_smollm2_q4_1_generated_decode_has_no_library_remainder() -> None:
    """The shipped Q4_1 weights' nibbles are cut out with remainders by 1 and 16: as library calls they made a
    generated decode step take ~2-3 s instead of ~40 ms."""
    from lightspeed import api
    try:
        path = api.default_model_path()
    except api.ModelNotFoundError as e:
        pytest.skip(str(e))
    m = api.load(path, ctx=64, progress=False, templates=False)
    src = m.step.program.executor.source
    assert "fmodf(" not in src[src.index("static void kfn0("):]
    gen = m.generate("The capital of France is", max_tokens=8)
    gen.run()
    want = api.load(path, ctx=64, progress=False).generate("The capital of France is", max_tokens=8)
    want.run()
    assert gen.token_ids == want.token_ids
