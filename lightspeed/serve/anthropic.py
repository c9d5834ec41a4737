"""Anthropic's Messages API on the same engine: ``POST /v1/messages`` (and ``/v1/messages/count_tokens``).

    client = anthropic.Anthropic(base_url="http://127.0.0.1:8000", api_key="unused")
    client.messages.create(model="SmolLM2-135M-Instruct.Q4_1", max_tokens=64,
                           messages=[{"role": "user", "content": "Hi"}])

The request is validated as strictly as the OpenAI ones (unknown fields are refused by name); the
conversation (``system``, then user/assistant turns of text) is rendered with the model's chat template.
Consecutive turns of one role are joined into one turn, as Anthropic does, and a final assistant turn is
a prefill: the reply continues it. Only text content is served: tool use, images and documents are
refused (400). Errors use Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``;
streaming sends Anthropic's events (``message_start``, ``content_block_start``, ``ping``,
``content_block_delta``..., ``content_block_stop``, ``message_delta``, ``message_stop``).
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, field_validator
from starlette.concurrency import run_in_threadpool

from ..generate import SamplingParams
from .common import ServerState, chat_ids, check_model, new_id, parse_body, token_budget
from .protocol import MAX_STOP_CHARS, APIError, _Strict
from .sequence import ERROR, TEXT, RequestOptions, Sequence
from .streams import Choices, sse, streaming_response

MAX_STOP_SEQUENCES = 16
PATH = "/v1/messages"

# HTTP status -> Anthropic's error type
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
               413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}


# request bodies --------------------------------------------------------------------------------------
class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None  # accepted and ignored (there is no prompt cache to steer)


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[TextBlock] = Field(min_length=1)

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)


class Metadata(_Strict):
    user_id: str | None = Field(None, max_length=256)


class _Conversation(_Strict):
    model: str = Field(min_length=1, max_length=256)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None

    def system_text(self) -> str | None:
        if self.system is None or isinstance(self.system, str):
            return self.system or None
        return "".join(b.text for b in self.system) or None

    def turns(self) -> tuple[list[dict[str, str]], str | None]:
        """The role/content dicts of the conversation (consecutive turns of a role joined) and the
        prefill: the text of a final assistant turn, which the reply continues (None without one)."""
        turns: list[dict[str, str]] = []
        for m in self.messages:
            if turns and turns[-1]["role"] == m.role:
                turns[-1]["content"] += "\n\n" + m.text()
            else:
                turns.append({"role": m.role, "content": m.text()})
        if turns[0]["role"] != "user":
            raise APIError(400, "messages: the first message must use the \"user\" role", param="messages")
        prefill = turns.pop()["content"] if turns[-1]["role"] == "assistant" else None
        system = self.system_text()
        return ([{"role": "system", "content": system}] if system else []) + turns, prefill


class MessagesRequest(_Conversation):
    """The body of ``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: Metadata | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v):
        if v and any(not s or len(s) > MAX_STOP_CHARS for s in v):
            raise ValueError(f"stop sequences must hold 1 to {MAX_STOP_CHARS} characters")
        return v


class CountTokensRequest(_Conversation):
    """The body of ``POST /v1/messages/count_tokens``."""


# errors ----------------------------------------------------------------------------------------------
def is_anthropic(request: Request) -> bool:
    """Whether the request is for this protocol (its errors are answered in Anthropic's shape)."""
    path = request.url.path
    return path == PATH or path.startswith(PATH + "/")


def error_body(e: APIError) -> dict:
    """Anthropic's error object for ``e``."""
    kind = ERROR_TYPES.get(_status(e.status), "api_error" if e.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def _status(status: int) -> int:
    return 400 if status == 422 else status  # Anthropic answers every invalid request with 400


def error_response(e: APIError) -> JSONResponse:
    """``e`` as Anthropic answers errors."""
    return JSONResponse(error_body(e), status_code=_status(e.status), headers=e.headers)


# generation ------------------------------------------------------------------------------------------
async def _prompt(state: ServerState, req: _Conversation) -> list[int]:
    turns, prefill = req.turns()
    ids = await chat_ids(state, turns)
    if prefill:
        ids = ids + await run_in_threadpool(state.model.tokenizer.encode_plain, prefill)
    return ids


def _options(state: ServerState, req: MessagesRequest, n_prompt: int) -> RequestOptions:
    max_tokens = token_budget(state, n_prompt, req.max_tokens, prompt_param="messages")
    # top_p = 0 keeps only the most likely token (as greedy), which the sampler spells as a tiny mass
    top_p = 1.0 if req.top_p is None else req.top_p or 1e-9
    params = SamplingParams(temperature=req.temperature, top_k=req.top_k or 0, top_p=top_p)
    return RequestOptions(max_tokens=max_tokens, params=params, stop=list(req.stop_sequences or []))


def _stop(seq: Sequence) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for a finished sequence."""
    if seq.finish_reason == "length":
        return "max_tokens", None
    if seq.stops.matched is not None:
        return "stop_sequence", seq.stops.matched
    return "end_turn", None


def add_routes(app: FastAPI, state: ServerState) -> None:
    """Register ``/v1/messages`` and ``/v1/messages/count_tokens`` on ``app``."""

    @app.post(PATH)
    async def messages(request: Request) -> Response:
        req: MessagesRequest = await parse_body(state, request, MessagesRequest, allow_x_api_key=True)
        check_model(state, req.model, "generate")
        ids = await _prompt(state, req)
        choices = Choices(state, ids, [_options(state, req, len(ids))])
        seq = choices.seqs[0]
        mid = new_id("msg", "_")

        def message(content: list[dict], stop: tuple[str | None, str | None], output_tokens: int) -> dict:
            return {"id": mid, "type": "message", "role": "assistant", "model": state.model_id, "content": content,
                    "stop_reason": stop[0], "stop_sequence": stop[1],
                    "usage": {"input_tokens": len(ids), "output_tokens": output_tokens}}

        if req.stream:
            async def events() -> AsyncIterator[str]:
                yield sse({"type": "message_start", "message": message([], (None, None), 0)}, "message_start")
                yield sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                          "content_block_start")
                yield sse({"type": "ping"}, "ping")
                async for _, kind, payload in choices.events():
                    if kind == TEXT:
                        yield sse({"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": payload}}, "content_block_delta")
                    elif kind == ERROR:
                        yield sse(error_body(APIError(500, str(payload), type="server_error")), "error")
                        return
                yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
                reason, sequence = _stop(seq)
                yield sse({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                           "usage": {"output_tokens": len(seq.token_ids)}}, "message_delta")
                yield sse({"type": "message_stop"}, "message_stop")
            return streaming_response(events(), choices, request)
        result = (await choices.collect(request))[0]
        return JSONResponse(message([{"type": "text", "text": result.text}], _stop(seq), len(seq.token_ids)))

    @app.post(PATH + "/count_tokens")
    async def count_tokens(request: Request) -> JSONResponse:
        req: CountTokensRequest = await parse_body(state, request, CountTokensRequest, allow_x_api_key=True)
        check_model(state, req.model, "generate")
        return JSONResponse({"input_tokens": len(await _prompt(state, req))})
