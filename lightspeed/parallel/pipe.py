"""Point-to-point transfers between pipeline stages: hidden states to the next stage, logits back.

A ``PipeChannel`` sends and receives numpy arrays over the group a ``GlooCommunicator`` formed, with
``torch.distributed``'s point-to-point calls (``isend`` / ``irecv``). Every wait is bounded by ``timeout_s``:
a stage whose neighbour died or hangs gets a ``CollectiveError`` naming the peer instead of waiting forever
(gloo also fails at once when the peer's connection closes). ``seconds`` is the time spent waiting on
transfers — including, on a receiving stage, the time the sender was still computing — and ``calls`` counts
them, so a benchmark can report the send/recv time per token. On an NCCL group (a communicator with a
``device``) the arrays go through that device.
"""
from __future__ import annotations

import datetime
import time

import numpy as np

from .comm import DEFAULT_TIMEOUT_S, CollectiveError, GlooCommunicator

__all__ = ["PipeChannel", "Pending"]


class Pending:
    """A send in flight: the array stays referenced until ``PipeChannel.wait`` has seen it complete."""

    def __init__(self, work, array, peer: int, what: str):
        self.work, self.array, self.peer, self.what = work, array, peer, what


class PipeChannel:
    """Sends and receives between the ranks of ``comm``'s group (see the module docstring)."""

    def __init__(self, comm: GlooCommunicator, timeout_s: float = DEFAULT_TIMEOUT_S):
        if not hasattr(comm, "dist"):
            raise CollectiveError(f"pipeline stages exchange arrays through torch.distributed; "
                                  f"{type(comm).__name__} has no group")
        self.comm, self.rank, self.world = comm, comm.rank, comm.world
        self.torch, self.dist = comm.torch, comm.dist
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        self.device = getattr(comm, "device", None)  # NCCL moves device tensors only
        self.seconds = 0.0
        self.calls = 0

    def _wait(self, work, what: str, peer: int) -> None:
        t0 = time.perf_counter()
        try:
            work.wait(self.timeout)
        except Exception as e:  # the peer's connection closed, or the wait timed out
            raise CollectiveError(f"rank {self.rank}: {what} rank {peer} failed or timed out after "
                                  f"{self.timeout_s:.0f} s (that rank stopped or hangs): {e}") from None
        self.seconds += time.perf_counter() - t0
        self.calls += 1

    def isend(self, a: np.ndarray, dst: int, tag: int = 0) -> Pending:
        """Start sending ``a`` (C-contiguous) to rank ``dst``; ``wait`` on the result before changing ``a``."""
        a = np.ascontiguousarray(a)
        t = self.torch.from_numpy(a) if self.device is None else self.torch.from_numpy(a).to(self.device)
        try:
            work = self.dist.isend(t, dst, tag=tag)
        except Exception as e:
            raise CollectiveError(f"rank {self.rank}: sending to rank {dst} failed (that rank stopped): {e}") \
                from None
        return Pending(work, t, dst, "sending to")

    def wait(self, pending: list[Pending]) -> None:
        """Wait until every send in ``pending`` has completed."""
        for p in pending:
            self._wait(p.work, p.what, p.peer)
        pending.clear()

    def send(self, a: np.ndarray, dst: int, tag: int = 0) -> None:
        """Send ``a`` to rank ``dst`` and wait until it has gone."""
        self.wait([self.isend(a, dst, tag)])

    def recv(self, shape: tuple[int, ...], dtype, src: int, tag: int = 0) -> np.ndarray:
        """A new array of ``shape`` and ``dtype`` filled with what rank ``src`` sends."""
        out = np.empty(shape, dtype)
        t = self.torch.from_numpy(out) if self.device is None else self.torch.from_numpy(out).to(self.device)
        try:
            work = self.dist.irecv(t, src, tag=tag)
        except Exception as e:
            raise CollectiveError(f"rank {self.rank}: receiving from rank {src} failed (that rank stopped): {e}") \
                from None
        self._wait(work, "receiving from", src)
        return out if self.device is None else t.cpu().numpy()

    def broadcast(self, a: np.ndarray, src: int) -> None:
        """``a`` (in place) from rank ``src`` on every rank (the communicator's broadcast, timed here too)."""
        t0 = time.perf_counter()
        self.comm.broadcast(a, src)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
