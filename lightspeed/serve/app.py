"""The HTTP API (FastAPI): OpenAI's /v1/models, /v1/completions, /v1/chat/completions and
/v1/embeddings, plus /health.

Handlers run on the event loop and never call native code: a generation is a ``Sequence``
submitted to the engine thread, whose events (text pieces, the finish) come back through an
asyncio queue. Bodies are read with a size cap and a deadline and validated strictly
(``protocol``); every error is OpenAI's error JSON. Tokenizing, and rendering the chat template
(the model file's code, bounded by ``template_limits``), run on worker threads. Every client is
watched for ``http.disconnect`` while its request runs (streaming or not): when it goes away its
sequence is cancelled, and the engine frees the slot before its next step.
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..generate import SamplingParams
from ..io.errors import ChatTemplateLimitError
from ..io.template_limits import TemplateLimits
from .engine import Engine, EngineStoppedError, QueueFullError
from .protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    SamplingFields,
    parse_json_body,
    validate,
)
from .sequence import DONE, ERROR, TEXT, RequestOptions, Sequence

MAX_EMBED_INPUTS = 256


@dataclass
class ServerState:
    """What the handlers need: the model (a ``lightspeed.api.Model``), its engine, limits."""

    model: Any
    model_id: str
    engine: Engine
    embedder: Any = None
    embed_id: str | None = None
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    body_timeout_s: float = 30.0         # from the request head to the body's last byte (then 408)
    template_limits: TemplateLimits = field(default_factory=TemplateLimits)
    retry_after_s: int = 1
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def ctx(self) -> int:
        return self.engine.ctx


# helpers ---------------------------------------------------------------------------------------------
def _error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _check_auth(state: ServerState, request: Request) -> None:
    if state.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
        raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def _read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The body, refusing (413) anything over ``limit`` bytes before reading it all, and (408, closing the
    connection) a body that has not fully arrived ``timeout`` seconds after the request head."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()) or len(declared) > 18:
            raise APIError(400, f"invalid Content-Length header {declared[:40]!r}")
        if int(declared) > limit:
            raise APIError(413, f"the request body ({declared} bytes) exceeds the limit of {limit} bytes",
                           code="request_too_large")

    async def read() -> bytes:
        parts, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"the request body exceeds the limit of {limit} bytes",
                               code="request_too_large")
            parts.append(chunk)
        return b"".join(parts)

    try:
        return await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout:g} s", code="request_timeout",
                       headers={"Connection": "close"}) from None


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _Stream:
    """A submitted sequence and the queue its events arrive on."""

    def __init__(self, state: ServerState, ids: list[int], options: RequestOptions):
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.state = state

        def sink(kind: str, payload: object) -> None:  # called on the engine thread
            try:
                loop.call_soon_threadsafe(self.queue.put_nowait, (kind, payload))
            except RuntimeError:  # the loop has closed (shutdown): nobody is listening
                pass

        tok = state.model.tokenizer
        self.seq = Sequence(ids, options, tok, tok.stop_ids, sink)
        try:
            state.engine.submit(self.seq)
        except QueueFullError as e:
            raise APIError(429, f"too many requests are queued ({e}); retry later", type="rate_limit_error",
                           code="queue_full", headers={"Retry-After": str(state.retry_after_s)}) from None
        except EngineStoppedError as e:
            raise APIError(503, str(e), type="server_error", code="shutting_down") from None

    def cancel(self) -> None:
        if self.seq.finish_reason is None:
            self.seq.cancel()
            self.state.engine.wake()

    async def events(self) -> AsyncIterator[tuple[str, object]]:
        """Text pieces, then one DONE (finish reason) or ERROR (message); cancels the sequence if the
        consumer stops early."""
        try:
            while True:
                kind, payload = await self.queue.get()
                yield kind, payload
                if kind in (DONE, ERROR):
                    return
        finally:
            self.cancel()

    async def collect(self, request: Request) -> tuple[str, str]:
        """The whole text and finish reason; the sequence is cancelled if the client disconnects first."""
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        pieces: list[str] = []
        try:
            while True:
                getter = asyncio.ensure_future(self.queue.get())
                done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    raise APIError(499, "the client disconnected")
                kind, payload = getter.result()
                if kind == TEXT:
                    pieces.append(payload)
                elif kind == ERROR:
                    raise APIError(500, str(payload), type="server_error")
                else:
                    return "".join(pieces), str(payload)
        finally:
            watcher.cancel()
            self.cancel()


def _options(state: ServerState, req: SamplingFields, n_prompt: int, max_tokens: int | None) -> RequestOptions:
    """Sampling options, checking the token budget against the context (400s)."""
    ctx = state.ctx
    if n_prompt > ctx:
        raise APIError(400, f"the prompt is {n_prompt} tokens long; this server's context is {ctx} tokens",
                       param="messages" if isinstance(req, ChatCompletionRequest) else "prompt",
                       code="context_length_exceeded")
    if max_tokens is None:
        max_tokens = ctx - n_prompt
        if max_tokens < 1:
            raise APIError(400, f"the prompt ({n_prompt} tokens) leaves no room to generate in the context of "
                                f"{ctx} tokens", code="context_length_exceeded")
    elif max_tokens > ctx:
        raise APIError(400, f"max_tokens is {max_tokens}; at most {ctx} (the context) on this server",
                       param="max_tokens", code="max_tokens_too_large")
    elif n_prompt + max_tokens > ctx:
        raise APIError(400, f"the prompt ({n_prompt} tokens) plus max_tokens ({max_tokens}) exceed this server's "
                            f"context of {ctx} tokens", param="max_tokens", code="context_length_exceeded")
    vocab = state.model.config.vocab_size
    bias = {}
    for k, v in (req.logit_bias or {}).items():
        if int(k) >= vocab:
            raise APIError(422, f"logit_bias names token {k}, outside the vocabulary of {vocab}", param="logit_bias")
        bias[int(k)] = float(v)
    seed = None if req.seed is None else req.seed % (1 << 64)
    # top_p = 0 keeps only the most likely token (as greedy), which the sampler spells as a tiny mass
    params = SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p or 1e-9,
                            min_p=req.min_p, repetition_penalty=req.repetition_penalty, seed=seed)
    return RequestOptions(max_tokens=max_tokens, params=params, stop=req.stop_strings(), logit_bias=bias,
                          presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                          ignore_eos=req.ignore_eos)


def _check_model(state: ServerState, name: str, want: str) -> None:
    ids = {"generate": state.model_id, "embed": state.embed_id}
    if name == ids[want]:
        return
    if name in ids.values():
        kind = "an embedding" if name == state.embed_id else "a text generation"
        raise APIError(400, f"model {name!r} is {kind} model; it does not serve this endpoint", param="model",
                       code="wrong_model_type")
    raise APIError(404, f"the model {name!r} does not exist; this server serves "
                        f"{', '.join(repr(i) for i in ids.values() if i)}", param="model", code="model_not_found")


async def _body(state: ServerState, request: Request, model: type) -> Any:
    _check_auth(state, request)
    return validate(model, parse_json_body(await _read_body(request, state.max_body_bytes, state.body_timeout_s)))


def _streaming(gen: AsyncIterator[str], stream: _Stream, request: Request) -> StreamingResponse:
    """An SSE response of ``gen``. The sequence is cancelled as soon as the client disconnects
    (watched on the receive channel, not only when a write fails) and however the stream ends."""
    async def guarded() -> AsyncIterator[str]:
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        watcher.add_done_callback(lambda t: None if t.cancelled() else stream.cancel())
        try:
            async for text in gen:
                yield text
        finally:
            watcher.cancel()
            stream.cancel()
            await gen.aclose()
    return StreamingResponse(guarded(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# the app ---------------------------------------------------------------------------------------------
def create_app(state: ServerState) -> FastAPI:
    """The FastAPI application serving ``state``'s model (and embedder, when there is one)."""
    app = FastAPI(title="lightspeed", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.lightspeed = state

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return _error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found" if e.status_code == 404 else "method_not_allowed" if e.status_code == 405 else None
        return _error_response(APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}",
                                        code=kind, headers=dict(e.headers or {})))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        return _error_response(APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error"))

    @app.get("/health")
    async def health() -> JSONResponse:
        status = "ok" if state.engine.accepting else "shutting_down"
        return JSONResponse({"status": status, "model": state.model_id, **state.engine.stats()},
                            status_code=200 if state.engine.accepting else 503)

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": state.created, "owned_by": "lightspeed"}

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        _check_auth(state, request)
        names = [n for n in (state.model_id, state.embed_id) if n]
        return JSONResponse({"object": "list", "data": [model_card(n) for n in names]})

    @app.get("/v1/models/{name:path}")
    async def model(name: str, request: Request) -> JSONResponse:
        _check_auth(state, request)
        if name not in (state.model_id, state.embed_id):
            raise APIError(404, f"the model {name!r} does not exist", param="model", code="model_not_found")
        return JSONResponse(model_card(name))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req: CompletionRequest = await _body(state, request, CompletionRequest)
        _check_model(state, req.model, "generate")
        if isinstance(req.prompt, str) or isinstance(req.prompt[0], str):
            text = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
            ids = await run_in_threadpool(state.model.prompt_ids, text)
        else:
            vocab = state.model.config.vocab_size
            if any(not isinstance(i, int) or not 0 <= i < vocab for i in req.prompt):
                raise APIError(422, f"prompt token ids must lie in [0, {vocab})", param="prompt")
            ids = list(req.prompt)
        if not ids:
            raise APIError(400, "the prompt has no tokens", param="prompt")
        stream = _Stream(state, ids, _options(state, req, len(ids), req.max_tokens))
        rid, created = _new_id("cmpl"), int(time.time())

        def chunk(text: str, finish: str | None) -> dict:
            return {"id": rid, "object": "text_completion", "created": created, "model": state.model_id,
                    "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}

        if req.stream:
            async def sse() -> AsyncIterator[str]:
                async for kind, payload in stream.events():
                    if kind == TEXT:
                        yield _sse(chunk(payload, None))
                    elif kind == ERROR:
                        yield _sse(APIError(500, str(payload), type="server_error").body())
                        return
                    else:
                        yield _sse(chunk("", payload))
                if req.include_usage():
                    yield _sse({**chunk("", None), "choices": [], "usage": stream.seq.usage})
                yield "data: [DONE]\n\n"
            return _streaming(sse(), stream, request)
        text, finish = await stream.collect(request)
        body = chunk(text, finish)
        body["usage"] = stream.seq.usage
        return JSONResponse(body)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req: ChatCompletionRequest = await _body(state, request, ChatCompletionRequest)
        _check_model(state, req.model, "generate")
        # rendering runs on a worker thread (the template is the model file's code, bounded by its limits) and
        # tokenizes the messages' text as text: "<|im_end|>" in a message is never a control token
        try:
            ids = await run_in_threadpool(partial(state.model.tokenizer.encode_chat, req.chat_messages(), True,
                                                  limits=state.template_limits))
        except ChatTemplateLimitError as e:
            raise APIError(500, f"the model's chat template was stopped: {e}", type="server_error",
                           code="chat_template_limit") from None
        except ValueError as e:  # ChatTemplateError: the template rejects this conversation (roles out of order)
            raise APIError(400, f"the chat template cannot render these messages: {e}", param="messages") from None
        stream = _Stream(state, ids, _options(state, req, len(ids), req.limit()))
        rid, created = _new_id("chatcmpl"), int(time.time())

        def chunk(delta: dict, finish: str | None) -> dict:
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": state.model_id,
                    "system_fingerprint": None,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

        if req.stream:
            async def sse() -> AsyncIterator[str]:
                yield _sse(chunk({"role": "assistant", "content": ""}, None))
                async for kind, payload in stream.events():
                    if kind == TEXT:
                        yield _sse(chunk({"content": payload}, None))
                    elif kind == ERROR:
                        yield _sse(APIError(500, str(payload), type="server_error").body())
                        return
                    else:
                        yield _sse(chunk({}, payload))
                if req.include_usage():
                    yield _sse({**chunk({}, None), "choices": [], "usage": stream.seq.usage})
                yield "data: [DONE]\n\n"
            return _streaming(sse(), stream, request)
        text, finish = await stream.collect(request)
        return JSONResponse({
            "id": rid, "object": "chat.completion", "created": created, "model": state.model_id,
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish}],
            "usage": stream.seq.usage})

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> JSONResponse:
        req: EmbeddingRequest = await _body(state, request, EmbeddingRequest)
        if state.embedder is None:
            raise APIError(404, f"the model {req.model!r} does not exist; this server has no embedding model "
                                "(start it with --embed-model)", param="model", code="model_not_found")
        _check_model(state, req.model, "embed")
        texts = req.texts()
        if not texts or len(texts) > MAX_EMBED_INPUTS:
            raise APIError(422, f"input must hold 1 to {MAX_EMBED_INPUTS} texts, got {len(texts)}", param="input")
        if any(not t for t in texts):
            raise APIError(422, "input texts must not be empty", param="input")
        emb = state.embedder
        if req.dimensions is not None and req.dimensions != emb.dim:
            raise APIError(422, f"this model's embeddings have {emb.dim} dimensions, not {req.dimensions}",
                           param="dimensions")
        n_tokens = sum(len(i) for i in await run_in_threadpool(emb.token_ids, texts))
        try:
            vectors = await asyncio.wrap_future(state.engine.call(lambda: emb.embed(texts)))
        except EngineStoppedError as e:
            raise APIError(503, str(e), type="server_error", code="shutting_down") from None
        data = []
        for i, v in enumerate(np.asarray(vectors, dtype=np.float32)):
            value = base64.b64encode(v.astype("<f4").tobytes()).decode() if req.encoding_format == "base64" \
                else [float(x) for x in v]
            data.append({"object": "embedding", "index": i, "embedding": value})
        return JSONResponse({"object": "list", "data": data, "model": state.embed_id,
                             "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})

    return app
