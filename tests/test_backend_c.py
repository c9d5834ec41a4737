"""The C backend as a whole: symbolic dims compiled once, input validation before native code,
out-of-range gathers and scatters, the arena memory plan, every dtype, several outputs, threads.

Known bugs of the backend are tests marked ``xfail(strict=True)`` (each says what is wrong), so
they turn into failures as soon as they are fixed and the marker can go.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from time_limit import time_limit

import lightspeed as ls
from lightspeed import dtypes as dt
from lightspeed.backend.c import compiler as c_compiler

F32 = np.float32
ALL_DTYPES = (ls.float32, ls.float16, ls.bfloat16, ls.int8, ls.uint8, ls.int32, ls.int64, ls.bool_)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module", autouse=True)
def shared_cache_dir(tmp_path_factory):
    """A compile cache for this module only (tests that count compiles use their own)."""
    old = os.environ.get(c_compiler.CACHE_ENV)
    os.environ[c_compiler.CACHE_ENV] = str(tmp_path_factory.mktemp("ls_cache_c"))
    yield
    if old is None:
        del os.environ[c_compiler.CACHE_ENV]
    else:
        os.environ[c_compiler.CACHE_ENV] = old


@pytest.fixture
def compile_calls(monkeypatch, tmp_path):
    """A fresh cache dir and a list that records every C compiler invocation building a shared object."""
    monkeypatch.setenv(c_compiler.CACHE_ENV, str(tmp_path / "cache"))
    c_compiler.runtime_library()  # the thread pool is compiled (or loaded) once per process, not per graph
    calls: list[list[str]] = []
    real_run = c_compiler.subprocess.run

    def counting_run(cmd, *args, **kwargs):
        if "-o" in cmd and not cmd[-1].endswith(".gch"):  # shared objects (not the precompiled header)
            calls.append(list(cmd))
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(c_compiler.subprocess, "run", counting_run)
    return calls




def both(g: ls.Graph, outs, **inputs):
    """(C results, reference results) of one graph."""
    dims = inputs.pop("dims", None)
    c = g.compile(outs, backend="c")(dims=dims, **inputs)
    r = g.compile(outs, backend="reference")(dims=dims, **inputs)
    return c, r


def np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


# symbolic dims: one compile, many sizes -------------------------------------------------------------

def test_symbolic_dim_compiles_once_and_runs_at_every_size(compile_calls) -> None:
    seq = ls.dim("seq", 1, 512)
    g = ls.Graph()
    x = g.input("x", (seq, 16), ls.float32)
    w = g.input("w", (16, 8), ls.float32)
    scores = (x @ w).softmax(-1)
    total = x.sum(0)
    tail = x[1:].max(-1)  # seq - 1 rows: empty when seq == 1
    prog = g.compile([scores, total, tail], backend="c")
    assert len(compile_calls) == 1
    rng = np.random.default_rng(0)
    wv = rng.standard_normal((16, 8)).astype(F32)
    for n in (1, 2, 7, 64, 511, 512, 3):
        xv = rng.standard_normal((n, 16)).astype(F32)
        got_scores, got_total, got_tail = prog(x=xv, w=wv)
        assert got_scores.shape == (n, 8) and got_total.shape == (16,) and got_tail.shape == (n - 1,)
        np.testing.assert_allclose(got_scores, np_softmax(xv.astype(np.float64) @ wv), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_total, xv.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got_tail, xv[1:].max(-1))
    assert len(compile_calls) == 1, "running at a new size must not recompile"
    g.compile([scores, total, tail], backend="c")
    assert len(compile_calls) == 1, "the same graph compiled again must come from the cache"


def test_dim_bound_only_by_dims_argument() -> None:
    """A dim that no input determines (a KV-cache position) is passed with dims=."""
    pos = ls.dim("pos", 0, 16)
    g = ls.Graph()
    cache = g.input("cache", (17, 4), ls.float32)
    seen = cache[: pos + 1].sum(0)
    prog = g.compile([seen], backend="c")
    cv = np.arange(68, dtype=F32).reshape(17, 4)
    for p in (0, 5, 16):
        (got,) = prog(cache=cv, dims={"pos": p})
        np.testing.assert_array_equal(got, cv[: p + 1].sum(0))


# input validation: ValueError before any native code runs -------------------------------------------

@pytest.fixture
def guarded_prog(monkeypatch):
    """A compiled C program whose executor records whether native code ran."""
    n = ls.dim("n", 1, 64)
    g = ls.Graph()
    x = g.input("x", (n, 8), ls.float32)
    idx = g.input("idx", (4,), ls.int32)
    out = (x * 2.0).gather(idx)
    prog = g.compile([out, x.sum(-1)], backend="c")
    ran: list[int] = []
    real = prog.executor.run

    def spy(*args, **kwargs):
        ran.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(prog.executor, "run", spy)
    return prog, ran


GOOD_X = np.ones((3, 8), F32)
GOOD_IDX = np.array([0, 1, 2, 5], np.int32)

BAD_CALLS = {
    "wrong dtype": (dict(x=GOOD_X.astype(np.float64), idx=GOOD_IDX), None, "dtype"),
    "wrong index dtype": (dict(x=GOOD_X, idx=GOOD_IDX.astype(np.int64)), None, "dtype"),
    "wrong static axis": (dict(x=np.ones((3, 9), F32), idx=GOOD_IDX), None, "shape"),
    "wrong rank": (dict(x=np.ones((3, 8, 1), F32), idx=GOOD_IDX), None, "shape"),
    "wrong index length": (dict(x=GOOD_X, idx=GOOD_IDX[:3]), None, "shape"),
    "dim above its bound": (dict(x=np.ones((65, 8), F32), idx=GOOD_IDX), None, "outside its bounds"),
    "zero-size dim below its bound": (dict(x=np.ones((0, 8), F32), idx=GOOD_IDX), None, "outside its bounds"),
    "dims contradicting an input": (dict(x=GOOD_X, idx=GOOD_IDX), {"n": 64}, "dimension 'n'"),
    "unknown dim": (dict(x=GOOD_X, idx=GOOD_IDX), {"m": 3}, "unknown dimension"),
    "non-int dim": (dict(x=GOOD_X, idx=GOOD_IDX), {"n": 3.0}, "must be an int"),
    "missing input": (dict(x=GOOD_X), None, "missing input"),
    "unexpected input": (dict(x=GOOD_X, idx=GOOD_IDX, y=GOOD_X), None, "unexpected input"),
    "not an array": (dict(x=GOOD_X.tolist(), idx=GOOD_IDX), None, "numpy array"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS), ids=list(BAD_CALLS))
def test_bad_inputs_raise_before_native_code(guarded_prog, case: str) -> None:
    prog, ran = guarded_prog
    inputs, dims, message = BAD_CALLS[case]
    with pytest.raises(ValueError, match=message):
        prog(dims=dims, **inputs)
    assert not ran, "native code ran for invalid inputs"
    got, _ = prog(x=GOOD_X, idx=GOOD_IDX)  # and the program still works afterwards
    assert ran
    np.testing.assert_array_equal(got, np.concatenate([np.full((3, 8), 2, F32), np.zeros((1, 8), F32)]))


def test_invalid_inputs_that_would_read_far_out_of_bounds_do_not_crash() -> None:
    """In a fresh process: if validation were skipped, each call would make native code read or
    write gigabytes past a small buffer (a segfault ends the subprocess, not the test run)."""
    script = textwrap.dedent("""
        import numpy as np, lightspeed as ls
        n = ls.dim("n", 1, 1 << 22)
        g = ls.Graph()
        x = g.input("x", (n, 1024), ls.float32)
        rows = g.input("rows", (n,), ls.int32)
        out = x.gather(rows) * 2.0
        prog = g.compile([out, x[: n].sum(0)], backend="c")
        small, r = np.ones((2, 1024), np.float32), np.zeros(2, np.int32)
        calls = [
            dict(x=small, rows=np.zeros(1 << 22, np.int32)),            # n from rows, x too short
            dict(x=small, rows=r, dims={"n": 1 << 22}),                  # dims claims more rows than x has
            dict(x=np.ones((2, 1024), np.float16), rows=r),              # half the bytes of float32
            dict(x=np.ones((2, 1), np.float32), rows=r),                 # 1 column instead of 1024
            dict(x=small.reshape(-1), rows=r),                           # wrong rank
        ]
        for kwargs in calls:
            dims = kwargs.pop("dims", None)
            try:
                prog(dims=dims, **kwargs)
            except ValueError as e:
                print("ValueError:", str(e).splitlines()[0])
            else:
                print("NO ERROR")
        got, total = prog(x=small, rows=np.array([1, 5], np.int32))
        print("ok", float(got.sum()), float(total.sum()))
    """)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert proc.returncode == 0, f"the process died (signal {-proc.returncode}): {proc.stderr[-2000:]}"
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 6 and all(line.startswith("ValueError:") for line in lines[:5]), proc.stdout
    assert lines[5] == f"ok {2.0 * 1024} {2.0 * 1024}"


def test_non_contiguous_inputs_give_the_same_results() -> None:
    g = ls.Graph()
    x = g.input("x", (4, 6), ls.float32)
    v = g.input("v", (6,), ls.int32)
    out = (x * 3.0 + v.cast(ls.float32)).softmax(-1)
    prog = g.compile([out, x], backend="c")
    rng = np.random.default_rng(1)
    base = rng.standard_normal((6, 4)).astype(F32)
    vbase = rng.integers(-5, 5, 12).astype(np.int32)
    variants = {
        "transposed": (base.T, vbase[::2]),
        "negative strides": (base.T[::-1, ::-1].copy()[::-1, ::-1], vbase[::-2]),
        "sliced": (np.ascontiguousarray(np.pad(base.T, 1))[1:-1, 1:-1], vbase[1:7]),
    }
    for name, (xv, vv) in variants.items():
        assert not (xv.flags.c_contiguous and vv.flags.c_contiguous), name
        got, x_again = prog(x=xv, v=vv)
        want = np_softmax(xv.astype(np.float64) * 3 + vv)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(x_again, xv, err_msg=name)


def test_zero_size_dims_run_and_give_empty_or_identity_results() -> None:
    n = ls.dim("n", 0, 8)
    g = ls.Graph()
    x = g.input("x", (n, 3), ls.float32)
    i = g.input("i", (n,), ls.int32)
    outs = [x * 2.0, x.sum(0), x.max(0), x.T @ x, x.gather(i), (x.sum(-1) + 1.0).cumsum(0)]
    c, r = both(g, outs, x=np.zeros((0, 3), F32), i=np.zeros(0, np.int32))
    shapes = [(0, 3), (3,), (3,), (3, 3), (0, 3), (0,)]
    for got, want, shape in zip(c, r, shapes):
        assert got.shape == shape
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(c[1], np.zeros(3, F32))
    np.testing.assert_array_equal(c[2], np.full(3, -np.inf, F32))
    np.testing.assert_array_equal(c[3], np.zeros((3, 3), F32))


# gather and scatter out of range ----------------------------------------------------------------------

@pytest.mark.parametrize("idx_dtype", [ls.int8, ls.uint8, ls.int32, ls.int64])
def test_gather_out_of_range_indices_read_zero_rows(idx_dtype) -> None:
    g = ls.Graph()
    table = g.input("table", (5, 3), ls.float32)
    idx = g.input("idx", (2, 4), idx_dtype)
    prog = g.compile([table.gather(idx), (table * 2.0).gather(idx)], backend="c")
    info = np.iinfo(idx_dtype.np)
    candidates = [0, 4, 5, 6, -1, -5, info.max, info.min, 2, 3, 1, -128]
    raw = np.array([v for v in candidates if info.min <= v <= info.max][:8] + [0] * 8, dtype=np.int64)[:8]
    iv = raw.astype(idx_dtype.np).reshape(2, 4)
    tv = np.arange(1, 16, dtype=F32).reshape(5, 3)
    got, got2 = prog(table=tv, idx=iv)
    ok = (iv.astype(np.int64) >= 0) & (iv.astype(np.int64) < 5)
    want = np.where(ok[..., None], tv[np.where(ok, iv, 0).astype(np.int64)], 0)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got2, want * 2)


def test_gather_with_huge_int64_indices_and_symbolic_rows() -> None:
    rows = ls.dim("rows", 1, 100)
    g = ls.Graph()
    table = g.input("table", (rows, 2), ls.int32)
    idx = g.input("idx", (6,), ls.int64)
    prog = g.compile([table.gather(idx)], backend="c")
    iv = np.array([2**40, -(2**40), 2**63 - 1, -(2**63), 3, 2], np.int64)
    for n in (1, 3, 4):
        tv = np.arange(2 * n, dtype=np.int32).reshape(n, 2) + 7
        (got,) = prog(table=tv, idx=iv)
        want = np.zeros((6, 2), np.int32)
        for k, i in enumerate(iv):
            if 0 <= i < n:
                want[k] = tv[i]
        np.testing.assert_array_equal(got, want, err_msg=f"rows={n}")


def test_scatter_drops_out_of_range_rows() -> None:
    g = ls.Graph()
    dest = g.input("dest", (5, 3), ls.float32)
    idx = g.input("idx", (6,), ls.int32)
    src = g.input("src", (6, 3), ls.float32)
    prog = g.compile([dest.scatter(idx, src)], backend="c")
    dv = np.zeros((5, 3), F32)
    sv = np.arange(1, 19, dtype=F32).reshape(6, 3)
    iv = np.array([-1, 4, 5, 2**31 - 1, 0, -(2**31)], np.int32)
    (got,) = prog(dest=dv, idx=iv, src=sv)
    want = dv.copy()
    want[4], want[0] = sv[1], sv[4]
    np.testing.assert_array_equal(got, want)
    assert not dv.any(), "scatter must not write into its input"


def test_scatter_into_kv_cache_at_symbolic_position() -> None:
    """The KV-cache pattern: write seq new rows at pos .. pos+seq-1 of a preallocated cache."""
    pos, seq = ls.dim("pos", 0, 10), ls.dim("seq", 1, 4)
    g = ls.Graph()
    cache = g.input("cache", (12, 2), ls.float32)
    new = g.input("new", (seq, 2), ls.float32)
    rows = g.iota(seq, ls.int32) + g.constant_dim(pos, ls.int32)
    prog = g.compile([cache.scatter(rows, new)], backend="c")
    cv = np.zeros((12, 2), F32)
    for p, s in ((0, 1), (3, 4), (10, 4)):  # at pos 10, rows 12 and 13 fall off the end
        nv = np.arange(1, 2 * s + 1, dtype=F32).reshape(s, 2)
        (got,) = prog(cache=cv, new=nv, dims={"pos": p})
        want = cv.copy()
        keep = min(s, 12 - p)
        want[p:p + keep] = nv[:keep]
        np.testing.assert_array_equal(got, want, err_msg=f"pos={p} seq={s}")


# the arena ----------------------------------------------------------------------------------------------

def _arena_overlaps(plan) -> list[str]:
    """Pairs of temporaries that share arena bytes while both are live (must be empty)."""
    first, last = {}, {}
    for k, kern in enumerate(plan.kernels):
        first.setdefault(id(kern.out), k)
        last[id(kern.out)] = max(last.get(id(kern.out), k), k)
        for b in kern.reads:
            last[id(b)] = max(last.get(id(b), k), k)
    bad = []
    temps = plan.temps
    for i, a in enumerate(temps):
        for b in temps[i + 1:]:
            live_together = first[id(a)] <= last[id(b)] and first[id(b)] <= last[id(a)]
            share = a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes
            if live_together and share:
                bad.append(f"{a.name}@{a.offset}+{a.nbytes} and {b.name}@{b.offset}+{b.nbytes}")
    return bad


def test_arena_reuses_space_of_dead_intermediates() -> None:
    g = ls.Graph()
    x = g.input("x", (64, 64), ls.float32)
    h = x
    for k in range(12):
        h = (h * 0.5 + float(k)).contiguous()  # Contiguous forces a buffer per step
    prog = g.compile([h.sum(-1)], backend="c")
    plan = prog.executor.plan
    step_bytes = 64 * 64 * 4
    assert len(plan.temps) >= 11, f"expected a materialised chain, got {len(plan.temps)} temporaries"
    total = sum(b.nbytes for b in plan.temps)
    assert total >= 11 * step_bytes
    assert prog.arena_bytes <= 3 * step_bytes, f"arena {prog.arena_bytes} B for {total} B of temporaries"
    assert prog.arena_bytes == plan.arena_bytes
    assert not _arena_overlaps(plan)
    xv = np.random.default_rng(2).standard_normal((64, 64)).astype(F32)
    want = xv.astype(np.float64)
    for k in range(12):
        want = want * 0.5 + k
    (got,) = prog(x=xv)
    np.testing.assert_allclose(got, want.sum(-1), rtol=1e-5)


def test_arena_keeps_live_buffers_apart() -> None:
    """Diamond-shaped dependencies: every temporary read later must not be overwritten."""
    g = ls.Graph()
    x = g.input("x", (32, 32), ls.float32)
    a = (x + 1.0).contiguous()
    b = (a * 2.0).contiguous()
    c = (x.exp() + a).contiguous()
    d = (b + c).contiguous()
    e = (d * a).contiguous()
    out = e + b.T
    c_out, r_out = both(g, [out], x=np.random.default_rng(3).standard_normal((32, 32)).astype(F32))
    np.testing.assert_allclose(c_out[0], r_out[0], rtol=1e-5, atol=1e-5)
    plan = g.compile([out], backend="c").executor.plan
    assert len(plan.temps) >= 4 and not _arena_overlaps(plan)


def test_arena_of_symbolic_dims_is_sized_from_upper_bounds() -> None:
    seq = ls.dim("seq", 1, 4096)
    g = ls.Graph()
    x = g.input("x", (seq, 64), ls.float32)
    h = x
    for _ in range(4):
        h = (h * 2.0 + 1.0).contiguous()
    prog = g.compile([h.max(-1)], backend="c")
    plan = prog.executor.plan
    upper = 4096 * 64 * 4
    assert plan.temps and all(b.nbytes == upper for b in plan.temps)
    assert upper <= prog.arena_bytes <= 2 * upper + 64 * 4
    rng = np.random.default_rng(4)
    for n in (1, 4096, 100):
        xv = rng.standard_normal((n, 64)).astype(F32)
        (got,) = prog(x=xv)
        want = xv.astype(np.float64)
        for _ in range(4):
            want = want * 2 + 1
        np.testing.assert_allclose(got, want.max(-1), rtol=1e-6)


# dtypes ----------------------------------------------------------------------------------------------

def _small_values(d: dt.DType, shape, rng) -> np.ndarray:
    """Small integers (and halves for floats): every result below is exact in every dtype."""
    if d is ls.bool_:
        return rng.random(shape) < 0.5
    if d.kind == "u":
        return rng.integers(0, 8, shape).astype(d.np)
    if d.is_int:
        return rng.integers(-7, 8, shape).astype(d.np)
    v = (rng.integers(-14, 15, shape) / 2).astype(F32)
    return dt.f32_to_bf16(v) if d is ls.bfloat16 else v.astype(d.np)


@pytest.mark.parametrize("d", ALL_DTYPES, ids=[d.name for d in ALL_DTYPES])
def test_every_dtype_through_casts_and_arithmetic(d) -> None:
    g = ls.Graph()
    x = g.input("x", (3, 4), d)
    y = g.input("y", (4,), d)
    outs = [x.cast(to) for to in ALL_DTYPES]                        # d -> every dtype
    outs += [y.cast(ls.float32).cast(d), x.contiguous(), x.T, x.flip(0)]
    if d is not ls.bool_:
        outs += [x + y, x * y, x - y, x.maximum(y), x.minimum(y), x.max(0), x.sum(-1), x.neg() if d.kind != "u" else x]
    else:
        outs += [x * y, x + y, x.logical_or(y), x.logical_not(), x.sum(-1)]
    outs += [x < y, x.eq(y), x.where(x, y), y.gather(g.constant(np.array([3, 0, 9], np.int32)))]
    if d.is_int:
        outs += [x % y, (x * 3) % 5]
    rng = np.random.default_rng(5)
    xv, yv = _small_values(d, (3, 4), rng), _small_values(d, (4,), rng)
    c, r = both(g, outs, x=xv, y=yv)
    for k, (got, want) in enumerate(zip(c, r)):
        assert got.dtype == want.dtype and got.shape == want.shape, k
        np.testing.assert_array_equal(got, want, err_msg=f"output {k}")


@pytest.mark.parametrize("d", [ls.float16, ls.bfloat16, ls.int8, ls.uint8, ls.int64],
                         ids=["float16", "bfloat16", "int8", "uint8", "int64"])
def test_every_dtype_from_float32_with_rounding_and_saturation(d) -> None:
    g = ls.Graph()
    x = g.input("x", (12,), ls.float32)
    outs = [x.cast(d), x.cast(d).cast(ls.float32), (x * 1.5).cast(d)]
    xv = np.array([0.1, -0.1, 2.5, -2.5, 3.75, 1e5, -1e5, 3e38, np.inf, -np.inf, np.nan, 255.9], F32)
    c, r = both(g, outs, x=xv)
    for k, (got, want) in enumerate(zip(c, r)):
        assert got.dtype == want.dtype, k
        np.testing.assert_array_equal(got, want, err_msg=f"output {k}")  # bf16: the same bits, NaN included


def test_cast_of_a_broadcast_bfloat16_scalar() -> None:
    """Regression: the reference read past the one element of a broadcast bf16 scalar."""
    g = ls.Graph()
    s = g.input("s", (), ls.bfloat16)
    x = g.input("x", (2, 4), ls.float32)
    y = s.expand((4,)).cast(ls.float32) + x
    sv = np.asarray(dt.f32_to_bf16(np.array(2.5, F32)))
    xv = np.arange(8, dtype=F32).reshape(2, 4)
    c, r = both(g, [y], s=sv, x=xv)
    np.testing.assert_array_equal(c[0], xv + 2.5)
    np.testing.assert_array_equal(r[0], xv + 2.5)


def test_float_to_int64_saturates_at_both_ends() -> None:
    g = ls.Graph()
    x = g.input("x", (5,), ls.float32)
    c, r = both(g, [x.cast(ls.int64)], x=np.array([np.inf, -np.inf, 1e30, -1e30, np.nan], F32))
    want = np.array([2**63 - 1, -(2**63), 2**63 - 1, -(2**63), 0], np.int64)
    np.testing.assert_array_equal(c[0], want)
    np.testing.assert_array_equal(r[0], want)


@pytest.mark.parametrize("d", [ls.bfloat16, ls.float16], ids=["bfloat16", "float16"])
def test_inlined_16bit_values_are_rounded_to_16_bits(d) -> None:
    g = ls.Graph()
    x = g.input("x", (3,), d)
    total = x.sum(0).cast(ls.float32)                # Cast(SumReduce_16bit(x)): the sum should be a 16-bit value
    chain = ((x + x[::-1]) * x).cast(ls.float32)     # (a + b) * c in 16-bit arithmetic
    vals = np.array([1.0, 1.0 / 256, 1.0 / 512], F32) if d is ls.bfloat16 else np.array([1.0, 2**-11, 2**-12], F32)
    xv = dt.f32_to_bf16(vals) if d is ls.bfloat16 else vals.astype(np.float16)
    c, r = both(g, [total, chain], x=xv)
    np.testing.assert_array_equal(c[0], r[0])
    np.testing.assert_array_equal(c[1], r[1])


@pytest.mark.parametrize("d", [ls.int32, ls.int64], ids=["int32", "int64"])
def test_int_min_mod_minus_one_does_not_trap(d) -> None:
    script = textwrap.dedent(f"""
        import numpy as np, lightspeed as ls
        g = ls.Graph()
        a = g.input("a", (4,), ls.{d.name}); b = g.input("b", (4,), ls.{d.name})
        lo = np.iinfo(np.{d.name}).min
        (got,) = g.compile([a % b], backend="c")(a=np.array([lo, 7, -7, lo], np.{d.name}),
                                                  b=np.array([-1, -1, 2, 0], np.{d.name}))
        print(got.tolist())
    """)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert proc.returncode == 0, f"the process died (signal {-proc.returncode})"
    assert proc.stdout.strip() == "[0, 0, -1, 0]"


def test_matmul_with_empty_inner_axis() -> None:
    g = ls.Graph()
    a = g.input("a", (2, 3), ls.float32)
    b = g.input("b", (3, 4), ls.float32)
    c, r = both(g, [a[:, :0] @ b[:0]], a=np.ones((2, 3), F32), b=np.ones((3, 4), F32))
    np.testing.assert_array_equal(c[0], np.zeros((2, 4), F32))
    np.testing.assert_array_equal(r[0], np.zeros((2, 4), F32))


def test_batched_matmul_over_an_expression_sized_axis_compiles_quickly() -> None:
    s0 = ls.dim("s0", 1, 5)
    g = ls.Graph()
    a = g.input("a", (3, s0 + 1, s0), ls.float32)
    w = g.input("w", (s0, s0), ls.float32)
    with time_limit(10, "forming the kernels of a 3-D @ 2-D matmul"):
        prog = g.compile([a @ w], backend="c")
    av, wv = np.ones((3, 3, 2), F32), np.full((2, 2), 0.5, F32)
    np.testing.assert_array_equal(prog(a=av, w=wv)[0], np.ones((3, 3, 2), F32))


def test_shared_operands_over_an_expression_sized_axis_render_small_source() -> None:
    """Over an axis of size s0-1 the unravelled index expressions are long (floordiv/floormod by s0-1 and
    s0^2-2*s0+1) and x.ne(x) repeats a shared operand: each repeated subexpression is named once (cse.py);
    written out at every use this was 2.4 MB of C for one kernel and minutes of gcc."""
    from lightspeed.backend.c.render import PRELUDE, render_plan
    from lightspeed.graph import Program
    from lightspeed.kernel import form_kernels
    s0, s1 = ls.dim("s0", 1, 5), ls.dim("s1", 1, 5)
    sizes = {}
    for label, shape in (("(s1, s0)", (s1, s0)), ("(s1, s0-1)", (s1, s0 - 1))):
        g = ls.Graph()
        x = g.input("x", shape, ls.int32)
        out = x.ne(x).gather(x).cast(ls.float32).max(0)
        source = render_plan(form_kernels(Program.build(g, [out])))
        assert PRELUDE in source
        sizes[label] = len(source) - len(PRELUDE)  # the kernels' own text (~5 KB), not the shared headers
    assert sizes["(s1, s0)"] < 20_000
    assert sizes["(s1, s0-1)"] < 20_000, sizes
    # and the named index arithmetic computes the same values as the reference (indices partly out of range)
    g = ls.Graph()
    x = g.input("x", (s1, s0 - 1), ls.int32)
    out = (x * x + x).gather(x).cast(ls.float32).max(0)
    rng = np.random.default_rng(0)
    for n1, n0 in ((3, 4), (5, 5), (1, 2)):
        xv = rng.integers(-1, n1 + 1, size=(n1, n0 - 1)).astype(np.int32)
        got, want = both(g, [out], x=xv, dims={"s0": n0})
        np.testing.assert_array_equal(got[0], want[0])


# outputs ----------------------------------------------------------------------------------------------

def test_multiple_outputs_same_tensor_twice_and_inputs_returned_as_copies() -> None:
    g = ls.Graph()
    x = g.input("x", (3, 4), ls.float32)
    y = (x * 2.0).softmax(-1)
    prog = g.compile([y, y, x, x, x.T, y + 1.0, x[1]], backend="c")
    xv = np.arange(12, dtype=F32).reshape(3, 4) / 10
    outs = prog(x=xv)
    assert len(outs) == 7
    for a in range(len(outs)):
        assert not np.shares_memory(outs[a], xv), f"output {a} aliases the input"
        for b in range(a + 1, len(outs)):
            assert not np.shares_memory(outs[a], outs[b]), f"outputs {a} and {b} share memory"
    want_y = np_softmax(xv * 2.0)
    np.testing.assert_allclose(outs[0], want_y, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[2], xv)
    np.testing.assert_array_equal(outs[3], xv)
    np.testing.assert_array_equal(outs[4], xv.T)
    np.testing.assert_allclose(outs[5], want_y + 1.0, rtol=1e-6)
    np.testing.assert_array_equal(outs[6], xv[1])
    outs[2][...] = -1
    outs[0][...] = -1
    np.testing.assert_array_equal(outs[3], xv)
    assert (outs[1] > 0).all()
    again = prog(x=xv * 0)  # a second run writes fresh arrays: the first results stay as they were
    np.testing.assert_array_equal(outs[4], xv.T)
    np.testing.assert_array_equal(again[2], np.zeros_like(xv))


def test_reshaped_output_is_stored_once_and_read_by_other_kernels() -> None:
    """An output that is a reshape of a computed value is that value's buffer: the kernels that read
    the value load it instead of recomputing it (the new KV rows a decode step outputs and attends to)."""
    n = ls.dim("n", 1, 8)
    g = ls.Graph()
    x = g.input("x", (n, 6), ls.float32)
    y = (x * 2.0 + 1.0).exp()
    outs = [y.reshape((n, 2, 3)), y.sum(1), y, y.reshape((n, 3, 2)), y.reshape((n, 2, 3))]
    prog = g.compile(outs, backend="c")
    plan = prog.executor.plan
    # one kernel computes y (stored as outputs 0 and 4), one sums it, one stores y, one the (n, 3, 2) view
    assert len(plan.kernels) == 4, [k.name for k in plan.kernels]
    # with only the reshaped output and the sum: two kernels, and only one of them evaluates exp
    two = g.compile([y.reshape((n, 2, 3)), y.sum(1)], backend="c").executor
    bodies = two.source.split("static void ")[1:]
    assert len(two.plan.kernels) == 2
    assert sum("ls_exp2f(" in b for b in bodies) == 1
    for k in (1, 5):
        xv = np.random.default_rng(k).standard_normal((k, 6)).astype(F32)
        c = prog(x=xv)
        r = g.compile(outs, backend="reference")(x=xv)
        for a, b in zip(c, r):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-5)
        assert c[0].shape == (k, 2, 3) and c[3].shape == (k, 3, 2)
        assert not np.shares_memory(c[0], c[4]) and not np.shares_memory(c[0], c[2])


def test_scatter_stored_as_a_reshaped_output() -> None:
    """A Scatter whose output is a reshape of it writes its rows at the scattered node's own offsets
    (the buffer carries the output's shape; found by the random-graph test)."""
    g = ls.Graph()
    x = g.input("x", (3, 2), ls.float32)
    idx = g.input("idx", (2,), ls.int32)
    src = g.input("src", (2, 2), ls.float32)
    out = x.scatter(idx, src).reshape((1, 3, 2, 1))
    inputs = dict(x=np.arange(6, dtype=F32).reshape(3, 2), idx=np.array([2, 0], np.int32),
                  src=np.array([[10, 11], [20, 21]], F32))
    c, r = both(g, [out], **inputs)
    np.testing.assert_array_equal(c[0], r[0])
    np.testing.assert_array_equal(c[0].reshape(3, 2), [[20, 21], [2, 3], [10, 11]])


def test_an_input_and_its_reshaped_copy_are_separate_outputs() -> None:
    """An input returned as is needs a copy, and that copy (hash-consed) is the same node as an explicit
    ``contiguous()`` the graph returns under another shape: each output keeps its own shape, in either
    order (found by the random-graph test)."""
    for order in (1, -1):
        g = ls.Graph()
        a = g.input("a", (), ls.float32)
        b = g.input("b", (2, 3), ls.float32)
        outs = [a, a.contiguous().unsqueeze(0), b, b.contiguous().reshape((3, 2))][::order]
        inputs = dict(a=np.array(3.0, F32), b=np.arange(6, dtype=F32).reshape(2, 3))
        c, r = both(g, outs, **inputs)
        assert [x.shape for x in c] == [x.shape for x in r]
        for got, want in zip(c, r):
            np.testing.assert_array_equal(got, want)


def test_constant_and_iota_outputs() -> None:
    n = ls.dim("n", 1, 9)
    g = ls.Graph()
    x = g.input("x", (n,), ls.int32)
    table = g.constant(np.arange(6, dtype=F32).reshape(2, 3))
    outs = [g.iota(n), table, table.T, g.constant(3.5), x + g.iota(n)]
    for k in (1, 5):
        xv = np.full(k, 10, np.int32)
        c = g.compile(outs, backend="c")(x=xv)
        np.testing.assert_array_equal(c[0], np.arange(k))
        np.testing.assert_array_equal(c[1], np.arange(6, dtype=F32).reshape(2, 3))
        np.testing.assert_array_equal(c[2], np.arange(6, dtype=F32).reshape(2, 3).T)
        assert c[3].shape == () and c[3] == 3.5
        np.testing.assert_array_equal(c[4], 10 + np.arange(k))


# threads ----------------------------------------------------------------------------------------------

def test_one_and_two_threads_give_identical_results() -> None:
    from lightspeed.backend import c as cb
    g = ls.Graph()
    x = g.input("x", (256, 128), ls.float32)
    w = g.input("w", (128, 192), ls.float32)
    h = (x @ w).silu()
    outs = [h.softmax(-1), h.sum(0), h.max(-1), (h * h).mean(-1), x.T.contiguous()]
    prog = g.compile(outs, backend="c")
    rng = np.random.default_rng(6)
    xv, wv = rng.standard_normal((256, 128)).astype(F32), rng.standard_normal((128, 192)).astype(F32)
    before = cb.get_num_threads()
    try:
        results = {}
        for n in (1, 2, 1, 2):
            cb.set_num_threads(n)
            assert cb.get_num_threads() == n
            got = prog(x=xv, w=wv)
            if n in results:
                for a, b in zip(results[n], got):
                    np.testing.assert_array_equal(a, b)
            results[n] = got
        for k, (a, b) in enumerate(zip(results[1], results[2])):
            np.testing.assert_array_equal(a, b, err_msg=f"output {k}")
        want = xv.astype(np.float64) @ wv
        want = want / (1 + np.exp(-want))
        np.testing.assert_allclose(results[2][1], want.sum(0), rtol=1e-4, atol=1e-3)
    finally:
        cb.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
def test_parallel_kernels_match_the_reference(threads: int) -> None:
    """Work large enough for the thread pool: few long rows (the last axis is split into chunks),
    many short rows, a tiled reduction and a scatter, at two sizes of a symbolic dim."""
    from lightspeed.backend import c as cb
    n = ls.dim("n", 1, 3000)
    g = ls.Graph()
    long_rows = g.input("long_rows", (3, 40000), ls.float32)
    tall = g.input("tall", (n, 96), ls.float32)
    w = g.input("w", (96, 80), ls.float32)
    idx = g.input("idx", (n,), ls.int32)
    outs = [long_rows.softmax(-1), (long_rows * 2.0 + 1.0).sin(), long_rows.max(-1), tall.T @ tall,
            (tall @ w).relu(), tall.sum(-1), g.constant(np.zeros((3000, 96), np.float32)).scatter(idx, tall),
            tall.gather(idx.flip(0))]
    prog_c = g.compile(outs, backend="c")
    prog_r = g.compile(outs, backend="reference")
    rng = np.random.default_rng(7)
    before = cb.get_num_threads()
    try:
        cb.set_num_threads(threads)
        for size in (2999, 37):
            inputs = dict(long_rows=rng.standard_normal((3, 40000)).astype(F32),
                          tall=rng.standard_normal((size, 96)).astype(F32),
                          w=rng.standard_normal((96, 80)).astype(F32),
                          idx=rng.permutation(3000)[:size].astype(np.int32))
            for k, (got, want) in enumerate(zip(prog_c(**inputs), prog_r(**inputs))):
                scale = max(1.0, float(np.abs(want).max()))
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale, err_msg=f"output {k} n={size}")
    finally:
        cb.set_num_threads(before)
