"""Tool calling: tool definitions in the prompt, calls generated under a grammar, calls parsed back.

A call is written the way Hermes- and Qwen-style chat models write it, one block per call:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The conversation is rendered by the model's chat template. A template that uses a ``tools`` variable
gets the tools as ``tools`` (OpenAI's ``{"type": "function", "function": {...}}`` dicts), assistant
turns with ``tool_calls`` and ``tool`` turns as they are. Other templates (SmolLM2's has no tools
section) get the default rendering: the tools and the call format described in the system message,
earlier calls written into the assistant's text as ``<tool_call>`` blocks, and tool results given as
a user turn of ``<tool_response>`` blocks.

A call the model must make (``tool_choice`` required, or a named function) is generated under the
grammar of ``call_grammar``: exactly one block whose arguments satisfy the tool's parameter schema,
so they always parse. Otherwise (``auto``) the model writes freely and ``CallParser`` picks out the
blocks that hold a known tool's name and JSON arguments; anything else stays text.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .grammar import JSON_LAYOUT, GrammarError, GrammarSpec, lark, schema_text

OPEN, CLOSE = "<tool_call>", "</tool_call>"
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 128


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name, description and the JSON schema of its arguments."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def as_openai(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
    """A call in a conversation: its id, the tool's name and the arguments as JSON text."""

    id: str
    name: str
    arguments: str


def check_tools(tools: list[Tool]) -> None:
    """ValueError naming the problem: too many tools, a bad or repeated name, parameters that are not
    a JSON object schema."""
    if len(tools) > MAX_TOOLS:
        raise ValueError(f"at most {MAX_TOOLS} tools, got {len(tools)}")
    seen: set[str] = set()
    for t in tools:
        if not TOOL_NAME.fullmatch(t.name):
            raise ValueError(f"tool name {t.name[:80]!r} must be 1 to 64 letters, digits, '_' or '-'")
        if t.name in seen:
            raise ValueError(f"two tools are named {t.name!r}")
        seen.add(t.name)
        if not isinstance(t.parameters, dict):
            raise ValueError(f"the parameters of tool {t.name!r} must be a JSON schema object")
        kind = t.parameters.get("type", "object")
        if kind != "object":
            raise ValueError(f"the parameters of tool {t.name!r} must be an object schema (type 'object'), "
                             f"got type {kind!r}")


# the prompt --------------------------------------------------------------------------------------------
def template_renders_tools(template: str | None) -> bool:
    """Whether a chat template has a tools section of its own (uses a ``tools`` variable)."""
    return bool(template) and re.search(r"\btools\b", template) is not None


def call_text(name: str, arguments: Any) -> str:
    """One call as the model writes it."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CLOSE}"


def tools_prompt(tools: list[Tool]) -> str:
    """The default description of the tools and of the call format (for templates without a tools section)."""
    lines = [json.dumps({"name": t.name, **({"description": t.description} if t.description else {}),
                         "parameters": t.parameters}, ensure_ascii=False) for t in tools]
    return ("You may call one or more functions to help with the user's request. The functions are:\n"
            "<tools>\n" + "\n".join(lines) + "\n</tools>\n"
            "To call a function, reply with a JSON object holding its name and arguments inside "
            f"{OPEN}{CLOSE} tags:\n{OPEN}\n" + '{"name": "function name", "arguments": {"argument": "value"}}'
            f"\n{CLOSE}")


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def render_messages(messages: list[dict[str, Any]], tools: list[Tool], template_tools: bool
                    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and extra template variables for a conversation with ``tools`` (may be empty).

    ``messages`` are role/content dicts; an assistant turn may hold ``tool_calls`` (``ToolCall``s),
    a ``tool`` turn has ``tool_call_id`` and the result as ``content``. With ``template_tools`` the
    template renders them itself; otherwise the default rendering of the module docstring is used."""
    if template_tools:
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [{"id": c.id, "type": "function",
                                    "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                                   for c in m["tool_calls"]]
            out.append(m)
        return out, ({"tools": [t.as_openai() for t in tools]} if tools else {})
    out = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(call_text(c.name, _arguments(c.arguments)) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": f"{content}\n{calls}" if content else calls})
        elif role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_tool_results"):  # consecutive results: one user turn
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append({"role": role, "content": content})
    for m in out:
        m.pop("_tool_results", None)
    if tools:
        prompt = tools_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, {}


# a forced call ------------------------------------------------------------------------------------------
def call_grammar(tools: list[Tool], name: str | None = None) -> GrammarSpec:
    """The grammar of exactly one call block: of tool ``name``, or of any of ``tools`` (None)."""
    chosen = [t for t in tools if name is None or t.name == name]
    if not chosen:
        raise GrammarError(f"no tool is named {name!r}", "unknown_tool")
    rules = []
    for i, t in enumerate(chosen):
        schema = {"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                  "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": JSON_LAYOUT}
        rules.append(f"call_{i}: %json {schema_text(schema, f'the parameters of tool {t.name!r}')}")
    alternatives = " | ".join(f"call_{i}" for i in range(len(chosen)))
    head = f'start: "{OPEN}\\n" call "\\n{CLOSE}"\ncall: {alternatives}\n'
    return lark(head + "\n".join(rules))


# parsing calls ------------------------------------------------------------------------------------------
def _held_back(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker`` (it may be a marker arriving)."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def parse_block(block: str, names: set[str]) -> tuple[str, str] | None:
    """(name, arguments as JSON) of one block's text, or None unless it is a JSON object naming a known
    tool with object arguments (``parameters`` is read as ``arguments``)."""
    try:
        obj = json.loads(block)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


# a call's beginning, up to the first character of its arguments (so that spaces still to come are not theirs)
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_-]{1,64})"\s*,\s*"arguments"\s*:\s*(?=\S)')


class _ValueEnd:
    """Finds where a JSON object or array ends in text that arrives piece by piece (strings and escapes
    followed, so braces inside strings do not count)."""

    def __init__(self):
        self.depth, self.in_string, self.escape, self.end = 0, False, False, None

    def scan(self, text: str, start: int) -> None:
        """Look at ``text[start:]``; ``end`` becomes the index after the value's closing bracket."""
        for i in range(start, len(text)):
            c = text[i]
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    self.end = i + 1
                    return


class CallParser:
    """Splits generated text, as it arrives, into text and calls: ``push(piece)`` and ``flush()`` return
    events ``("text", str)`` and ``("call", name, arguments)``. A possible block opening is held back
    until it is decided; whitespace next to a call, and at the end of a reply with calls, is dropped.

    With ``stream_arguments`` (for a call generated under its grammar, which is sure to be well formed)
    a call is reported as it is written instead: ``("call_start", name)`` once its name is known, then
    ``("arguments", piece)`` as its arguments arrive, then ``("call_done", name, arguments)``; the
    arguments are the text the model wrote (the pieces joined)."""

    def __init__(self, names: set[str], stream_arguments: bool = False):
        self.names = set(names)
        self.stream_arguments = stream_arguments
        self.calls = 0
        self._buf = ""
        self._inside = False
        self._space = ""  # whitespace not yet sent: it goes out with the next text, unless a call comes
        self._after_call = False  # whitespace right after a call is dropped
        self._reset_call()

    def _reset_call(self) -> None:
        self._name: str | None = None  # the call being streamed
        self._args_at = 0              # where its arguments start in _buf
        self._sent = 0                 # characters of them reported
        self._value = _ValueEnd()

    def _text(self, text: str, out: list) -> None:
        # trailing whitespace waits in _space: a call right after it drops it, text takes it along
        if self._after_call:
            text = text.lstrip()
        if not text:
            return
        self._after_call = False
        body = text.rstrip()
        if body:
            out.append(("text", self._space + body))
            self._space = ""
        self._space += text[len(body):]

    def _called(self) -> None:
        self._space, self._after_call = "", True
        self.calls += 1

    def _stream(self, out: list, limit: int) -> None:
        """Report what arrived of the streamed call's arguments, up to ``_buf[limit]`` (starting the call
        once its name is read)."""
        if self._name is None:
            m = _HEADER.match(self._buf)
            if m is None or m.group(1) not in self.names:
                return
            self._name, self._args_at = m.group(1), m.end()
            out.append(("call_start", self._name))
        if self._value.end is None:
            self._value.scan(self._buf, self._args_at + self._sent)
        stop = self._value.end if self._value.end is not None else limit
        piece = self._buf[self._args_at + self._sent:stop]
        if piece:
            out.append(("arguments", piece))
            self._sent += len(piece)

    def _done(self, out: list) -> None:
        args = self._buf[self._args_at:self._args_at + self._sent]
        out.append(("call_done", self._name, args))
        self._called()

    def push(self, piece: str) -> list[tuple]:
        out: list[tuple] = []
        self._buf += piece
        while True:
            if not self._inside:
                i = self._buf.find(OPEN)
                if i < 0:
                    keep = _held_back(self._buf, OPEN)
                    self._text(self._buf[:len(self._buf) - keep], out)
                    self._buf = self._buf[len(self._buf) - keep:]
                    return out
                self._text(self._buf[:i], out)
                self._buf, self._inside = self._buf[i + len(OPEN):], True
                continue
            j = self._buf.find(CLOSE)
            if self.stream_arguments:
                self._stream(out, j if j >= 0 else len(self._buf))
            if j < 0:
                return out
            block, rest = self._buf[:j], self._buf[j + len(CLOSE):]
            if self._name is not None:
                self._done(out)
            else:
                call = parse_block(block, self.names)
                if call is None:
                    self._text(OPEN + block + CLOSE, out)
                else:
                    self._called()
                    out.append(("call", *call))
            self._buf, self._inside = rest, False
            self._reset_call()

    def flush(self) -> list[tuple]:
        """What is left: an unfinished block or held-back text is text (a streamed call that was cut ends
        with the arguments written so far)."""
        out: list[tuple] = []
        if self._name is not None:
            self._stream(out, len(self._buf))
            self._done(out)
            self._buf, self._inside = "", False
            self._reset_call()
        rest = (OPEN if self._inside else "") + self._buf
        self._buf, self._inside = "", False
        self._text(rest, out)
        if self._space and not self.calls:
            out.append(("text", self._space))
        self._space = ""
        return out


def split_calls(text: str, names: set[str], stream_arguments: bool = False) -> tuple[str, list[tuple[str, str]]]:
    """A whole reply's text (blocks removed) and its calls (name, arguments)."""
    parser = CallParser(names, stream_arguments)
    events = parser.push(text) + parser.flush()
    content = "".join(e[1] for e in events if e[0] == "text")
    return content, [(e[1], e[2]) for e in events if e[0] in ("call", "call_done")]
