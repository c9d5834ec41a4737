"""``GpuDevice`` (backend/gpu/executor.py) of a CUDA device: the driver API's memory and launches for one
loaded cubin."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .driver import Device


class CudaDevice:
    """Device memory, copies on the device's stream, and the kernels of ``cubin`` (loaded once)."""

    def __init__(self, device: Device, cubin: bytes):
        self.device = device
        self.module = device.load(cubin)

    def alloc(self, nbytes: int):
        return self.device.alloc(nbytes)

    def upload(self, dst, a: np.ndarray) -> None:
        self.device.upload(dst, a)

    def download(self, a: np.ndarray, src) -> None:
        self.device.download(a, src)

    def sibling(self, cubin: bytes) -> "CudaDevice":
        """The kernels of another cubin on the same device, stream and memory."""
        return CudaDevice(self.device, cubin)

    def prepare(self, function: str, buffers: Sequence[tuple[Any, int]], n_scalars: int,
                pointers: Sequence[Any] = ()):
        """(function, argument values, their addresses): cuLaunchKernel reads each argument through its
        address and copies it at the launch, so the scalar values are rewritten in place per launch."""
        fn = self.device.function(self.module, function)
        values = []
        for buf, offset in buffers:
            values += [np.array([int(buf)], np.uint64), np.array([offset], np.int64)]
        values += [np.array([int(buf)], np.uint64) for buf in pointers]
        scalars = [np.zeros(1, np.int64) for _ in range(n_scalars)]
        addresses = np.array([v.ctypes.data for v in values + scalars], np.uint64)
        return fn, values, scalars, addresses

    def launch(self, kernel, scalars: Sequence[int], groups: int, block: int) -> None:
        fn, _, slots, addresses = kernel
        for slot, v in zip(slots, scalars):
            slot[0] = v
        self.device.launch(fn, groups, block, addresses)

    def synchronize(self) -> None:
        self.device.synchronize()

    def begin_capture(self) -> None:
        self.device.begin_capture()

    def end_capture(self):
        return self.device.end_capture()

    def replay(self, recording) -> None:
        self.device.graph_launch(recording)
