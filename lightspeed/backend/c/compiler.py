"""Compile C source into shared objects, cached on disk.

Cache entries are keyed by a hash of the source, the compiler and its version, the
flags, the Lightspeed version and the CPU, and written atomically (compile to a
private temporary name, then rename), so concurrent processes compiling the same
graph both succeed and leave one valid entry. Each shared object has a checksum
file, verified before the object is handed out (and so before any ``dlopen``): a
truncated or corrupted entry is rebuilt with a warning (see cache_files.py).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from . import cache_files, pch
from .cache_files import CACHE_ENV, cache_dir  # noqa: F401 - part of this module's interface


class CompilerError(RuntimeError):
    """The C compiler is missing or rejected generated code."""


def find_compiler() -> str:
    """``$CC`` if set, else ``cc`` or ``gcc`` on PATH."""
    cc = os.environ.get("CC")
    if cc:
        if shutil.which(cc.split()[0]) is None:
            raise CompilerError(f"the C compiler named by CC ({cc!r}) was not found on PATH")
        return cc
    for name in ("cc", "gcc"):
        if shutil.which(name):
            return name
    raise CompilerError("no C compiler found: install gcc (e.g. `apt-get install gcc`) or set CC to a C compiler")


@lru_cache(maxsize=None)
def compiler_identity(cc: str) -> str:
    try:
        out = subprocess.run(cc.split() + ["--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else cc
    except (OSError, subprocess.SubprocessError) as e:
        raise CompilerError(f"cannot run the C compiler {cc!r}: {e}") from e


@lru_cache(maxsize=None)
def cpu_signature() -> str:
    """Identifies the CPU for cache keys (model and feature flags)."""
    text = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features")):
                    text += line
                if line.strip() == "":
                    break
    except OSError:
        text += platform.processor()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def default_flags() -> list[str]:
    flags = ["-O3", "-march=native", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math",
             "-fopenmp-simd",
             "-fno-semantic-interposition", "-w"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags.append("-mprefer-vector-width=512")  # gcc prefers 256-bit vectors on these CPUs otherwise
    return flags


def cache_key(source: str, cc: str, flags: list[str]) -> str:
    from ... import __version__
    h = hashlib.sha256()
    for part in (source, cc, compiler_identity(cc), " ".join(flags), __version__, cpu_signature()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def compile_shared(source: str, flags: list[str] | None = None, cc: str | None = None,
                   extra_libs: list[str] | None = None) -> Path:
    """Path of a shared object built from ``source``, from the cache when present; an entry is returned
    only after its checksum was verified (a corrupt one is rebuilt), so the path is safe to ``dlopen``."""
    cc = cc or find_compiler()
    flags = list(flags) if flags is not None else default_flags()
    key = cache_key(source, cc, flags + (extra_libs or []))
    d = cache_dir()
    path = d / f"{key}.so"
    ok, problem = cache_files.verified(path, key)
    if ok:
        return path
    if problem is not None:
        cache_files.warn(f"discarding the cached shared object {path}: {problem}; rebuilding it")
    cache_files.remove_stale_temps(d)
    try:
        # the default flags only: a one-off flag set would spend more on its header (0.5 s) than it saves
        header = (pch.include_args(cc, compiler_identity(cc), flags, d, cache_key(pch.HEADER, cc, flags))
                  if flags == default_flags() else [])
        _build(source, cc, flags, extra_libs or [], d, key, path, header)
    except OSError as e:  # the directory vanished, filled up or became read-only under us
        raise CompilerError(f"cannot write the compiled object into the cache directory {d}: "
                            f"{e.strerror or e}") from None
    return path


def _build(source: str, cc: str, flags: list[str], extra_libs: list[str], d: Path, key: str, path: Path,
           header: list[str]) -> None:
    """Compile ``source`` in ``d`` under a private temporary name, then install it as ``path``. ``header``:
    the precompiled header's arguments (pch.py); a compile that fails with them is tried again without."""
    fd, tmp_c = cache_files.temp_file(d, key, ".c")
    tmp_so = tmp_c[:-2] + ".so"
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        for extra in ([header, []] if header else [[]]):
            cmd = cc.split() + flags + extra + [tmp_c, "-o", tmp_so] + extra_libs
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True)
            except OSError as e:  # not an error of the cache directory (handled by the caller)
                raise CompilerError(f"cannot run the C compiler {cc!r}: {e.strerror or e}") from None
            if proc.returncode == 0:
                if header and not extra:  # it failed with the precompiled header and passed without
                    pch.discard(header)
                break
        if proc.returncode != 0:
            keep = d / f"failed-{key}.c"
            shutil.copyfile(tmp_c, keep)
            raise CompilerError(f"C compilation failed ({' '.join(cmd[:3])} ...); source kept at {keep}:\n"
                                f"{proc.stderr[-4000:]}")
        cache_files.install(tmp_so, path, key)  # atomic, with its checksum file
        source_copy = d / f"{key}.c"
        if not source_copy.exists():
            cache_files.write_atomic(source_copy, key, source.encode())
    finally:
        for p in (tmp_c, tmp_so):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


_RUNTIME: ctypes.CDLL | None = None


def runtime_library() -> ctypes.CDLL:
    """The native runtime (thread pool), loaded once per process with global symbols."""
    global _RUNTIME
    if _RUNTIME is None:
        src = (Path(__file__).with_name("lsrt.c")).read_text()
        flags = ["-O2", "-fPIC", "-shared", "-std=gnu11", "-pthread"]
        path = compile_shared(src, flags)
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        lib.ls_set_num_threads.argtypes = [ctypes.c_int]
        lib.ls_get_num_threads.restype = ctypes.c_int
        lib.ls_set_spin_us.argtypes = [ctypes.c_int64]
        _RUNTIME = lib
    return _RUNTIME


def set_num_threads(n: int) -> None:
    """Threads used by compiled graphs (including the caller); 0 for one per available core."""
    runtime_library().ls_set_num_threads(int(n))


def get_num_threads() -> int:
    return int(runtime_library().ls_get_num_threads())


def set_spin_time(microseconds: int) -> None:
    """How long idle worker threads keep spinning after a call before they sleep."""
    runtime_library().ls_set_spin_us(int(microseconds))
