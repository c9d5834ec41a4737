"""Collectives between the ranks of a tensor-parallel run, on ``torch.distributed`` (gloo on CPUs).

A ``Communicator`` sums arrays in place across ranks (``all_reduce``), broadcasts from a rank and keeps the
seconds it spent in collectives, so a benchmark can report the all-reduce time per token. ``from_env`` joins
the group that ``torchrun`` (or ``lightspeed.parallel.launch``, which sets the same variables) describes:
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
"""
from __future__ import annotations

import atexit
import datetime
import mmap
import os
import platform
import time

import numpy as np

__all__ = ["Communicator", "SingleProcess", "GlooCommunicator", "SharedMemoryCommunicator", "distributed_env",
           "CollectiveError", "group_address", "join_group"]

DEFAULT_TIMEOUT_S = 120.0


class CollectiveError(RuntimeError):
    """A collective failed or timed out (another rank died or hangs); the message says which."""


def distributed_env() -> tuple[int, int] | None:
    """(rank, world size) when this process is a rank of a launched group (torchrun's variables), else None."""
    world = os.environ.get("WORLD_SIZE")
    rank = os.environ.get("RANK")
    if world is None or rank is None:
        return None
    try:
        return int(rank), int(world)
    except ValueError:
        raise CollectiveError(f"RANK={rank!r} and WORLD_SIZE={world!r} must be integers") from None


def group_address(world: int | None = None, option: str = "--tensor-parallel") -> tuple[int, int, str]:
    """(rank, world size, init method) of the group torchrun's variables describe; ``world`` (if given) must
    match WORLD_SIZE. CollectiveError naming the missing or mismatched variable (and ``option``, the flag
    that asked for ``world`` ranks)."""
    env = distributed_env()
    if env is None:
        raise CollectiveError("not a rank of a launched group (RANK and WORLD_SIZE are not set); start it with "
                              f"{option} N or torchrun")
    rank, size = env
    if world is not None and size != world:
        raise CollectiveError(f"{option} {world} but the launcher started {size} ranks (WORLD_SIZE)")
    port = os.environ.get("MASTER_PORT")
    if port is None:
        raise CollectiveError(f"MASTER_PORT is not set (torchrun and {option} set it)")
    return rank, size, f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{port}"


class Communicator:
    """The interface: ``rank``, ``world``, ``all_reduce(a)`` (sum, in place), ``broadcast(a, src)``,
    ``seconds`` (time spent in collectives) and ``calls``."""

    rank: int = 0
    world: int = 1

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def all_reduce(self, a: np.ndarray) -> None:
        raise NotImplementedError

    def broadcast(self, a: np.ndarray, src: int = 0) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class SingleProcess(Communicator):
    """One rank: every collective is the identity (tests and the world-size-1 path)."""

    def all_reduce(self, a: np.ndarray) -> None:
        self.calls += 1

    def broadcast(self, a: np.ndarray, src: int = 0) -> None:
        self.calls += 1


class GlooCommunicator(Communicator):
    """``torch.distributed`` with the gloo backend; arrays are shared with torch without copies. ``BACKEND``
    and ``require_backend`` are what a subclass on another backend changes (``lightspeed.parallel.nccl``)."""

    BACKEND = "gloo"

    def __init__(self, rank: int, world: int, init_method: str, timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__()
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            raise CollectiveError("tensor parallelism needs torch (pip install torch==2.13.0)") from None
        self.require_backend(torch, dist)
        self.torch, self.dist = torch, dist
        self.rank, self.world = rank, world
        try:
            dist.init_process_group(self.BACKEND, init_method=init_method, rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        except Exception as e:  # a rank that never arrives, a port in use, ...
            raise CollectiveError(f"rank {rank} of {world} could not join the group at {init_method}: {e}") from None
        # A process that exits with its group still formed can abort in gloo's teardown ("terminate called
        # without an active exception": its worker threads outlive the interpreter), so every group is left
        # while the interpreter is whole, also when the caller never calls close.
        atexit.register(self.close)

    @staticmethod
    def require_backend(torch, dist) -> None:
        """CollectiveError when this torch build cannot run the backend's collectives."""
        if not dist.is_available() or not dist.is_gloo_available():
            raise CollectiveError("this torch build has no gloo backend for torch.distributed")

    @classmethod
    def from_env(cls, world: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 option: str = "--tensor-parallel") -> "GlooCommunicator":
        """Join the group described by torchrun's variables; ``world`` (if given) must match WORLD_SIZE."""
        rank, size, init_method = group_address(world, option)
        return cls(rank, size, init_method, timeout_s)

    def _timed(self, what: str, fn) -> None:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:
            raise CollectiveError(f"rank {self.rank}: {what} failed (another rank stopped or timed out): {e}") \
                from None
        self.seconds += time.perf_counter() - t0
        self.calls += 1

    def all_reduce(self, a: np.ndarray) -> None:
        if not (a.flags.c_contiguous and a.flags.writeable):
            raise ValueError("all_reduce: the array must be C-contiguous and writable (it is summed in place)")
        t = self.torch.from_numpy(a)
        self._timed("all_reduce", lambda: self.dist.all_reduce(t))

    def broadcast(self, a: np.ndarray, src: int = 0) -> None:
        t = self.torch.from_numpy(a)
        self._timed("broadcast", lambda: self.dist.broadcast(t, src))

    def close(self) -> None:
        """Leave the group (once; later calls do nothing)."""
        atexit.unregister(self.close)
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


class SharedMemoryCommunicator(GlooCommunicator):
    """Ranks on one host: ``all_reduce`` through a shared mapping instead of gloo's TCP path (~0.9 ms per
    call measured here for SmolLM2's 2.3 KB partials; see benchmarks/README.md). Gloo still forms the group,
    shares the mapping and runs ``broadcast``.

    Each rank copies its array into its slot, marks its flag with the call's number and waits until every
    flag has it; then every rank sums the slots in rank order, so all ranks get the same bits. Two sets of
    slots alternate: a rank writes a set only after every rank has entered the following call, i.e. has
    finished reading that set. The flags are plain aligned 8-byte stores, ordered after the data by x86's
    store order (other machines use ``GlooCommunicator``). ``max_bytes`` bounds one array."""

    FLAG_STRIDE = 64  # bytes between flags: one cache line each

    def __init__(self, rank: int, world: int, init_method: str, max_bytes: int, timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__(rank, world, init_method, timeout_s)
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes = (max_bytes + 63) // 64 * 64
        flags = world * self.FLAG_STRIDE
        size = flags + 2 * world * max_bytes
        path = os.path.join("/dev/shm", f"lightspeed-tp-{init_method.rsplit(':', 1)[-1]}-{os.getuid()}")
        if rank == 0:
            with open(path, "wb") as f:
                f.truncate(size)
        self._timed("barrier", lambda: self.dist.barrier())
        try:
            with open(path, "r+b") as f:
                self._map = mmap.mmap(f.fileno(), size)
        except OSError as e:
            raise CollectiveError(f"rank {rank}: cannot map the shared all-reduce buffer {path}: {e}") from None
        self._timed("barrier", lambda: self.dist.barrier())
        if rank == 0:
            os.unlink(path)  # every rank has it mapped; nothing is left behind if a rank dies
        self._flags = np.frombuffer(self._map, dtype=np.int64, count=flags // 8)[::self.FLAG_STRIDE // 8]
        self._slots = np.frombuffer(self._map, dtype=np.uint8, offset=flags).reshape(2, world, max_bytes)
        self._epoch = 0

    @classmethod
    def usable(cls) -> bool:
        """Whether this machine's store order makes the flags safe (x86-64) and /dev/shm exists."""
        return platform.machine().lower() in ("x86_64", "amd64") and os.path.isdir("/dev/shm")

    def _wait(self, epoch: int) -> None:
        flags, spins = self._flags, 0
        deadline = None
        while (flags < epoch).any():
            spins += 1
            if spins % 64 == 0:
                os.sched_yield()  # more ranks than cores: let the others run
            if spins % 4096 == 0:
                now = time.monotonic()
                deadline = deadline or now + self.timeout_s
                if now > deadline:
                    late = [r for r in range(self.world) if flags[r] < epoch]
                    raise CollectiveError(f"rank {self.rank}: all_reduce timed out after {self.timeout_s:.0f} s "
                                          f"waiting for rank(s) {late}")

    def all_reduce(self, a: np.ndarray) -> None:
        if not (a.flags.c_contiguous and a.flags.writeable):
            raise ValueError("all_reduce: the array must be C-contiguous and writable (it is summed in place)")
        if a.nbytes > self.max_bytes:
            raise ValueError(f"all_reduce: {a.nbytes} bytes exceed the shared buffer's {self.max_bytes}")
        t0 = time.perf_counter()
        self._epoch += 1
        slots = self._slots[self._epoch % 2]
        flat = a.reshape(-1)
        view = [slots[r, :a.nbytes].view(a.dtype) for r in range(self.world)]
        view[self.rank][...] = flat
        self._flags[self.rank] = self._epoch
        self._wait(self._epoch)
        total = view[0].copy()
        for r in range(1, self.world):
            total += view[r]
        flat[...] = total
        self.seconds += time.perf_counter() - t0
        self.calls += 1

    def close(self) -> None:
        self._flags = self._slots = None
        try:
            if getattr(self, "_map", None) is not None:  # absent when joining failed before the mapping
                self._map.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with the process
            pass
        super().close()


def join_group(world: int | None = None, max_bytes: int = 0, shared_memory: bool = True,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> GlooCommunicator:
    """This process's communicator in the group torchrun's variables describe: through shared memory when
    every rank is on this host (LOCAL_WORLD_SIZE == WORLD_SIZE) and ``max_bytes`` is given, else gloo."""
    env = distributed_env()
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if (shared_memory and max_bytes > 0 and env is not None and local == str(env[1])
            and SharedMemoryCommunicator.usable()):
        rank, size, init_method = group_address(world)
        return SharedMemoryCommunicator(rank, size, init_method, max_bytes, timeout_s)
    return GlooCommunicator.from_env(world, timeout_s)
