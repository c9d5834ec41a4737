"""The engine for one process's own text: ``lightspeed generate`` and ``lightspeed chat`` run on it.

``LocalEngine(model)`` starts an ``Engine`` (lightspeed.engine.scheduler) with one slot over the model's own
single-sequence program (its decode steps too, through ``SequentialStepper``: no second program to compile)
and a prefix cache, so a chat's next turn prefills only what was said since the last one. ``generate(ids,
options)`` submits a ``Sequence`` and returns an ``EngineGeneration``: the interface of
``lightspeed.generate.Generation`` (iterate the text pieces; ``text``, ``token_ids``, ``finish_reason``,
``stats``) fed by the engine thread. The sampler, stops and detokenizer are the served sequences' (the same
code as ``Generation``'s loop), so the text equals what ``Model.generate`` and ``lightspeed serve`` give.
"""
from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import Any

from ..generate import ContextFullError, GenerationStats, SamplingParams, TextStream
from ..prefix_cache import PrefixCache
from .scheduler import Engine, SequentialStepper
from .sequence import DONE, ERROR, TEXT, RequestOptions, Sequence

DEFAULT_LOCAL_CACHE_MB = 64  # a conversation of 2,048 SmolLM2 tokens holds ~94 MB of rows; the recent ones


class EngineGeneration(TextStream):
    """One sequence's text pieces as the engine produces them (``lightspeed.generate.Generation``'s interface).
    ``on_finish(self)`` runs once when it ends; an error the engine reports is raised as ValueError."""

    def __init__(self, engine: "LocalEngine", seq: Sequence, events: "queue.Queue[tuple[str, object]]"):
        self._engine, self.seq, self._events = engine, seq, events
        self.prompt_ids = seq.prompt_ids
        self.text = ""
        self.finish_reason: str | None = None
        self.stats = GenerationStats()
        self.on_finish: Callable[["EngineGeneration"], None] | None = None
        self._marks = engine.counters()
        self._iter = self._run()

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids

    def close(self) -> None:
        """The consumer is done with it: stop generating."""
        self._iter.close()
        self.cancel()

    def cancel(self) -> None:
        """Stop generating (the engine drops the sequence before its next step)."""
        self.seq.cancel()
        self._engine.engine.wake()

    def _run(self) -> Iterator[str]:
        try:
            while True:
                kind, payload = self._events.get()
                if kind == TEXT:
                    self.text += payload
                    yield payload
                elif kind == DONE:
                    break
                elif kind == ERROR:
                    raise ValueError(str(payload))
        except BaseException:  # KeyboardInterrupt, or the consumer closed the iterator: free the slot
            self.cancel()
            raise
        seq = self.seq
        # Sequence speaks OpenAI's vocabulary (a full context is a "length"); Generation says "context"
        self.finish_reason = "context" if seq.finish_reason == "length" and seq.pos >= self._engine.ctx and \
            len(seq.token_ids) < seq.options.max_tokens else seq.finish_reason
        prefill, decode, steps = (now - before for now, before in zip(self._engine.counters(), self._marks))
        s = self.stats
        s.cached_tokens = seq.cached_tokens
        s.prompt_tokens = len(seq.prompt_ids) - seq.cached_tokens
        s.generated_tokens = len(seq.token_ids)
        s.prefill_seconds, s.decode_seconds, s.decode_steps = prefill, decode, steps
        if self.on_finish is not None:
            self.on_finish(self)


class LocalEngine:
    """An engine with one slot over ``model.step`` (a ``lightspeed.api.Model``), started at once; ``close()``
    stops its thread. ``prefix_cache_mb`` bounds the rows kept between requests (0: none)."""

    def __init__(self, model, prefix_cache_mb: int = DEFAULT_LOCAL_CACHE_MB):
        if prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0, got {prefix_cache_mb!r}")
        self.model = model
        self.ctx = model.step.ctx
        cache = PrefixCache(prefix_cache_mb << 20) if prefix_cache_mb > 0 else None
        self.engine = Engine(model.step, SequentialStepper(model.step, 1), prefix_cache=cache)
        self.engine.start()

    def counters(self) -> tuple[float, float, int]:
        """(seconds in prefill calls, seconds in decode steps, decode steps) so far."""
        e = self.engine
        return e.prefill_seconds, e.step_seconds, e.steps

    def generate(self, ids: list[int], *, max_tokens: int = 256, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0, seed: int | None = None,
                 stop=(), grammar=None) -> EngineGeneration:
        """Stream the continuation of prompt ``ids``; the options of ``Model.generate``, and ``grammar``
        (a ``lightspeed.structured.CompiledGrammar``) for output that must be one of its sentences.
        ContextFullError when the prompt leaves no room for a token."""
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if len(ids) >= self.ctx:
            raise ContextFullError(f"the prompt ({len(ids)} tokens) does not fit the context bound of "
                                   f"{self.ctx} tokens")
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repetition_penalty=repetition_penalty, seed=seed)
        options = RequestOptions(max_tokens=max_tokens, params=params, stop=list(stop), grammar=grammar)
        events: queue.Queue[tuple[str, object]] = queue.Queue()
        tok = self.model.tokenizer
        seq = Sequence(ids, options, tok, tok.stop_ids, lambda kind, payload: events.put((kind, payload)))
        gen = EngineGeneration(self, seq, events)
        self.engine.submit(seq)
        return gen

    def close(self) -> None:
        self.engine.stop(timeout=5.0)

    def __enter__(self) -> "LocalEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EngineChat:
    """A conversation on a ``LocalEngine``: its messages; each turn's prompt is the whole conversation, whose
    rows up to the last turn come from the engine's prefix cache."""

    def __init__(self, local: LocalEngine, system: str | None = None):
        self.local = local
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []

    def send(self, content: str, **options: Any) -> EngineGeneration:
        """Add a user message and stream the reply; the reply joins the conversation when it ends."""
        self.messages.append({"role": "user", "content": content})
        ids = self.local.model.chat_ids(self.messages)
        gen = self.local.generate(ids, **options)
        gen.on_finish = lambda g: self.messages.append({"role": "assistant", "content": g.text})
        return gen

    def reset(self) -> None:
        self.messages = [m for m in self.messages[:1] if m["role"] == "system"]
