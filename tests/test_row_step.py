"""RowStep: a call checked once and repeated, its outputs written into rows of caller arrays. Results equal
the ordinary call with row slices as ``out`` (C and reference backends), steps over different arrays and
ordinary calls interleave without writing into each other's arrays, and every bad call is refused by name."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.row_step import RowStep

CTX, WIDTH = 16, 8


def _program(backend: str):
    """y = (x * 2 + cache[:pos].sum(0)) and new rows = x + 1 (to be written at rows pos.. of the cache)."""
    g = ls.Graph()
    seq = ls.dim("seq", 1, 4)
    pos = ls.dim("pos", 0, CTX - 4)
    x = g.input("x", (seq, WIDTH), ls.float32)
    cache = g.input("cache", (CTX, WIDTH), ls.float32)
    rows = x + 1.0
    here = ls.frontend.arange(g, pos, pos + 1)  # [pos]
    mask = ls.frontend.arange(g, CTX).reshape(CTX, 1) < here.reshape(1, 1)
    past = ls.frontend.where(mask, cache, 0.0).sum(0, keepdim=True)
    y = x * 2.0 + past
    return g.compile([y, rows], backend=backend)


def _reference_steps(xs, positions):
    cache = np.zeros((CTX, WIDTH), np.float32)
    ys = []
    for x, pos in zip(xs, positions):
        ys.append(x * 2 + cache[:pos].sum(0, keepdims=True))
        cache[pos:pos + len(x)] = x + 1
    return ys, cache


@pytest.mark.parametrize("backend", ["c", "reference"])
def test_row_step_equals_the_ordinary_call(backend: str) -> None:
    prog = _program(backend)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((n, WIDTH)).astype(np.float32) for n in (3, 1, 1, 2, 1)]
    positions = np.cumsum([0] + [len(x) for x in xs])[:-1].tolist()
    want_ys, want_cache = _reference_steps(xs, positions)
    cache = np.zeros((CTX, WIDTH), np.float32)
    step = RowStep(prog, {"x": xs[0], "cache": cache}, writes={1: "cache"}, varying=["x"], dims={"pos": 0})
    for x, pos, want in zip(xs, positions, want_ys):
        (y,) = step.run({"x": x}, {"pos": pos}, row=pos)
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(cache, want_cache, rtol=1e-6)


def test_interleaved_steps_and_calls_keep_to_their_own_arrays() -> None:
    prog = _program("c")
    rng = np.random.default_rng(1)
    a, b = np.zeros((CTX, WIDTH), np.float32), np.zeros((CTX, WIDTH), np.float32)
    x0 = np.zeros((1, WIDTH), np.float32)
    step_a = RowStep(prog, {"x": x0, "cache": a}, writes={1: "cache"}, varying=["x"], dims={"pos": 0})
    step_b = RowStep(prog, {"x": x0, "cache": b}, writes={1: "cache"}, varying=["x"], dims={"pos": 0})
    xs = [rng.standard_normal((1, WIDTH)).astype(np.float32) for _ in range(6)]
    want_ys, want_a = _reference_steps(xs[0::2], [0, 1, 2])
    _, want_b = _reference_steps(xs[1::2], [0, 1, 2])
    other = np.full((CTX, WIDTH), 5.0, np.float32)
    for i, x in enumerate(xs):
        step, pos = (step_a, step_b)[i % 2], i // 2
        (y,) = step.run({"x": x}, {"pos": pos}, row=pos)
        if i % 2 == 0:
            np.testing.assert_allclose(y, want_ys[pos], rtol=1e-6, atol=1e-6)
        # an ordinary call over another array in between: its slots must not leak into the steps
        prog(dims={"pos": 3}, x=x, cache=other)
    np.testing.assert_allclose(a, want_a, rtol=1e-6)
    np.testing.assert_allclose(b, want_b, rtol=1e-6)
    assert (other == 5.0).all()


def test_a_non_contiguous_varying_input_is_copied() -> None:
    prog = _program("c")
    cache = np.zeros((CTX, WIDTH), np.float32)
    step = RowStep(prog, {"x": np.zeros((1, WIDTH), np.float32), "cache": cache}, writes={1: "cache"},
                   varying=["x"], dims={"pos": 0})
    wide = np.arange(2 * WIDTH * 2, dtype=np.float32).reshape(2, 2 * WIDTH)
    x = wide[:, ::2]
    assert not x.flags.c_contiguous
    (y,) = step.run({"x": x}, {"pos": 0}, row=0)
    np.testing.assert_allclose(y, x * 2)
    np.testing.assert_allclose(cache[:2], x + 1)


def test_bad_calls_are_refused_by_name() -> None:
    prog = _program("c")
    cache = np.zeros((CTX, WIDTH), np.float32)
    x = np.zeros((1, WIDTH), np.float32)
    step = RowStep(prog, {"x": x, "cache": cache}, writes={1: "cache"}, varying=["x"], dims={"pos": 0})
    with pytest.raises(ValueError, match="'x'.*float32"):
        step.run({"x": x.astype(np.float64)}, {"pos": 0}, row=0)
    with pytest.raises(ValueError, match="axis 1 has size 3"):
        step.run({"x": np.zeros((1, 3), np.float32)}, {"pos": 0}, row=0)
    with pytest.raises(ValueError, match="'seq' = 5 is outside"):
        step.run({"x": np.zeros((5, WIDTH), np.float32)}, {"pos": 0}, row=0)
    with pytest.raises(ValueError, match="'pos' = 13 is outside"):
        step.run({"x": x}, {"pos": 13}, row=0)
    with pytest.raises(ValueError, match="'pos' is unbound"):
        step.run({"x": x}, {}, row=0)
    with pytest.raises(ValueError, match="rows 16..16 do not fit the 16 rows"):
        step.run({"x": x}, {"pos": 0}, row=CTX)
    with pytest.raises(ValueError, match="rows -1"):
        step.run({"x": x}, {"pos": 0}, row=-1)
    with pytest.raises(ValueError, match="exactly the varying inputs"):
        step.run({"x": x, "cache": cache}, {"pos": 0}, row=0)
    with pytest.raises(ValueError, match="read-only"):
        frozen = cache.copy()
        frozen.flags.writeable = False
        RowStep(prog, {"x": x, "cache": frozen}, writes={1: "cache"}, varying=["x"], dims={"pos": 0})
    with pytest.raises(ValueError, match="output index 2"):
        RowStep(prog, {"x": x, "cache": cache}, writes={2: "cache"}, varying=["x"], dims={"pos": 0})
    with pytest.raises(ValueError, match="fixed input"):
        RowStep(prog, {"x": x, "cache": cache}, writes={1: "x"}, varying=["x"], dims={"pos": 0})
    with pytest.raises(ValueError, match="varying input.*'y'"):
        RowStep(prog, {"x": x, "cache": cache}, writes={1: "cache"}, varying=["y"], dims={"pos": 0})
    assert (cache == 0).all()  # nothing ran


def test_compiled_lm_alternating_caches_match_separate_runs(tmp_path) -> None:
    """Two sequences alternating on one compiled step (each with its own RowStep) give the logits each
    gives alone."""
    pytest.importorskip("transformers")
    from test_llama_tiny import make_hf_model  # the tiny random Llama the other model tests use

    from lightspeed.models import load_model
    make_hf_model(tmp_path, "llama", seed=3)
    step = load_model(tmp_path).compile(32, max_chunk=4)
    seqs = [[1, 5, 9, 2], [3, 3, 7, 11]]

    def alone(ids):
        caches, out = step.new_caches(), []
        for pos, t in enumerate(ids):
            logits, caches = step.run([t], pos, caches)
            out.append(logits.copy())
        return out

    want = [alone(s) for s in seqs]
    caches = [step.new_caches(), step.new_caches()]
    for pos in range(4):
        for i in (0, 1):
            logits, caches[i] = step.run([seqs[i][pos]], pos, caches[i])
            np.testing.assert_array_equal(logits, want[i][pos])
