"""The precompiled system headers of generated C sources (backend/c/pch.py): built once per compiler and flags
in the cache directory, valid for gcc (it would say so with -Winvalid-pch), the same results, and never the
reason a build fails (a damaged .gch, a source error)."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.backend.c import cache_files
from lightspeed.backend.c.compiler import CompilerError, compile_shared, compiler_identity, default_flags, \
    find_compiler

pytestmark = pytest.mark.skipif("clang" in compiler_identity(find_compiler()).lower(),
                                reason="the precompiled header is gcc's (clang builds without it)")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))
    return tmp_path


def _program(scale: float):
    g = ls.Graph()
    x = g.input("x", (37,))
    return g.compile([(x * scale + 1.0).exp()], backend="c", plan_cache=False)


def test_built_once_valid_and_the_same_results(cache: Path) -> None:
    xv = np.linspace(-2, 2, 37, dtype=np.float32)
    for scale in (0.5, 1.5):
        np.testing.assert_allclose(_program(scale)(x=xv)[0], np.exp(xv * scale + 1.0), rtol=1e-6)
    headers, gchs = sorted(cache.glob("pch-*.h")), sorted(cache.glob("pch-*.h.gch"))
    assert len(headers) == 1 and len(gchs) == 1 and gchs[0].name == headers[0].name + ".gch"
    # gcc takes it (an invalid one would be an error here, not a silent fallback)
    src = cache / "probe.c"
    src.write_text("#include <immintrin.h>\nint probe(int v) { return v + 1; }\n")
    flags = [f for f in default_flags() if f != "-w"]
    cmd = find_compiler().split() + flags + ["-Winvalid-pch", "-Werror=invalid-pch", "-include", str(headers[0]),
                                             str(src), "-o", str(cache / "probe.so")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_damaged_header_never_fails_a_build(cache: Path) -> None:
    xv = np.linspace(-1, 1, 37, dtype=np.float32)
    _program(2.0)
    (gch,) = cache.glob("pch-*.h.gch")
    gch.write_bytes(gch.read_bytes()[:4096])  # truncated: gcc fails with it
    np.testing.assert_allclose(_program(3.0)(x=xv)[0], np.exp(xv * 3.0 + 1.0), rtol=1e-6)
    assert not gch.exists()  # removed after the build passed without it ...
    _program(5.0)
    assert gch.stat().st_size > 1 << 20  # ... and built again by the next compile
    gch.write_bytes(b"not a precompiled header")
    np.testing.assert_allclose(_program(4.0)(x=xv)[0], np.exp(xv * 4.0 + 1.0), rtol=1e-6)


def test_source_errors_still_fail_and_other_flags_build_none(cache: Path) -> None:
    with pytest.raises(CompilerError, match="compilation failed"):
        compile_shared("int broken(void) { return missing_name; }\n")
    assert len(list(cache.glob("pch-*.h.gch"))) == 1  # the default flags' header, built for that attempt
    compile_shared("int fine(void) { return 1; }\n", flags=default_flags() + ["-DLS_SOMETHING_ELSE"])
    assert len(list(cache.glob("pch-*.h.gch"))) == 1


def test_a_killed_header_build_leaves_nothing_for_long(cache: Path) -> None:
    """A .gch being built has a temporary name like every cache file's; one left by a killed build (an hour
    old) is swept like the others."""
    _program(1.0)
    (header,) = cache.glob("pch-*.h")
    key = header.name[len("pch-"):-len(".h")]
    fd, tmp = cache_files.temp_file(cache, key, ".gch")
    os.close(fd)
    old = time.time() - 2 * cache_files.STALE_TEMP_S
    os.utime(tmp, (old, old))
    assert cache_files.remove_stale_temps(cache) == 1 and not os.path.exists(tmp)
