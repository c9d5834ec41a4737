"""The machine's streaming read bandwidth, measured by ``probe.c`` (compiled on first use with the
C backend's compiler and cache, loaded with ctypes)."""
from __future__ import annotations

import ctypes
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class Bandwidth:
    """Read bandwidth of a ``bytes``-sized buffer with ``threads`` threads over ``reps`` passes."""

    bytes: int
    threads: int
    seconds: tuple[float, ...]

    @property
    def best_gb_per_s(self) -> float:
        return self.bytes / min(self.seconds) / 1e9

    @property
    def median_gb_per_s(self) -> float:
        return self.bytes / statistics.median(self.seconds) / 1e9


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    from ..backend.c.compiler import compile_shared, default_flags
    source = Path(__file__).with_name("probe.c").read_text()
    path = compile_shared(source, default_flags(), extra_libs=["-pthread"])
    lib = ctypes.CDLL(str(path))
    lib.ls_probe_read.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    lib.ls_probe_read.restype = ctypes.c_int
    return lib


def measure_read_bandwidth(n_bytes: int, threads: int, reps: int = 5) -> Bandwidth:
    """Time ``reps`` passes of ``threads`` threads summing a buffer of ``n_bytes`` (allocated, on huge
    pages where the kernel grants them, and freed by the probe)."""
    if n_bytes < 1 or threads < 1 or reps < 1:
        raise ValueError(f"measure_read_bandwidth: bytes ({n_bytes}), threads ({threads}) and reps ({reps}) "
                         f"must be positive")
    times = (ctypes.c_double * reps)()
    rc = _library().ls_probe_read(n_bytes, threads, reps, times)
    if rc == -1:
        raise MemoryError(f"bandwidth probe: cannot allocate {n_bytes} bytes")
    if rc != 0:
        raise RuntimeError(f"bandwidth probe: cannot start {threads} threads")
    return Bandwidth(n_bytes, threads, tuple(float(t) for t in times))
