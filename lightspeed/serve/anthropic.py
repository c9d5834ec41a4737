"""Anthropic's Messages API on the same engine: ``POST /v1/messages`` (and ``/v1/messages/count_tokens``).

    client = anthropic.Anthropic(base_url="http://127.0.0.1:8000", api_key="unused")
    client.messages.create(model="SmolLM2-135M-Instruct.Q4_1", max_tokens=64,
                           messages=[{"role": "user", "content": "Hi"}])

The request is validated as strictly as the OpenAI ones (unknown fields are refused by name); the
conversation (``system``, then user/assistant turns of text) is rendered with the model's chat template.
Consecutive turns of one role are joined into one turn, as Anthropic does, and a final assistant turn is
a prefill: the reply continues it. Images and documents are refused (400). Errors use Anthropic's
shape, ``{"type": "error", "error": {"type", "message"}}``; streaming sends Anthropic's events
(``message_start``, ``content_block_start``, ``ping``, ``content_block_delta``..., ``content_block_stop``,
``message_delta``, ``message_stop``).

Tools: ``tools`` (``name``, ``description``, ``input_schema``) and ``tool_choice`` (``auto``, ``any``,
``tool`` with a ``name``, ``none``) work as on chat completions (``lightspeed.structured.tools``; ``any``
and ``tool`` generate one call under the tool's schema). Assistant turns may hold ``tool_use`` blocks and
user turns ``tool_result`` blocks answering them by ``tool_use_id``. A reply's calls are ``tool_use``
blocks (``stop_reason: "tool_use"``), streamed as a ``content_block_start`` with empty ``input``,
``input_json_delta`` events (a forced call's arguments as they are generated) and a ``content_block_stop``.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, field_validator, model_validator
from starlette.concurrency import run_in_threadpool

from ..engine.sequence import ERROR, TEXT, RequestOptions, Sequence
from ..generate import SamplingParams
from ..structured import CompiledGrammar
from ..structured.tools import Tool, ToolCall
from .common import ServerState, check_model, new_id, parse_body, token_budget
from .constraints import ToolPlan, ToolReply, plan_tools, tool_prompt
from .protocol import MAX_STOP_CHARS, APIError, _Strict
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


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=64)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None

    def text(self) -> str:
        body = self.content if isinstance(self.content, str) or self.content is None else \
            "".join(b.text for b in self.content)
        return ("error: " if self.is_error else "") + (body or "")


Block = Annotated[Union[TextBlock, ToolUseBlock, ToolResultBlock], Field(discriminator="type")]


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block] = Field(min_length=1)

    @model_validator(mode="after")
    def _blocks(self):
        if isinstance(self.content, list):
            wrong = "tool_result" if self.role == "assistant" else "tool_use"
            if any(b.type == wrong for b in self.content):
                raise ValueError(f"content: {wrong} blocks may not appear in {self.role} messages")
        return self

    def blocks(self, kind: str) -> list:
        return [] if isinstance(self.content, str) else [b for b in self.content if b.type == kind]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(b.text for b in self.blocks("text"))


class ToolDef(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = Field(None, max_length=8192)
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None

    @field_validator("input_schema")
    @classmethod
    def _object(cls, v):
        if v.get("type") != "object":
            raise ValueError("input_schema.type must be 'object'")
        return v


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, min_length=1, max_length=64)
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name(self):
        if (self.name is not None) != (self.type == "tool"):
            raise ValueError("tool_choice of type 'tool' needs a name, and only it takes one")
        return self


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

    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None

    def tool_list(self) -> list[Tool]:
        return [Tool(t.name, t.description, t.input_schema) for t in self.tools or []]

    def choice(self) -> tuple[str, str | None]:
        """``tool_choice`` as (mode, name) in the vocabulary of ``constraints.plan_tools``."""
        c = self.tool_choice
        if c is None:
            return ("auto" if self.tools else "none"), None
        return {"auto": "auto", "any": "required", "tool": "function", "none": "none"}[c.type], c.name

    def turns(self) -> tuple[list[dict[str, Any]], str | None]:
        """The role/content dicts of the conversation (consecutive text turns of a role joined; tool_use
        blocks as the assistant's ``tool_calls``, tool_result blocks as ``tool`` turns) and the prefill:
        the text of a final assistant turn, which the reply continues (None without one)."""
        turns: list[dict[str, Any]] = []
        calls: set[str] = set()
        for i, m in enumerate(self.messages):
            for r in m.blocks("tool_result"):
                if r.tool_use_id not in calls:
                    raise APIError(400, f"messages.{i}: tool_result for {r.tool_use_id[:80]!r}, which no earlier "
                                        "tool_use block has as its id", param=f"messages.{i}.content")
                turns.append({"role": "tool", "tool_call_id": r.tool_use_id, "content": r.text()})
            uses = [ToolCall(b.id, b.name, json.dumps(b.input, ensure_ascii=False)) for b in m.blocks("tool_use")]
            calls.update(c.id for c in uses)
            text = m.text()
            if uses:
                turns.append({"role": m.role, "content": text, "tool_calls": uses})
            elif turns and turns[-1]["role"] == m.role and not turns[-1].get("tool_calls"):
                turns[-1]["content"] += "\n\n" + text
            elif text or not m.blocks("tool_result"):
                turns.append({"role": m.role, "content": text})
        if self.messages[0].role != "user" or turns[0]["role"] != "user":
            raise APIError(400, "messages: the first message must use the \"user\" role", param="messages")
        if turns[-1].get("tool_calls"):
            raise APIError(400, "messages: the last assistant message holds tool_use blocks; answer them with "
                                "tool_result blocks in a user message", param="messages")
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
async def _prompt(state: ServerState, req: _Conversation, plan: ToolPlan) -> list[int]:
    turns, prefill = req.turns()
    ids = await tool_prompt(state, turns, plan)
    if prefill:
        ids = ids + await run_in_threadpool(state.model.tokenizer.encode_plain, prefill)
    return ids


async def _plan(state: ServerState, req: _Conversation) -> ToolPlan:
    return await plan_tools(state, req.tool_list(), *req.choice())


def _options(state: ServerState, req: MessagesRequest, n_prompt: int,
             grammar: CompiledGrammar | None) -> RequestOptions:
    max_tokens = token_budget(state, n_prompt, req.max_tokens, prompt_param="messages")
    # top_p = 0 keeps only the most likely token (as greedy), which the sampler spells as a tiny mass
    top_p = 1.0 if req.top_p is None else req.top_p or 1e-9
    params = SamplingParams(temperature=req.temperature, top_k=req.top_k or 0, top_p=top_p)
    return RequestOptions(max_tokens=max_tokens, params=params, stop=list(req.stop_sequences or []),
                          grammar=grammar)


def _stop(seq: Sequence, reply: ToolReply) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for a finished sequence."""
    if seq.finish_reason == "length":
        return "max_tokens", None
    if seq.stops.matched is not None:
        return "stop_sequence", seq.stops.matched
    if reply.calls:
        return "tool_use", None
    return "end_turn", None


def _tool_use(call: tuple[str, str, str]) -> dict:
    try:
        value = json.loads(call[2])
    except ValueError:  # a call that max_tokens cut short (stop_reason max_tokens says so)
        value = {}
    return {"type": "tool_use", "id": call[0], "name": call[1], "input": value if isinstance(value, dict) else {}}


def add_routes(app: FastAPI, state: ServerState) -> None:
    """Register ``/v1/messages`` and ``/v1/messages/count_tokens`` on ``app``."""

    @app.post(PATH)
    async def messages(request: Request) -> Response:
        req: MessagesRequest = await parse_body(state, request, MessagesRequest, allow_x_api_key=True)
        check_model(state, req.model, "generate")
        plan = await _plan(state, req)
        ids = await _prompt(state, req, plan)
        choices = Choices(state, ids, [_options(state, req, len(ids), plan.grammar)])
        seq = choices.seqs[0]
        reply = ToolReply(plan, lambda: new_id("toolu", "_"))
        mid = new_id("msg", "_")

        def message(content: list[dict], stop: tuple[str | None, str | None], output_tokens: int) -> dict:
            return {"id": mid, "type": "message", "role": "assistant", "model": state.model_id, "content": content,
                    "stop_reason": stop[0], "stop_sequence": stop[1],
                    "usage": {"input_tokens": len(ids), "output_tokens": output_tokens,
                              "cache_read_input_tokens": seq.cached_tokens}}

        if req.stream:
            async def events() -> AsyncIterator[str]:
                index, text_open = 0, False

                def open_text() -> str:
                    return sse({"type": "content_block_start", "index": index,
                                "content_block": {"type": "text", "text": ""}}, "content_block_start")

                def close(i: int) -> str:
                    return sse({"type": "content_block_stop", "index": i}, "content_block_stop")

                def blocks(evs: list[tuple]) -> list[str]:
                    nonlocal index, text_open
                    out = []
                    for e in evs:
                        if e[0] == "text":
                            if not text_open:
                                out.append(open_text())
                                text_open = True
                            out.append(sse({"type": "content_block_delta", "index": index,
                                            "delta": {"type": "text_delta", "text": e[1]}}, "content_block_delta"))
                            continue
                        if text_open:
                            out.append(close(index))
                            index, text_open = index + 1, False
                        if e[0] in ("call", "call_start"):
                            block = {"type": "tool_use", "id": e[1], "name": e[2], "input": {}}
                            out.append(sse({"type": "content_block_start", "index": index, "content_block": block},
                                           "content_block_start"))
                        piece = e[3] if e[0] == "call" else e[2] if e[0] == "arguments" else ""
                        if piece:
                            out.append(sse({"type": "content_block_delta", "index": index,
                                            "delta": {"type": "input_json_delta", "partial_json": piece}},
                                           "content_block_delta"))
                        if e[0] in ("call", "call_done"):
                            out.append(close(index))
                            index += 1
                    return out

                yield sse({"type": "message_start", "message": message([], (None, None), 0)}, "message_start")
                if not plan.calls:  # text only: the block opens at once, as Anthropic's own server does
                    yield open_text()
                    text_open = True
                yield sse({"type": "ping"}, "ping")
                async for _, kind, payload in choices.events():
                    if kind == TEXT:
                        for event in blocks(reply.push(payload)):
                            yield event
                    elif kind == ERROR:
                        yield sse(error_body(APIError(500, str(payload), type="server_error")), "error")
                        return
                for event in blocks(reply.flush()):
                    yield event
                if text_open:
                    yield close(index)
                elif index == 0:  # no block at all: an empty text block, so that the content is never empty
                    yield open_text()
                    yield close(index)
                reason, sequence = _stop(seq, reply)
                yield sse({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                           "usage": {"output_tokens": len(seq.token_ids),
                                     "cache_read_input_tokens": seq.cached_tokens}}, "message_delta")
                yield sse({"type": "message_stop"}, "message_stop")
            return streaming_response(events(), choices, request)
        result = (await choices.collect(request))[0]
        evs = reply.push(result.text) + reply.flush()
        text = "".join(e[1] for e in evs if e[0] == "text")
        content = ([{"type": "text", "text": text}] if text or not reply.calls else []) + \
            [_tool_use(c) for c in reply.calls]
        return JSONResponse(message(content, _stop(seq, reply), len(seq.token_ids)))

    @app.post(PATH + "/count_tokens")
    async def count_tokens(request: Request) -> JSONResponse:
        req: CountTokensRequest = await parse_body(state, request, CountTokensRequest, allow_x_api_key=True)
        check_model(state, req.model, "generate")
        plan = await _plan(state, req)
        return JSONResponse({"input_tokens": len(await _prompt(state, req, plan))})
