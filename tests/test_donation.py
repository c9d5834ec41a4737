"""Donated inputs (updated in place by native code) must be writable, C-contiguous and aligned: anything
else is refused with a ValueError naming the input before native code runs. The cases run in one
subprocess, since native code writing a read-only mapping would kill the interpreter."""
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
from lightspeed.runtime import check_donated

REPO = Path(__file__).resolve().parent.parent

# Every case passes one "cache" array to a program that donates it (Scatter writes rows in place) and
# reports the error message, or whether the result is right and was written into the caller's array.
SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import lightspeed as ls
    from lightspeed.frontend import arange

    g = ls.Graph()
    pos = ls.dim("pos", 0, 14)
    cache = g.input("cache", (16, 4), ls.float32)
    x = g.input("x", (2, 4), ls.float32)
    rows = arange(g, pos, ls.symbolic.add(pos, 2))
    updated = cache.scatter(rows, x * 2.0)
    prog = g.compile([updated], backend=sys.argv[2], donate=["cache"])
    tmp = sys.argv[1]
    xv = np.arange(8, dtype=np.float32).reshape(2, 4)
    base = np.arange(64, dtype=np.float32).reshape(16, 4)
    base.tofile(f"{tmp}/cache.bin")
    want = base.copy()
    want[3:5] = xv * 2

    def readonly_view():
        v = base.copy().view()
        v.flags.writeable = False
        return v

    def misaligned():
        buf = bytearray(base.nbytes + 1)
        a = np.frombuffer(buf, dtype=np.float32, offset=1, count=64).reshape(16, 4)
        a[...] = base
        return a

    def made_read_only_after_a_call():
        a = base.copy()
        prog(dims={"pos": 0}, cache=a, x=xv)  # accepted once (the C backend remembers its address)
        a[...] = base
        a.flags.writeable = False
        return a

    cases = {
        "memmap r": lambda: np.memmap(f"{tmp}/cache.bin", dtype=np.float32, mode="r", shape=(16, 4)),
        "frombuffer bytes": lambda: np.frombuffer(base.tobytes(), dtype=np.float32).reshape(16, 4),
        "read-only view": readonly_view,
        "broadcast": lambda: np.broadcast_to(base[:1], (16, 4)),
        "not contiguous": lambda: np.repeat(base, 2, axis=1)[:, ::2],
        "fortran order": lambda: np.asfortranarray(base),
        "misaligned": misaligned,
        "read-only after a call": made_read_only_after_a_call,
        "memmap r+": lambda: np.memmap(f"{tmp}/cache.bin", dtype=np.float32, mode="r+", shape=(16, 4)),
        "frombuffer bytearray": lambda: np.frombuffer(bytearray(base.tobytes()), dtype=np.float32).reshape(16, 4),
        "plain": lambda: base.copy(),
    }
    report = {}
    for name, make in cases.items():
        for call in ("call", "run"):
            base.tofile(f"{tmp}/cache.bin")
            a = make()
            before = np.array(a)
            try:
                if call == "call":
                    (got,) = prog(dims={"pos": 3}, cache=a, x=xv)
                else:
                    (got,) = prog.run({"cache": a, "x": xv}, dims={"pos": 3})
            except ValueError as e:
                report[f"{name}/{call}"] = {"error": str(e), "unchanged": bool(np.array_equal(a, before))}
                continue
            report[f"{name}/{call}"] = {"error": None, "right": bool(np.array_equal(got, want)),
                                        "in_place": got is a or (sys.argv[2] != "c")}
    print(json.dumps(report))
""")

REFUSED = {"memmap r": "read-only", "frombuffer bytes": "read-only", "read-only view": "read-only",
           "broadcast": "read-only", "not contiguous": "C-contiguous", "fortran order": "C-contiguous",
           "misaligned": "aligned", "read-only after a call": "read-only"}
ACCEPTED = ["memmap r+", "frombuffer bytearray", "plain"]


@pytest.fixture(scope="module", params=["c", "reference"])
def report(request, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("donation")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               LIGHTSPEED_CACHE_DIR=str(tmp_path_factory.getbasetemp() / "ls_cache_donation"))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp), request.param], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0, f"exit {proc.returncode} (a crash means native code ran):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("call", ["call", "run"])
@pytest.mark.parametrize("case", list(REFUSED))
def test_unsuitable_donated_inputs_are_refused_by_name(report, case, call) -> None:
    got = report[f"{case}/{call}"]
    assert got["error"] is not None, f"{case} was accepted"
    assert "'cache'" in got["error"] and "donated" in got["error"] and REFUSED[case] in got["error"], got
    assert got["unchanged"]


@pytest.mark.parametrize("call", ["call", "run"])
@pytest.mark.parametrize("case", ACCEPTED)
def test_writable_donated_inputs_are_updated_in_place(report, case, call) -> None:
    got = report[f"{case}/{call}"]
    assert got["error"] is None, got["error"]
    assert got["right"] and got["in_place"]


def test_read_only_inputs_that_are_not_donated_are_fine() -> None:
    g = ls.Graph()
    x = g.input("x", (4,), ls.float32)
    prog = g.compile([x * 2.0], backend="reference")
    ro = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), dtype=np.float32)
    np.testing.assert_array_equal(prog(x=ro)[0], np.arange(4) * 2.0)


def test_check_donated_accepts_exactly_writable_contiguous_aligned_arrays() -> None:
    """The fast path tests numpy's flag bits; this ties them to the flags the detailed check reads."""
    from lightspeed import runtime
    samples = [np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32)[:, ::2],
               np.frombuffer(bytes(16), np.float32), np.frombuffer(bytearray(17), np.float32, count=4, offset=1)]
    for a in samples:
        fast_ok = a.flags.num & runtime.DONATABLE_FLAGS == runtime.DONATABLE_FLAGS
        try:
            check_donated("a", a)
            ok = True
        except ValueError:
            ok = False
        assert fast_ok == ok == (a.flags.writeable and a.flags.c_contiguous and a.flags.aligned)
