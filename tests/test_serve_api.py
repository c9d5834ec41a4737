"""``lightspeed serve`` with SmolLM2 over loopback: the official ``openai`` client (completions, chat,
streaming, embeddings), greedy output equal to ``lightspeed generate``, 16 concurrent streams equal
to their sequential outputs, a table of hostile requests, and a client that disconnects mid-stream.

One server (started once for the module: compiling its programs takes most of the time)."""
from __future__ import annotations

import asyncio
import base64
import json
import time

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serve_process import ServerProcess

KEY = "test-key-123"
CTX = 512
MODEL = "SmolLM2-135M-Instruct.Q4_1"
EMBED = "all-MiniLM-L6-v2"
BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def server():
    import lightspeed.api as lsa
    try:
        lsa.default_model_path()
        from lightspeed.embed import default_embedder_path
        default_embedder_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    proc = ServerProcess(["--max-batch", "8", "--context", str(CTX), "--api-key", KEY, "--embed-model", "default",
                          "--max-body-bytes", str(BODY_LIMIT), "--max-queue", "64"])
    try:
        # the local references load while the server compiles
        from lightspeed.embed import load_embedder
        local = lsa.load(ctx=CTX, progress=False)
        embedder = load_embedder()
        proc.wait_ready(timeout=400)
        yield proc, local, embedder
    finally:
        code = proc.stop()
        assert code == 0, "\n".join(proc.log[-20:])


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0].url + "/v1", api_key=KEY, max_retries=0, timeout=300)


def _http(server) -> httpx.Client:
    return httpx.Client(base_url=server[0].url, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)


# the openai client -------------------------------------------------------------------------------------
def test_models_and_health(server, client) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL, EMBED]
    assert client.models.retrieve(MODEL).id == MODEL
    health = httpx.get(server[0].url + "/health", timeout=30)  # no key needed
    assert health.status_code == 200 and health.json()["status"] == "ok"


@pytest.mark.parametrize("prompt", ["The capital of France is", "def fibonacci(n):"])
def test_completion_equals_generate(server, client, prompt) -> None:
    local = server[1]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0)
    gen = local.generate(prompt, max_tokens=32)
    text = gen.run()
    assert r.choices[0].text == text
    assert r.choices[0].finish_reason == {"context": "length"}.get(gen.finish_reason, gen.finish_reason)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(gen.prompt_ids), len(gen.token_ids))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_equals_generate(server, client) -> None:
    local = server[1]
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a planet."}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0)
    want = local.chat(messages, max_tokens=32).run()
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want
    assert r.usage.prompt_tokens == len(local.chat_ids(messages))


def test_streaming_equals_non_streaming(client) -> None:
    prompt = "Once upon a time"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 3  # it really streamed
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens

    messages = [{"role": "user", "content": "Tell me about cats."}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
    parts = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0,
                                                stream=True))
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts) == chat.choices[0].message.content
    assert parts[-1].choices[0].finish_reason == chat.choices[0].finish_reason


def test_sampling_options(server, client) -> None:
    local = server[1]
    prompt = "Here is a list of animals:"
    stopped = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=["\n", "."])
    assert stopped.choices[0].text == local.generate(prompt, max_tokens=24, stop=["\n", "."]).run()
    assert stopped.choices[0].finish_reason == "stop"
    assert "\n" not in stopped.choices[0].text and "." not in stopped.choices[0].text
    a, b = (client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=1.0, top_p=0.9, seed=7)
            for _ in range(2))
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].text == local.generate(prompt, max_tokens=12, temperature=1.0, top_p=0.9, seed=7).run()
    short = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert short.usage.completion_tokens == 3 and short.choices[0].finish_reason == "length"


@pytest.mark.parametrize("encoding", [None, "base64", "float"], ids=["client-default", "base64", "float"])
def test_embeddings(server, client, encoding) -> None:
    texts = ["A cat sits on the mat.", "Stock markets fell today.", "A kitten rests on a rug."]
    options = {"encoding_format": encoding} if encoding else {}
    r = client.embeddings.create(model=EMBED, input=texts, **options)
    if encoding == "base64":  # asked for explicitly, the client hands back the base64 text
        got = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in r.data])
    else:
        got = np.array([d.embedding for d in r.data], dtype=np.float32)
    np.testing.assert_allclose(got, server[2].embed(texts), rtol=1e-6, atol=1e-6)
    assert [d.index for d in r.data] == [0, 1, 2]
    assert r.usage.prompt_tokens == sum(len(i) for i in server[2].token_ids(texts))


# concurrency -------------------------------------------------------------------------------------------
def test_16_concurrent_streams_equal_their_sequential_outputs(server) -> None:
    """Each stream alone, then all 16 at once (8 slots: they queue, join and leave): same text."""
    prompts = [f"{i} + {i} equals" for i in range(16)]  # short prompts: the test is about decoding
    aclient = openai.AsyncOpenAI(base_url=server[0].url + "/v1", api_key=KEY, max_retries=0, timeout=600)

    async def one(i: int) -> tuple[str, str]:
        stream = await aclient.completions.create(model=MODEL, prompt=prompts[i], max_tokens=5 + i % 4,
                                                  temperature=0, stream=True)
        text, finish = "", None
        async for part in stream:
            text += part.choices[0].text
            finish = part.choices[0].finish_reason or finish
        return text, finish

    async def main():
        t0 = time.perf_counter()
        sequential = [await one(i) for i in range(16)]
        t1 = time.perf_counter()
        together = await asyncio.gather(*[one(i) for i in range(16)])
        return sequential, together, (t1 - t0, time.perf_counter() - t1)

    before = httpx.get(server[0].url + "/health", timeout=30).json()
    sequential, together, seconds = asyncio.run(main())
    print(f"16 streams: {seconds[0]:.1f} s one after another, {seconds[1]:.1f} s at once")
    assert list(together) == sequential
    assert all(finish in ("stop", "length") and text for text, finish in sequential)
    after = httpx.get(server[0].url + "/health", timeout=30).json()
    assert after["active"] == 0 and after["waiting"] == 0
    steps = after["steps"] - before["steps"]
    tokens = after["decoded_tokens"] - before["decoded_tokens"]
    # steps advanced several sequences at once (prompts that arrive while others decode join a few tokens per
    # step, chunked prefill, so these short replies overlap less than whole-prompt admission made them)
    assert tokens > 1.25 * steps, (tokens, steps)


def test_disconnect_frees_the_slot(server) -> None:
    body = {"model": MODEL, "prompt": "Count to one thousand:", "max_tokens": 400, "stream": True,
            "ignore_eos": True}
    with _http(server) as http:
        with http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = 0
            for line in lines:
                got += line.startswith("data: ")
                if got >= 3:
                    break
            busy = httpx.get(server[0].url + "/health", timeout=30).json()
            assert busy["active"] == 1
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            health = httpx.get(server[0].url + "/health", timeout=30).json()
            if health["active"] == 0:
                break
            time.sleep(0.05)
        assert health["active"] == 0, health
        # far fewer tokens than asked for were generated after the client left
        assert health["decoded_tokens"] - busy["decoded_tokens"] < 200


# hostile requests --------------------------------------------------------------------------------------
LONG_PROMPT = "word " * 1000  # > 512 tokens, < the body limit
GOOD = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
AUTH = {"Authorization": f"Bearer {KEY}"}

# (name, method, path, headers, body: bytes | dict | None, status, error code or None)
HOSTILE = [
    ("bad json", "POST", "/v1/completions", AUTH, b'{"model": ', 400, "invalid_json"),
    ("json array", "POST", "/v1/completions", AUTH, b"[1, 2]", 400, "invalid_json"),
    ("empty body", "POST", "/v1/completions", AUTH, b"", 400, "invalid_json"),
    ("invalid utf-8", "POST", "/v1/completions", AUTH, b'{"model": "\xff\xfe", "prompt": "a"}', 400,
     "invalid_encoding"),
    ("lone surrogate", "POST", "/v1/completions", AUTH, b'{"model": "m", "prompt": "\\ud800"}', 400,
     "invalid_unicode"),
    ("NaN literal", "POST", "/v1/completions", AUTH, b'{"model": "m", "prompt": "a", "temperature": NaN}', 400,
     "invalid_json"),
    ("deep nesting", "POST", "/v1/completions", AUTH, b"[" * 50000, 400, "invalid_json"),
    ("max_tokens as string", "POST", "/v1/completions", AUTH, {**GOOD, "max_tokens": "5"}, 422, "int_type"),
    ("prompt as number", "POST", "/v1/completions", AUTH, {**GOOD, "prompt": 5}, 422, None),
    ("negative max_tokens", "POST", "/v1/completions", AUTH, {**GOOD, "max_tokens": -1}, 422, None),
    ("huge max_tokens", "POST", "/v1/completions", AUTH, {**GOOD, "max_tokens": 10 ** 30}, 400,
     "max_tokens_too_large"),
    ("max_tokens past the context", "POST", "/v1/completions", AUTH, {**GOOD, "max_tokens": CTX}, 400,
     "context_length_exceeded"),
    ("temperature too high", "POST", "/v1/completions", AUTH, {**GOOD, "temperature": 5}, 422, None),
    ("seed as float", "POST", "/v1/completions", AUTH, {**GOOD, "seed": 1.5}, 422, None),
    ("stream as string", "POST", "/v1/completions", AUTH, {**GOOD, "stream": "yes"}, 422, None),
    ("unknown field", "POST", "/v1/completions", AUTH, {**GOOD, "foo": 1}, 422, "extra_forbidden"),
    ("missing prompt", "POST", "/v1/completions", AUTH, {"model": MODEL}, 422, "missing"),
    ("n = 9 (above the limit of 8)", "POST", "/v1/completions", AUTH, {**GOOD, "n": 9}, 422, None),
    ("five stop strings", "POST", "/v1/completions", AUTH, {**GOOD, "stop": list("abcde")}, 422, None),
    ("logit_bias key not an id", "POST", "/v1/completions", AUTH, {**GOOD, "logit_bias": {"abc": 1}}, 422, None),
    ("token id out of vocab", "POST", "/v1/completions", AUTH, {**GOOD, "prompt": [1, 10 ** 7]}, 422, None),
    ("unknown model", "POST", "/v1/completions", AUTH, {**GOOD, "model": "gpt-4"}, 404, "model_not_found"),
    ("prompt longer than the context", "POST", "/v1/completions", AUTH, {**GOOD, "prompt": LONG_PROMPT}, 400,
     "context_length_exceeded"),
    ("body over the limit", "POST", "/v1/completions", AUTH, {**GOOD, "prompt": "x" * (BODY_LIMIT + 10)}, 413,
     "request_too_large"),
    ("missing messages", "POST", "/v1/chat/completions", AUTH, {"model": MODEL}, 422, "missing"),
    ("empty messages", "POST", "/v1/chat/completions", AUTH, {**CHAT, "messages": []}, 422, None),
    ("bad role", "POST", "/v1/chat/completions", AUTH, {**CHAT, "messages": [{"role": "wizard", "content": "x"}]},
     422, None),
    ("message without content", "POST", "/v1/chat/completions", AUTH, {**CHAT, "messages": [{"role": "user"}]},
     422, "missing"),
    ("tools", "POST", "/v1/chat/completions", AUTH, {**CHAT, "tools": [{"type": "function"}]}, 422, None),
    ("embeddings of nothing", "POST", "/v1/embeddings", AUTH, {"model": EMBED, "input": []}, 422, None),
    ("embeddings from the chat model", "POST", "/v1/embeddings", AUTH, {"model": MODEL, "input": "x"}, 400,
     "wrong_model_type"),
    ("no api key", "POST", "/v1/completions", {}, GOOD, 401, "invalid_api_key"),
    ("wrong api key", "POST", "/v1/chat/completions", {"Authorization": "Bearer nope"}, CHAT, 401,
     "invalid_api_key"),
    ("models without a key", "GET", "/v1/models", {}, None, 401, "invalid_api_key"),
    ("wrong method", "GET", "/v1/completions", AUTH, None, 405, None),
    ("unknown path", "POST", "/v1/nothing", AUTH, GOOD, 404, None),
]


def test_hostile_requests_get_the_right_4xx(server) -> None:
    assert len(HOSTILE) >= 20
    failures = []
    with httpx.Client(base_url=server[0].url, timeout=120) as http:
        for name, method, path, headers, body, status, code in HOSTILE:
            content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
            r = http.request(method, path, headers={"Content-Type": "application/json", **headers}, content=content)
            try:
                err = r.json()["error"]
                ok = r.status_code == status and isinstance(err["message"], str) and err["message"] \
                    and "type" in err and (code is None or err["code"] == code)
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                failures.append(f"{name}: {r.status_code} {r.text[:200]}")
        assert not failures, "\n".join(failures)
        # the server keeps serving
        r = http.post("/v1/completions", headers=AUTH, json={**GOOD, "ignore_eos": True})  # never 0 tokens
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        assert http.get("/health").json()["status"] == "ok"

