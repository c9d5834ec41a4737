"""One sequence's grammar state, and the masks of a batch computed while the model runs.

A generation loop with a ``Constraint``:

    logits = constraint.apply(logits)   # tokens the grammar does not allow next get -inf
    token = sampler(logits)
    constraint.consume(token)           # advance the grammar; constraint.finished: nothing may follow

The mask of the next token depends only on the tokens so far, not on the logits, so it can be
computed before the model has produced them: ``MaskWorker.start(constraints)`` computes the masks of
every sequence of a batched step in parallel (llguidance's executor, off the calling thread, the GIL
released) while the step runs, and ``apply`` then only reads the finished mask. A constraint whose
mask was not prepared computes it in ``apply``.
"""
from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from .grammar import GrammarError


class Constraint:
    """The grammar state of one sequence over ``n_vocab`` logits; ``stop_ids`` end the output."""

    def __init__(self, matcher: Any, n_vocab: int, stop_ids: Iterable[int]):
        self.matcher = matcher
        self.n_vocab = int(n_vocab)
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        self.words = (self.n_vocab + 31) // 32
        self.bitmask = np.zeros(self.words, dtype=np.int32)
        self.fresh = False           # bitmask is the mask of the current state
        self.mask_seconds = 0.0      # time spent computing this sequence's masks in apply()
        self.apply_seconds = 0.0     # time spent applying them to the logits

    @property
    def finished(self) -> bool:
        """Whether the grammar is complete and allows nothing more (the output should end)."""
        return self.matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """Whether the text so far is a complete sentence of the grammar (it may end here)."""
        return self.matcher.is_accepting()

    def fill_mask(self) -> None:
        """Compute the mask of the current state into ``bitmask``."""
        t0 = time.perf_counter()
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.ctypes.data, self.bitmask.nbytes)
        self.fresh = True
        self.mask_seconds += time.perf_counter() - t0

    def allowed(self, size: int | None = None) -> np.ndarray:
        """A bool array over ``size`` ids (default ``n_vocab``): the tokens the grammar allows next."""
        if not self.fresh:
            self.fill_mask()
        self._check()
        size = self.n_vocab if size is None else int(size)
        bits = np.unpackbits(self.bitmask.view(np.uint8), count=min(size, 32 * self.words), bitorder="little")
        out = bits.view(bool)
        if out.size < size:  # logits past the grammar's vocabulary are never allowed
            out = np.concatenate([out, np.zeros(size - out.size, dtype=bool)])
        return out

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """A float32 copy of ``logits`` with every token the grammar does not allow set to -inf."""
        x = np.asarray(logits, dtype=np.float32).reshape(-1)
        allowed = self.allowed(x.size)
        t0 = time.perf_counter()
        if not allowed.any():
            raise GrammarError("the grammar allows no token at this point", "grammar_dead_end")
        out = np.where(allowed, x, np.float32(-np.inf))
        self.apply_seconds += time.perf_counter() - t0
        return out

    def consume(self, token: int) -> None:
        """Advance the grammar by the sampled ``token`` (GrammarError if the grammar refuses it)."""
        self.fresh = False
        if not self.matcher.consume_token(int(token)):
            raise GrammarError(f"the grammar refused token {int(token)}: {self.matcher.get_error()}",
                               "grammar_refused_token")

    def _check(self) -> None:
        if self.matcher.is_error():
            # llguidance's message, without the marker line it adds when its errors are not verbose
            lines = [x for x in self.matcher.get_error().splitlines() if x.strip() and x.strip() != "<non-verbose/>"]
            raise GrammarError(f"the grammar engine stopped: {' '.join(lines) or 'unknown error'}",
                               "grammar_engine_error")


class MaskWorker:
    """Computes the masks of many constraints at once, on a thread of its own, in parallel over
    ``threads`` threads of llguidance's executor (None: its default). ``seconds`` is the wall time
    spent computing batches of masks, ``masks`` how many."""

    def __init__(self, threads: int | None = None):
        import llguidance
        self._executor = llguidance.LLExecutor(threads)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lightspeed-masks")
        self.seconds = 0.0
        self.masks = 0

    def start(self, constraints: Iterable[Constraint]) -> concurrent.futures.Future | None:
        """Begin computing the masks of those ``constraints`` that need one; None when none does.
        Until the future is done the caller must not touch them."""
        todo = [c for c in constraints if not c.fresh]
        if not todo:
            return None
        return self._pool.submit(self._fill, todo)

    def fill(self, constraints: Iterable[Constraint]) -> None:
        """Compute the masks now (on the calling thread, still in parallel over the constraints)."""
        todo = [c for c in constraints if not c.fresh]
        if todo:
            self._fill(todo)

    def _fill(self, todo: list[Constraint]) -> None:
        t0 = time.perf_counter()
        words = todo[0].words
        if any(c.words != words for c in todo):
            raise ValueError("constraints of one batch must share a vocabulary size")
        masks = np.zeros((len(todo), words), dtype=np.int32)
        self._executor.unsafe_compute_mask_ptr([(c.matcher, i) for i, c in enumerate(todo)], masks.ctypes.data,
                                               words * 4, len(todo))
        for i, c in enumerate(todo):
            c.bitmask = masks[i]
            c.fresh = True
        self.seconds += time.perf_counter() - t0
        self.masks += len(todo)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
