"""Finding an OpenCL device through pyopencl, with PoCL (OpenCL on the CPU) configured first.

PoCL reads its settings from the process environment when the OpenCL platform layer initialises (the
first ``pyopencl.get_platforms()``), so ``configure_pocl`` runs before pyopencl is imported here:

- ``POCL_CACHE_DIR``: PoCL caches every kernel it compiles on disk; the cache goes inside Lightspeed's
  cache directory (``$LIGHTSPEED_CACHE_DIR`` or ``~/.cache/lightspeed``, resolved as backend/c does),
  under ``pocl/``, instead of PoCL's default under ``~/.cache/pocl``.
- ``POCL_KERNELLIB_NAME``: PoCL otherwise compiles for the CPU it runs on (``-target-cpu skylake-avx512``),
  and a cached build may meet another CPU (a shared cache directory, a container moved between hosts).
  On x86-64 it is pinned to the generic ``sse2`` kernel library (LLVM target ``athlon64``, the x86-64
  baseline). PoCL 3.1 as Debian builds it ignores ``POCL_LLVM_CPU_NAME``; ``POCL_KERNELLIB_NAME``
  selects both the kernel library and the target CPU.
- ``POCL_DEVICES``: ``pthread`` (PoCL's multithreaded CPU device) unless set.

A value the user already set is kept (``setdefault``); these are PoCL's own settings, not Lightspeed's.
"""
from __future__ import annotations

import os
import platform
from functools import lru_cache

POCL_CPU_KERNELLIB = "sse2"  # generic x86-64 (see above)


class OpenCLUnavailableError(RuntimeError):
    """pyopencl is not installed, or no OpenCL platform or device was found."""


def configure_pocl() -> None:
    """Set PoCL's cache directory, CPU target and device in the environment (before OpenCL initialises)."""
    from ..c.cache_files import cache_subdir
    os.environ.setdefault("POCL_CACHE_DIR", str(cache_subdir("pocl")))
    if platform.machine() in ("x86_64", "AMD64"):
        os.environ.setdefault("POCL_KERNELLIB_NAME", POCL_CPU_KERNELLIB)
    os.environ.setdefault("POCL_DEVICES", "pthread")


@lru_cache(maxsize=None)
def _devices() -> tuple:
    configure_pocl()
    try:
        import pyopencl as cl
    except ImportError as e:
        raise OpenCLUnavailableError(f"the OpenCL backend needs pyopencl (pip install pyopencl): {e}") from None
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:  # no ICD loader configuration, no platform
        raise OpenCLUnavailableError(
            "no OpenCL platform found (on a CPU-only Debian machine: apt-get install pocl-opencl-icd "
            f"ocl-icd-libopencl1): {e}") from None
    found = []
    for p in platforms:
        try:
            found += p.get_devices()
        except cl.Error:  # a platform without devices of any type
            continue
    if not found:
        raise OpenCLUnavailableError(f"OpenCL platforms {[p.name for p in platforms]} have no devices")
    return tuple(found)


def find_device(index: int = 0):
    """The ``index``-th OpenCL device over all platforms (raises OpenCLUnavailableError when none)."""
    devices = _devices()
    if not 0 <= index < len(devices):
        raise OpenCLUnavailableError(f"OpenCL device {index} requested, {len(devices)} found")
    return devices[index]


def unavailable_reason() -> str | None:
    """Why OpenCL cannot run here, or None when a device was found (for tests that skip)."""
    try:
        find_device()
    except OpenCLUnavailableError as e:
        return str(e)
    return None
