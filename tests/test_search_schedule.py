"""Kernel-level schedule search: knobs, candidates checked against the reference, the time budget, the
tuning cache, and ``graph.compile(..., backend="c", search=...)``."""
from __future__ import annotations

import re
import time

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.backend.c import render as c_render
from lightspeed.graph import Program
from lightspeed.backend.c.scheduling import assign_schedules
from lightspeed.kernel import form_kernels
from lightspeed.search import driver as search_driver
from lightspeed.kernel.schedule import Order, Register, SplitReduce, Tile
from lightspeed.search import knobs as K
from lightspeed.search import schedule as S


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))


def matmul_softmax(n: int = 96):
    g = ls.Graph()
    x = g.input("x", (n, n))
    w = g.input("w", (n, n))
    return g, [(x @ w).softmax(-1) * 2.0]


def test_override_edits_the_kernels_schedule_and_rejects_unknown_knobs():
    """Knobs are steps appended to one kernel's schedule while it renders: nothing global changes (the
    renderers' defaults stay), the schedule is restored after, and nested overrides stack."""
    g, outs = matmul_softmax()
    plan = form_kernels(Program.build(g, outs), gemm=False)
    (tiled,) = [k for k in plan.kernels if k.kind == "tiled"]
    before, saved = K.defaults(), tiled.schedule
    with K.override({"TILE": 32, "ATTENTION_KEYS": 128}, tiled):
        assert tiled.schedule.size(Register, "n", 0) == 32 and tiled.schedule.find(Tile) is None
        with K.override({"TILE": 8}, tiled):
            assert tiled.schedule.size(Register, "n", 0) == 8
        assert tiled.schedule.size(Register, "n", 0) == 32
        assert c_render.TILE == before["TILE"]
    assert tiled.schedule is saved and K.defaults() == before
    with pytest.raises(ValueError, match="unknown schedule knobs"):
        with K.override({"TILES": 4}, tiled):
            pass


def test_knobs_change_the_rendered_kernel_only_where_they_apply():
    g, outs = matmul_softmax()
    plan = form_kernels(Program.build(g, outs), gemm=False)  # the tiled form of the matmul
    base = c_render.render_plan(plan)
    tiled = [k for k in plan.kernels if k.kind == "tiled"]
    assert tiled, [k.kind for k in plan.kernels]
    other = c_render.render_plan(plan, schedule=K.per_kernel({tiled[0].name: {"TILE": 32, "ROW_BLOCK": 2}}))
    assert other != base
    # knobs of another kind of kernel change nothing here
    assert c_render.render_plan(plan, schedule=K.uniform({"ATTENTION_ROWS": 8})) == base


def test_gemm_knobs_edit_the_kernels_own_schedule_only_while_it_renders():
    g, outs = matmul_softmax()
    plan = assign_schedules(form_kernels(Program.build(g, outs)))
    (gemm,) = [k for k in plan.kernels if k.kind == "gemm"]
    before = gemm.schedule
    base = c_render.render_plan(plan)
    knobs = {"GEMM_TILE_K": 40, "GEMM_TILE_M": 50, "GEMM_UNROLL_K": 2}
    other = c_render.render_plan(plan, schedule=K.per_kernel({gemm.name: knobs}))
    assert other != base and "k0 += 40" in other and "k0 += 40" not in base
    assert gemm.schedule is before  # restored: nothing outside the rendering changed
    edited = K.schedule_steps(before, knobs)
    assert edited.size(Tile, "k", 0) == 40 and edited.size(Tile, "m", 0) % edited.size(Register, "m", 1) == 0
    # the search measures gemm schedules and keeps only candidates that agree with the reference
    res = S.tune_schedule(Program.build(g, outs), plan, level=1, budget_s=60, progress=False, use_cache=False)
    assert res.tried >= 2 and res.rejected == 0, res
    assert all(set(c) <= set(K.BY_SCHEDULE["gemm"]) for name, c in res.choice.items() if name == gemm.name)


def test_the_candidates_propose_split_k_and_the_tile_order(monkeypatch):
    """Both levels propose k split into parts and n-major tiles; the knobs become SplitReduce and Order steps
    the renderer applies, and a search over them (a product with few tiles) keeps only
    candidates that agree with the reference."""
    quick, grid = K.configurations(1), K.configurations(2)
    assert any(c.get("GEMM_SPLIT_K", 1) > 1 for c in quick) and any(c.get("GEMM_ORDER") == "nm" for c in quick)
    assert {c.get("GEMM_SPLIT_K") for c in grid[1:]} == set(K.VALUES["GEMM_SPLIT_K"])
    assert {c.get("GEMM_ORDER") for c in grid[1:]} == set(K.VALUES["GEMM_ORDER"])
    g = ls.Graph()
    x, w = g.input("x", (32, 1024)), g.input("w", (1024, 64))  # too short a k for the heuristics to split it
    program = Program.build(g, [x @ w])
    plan = assign_schedules(form_kernels(program))
    (gemm,) = plan.kernels
    knobs = {"GEMM_SPLIT_K": 4, "GEMM_ORDER": "nm"}
    edited = K.schedule_steps(gemm.schedule, knobs)
    assert edited.find(SplitReduce, "k") == SplitReduce("k", 4) and edited.find(Order) == Order(("n", "m"))
    src = c_render.render_plan(plan, schedule=K.per_kernel({gemm.name: knobs}))
    assert "_merge(" in src and "_merge(" not in c_render.render_plan(plan)
    monkeypatch.setattr(K, "configurations", lambda level: [{}, {"GEMM_SPLIT_K": 4}, knobs])
    res = S.tune_schedule(program, plan, level=1, budget_s=60, progress=False, use_cache=False)
    assert res.tried == 3 and res.rejected == 0, res


def test_search_checks_times_caches_and_respects_the_budget(monkeypatch):
    """One search: a deliberately broken candidate is rejected and never chosen, the result agrees with
    the reference, the tuning cache answers a second search at once, and a tiny budget holds."""
    g, outs = matmul_softmax()
    program = Program.build(g, outs)
    plan = form_kernels(program, gemm=False)
    broken = {"TILE": 32, "ROW_BLOCK": 4}
    monkeypatch.setattr(K, "QUICK", [{"TILE": 8, "ROW_BLOCK": 6}, broken])
    real_render = S.render_plan

    tiled = next(k for k in plan.kernels if k.kind == "tiled")

    def render(plan_, profile=False, schedule=None):
        src = real_render(plan_, profile=profile, schedule=schedule)
        if schedule is not None:
            with schedule(tiled):  # rendering under the broken candidate's knobs
                is_broken = tiled.schedule is not None and tiled.schedule.size(Register, "n", 0) == 32
            if is_broken:
                src = re.sub(r"(acc\[\w+\]\[jj\]) \+= \(", r"\1 -= (", src)  # wrong sums
                assert "-= (" in src
        return src
    monkeypatch.setattr(S, "render_plan", render)
    res = S.tune_schedule(program, plan, level=1, budget_s=60, progress=False)
    assert res.tried == 3 and res.rejected == 1, res
    assert all(c.get("TILE") != 32 for c in res.choice.values())
    assert res.default_seconds is not None and res.default_seconds > 0
    # the chosen schedule as the C backend renders it agrees with the reference
    monkeypatch.setattr(S, "render_plan", real_render)
    prog = g.compile(outs, backend="c", gemm=False)
    x, w = (np.random.default_rng(k).standard_normal((96, 96)).astype(np.float32) for k in range(2))
    ref = g.compile(outs, backend="reference")(x=x, w=w)[0]
    tuned_src = c_render.render_plan(plan, schedule=res.schedule())
    assert "-= (" not in tuned_src
    assert "gemm" not in [k.kind for k in plan.kernels]
    np.testing.assert_allclose(prog(x=x, w=w)[0], ref, rtol=1e-4, atol=1e-6)
    # a second search finds every kernel in the tuning cache
    t0 = time.perf_counter()
    again = S.tune_schedule(program, plan, level=1, budget_s=60, progress=False)
    assert again.stopped_by == "cached" and again.choice == res.choice
    assert time.perf_counter() - t0 < 2.0
    # other dimension values or a tiny budget: a fresh search, which stops at the budget
    t0 = time.perf_counter()
    short = S.tune_schedule(program, plan, level=2, budget_s=0.3, progress=False, use_cache=False)
    assert short.stopped_by == "budget" and not short.choice
    assert time.perf_counter() - t0 < 5.0  # the reference run and the first compile may overrun a little


def test_the_cache_keeps_what_the_whole_program_check_decided(monkeypatch):
    """A kernel's knobs that win alone but lose in the whole-program check are not used, and the tuning
    cache then says "heuristics" for that kernel too: a cached search answers what the search chose."""
    g, outs = matmul_softmax()
    program = Program.build(g, outs)
    plan = form_kernels(program, gemm=False)
    monkeypatch.setattr(K, "configurations", lambda level: [{}, {"TILE": 8, "ROW_BLOCK": 6}])
    real_time, runs = S.PlanRunner.time, []

    def time_default_slower(self, *a, **kw):  # the first runner timed is the heuristics' build
        total, per = real_time(self, *a, **kw)
        runs.append(1)
        scale = 3.0 if len(runs) == 1 else 1.0
        return total * scale, [p * scale for p in per]
    monkeypatch.setattr(S.PlanRunner, "time", time_default_slower)
    monkeypatch.setattr(S, "compare", lambda tuned, default: (2.0, 1.0))  # the whole program: slower
    res = S.tune_schedule(program, plan, level=1, budget_s=60, progress=False)
    assert res.tried == 2 and res.rejected == 0 and res.choice == {}, res
    again = S.tune_schedule(program, plan, level=1, budget_s=60, progress=False)
    assert again.stopped_by == "cached" and again.from_cache > 0 and again.choice == {}


def test_compile_with_search_option(monkeypatch):
    """The public API: ``g.compile(..., backend="c", search=1, search_budget_s=...)``, with symbolic dims
    tuned at given values; the result agrees with the reference at other values too."""
    monkeypatch.setattr(K, "QUICK", K.QUICK[:1])  # one candidate besides the heuristics keeps this quick
    seq = ls.dim("seq", 1, 512)
    g = ls.Graph()
    x = g.input("x", (seq, 64))
    w = g.input("w", (64, 48))
    y = (x @ w + 0.0).softmax(-1)  # "+ 0.0" is removed by the exact rewrites of level 1
    prog = g.compile([y], backend="c", search=1, search_budget_s=40, search_dims={"seq": 64})
    report = prog.executor.search_report
    assert report.graph == "rewrite" and report.rewrites.get("add-zero") == 1
    assert report.schedule.env == {"seq": 64}
    assert report.seconds < 40 + 5
    ref = g.compile([y], backend="reference")
    for n in (1, 7, 100):
        xs = np.random.default_rng(n).standard_normal((n, 64)).astype(np.float32)
        ws = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
        np.testing.assert_allclose(prog(x=xs, w=ws)[0], ref(x=xs, w=ws)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="search level"):
        g.compile([y], backend="c", search=3)


def test_level_two_uses_the_e_graph(monkeypatch):
    """search=2 runs the e-graph with rounding rules (here: x*a + x*b -> x*(a+b)) before the schedules."""
    pytest.importorskip("egglog")
    from lightspeed.search import calibration, cost
    monkeypatch.setattr(calibration, "calibrate", lambda: cost.CostModel())  # not the one-off measurement here
    monkeypatch.setattr(K, "configurations", lambda level: [{}, {"TILE": 32}])
    # the model's choice stands: timing the two one-kernel candidates could pick either on a loaded machine
    # (a 5% margin on microseconds), and the measured choice has its own tests (test_search_measured.py)
    monkeypatch.setattr(search_driver, "MEASURE_MIN_BUDGET_S", float("inf"))
    g = ls.Graph()
    x, a, b = (g.input(n, (64, 64)) for n in "xab")
    y = x * a + x * b
    prog = g.compile([y], backend="c", search=2, search_budget_s=30)
    report = prog.executor.search_report
    assert report.graph == "e-graph"
    assert [k.kind for k in prog.executor.plan.kernels] == ["loop"]
    rng = np.random.default_rng(0)
    xs, as_, bs = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(3))
    np.testing.assert_allclose(prog(x=xs, a=as_, b=bs)[0], xs * as_ + xs * bs, rtol=1e-5, atol=1e-5)


def test_knobs_option_edits_every_kernel_that_reads_them():
    """``g.compile(..., knobs=...)``: the tiled reduction's block comes from its schedule (no module constant
    changes), a gemm kernel given only a grain keeps the heuristics' tiles, and the values stay right."""
    from lightspeed.kernel.schedule import Grain
    g, outs = matmul_softmax()
    plain = g.compile(outs, backend="c", gemm=False)
    tiled = g.compile(outs, backend="c", gemm=False, knobs={"TILE": 8, "ROW_BLOCK": 2})
    assert "acc[4][16]" in plain.executor.source and "acc[2][8]" in tiled.executor.source
    assert c_render.TILE == 16 and c_render.ROW_BLOCK == 4
    gemm = g.compile(outs, backend="c", knobs={"PARALLEL_GRAIN": 1})
    (k,) = [k for k in gemm.executor.plan.kernels if k.kind == "gemm"]
    assert k.schedule.find(Grain).ops == 1 and k.schedule.find(Tile) is not None
    x, w = (np.random.default_rng(k).standard_normal((96, 96)).astype(np.float32) for k in range(2))
    want = g.compile(outs, backend="reference")(x=x, w=w)[0]
    for prog in (tiled, gemm):
        np.testing.assert_allclose(prog(x=x, w=w)[0], want, rtol=1e-4, atol=1e-6)
