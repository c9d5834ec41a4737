"""Device memory bandwidth, measured with a copy kernel of our own (the limit decode is compared against).

``dst[i] = src[i]`` over 16-byte vectors, one work item each: every byte of ``src`` is read once and every
byte of ``dst`` written once, so a pass moves ``2 * nbytes``; the best of ``reps`` timed passes (after one
untimed warm-up) gives the bandwidth. The same kernel text serves both dialects (``float4`` is a vector in
OpenCL C and a struct in CUDA C; both copy by assignment), run through the ``GpuDevice`` interface.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .dialect import CUDA, OPENCL, Dialect
from .executor import GpuDevice

COPY_FUNCTION = "ls_probe_copy"
BLOCK = 256


def copy_kernel_source(dialect: Dialect) -> str:
    """The probe's copy kernel with ``dialect``'s prelude (arguments as the renderer's kernels take them)."""
    return dialect.prelude() + f"""
LS_KERNEL {COPY_FUNCTION}(LS_GLOBAL ls_u8 *p0, const ls_i64 o0, LS_GLOBAL const ls_u8 *p1, const ls_i64 o1,
                          const ls_i64 n_items) {{
    const ls_i64 gid = LS_GLOBAL_ID;
    if (gid >= n_items) return;
    ((LS_GLOBAL float4 *)(p0 + o0))[gid] = ((LS_GLOBAL const float4 *)(p1 + o1))[gid];
}}
"""


@dataclass(frozen=True)
class DeviceBandwidth:
    """Copy passes over ``nbytes`` (read ``nbytes`` and write ``nbytes`` each) and their times."""

    nbytes: int
    seconds: tuple[float, ...]

    @property
    def best_gb_per_s(self) -> float:
        """Bytes moved (read + written) per second by the fastest pass, in GB/s (1e9)."""
        return 2 * self.nbytes / min(self.seconds) / 1e9

    def as_dict(self) -> dict:
        return {"bytes": self.nbytes, "passes": len(self.seconds), "seconds": list(self.seconds),
                "best_gb_per_s": self.best_gb_per_s, "kernel": "copy (read + write), 16-byte vectors"}


def measure_copy_bandwidth(device: GpuDevice, nbytes: int, reps: int = 10) -> DeviceBandwidth:
    """Time ``reps`` copy passes of ``nbytes`` (rounded down to 16 bytes) on ``device``, whose program
    holds ``copy_kernel_source``'s kernel."""
    n = int(nbytes) // 16
    if n < 1 or reps < 1:
        raise ValueError(f"bandwidth probe: bytes ({nbytes}) must be >= 16 and reps ({reps}) >= 1")
    src, dst = device.alloc(16 * n), device.alloc(16 * n)
    kernel = device.prepare(COPY_FUNCTION, [(dst, 0), (src, 0)], 1)
    groups = (n + BLOCK - 1) // BLOCK
    device.launch(kernel, [n], groups, BLOCK)  # warm-up: first touch, lazy loading
    device.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        device.launch(kernel, [n], groups, BLOCK)
        device.synchronize()
        times.append(time.perf_counter() - t0)
    return DeviceBandwidth(16 * n, tuple(times))


def cuda_copy_cubin(arch: str) -> bytes:
    """The probe kernel compiled by NVRTC for ``arch`` (no GPU needed)."""
    from ..cuda.nvrtc import compile_cubin
    return compile_cubin(copy_kernel_source(CUDA), arch, name="ls_probe_copy.cu")


def cuda_bandwidth(nbytes: int = 1 << 30, reps: int = 10, device: int = 0) -> DeviceBandwidth:
    """Copy bandwidth of CUDA device ``device`` (raises CudaUnavailableError without one)."""
    from ..cuda.driver import Device
    from ..cuda.launch import CudaDevice
    dev = Device(device)
    return measure_copy_bandwidth(CudaDevice(dev, cuda_copy_cubin(dev.arch())), nbytes, reps)


def opencl_bandwidth(nbytes: int = 1 << 28, reps: int = 10, device: int = 0) -> DeviceBandwidth:
    """Copy bandwidth of OpenCL device ``device`` (raises OpenCLUnavailableError without one)."""
    from ..opencl import OpenCLDevice, find_device
    return measure_copy_bandwidth(OpenCLDevice(find_device(device), copy_kernel_source(OPENCL)), nbytes, reps)


def device_bandwidth(backend: str, nbytes: int, reps: int = 10, device: int = 0) -> DeviceBandwidth:
    """Copy bandwidth of the device ``backend`` ("cuda" or "opencl") runs on."""
    if backend == "cuda":
        return cuda_bandwidth(nbytes, reps, device)
    if backend == "opencl":
        return opencl_bandwidth(nbytes, reps, device)
    raise ValueError(f"device bandwidth: backend must be 'cuda' or 'opencl', got {backend!r}")
