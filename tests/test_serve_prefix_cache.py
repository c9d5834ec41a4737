"""The prefix cache: its blocks, chains and LRU eviction on plain arrays; the engine on a tiny random Llama
giving the same tokens with and without it (shared prefixes, eviction under a small budget, a chat's next
turn reusing the reply's rows); and ``lightspeed serve`` with SmolLM2, where the second request sharing a
1,000-token system prompt reaches its first token in at most 0.3x the first's time and reports
``usage.prompt_tokens_details.cached_tokens``."""
from __future__ import annotations

import time

import numpy as np
import pytest
from tiny_gguf import write_tiny_llama

from lightspeed.engine.batched import BatchedStep
from lightspeed.engine.scheduler import Engine
from lightspeed.engine.sequence import DONE, RequestOptions, Sequence
from lightspeed.models import load_model
from lightspeed.prefix_cache import PrefixCache

CTX, MAX_BATCH, CHUNK, BLOCK = 128, 3, 16, 8


# the cache alone --------------------------------------------------------------------------------------
def _rows(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"k0": rng.standard_normal((n, 2, 4)).astype(np.float32),
            "v0": rng.standard_normal((n, 2, 4)).astype(np.float16)}


def test_blocks_chains_and_limits() -> None:
    cache = PrefixCache(max_bytes=1 << 20, block=4)
    ids = list(range(10, 30))
    src = _rows(20, 0)
    assert cache.store(ids, src, n=18) == 4  # whole blocks of the first 18 tokens only
    dst = {k: np.zeros_like(v) for k, v in src.items()}
    assert cache.load(ids, dst, limit=len(ids) - 1) == 16
    for k in src:
        np.testing.assert_array_equal(dst[k][:16], src[k][:16])
        assert not dst[k][16:].any() and dst[k].dtype == src[k].dtype
    assert cache.match(ids, limit=9) == 8 and cache.match(ids[:3]) == 0
    assert cache.match([99] + ids[1:]) == 0            # a different first token: no later block matches
    assert cache.match(ids[:8] + [0] * 8) == 8         # a shared beginning matches up to where they differ
    assert cache.store(ids, src) == 1                  # only the block it lacked
    assert cache.stats()["hit_tokens"] == 16 and len(cache) == 5


def test_lru_eviction_takes_the_ends_of_prefixes_first() -> None:
    block_bytes = 4 * (2 * 4 * 4 + 2 * 4 * 2)           # one block of k0 (f32) and v0 (f16) rows
    cache = PrefixCache(max_bytes=6 * block_bytes, block=4)
    a, b = list(range(100, 116)), list(range(200, 216))  # 4 blocks each
    cache.store(a, _rows(16, 1))
    cache.store(b, _rows(16, 2))                          # 8 blocks > 6: a's last two blocks go
    assert cache.bytes <= cache.max_bytes and len(cache) == 6
    assert cache.match(b) == 16 and cache.match(a) == 8  # what is left of a is still reachable
    cache.load(a, {k: np.zeros_like(v) for k, v in _rows(16, 0).items()})  # a is now the most recent
    cache.store(list(range(300, 308)), _rows(8, 3))       # 2 more blocks: b's end goes, a stays
    assert cache.match(a) == 8 and cache.match(b) == 8
    assert cache.stats()["evicted_blocks"] == 4
    assert PrefixCache(max_bytes=0).store(a, _rows(16, 1)) == 0


# the engine -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("prefix") / "tiny.gguf"
    write_tiny_llama(path, seed=4)
    lm = load_model(path)
    return lm, lm.compile(CTX, max_chunk=CHUNK, backend="c")


class _Sink:
    def __init__(self):
        import threading
        self.done = threading.Event()

    def __call__(self, kind, payload):
        if kind in (DONE, "error"):
            self.kind = kind
            self.done.set()


def _run(engine: Engine, lm, prompts: list[list[int]], max_tokens: int = 12) -> list[tuple[list[int], int]]:
    """Greedy tokens and cached prompt tokens of each prompt, one request after the other."""
    out = []
    for ids in prompts:
        sink = _Sink()
        seq = Sequence(ids, RequestOptions(max_tokens=max_tokens, ignore_eos=True), lm.tokenizer, set(), sink)
        engine.submit(seq)
        assert sink.done.wait(60) and sink.kind == DONE
        out.append((seq.token_ids, seq.cached_tokens))
    return out


def _engine(tiny, cache):
    lm, single = tiny
    eng = Engine(single, BatchedStep(lm, CTX, MAX_BATCH, backend="c"), prefix_cache=cache)
    eng.start()
    return eng


def test_engine_outputs_equal_with_and_without_the_cache(tiny) -> None:
    lm = tiny[0]
    rng = np.random.default_rng(0)
    system = [int(t) for t in rng.integers(3, 128, 45)]
    prompts = [system + [int(t) for t in rng.integers(3, 128, n)] for n in (5, 9, 1, 30)] + [system[:20], system]
    plain = _engine(tiny, None)
    cached_engine = _engine(tiny, PrefixCache(max_bytes=1 << 24, block=BLOCK))
    itemsize = np.dtype(tiny[1].cache_specs[0].dtype.np).itemsize  # float16 by default
    small_engine = _engine(tiny, PrefixCache(max_bytes=6 * 30 * 8 * 4 * 2 * itemsize, block=BLOCK))  # a few blocks
    try:
        want = _run(plain, lm, prompts)
        got = _run(cached_engine, lm, prompts)
        assert [t for t, _ in got] == [t for t, _ in want]
        assert got[0][1] == 0 and all(c == 40 for _, c in got[1:4])  # the system prompt's whole blocks
        assert got[4][1] == 16 and got[5][1] == 40
        stats = cached_engine.stats()
        assert stats["prefilled_tokens"] == sum(len(p) for p in prompts) - sum(c for _, c in got)
        small = _run(small_engine, lm, prompts)
        assert [t for t, _ in small] == [t for t, _ in want]
        assert small_engine.stats()["prefix_cache"]["evicted_blocks"] > 0
        # the next turn of a chat starts with the previous prompt and reply: their rows are reused
        (reply, _), = _run(cached_engine, lm, [prompts[3]], max_tokens=20)
        turn = prompts[3] + reply + [5, 6, 7]
        (again, cached), = _run(cached_engine, lm, [turn])
        assert cached == (len(prompts[3]) + 20 - 1) // BLOCK * BLOCK and cached > len(prompts[3]) - BLOCK
        assert again == _run(plain, lm, [turn])[0][0]
    finally:
        for e in (plain, cached_engine, small_engine):
            e.stop(timeout=5)


# the server -------------------------------------------------------------------------------------------
def test_shared_system_prompt_time_to_first_token() -> None:
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import lightspeed.api as lsa
    from serve_process import ServerProcess
    try:
        lsa.default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    proc = ServerProcess(["--max-batch", "2", "--context", "1280"])
    try:
        proc.wait_ready(timeout=400)
        client = openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        words = "Answer kindly, briefly and accurately; cite nothing; never invent facts about the world. "
        system = {"role": "system", "content": words * 70}

        def ask(question: str) -> tuple[float, str, dict]:
            t0 = time.perf_counter()
            first, text, usage = None, "", None
            for chunk in client.chat.completions.create(
                    model="SmolLM2-135M-Instruct.Q4_1", messages=[system, {"role": "user", "content": question}],
                    max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}):
                if chunk.choices and chunk.choices[0].delta.content and first is None:
                    first = time.perf_counter() - t0
                text += chunk.choices[0].delta.content or "" if chunk.choices else ""
                usage = chunk.usage or usage
            return first, text, usage.model_dump()

        t1, _, u1 = ask("Name a planet.")
        t2, text2, u2 = ask("Name a color.")
        assert u1["prompt_tokens"] > 1000 and u1["prompt_tokens_details"]["cached_tokens"] == 0
        assert u2["prompt_tokens_details"]["cached_tokens"] >= u2["prompt_tokens"] - 40
        assert t2 <= 0.3 * t1, (t1, t2)
        # the reply is the one an uncached prefill gives
        proc_plain = ServerProcess(["--max-batch", "1", "--context", "1280", "--prefix-cache-mb", "0"])
        try:
            proc_plain.wait_ready(timeout=400)
            plain = openai.OpenAI(base_url=proc_plain.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            r = plain.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", max_tokens=8, temperature=0,
                                              messages=[system, {"role": "user", "content": "Name a color."}])
            assert r.choices[0].message.content == text2
            assert r.usage.prompt_tokens_details.cached_tokens == 0
        finally:
            assert proc_plain.stop() == 0
    finally:
        assert proc.stop() == 0, "\n".join(proc.log[-20:])
