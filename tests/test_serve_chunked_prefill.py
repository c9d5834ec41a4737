"""Chunked prefill inside the batch: a long prompt is prefilled a chunk per engine turn while other sequences
decode (a fixed size, or sized to a decode step), in the program's largest chunks when nothing else decodes,
with outputs equal to runs alone. On a tiny random Llama, with the single-sequence program wrapped to record its
calls; and ``lightspeed serve`` with SmolLM2, where four running streams keep their pace while a client sends
a ~1,500-token prompt (their p99 gap within 8x their median gap before it; the issue's 3x is not reached)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from tiny_gguf import write_tiny_llama

from lightspeed.engine.batched import BatchedStep
from lightspeed.engine.chunking import MIN_AUTO_CHUNK, ChunkPolicy
from lightspeed.engine.scheduler import Engine
from lightspeed.engine.sequence import DONE, TEXT, RequestOptions, Sequence
from lightspeed.models import load_model
from lightspeed.prefix_cache import PrefixCache

CTX, MAX_BATCH, MAX_CHUNK, CHUNK = 160, 4, 32, 5


class RecordingStep:
    """The single-sequence program, recording each call as (position, tokens, decode steps run so far)."""

    def __init__(self, step):
        self.step = step
        self.ctx, self.max_chunk, self.kv_update = step.ctx, step.max_chunk, step.kv_update
        self.calls: list[tuple[int, int, int]] = []
        self.engine: Engine | None = None

    def run(self, tokens, pos, caches):
        self.calls.append((pos, len(tokens), self.engine.steps if self.engine else 0))
        return self.step.run(tokens, pos, caches)


class Stream:
    """A sink recording, for each text piece, the prefill calls made so far, and the end. With ``hold``, the
    engine thread waits at the third piece until ``go`` is set (so a test can submit work while the stream
    certainly still runs: a tiny model decodes its tokens in milliseconds)."""

    def __init__(self, step: RecordingStep, hold: bool = False):
        self.step = step
        self.marks: list[int] = []
        self.done = threading.Event()
        self.kind = None
        self.hold, self.reached, self.go = hold, threading.Event(), threading.Event()

    def __call__(self, kind, payload):
        if kind == TEXT:
            self.marks.append(len(self.step.calls))
            if self.hold and len(self.marks) == 3:
                self.reached.set()
                self.go.wait(30)
        elif kind != "logprobs":
            self.kind = kind
            self.done.set()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("chunked") / "tiny.gguf"
    write_tiny_llama(path, seed=6)
    lm = load_model(path)
    # float activations: under the default ("auto") a prompt's rows round by how it was cut (int16 for calls of
    # up to 8 rows, float or, on AMX, bfloat16 tiles for longer ones), and this tiny random model's logits are
    # close enough to tie that a reply cut otherwise may differ; here the replies must be equal
    opts = {"backend": "c", "activations": "float"}
    return lm, lm.compile(CTX, max_chunk=MAX_CHUNK, **opts), BatchedStep(lm, CTX, MAX_BATCH, **opts)


def _engine(tiny, chunk=CHUNK, cache=None):
    lm, single, batched = tiny
    step = RecordingStep(single)
    eng = Engine(step, batched, prefill_chunk=chunk, prefix_cache=cache)
    step.engine = eng
    eng.start()
    return eng, step


def _submit(eng, step, lm, ids, max_tokens, hold=False):
    sink = Stream(step, hold)
    seq = Sequence(ids, RequestOptions(max_tokens=max_tokens, ignore_eos=True), lm.tokenizer, set(), sink)
    eng.submit(seq)
    return seq, sink


def _ids(rng, n):
    return [int(t) for t in rng.integers(3, 128, n)]


def test_long_prompt_interleaves_with_decoding(tiny) -> None:
    lm = tiny[0]
    rng = np.random.default_rng(0)
    shorts = [_ids(rng, n) for n in (3, 7, 4)]
    long_prompt = _ids(rng, 71)
    eng, step = _engine(tiny)
    try:
        alone = []
        for ids in shorts:
            seq, sink = _submit(eng, step, lm, ids, 60)
            assert sink.done.wait(60) and sink.kind == DONE
            alone.append(seq.token_ids)
        step.calls.clear()
        seq, sink = _submit(eng, step, lm, long_prompt, 10)
        assert sink.done.wait(60) and sink.kind == DONE
        alone.append(seq.token_ids)
        # alone: chunks of the program's bound, back to back
        assert [(p, n) for p, n, _ in step.calls] == [(0, 32), (32, 32), (64, 7)]
        running = [_submit(eng, step, lm, ids, 60, hold=i == 2) for i, ids in enumerate(shorts)]
        assert running[2][1].reached.wait(30)  # all three decode (the last admitted is at its third token)
        before = len(step.calls)
        seq, sink = _submit(eng, step, lm, long_prompt, 10)
        running[2][1].go.set()
        assert sink.done.wait(60) and all(s.done.wait(60) for _, s in running)
        assert [q.token_ids for q, _ in running] + [seq.token_ids] == alone
        chunks = step.calls[before:]
        assert [(p, n) for p, n, _ in chunks] == [(p, min(CHUNK, 71 - p)) for p in range(0, 71, CHUNK)]
        # exactly one decode step of the running streams after each chunk
        steps = [s for _, _, s in chunks]
        assert all(b == a + 1 for a, b in zip(steps, steps[1:])), steps
        assert eng.stats()["prefill_chunk"] == CHUNK
    finally:
        eng.stop(timeout=5)


def test_auto_chunks_alternate_with_decode_steps(tiny) -> None:
    """With the default (auto) size, a prompt arriving while others decode runs in chunks smaller than the
    program's bound, each followed by a decode step, and the replies equal those of runs alone."""
    lm = tiny[0]
    rng = np.random.default_rng(2)
    short, long_prompt = _ids(rng, 5), _ids(rng, 120)
    eng, step = _engine(tiny, chunk=None)
    try:
        assert eng.stats()["prefill_chunk"] == "auto"
        want = []
        for ids, m in ((short, 100), (long_prompt, 8)):
            seq, sink = _submit(eng, step, lm, ids, m)
            assert sink.done.wait(60)
            want.append(seq.token_ids)
        running, stream = _submit(eng, step, lm, short, 100, hold=True)
        assert stream.reached.wait(30)
        before = len(step.calls)
        seq, sink = _submit(eng, step, lm, long_prompt, 8)
        stream.go.set()
        assert sink.done.wait(60) and stream.done.wait(60)
        assert [running.token_ids, seq.token_ids] == want
        chunks = step.calls[before:]
        assert sum(n for _, n, _ in chunks) == len(long_prompt) and len(chunks) > len(long_prompt) // MAX_CHUNK + 1
        assert [p for p, _, _ in chunks] == list(np.cumsum([0] + [n for _, n, _ in chunks[:-1]]))
        # a decode step after each chunk while the stream runs; once it has finished, the rest back to back
        diffs = [b - a for (_, _, a), (_, _, b) in zip(chunks, chunks[1:])]
        assert diffs[:5] == [1] * 5 and set(diffs) <= {0, 1}, diffs
        assert 0 not in diffs or (min(diffs[diffs.index(0):]) == max(diffs[diffs.index(0):]) == 0), diffs
    finally:
        eng.stop(timeout=5)


def test_chunk_policy_sizes_chunks_to_a_decode_step() -> None:
    def call(n: int, fixed: float, per_token: float) -> None:
        policy.prefilled(n, fixed + per_token * n)

    policy = ChunkPolicy(max_chunk=128, share=1.0)
    assert policy.size(alone=True) == 128 and policy.size(alone=False) == MIN_AUTO_CHUNK
    policy.decoded(0.020)
    call(8, 0.0, 0.005)                                # one size seen: all of it counted per token
    assert policy.size(alone=False) == 4
    for n in (128, 128, 7, 4, 128, 5):                 # 8 ms a call + 4 ms a token, steps of 20 ms: 3 -> 4
        call(n, 0.008, 0.004)
    assert policy.call_cost() == pytest.approx((0.008, 0.004), rel=0.05)
    for _ in range(40):                                # the batch grew: steps of 48 ms -> 10 tokens
        policy.decoded(0.048)
    assert policy.size(alone=False) == 10
    tiny = ChunkPolicy(max_chunk=64, share=1.0)        # a call costs what a step does; tokens are nearly free
    for n in (64, 3, 64, 12):
        tiny.prefilled(n, 30e-6 + 0.2e-6 * n)
    tiny.decoded(40e-6)
    assert tiny.size(alone=False) == 50
    half = ChunkPolicy(max_chunk=64)                   # the default: chunks of about half a step
    for n in (64, 3, 64, 12):
        half.prefilled(n, 0.008 + 0.004 * n)
    half.decoded(0.048)
    assert half.share == 0.5 and half.size(alone=False) == 4
    assert half.size(alone=False, queued=True) == 22    # requests wait for a slot: two steps' worth
    assert ChunkPolicy(64, chunk=100).size(alone=False) == 64 and ChunkPolicy(64, chunk=3).size(False) == 3
    assert ChunkPolicy(64, chunk=3, share=0.5).size(alone=True) == 64


def test_chunks_after_a_prefix_cache_hit(tiny) -> None:
    """A prompt whose beginning is cached, arriving while another sequence decodes, prefills the rest in
    chunks from the end of the cached blocks and replies as without the cache."""
    lm = tiny[0]
    rng = np.random.default_rng(1)
    system = _ids(rng, 40)
    eng, step = _engine(tiny, chunk=6, cache=PrefixCache(1 << 24, block=8))
    plain, plain_step = _engine(tiny, chunk=6)
    try:
        first, sink = _submit(eng, step, lm, system + _ids(rng, 9), 5)
        assert sink.done.wait(60)
        _, stream = _submit(eng, step, lm, _ids(rng, 4), 100, hold=True)
        assert stream.reached.wait(30)
        before = len(step.calls)
        prompt = system + _ids(rng, 13)
        seq, sink = _submit(eng, step, lm, prompt, 8)
        stream.go.set()
        assert sink.done.wait(60) and seq.cached_tokens == 40 and stream.done.wait(60)
        assert [(p, n) for p, n, _ in step.calls[before:]] == [(40, 6), (46, 6), (52, 1)]
        ref, sink = _submit(plain, plain_step, lm, prompt, 8)
        assert sink.done.wait(60) and ref.token_ids == seq.token_ids
    finally:
        eng.stop(timeout=5)
        plain.stop(timeout=5)


def test_prefill_chunk_is_checked_and_bounded(tiny) -> None:
    _, single, batched = tiny
    for bad in (0, -3, 2.5, "8"):
        with pytest.raises(ValueError, match="prefill_chunk"):
            Engine(single, batched, prefill_chunk=bad)
    assert Engine(single, batched, prefill_chunk=1000).stats()["prefill_chunk"] == MAX_CHUNK


# the server -------------------------------------------------------------------------------------------
def test_running_streams_keep_their_pace_during_a_long_prompt() -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import json
    import os

    import lightspeed.api as lsa
    from serve_process import ServerProcess
    try:
        lsa.default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    # one thread: on a shared machine a descheduled partner thread stalls every step at a barrier, and
    # those stalls (not the scheduler) would dominate the slowest gaps
    proc = ServerProcess(["--max-batch", "5", "--context", "2048", "--prefix-cache-mb", "0", "--threads", "1"])
    try:
        url = proc.wait_ready(timeout=400)
        model = "SmolLM2-135M-Instruct.Q4_1"
        stamps: list[list[float]] = [[] for _ in range(4)]
        texts = [""] * 4
        long_done = threading.Event()
        at: dict[str, float] = {}  # when the long prompt was sent and answered

        def stream(i: int) -> None:
            body = {"model": model, "prompt": f"Chapter {i + 1}. The", "max_tokens": 1900, "temperature": 0,
                    "stream": True, "ignore_eos": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        texts[i] += json.loads(line[6:])["choices"][0]["text"]
                        stamps[i].append(time.perf_counter())
                    if long_done.is_set() and len(stamps[i]) > 0 and time.perf_counter() - at["answered"] > 1.0:
                        return  # closing the stream cancels the request

        load_before = os.getloadavg()[0]
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while min(len(s) for s in stamps) < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        words = "the quiet river bends past old stone mills and green fields where children play "
        prompt = words * 110
        at["sent"] = time.perf_counter()
        r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 4,
                                                      "temperature": 0}, timeout=300)
        at["answered"] = time.perf_counter()
        long_done.set()
        for t in threads:
            t.join(timeout=120)
        assert r.status_code == 200 and 1400 <= r.json()["usage"]["prompt_tokens"] <= 1700, r.text
        before = np.concatenate([np.diff([x for x in s if x < at["sent"]]) for s in stamps])
        gaps = np.concatenate([np.diff(s) for s in stamps])
        during = np.concatenate([np.diff([x for x in s if at["sent"] <= x <= at["answered"]]) for s in stamps])
        median, p99 = float(np.median(before)), float(np.percentile(gaps, 99))
        assert len(during) > 40, "the streams made no progress while the long prompt was prefilled"
        figures = (f"p99 gap {p99 * 1e3:.1f} ms vs median {median * 1e3:.1f} ms before the long prompt; "
                   f"{len(during)} gaps during its prefill, median {np.median(during) * 1e3:.1f} ms")
        print(figures)
        # what the first stream said before and while the long prompt arrived is what it says alone
        n = min(len(stamps[0]), 150)
        alone = httpx.post(url + "/v1/completions", json={"model": model, "prompt": "Chapter 1. The",
                                                          "max_tokens": n, "temperature": 0, "ignore_eos": True},
                           timeout=300)
        text = alone.json()["choices"][0]["text"]
        assert alone.status_code == 200 and len(text) > n and texts[0].startswith(text)
        load = max(load_before, os.getloadavg()[0])
        if load > (os.cpu_count() or 1) + 0.5:  # other processes take the cores: wall-clock ratios mean little
            pytest.skip(f"the machine is loaded (load average {load:.1f} on {os.cpu_count()} cores); {figures}")
        # issue 19 asks for under 3x. A chunk between two steps costs a pass over the weights, about a decode
        # step itself, so a gap during the prefill is about twice a gap before it: 3-6x at the 99th percentile
        # on a shared 2-core machine (benchmarks/README.md, "Serving"); prefilled whole, 128-token chunks
        # gave 20-31x. The bound here catches a return to that, not the target.
        assert p99 < 8 * median, figures
    finally:
        assert proc.stop() == 0, "\n".join(proc.log[-20:])
