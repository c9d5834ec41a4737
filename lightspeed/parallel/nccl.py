"""Which collective library a parallel run uses, and the NCCL communicator of the CUDA backend.

``collective_backend(backend)``: the CUDA backend's ranks talk through NCCL (``torch.distributed`` backend
"nccl", one GPU per local rank); every other backend's through gloo, or the shared-memory all-reduce for ranks
on one host. ``join_backend_group`` joins the group on the library chosen. A torch build without NCCL (the
CPU wheels) or a machine without a CUDA device gets a ``CollectiveError`` saying so before any rank waits.

``NcclCommunicator`` keeps the ``Communicator`` interface (numpy arrays in, summed in place): each call copies
the array to the rank's device, runs the collective there and copies the result back. The CUDA backend's
step programs take and return host arrays, so the copies are where its segments meet.
"""
from __future__ import annotations

import os

import numpy as np

from .comm import DEFAULT_TIMEOUT_S, CollectiveError, GlooCommunicator, group_address, join_group

__all__ = ["NcclCommunicator", "collective_backend", "join_backend_group", "NCCL_BACKENDS"]

NCCL_BACKENDS = ("cuda",)  # compile backends whose ranks use NCCL


def collective_backend(backend: str) -> str:
    """The ``torch.distributed`` backend of ranks compiled for ``backend``: "nccl" for CUDA, else "gloo"."""
    return "nccl" if backend in NCCL_BACKENDS else "gloo"


class NcclCommunicator(GlooCommunicator):
    """``torch.distributed`` with NCCL: rank ``LOCAL_RANK`` uses CUDA device ``LOCAL_RANK`` (modulo the count)."""

    BACKEND = "nccl"

    def __init__(self, rank: int, world: int, init_method: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 local_rank: int | None = None, device=None):
        try:
            import torch
        except ImportError:
            raise CollectiveError("NCCL collectives need torch with CUDA (a CUDA build of torch)") from None
        self.require_backend(torch, torch.distributed)
        if device is None:  # the rank's own GPU (``device`` is given by tests of the copies on another device)
            local = rank if local_rank is None else local_rank
            device = torch.device("cuda", local % torch.cuda.device_count())
            torch.cuda.set_device(device)
        self.device = device
        super().__init__(rank, world, init_method, timeout_s)

    @staticmethod
    def require_backend(torch, dist) -> None:
        if not dist.is_available() or not dist.is_nccl_available():
            raise CollectiveError(f"--backend cuda runs its collectives on NCCL, but this torch build "
                                  f"({torch.__version__}) has no NCCL (a CPU wheel): install a CUDA build of torch, "
                                  "or run the ranks with --backend c (gloo)")
        if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
            raise CollectiveError("--backend cuda runs its collectives on NCCL, but torch sees no CUDA device here")

    @classmethod
    def from_env(cls, world: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 option: str = "--tensor-parallel") -> "NcclCommunicator":
        rank, size, init_method = group_address(world, option)
        return cls(rank, size, init_method, timeout_s, int(os.environ.get("LOCAL_RANK", rank)))

    def _on_device(self, a: np.ndarray):
        return self.torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def all_reduce(self, a: np.ndarray) -> None:
        if not (a.flags.c_contiguous and a.flags.writeable):
            raise ValueError("all_reduce: the array must be C-contiguous and writable (it is summed in place)")
        t = self._on_device(a)
        self._timed("all_reduce", lambda: self.dist.all_reduce(t))
        a[...] = t.cpu().numpy()

    def broadcast(self, a: np.ndarray, src: int = 0) -> None:
        t = self._on_device(a)
        self._timed("broadcast", lambda: self.dist.broadcast(t, src))
        a[...] = t.cpu().numpy()


def join_backend_group(backend: str, world: int, max_bytes: int = 0, option: str = "--tensor-parallel",
                       timeout_s: float = DEFAULT_TIMEOUT_S) -> GlooCommunicator:
    """This process's communicator for ranks compiled for ``backend`` (see ``collective_backend``): NCCL for
    CUDA; else, with ``max_bytes`` (the largest all-reduce), ``join_group``'s shared-memory or gloo choice;
    else gloo. ``option`` names the flag in messages."""
    if collective_backend(backend) == "nccl":
        return NcclCommunicator.from_env(world, timeout_s, option)
    if max_bytes > 0:
        return join_group(world=world, max_bytes=max_bytes, timeout_s=timeout_s)
    return GlooCommunicator.from_env(world, timeout_s, option)
