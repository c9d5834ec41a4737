"""Start N local ranks of a ``lightspeed`` command (``--tensor-parallel N`` without torchrun).

Each rank is ``python -m lightspeed <the same arguments>`` with torchrun's variables (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and, unless the arguments set ``--threads``, an even share of this
machine's cores as its thread count. Rank 0
writes to this process's stdout; the others' stdout is discarded (they compute the same tokens). When a rank
fails, the others are stopped at once and its exit code is returned, so no rank is left waiting in a
collective. Ctrl-C or SIGTERM to the launcher goes to rank 0 first (a server then drains and stops the
other ranks itself); ranks still running a while after rank 0 has ended are stopped.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Sequence

__all__ = ["free_port", "launch_local", "run_ranks"]

POLL_S = 0.05
END_GRACE_S = 5.0  # seconds the other ranks get to end by themselves once rank 0 has stopped


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


class _Terminated(Exception):
    """This launcher got SIGTERM."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated()


def run_ranks(world: int, command: Sequence[str], stop_grace_s: float = 30.0) -> int:
    """Run ``command`` as ``world`` ranks on this host (torchrun's variables set; rank 0's stdout kept);
    when one fails the others are stopped. The exit code: 0, or the first failure's.

    Ctrl-C or SIGTERM to this process stops rank 0 first (SIGTERM; a server drains its requests and ends the
    other ranks) and the rest once it has ended or after ``stop_grace_s`` seconds. Ranks still running
    ``stop_grace_s`` seconds after rank 0 succeeded are stopped too."""
    port = free_port()
    procs = []
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main else None
    try:
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen(list(command), env=env,
                                          stdout=None if rank == 0 else subprocess.DEVNULL))
        return _watch(procs, stop_grace_s)
    except (KeyboardInterrupt, _Terminated) as e:
        if procs and procs[0].poll() is None:
            procs[0].send_signal(signal.SIGTERM)
            deadline = time.monotonic() + stop_grace_s
            while procs[0].poll() is None and time.monotonic() < deadline:
                time.sleep(POLL_S)
        # the others may be ending on rank 0's word (a server's stop message): a few seconds to do so
        deadline = time.monotonic() + min(stop_grace_s, END_GRACE_S)
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        _stop(procs, grace_s=2.0)
        if all(p.returncode == 0 for p in procs):  # every rank ended cleanly (a server that drained)
            return 0
        return 130 if isinstance(e, KeyboardInterrupt) else 143
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _watch(procs: list[subprocess.Popen], stop_grace_s: float) -> int:
    world = len(procs)
    rank0_done = None
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
        if codes[0] == 0:
            rank0_done = rank0_done or time.monotonic()
            if time.monotonic() - rank0_done > stop_grace_s:
                late = [r for r, c in enumerate(codes) if c is None]
                _stop(procs)
                print(f"lightspeed: rank(s) {late} of {world} still ran {stop_grace_s:.0f} s after rank 0 "
                      "finished; stopped them", file=sys.stderr)
                return 1
        time.sleep(POLL_S)
