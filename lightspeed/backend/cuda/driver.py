"""The CUDA driver API (``cuda.bindings.driver``): a context, a loaded module, device memory, launches.

Every call's status is checked and turned into a ``CudaError`` naming the call and the CUDA error; a
machine without the NVIDIA driver library or without a device raises ``CudaUnavailableError`` saying
which, before anything touches device memory.
"""
from __future__ import annotations

import numpy as np


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


class CudaUnavailableError(CudaError):
    """No NVIDIA driver library, or no CUDA device, on this machine."""


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise CudaUnavailableError(f"running CUDA kernels needs cuda-bindings (pip install cuda-bindings): {e}") \
            from None
    return driver


def check(cu, result, what: str):
    """The value(s) of a driver call's result tuple; raises CudaError unless its status is success."""
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        name = cu.cuGetErrorName(err)
        raise CudaError(f"{what} failed: {name[1].decode() if name[0] == cu.CUresult.CUDA_SUCCESS else err}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


class Device:
    """The primary context of CUDA device ``index``, current on this thread."""

    def __init__(self, index: int = 0):
        cu = _driver()
        try:
            err = cu.cuInit(0)[0]
        except Exception as e:  # cuda.pathfinder's DynamicLibNotFoundError: no libcuda.so
            raise CudaUnavailableError(f"no NVIDIA driver: the CUDA driver library (libcuda.so) was not found "
                                       f"({type(e).__name__}: {e})") from None
        if err != cu.CUresult.CUDA_SUCCESS:
            raise CudaUnavailableError(f"the CUDA driver did not initialise (cuInit: {err}); is a GPU present?")
        count = check(cu, cu.cuDeviceGetCount(), "cuDeviceGetCount")
        if not 0 <= index < count:
            raise CudaUnavailableError(f"CUDA device {index} requested, {count} found")
        self.cu = cu
        self.device = check(cu, cu.cuDeviceGet(index), "cuDeviceGet")
        self.context = check(cu, cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        check(cu, cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self.stream = check(cu, cu.cuStreamCreate(0), "cuStreamCreate")

    def arch(self) -> str:
        """The device's architecture as NVRTC names it ("sm_90")."""
        cu = self.cu
        a = cu.CUdevice_attribute
        major = check(cu, cu.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device),
                      "cuDeviceGetAttribute")
        minor = check(cu, cu.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device),
                      "cuDeviceGetAttribute")
        return f"sm_{major}{minor}"

    def name(self) -> str:
        """The device's name ("NVIDIA H200")."""
        raw = check(self.cu, self.cu.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        return raw.split(b"\x00", 1)[0].decode(errors="replace")

    def total_memory(self) -> int:
        """The device's memory in bytes."""
        return int(check(self.cu, self.cu.cuDeviceTotalMem(self.device), "cuDeviceTotalMem"))

    def current(self) -> None:
        check(self.cu, self.cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def load(self, cubin: bytes):
        """A module from a cubin (kept alive by the caller)."""
        image = np.frombuffer(cubin, dtype=np.uint8).copy()
        return check(self.cu, self.cu.cuModuleLoadData(image.ctypes.data), "cuModuleLoadData")

    def function(self, module, name: str):
        return check(self.cu, self.cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")

    def alloc(self, nbytes: int):
        return check(self.cu, self.cu.cuMemAlloc(max(int(nbytes), 1)), "cuMemAlloc")

    def upload(self, dst, a: np.ndarray) -> None:
        if a.nbytes:
            check(self.cu, self.cu.cuMemcpyHtoDAsync(dst, a.ctypes.data, a.nbytes, self.stream), "cuMemcpyHtoDAsync")

    def download(self, a: np.ndarray, src) -> None:
        if a.nbytes:
            check(self.cu, self.cu.cuMemcpyDtoHAsync(a.ctypes.data, src, a.nbytes, self.stream), "cuMemcpyDtoHAsync")

    def launch(self, fn, blocks: int, threads: int, args: np.ndarray) -> None:
        """Launch ``fn`` on a 1-D grid; ``args`` holds the addresses of the argument values (uint64)."""
        check(self.cu, self.cu.cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, self.stream, args.ctypes.data, 0),
              "cuLaunchKernel")

    def synchronize(self) -> None:
        check(self.cu, self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def begin_capture(self) -> None:
        """Record the stream's work from here as a CUDA graph (stream capture)."""
        mode = self.cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(self.cu, self.cu.cuStreamBeginCapture(self.stream, mode), "cuStreamBeginCapture")

    def end_capture(self):
        """The captured graph, instantiated (a CUgraphExec, with its graph kept alive beside it)."""
        graph = check(self.cu, self.cu.cuStreamEndCapture(self.stream), "cuStreamEndCapture")
        return check(self.cu, self.cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate"), graph

    def graph_launch(self, recording) -> None:
        check(self.cu, self.cu.cuGraphLaunch(recording[0], self.stream), "cuGraphLaunch")
