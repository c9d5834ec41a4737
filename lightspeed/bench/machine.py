"""Facts about the machine a benchmark runs on, and the process's resident memory."""
from __future__ import annotations

import os
import platform
import resource
import subprocess
from pathlib import Path

# CPU features that decide which kernels and peers' builds can run fast
FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_name() -> str:
    """The CPU model name (``/proc/cpuinfo``), or what ``platform`` knows."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_features() -> list[str]:
    """Which of ``FEATURES`` the CPU reports."""
    flags = set(_cpuinfo().get("flags", "").split())
    return [f for f in FEATURES if f in flags]


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def source_revision() -> str | None:
    """The git commit of the Lightspeed source that runs (with ``+dirty`` when ``lightspeed/`` has
    uncommitted changes), or None outside a git checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uno", "--", "lightspeed"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine_summary() -> dict:
    return {"cpu": cpu_name(), "features": cpu_features(), "cores": available_cores(),
            "platform": platform.platform()}


class PeakRSS:
    """The process's peak resident memory over a stretch of code.

    Linux keeps the high-water mark ``VmHWM`` and lets a process reset it to the current
    resident size (write ``5`` to ``/proc/self/clear_refs``), so a peak can be measured for
    one phase even after an earlier phase (the bandwidth probe's buffer, a peer engine)
    held more. Elsewhere this falls back to ``getrusage``'s lifetime peak (``resettable``
    is then False)."""

    def __init__(self) -> None:
        self.resettable = self.reset()

    def reset(self) -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def current_bytes(self) -> int:
        """Resident bytes now (0 where ``/proc/self/statm`` is missing)."""
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0

    def peak_bytes(self) -> int:
        if self.resettable:
            try:
                with open("/proc/self/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            return int(line.split()[1]) * 1024
            except (OSError, ValueError, IndexError):
                pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
