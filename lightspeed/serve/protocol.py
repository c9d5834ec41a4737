"""The OpenAI request bodies the server accepts, and the error JSON it answers with.

Requests are validated strictly: wrong types are not coerced (``"5"`` is not a number), fields
the OpenAI API does not define are rejected, as OpenAI rejects them, and fields it defines that
this server cannot honour (``echo``, ``best_of``, audio...) are rejected by name rather than
silently ignored. A few common extensions are accepted: ``top_k``, ``min_p``,
``repetition_penalty``, ``ignore_eos``, and ``response_format`` types ``grammar`` (a Lark grammar)
and ``regex`` besides OpenAI's ``text``, ``json_object`` and ``json_schema`` (also on completions).

Tool calling: ``tools`` (functions), ``tool_choice`` and ``parallel_tool_calls``; assistant messages
may carry ``tool_calls`` (their ``content`` may then be null) and ``tool`` messages answer them by
``tool_call_id``. The checks that span messages (an id answered that no earlier call has) are in
``ChatCompletionRequest.conversation``.
"""
from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..structured import GrammarSpec, json_object, json_schema, lark, regex
from ..structured.tools import Tool, ToolCall

MAX_STOP_STRINGS = 4      # as OpenAI
MAX_STOP_CHARS = 256
MAX_LOGIT_BIAS = 1024
MAX_CHOICES = 8           # n: independent choices of one request
MAX_TOP_LOGPROBS = 20     # chat's top_logprobs, as OpenAI
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions' logprobs, as OpenAI
_TOKEN_ID = re.compile(r"[0-9]{1,9}")


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# the body as JSON ------------------------------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _check_strings(x: Any, depth: int = 0) -> None:
    """Reject strings holding unpaired surrogates (``"\\ud800"`` parses, but is not text)."""
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            raise APIError(400, "the request body holds an unpaired UTF-16 surrogate escape (not valid Unicode text)",
                           code="invalid_unicode") from None
    elif isinstance(x, dict):
        for k, v in x.items():
            _check_strings(k, depth + 1)
            _check_strings(v, depth + 1)
    elif isinstance(x, list):
        for v in x:
            _check_strings(v, depth + 1)


def parse_json_body(raw: bytes) -> dict:
    """The request body as a JSON object; APIError(400) when it is not UTF-8, not JSON or not an object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"the request body is not valid UTF-8 (byte {e.start})", code="invalid_encoding") from None
    if not text.strip():
        raise APIError(400, "the request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise APIError(400, "the request body is nested too deeply", code="invalid_json") from None
    except ValueError as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    _check_strings(body)
    return body


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _is_union_tag(part: Any) -> bool:
    """Whether a location part names a member of a union (``str``, ``list[str]``) rather than a field."""
    return isinstance(part, str) and (part in _TYPE_NAMES or any(c in part for c in "[(-")
                                      or part[:1].isupper())


def validate(model: type[BaseModel], body: dict) -> Any:
    """``body`` validated as ``model``; APIError(422) naming the first bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        # of the errors about the first bad field, the deepest: for a union (a string or a list of blocks)
        # that is the member's own complaint ("messages.0.content.0.type: should be 'text'"), not "not a string"
        first = errors[0]["loc"][:1]
        err = max((x for x in errors if x["loc"][:1] == first), key=lambda x: len(x["loc"]))
        param = ".".join(str(p) for p in err["loc"] if not _is_union_tag(p)) or None
        kind = err["type"]
        if kind == "extra_forbidden":
            message = f"unrecognized request argument supplied: {param}"
        elif kind == "missing":
            message = f"missing required field: {param}"
        else:
            message = f"invalid value for {param}: {err['msg']}"
        raise APIError(422, message, param=param, code=kind) from None


# request bodies --------------------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class SamplingFields(_Strict):
    """What completions and chat completions share."""

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2 ** 63), lt=2 ** 64)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(None, max_length=256)
    # extensions (vLLM and llama.cpp accept the same names)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    ignore_eos: bool = False  # keep generating past the end-of-sequence tokens (for benchmarks)

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop strings are limited to {MAX_STOP_CHARS} characters")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} logit_bias entries")
        for k, b in v.items():
            # plain ASCII decimal only: str.isdigit() also accepts "²" or "١", which int() refuses or reads
            if not _TOKEN_ID.fullmatch(k):
                raise ValueError(f"logit_bias keys must be token ids (decimal integers), got {k[:40]!r}")
            if not -100.0 <= b <= 100.0:
                raise ValueError(f"logit_bias values must lie in [-100, 100], got {b}")
        return v

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


# structured output ---------------------------------------------------------------------------------
class JSONSchemaFormat(_Strict):
    """OpenAI's ``response_format.json_schema``: ``schema`` is the JSON schema (any JSON object without one)."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = Field(None, max_length=4096)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """``{"type": "text" | "json_object" | "json_schema" | "grammar" | "regex", ...}``: the field that
    holds the type's content (``json_schema``, ``grammar``, ``regex``) must be present, the others not."""

    type: Literal["text", "json_object", "json_schema", "grammar", "regex"]
    json_schema: JSONSchemaFormat | None = None
    grammar: str | None = Field(None, min_length=1)  # llguidance's Lark syntax (an extension)
    regex: str | None = Field(None, min_length=1)    # the whole output matches it (an extension)

    @model_validator(mode="after")
    def _content(self):
        for name in ("json_schema", "grammar", "regex"):
            given = getattr(self, name) is not None
            if given and self.type != name:
                raise ValueError(f"'{name}' is only allowed with type '{name}', not '{self.type}'")
            if self.type == name and not given:
                raise ValueError(f"type '{name}' needs the field '{name}'")
        return self

    def spec(self) -> GrammarSpec | None:
        """The grammar the output must follow (None for plain text)."""
        if self.type == "json_object":
            return json_object()
        if self.type == "json_schema":
            schema = self.json_schema.schema_ if self.json_schema else None
            return json_object() if schema is None else json_schema(schema)
        if self.type == "grammar":
            return lark(self.grammar)
        if self.type == "regex":
            return regex(self.regex)
        return None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    echo: Literal[False] = False
    best_of: int = Field(1, ge=1, le=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    suffix: None = None
    response_format: ResponseFormat | None = None

    def top_logprobs(self) -> int | None:
        """Alternatives per token to report (None: no logprobs)."""
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("the prompt is empty")
            if isinstance(v[0], str) and len(v) != 1:
                raise ValueError("only one prompt per request (send one request per prompt)")
        return v


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(max_length=1 << 20)

    @field_validator("arguments")
    @classmethod
    def _json(cls, v):
        try:
            value = json.loads(v)
        except ValueError as e:
            raise ValueError(f"the arguments must be JSON text (an object): {e}") from None
        if not isinstance(value, dict):
            raise ValueError("the arguments must be a JSON object")
        return v


class ToolCallIn(_Strict):
    """A call an assistant message made (OpenAI's ``tool_calls[i]``)."""

    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    name: str | None = Field(None, max_length=256)
    tool_calls: list[ToolCallIn] | None = Field(None, min_length=1, max_length=128)
    tool_call_id: str | None = Field(None, min_length=1, max_length=256)
    # declared last: its check reads the fields above
    content: str | list[TextPart] | None = Field(None, validate_default=True)

    @field_validator("content")
    @classmethod
    def _content(cls, v, info: ValidationInfo):
        if v is None and not (info.data.get("role") == "assistant" and info.data.get("tool_calls")):
            # a missing field, as before tool calls made it optional for one kind of message
            raise PydanticCustomError("missing", "content is required (only an assistant message with tool_calls "
                                                 "may leave it null)")
        return v

    @model_validator(mode="after")
    def _shape(self):
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"only assistant messages may hold tool_calls, not {self.role} messages")
        if (self.tool_call_id is not None) != (self.role == "tool"):
            raise ValueError("tool messages need a tool_call_id (the id of the call they answer), and only they "
                             "may have one")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionDef(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = Field(None, max_length=8192)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef

    def tool(self) -> Tool:
        f = self.function
        params = f.parameters if f.parameters is not None else {"type": "object", "properties": {}}
        return Tool(f.name, f.description, params)


class NamedFunction(_Strict):
    name: str = Field(min_length=1, max_length=64)


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = Field(None, min_length=1)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, v, info: ValidationInfo):
        if v is not None and not info.data.get("logprobs"):  # logprobs is validated first (declared first)
            raise ValueError("top_logprobs requires logprobs to be true")
        return v

    def top_logprobs_count(self) -> int | None:
        """Alternatives per token to report (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def tool_list(self) -> list[Tool]:
        return [t.tool() for t in self.tools or []]

    def choice(self) -> tuple[str, str | None]:
        """``tool_choice`` as (mode, name): mode none, auto, required or function (with the tool's name)."""
        c = self.tool_choice
        if isinstance(c, NamedToolChoice):
            return "function", c.function.name
        return (c or ("auto" if self.tools else "none")), None

    def chat_messages(self) -> list[dict[str, Any]]:
        """Role/content dicts for the chat template (``developer`` is OpenAI's new name for ``system``);
        assistant turns keep their ``tool_calls`` (as ``ToolCall``), tool turns their ``tool_call_id``.
        APIError(400) for a tool message that answers no earlier call."""
        out: list[dict[str, Any]] = []
        calls: set[str] = set()
        for i, m in enumerate(self.messages):
            d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            if m.tool_calls:
                d["tool_calls"] = [ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls]
                calls.update(c.id for c in m.tool_calls)
            if m.role == "tool":
                if m.tool_call_id not in calls:
                    raise APIError(400, f"messages.{i}.tool_call_id {m.tool_call_id[:80]!r} answers no tool call of an "
                                        "earlier assistant message", param=f"messages.{i}.tool_call_id")
                d["tool_call_id"] = m.tool_call_id
            out.append(d)
        return out


class EmbeddingRequest(_Strict):
    model: str = Field(min_length=1, max_length=256)
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = Field(None, max_length=256)

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)
