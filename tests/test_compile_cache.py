"""The on-disk compile cache of the C backend, seen from separate processes.

A graph compiled once is loaded from ``$LIGHTSPEED_CACHE_DIR`` by a new process without
running the compiler; two processes compiling the same graph into an empty cache both
succeed and leave one shared object; a missing or failing compiler is a CompilerError.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.backend.c import CompilerError
from lightspeed.backend.c import compiler as c_compiler

REPO = Path(__file__).resolve().parent.parent
WARM_COMPILE_LIMIT_S = 0.1

# Builds a small graph (several kernels, a symbolic dim), counts compiler invocations, waits for
# a start signal when given one, compiles, runs and prints what happened as JSON.
SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import lightspeed as ls
    from lightspeed.backend.c import compiler

    calls = []
    real_run = compiler.subprocess.run
    def counting_run(cmd, *a, **k):
        if "-o" in cmd and not cmd[-1].endswith(".gch"):  # shared objects (not the precompiled header)
            calls.append(cmd[-1])
        return real_run(cmd, *a, **k)
    compiler.subprocess.run = counting_run

    seq = ls.dim("seq", 1, 256)
    g = ls.Graph()
    x = g.input("x", (seq, 32), ls.float32)
    w = g.input("w", (32, 16), ls.float32)
    h = (x @ w).silu()
    outs = [h.softmax(-1), h.sum(0), x.T.contiguous()]
    go = os.environ.get("LS_TEST_GO")
    if go:  # say we are ready, then start together with the other process
        open(f"{go}.ready.{os.getpid()}", "w").close()
        deadline = time.time() + 60
        while not os.path.exists(go) and time.time() < deadline:
            time.sleep(0.001)
    t0 = time.perf_counter()
    prog = g.compile(outs, backend="c")
    wall = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    xv, wv = rng.standard_normal((40, 32)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32)
    got = prog(x=xv, w=wv)
    hv = xv.astype(np.float64) @ wv
    hv = hv / (1 + np.exp(-hv))
    e = np.exp(hv - hv.max(-1, keepdims=True))
    ok = (np.allclose(got[0], e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
          and np.allclose(got[1], hv.sum(0), rtol=1e-4, atol=1e-4) and np.array_equal(got[2], xv.T))
    print(json.dumps({"compiles": calls, "compile_seconds": prog.executor.compile_seconds, "wall": wall,
                      "library": str(prog.executor.library_path), "ok": bool(ok)}))
""")


def _env(cache: Path, **extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env[c_compiler.CACHE_ENV] = str(cache)
    env.update(extra)
    return env


def _run(cache: Path, **extra: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=_env(cache, **extra),
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _shared_objects(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.suffix == ".so")


def test_new_process_loads_the_graph_from_the_cache(tmp_path) -> None:
    cache = tmp_path / "cache"
    cold = _run(cache)
    assert cold["ok"]
    assert len(cold["compiles"]) == 2, cold  # the thread-pool runtime and the graph
    warm = [_run(cache) for _ in range(2)]  # the faster of two, so that a busy machine does not fail it
    for w in warm:
        assert w["ok"]
        assert w["compiles"] == [], "a later process ran the compiler"
        assert w["library"] == cold["library"]
    fastest = min(w["compile_seconds"] for w in warm)
    assert fastest < WARM_COMPILE_LIMIT_S, f"compile from the cache took {fastest * 1000:.0f} ms: {warm}"
    assert len(_shared_objects(cache)) == 2


def test_concurrent_processes_share_one_cache_entry(tmp_path) -> None:
    cache = tmp_path / "cache"
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=_env(cache, LS_TEST_GO=str(go))) for _ in range(2)]
    deadline = time.time() + 120
    while len(list(tmp_path.glob("go.ready.*"))) < 2 and time.time() < deadline:
        time.sleep(0.01)
    assert len(list(tmp_path.glob("go.ready.*"))) == 2, "the processes did not get ready"
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in results)
    # both found the cache empty and compiled the graph themselves: the race really happened
    graph_key = Path(results[0]["library"]).stem
    assert all(any(Path(c).name.startswith(f".{graph_key}.") for c in r["compiles"]) for r in results), results
    assert results[0]["library"] == results[1]["library"]
    assert Path(results[0]["library"]).name in _shared_objects(cache)
    assert len(_shared_objects(cache)) == 2, _shared_objects(cache)  # the graph once, the runtime once
    leftovers = [p.name for p in cache.iterdir() if p.name.startswith(".") or p.name.startswith("failed-")]
    assert not leftovers, f"temporary files left behind: {leftovers}"


def _small_graph():
    g = ls.Graph()
    x = g.input("x", (3,), ls.float32)
    return g, [(x * 2.0 + 1.0).exp()]


def test_missing_compiler_in_cc_is_a_compiler_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(c_compiler.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "/nonexistent")
    g, outs = _small_graph()
    with pytest.raises(CompilerError, match="/nonexistent"):
        g.compile(outs, backend="c")


def test_missing_compiler_as_an_option_is_a_compiler_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(c_compiler.CACHE_ENV, str(tmp_path / "cache"))
    g, outs = _small_graph()
    with pytest.raises(CompilerError, match="/nonexistent/cc"):
        g.compile(outs, backend="c", cc="/nonexistent/cc")


def test_failing_compiler_is_a_compiler_error_that_keeps_the_source(monkeypatch, tmp_path) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv(c_compiler.CACHE_ENV, str(cache))
    g, outs = _small_graph()
    with pytest.raises(CompilerError, match="failed") as info:
        g.compile(outs, backend="c", cc="false")  # on PATH, exits 1 without output
    kept = [p for p in cache.iterdir() if p.name.startswith("failed-")]
    assert len(kept) == 1 and str(kept[0]) in str(info.value)
    assert "ls_graph" in kept[0].read_text()
    assert not _shared_objects(cache)


def test_missing_compiler_in_a_fresh_process_is_a_compiler_error(tmp_path) -> None:
    """Nothing is cached, so even the runtime must be compiled: the error must still be clean."""
    script = textwrap.dedent("""
        import numpy as np, lightspeed as ls
        from lightspeed.backend.c import CompilerError
        g = ls.Graph()
        x = g.input("x", (3,), ls.float32)
        try:
            g.compile([x * 2.0], backend="c")
        except CompilerError as e:
            print("CompilerError:", e)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=_env(tmp_path / "cache", CC="/nonexistent"), timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("CompilerError:") and "/nonexistent" in proc.stdout, proc.stdout


def test_cache_entry_is_used_in_process_and_key_changes_with_flags(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(c_compiler.CACHE_ENV, str(tmp_path / "cache"))
    g, outs = _small_graph()
    a = g.compile(outs, backend="c")
    b = g.compile(outs, backend="c")
    assert a.executor.library_path == b.executor.library_path
    flags = c_compiler.default_flags()
    c = g.compile(outs, backend="c", flags=[f for f in flags if f != "-O3"] + ["-O1"])
    assert c.executor.library_path != a.executor.library_path
    xv = np.array([0.0, 1.0, -1.0], np.float32)
    want = np.exp(xv.astype(np.float64) * 2 + 1)
    for prog in (a, b, c):
        np.testing.assert_allclose(prog(x=xv)[0], want, rtol=1e-6)
