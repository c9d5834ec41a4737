"""Structured output and tool calls for the HTTP endpoints, whatever their protocol.

``response_grammar`` compiles a request's response format, ``plan_tools`` checks its tools and tool
choice (compiling the grammar of a forced call), ``tool_prompt`` renders a conversation with tools
into prompt ids, and ``ToolReply`` splits a reply's text into text and calls. Grammars compile on a
worker thread (a large schema can take a while); every problem is an ``APIError`` (400) that names
the request field, which each protocol answers in its own error shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from ..structured import CompiledGrammar, GrammarError, GrammarSpec
from ..structured.tools import CallParser, Tool, call_grammar, check_tools, render_messages, template_renders_tools
from .common import ServerState, chat_ids
from .protocol import APIError


async def compile_grammar(state: ServerState, spec: GrammarSpec, param: str) -> CompiledGrammar:
    """``spec`` compiled for the model; APIError(400) naming ``param`` when it cannot be."""
    try:
        return await run_in_threadpool(state.grammars.compile, spec)
    except GrammarError as e:
        raise APIError(400, f"{param}: {e}", param=param, code=e.code) from None
    except ImportError as e:
        raise APIError(501, f"structured output needs the llguidance package on the server ({e})",
                       type="server_error", param=param, code="grammar_unavailable") from None


async def response_grammar(state: ServerState, spec: GrammarSpec | None, param: str = "response_format"
                           ) -> CompiledGrammar | None:
    """The compiled grammar of a response format (None for plain text)."""
    return None if spec is None else await compile_grammar(state, spec, param)


@dataclass
class ToolPlan:
    """The tools of a request and what the model may do with them: ``mode`` none (no calls), auto (the
    model decides), required (one call of any tool) or function (one call of ``name``); ``grammar``
    holds a forced call's grammar."""

    tools: list[Tool] = field(default_factory=list)
    mode: str = "none"
    name: str | None = None
    grammar: CompiledGrammar | None = None

    @property
    def calls(self) -> bool:
        """Whether the reply is searched for calls."""
        return bool(self.tools) and self.mode != "none"

    @property
    def names(self) -> set[str]:
        return {t.name for t in self.tools}


async def plan_tools(state: ServerState, tools: list[Tool], mode: str, name: str | None,
                     tools_param: str = "tools", choice_param: str = "tool_choice") -> ToolPlan:
    """Check ``tools`` and the choice; compile the grammar of a forced call."""
    try:
        check_tools(tools)
    except ValueError as e:
        raise APIError(400, f"{tools_param}: {e}", param=tools_param, code="invalid_tools") from None
    if mode != "none" and not tools:
        raise APIError(400, f"{choice_param} {mode!r} needs tools", param=choice_param)
    if mode == "function" and name not in {t.name for t in tools}:
        known = ", ".join(repr(t.name) for t in tools)
        raise APIError(400, f"{choice_param} names the tool {name!r}, which is not among the tools ({known})",
                       param=choice_param, code="unknown_tool")
    plan = ToolPlan(tools, mode, name)
    if mode in ("required", "function"):
        try:
            spec = call_grammar(tools, name)
        except GrammarError as e:
            raise APIError(400, f"{tools_param}: {e}", param=tools_param, code=e.code) from None
        plan.grammar = await compile_grammar(state, spec, tools_param)
    return plan


async def tool_prompt(state: ServerState, messages: list[dict[str, Any]], plan: ToolPlan,
                      param: str = "messages") -> list[int]:
    """Prompt ids of a conversation that may hold tools, calls and tool results (``tools.render_messages``).
    With tool_choice none the tools are left out of the prompt."""
    template = state.model.tokenizer.chat_template
    rendered, extra = render_messages(messages, plan.tools if plan.calls else [], template_renders_tools(template))
    return await chat_ids(state, rendered, param, **extra)


class ToolReply:
    """One choice's reply split into text and calls as its pieces arrive (``tools.CallParser``; a forced
    call's arguments are reported as they are written); ``new_id()`` names each call."""

    def __init__(self, plan: ToolPlan, new_id):
        self.parser = CallParser(plan.names, stream_arguments=plan.grammar is not None) if plan.calls else None
        self.new_id = new_id
        self.started: list[str] = []                 # ids of the calls begun, in order
        self.calls: list[tuple[str, str, str]] = []  # (id, name, arguments) of the calls completed

    def push(self, piece: str) -> list[tuple]:
        """Events ("text", str), ("call", id, name, arguments) for a whole call, and for a streamed one
        ("call_start", id, name), ("arguments", id, piece)..., ("call_done", id, name, arguments)."""
        if self.parser is None:
            return [("text", piece)] if piece else []
        return self._named(self.parser.push(piece))

    def flush(self) -> list[tuple]:
        return [] if self.parser is None else self._named(self.parser.flush())

    def index(self, call_id: str) -> int:
        """The call's position among the reply's calls."""
        return self.started.index(call_id)

    def _named(self, events: list[tuple]) -> list[tuple]:
        out = []
        for e in events:
            kind = e[0]
            if kind in ("call", "call_start"):
                self.started.append(self.new_id())
            if kind == "text":
                out.append(e)
            elif kind == "call_start":
                out.append(("call_start", self.started[-1], e[1]))
            elif kind == "arguments":
                out.append(("arguments", self.started[-1], e[1]))
            else:  # a whole call, or the end of a streamed one
                call = (self.started[-1], e[1], e[2])
                self.calls.append(call)
                out.append((kind, *call))
        return out

    def finish_reason(self, reason: str) -> str:
        """OpenAI's finish reason: ``tool_calls`` when the reply made calls and ended by itself."""
        return "tool_calls" if self.calls and reason == "stop" else reason
