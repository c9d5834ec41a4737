"""Text generation: KV cache, sampling, and a streaming generation loop.

    step = model.compile(ctx=2048)                  # a CompiledLM (lightspeed.models.base)
    cache = KVCache(step)
    gen = generate(step, model.tokenizer, ids, SamplingParams(temperature=0.7, seed=1), cache=cache)
    for text in gen:                                 # valid UTF-8 pieces as tokens arrive
        print(text, end="")
    gen.token_ids, gen.finish_reason, gen.stats      # filled in as it runs

The cache remembers which tokens it holds, so a later call whose prompt starts with the
same tokens (the next turn of a chat) only runs the new ones. Sampling (lightspeed.sampling,
whose names this module re-exports) happens in numpy on the logits of the last position; a
fixed seed makes it reproducible.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

import numpy as np

from .sampling import Sampler, SamplingParams, apply_repetition_penalty, filter_logits

if TYPE_CHECKING:
    from .io import Tokenizer
    from .models.base import CompiledLM
    from .structured import Constraint

__all__ = ["Sampler", "SamplingParams", "apply_repetition_penalty", "filter_logits", "KVCache", "ContextFullError",
           "GenerationStats", "StopStringFilter", "Generation", "generate"]


# KV cache ---------------------------------------------------------------------------------------------
class KVCache:
    """The cache arrays of a compiled step program and the token ids whose keys and values they hold.

    Rows past ``pos`` may hold stale values from an earlier, longer sequence: the program never
    reads a row before writing it, so truncating is free."""

    def __init__(self, step: "CompiledLM"):
        self.step = step
        self.arrays = step.new_caches()
        self.tokens: list[int] = []

    @property
    def pos(self) -> int:
        """The number of tokens in the cache (the position of the next one)."""
        return len(self.tokens)

    @property
    def capacity(self) -> int:
        return self.step.ctx

    def truncate(self, n: int) -> None:
        """Keep only the first ``n`` tokens."""
        del self.tokens[max(n, 0):]

    def reuse(self, ids: Sequence[int]) -> int:
        """Drop cached tokens that do not match ``ids`` and return how many of ``ids`` are
        already cached. At least one token is left to run, since logits come from running one."""
        n = 0
        limit = min(len(self.tokens), len(ids) - 1)
        while n < limit and self.tokens[n] == ids[n]:
            n += 1
        self.truncate(n)
        return n

    def run(self, ids: Sequence[int]) -> np.ndarray:
        """Append ``ids`` (any number, in chunks the program accepts); returns the logits of the
        last chunk (the last row is the next-token distribution)."""
        if self.pos + len(ids) > self.capacity:
            raise ContextFullError(f"{self.pos} cached + {len(ids)} new tokens exceed the context bound of "
                                   f"{self.capacity} tokens")
        logits = None
        chunk = self.step.max_chunk
        for start in range(0, len(ids), chunk):
            part = list(ids[start:start + chunk])
            logits, self.arrays = self.step.run(part, self.pos, self.arrays)
            self.tokens.extend(int(i) for i in part)
        if logits is None:
            raise ValueError("KVCache.run: no tokens to run")
        return logits

    def reset(self) -> None:
        self.tokens.clear()


class ContextFullError(ValueError):
    """The cache has no room for more tokens."""


# the generation loop -------------------------------------------------------------------------------
@dataclass
class GenerationStats:
    prompt_tokens: int = 0         # tokens of the prompt that were run (not found in the cache)
    cached_tokens: int = 0         # tokens of the prompt reused from the cache
    generated_tokens: int = 0
    decode_steps: int = 0          # one-token runs
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    sampling_seconds: float = 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_steps / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "generated_tokens": self.generated_tokens, "prefill_seconds": round(self.prefill_seconds, 4),
                "decode_seconds": round(self.decode_seconds, 4),
                "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 2),
                "decode_tokens_per_s": round(self.decode_tokens_per_s, 2)}


class StopStringFilter:
    """Holds back text that might be the start of a stop string; reports when one appears."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """Add text; return what is safe to emit (everything before a found stop string)."""
        if not self.stops:
            return text
        buf = self.pending + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self.pending = True, ""
            return buf[:min(hits)]
        hold = 0
        for s in self.stops:  # the longest suffix of buf that is a proper prefix of a stop string
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        self.pending = buf[len(buf) - hold:] if hold else ""
        return buf[:len(buf) - hold]

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class TextStream:
    """An iterator over text pieces that fills ``text`` as it goes: a subclass sets ``self._iter`` (a generator
    of the pieces) and ``self.text``."""

    text: str
    _iter: Iterator[str]

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._iter)

    def run(self) -> str:
        """Generate to the end; the full text."""
        for _ in self:
            pass
        return self.text


class Generation(TextStream):
    """An iterator over generated text pieces; ``text``, ``token_ids``, ``finish_reason`` ("stop",
    "length" or "context") and ``stats`` fill in as it runs. ``run()`` consumes it and returns the text.

    With a ``constraint`` (``lightspeed.structured``: a JSON schema, a grammar) the logits are masked to the
    tokens the grammar allows before each token is sampled, and the text ends ("stop") when the grammar is
    complete or an end token it allows there is drawn."""

    def __init__(self, step: "CompiledLM", tokenizer: "Tokenizer | None", prompt_ids: Sequence[int],
                 params: SamplingParams | None = None, max_tokens: int = 256, stop_ids: Iterable[int] | None = None,
                 stop_strings: Sequence[str] = (), cache: KVCache | None = None,
                 constraint: "Constraint | None" = None):
        if not prompt_ids:
            raise ValueError("generate: the prompt has no tokens")
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.step, self.tokenizer = step, tokenizer
        self.prompt_ids = [int(i) for i in prompt_ids]
        self.sampler = Sampler(params)
        self.max_tokens = max_tokens
        default_stops = tokenizer.stop_ids if tokenizer is not None else set()
        self.stop_ids = set(default_stops if stop_ids is None else stop_ids)
        self.stop_strings = list(stop_strings)
        self.cache = cache if cache is not None else KVCache(step)
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.stats = GenerationStats()
        self.last_logits: np.ndarray | None = None
        self.on_finish: Callable[["Generation"], None] | None = None  # called once when generation ends
        self.constraint = constraint  # may be set until the first piece is asked for
        self._iter = self._run()

    def _emit(self, piece: str) -> str:
        self.text += piece
        return piece

    def _run(self) -> Iterator[str]:
        cache, stats = self.cache, self.stats
        reused = cache.reuse(self.prompt_ids)
        stats.cached_tokens = reused
        new = self.prompt_ids[reused:]
        if cache.pos + len(new) > cache.capacity:
            raise ContextFullError(f"the prompt ({len(self.prompt_ids)} tokens) does not fit the context bound of "
                                   f"{cache.capacity} tokens")
        t0 = time.perf_counter()
        logits = cache.run(new)
        stats.prefill_seconds = time.perf_counter() - t0
        stats.prompt_tokens = len(new)
        decoder = self.tokenizer.stream(skip_special_tokens=False) if self.tokenizer is not None else None
        stops = StopStringFilter(self.stop_strings)
        history = list(self.prompt_ids)
        while True:
            self.last_logits = logits[-1]
            if len(self.token_ids) >= self.max_tokens:
                self.finish_reason = "length"
                break
            t0 = time.perf_counter()
            c = self.constraint
            x = logits[-1] if c is None else c.apply(logits[-1])
            token = self.sampler(x, history if self.sampler.params.repetition_penalty != 1.0 else ())
            stats.sampling_seconds += time.perf_counter() - t0
            if token in self.stop_ids or (c is not None and token in c.stop_ids):
                self.finish_reason = "stop"
                break
            if c is not None:
                c.consume(token)
            self.token_ids.append(token)
            history.append(token)
            stats.generated_tokens += 1
            if decoder is not None:
                piece = stops.push(decoder.push(token))
                if piece:
                    yield self._emit(piece)
                if stops.stopped:
                    self.finish_reason = "stop"
                    break
            if c is not None and c.finished:
                self.finish_reason = "stop"
                break
            if len(self.token_ids) >= self.max_tokens:
                self.finish_reason = "length"
                break
            if cache.pos >= cache.capacity:
                self.finish_reason = "context"
                break
            t0 = time.perf_counter()
            logits = cache.run([token])
            stats.decode_seconds += time.perf_counter() - t0
            stats.decode_steps += 1
        if decoder is not None and not stops.stopped:
            tail = stops.push(decoder.flush()) + (stops.flush() if not stops.stopped else "")
            if tail:
                yield self._emit(tail)
        if self.on_finish is not None:
            self.on_finish(self)


def generate(step: "CompiledLM", tokenizer: "Tokenizer | None", prompt_ids: Sequence[int],
             params: SamplingParams | None = None, **options) -> Generation:
    """A streaming ``Generation`` of up to ``max_tokens`` tokens after ``prompt_ids`` (see ``Generation``)."""
    return Generation(step, tokenizer, prompt_ids, params, **options)
