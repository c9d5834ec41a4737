"""The compile cache verifies what it loads: a damaged shared object or plan entry is discarded with a
warning and rebuilt, an unusable cache directory falls back to a private one, and stale temporary files
of a killed compile are removed. Every run that reads a damaged entry runs in a subprocess, so a crash
(SIGBUS, SIGSEGV, a corrupted heap) fails the test instead of taking pytest down."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from lightspeed.backend.c import cache_files, plan_cache

REPO = Path(__file__).resolve().parent.parent

# Two inputs of different shapes (swapped slots would read the wrong one), several kernels (a non-empty
# arena), outputs checked against numpy. Prints what happened as JSON.
SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import lightspeed as ls
    from lightspeed.backend.c import compiler, plan_cache

    calls = []
    real_run = compiler.subprocess.run
    def counting_run(cmd, *a, **k):
        if "-o" in cmd and not cmd[-1].endswith(".gch"):  # shared objects (not the precompiled header)
            calls.append(cmd[-1])
        return real_run(cmd, *a, **k)
    compiler.subprocess.run = counting_run
    # a fixed stand-in for the hash of the package's sources, which may change on disk between runs
    plan_cache.code_fingerprint = lambda: "hardening-test"

    seq = ls.dim("seq", 1, 64)
    g = ls.Graph()
    x = g.input("x", (seq, 24), ls.float32)
    w = g.input("w", (24, 8), ls.float32)
    h = (x @ w).silu()
    prog = g.compile([h.softmax(-1), h.sum(0)], backend="c")
    rng = np.random.default_rng(0)
    xv, wv = rng.standard_normal((20, 24)).astype(np.float32), rng.standard_normal((24, 8)).astype(np.float32)
    got = prog(x=xv, w=wv)
    hv = xv.astype(np.float64) @ wv
    hv = hv / (1 + np.exp(-hv))
    e = np.exp(hv - hv.max(-1, keepdims=True))
    ok = (np.allclose(got[0], e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
          and np.allclose(got[1], hv.sum(0), rtol=1e-4, atol=1e-4))
    print(json.dumps({"ok": bool(ok), "compiles": len(calls), "library": str(prog.executor.library_path),
                      "plan_hit": isinstance(prog.executor.plan, plan_cache.CachedPlan),
                      "arena": prog.arena_bytes}))
""")


def _env(cache: Path | str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["LIGHTSPEED_CACHE_DIR"] = str(cache)
    env.pop("PYTHONWARNINGS", None)
    return env


def run(cache: Path | str, **popen) -> tuple[dict, str]:
    """(the script's report, its stderr); fails on a crash or a traceback."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=_env(cache),
                          timeout=300, check=False, **popen)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> tuple[Path, dict]:
    """A cache holding the runtime, the graph's shared object and its plan (made once, copied per test)."""
    cache = tmp_path_factory.mktemp("warm") / "cache"
    report, _ = run(cache)
    assert report["ok"] and report["compiles"] == 2 and report["arena"] > 0 and not report["plan_hit"]
    return cache, report


@pytest.fixture
def cache(warm, tmp_path) -> Path:
    dst = tmp_path / "cache"
    shutil.copytree(warm[0], dst)
    return dst


def _graph_object(cache: Path, warm) -> Path:
    return cache / Path(warm[1]["library"]).name


def _plan(cache: Path) -> Path:
    (entry,) = (cache / "plans").glob("*.json")
    return entry


def test_a_warm_copy_is_used_without_compiling(cache) -> None:
    report, err = run(cache)
    assert report["ok"] and report["compiles"] == 0 and report["plan_hit"]
    assert "discarding" not in err
    for so in cache.glob("*.so"):  # every object was installed with its checksum file
        assert cache_files.verified(so, so.stem) == (True, None)


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _zero(data: bytes) -> bytes:
    return bytes(len(data))


def _scribble(data: bytes) -> bytes:
    mid = len(data) // 2
    return data[:mid] + os.urandom(256) + data[mid + 256:]


def _zero_block(data: bytes) -> bytes:
    """A zeroed 4 KiB block a quarter into the file (the length is kept)."""
    start = len(data) // 4
    return data[:start] + bytes(4096) + data[start + 4096:]


DAMAGE = {"truncated": _truncate, "zeroed": _zero, "random bytes in the middle": _scribble,
          "zeroed block": _zero_block}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_a_damaged_graph_object_is_rebuilt(cache, warm, damage) -> None:
    so = _graph_object(cache, warm)
    data = so.read_bytes()
    assert DAMAGE[damage](data) != data
    with open(so, "r+b") as f:  # in place, as a crash or a full disk would leave it
        f.write(DAMAGE[damage](data))
        f.truncate()
    report, err = run(cache)
    assert report["ok"], report
    assert report["compiles"] == 1, "the damaged object was not rebuilt (or more than it was)"
    assert "discarding the cached shared object" in err and so.name in err
    assert cache_files.verified(so, so.stem) == (True, None)
    again, err = run(cache)
    assert again["ok"] and again["compiles"] == 0 and "discarding" not in err


def test_a_damaged_runtime_object_is_rebuilt(cache, warm) -> None:
    (runtime,) = [p for p in cache.glob("*.so") if p.name != Path(warm[1]["library"]).name]
    runtime.write_bytes(_truncate(runtime.read_bytes()))
    report, err = run(cache)
    assert report["ok"] and report["compiles"] == 1 and "discarding" in err


def test_an_object_without_its_checksum_file_is_rebuilt_not_loaded(cache, warm) -> None:
    """An entry from before checksums (or one whose checksum file was lost) is never trusted."""
    so = _graph_object(cache, warm)
    cache_files.checksum_path(so).unlink()
    so.write_bytes(b"\0" * 100)  # loading this would crash: the run proves it was not loaded
    report, _ = run(cache)
    assert report["ok"] and report["compiles"] == 1


def test_a_checksum_file_of_another_entry_is_refused(cache, warm) -> None:
    so = _graph_object(cache, warm)
    (runtime,) = [p for p in cache.glob("*.so") if p != so]
    shutil.copyfile(runtime, so)
    shutil.copyfile(cache_files.checksum_path(runtime), cache_files.checksum_path(so))
    report, err = run(cache)
    assert report["ok"] and report["compiles"] == 1 and "another entry" in err


def _edit_plan(cache: Path, edit, recompute: bool) -> None:
    path = _plan(cache)
    entry = json.loads(path.read_text())
    edit(entry["table"])
    if recompute:  # as a deliberate edit would: the checksum alone cannot catch it
        entry["sha256"] = plan_cache.checksum(entry["key"], entry["table"], entry["source"])
    path.write_text(json.dumps(entry))


def _arena_zero(t) -> None:
    t["arena_bytes"] = 0


def _arena_tiny(t) -> None:
    t["arena_bytes"] = 16


def _swap_inputs(t) -> None:
    t["inputs"] = t["inputs"][::-1]


def _swap_outputs(t) -> None:
    a, b = t["outputs"][0][1], t["outputs"][1][1]
    t["outputs"][0][1], t["outputs"][1][1] = b, a


def _negative_arena(t) -> None:
    t["arena_bytes"] = -5


EDITS = {"arena size 0": (_arena_zero, False), "arena size 16": (_arena_tiny, False),
         "swapped input slots": (_swap_inputs, False), "swapped output slots": (_swap_outputs, False),
         "swapped input slots, checksum recomputed": (_swap_inputs, True),
         "negative arena, checksum recomputed": (_negative_arena, True)}


@pytest.mark.parametrize("edit", list(EDITS), ids=list(EDITS))
def test_an_edited_plan_is_discarded_and_rebuilt(cache, edit) -> None:
    fn, recompute = EDITS[edit]
    _edit_plan(cache, fn, recompute)
    report, err = run(cache)
    assert report["ok"], report
    assert not report["plan_hit"] and "discarding the cached plan" in err
    again, err = run(cache)  # rewritten: a hit again
    assert again["ok"] and again["plan_hit"] and "discarding" not in err


@pytest.mark.parametrize("damage", ["truncated", "zeroed", "random bytes in the middle"])
def test_a_damaged_plan_file_is_discarded_and_rebuilt(cache, damage) -> None:
    path = _plan(cache)
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    report, err = run(cache)
    assert report["ok"] and not report["plan_hit"] and "discarding the cached plan" in err


def test_a_plan_of_another_key_is_refused(cache, warm) -> None:
    path = _plan(cache)
    entry = json.loads(path.read_text())
    entry["key"] = "0" * 40
    entry["sha256"] = plan_cache.checksum(entry["key"], entry["table"], entry["source"])
    path.write_text(json.dumps(entry))
    report, err = run(cache)
    assert report["ok"] and not report["plan_hit"] and "another key" in err


def test_a_file_in_place_of_the_cache_directory(tmp_path) -> None:
    blocker = tmp_path / "cache"
    blocker.write_text("not a directory")
    report, err = run(blocker)
    assert report["ok"]
    assert str(blocker) in err and "cannot be used" in err
    assert blocker.read_text() == "not a directory"


def test_a_file_in_place_of_the_plans_directory(cache) -> None:
    shutil.rmtree(cache / "plans")
    (cache / "plans").write_text("x")
    report, err = run(cache)
    assert report["ok"] and report["compiles"] == 0  # the shared objects are still used
    assert "plans" in err and "cannot be used" in err


def test_a_cache_under_a_file(tmp_path) -> None:
    (tmp_path / "f").write_text("x")
    report, err = run(tmp_path / "f" / "cache")
    assert report["ok"] and "cannot be used" in err


def test_a_read_only_cache_directory(warm) -> None:
    if os.geteuid() == 0:  # root writes through permission bits; /sys refuses even root
        if not os.path.isdir("/sys"):
            pytest.skip("running as root without /sys: no directory root cannot write")
        report, err = run("/sys")
        assert report["ok"] and "not writable" in err and "/sys" in err
        return
    top = Path(tempfile.mkdtemp(prefix="ls-readonly-"))
    try:
        cache = top / "cache"
        shutil.copytree(warm[0], cache)
        for p in [cache, *cache.rglob("*")]:
            p.chmod(0o555 if p.is_dir() else 0o444)
        report, err = run(cache)
        assert report["ok"] and "not writable" in err and str(cache) in err
    finally:
        for p in [top, *top.rglob("*")]:
            p.chmod(0o755)
        shutil.rmtree(top, ignore_errors=True)


def test_stale_temporary_files_are_removed_on_the_next_compile(cache, warm) -> None:
    key = "ab" * 20
    old = [cache / f".{key}.k1ll3d_1.c", cache / f".{key}.k1ll3d_1.so", cache / "plans" / f".{key}.x9z.tmp"]
    fresh = cache / f".{key}.running.c"  # a compile still in progress in another process
    other = cache / ".keep-me"  # not named like Lightspeed's temporary files
    for p in [*old, fresh, other]:
        p.write_text("partial")
    hours_ago = time.time() - 2 * 3600
    for p in [*old, other]:
        os.utime(p, (hours_ago, hours_ago))
    _graph_object(cache, warm).unlink()  # misses: the object is compiled and the plan stored again
    _plan(cache).unlink()
    report, _ = run(cache)
    assert report["ok"] and report["compiles"] == 1 and not report["plan_hit"]
    assert not any(p.exists() for p in old)
    assert fresh.exists() and other.exists()
