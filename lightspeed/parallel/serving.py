"""``lightspeed serve --tensor-parallel N``: rank 0 serves, every other rank mirrors its engine's native calls.

Rank 0 runs the HTTP server and the engine (``lightspeed.engine.scheduler.Engine``) as one process does, over
mirrored objects: before each native call that touches the model or its caches — a prefill chunk, a batched
decode step, a slot move — ``Mirror.send`` broadcasts a fixed-size message (the operation, its numbers and its
token ids and positions) through the communicator, then runs the call locally. Every other rank loops in
``follow``: it receives each message and makes the same call on its own shard, so its collectives meet rank 0's.
A stop message ends the loop when the engine stops. While the engine is idle, rank 0 sends a no-op every
``HEARTBEAT_S`` seconds, so a waiting rank's broadcast does not reach the communicator's timeout.

Calls are serialised by one lock (the engine thread's calls and the heartbeat). A collective that fails on rank
0 (a rank died) ends rank 0 with a message: the server cannot go on without its ranks.

The prefix cache is off under tensor parallelism: its hits depend on byte budgets, which differ per rank.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from ..engine.scheduler import DEFAULT_PREFILL_CHUNK, Engine
from .batched import TensorParallelBatchedStep
from .comm import CollectiveError, Communicator
from .step import TensorParallelStep

__all__ = ["Mirror", "MirroredStep", "MirroredStepper", "TensorParallelEngine", "follow", "tensor_parallel_engine",
           "serve_follower", "HEARTBEAT_S"]

HEARTBEAT_S = 5.0
NOOP, PREFILL, DECODE, MOVE, STOP = range(5)
HEAD = 4  # op, n, a, b; then n token ids and n positions


class Mirror:
    """Rank 0's side: ``send`` broadcasts one message and runs the local call under the lock."""

    def __init__(self, comm: Communicator, longest: int, heartbeat_s: float = HEARTBEAT_S):
        self.comm, self.longest = comm, longest
        self.message = np.zeros(HEAD + 2 * longest, np.int64)
        self.lock = threading.Lock()
        self.stopped = False
        self.last = time.monotonic()
        self._beat = threading.Thread(target=self._heartbeat, args=(heartbeat_s,), name="lightspeed-tp-heartbeat",
                                      daemon=True)
        self._beat.start()

    def send(self, op: int, call: Callable[[], object], a: int = 0, b: int = 0, tokens=(), positions=None) -> object:
        """Broadcast ``op`` with its numbers and rows, then return ``call()`` (both under the lock)."""
        with self.lock:
            if self.stopped:
                raise CollectiveError("the tensor-parallel ranks were stopped")
            n = len(tokens)
            m = self.message
            m[:HEAD] = (op, n, a, b)
            m[HEAD:HEAD + n] = tokens
            m[HEAD + n:HEAD + 2 * n] = 0 if positions is None else positions
            self._broadcast()
            return call()

    def _broadcast(self) -> None:
        try:
            self.comm.broadcast(self.message, 0)
        except CollectiveError as e:  # a rank died: this server cannot compute anything any more
            print(f"lightspeed serve: error: {e}; stopping", file=sys.stderr, flush=True)
            os._exit(1)
        self.last = time.monotonic()

    def _heartbeat(self, period: float) -> None:
        while True:
            time.sleep(period / 4)
            with self.lock:
                if self.stopped:
                    return
                if time.monotonic() - self.last >= period:
                    self.message[:HEAD] = (NOOP, 0, 0, 0)
                    self._broadcast()

    def stop(self) -> None:
        """Tell every rank to end its loop (once; later sends fail)."""
        with self.lock:
            if self.stopped:
                return
            self.message[:HEAD] = (STOP, 0, 0, 0)
            self._broadcast()
            self.stopped = True


class MirroredStep:
    """The single-sequence step (prefill) on rank 0, each call mirrored; otherwise the step itself."""

    def __init__(self, step: TensorParallelStep, stepper: TensorParallelBatchedStep, mirror: Mirror):
        self._step, self._stepper, self._mirror = step, stepper, mirror

    def __getattr__(self, name: str):  # ctx, max_chunk, kv_update, kv_dtype, ...
        return getattr(self._step, name)

    def run(self, tokens, pos: int, caches: dict[str, np.ndarray]):
        ids = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        slot = self._stepper.slot_of(caches)
        if not 1 <= ids.shape[0] <= self._step.max_chunk:  # a message holds max_chunk tokens (build_batched)
            raise ValueError(f"run: {ids.shape[0]} tokens; a prefill call takes 1 to {self._step.max_chunk}")
        return self._mirror.send(PREFILL, lambda: self._step.run(ids, pos, caches), int(pos), slot, tokens=ids)


class MirroredStepper:
    """The batched step on rank 0 (``run``, ``move_slot`` mirrored; ``slot_caches`` local)."""

    def __init__(self, stepper: TensorParallelBatchedStep, mirror: Mirror):
        self._stepper, self._mirror = stepper, mirror
        self.ctx, self.max_batch = stepper.ctx, stepper.max_batch

    def slot_caches(self, slot: int) -> dict[str, np.ndarray]:
        return self._stepper.slot_caches(slot)

    def move_slot(self, src: int, dst: int, rows: int) -> None:
        self._mirror.send(MOVE, lambda: self._stepper.move_slot(src, dst, rows), src, dst, tokens=[rows])

    def run(self, tokens, positions) -> np.ndarray:
        ids, pos = self._stepper.check(tokens, positions)  # a bad step fails here, before any rank runs it
        return self._mirror.send(DECODE, lambda: self._stepper.run(ids, pos), tokens=ids, positions=pos)


class TensorParallelEngine(Engine):
    """The engine of rank 0: stopping it also ends the other ranks' loops."""

    def __init__(self, step: MirroredStep, stepper: MirroredStepper, mirror: Mirror, **kwargs):
        super().__init__(step, stepper, **kwargs)
        self.mirror = mirror

    def stop(self, timeout: float = 30.0) -> None:
        super().stop(timeout)
        self.mirror.stop()  # under the lock: after any step the engine thread still runs


def build_batched(step: TensorParallelStep, max_batch: int, backend: str = "c",
                  options: dict | None = None) -> tuple[TensorParallelBatchedStep, int]:
    """This rank's batched step and the longest row list a message carries (the same on every rank)."""
    longest = max(max_batch, step.max_chunk)
    return TensorParallelBatchedStep(step, max_batch, backend=backend, **(options or {})), longest


def tensor_parallel_engine(model, max_batch: int, *, backend: str = "c", options: dict | None = None,
                           prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK, max_queue: int = 64,
                           log: Callable[[str], None] | None = None) -> TensorParallelEngine:
    """Rank 0's engine (not started) over ``model`` (``lightspeed.load(tensor_parallel=N)``): its calls are
    mirrored on the other ranks, which run ``follow``."""
    step = model.step
    if step.comm.rank != 0:
        raise ValueError(f"rank {step.comm.rank} follows rank 0's engine (lightspeed.parallel.serving.follow)")
    t0 = time.perf_counter()
    stepper, longest = build_batched(step, max_batch, backend, options)
    if log is not None:
        log(f"compiled the batched step as segments on {step.comm.world} ranks (up to {max_batch} sequences) in "
            f"{time.perf_counter() - t0:.1f} s; no prefix cache under tensor parallelism")
    mirror = Mirror(step.comm, longest)
    return TensorParallelEngine(MirroredStep(step, stepper, mirror), MirroredStepper(stepper, mirror), mirror,
                                max_queue=max_queue, prefix_cache=None, prefill_chunk=prefill_chunk)


def follow(step: TensorParallelStep, stepper: TensorParallelBatchedStep, longest: int) -> int:
    """A rank other than 0: make rank 0's engine calls on this rank's shard until rank 0 stops; the exit code.
    A call that fails on its inputs fails the same way on rank 0 (checked before any collective), so it is
    skipped; a collective that fails ends this rank with its message."""
    comm = step.comm
    m = np.zeros(HEAD + 2 * longest, np.int64)
    while True:
        comm.broadcast(m, 0)
        op, n, a, b = (int(v) for v in m[:HEAD])
        tokens, positions = m[HEAD:HEAD + n], m[HEAD + n:HEAD + 2 * n]
        try:
            if op == STOP:
                return 0
            if op == PREFILL:
                step.run(tokens.astype(np.int32), a, stepper.slot_caches(b))
            elif op == DECODE:
                stepper.run(tokens, positions)
            elif op == MOVE:
                stepper.move_slot(a, b, int(tokens[0]))
            elif op != NOOP:
                raise CollectiveError(f"rank {comm.rank}: unknown message {op} from rank 0")
        except ValueError:  # rank 0 refused the same inputs before its collectives
            continue


def serve_follower(world: int, model: str | None, *, ctx: int | None, quant: str | None, backend: str,
                   max_batch: int, threads: int | None, activations: dict, kv_dtype: str | None = None) -> int:
    """A rank other than 0 of ``lightspeed serve --tensor-parallel N``: load and compile this rank's shard as rank 0
    does (the same arguments), then ``follow`` its engine; the exit code. Ctrl-C is left to rank 0, which ends
    this loop when it has drained its requests."""
    from ..api import load
    from ..backend.c import set_num_threads
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if threads is not None and backend == "c":
        set_num_threads(threads)
    m = load(model, ctx=ctx, quant=quant, backend=backend, progress=False, kv_dtype=kv_dtype, tensor_parallel=world,
             **activations)
    stepper, longest = build_batched(m.step, max_batch, backend, activations)
    try:
        return follow(m.step, stepper, longest)
    finally:
        m.step.comm.close()
