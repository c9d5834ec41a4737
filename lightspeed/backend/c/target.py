"""The host CPU as a heuristics target (kernel/heuristics.py): vector width, registers, cache sizes."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ...kernel.heuristics import Target


@lru_cache(maxsize=None)
def host_flags() -> frozenset[str]:
    """The feature flags of this machine's CPU as /proc/cpuinfo names them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return frozenset()


def _cache_bytes(level: int, kind: str) -> int | None:
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for idx in root.glob("index*"):
            if int((idx / "level").read_text()) == level and (idx / "type").read_text().strip() in (kind, "Unified"):
                text = (idx / "size").read_text().strip().upper()
                mult = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
                return int(text.rstrip("KM")) * mult
    except (OSError, ValueError):
        return None
    return None


@lru_cache(maxsize=None)
def host_target() -> Target:
    """The machine this process runs on (the C backend compiles with -march=native for it)."""
    flags = host_flags()
    if "avx512f" in flags:
        vb, regs = 64, 32
    elif "avx2" in flags or "avx" in flags:
        vb, regs = 32, 16
    elif "asimd" in flags:  # aarch64 NEON
        vb, regs = 16, 32
    else:
        vb, regs = 16, 16
    default = Target()
    return Target(vector_bytes=vb, vector_registers=regs, l1_bytes=_cache_bytes(1, "Data") or default.l1_bytes,
                  l2_bytes=_cache_bytes(2, "Unified") or default.l2_bytes)
