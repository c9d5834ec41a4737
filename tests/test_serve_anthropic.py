"""Anthropic's Messages API on ``lightspeed serve`` (a tiny random Llama over loopback): the official
``anthropic`` client (when installed) and raw HTTP for the response shape, the streaming events in
Anthropic's order with the same text as the non-streaming reply, stop sequences, system prompts and
content blocks, the API key in ``x-api-key``, and Anthropic-shaped errors for invalid requests."""
from __future__ import annotations

import json

import httpx
import pytest
from serve_process import ServerProcess
from tiny_gguf import write_tiny_llama

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

CTX = 256
MODEL = "tiny"
KEY = "anthropic-test-key"
USER = [{"role": "user", "content": "t1 t2 t1"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve_anthropic") / "tiny.gguf"
    write_tiny_llama(path, seed=2)
    # the shapes, batch and context of test_serve_openai_details: its compiled programs are reused
    proc = ServerProcess(["--model", str(path), "--max-batch", "4", "--context", str(CTX), "--api-key", KEY])
    try:
        from lightspeed.io import Tokenizer
        tok = Tokenizer.from_gguf(str(path))
        proc.wait_ready(timeout=300)
        yield proc, tok
    finally:
        assert proc.stop() == 0, "\n".join(proc.log[-20:])


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server[0].url, headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
                      timeout=120) as client:
        yield client


def _create(http: httpx.Client, **body) -> dict:
    r = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 12, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def _events(http: httpx.Client, **body) -> list[tuple[str, dict]]:
    """The (event name, data) pairs of a streamed reply, checking the SSE framing as it goes."""
    events = []
    with http.stream("POST", "/v1/messages", json={"model": MODEL, "max_tokens": 12, "temperature": 0,
                                                   "stream": True, **body}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("\n\n")
    for block in raw.strip("\n").split("\n\n"):
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line[6:])
        assert data["type"] == name_line[7:]  # the event name repeats the data's type, as Anthropic sends it
        events.append((name_line[7:], data))
    return events


def test_message_shape_and_usage(server, http) -> None:
    tok = server[1]
    m = _create(http, messages=USER)
    assert m["id"].startswith("msg_") and m["type"] == "message" and m["role"] == "assistant"
    assert m["model"] == MODEL
    assert [b["type"] for b in m["content"]] == ["text"] and m["content"][0]["text"]
    assert m["stop_reason"] in ("end_turn", "max_tokens") and m["stop_sequence"] is None
    assert m["usage"]["input_tokens"] == len(tok.encode_chat(USER, add_generation_prompt=True))
    assert 1 <= m["usage"]["output_tokens"] <= 12
    counted = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": USER})
    assert counted.json() == {"input_tokens": m["usage"]["input_tokens"]}
    # the same engine as the OpenAI routes: greedy text equals the chat completion's
    chat = http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                     json={"model": MODEL, "messages": USER, "max_tokens": 12, "temperature": 0}).json()
    assert m["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    longer = _create(http, messages=USER, max_tokens=40)
    if longer["usage"]["output_tokens"] > 12:
        assert m["stop_reason"] == "max_tokens" and m["usage"]["output_tokens"] == 12


def test_streaming_events_in_order_with_the_same_text(http) -> None:
    whole = _create(http, messages=USER, max_tokens=20)
    events = _events(http, messages=USER, max_tokens=20)
    names = [n for n, _ in events]
    deltas = names.count("content_block_delta")
    assert deltas >= 1
    assert names == ["message_start", "content_block_start", "ping"] + ["content_block_delta"] * deltas + \
        ["content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == whole["usage"]["input_tokens"]
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert all(d["delta"]["type"] == "text_delta" and d["index"] == 0 for n, d in events if n == "content_block_delta")
    assert text == whole["content"][0]["text"]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


def test_stop_sequences(http) -> None:
    full = _create(http, messages=USER, max_tokens=30)["content"][0]["text"]
    stop = full[3:5]
    m = _create(http, messages=USER, max_tokens=30, stop_sequences=["zzzz", stop])
    assert m["content"][0]["text"] == full[:full.find(stop)]
    assert (m["stop_reason"], m["stop_sequence"]) == ("stop_sequence", stop)
    events = _events(http, messages=USER, max_tokens=30, stop_sequences=[stop])
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == full[:full.find(stop)]
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}


def test_system_and_content_blocks(http) -> None:
    plain = _create(http, system="t2 t2", messages=USER)
    blocks = _create(http, system=[{"type": "text", "text": "t2 "}, {"type": "text", "text": "t2"}],
                     messages=[{"role": "user", "content": [{"type": "text", "text": "t1 t2"},
                                                            {"type": "text", "text": " t1"}]}])
    assert blocks["content"] == plain["content"] and blocks["usage"] == plain["usage"]
    assert plain["usage"]["input_tokens"] > _create(http, messages=USER)["usage"]["input_tokens"]
    # a final assistant turn is a prefill: the prompt grows by its tokens and the reply continues it
    turns = USER + [{"role": "assistant", "content": "t2"}, {"role": "user", "content": "t1"}]
    assert _create(http, messages=turns)["usage"]["input_tokens"] > plain["usage"]["input_tokens"] - 3
    prefilled = _create(http, messages=USER + [{"role": "assistant", "content": "t2 t2"}])
    assert prefilled["usage"]["input_tokens"] > _create(http, messages=USER)["usage"]["input_tokens"]


def test_official_client(server) -> None:
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=server[0].url, api_key=KEY, max_retries=0, timeout=120)
    greedy = {"extra_body": {"temperature": 0}}  # recent clients no longer take sampling arguments by name
    m = client.messages.create(model=MODEL, max_tokens=16, messages=USER, **greedy)
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    assert m.stop_reason in ("end_turn", "max_tokens")
    with client.messages.stream(model=MODEL, max_tokens=16, messages=USER, **greedy) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == m.content[0].text == final.content[0].text
    assert final.usage.output_tokens == m.usage.output_tokens
    stopped = client.messages.create(model=MODEL, max_tokens=16, messages=USER, **greedy,
                                     stop_sequences=[m.content[0].text[2:4]])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == m.content[0].text[2:4]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "wizard", "content": "x"}])
    assert bad.value.status_code == 400 and bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server[0].url, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=4, messages=USER)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-3-5-sonnet", max_tokens=4, messages=USER)


# errors -------------------------------------------------------------------------------------------------
GOOD = {"model": MODEL, "max_tokens": 4, "messages": USER}

# (name, body, status, Anthropic error type, a word the message must hold)
BAD = [
    ("missing max_tokens", {"model": MODEL, "messages": USER}, 400, "invalid_request_error", "max_tokens"),
    ("max_tokens 0", {**GOOD, "max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
    ("max_tokens as string", {**GOOD, "max_tokens": "4"}, 400, "invalid_request_error", "max_tokens"),
    ("max_tokens past the context", {**GOOD, "max_tokens": CTX * 4}, 400, "invalid_request_error", "max_tokens"),
    ("missing messages", {"model": MODEL, "max_tokens": 4}, 400, "invalid_request_error", "messages"),
    ("empty messages", {**GOOD, "messages": []}, 400, "invalid_request_error", "messages"),
    ("system role in messages", {**GOOD, "messages": [{"role": "system", "content": "x"}]}, 400,
     "invalid_request_error", "role"),
    ("bad role", {**GOOD, "messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_request_error", "role"),
    ("first message from the assistant", {**GOOD, "messages": [{"role": "assistant", "content": "x"}]}, 400,
     "invalid_request_error", "user"),
    ("image block", {**GOOD, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "invalid_request_error", "content"),
    ("tool_use block", {**GOOD, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, 400, "invalid_request_error", "content"),
    ("text block without text", {**GOOD, "messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400,
     "invalid_request_error", "text"),
    ("empty content", {**GOOD, "messages": [{"role": "user", "content": []}]}, 400, "invalid_request_error",
     "content"),
    ("content as number", {**GOOD, "messages": [{"role": "user", "content": 5}]}, 400, "invalid_request_error",
     "content"),
    ("system as number", {**GOOD, "system": 5}, 400, "invalid_request_error", "system"),
    ("temperature 1.5", {**GOOD, "temperature": 1.5}, 400, "invalid_request_error", "temperature"),
    ("top_k negative", {**GOOD, "top_k": -1}, 400, "invalid_request_error", "top_k"),
    ("100 stop sequences", {**GOOD, "stop_sequences": ["a"] * 100}, 400, "invalid_request_error", "stop_sequences"),
    ("stop sequence not a string", {**GOOD, "stop_sequences": [1]}, 400, "invalid_request_error", "stop_sequences"),
    ("empty stop sequence", {**GOOD, "stop_sequences": [""]}, 400, "invalid_request_error", "stop_sequences"),
    ("tools", {**GOOD, "tools": [{"name": "f", "input_schema": {}}]}, 400, "invalid_request_error", "tools"),
    ("unknown model", {**GOOD, "model": "claude"}, 404, "not_found_error", "claude"),
]


def test_invalid_requests_get_anthropic_errors(server, http) -> None:
    failures = []
    for name, body, status, kind, word in BAD:
        r = http.post("/v1/messages", content=json.dumps(body), headers={"Content-Type": "application/json"})
        try:
            data = r.json()
            ok = r.status_code == status and data["type"] == "error" and data["error"]["type"] == kind \
                and word in data["error"]["message"]
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            failures.append(f"{name}: {r.status_code} {r.text[:200]}")
    for name, raw in [("bad json", b'{"model": '), ("json array", b"[1]"), ("empty body", b"")]:
        r = http.post("/v1/messages", content=raw, headers={"Content-Type": "application/json"})
        if r.status_code != 400 or r.json().get("error", {}).get("type") != "invalid_request_error":
            failures.append(f"{name}: {r.status_code} {r.text[:200]}")
    no_key = httpx.post(server[0].url + "/v1/messages", json=GOOD, timeout=60)
    if no_key.status_code != 401 or no_key.json()["error"]["type"] != "authentication_error":
        failures.append(f"no key: {no_key.status_code} {no_key.text[:200]}")
    bearer = httpx.post(server[0].url + "/v1/messages", json=GOOD, headers={"Authorization": f"Bearer {KEY}"},
                        timeout=60)
    if bearer.status_code != 200:
        failures.append(f"bearer key: {bearer.status_code} {bearer.text[:200]}")
    assert not failures, "\n".join(failures)
    # OpenAI's routes keep OpenAI's error shape
    r = http.post("/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, json={"model": MODEL})
    assert r.status_code == 422 and r.json()["error"]["param"] == "prompt"
