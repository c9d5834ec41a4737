"""What every generating endpoint shares, whatever its protocol: the server state, authentication, the
size- and time-bounded body read, the model check, and the token budget of a request."""
from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from ..engine.scheduler import Engine
from ..io.errors import ChatTemplateLimitError
from ..io.template_limits import TemplateLimits
from ..structured import GrammarCompiler, GrammarLimits
from .logprobs import TokenText
from .protocol import APIError, parse_json_body, validate


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
    max_request_tokens: int | None = None  # n x max_tokens of one request (None: 4 x the context)
    grammar_limits: GrammarLimits = field(default_factory=GrammarLimits)  # response_format / tool schemas

    @property
    def ctx(self) -> int:
        return self.engine.ctx

    @cached_property
    def token_text(self) -> TokenText:
        """Token texts and bytes for logprobs (looked up once per token id)."""
        return TokenText(self.model.tokenizer)

    @cached_property
    def grammars(self) -> GrammarCompiler:
        """Compiles response formats and tool-call grammars for the model (its tokenizer built on first use)."""
        return GrammarCompiler(self.model.tokenizer, self.model.config.vocab_size, self.grammar_limits)

    @property
    def request_tokens(self) -> int:
        """The most tokens one request may ask for over all its choices."""
        return self.max_request_tokens if self.max_request_tokens is not None else 4 * self.ctx


def new_id(prefix: str, sep: str = "-") -> str:
    """A fresh response id such as ``chatcmpl-<hex>``."""
    return f"{prefix}{sep}{uuid.uuid4().hex[:24]}"


def check_auth(state: ServerState, request: Request, allow_x_api_key: bool = False) -> None:
    """401 unless the request carries the server's key (``Authorization: Bearer``, or ``x-api-key``
    where ``allow_x_api_key``, as Anthropic's clients send it)."""
    if state.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    want = state.api_key.encode()
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), want):
        return
    if allow_x_api_key and hmac.compare_digest(request.headers.get("x-api-key", "").strip().encode(), want):
        return
    raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                   type="authentication_error" if allow_x_api_key else "invalid_request_error",
                   code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
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


async def parse_body(state: ServerState, request: Request, model: type, allow_x_api_key: bool = False) -> Any:
    """Authenticate, read and validate the body as ``model`` (a pydantic class)."""
    check_auth(state, request, allow_x_api_key)
    return validate(model, parse_json_body(await read_body(request, state.max_body_bytes, state.body_timeout_s)))


def check_model(state: ServerState, name: str, want: str) -> None:
    """404 for a model this server does not have, 400 for one of the wrong kind (``want``: generate, embed)."""
    ids = {"generate": state.model_id, "embed": state.embed_id}
    if name == ids[want]:
        return
    if name in ids.values():
        kind = "an embedding" if name == state.embed_id else "a text generation"
        raise APIError(400, f"model {name!r} is {kind} model; it does not serve this endpoint", param="model",
                       code="wrong_model_type")
    raise APIError(404, f"the model {name!r} does not exist; this server serves "
                        f"{', '.join(repr(i) for i in ids.values() if i)}", param="model", code="model_not_found")


def token_budget(state: ServerState, n_prompt: int, max_tokens: int | None, n: int = 1,
                 prompt_param: str = "prompt") -> int:
    """The tokens each of ``n`` choices may generate, checking the prompt, ``max_tokens`` and
    ``n x max_tokens`` against the context and the server's per-request limit (400s naming the field).
    Without ``max_tokens`` a choice may fill the context, within its share of the request limit."""
    ctx, engine = state.ctx, state.engine
    if n > engine.max_batch + engine.max_queue:  # could never be queued at once
        raise APIError(400, f"n ({n}) exceeds what this server can run at once "
                            f"({engine.max_batch + engine.max_queue} sequences)", param="n")
    if n_prompt > ctx:
        raise APIError(400, f"the prompt is {n_prompt} tokens long; this server's context is {ctx} tokens",
                       param=prompt_param, code="context_length_exceeded")
    if max_tokens is None:
        max_tokens = min(ctx - n_prompt, state.request_tokens // n)
        if max_tokens < 1:
            raise APIError(400, f"the prompt ({n_prompt} tokens) leaves no room to generate in the context of "
                                f"{ctx} tokens", code="context_length_exceeded")
        return max_tokens
    if max_tokens > ctx:
        raise APIError(400, f"max_tokens is {max_tokens}; at most {ctx} (the context) on this server",
                       param="max_tokens", code="max_tokens_too_large")
    if n_prompt + max_tokens > ctx:
        raise APIError(400, f"the prompt ({n_prompt} tokens) plus max_tokens ({max_tokens}) exceed this server's "
                            f"context of {ctx} tokens", param="max_tokens", code="context_length_exceeded")
    if n * max_tokens > state.request_tokens:
        raise APIError(400, f"n ({n}) x max_tokens ({max_tokens}) exceeds this server's limit of "
                            f"{state.request_tokens} tokens per request", param="n", code="request_too_large")
    return max_tokens


async def chat_ids(state: ServerState, messages: list[dict[str, Any]], param: str = "messages",
                   **extra: Any) -> list[int]:
    """The prompt ids of ``messages`` rendered with the model's chat template and a generation prompt
    (``extra``: more template variables, such as ``tools``).

    Rendering runs on a worker thread (the template is the model file's code, bounded by its limits)
    and tokenizes the messages' text as text: ``<|im_end|>`` in a message is never a control token."""
    try:
        return await run_in_threadpool(partial(state.model.tokenizer.encode_chat, messages, True,
                                               limits=state.template_limits, **extra))
    except ChatTemplateLimitError as e:
        raise APIError(500, f"the model's chat template was stopped: {e}", type="server_error",
                       code="chat_template_limit") from None
    except ValueError as e:  # ChatTemplateError: the template rejects this conversation (roles out of order)
        raise APIError(400, f"the chat template cannot render these messages: {e}", param=param) from None
