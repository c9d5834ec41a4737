"""The CPU's feature flags (Linux /proc/cpuinfo), for tests of kernels that have SIMD paths."""
from __future__ import annotations


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line.split() for line in f if line.startswith("flags")), []))
    except OSError:
        return set()


def has_flags(*wanted: str, without: tuple[str, ...] = ()) -> bool:
    """Whether the CPU has every flag in ``wanted`` and none in ``without``."""
    flags = cpu_flags()
    return all(f in flags for f in wanted) and not any(f in flags for f in without)
