"""The HTTP API (FastAPI): OpenAI's /v1/models, /v1/completions, /v1/chat/completions and
/v1/embeddings, Anthropic's /v1/messages (``anthropic``), plus /health.

Handlers run on the event loop and never call native code: a generation is a ``Sequence``
submitted to the engine thread (``n`` of them for ``n`` choices, ``streams.Choices``), whose events
(text pieces, logprobs, the finish) come back through an asyncio queue. Bodies are read with a size
cap and a deadline and validated strictly (``protocol``); every error is OpenAI's error JSON
(Anthropic's on /v1/messages).
Tokenizing, and rendering the chat template (the model file's code, bounded by ``template_limits``),
run on worker threads. Every client is watched for ``http.disconnect`` while its request runs
(streaming or not): when it goes away its sequences are cancelled, and the engine frees the slots
before its next step.
"""
from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.scheduler import EngineStoppedError
from ..engine.sequence import ERROR, LOGPROBS, TEXT, RequestOptions
from ..generate import SamplingParams
from . import anthropic
from ..structured import CompiledGrammar
from .common import ServerState, check_auth, check_model, new_id, parse_body, token_budget
from .constraints import ToolReply, plan_tools, response_grammar, tool_prompt
from .logprobs import TokenText, chat_logprobs, completion_logprobs
from .page import add_chat_page
from .protocol import APIError, ChatCompletionRequest, CompletionRequest, EmbeddingRequest, SamplingFields
from .streams import Choices, sse, streaming_response

__all__ = ["ServerState", "create_app"]

MAX_EMBED_INPUTS = 256


def _error_response(request: Request, e: APIError) -> JSONResponse:
    if anthropic.is_anthropic(request):
        return anthropic.error_response(e)
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _choice_options(state: ServerState, req: SamplingFields, n_prompt: int, max_tokens: int | None,
                    logprobs: int | None, grammar: CompiledGrammar | None = None) -> list[RequestOptions]:
    """One ``RequestOptions`` per choice, checking the token budget (400s). With a ``seed``, choice ``i``
    samples with ``seed + i``: the choices differ, and each is reproducible."""
    param = "messages" if isinstance(req, ChatCompletionRequest) else "prompt"
    max_tokens = token_budget(state, n_prompt, max_tokens, req.n, param)
    vocab = state.model.config.vocab_size
    bias = {}
    for k, v in (req.logit_bias or {}).items():
        if int(k) >= vocab:
            raise APIError(422, f"logit_bias names token {k}, outside the vocabulary of {vocab}", param="logit_bias")
        bias[int(k)] = float(v)
    options = []
    for i in range(req.n):
        seed = None if req.seed is None else (req.seed + i) % (1 << 64)
        # top_p = 0 keeps only the most likely token (as greedy), which the sampler spells as a tiny mass
        params = SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p or 1e-9,
                                min_p=req.min_p, repetition_penalty=req.repetition_penalty, seed=seed)
        options.append(RequestOptions(max_tokens=max_tokens, params=params, stop=req.stop_strings(),
                                      logit_bias=bias, presence_penalty=req.presence_penalty,
                                      frequency_penalty=req.frequency_penalty, ignore_eos=req.ignore_eos,
                                      logprobs=logprobs, grammar=grammar))
    return options


class _LogprobBuffer:
    """Logprob entries of each choice that arrived since its last chunk, shaped by ``shape``."""

    def __init__(self, n: int, wanted: bool, shape, text: TokenText):
        self.wanted, self.shape, self.text = wanted, shape, text
        self.pending: list[list] = [[] for _ in range(n)]

    def add(self, index: int, entries: list) -> None:
        self.pending[index].extend(entries)

    def take(self, index: int) -> dict | None:
        entries, self.pending[index] = self.pending[index], []
        return self.shape(entries, self.text) if self.wanted and entries else None


# the app ---------------------------------------------------------------------------------------------
def create_app(state: ServerState) -> FastAPI:
    """The FastAPI application serving ``state``'s model (and embedder, when there is one)."""
    app = FastAPI(title="lightspeed", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.lightspeed = state

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return _error_response(request, e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found" if e.status_code == 404 else "method_not_allowed" if e.status_code == 405 else None
        return _error_response(request, APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}",
                                                 code=kind, headers=dict(e.headers or {})))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        return _error_response(request, APIError(500, f"internal error: {type(e).__name__}: {e}",
                                                 type="server_error"))

    add_chat_page(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        status = "ok" if state.engine.accepting else "shutting_down"
        return JSONResponse({"status": status, "model": state.model_id, **state.engine.stats()},
                            status_code=200 if state.engine.accepting else 503)

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": state.created, "owned_by": "lightspeed"}

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        check_auth(state, request)
        names = [n for n in (state.model_id, state.embed_id) if n]
        return JSONResponse({"object": "list", "data": [model_card(n) for n in names]})

    @app.get("/v1/models/{name:path}")
    async def model(name: str, request: Request) -> JSONResponse:
        check_auth(state, request)
        if name not in (state.model_id, state.embed_id):
            raise APIError(404, f"the model {name!r} does not exist", param="model", code="model_not_found")
        return JSONResponse(model_card(name))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req: CompletionRequest = await parse_body(state, request, CompletionRequest)
        check_model(state, req.model, "generate")
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
        top = req.top_logprobs()
        grammar = await response_grammar(state, req.response_format.spec() if req.response_format else None)
        choices = Choices(state, ids, _choice_options(state, req, len(ids), req.max_tokens, top, grammar))
        rid, created = new_id("cmpl"), int(time.time())
        tokens = state.token_text

        def body(items: list[dict]) -> dict:
            return {"id": rid, "object": "text_completion", "created": created, "model": state.model_id,
                    "choices": items}

        def item(index: int, text: str, finish: str | None, logprobs: dict | None) -> dict:
            return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}

        if req.stream:
            async def events() -> AsyncIterator[str]:
                buf = _LogprobBuffer(req.n, top is not None, completion_logprobs, tokens)
                async for index, kind, payload in choices.events():
                    if kind == LOGPROBS:
                        buf.add(index, payload)
                    elif kind == TEXT:
                        yield sse(body([item(index, payload, None, buf.take(index))]))
                    elif kind == ERROR:
                        yield sse(APIError(500, str(payload), type="server_error").body())
                        return
                    else:
                        yield sse(body([item(index, "", payload, buf.take(index))]))
                if req.include_usage():
                    yield sse({**body([]), "usage": choices.usage})
                yield "data: [DONE]\n\n"
            return streaming_response(events(), choices, request)
        results = await choices.collect(request)
        items = [item(i, r.text, r.finish_reason, completion_logprobs(r.logprobs, tokens) if top is not None else None)
                 for i, r in enumerate(results)]
        return JSONResponse({**body(items), "usage": choices.usage})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req: ChatCompletionRequest = await parse_body(state, request, ChatCompletionRequest)
        check_model(state, req.model, "generate")
        messages = req.chat_messages()
        plan = await plan_tools(state, req.tool_list(), *req.choice())
        fmt = req.response_format.spec() if req.response_format else None
        if fmt is not None and plan.calls:
            raise APIError(400, "response_format cannot be combined with tools unless tool_choice is 'none'",
                           param="response_format")
        ids = await tool_prompt(state, messages, plan)
        grammar = plan.grammar or await response_grammar(state, fmt)
        top = req.top_logprobs_count()
        choices = Choices(state, ids, _choice_options(state, req, len(ids), req.limit(), top, grammar))
        rid, created = new_id("chatcmpl"), int(time.time())
        tokens = state.token_text
        replies = [ToolReply(plan, lambda: new_id("call", "_")) for _ in range(req.n)]

        def chunk(index: int, delta: dict, finish: str | None, logprobs: dict | None = None) -> dict:
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": state.model_id,
                    "system_fingerprint": None,
                    "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

        def deltas(index: int, events: list[tuple]) -> list[dict]:
            out = []
            for e in events:
                kind = e[0]
                if kind == "text":
                    out.append({"content": e[1]})
                    continue
                k = replies[index].index(e[1])
                if kind in ("call", "call_start"):  # the first delta of a call names it
                    args = e[3] if kind == "call" else ""
                    out.append({"tool_calls": [{"index": k, "id": e[1], "type": "function",
                                                "function": {"name": e[2], "arguments": args}}]})
                elif kind == "arguments":
                    out.append({"tool_calls": [{"index": k, "function": {"arguments": e[2]}}]})
            return out

        if req.stream:
            async def events() -> AsyncIterator[str]:
                buf = _LogprobBuffer(req.n, top is not None, chat_logprobs, tokens)
                for index in range(req.n):
                    yield sse(chunk(index, {"role": "assistant", "content": ""}, None))
                async for index, kind, payload in choices.events():
                    if kind == LOGPROBS:
                        buf.add(index, payload)
                    elif kind == TEXT:
                        for delta in deltas(index, replies[index].push(payload)):
                            yield sse(chunk(index, delta, None, buf.take(index)))
                    elif kind == ERROR:
                        yield sse(APIError(500, str(payload), type="server_error").body())
                        return
                    else:
                        for delta in deltas(index, replies[index].flush()):
                            yield sse(chunk(index, delta, None, buf.take(index)))
                        yield sse(chunk(index, {}, replies[index].finish_reason(payload), buf.take(index)))
                if req.include_usage():
                    yield sse({**chunk(0, {}, None), "choices": [], "usage": choices.usage})
                yield "data: [DONE]\n\n"
            return streaming_response(events(), choices, request)
        results = await choices.collect(request)

        def message(index: int, text: str) -> dict:
            reply = replies[index]
            content = "".join(e[1] for e in reply.push(text) + reply.flush() if e[0] == "text")
            out: dict = {"role": "assistant", "content": content if content or not reply.calls else None}
            if reply.calls:
                out["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                     for i, n, a in reply.calls]
            return out

        items = []
        for i, r in enumerate(results):
            msg = message(i, r.text)
            items.append({"index": i, "message": msg,
                          "logprobs": chat_logprobs(r.logprobs, tokens) if top is not None else None,
                          "finish_reason": replies[i].finish_reason(r.finish_reason)})
        return JSONResponse({
            "id": rid, "object": "chat.completion", "created": created, "model": state.model_id,
            "system_fingerprint": None, "choices": items, "usage": choices.usage})

    anthropic.add_routes(app, state)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> JSONResponse:
        req: EmbeddingRequest = await parse_body(state, request, EmbeddingRequest)
        if state.embedder is None:
            raise APIError(404, f"the model {req.model!r} does not exist; this server has no embedding model "
                                "(start it with --embed-model)", param="model", code="model_not_found")
        check_model(state, req.model, "embed")
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
