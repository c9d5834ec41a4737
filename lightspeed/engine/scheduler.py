"""The scheduler: one thread that owns the model and runs every native call.

Each turn of its loop:

1. drops cancelled sequences (a client that went away frees its slot before the next step);
2. runs queued jobs (embeddings) — native programs share one thread pool, so they never run
   concurrently with a step;
3. prefills prompts. While other sequences decode, a turn runs at most ``chunks.size`` prompt tokens
   (chunked prefill inside the batch; ``lightspeed.engine.chunking`` sizes them, by default to about half a
   decode step's time): the rest of the prompt being prefilled, then, while slots are free, the next
   waiting ones, so a long prompt delays each running stream's token by one chunk only and short prompts
   join the batch together. When nothing decodes, a prompt runs in the program's ``max_chunk`` chunks,
   back to back;
4. runs one batched decode step over every decoding sequence (``stepper.run``): a new sequence
   joins the batch once its prompt is prefilled, a finished one leaves. With a stepper that has a mixed step
   (``run_mixed``, lightspeed.engine.mixed), step 3 runs nothing while others decode: it picks the next chunk
   of the prompt being prefilled, and this decode step carries it (one pass over the weights for both).

Slots stay packed: decoding sequences hold slots ``0 .. D-1`` (row ``b`` of a step is slot
``b``) and the one being prefilled holds slot ``D``. When a sequence leaves, the sequence in the
highest slot moves into the hole (``stepper.move_slot`` copies its cache rows).

Sequences under a grammar (structured output, forced tool calls) need a token mask before they
sample. The mask depends only on the tokens so far, so the masks of every such sequence of a step are
computed in parallel by a ``lightspeed.structured.MaskWorker`` while the step (or a prompt's last
prefill chunk) runs natively; the engine waits for them only if they take longer than the step.

With a ``PrefixCache`` (lightspeed.prefix_cache), a sequence admitted into a slot first copies the
cached rows of the longest cached prefix of its prompt (all but its last token, whose logits it needs)
and prefills only the rest; once its prompt is prefilled its full blocks are stored, and when it leaves
the rows of everything it generated are too (the next turn of a chat starts with them).

Steppers: ``BatchedStep`` (lightspeed.engine.batched) for model families with a batched forward;
``SequentialStepper`` (one single-sequence call per sequence per step) for the others.
"""
from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
import traceback
from collections.abc import Callable

import numpy as np

from ..models.base import CACHE_ROW_AXIS, CompiledLM
from ..prefix_cache import PrefixCache
from ..row_step import RowStep
from ..structured import MaskWorker
from .chunking import DEFAULT_PREFILL_CHUNK, ChunkPolicy
from .sequence import Sequence


class QueueFullError(Exception):
    """Too many requests are waiting for a slot."""


class EngineStoppedError(Exception):
    """The engine is shutting down and takes no new work."""


class SequentialStepper:
    """The batched-step interface over the single-sequence program: one call per sequence per step
    (for model families without a batched forward).

    Each slot's calls go through a ``RowStep`` of its own (lightspeed.row_step): the program's inputs are
    checked once per slot, not on every call. ``CompiledLM.run`` keeps one such check for the last set of
    caches it saw, which slots taking turns would redo every call (~1 ms each for SmolLM2's 60 caches)."""

    def __init__(self, step, max_batch: int):
        self.step, self.max_batch, self.ctx = step, max_batch, step.ctx
        self.slots = [step.new_caches() for _ in range(max_batch)]
        # a RowStep needs the compiled program writing rows in place (itself, or the RowStep into the caches'
        # rows); other steps are called as they are
        self._checked = isinstance(step, CompiledLM) and step.kv_update in ("rows", "heads")
        self._rows: list[RowStep | None] = [None] * max_batch

    def slot_caches(self, slot: int) -> dict[str, np.ndarray]:
        return self.slots[slot]

    def move_slot(self, src: int, dst: int, rows: int) -> None:
        self.slots[src], self.slots[dst] = self.slots[dst], self.slots[src]
        self._rows[src], self._rows[dst] = self._rows[dst], self._rows[src]

    def _row_step(self, slot: int) -> RowStep:
        rs = self._rows[slot]
        if rs is None:
            rs = self._rows[slot] = RowStep(self.step.program, {"tokens": np.zeros(1, np.int32), **self.slots[slot]},
                                            writes=self.step.row_writes(), varying=["tokens"], dims={"pos": 0})
        return rs

    def run(self, tokens, positions) -> np.ndarray:
        if not self._checked:
            return np.stack([self.step.run([int(t)], int(p), self.slots[b])[0][-1]
                             for b, (t, p) in enumerate(zip(tokens, positions))])
        vocab = self.step.vocab_size
        rows = []
        for b, (t, p) in enumerate(zip(tokens, positions)):
            t, p = int(t), int(p)
            if not 0 <= t < vocab:  # the program indexes the embedding with it
                raise ValueError(f"run: token ids must lie in [0, {vocab}), got {t}")
            # RowStep checks the position against its bounds and the caches' rows
            logits = self._row_step(b).run({"tokens": np.array([t], dtype=np.int32)}, {"pos": p}, p)[0]
            rows.append(logits[-1])
        return np.stack(rows)




class Engine:
    """Runs sequences on ``step`` (the single-sequence program, for prefill) and ``stepper`` (decode);
    while others decode, prompts are prefilled ``prefill_chunk`` tokens per step (None: sized to take about
    half a decode step; see lightspeed.engine.chunking)."""

    def __init__(self, step, stepper, max_queue: int = 64, prefix_cache: PrefixCache | None = None,
                 prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK):
        if getattr(step, "kv_update", "rows") not in ("rows", "heads"):
            raise ValueError("the engine prefills into the slots' caches in place, which needs kv_update 'rows' "
                             f"or 'heads', not {step.kv_update!r}")
        caches = stepper.slot_caches(0)
        specs = {s.name: tuple(s.shape) for s in getattr(step, "cache_specs", ())}
        wrong = [name for name, a in caches.items() if name in specs and a.shape != specs[name]]
        if wrong:
            raise ValueError(f"the stepper's cache {wrong[0]!r} is {caches[wrong[0]].shape}, but the prefill step "
                             f"reads {specs[wrong[0]]} (a batched step shares [ctx, ...] caches: compile the "
                             "single-sequence step with kv_update='rows')")
        self.chunks = ChunkPolicy(step.max_chunk, prefill_chunk)
        self.step, self.stepper = step, stepper
        # rows are reused by position, so every cache must hold one row per position of the slot
        self.row_axis = CACHE_ROW_AXIS[step.kv_update] if hasattr(step, "kv_update") else 0
        fits = all(a.ndim > self.row_axis and a.shape[self.row_axis] == stepper.ctx for a in caches.values())
        self.prefix_cache = prefix_cache if fits else None
        self.ctx, self.max_batch, self.max_queue = stepper.ctx, stepper.max_batch, max_queue
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.slots: list[Sequence] = []  # packed: slots[i].slot == i
        self.jobs: collections.deque[tuple[Callable, concurrent.futures.Future]] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.decoded_tokens = 0
        self.prefilled_tokens = 0
        self.prefill_chunks = 0
        self.step_seconds = 0.0     # in batched decode steps
        self.prefill_seconds = 0.0  # in prefill chunks
        self.masks: MaskWorker | None = None  # started with the first sequence under a grammar
        # a stepper with a mixed step (lightspeed.engine.mixed) carries prompt chunks on its decode steps (at
        # most ``chunk_limit(decoding rows)`` tokens); this turn's (sequence, tokens) to carry
        self._mixed = hasattr(stepper, "run_mixed")
        self._ride: tuple[Sequence, int] | None = None
        self.mixed_steps = 0  # decode steps that carried a prompt chunk
        self.mask_wait_seconds = 0.0  # waiting for grammar masks after a step had finished

    # any thread --------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="lightspeed-engine", daemon=True)
        self._thread.start()

    @property
    def accepting(self) -> bool:
        return not self._stopping

    def submit(self, seq: Sequence) -> None:
        """Queue ``seq``; QueueFullError when ``max_queue`` requests are already waiting."""
        self.submit_all([seq])

    def submit_all(self, seqs: list[Sequence]) -> None:
        """Queue all of ``seqs`` (the choices of one request) or none: QueueFullError when more than
        ``max_queue`` sequences would wait for a slot."""
        with self._cond:
            if self._stopping:
                raise EngineStoppedError("the server is shutting down")
            free = self.max_batch - len(self.slots)
            if len(self.waiting) + len(seqs) - free > self.max_queue:
                raise QueueFullError(f"{len(self.waiting)} requests are waiting for one of {self.max_batch} slots")
            self.waiting.extend(seqs)
            self._cond.notify()

    def call(self, fn: Callable[[], object]) -> concurrent.futures.Future:
        """Run ``fn`` on the engine thread between steps; its result or exception comes in the future."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._stopping:
                raise EngineStoppedError("the server is shutting down")
            self.jobs.append((fn, fut))
            self._cond.notify()
        return fut

    def wake(self) -> None:
        """Look at cancellations now (a sequence's consumer went away)."""
        with self._cond:
            self._cond.notify()

    def stats(self) -> dict:
        with self._cond:
            masks = self.masks
            return {"active": len(self.slots), "waiting": len(self.waiting), "max_batch": self.max_batch,
                    "steps": self.steps, "decoded_tokens": self.decoded_tokens,
                    "prefilled_tokens": self.prefilled_tokens, "prefill_chunks": self.prefill_chunks,
                    "prefill_chunk": self.chunks.describe(), "mixed_steps": self.mixed_steps,
                    "decode_seconds": round(self.step_seconds, 3),
                    "prefill_seconds": round(self.prefill_seconds, 3),
                    "grammar_masks": masks.masks if masks else 0,
                    "grammar_mask_seconds": round(masks.seconds, 4) if masks else 0.0,
                    "grammar_wait_seconds": round(self.mask_wait_seconds, 4),
                    "prefix_cache": self.prefix_cache.stats() if self.prefix_cache is not None else None}

    def drain(self) -> None:
        """Take no new work from now on; what runs and waits goes on."""
        with self._cond:
            self._stopping = True

    def stop(self, timeout: float = 30.0) -> None:
        """Take no new work; let running and queued sequences finish for up to ``timeout`` seconds,
        then end the rest with an error and stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cond:
                if not self.slots and not self.waiting and not self.jobs:
                    break
            time.sleep(0.02)
        with self._cond:
            self._halt = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=10.0)

    # the engine thread -------------------------------------------------------------------------------
    _halt = False

    def _has_work(self) -> bool:
        return bool(self.slots or self.waiting or self.jobs or self._halt)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._has_work():
                    self._cond.wait()
                if self._halt:
                    break
            try:
                self._turn()
            except Exception as e:  # noqa: BLE001 - a failed step ends the sequences it ran, the server goes on
                message = f"internal error: {type(e).__name__}: {e}"
                traceback.print_exc()
                for seq in list(self.slots):
                    seq.fail(message)
                self.slots.clear()
        leftover = list(self.slots) + list(self.waiting)
        self.slots.clear()
        self.waiting.clear()
        for seq in leftover:
            seq.fail("the server shut down before the request finished")
        while self.jobs:
            _, fut = self.jobs.popleft()
            fut.set_exception(EngineStoppedError("the server shut down"))
        if self.masks is not None:
            self.masks.close()

    def _turn(self) -> None:
        self._drop_cancelled()
        self._run_jobs()
        self._prefill()
        self._decode()

    def _drop_cancelled(self) -> None:
        with self._cond:
            if any(s.cancelled for s in self.waiting):
                self.waiting = collections.deque(s for s in self.waiting if not s.cancelled)
        gone = [s for s in self.slots if s.cancelled]
        for seq in gone:
            seq.finish_reason = seq.finish_reason or "cancelled"
        if gone:
            self._release(gone)

    def _run_jobs(self) -> None:
        while True:
            with self._cond:
                if not self.jobs:
                    return
                fn, fut = self.jobs.popleft()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - reported to the caller
                    fut.set_exception(e)

    def _prefill(self) -> None:
        """Prefill prompts for one turn. While other sequences decode, the turn may run ``chunks.size`` prompt
        tokens: the rest of the prompt being prefilled, then (a slot free) the next waiting ones, so short
        prompts join the batch together; a long one stops at the budget and goes on next turn. While nothing
        decodes, the whole prompt runs (nobody waits for it)."""
        budget = None  # prompt tokens left to this turn
        while True:
            filling = self._filling() or self._admit()
            if filling is None:
                return
            if len(self.slots) == 1:  # nobody decodes
                while self._prefill_chunk(filling, self.chunks.size(alone=True)):
                    if filling.cancelled or self.jobs or self._halt:  # seen by the next turn
                        return
                continue
            limit = self.stepper.chunk_limit(len(self.slots) - 1) if self._mixed else 0
            if limit > 0:  # the chunk rides on this turn's decode step
                self._ride = (filling, self.chunks.size(alone=False, queued=bool(self.waiting), mixed=True,
                                                        limit=limit))
                return
            if budget is None:
                budget = self.chunks.size(alone=False, queued=bool(self.waiting))
            if budget <= 0:
                return
            n = min(budget, len(filling.prefill_left))
            budget -= n
            if self._prefill_chunk(filling, n):
                return  # the budget ran out inside this prompt

    def _filling(self) -> Sequence | None:
        """The sequence whose prompt is being prefilled (it holds the highest slot), if any."""
        return self.slots[-1] if self.slots and self.slots[-1].next_token is None and \
            self.slots[-1].finish_reason is None else None

    def _admit(self) -> Sequence | None:
        """Move the oldest waiting sequence into the next free slot (its cached prefix copied in), if any; one
        cancelled while it waited (since this turn began) is dropped, not prefilled."""
        if len(self.slots) >= self.max_batch:
            return None
        with self._cond:
            seq = self.waiting.popleft() if self.waiting else None
            while seq is not None and seq.cancelled:
                seq = self.waiting.popleft() if self.waiting else None
        if seq is None:
            return None
        seq.slot, seq.pos = len(self.slots), 0
        if self.prefix_cache is not None:  # the last prompt token always runs: its logits are needed
            seq.pos = seq.cached_tokens = self.prefix_cache.load(
                seq.prompt_ids, self.stepper.slot_caches(seq.slot), limit=len(seq.prompt_ids) - 1,
                axis=self.row_axis)
        self.slots.append(seq)
        return seq

    def _prefill_chunk(self, filling: Sequence, size: int) -> bool:
        """Run the next ``size`` tokens (at most) of ``filling``'s prompt; True while tokens are left to run."""
        chunk = filling.prefill_left[:size]
        last = len(chunk) == len(filling.prefill_left)
        # the first token's mask is prepared while the last chunk runs
        job = self._start_masks([filling] if last else [])
        t0 = time.perf_counter()
        try:
            logits, _ = self.step.run(chunk, filling.pos, self.stepper.slot_caches(filling.slot))
        except Exception as e:  # noqa: BLE001 - this prompt's problem (a token the model lacks): only it fails
            filling.fail(f"prefill failed: {type(e).__name__}: {e}")
            self._release([filling])
            return False
        finally:
            seconds = time.perf_counter() - t0
            self.prefill_seconds += seconds
            self._wait_masks(job)
        self.chunks.prefilled(len(chunk), seconds)
        self.prefill_chunks += 1
        filling.pos += len(chunk)
        self.prefilled_tokens += len(chunk)
        if not last:
            return True
        if self.prefix_cache is not None:
            self.prefix_cache.store(filling.prompt_ids, self.stepper.slot_caches(filling.slot), axis=self.row_axis)
        if not filling.accept(logits[-1], self.ctx):
            self._release([filling])
        return False

    def _decode(self) -> None:
        ride, self._ride = self._ride, None
        batch = [s for s in self.slots if s.next_token is not None]
        if not batch:
            return
        # packed slots: the decoding sequences are slots 0 .. len(batch)-1 (the prefilling one comes after)
        assert all(s.slot == b for b, s in enumerate(batch)), "slots are not packed"
        chunk: list[int] = []
        filling = ride[0] if ride is not None else None
        if ride is not None and not filling.cancelled and filling.finish_reason is None:
            size = ride[1]
            assert filling.slot == len(batch), "the sequence being prefilled is not right after the decoding ones"
            chunk = list(filling.prefill_left[:size])
            problem = self.stepper.chunk_error(chunk, filling.pos)
            if problem is not None:  # this prompt's problem (a token the model lacks): only it fails
                filling.fail(f"prefill failed: {problem}")
                self._release([filling])
                chunk = []
        last = bool(chunk) and len(chunk) == len(filling.prefill_left)
        job = self._start_masks(batch + [filling] if last else batch)
        tokens, positions = [s.next_token for s in batch], [s.pos for s in batch]
        t0 = time.perf_counter()
        try:
            if chunk:
                logits = self.stepper.run_mixed(tokens, positions, chunk, filling.pos)
            else:
                logits = self.stepper.run(tokens, positions)
        finally:
            seconds = time.perf_counter() - t0
            self.step_seconds += seconds
            self._wait_masks(job)
        self.steps += 1
        self.decoded_tokens += len(batch)
        done = []
        if chunk:
            self.chunks.mixed(len(chunk), seconds)
            self.mixed_steps += 1
            self.prefill_chunks += 1
            self.prefilled_tokens += len(chunk)
            filling.pos += len(chunk)
        else:
            self.chunks.decoded(seconds)
        for b, seq in enumerate(batch):
            seq.pos += 1
            if not seq.accept(logits[b], self.ctx):
                done.append(seq)
        if last:
            if self.prefix_cache is not None:
                self.prefix_cache.store(filling.prompt_ids, self.stepper.slot_caches(filling.slot),
                                        axis=self.row_axis)
            if not filling.accept(logits[len(batch)], self.ctx):
                done.append(filling)
        if done:
            self._release(done)

    def _start_masks(self, seqs: list[Sequence]) -> concurrent.futures.Future | None:
        """Start computing the grammar masks of ``seqs`` (those with a grammar) in the background."""
        constraints = [s.constraint for s in seqs if s.constraint is not None]
        if not constraints:
            return None
        if self.masks is None:
            self.masks = MaskWorker()
        return self.masks.start(constraints)

    def _wait_masks(self, job: concurrent.futures.Future | None) -> None:
        """Wait for ``job``; a failure only means each sequence computes its own mask when it samples."""
        if job is None:
            return
        t0 = time.perf_counter()
        try:
            job.result()
        except Exception:  # noqa: BLE001 - Constraint.apply computes (and reports) it again
            traceback.print_exc()
        self.mask_wait_seconds += time.perf_counter() - t0

    def _release(self, gone: list[Sequence]) -> None:
        """Remove finished or cancelled sequences and pack the slots again."""
        gone_ids = {id(s) for s in gone}
        for seq in gone:
            # rows 0 .. pos-1 hold history[:pos] once the prompt is prefilled (not after a failed step)
            if self.prefix_cache is not None and seq.finish_reason != "error" and seq.pos >= len(seq.prompt_ids):
                self.prefix_cache.store(seq.history, self.stepper.slot_caches(seq.slot), seq.pos, axis=self.row_axis)
            seq.slot = None
        decoding = [s for s in self.slots if id(s) not in gone_ids and s.next_token is not None]
        filling = [s for s in self.slots if id(s) not in gone_ids and s.next_token is None]
        n = len(decoding)
        # the fewest moves: decoding sequences above the new top fill the holes below it, then the
        # sequence being prefilled (if any) moves down to just above them
        holes = sorted(set(range(n)) - {s.slot for s in decoding})
        for seq in [s for s in decoding if s.slot >= n]:
            self._move(seq, holes.pop(0))
        for k, seq in enumerate(filling):
            self._move(seq, n + k)
        with self._cond:
            self.slots = sorted(decoding, key=lambda s: s.slot) + filling

    def _move(self, seq: Sequence, slot: int) -> None:
        if seq.slot != slot:
            self.stepper.move_slot(seq.slot, slot, seq.pos)
            seq.slot = slot
