"""Schedules as data, and matmul-like kernels generated under them ("gemm" kernels: packed panels and a
register block in vector-extension registers), compared with numpy on odd shapes and random schedules."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from time_limit import time_limit

import lightspeed as ls
from lightspeed.backend.c.gemm import gemm_sizes
from lightspeed.kernel.heuristics import Target, gemm_schedule
from lightspeed.kernel.schedule import (Order, Pack, Parallel, Register, Schedule, ScheduleError, SplitReduce, Tile,
                                        Unroll, Vectorize)

RNG = np.random.default_rng(0)


def _schedule(mr: int, nr: int, w: int, mc: int, nc: int, kc: int, u: int, pack_a: bool = True) -> Schedule:
    return Schedule((Parallel("m"), Parallel("n"), Tile("m", mc), Tile("n", nc), Tile("k", kc), Register("m", mr),
                     Register("n", nr), Vectorize("n", w)) + ((Pack("a", "k"),) if pack_a else ())
                    + (Pack("b", "k"), Unroll("k", u)))


def _kinds(prog) -> list[str]:
    return [k.kind for k in prog.executor.plan.kernels]


def _check(got: np.ndarray, want: np.ndarray, k: int) -> None:
    # float32 sums in another order: a few ulps of the largest partial sums
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * max(k, 1) ** 0.5 * (np.abs(want).max() + 1))


# --- the schedule as data -------------------------------------------------------------------------------
def test_schedule_round_trips_through_json_and_later_steps_override():
    s = _schedule(6, 16, 8, 48, 64, 40, 2).with_steps(Tile("k", 80), Order(("n", "m")), SplitReduce("k", 2))
    assert s.size(Tile, "k", 0) == 80 and s.size(Tile, "m", 0) == 48
    back = Schedule.from_json(s.to_json())
    assert back == s.canonical()
    assert back.size(Tile, "k", 0) == 80 and back.find(Order).axes == ("n", "m")
    assert back.parallel() == ("m", "n") and back.packs("a") and back.packs("b")
    assert "Tile('k', 80)" in str(s)


@pytest.mark.parametrize("bad, words", [
    (_schedule(6, 16, 8, 48, 64, 40, 1).with_steps(Tile("x", 4)), "axis 'x'"),
    (_schedule(6, 16, 8, 48, 64, 40, 1).with_steps(Unroll("k", 0)), "positive"),
    (_schedule(6, 12, 8, 48, 48, 40, 1), "multiple of Vectorize"),
    (_schedule(6, 16, 8, 50, 64, 40, 1), "multiples of the register"),
    (_schedule(6, 24, 12, 48, 48, 40, 1), "power of two"),
    (Schedule((Register("m", 4), Register("n", 8), Vectorize("n", 8))), "packed"),
    (_schedule(6, 16, 8, 48, 64, 40, 1).with_steps(SplitReduce("m", 2)), r"does not apply SplitReduce\(axis='m'"),
    (_schedule(6, 16, 8, 48, 64, 40, 1).with_steps(SplitReduce("n", 3)), r"does not apply SplitReduce\(axis='n'"),
    (_schedule(6, 16, 8, 48, 64, 40, 1).with_steps(SplitReduce("k", 0)), "positive"),
    (_schedule(6, 16, 8, 48, 64, 40, 1).with_steps(Order(("m",))), r"does not apply Order\(axes=\('m',\)\)"),
    (_schedule(6, 16, 8, 48, 64, 40, 1).with_steps(Order(("k", "n", "m"))), r"does not apply Order\(axes=\('k'"),
    (_schedule(6, 16, 8, 48, 64, 40, 1).with_steps(Order(("m", "k", "n"))), r"does not apply Order\(axes=\('m', 'k'"),
    (_schedule(6, 16, 8, 48, 64, 40, 1).with_steps(Order(("n", "m", "n"))), "Order.*repeats an axis"),
    (_schedule(6, 16, 8, 48, 64, 40, 1).with_steps(Vectorize("k", 8)), "does not apply Vectorize"),
])
def test_a_schedule_that_cannot_apply_is_refused_by_name(bad, words):
    with pytest.raises(ScheduleError, match=words):
        gemm_sizes(bad)


def test_split_k_and_the_tile_order_are_read_from_the_schedule():
    base = _schedule(6, 16, 8, 48, 64, 40, 1)
    assert (gemm_sizes(base)["P"], gemm_sizes(base)["NMAJOR"]) == (1, 0)
    assert gemm_sizes(base.with_steps(SplitReduce("k", 3)))["P"] == 3
    for axes, nmajor in ((("m", "n"), 0), (("n", "m"), 1), (("m", "n", "k"), 0), (("n", "m", "k"), 1)):
        assert gemm_sizes(base.with_steps(Order(axes)))["NMAJOR"] == nmajor


def test_schedule_json_with_an_unknown_step_is_refused():
    with pytest.raises(ScheduleError, match="unknown schedule step"):
        Schedule.from_json('[["Swizzle", {"axis": "m"}]]')


def test_heuristics_fill_the_register_file_of_the_target():
    avx512 = gemm_sizes(gemm_schedule(Target(vector_bytes=64, vector_registers=32, l1_bytes=48 << 10)))
    avx2 = gemm_sizes(gemm_schedule(Target(vector_bytes=32, vector_registers=16, l1_bytes=32 << 10)))
    assert (avx512["MR"], avx512["NR"], avx512["W"]) == (6, 64, 16)
    assert (avx2["MR"], avx2["NR"], avx2["W"]) == (6, 16, 8)
    # the b panel a register block walks stays within L1
    assert avx512["KC"] * avx512["NR"] * 4 <= 48 << 10 and avx2["KC"] * avx2["NR"] * 4 <= 32 << 10


def test_heuristics_split_k_only_for_few_output_blocks_and_a_long_k():
    avx512 = Target(vector_bytes=64, vector_registers=32, l1_bytes=48 << 10)
    kc = gemm_sizes(gemm_schedule(avx512, 64))["KC"]

    def parts(**sizes):
        return gemm_sizes(gemm_schedule(avx512, **sizes))["P"]
    assert parts(columns=64, rows=32, depth=16 * kc) == 4          # 6 register blocks of 6 x 64
    assert parts(columns=64, rows=32, depth=16 * kc, batch=2) == 4  # 12
    assert parts(columns=64, rows=32, depth=16 * kc, batch=3) == 1  # 18: enough blocks
    assert parts(columns=128, rows=128, depth=64 * kc) == 1         # 44
    assert parts(columns=64, rows=32, depth=16 * kc - 1) == 1       # k too short
    assert parts(columns=64, rows=None, depth=16 * kc) == 1         # symbolic rows
    assert parts(columns=64, rows=32, depth=None) == 1


def test_a_static_product_gets_the_heuristics_split_of_k():
    """32x64x8192: split into 4 parts where the host's register blocks are 6 x 64 (AVX-512), not with 6 x 16."""
    from lightspeed.backend.c.target import host_target
    g = ls.Graph()
    x = g.input("x", (32, 8192), ls.float32)
    w = g.input("w", (8192, 64), ls.float32)
    prog = g.compile([x @ w], backend="c", templates=False)
    (kern,) = prog.executor.plan.kernels
    want = gemm_schedule(host_target(), columns=64, rows=32, depth=8192)
    assert kern.kind == "gemm" and kern.schedule == want
    assert ("_merge(" in prog.executor.source) == (gemm_sizes(want)["P"] > 1)
    xv = RNG.standard_normal((32, 8192), dtype=np.float32)
    wv = RNG.standard_normal((8192, 64), dtype=np.float32)
    (got,) = prog(x=xv, w=wv)
    _check(got, xv.astype(np.float64) @ wv, 8192)


# --- generated gemm kernels -------------------------------------------------------------------------------
def _matmul_prog(m, k, n, transposed: bool, **opts):
    g = ls.Graph()
    a = g.input("a", (m, k), ls.float32)
    b = g.input("b", (n, k) if transposed else (k, n), ls.float32)
    return g.compile([a @ (b.T if transposed else b)], backend="c", templates=False, **opts)


def test_a_matmul_becomes_a_gemm_kernel_with_the_default_schedule():
    prog = _matmul_prog(64, 48, 80, False)
    assert _kinds(prog) == ["gemm"]
    (kern,) = prog.executor.plan.kernels
    assert kern.schedule is not None and kern.schedule.packs("b")
    off = _matmul_prog(64, 48, 80, False, gemm=False)
    assert "gemm" not in _kinds(off)


def test_a_plan_from_the_plan_cache_shows_the_schedules_it_was_rendered_with(tmp_path, monkeypatch):
    from lightspeed.backend.c.plan_cache import CachedPlan
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))
    cold, warm = _matmul_prog(64, 48, 80, True), _matmul_prog(64, 48, 80, True)
    assert isinstance(warm.executor.plan, CachedPlan) and not isinstance(cold.executor.plan, CachedPlan)
    assert warm.executor.plan.kernels[0].schedule == cold.executor.plan.kernels[0].schedule is not None


@pytest.mark.parametrize("transposed", [False, True])
def test_symbolic_rows_run_at_every_length_including_the_few_rows_path(transposed):
    seq = ls.dim("seq", 1, 300)
    g = ls.Graph()
    x = g.input("x", (seq, 72), ls.float32)
    w = g.input("w", (40, 72) if transposed else (72, 40), ls.float32)
    prog = g.compile([x @ (w.T if transposed else w)], backend="c", templates=False)
    assert _kinds(prog) == ["gemm"]
    wv = RNG.standard_normal((40, 72) if transposed else (72, 40), dtype=np.float32)
    for rows in (1, 2, 5, 6, 13, 97, 300):  # below and above half a register block, odd tails
        xv = RNG.standard_normal((rows, 72), dtype=np.float32)
        (got,) = prog(x=xv, w=wv)
        _check(got, xv.astype(np.float64) @ (wv.T if transposed else wv), 72)


def test_batched_operands_through_views_and_a_decoded_weight():
    g = ls.Graph()
    a = g.input("a", (3, 20, 33), ls.float32)            # used as [3, 33, 20]^T -> rows of 20 along k
    q = g.input("q", (3, 33, 50), ls.int8)               # int8 weights ...
    s = g.input("s", (3, 1, 50), ls.float32)             # ... with a scale per column
    bias = g.input("bias", (50,), ls.float32)
    w = q.cast(ls.float32) * s
    y = a.permute(0, 2, 1).permute(0, 2, 1) @ w          # a view round trip: same values, other index algebra
    prog = g.compile([y + bias], backend="c", templates=False)
    assert "gemm" in _kinds(prog)
    av = RNG.standard_normal((3, 20, 33), dtype=np.float32)
    qv = RNG.integers(-128, 128, (3, 33, 50), dtype=np.int8)
    sv = RNG.random((3, 1, 50), dtype=np.float32)
    bv = RNG.standard_normal(50, dtype=np.float32)
    (got,) = prog(a=av, q=qv, s=sv, bias=bv)
    want = av.astype(np.float64) @ (qv.astype(np.float64) * sv) + bv
    _check(got, want, 33)


def test_a_broadcast_right_operand_and_a_padded_left_operand():
    g = ls.Graph()
    a = g.input("a", (2, 30, 17), ls.float32)
    b = g.input("b", (19, 41), ls.float32)
    y = a.pad(((0, 0), (0, 0), (1, 1))) @ b            # k padded with zeros: a Select in the a factor
    prog = g.compile([y], backend="c", templates=False)
    assert _kinds(prog) == ["gemm"]
    av = RNG.standard_normal((2, 30, 17), dtype=np.float32)
    bv = RNG.standard_normal((19, 41), dtype=np.float32)
    (got,) = prog(a=av, b=bv)
    _check(got, np.pad(av, ((0, 0), (0, 0), (1, 1))).astype(np.float64) @ bv, 19)


def test_a_chosen_schedule_that_cannot_apply_names_the_kernel():
    bad = _schedule(6, 16, 8, 50, 64, 40, 1)
    with pytest.raises(ScheduleError, match="kernel k.*multiples"):
        _matmul_prog(32, 32, 32, False, schedules=lambda kern: bad)


@settings(max_examples=32, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 70), k=st.integers(1, 90), n=st.integers(1, 70), transposed=st.booleans(),
       mr=st.sampled_from([1, 2, 3, 4, 6, 8, 12]), w=st.sampled_from([4, 8, 16]), nv=st.integers(1, 3),
       mt=st.integers(1, 4), nt=st.integers(1, 3), kc=st.sampled_from([1, 7, 16, 40, 256]),
       u=st.sampled_from([1, 2, 4]), pack_a=st.booleans(), fused_a=st.booleans(),
       parts=st.sampled_from([1, 2, 3, 5]), order=st.sampled_from([None, ("m", "n"), ("n", "m"), ("n", "m", "k")]))
def test_random_schedules_on_random_shapes_match_numpy(m, k, n, transposed, mr, w, nv, mt, nt, kc, u, pack_a,
                                                       fused_a, parts, order):
    """Every way of reading a: panels per work item (Pack('a')), in place (a plain load, no Pack('a')),
    panels packed once per call and shared by the items (a fused factor, no Pack('a')); k split or not, the
    tiles in either order."""
    nr = w * nv
    if mr * nv > 64:
        mr = 4
    sched = _schedule(mr, nr, w, mr * mt, nr * nt, kc, u, pack_a)
    sched = sched.with_steps(*([SplitReduce("k", parts)] if parts > 1 else []) + ([Order(order)] if order else []))
    rows = ls.dim("rows", 1, 80)
    g = ls.Graph()
    a = g.input("a", (rows, k), ls.float32)
    s = g.input("s", (rows, 1), ls.float32)
    b = g.input("b", (n, k) if transposed else (k, n), ls.float32)
    left = a * s + 0.5 if fused_a else a
    with time_limit(60, "compile"):
        prog = g.compile([left @ (b.T if transposed else b)], backend="c", templates=False, gemm=True,
                         schedules=lambda kern: sched)
    av = RNG.standard_normal((m, k), dtype=np.float32)
    sv = RNG.standard_normal((m, 1), dtype=np.float32)
    bv = RNG.standard_normal((n, k) if transposed else (k, n), dtype=np.float32)
    (got,) = prog(a=av, s=sv, b=bv) if fused_a else prog(a=av, b=bv)
    gemms = [kern for kern in prog.executor.plan.kernels if kern.kind == "gemm"]
    if gemms:
        assert gemms[0].schedule == sched
    lv = av.astype(np.float64) * sv + 0.5 if fused_a else av.astype(np.float64)
    _check(got, lv @ (bv.T if transposed else bv).astype(np.float64), k)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_plain_left_operand_is_read_in_place_through_a_strided_view(transposed):
    """No Pack('a') and a plain load: the micro-kernel reads a's rows where they lie (a slice of a wider
    array from its second row: a base offset and a row stride other than k), odd row tails included."""
    seq = ls.dim("seq", 1, 200)
    g = ls.Graph()
    x = g.input("x", (seq, 90), ls.float32)
    w = g.input("w", (70, 61) if transposed else (61, 70), ls.float32)
    left = x[1:, 3:64]
    prog = g.compile([left @ (w.T if transposed else w)], backend="c", templates=False)
    (kern,) = [kern for kern in prog.executor.plan.kernels if kern.kind == "gemm"]
    assert not kern.schedule.packs("a")
    src = prog.executor.source
    assert "_ia(kc, ad" in src and "_apack" not in src
    wv = RNG.standard_normal((70, 61) if transposed else (61, 70), dtype=np.float32)
    for rows in (2, 5, 7, 13, 97, 200):
        xv = RNG.standard_normal((rows, 90), dtype=np.float32)
        (got,) = prog(x=xv, w=wv)
        _check(got, xv[1:, 3:64].astype(np.float64) @ (wv.T if transposed else wv), 61)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_fused_left_operand_is_packed_once_per_call_into_shared_panels(transposed):
    """No Pack('a') and a factor that is not a plain load (a norm's scale per row and per column fused into
    it): its panels are packed once per call (``_apack``) and every work item reads them; symbolic rows at
    lengths with odd tails, k in several blocks with a partial last one."""
    seq = ls.dim("seq", 1, 300)
    g = ls.Graph()
    x = g.input("x", (seq, 300), ls.float32)
    r = g.input("r", (seq, 1), ls.float32)
    gamma = g.input("gamma", (300,), ls.float32)
    w = g.input("w", (130, 300) if transposed else (300, 130), ls.float32)
    prog = g.compile([(x * r * gamma) @ (w.T if transposed else w)], backend="c", templates=False)
    assert "_apack" in prog.executor.source
    gv = RNG.standard_normal(300, dtype=np.float32)
    wv = RNG.standard_normal((130, 300) if transposed else (300, 130), dtype=np.float32)
    for rows in (3, 7, 61, 256, 300):
        xv = RNG.standard_normal((rows, 300), dtype=np.float32)
        rv = RNG.random((rows, 1), dtype=np.float32)
        (got,) = prog(x=xv, r=rv, gamma=gv, w=wv)
        want = (xv.astype(np.float64) * rv * gv) @ (wv.T if transposed else wv)
        _check(got, want, 300)


def test_without_memory_for_shared_panels_each_item_packs_its_own():
    """The shared buffer refused (a limit of no floats): the same kernel packs a per work item instead."""
    from lightspeed.backend.c.compiler import default_flags
    seq = ls.dim("seq", 1, 200)
    g = ls.Graph()
    x = g.input("x", (seq, 150), ls.float32)
    r = g.input("r", (seq, 1), ls.float32)
    w = g.input("w", (90, 150), ls.float32)
    prog = g.compile([(x * r) @ w.T], backend="c", templates=False,
                     flags=default_flags() + ["-DLS_SHARE_MAX_FLOATS=0"])
    assert "_apack" in prog.executor.source
    wv = RNG.standard_normal((90, 150), dtype=np.float32)
    for rows in (5, 77, 200):
        xv = RNG.standard_normal((rows, 150), dtype=np.float32)
        rv = RNG.random((rows, 1), dtype=np.float32)
        (got,) = prog(x=xv, r=rv, w=wv)
        _check(got, (xv.astype(np.float64) * rv) @ wv.T, 150)


@pytest.mark.parametrize("w", [4, 8, 16])
def test_a_weight_stored_n_by_k_is_packed_by_block_transposes_with_odd_tails(w):
    """b read as ``w[n, k]`` (``x @ w.T``), here a slice of a wider array from its second row: panels are
    packed by w x w register transposes, the columns and k steps past the last whole block one by one."""
    rows = ls.dim("rows", 1, 100)
    g = ls.Graph()
    x = g.input("x", (rows, 45), ls.float32)
    wt = g.input("wt", (60, 50), ls.float32)
    right = wt[1:, 2:47]                                   # [59, 45]: row stride 50, offset 52
    sched = _schedule(3, 2 * w, w, 6, 4 * w, 16, 2, pack_a=False)
    prog = g.compile([x @ right.T], backend="c", templates=False, schedules=lambda kern: sched)
    assert f"ls_transpose{w}(bp" in prog.executor.source  # called on the weight, not only defined
    wv = RNG.standard_normal((60, 50), dtype=np.float32)
    for m in (1, 4, 9, 100):
        xv = RNG.standard_normal((m, 45), dtype=np.float32)
        (got,) = prog(x=xv, wt=wv)
        _check(got, xv.astype(np.float64) @ wv[1:, 2:47].T, 45)


@pytest.mark.parametrize("kc", [16, 256])
def test_an_epilogue_applies_once_after_the_last_k_block_with_odd_tails(kc):
    """relu(x @ w.T + b) folded into the gemm: each register block gets the bias and the relu once, after
    its last k tile (k of 300 in tiles of 16, or one tile), rows and columns with partial blocks."""
    rows = ls.dim("rows", 1, 200)
    g = ls.Graph()
    x = g.input("x", (rows, 300), ls.float32)
    w = g.input("w", (70, 300), ls.float32)
    b = g.input("b", (70,), ls.float32)
    sched = _schedule(6, 32, 16, 12, 64, kc, 2, pack_a=False)
    prog = g.compile([(x @ w.T + b).relu()], backend="c", templates=False, schedules=lambda kern: sched)
    (kern,) = [kern for kern in prog.executor.plan.kernels if kern.kind == "gemm"]
    assert kern.epilogue is not None
    wv = RNG.standard_normal((70, 300), dtype=np.float32)
    bv = RNG.standard_normal(70, dtype=np.float32)
    for m in (7, 61, 200):
        xv = RNG.standard_normal((m, 300), dtype=np.float32)
        (got,) = prog(x=xv, w=wv, b=bv)
        _check(got, np.maximum(xv.astype(np.float64) @ wv.T + bv, 0.0), 300)


def test_a_weight_changed_between_calls_is_seen():
    """Panels are packed from the arrays of each call: a weight updated in place gives the new product."""
    g = ls.Graph()
    x = g.input("x", (64, 96), ls.float32)
    r = g.input("r", (64, 1), ls.float32)
    w = g.input("w", (80, 96), ls.float32)
    prog = g.compile([(x * r) @ w.T], backend="c", templates=False)
    xv = RNG.standard_normal((64, 96), dtype=np.float32)
    rv = RNG.random((64, 1), dtype=np.float32)
    wv = RNG.standard_normal((80, 96), dtype=np.float32)
    (first,) = prog(x=xv, r=rv, w=wv)
    _check(first, (xv.astype(np.float64) * rv) @ wv.T, 96)
    wv[3:40] *= -2.0
    (second,) = prog(x=xv, r=rv, w=wv)
    _check(second, (xv.astype(np.float64) * rv) @ wv.T, 96)


# --- split k and the tile order -----------------------------------------------------------------------------
def _split(parts: int, pack_a: bool = False, kc: int = 16) -> Schedule:
    return _schedule(6, 16, 8, 12, 32, kc, 2, pack_a).with_steps(SplitReduce("k", parts))


@pytest.mark.parametrize("parts", [2, 3, 5])
@pytest.mark.parametrize("read_a", ["in place", "per item", "shared"])
def test_split_k_with_an_epilogue_matches_numpy_at_every_depth(parts, read_a):
    """relu(x @ w.T + b) with k split into parts of whole 16-deep tiles, rows and depth symbolic: depths
    that are not a multiple of the tile, shorter than ``parts`` tiles (fewer parts, none empty) and of one
    tile (no split); the bias and relu apply once, to the merged sums (to a partial sum they would not
    match). Every way of reading a: in place, packed per item (Pack('a')), shared panels packed per call."""
    rows, depth = ls.dim("rows", 1, 200), ls.dim("depth", 1, 400)
    g = ls.Graph()
    x = g.input("x", (rows, depth), ls.float32)
    r = g.input("r", (rows, 1), ls.float32)
    w = g.input("w", (70, depth), ls.float32)
    b = g.input("b", (70,), ls.float32)
    left = x * r if read_a == "shared" else x
    sched = _split(parts, pack_a=read_a == "per item")
    prog = g.compile([(left @ w.T + b).relu()], backend="c", templates=False, schedules=lambda kern: sched)
    (kern,) = prog.executor.plan.kernels
    assert kern.kind == "gemm" and kern.epilogue is not None and kern.schedule == sched
    src = prog.executor.source
    assert "_merge(" in src and "ls_gemm_partials(" in src and ("_apack" in src) == (read_a == "shared")
    bv = RNG.standard_normal(70, dtype=np.float32)
    for m, k in ((61, 300), (7, 40), (200, 20), (13, 16), (97, 17)):
        xv = RNG.standard_normal((m, k), dtype=np.float32)
        rv = RNG.random((m, 1), dtype=np.float32)
        wv = RNG.standard_normal((70, k), dtype=np.float32)
        feeds = {"x": xv, "w": wv, "b": bv} | ({"r": rv} if read_a == "shared" else {})
        (got,) = prog(**feeds)
        lv = xv.astype(np.float64) * (rv if read_a == "shared" else 1.0)
        _check(got, np.maximum(lv @ wv.T + bv, 0.0), k)


def test_split_k_of_a_batched_matmul_in_either_tile_order():
    """A batch of products, each split into 3 parts, tiles enumerated n-major and m-major."""
    g = ls.Graph()
    a = g.input("a", (3, 29, 150), ls.float32)
    b = g.input("b", (3, 150, 50), ls.float32)
    av = RNG.standard_normal((3, 29, 150), dtype=np.float32)
    bv = RNG.standard_normal((3, 150, 50), dtype=np.float32)
    for order in (("n", "m"), ("m", "n")):
        sched = _split(3).with_steps(Order(order))
        prog = g.compile([a @ b], backend="c", templates=False, schedules=lambda kern: sched)
        assert _kinds(prog) == ["gemm"] and "_merge(" in prog.executor.source
        (got,) = prog(a=av, b=bv)
        _check(got, av.astype(np.float64) @ bv, 150)


def test_split_k_bits_repeat_and_do_not_depend_on_the_thread_count():
    """The partial sums merge in part order, so a split product is bit-identical run to run and whatever the
    number of threads (the tiles the launcher picks per thread count do not change any sum)."""
    from lightspeed.backend import c as cb
    g = ls.Graph()
    x = g.input("x", (32, 4100), ls.float32)
    w = g.input("w", (4100, 64), ls.float32)
    sched = _split(5, kc=64)
    prog = g.compile([x @ w], backend="c", templates=False, schedules=lambda kern: sched)
    assert "_merge(" in prog.executor.source
    xv = RNG.standard_normal((32, 4100), dtype=np.float32)
    wv = RNG.standard_normal((4100, 64), dtype=np.float32)
    before = cb.get_num_threads()
    try:
        runs = []
        for n in (2, 2, 1):
            cb.set_num_threads(n)
            runs.append(prog(x=xv, w=wv)[0])
    finally:
        cb.set_num_threads(before)
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_array_equal(runs[0], runs[2])
    _check(runs[0], xv.astype(np.float64) @ wv, 4100)


def test_the_tile_order_changes_only_the_enumeration_of_work_items():
    """Order(('n', 'm')) makes the row tile the fastest index of a work item (consecutive items share a panel
    of b); ('m', 'n'), with or without a last 'k', is the default enumeration, rendered the same."""
    rows = ls.dim("rows", 1, 300)
    g = ls.Graph()
    x = g.input("x", (rows, 90), ls.float32)
    w = g.input("w", (90, 130), ls.float32)

    def build(*steps):
        sched = _schedule(6, 16, 8, 12, 32, 32, 2).with_steps(*steps)
        return g.compile([x @ w], backend="c", templates=False, schedules=lambda kern: sched)
    default, mn, mnk, nm = build(), build(Order(("m", "n"))), build(Order(("m", "n", "k"))), build(Order(("n", "m")))
    assert default.executor.source == mn.executor.source == mnk.executor.source != nm.executor.source
    fast = "const int64_t mb = q % nmb; q /= nmb;\n        const int64_t nb = q % nnb; q /= nnb;"
    assert fast in nm.executor.source and fast not in default.executor.source
    wv = RNG.standard_normal((90, 130), dtype=np.float32)
    for m in (3, 50, 300):
        xv = RNG.standard_normal((m, 90), dtype=np.float32)
        (got,) = nm(x=xv, w=wv)
        _check(got, xv.astype(np.float64) @ wv, 90)
