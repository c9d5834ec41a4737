"""A request's choices on the engine, and server-sent events.

``Choices`` submits the ``n`` sequences of one request together (all or none are queued) and gathers
their events on one asyncio queue, tagged with the choice index, so that streaming endpoints can
interleave them and non-streaming ones can wait for all. However the consumer stops (it is done, the
client went away, an error), every sequence still running is cancelled and its slot freed.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..engine.logprobs import TokenLogprob
from ..engine.scheduler import EngineStoppedError, QueueFullError
from ..engine.sequence import DONE, ERROR, TEXT, RequestOptions, Sequence
from .common import ServerState
from .protocol import APIError


async def wait_disconnect(request: Request) -> None:
    """Return when the client has gone away (``http.disconnect`` on the receive channel)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def sse(obj: Any, event: str | None = None) -> str:
    """One server-sent event holding ``obj`` as JSON (with an ``event:`` line when named)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(obj, ensure_ascii=False)}\n\n"


@dataclass
class ChoiceResult:
    """One finished choice: its text, finish reason and sequence (token ids, logprobs, stop string)."""

    text: str
    finish_reason: str
    seq: Sequence

    @property
    def logprobs(self) -> list[TokenLogprob]:
        return self.seq.logprobs


class Choices:
    """The sequences of one request (one per choice) and the queue their events arrive on."""

    def __init__(self, state: ServerState, ids: list[int], options: list[RequestOptions],
                 on_error: Callable[[int, str, str], APIError] | None = None):
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.state = state

        def sink_for(index: int) -> Callable[[str, object], None]:
            def sink(kind: str, payload: object) -> None:  # called on the engine thread
                try:
                    loop.call_soon_threadsafe(self.queue.put_nowait, (index, kind, payload))
                except RuntimeError:  # the loop has closed (shutdown): nobody is listening
                    pass
            return sink

        tok = state.model.tokenizer
        self.seqs = [Sequence(ids, o, tok, tok.stop_ids, sink_for(i)) for i, o in enumerate(options)]
        try:
            state.engine.submit_all(self.seqs)
        except QueueFullError as e:
            raise APIError(429, f"too many requests are queued ({e}); retry later", type="rate_limit_error",
                           code="queue_full", headers={"Retry-After": str(state.retry_after_s)}) from None
        except EngineStoppedError as e:
            raise APIError(503, str(e), type="server_error", code="shutting_down") from None

    @property
    def usage(self) -> dict:
        """OpenAI's usage: the prompt once, the completion tokens of every choice, and the prompt tokens
        whose rows came from the prefix cache (the most of any choice)."""
        n = len(self.seqs[0].prompt_ids)
        m = sum(len(s.token_ids) for s in self.seqs)
        return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m,
                "prompt_tokens_details": {"cached_tokens": max(s.cached_tokens for s in self.seqs)}}

    def cancel(self) -> None:
        """Cancel every choice still running."""
        if any(s.finish_reason is None for s in self.seqs):
            for s in self.seqs:
                if s.finish_reason is None:
                    s.cancel()
            self.state.engine.wake()

    async def events(self) -> AsyncIterator[tuple[int, str, object]]:
        """``(index, kind, payload)``: text pieces and logprobs, one DONE (finish reason) per choice, or
        one ERROR (message) that ends them all. Cancels what runs if the consumer stops early."""
        running = len(self.seqs)
        try:
            while running:
                index, kind, payload = await self.queue.get()
                yield index, kind, payload
                if kind == ERROR:
                    return
                running -= kind == DONE
        finally:
            self.cancel()

    async def collect(self, request: Request) -> list[ChoiceResult]:
        """Every choice once all have finished; everything is cancelled if the client disconnects first."""
        watcher = asyncio.ensure_future(wait_disconnect(request))
        pieces: list[list[str]] = [[] for _ in self.seqs]
        results: list[ChoiceResult | None] = [None] * len(self.seqs)
        try:
            while any(r is None for r in results):
                getter = asyncio.ensure_future(self.queue.get())
                done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    raise APIError(499, "the client disconnected")
                index, kind, payload = getter.result()
                if kind == TEXT:
                    pieces[index].append(payload)
                elif kind == ERROR:
                    raise APIError(500, str(payload), type="server_error")
                elif kind == DONE:
                    results[index] = ChoiceResult("".join(pieces[index]), str(payload), self.seqs[index])
            return results  # type: ignore[return-value]
        finally:
            watcher.cancel()
            self.cancel()


def streaming_response(gen: AsyncIterator[str], choices: Choices, request: Request) -> StreamingResponse:
    """An SSE response of ``gen``. The choices are cancelled as soon as the client disconnects
    (watched on the receive channel, not only when a write fails) and however the stream ends."""
    async def guarded() -> AsyncIterator[str]:
        watcher = asyncio.ensure_future(wait_disconnect(request))
        watcher.add_done_callback(lambda t: None if t.cancelled() else choices.cancel())
        try:
            async for text in gen:
                yield text
        finally:
            watcher.cancel()
            choices.cancel()
            await gen.aclose()
    return StreamingResponse(guarded(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
