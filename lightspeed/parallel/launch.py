"""Start N local ranks of a ``lightspeed`` command (``--tensor-parallel N`` without torchrun).

Each rank is ``python -m lightspeed <the same arguments>`` with torchrun's variables (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and, unless the arguments set ``--threads``, an even share of this
machine's cores as its thread count. Rank 0
writes to this process's stdout; the others' stdout is discarded (they compute the same tokens). When a rank
fails, the others are stopped at once and its exit code is returned, so no rank is left waiting in a
collective.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Sequence

__all__ = ["free_port", "launch_local", "run_ranks"]

POLL_S = 0.05


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if p.poll() is None:
            p.kill()
            p.wait()


def launch_local(world: int, args: Sequence[str], threads: int | None = None) -> int:
    """Run ``lightspeed <args>`` as ``world`` local ranks; the exit code (0 when every rank succeeded, else
    the first failure's)."""
    if world < 2:
        raise ValueError(f"launch_local: {world} ranks; use at least 2")
    args = list(args)
    if "--threads" not in args and not any(a.startswith("--threads=") for a in args):
        args += ["--threads", str(threads if threads is not None else max(1, (os.cpu_count() or 1) // world))]
    return run_ranks(world, [sys.executable, "-m", "lightspeed", *args])


def run_ranks(world: int, command: Sequence[str]) -> int:
    """Run ``command`` as ``world`` ranks on this host (torchrun's variables set; rank 0's stdout kept);
    when one fails the others are stopped. The exit code: 0, or the first failure's."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(list(command), env=env, stdout=None if rank == 0 else subprocess.DEVNULL))
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                _stop(procs)
                print(f"lightspeed: rank {rank} of {world} failed (exit code {code}); stopped the other ranks",
                      file=sys.stderr)
                return code if code > 0 else 1
            if all(c == 0 for c in codes):
                return 0
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        _stop(procs)
        return 130
