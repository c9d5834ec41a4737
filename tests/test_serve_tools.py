"""Tool calling on ``lightspeed serve`` with SmolLM2 over loopback: forced calls (required and named) through
the official ``openai`` client parse and satisfy the tool's schema, also sampled and streamed; tool results
round-trip into the next turn, rendered exactly as ``lightspeed.structured.tools`` renders them; the same on
Anthropic's /v1/messages (``tool_use`` / ``tool_result`` blocks, ``input_json_delta`` events); and hostile
tool fields answered with 4xx in each protocol's shape while the server keeps serving."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serve_process import ServerProcess  # noqa: E402

CTX = 512
MODEL = "SmolLM2-135M-Instruct.Q4_1"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 999}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server():
    import lightspeed.api as lsa
    try:
        lsa.default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    # the batch and context of test_serve_api: its compiled programs are reused
    proc = ServerProcess(["--max-batch", "8", "--context", str(CTX), "--max-schema-bytes", "8192"])
    try:
        from lightspeed.io import Tokenizer
        tok = Tokenizer.from_gguf(lsa.default_model_path())
        proc.wait_ready(timeout=400)
        yield proc, tok
    finally:
        assert proc.stop() == 0, "\n".join(proc.log[-20:])


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0].url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _call(client, seed: int, choice="required", temperature: float = 0.9, **kw):
    return client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice,
                                          max_tokens=60, temperature=temperature, seed=seed, **kw)


def _check_call(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in SCHEMAS
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def test_forced_calls_parse_and_satisfy_the_schema(client) -> None:
    with ThreadPoolExecutor(4) as pool:
        required = list(pool.map(lambda s: _call(client, s), range(6)))
        named = list(pool.map(lambda s: _call(client, s, {"type": "function", "function": {"name": "add"}}),
                              range(2)))
    for r in required + named:
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert len(choice.message.tool_calls) == 1
        _check_call(choice.message.tool_calls[0])
    assert all(r.choices[0].message.tool_calls[0].function.name == "add" for r in named)
    ids = [r.choices[0].message.tool_calls[0].id for r in required]
    assert len(set(ids)) == len(ids)


def test_streamed_call_equals_the_whole_one(client) -> None:
    whole = _call(client, 11, temperature=0).choices[0].message.tool_calls[0]
    calls: dict[int, dict] = {}
    finish, pieces = None, 0
    for chunk in _call(client, 11, temperature=0, stream=True):
        for c in chunk.choices[0].delta.tool_calls or []:
            pieces += bool(c.function.arguments)
            entry = calls.setdefault(c.index, {"name": "", "arguments": "", "id": None})
            entry["id"] = c.id or entry["id"]
            entry["name"] += c.function.name or ""
            entry["arguments"] += c.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0]
    assert (calls[0]["name"], calls[0]["arguments"]) == (whole.function.name, whole.function.arguments)
    assert calls[0]["id"].startswith("call_")
    assert pieces > 2  # the arguments arrived as they were generated, not in one piece


def test_tool_result_round_trip(server, client) -> None:
    from lightspeed.structured.tools import Tool, ToolCall, render_messages
    first = _call(client, 3, temperature=0).choices[0].message
    call = first.tool_calls[0]
    turns = ASK + [first.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 degrees"}]
    r = client.chat.completions.create(model=MODEL, messages=turns, tools=TOOLS, max_tokens=24, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the prompt is the conversation as the default rendering writes it: tools, the call, the result
    tools = [Tool(t["function"]["name"], t["function"]["description"], t["function"]["parameters"]) for t in TOOLS]
    local = [ASK[0], {"role": "assistant", "content": "", "tool_calls": [
        ToolCall(call.id, call.function.name, call.function.arguments)]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 degrees"}]
    rendered, extra = render_messages(local, tools, template_tools=False)
    assert r.usage.prompt_tokens == len(server[1].encode_chat(rendered, True, **extra))
    # tool_choice none leaves the tools out of the prompt, and no calls are parsed
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0)
    none = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=4,
                                          temperature=0)
    auto = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=4, temperature=0)
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens < auto.usage.prompt_tokens
    assert none.choices[0].message.tool_calls is None


# Anthropic --------------------------------------------------------------------------------------------
A_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"]} for t in TOOLS]


def test_anthropic_tool_use_and_result(server) -> None:
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=server[0].url, api_key="unused", max_retries=0, timeout=300)
    greedy = {"extra_body": {"temperature": 0}}
    m = client.messages.create(model=MODEL, max_tokens=60, tools=A_TOOLS, tool_choice={"type": "any"},
                               messages=ASK, **greedy)
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
    use = m.content[0]
    assert use.id.startswith("toolu_") and use.name in SCHEMAS
    jsonschema.validate(use.input, SCHEMAS[use.name])
    with client.messages.stream(model=MODEL, max_tokens=60, tools=A_TOOLS, messages=ASK, **greedy,
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
        final = stream.get_final_message()
    assert kinds.count(("content_block_delta", "input_json_delta")) > 2 and final.stop_reason == "tool_use"
    assert final.content[0].type == "tool_use" and final.content[0].name == "get_weather"
    jsonschema.validate(final.content[0].input, WEATHER)
    reply = client.messages.create(model=MODEL, max_tokens=16, tools=A_TOOLS, **greedy, messages=ASK + [
        {"role": "assistant", "content": m.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}])
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use") and reply.content
    counted = client.messages.count_tokens(model=MODEL, tools=A_TOOLS, messages=ASK)
    assert counted.input_tokens > client.messages.count_tokens(model=MODEL, messages=ASK).input_tokens


# hostile inputs ---------------------------------------------------------------------------------------
CHAT = {"model": MODEL, "messages": ASK, "max_tokens": 4}
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}


def _schema_tool(name: str, params) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": params}}


# (name, body, status, OpenAI error code or None, a word the param or message must hold)
HOSTILE = [
    ("unknown tool in tool_choice", {**CHAT, "tools": TOOLS, "tool_choice": {"type": "function",
                                                                             "function": {"name": "nope"}}},
     400, "unknown_tool", "nope"),
    ("required without tools", {**CHAT, "tool_choice": "required"}, 400, None, "tool_choice"),
    ("bad tool_choice", {**CHAT, "tools": TOOLS, "tool_choice": "always"}, 422, None, "tool_choice"),
    ("two tools of one name", {**CHAT, "tools": TOOLS + TOOLS[:1]}, 400, "invalid_tools", "two tools"),
    ("bad tool name", {**CHAT, "tools": [_schema_tool("no spaces allowed", ADD)]}, 422, None, "tools"),
    ("parameters not an object schema", {**CHAT, "tools": [_schema_tool("f", {"type": "string"})]}, 400,
     "invalid_tools", "object"),
    ("parameters the engine refuses", {**CHAT, "tools": [_schema_tool("f", {"type": "object", "not": {}})],
                                       "tool_choice": "required"}, 400, "invalid_grammar", "tools"),
    ("tool schemas too large", {**CHAT, "tools": [_schema_tool("f", {"type": "object", "properties": {
        f"p{i}": {"type": "string", "description": "x" * 40} for i in range(200)}})], "tool_choice": "required"},
     400, "grammar_too_large", "tools"),
    ("tools with response_format", {**CHAT, "tools": TOOLS, "response_format": {"type": "json_object"}}, 400, None,
     "response_format"),
    ("tool message without tool_call_id", {**CHAT, "messages": ASK + [{"role": "tool", "content": "x"}]}, 422,
     None, "tool_call_id"),
    ("tool message answering nothing", {**CHAT, "messages": ASK + [
        {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_2", "content": "3"}]},
     400, None, "tool_call_id"),
    ("arguments not JSON", {**CHAT, "messages": ASK + [
        {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "add", "arguments": "{a: 1"}}]}]},
     422, None, "arguments"),
    ("tool_calls on a user message", {**CHAT, "messages": [{"role": "user", "content": "x", "tool_calls": [CALL]}]},
     422, None, "tool_calls"),
    ("null content without tool_calls", {**CHAT, "messages": [{"role": "assistant", "content": None}]}, 422, None,
     "content"),
]

A_GOOD = {"model": MODEL, "max_tokens": 4, "messages": ASK}
A_USE = {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}}
A_HOSTILE = [
    ("unknown tool", {**A_GOOD, "tools": A_TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
    ("tool choice without a name", {**A_GOOD, "tools": A_TOOLS, "tool_choice": {"type": "tool"}}, "name"),
    ("input_schema not an object", {**A_GOOD, "tools": [{"name": "f", "input_schema": {"type": "array"}}]},
     "input_schema"),
    ("tool_result answering nothing", {**A_GOOD, "messages": ASK + [
        {"role": "assistant", "content": [A_USE]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "3"}]}]},
     "tool_result"),
    ("tool_result from the assistant", {**A_GOOD, "messages": ASK + [
        {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "3"}]}]},
     "tool_result"),
    ("unanswered tool_use last", {**A_GOOD, "messages": ASK + [{"role": "assistant", "content": [A_USE]}]},
     "tool_use"),
    ("tool_use input not an object", {**A_GOOD, "messages": ASK + [
        {"role": "assistant", "content": [{**A_USE, "input": [1]}]}, {"role": "user", "content": "ok"}]}, "input"),
]


def test_hostile_tool_fields_get_4xx_and_the_server_keeps_serving(server, client) -> None:
    failures = []
    with httpx.Client(base_url=server[0].url, timeout=120) as http:
        for name, body, status, code, word in HOSTILE:
            r = http.post("/v1/chat/completions", json=body)
            err = r.json().get("error", {})
            ok = r.status_code == status and (code is None or err.get("code") == code) and \
                (word in (err.get("param") or "") or word in err.get("message", ""))
            if not ok:
                failures.append(f"{name}: {r.status_code} {r.text[:300]}")
        for name, body, word in A_HOSTILE:
            r = http.post("/v1/messages", json=body)
            data = r.json()
            ok = r.status_code == 400 and data.get("type") == "error" and \
                data["error"]["type"] == "invalid_request_error" and word in data["error"]["message"]
            if not ok:
                failures.append(f"anthropic {name}: {r.status_code} {r.text[:300]}")
        assert http.get("/health").json()["status"] == "ok"
    assert not failures, "\n".join(failures)
    _check_call(_call(client, 1).choices[0].message.tool_calls[0])
