"""OpenAI request details on ``lightspeed serve`` (a tiny random Llama over loopback): logprobs and
top_logprobs (chat and legacy shapes, streaming and not, checked against the model's own logits), ``n``
choices with seeds, stop strings, presence/frequency penalties, ``stream_options.include_usage``, and
hostile values of every new field."""
from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pytest
from serve_process import ServerProcess
from tiny_gguf import write_tiny_llama

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

CTX = 256
MODEL = "tiny"
REPEAT = "t1 t1 t1 t1 t1 t1"  # a repetitive prompt
CHAT = [{"role": "user", "content": "t1 t2 t1 t2"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve_details") / "tiny.gguf"
    write_tiny_llama(path, seed=1)
    proc = ServerProcess(["--model", str(path), "--max-batch", "4", "--context", str(CTX), "--max-queue", "8"])
    try:
        import lightspeed.api as lsa
        local = lsa.load(str(path), ctx=CTX, progress=False)  # loads while the server compiles
        proc.wait_ready(timeout=300)
        yield proc, local
    finally:
        assert proc.stop() == 0, "\n".join(proc.log[-20:])


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0].url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _first_logprobs(local, ids: list[int]) -> np.ndarray:
    """log_softmax of the local model's next-token logits after ``ids`` (float64)."""
    logits, _ = local.step.run(ids, 0, local.step.new_caches())
    x = np.asarray(logits[-1], dtype=np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


def _check_entry(logprob: float, top: list[tuple[str, float]], k: int) -> None:
    assert math.isfinite(logprob) and logprob <= 0
    assert len(top) == k
    values = [v for _, v in top]
    assert all(math.isfinite(v) and v <= 0 for v in values)
    assert values == sorted(values, reverse=True)
    assert sum(math.exp(v) for v in values) <= 1 + 1e-9


# logprobs ----------------------------------------------------------------------------------------------
def test_chat_logprobs(server, client) -> None:
    local = server[1]
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0, logprobs=True,
                                       top_logprobs=5, extra_body={"ignore_eos": True})
    choice = r.choices[0]
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens == 8
    for e in content:
        _check_entry(e.logprob, [(t.token, t.logprob) for t in e.top_logprobs], 5)
        # greedy: the chosen token is the most likely one, with the same value
        assert (e.token, e.logprob) == (e.top_logprobs[0].token, e.top_logprobs[0].logprob)
        assert bytes(e.bytes).decode() == e.token
    assert "".join(e.token for e in content) == choice.message.content
    # the first token's values are the model's own distribution after the prompt
    want = _first_logprobs(local, local.chat_ids(CHAT))
    order = np.lexsort((np.arange(want.size), -want))[:5]
    got = content[0].top_logprobs
    assert [t.token for t in got] == [local.tokenizer.decode([int(i)]) for i in order]
    np.testing.assert_allclose([t.logprob for t in got], want[order], rtol=0, atol=1e-5)


def test_sampled_logprobs_match_their_distribution(client) -> None:
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=1.0, seed=3,
                                       logprobs=True, top_logprobs=20, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    seen = 0
    for e in content:
        top = {t.token: t.logprob for t in e.top_logprobs}
        _check_entry(e.logprob, list(top.items()), 20)
        if e.token in top:  # the chosen token's value is the one in the returned distribution
            assert e.logprob == top[e.token]
            seen += 1
        else:
            assert e.logprob <= min(top.values())
    assert seen > 0
    plain = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=1.0, seed=3,
                                           extra_body={"ignore_eos": True})
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == r.choices[0].message.content  # logprobs do not change sampling


def test_completion_logprobs_legacy_shape(client) -> None:
    r = client.completions.create(model=MODEL, prompt="t1 t2", max_tokens=10, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 10
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(10)]
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        _check_entry(value, list(top.items()), 3)
        assert top[token] == value == max(top.values())
    none = client.completions.create(model=MODEL, prompt="t1 t2", max_tokens=2, temperature=0)
    assert none.choices[0].logprobs is None
    zero = client.completions.create(model=MODEL, prompt="t1 t2", max_tokens=2, temperature=0, logprobs=0)
    assert zero.choices[0].logprobs.top_logprobs == [{}, {}] and len(zero.choices[0].logprobs.tokens) == 2


def test_streamed_logprobs_equal_non_streamed(client) -> None:
    options = dict(model=MODEL, messages=CHAT, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2,
                   extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**options).choices[0].logprobs.content
    parts = [e for c in client.chat.completions.create(stream=True, **options)
             if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [p.model_dump() for p in parts] == [w.model_dump() for w in whole]

    legacy = dict(model=MODEL, prompt="t2 t1", max_tokens=10, temperature=0, logprobs=2,
                  extra_body={"ignore_eos": True})
    want = client.completions.create(**legacy).choices[0].logprobs
    tokens, offsets = [], []
    for c in client.completions.create(stream=True, **legacy):
        if c.choices and c.choices[0].logprobs:
            tokens += c.choices[0].logprobs.tokens
            offsets += c.choices[0].logprobs.text_offset
    assert (tokens, offsets) == (want.tokens, want.text_offset)


# n and seeds --------------------------------------------------------------------------------------------
def test_n_choices_are_independent_and_reproducible(client) -> None:
    options = dict(model=MODEL, prompt="t1", max_tokens=12, temperature=1.0, seed=11, n=3,
                   extra_body={"ignore_eos": True})
    a = client.completions.create(**options)
    b = client.completions.create(**options)
    assert [c.index for c in a.choices] == [0, 1, 2]
    texts = [c.text for c in a.choices]
    assert texts == [c.text for c in b.choices]
    assert len(set(texts)) == 3  # independent samples, not one sample three times
    assert a.usage.completion_tokens == 36 and a.usage.prompt_tokens == b.usage.prompt_tokens
    streamed = ["", "", ""]
    for c in client.completions.create(stream=True, **options):
        for choice in c.choices:
            streamed[choice.index] += choice.text
    assert streamed == texts
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0, n=2)
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.content == chat.choices[1].message.content  # greedy: the same choice


# stop strings -------------------------------------------------------------------------------------------
def test_stop_strings_cut_the_text(client) -> None:
    base = dict(model=MODEL, prompt="t2 t2", max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**base).choices[0].text
    stop = full[4:6]
    cut = full[:full.find(stop)]
    for stops in (stop, ["zzzz", stop], [stop, "qqq", "www", "eee"]):
        r = client.completions.create(stop=stops, logprobs=1, **base)
        assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
        tokens = r.choices[0].logprobs.tokens  # only tokens that start before the cut are reported
        assert "".join(tokens).startswith(cut) and len("".join(tokens[:-1])) < len(cut)
    streamed = "".join(c.choices[0].text for c in client.completions.create(stop=[stop], stream=True, **base)
                       if c.choices)
    assert streamed == cut
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0,
                                          extra_body={"ignore_eos": True})
    text = chat.choices[0].message.content
    stopped = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0,
                                             stop=[text[3:5]], extra_body={"ignore_eos": True})
    assert stopped.choices[0].message.content == text[:text.find(text[3:5])]
    assert stopped.choices[0].finish_reason == "stop"


# penalties ----------------------------------------------------------------------------------------------
def test_penalties_change_greedy_output(client) -> None:
    def tokens(**penalties) -> list[str]:
        r = client.completions.create(model=MODEL, prompt=REPEAT, max_tokens=24, temperature=0, logprobs=0,
                                      extra_body={"ignore_eos": True}, **penalties)
        return r.choices[0].logprobs.tokens

    plain = tokens()
    assert len(set(plain)) < len(plain)  # greedy decoding repeats itself here
    assert tokens(presence_penalty=0.0, frequency_penalty=0.0) == plain
    for penalties in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        changed = tokens(**penalties)
        assert changed != plain and len(set(changed)) > len(set(plain)), penalties
    # a negative penalty favours what was already said
    assert len(set(tokens(frequency_penalty=-2.0))) <= len(set(plain))


# include_usage ------------------------------------------------------------------------------------------
def test_include_usage_sends_a_final_usage_chunk(client) -> None:
    options = dict(model=MODEL, messages=CHAT, max_tokens=7, temperature=0, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**options)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **options))
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])
    assert all(c.usage is None for c in client.chat.completions.create(stream=True, **options))
    two = list(client.completions.create(model=MODEL, prompt="t1", max_tokens=5, temperature=0, n=2, stream=True,
                                         stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert two[-1].choices == [] and two[-1].usage.completion_tokens == 10


# hostile values -----------------------------------------------------------------------------------------
COMPLETION = {"model": MODEL, "prompt": "t1", "max_tokens": 2}
CHAT_BODY = {"model": MODEL, "messages": CHAT, "max_tokens": 2}

# (endpoint, change, the field the error must name)
HOSTILE = [
    ("completions", {"n": -1}, "n"), ("completions", {"n": 0}, "n"), ("completions", {"n": 9}, "n"),
    ("completions", {"n": "2"}, "n"), ("completions", {"n": 2.0}, "n"), ("completions", {"n": 10 ** 12}, "n"),
    ("completions", {"n": 8, "max_tokens": 200}, "n"),  # 8 x 200 tokens is over the per-request limit
    ("chat", {"n": 8, "max_tokens": 200}, "n"),
    ("completions", {"logprobs": 6}, "logprobs"), ("completions", {"logprobs": -1}, "logprobs"),
    ("completions", {"logprobs": True}, "logprobs"), ("completions", {"logprobs": "3"}, "logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 10 ** 9}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"), ("chat", {"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    ("chat", {"logprobs": "yes"}, "logprobs"), ("chat", {"logprobs": 1}, "logprobs"),
    ("completions", {"stop": ["a"] * 100}, "stop"), ("chat", {"stop": ["a"] * 5}, "stop"),
    ("completions", {"stop": 5}, "stop"), ("completions", {"stop": [1]}, "stop"),
    ("completions", {"stop": {"a": 1}}, "stop"), ("chat", {"stop": ["x" * 300]}, "stop"),
    ("completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("completions", {"frequency_penalty": -3}, "frequency_penalty"),
    ("chat", {"frequency_penalty": "1"}, "frequency_penalty"),
    ("chat", {"stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ("chat", {"stream_options": {"other": True}}, "stream_options.other"),
    ("completions", {"seed": "1"}, "seed"), ("completions", {"seed": 2 ** 64}, "seed"),
]


def test_hostile_values_are_4xx_naming_the_field(server) -> None:
    failures = []
    with httpx.Client(base_url=server[0].url, timeout=60) as http:
        for endpoint, change, field in HOSTILE:
            base = COMPLETION if endpoint == "completions" else CHAT_BODY
            path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
            r = http.post(path, content=json.dumps({**base, **change}), headers={"Content-Type": "application/json"})
            try:
                err = r.json()["error"]
                named = err["param"] == field or err["param"].startswith(field + ".")  # "stop" or "stop.0"
                ok = 400 <= r.status_code < 500 and named and err["message"]
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                failures.append(f"{endpoint} {change!r:.60}: {r.status_code} {r.text[:160]}")
        # the limits are not off by one, and the server keeps serving
        assert http.post("/v1/completions", json={**COMPLETION, "n": 8, "logprobs": 5}).status_code == 200
        r = http.post("/v1/chat/completions", json={**CHAT_BODY, "logprobs": True, "top_logprobs": 20, "n": 2})
        assert r.status_code == 200 and len(r.json()["choices"][1]["logprobs"]["content"][0]["top_logprobs"]) == 20
    assert not failures, "\n".join(failures)
