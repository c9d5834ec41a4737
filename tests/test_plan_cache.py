"""The C backend's plan cache: a structurally identical program reuses its rendered source; any change to
the graph or to the options that shape the source misses; results always come from the graph compiled."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import lightspeed as ls
from lightspeed import quant
from lightspeed.backend.c import plan_cache
from lightspeed.graph import Program
from lightspeed.kernel import KernelPlan


REPO = Path(__file__).resolve().parent.parent
F32 = np.float32


@pytest.fixture(scope="module")
def _shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")  # shared by the tests: the base graph compiles once


@pytest.fixture(autouse=True)
def _cache(_shared_cache, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(_shared_cache))


def entries() -> int:
    d = Path(os.environ["LIGHTSPEED_CACHE_DIR"]) / "plans"
    return len(list(d.glob("*.json"))) if d.exists() else 0


def model(scalar=0.5, table=(1.0, 2.0, 3.0, 4.0), bound=64, width=8, unary="sin", transpose=False,
          big=None, dtype=ls.float32):
    """A small graph with a symbolic dim, a scalar, a small table and optionally a large constant."""
    seq = ls.dim("seq", 1, bound)
    g = ls.Graph()
    x = g.input("x", (seq, width), dtype)
    w = g.input("w", (width, width), ls.float32)
    h = x.cast(ls.float32) @ (w.T if transpose else w)
    h = getattr(h, unary)() * scalar + g.constant(np.array(table * (width // 4), dtype=F32))
    if big is not None:
        h = h + g.constant(big)[: width].reshape((1, width))
    return g, [h.softmax(-1), h.sum(0)]


def inputs(n=5, width=8, dtype=ls.float32):
    rng = np.random.default_rng(n)
    return dict(x=rng.standard_normal((n, width)).astype(dtype.np), w=rng.standard_normal((width, width)).astype(F32))


def compile_checked(g, outs, **options):
    """Compile for C, check every output against the reference; returns (program, hit)."""
    prog = g.compile(outs, backend="c", **options)
    ref = g.compile(outs, backend="reference")
    args = inputs(width=g.inputs["x"].shape[1], dtype=g.inputs["x"].dtype)
    for got, want in zip(prog(**args), ref(**args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return prog, isinstance(prog.executor.plan, plan_cache.CachedPlan)


def test_identical_program_hits_and_keeps_the_full_plan_on_demand(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))
    first, hit = compile_checked(*model())
    assert not hit and isinstance(first.executor.plan, KernelPlan) and entries() == 1
    again, hit = compile_checked(*model())  # a new Graph object: nothing is keyed by Python identity
    assert hit and entries() == 1
    assert again.executor.source == first.executor.source
    assert again.arena_bytes == first.arena_bytes
    # the full plan is formed again when asked for, with the same kernels
    assert [k.name for k in again.executor.plan.kernels] == [k.name for k in first.executor.plan.kernels]


VARIANTS = {
    "scalar": dict(scalar=0.25),
    "negative zero": dict(scalar=-0.0),
    "small table values": dict(table=(1.0, 2.0, 3.0, 4.5)),
    "dimension bound": dict(bound=65),
    "static shape": dict(width=12),
    "op": dict(unary="cos"),
    "view": dict(transpose=True),
    "dtype": dict(dtype=ls.float16),
}


@pytest.mark.parametrize("change", list(VARIANTS), ids=list(VARIANTS))
def test_a_changed_graph_misses_and_computes_its_own_values(change):
    base = dict(scalar=0.0) if change == "negative zero" else {}
    compile_checked(*model(**base))
    before = entries()
    _, hit = compile_checked(*model(**VARIANTS[change]))
    assert not hit and entries() == before + 1


@pytest.mark.parametrize("option", [dict(templates=False), dict(profile=True), dict(portable=True),
                                    dict(int8_activations=True)], ids=lambda o: next(iter(o)))
def test_options_that_shape_the_source_miss(option):
    compile_checked(*model())
    prog, hit = compile_checked(*model(), **option)
    assert not hit
    if option.get("profile"):  # profiling works on a hit too: its kernel names come from the full plan
        again, hit = compile_checked(*model(), **option)
        assert hit and len(again.executor.kernel_times()) == len(prog.executor.kernel_times())


def test_overridden_knobs_and_thresholds_miss(monkeypatch):
    from lightspeed.backend.c import render
    from lightspeed.kernel import fusion
    compile_checked(*model())
    _, hit = compile_checked(*model(), knobs={"TILE": 8, "ROW_BLOCK": 2, "PARALLEL_GRAIN": 1 << 12})
    assert not hit
    monkeypatch.setattr(render, "TILE", 8)  # a renderer default changed: its value is part of the key
    _, hit = compile_checked(*model())
    assert not hit
    monkeypatch.undo()
    monkeypatch.setattr(fusion, "RECOMPUTE_MAX_COST", 0)
    _, hit = compile_checked(*model())
    assert not hit


def test_outputs_and_donated_inputs_are_part_of_the_key():
    g, outs = model()
    compile_checked(g, outs)
    g, outs = model()
    _, hit = compile_checked(g, outs[:1])
    assert not hit
    g = ls.Graph()
    cache = g.input("cache", (4, 8), ls.float32)
    rows = g.input("rows", (2, 8), ls.float32)
    upd = cache.scatter(g.iota(2), rows * 2.0)
    plain = g.compile([upd], backend="c")
    g2 = ls.Graph()
    cache2, rows2 = g2.input("cache", (4, 8), ls.float32), g2.input("rows", (2, 8), ls.float32)
    donated = g2.compile([cache2.scatter(g2.iota(2), rows2 * 2.0)], backend="c", donate=["cache"])
    assert not isinstance(donated.executor.plan, plan_cache.CachedPlan)
    c = np.zeros((4, 8), F32)
    r = np.ones((2, 8), F32)
    (want,) = plain(cache=c.copy(), rows=r)
    (got,) = donated(cache=c, rows=r)
    np.testing.assert_array_equal(got, want)
    assert got is c  # written in place: the donated plan, not the plain one


def test_large_constants_are_read_at_run_time_so_their_values_hit():
    rng = np.random.default_rng(0)
    one, two = (rng.standard_normal(4096).astype(F32) for _ in range(2))  # 16 KiB: keyed by dtype and shape
    first, hit = compile_checked(*model(big=one))
    assert not hit
    second, hit = compile_checked(*model(big=two))  # compile_checked compares with the reference of `two`
    assert hit
    args = inputs()
    assert not np.allclose(first(**args)[0], second(**args)[0])
    _, hit = compile_checked(*model(big=one[:2048]))  # another shape misses
    assert not hit


def test_lowering_hints_are_part_of_the_key():
    q = quant.QType.Q4_1
    raw = quant.quantize(np.random.default_rng(1).standard_normal((8, 64)).astype(F32), q).reshape(8, -1)

    def build(hint: bool):
        g = ls.Graph()
        x = g.input("x", (3, 64), ls.float32)
        wt = quant.dequant_matrix_graph(g.constant(raw, ls.uint8), q)
        if not hint:
            g.lowerings.clear()
        return g, [x @ wt.T]

    progs = []
    for hint in (True, False, True):
        g, outs = build(hint)
        prog = g.compile(outs, backend="c")
        progs.append((prog, isinstance(prog.executor.plan, plan_cache.CachedPlan)))
        xv = np.random.default_rng(2).standard_normal((3, 64)).astype(F32)
        np.testing.assert_allclose(prog(x=xv)[0], g.compile(outs, backend="reference")(x=xv)[0], rtol=1e-4, atol=1e-4)
    assert [hit for _, hit in progs] == [False, False, True]
    assert progs[0][0].executor.source != progs[1][0].executor.source  # the hint gives a lowered kernel


def test_key_is_the_same_in_another_process():
    g, outs = model()
    # a fixed stand-in for the code fingerprint and module constants: the package may change on disk
    # while this runs (the subprocess would load the new code)
    key = plan_cache.plan_key(Program.build(g, outs), {"profile": False}, code="test")
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from test_plan_cache import model
        from lightspeed.backend.c import plan_cache
        from lightspeed.graph import Program
        g, outs = model()
        print(plan_cache.plan_key(Program.build(g, outs), {"profile": False}, code="test"))
    """)
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", script, str(REPO / "tests")], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == key


def test_unreadable_entries_and_the_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))
    compile_checked(*model())
    (entry,) = (Path(os.environ["LIGHTSPEED_CACHE_DIR"]) / "plans").glob("*.json")
    entry.write_text("{ not json")
    _, hit = compile_checked(*model())
    assert not hit and json.loads(entry.read_text())["format"] == plan_cache.FORMAT  # rewritten
    _, hit = compile_checked(*model(scalar=3.0), plan_cache=False)
    assert not hit and entries() == 1
