"""The mixed step (lightspeed.engine.mixed): one call decodes a token of each running sequence and prefills a
chunk of the next prompt. Its numbers against the single-sequence program and the plain batched step, its input
checks, and the engine carrying prompt chunks on decode steps with replies equal to runs alone."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from tiny_gguf import write_tiny_llama

from lightspeed.backend.c.activations import resolve_activations
from lightspeed.engine.batched import BatchedStep
from lightspeed.engine.chunking import MIN_AUTO_CHUNK, MIN_MIXED_CHUNK, ChunkPolicy
from lightspeed.engine.mixed import MixedStep, build_mixed
from lightspeed.engine.scheduler import Engine
from lightspeed.engine.sequence import DONE, ERROR, TEXT, RequestOptions, Sequence
from lightspeed.models import load_model

CTX, MAX_BATCH, MAX_CHUNK = 160, 4, 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("mixed") / "tiny.gguf"
    write_tiny_llama(path, seed=11)
    lm = load_model(path)
    # float activations: under the default ("auto": int16 for calls of few rows, float for more) a row's numbers
    # depend on how many rows share its call, which these tests would mistake for the mixed step's doing
    opts = {"backend": "c", "activations": "float"}
    single = lm.compile(CTX, max_chunk=MAX_CHUNK, **opts)
    batched = BatchedStep(lm, CTX, MAX_BATCH, **opts)
    return lm, single, MixedStep(batched, lm, MAX_CHUNK, **opts)


def _ids(rng, n):
    return [int(t) for t in rng.integers(3, 128, n)]


def _clear(mixed: MixedStep) -> None:
    for a in mixed.batched.caches.values():
        a[:] = 0


def test_mixed_call_matches_the_single_sequence_program(tiny) -> None:
    lm, single, mixed = tiny
    _clear(mixed)
    rng = np.random.default_rng(0)
    prompts = [_ids(rng, n) for n in (5, 17)]
    nexts = []
    for slot, ids in enumerate(prompts):  # two decoding sequences in slots 0 and 1
        logits, _ = single.run(ids, 0, mixed.slot_caches(slot))
        nexts.append(int(np.argmax(logits[-1])))
    long_prompt = _ids(rng, 45)
    first = mixed.run_mixed(nexts, [len(p) for p in prompts], long_prompt[:20], 0)
    assert first.shape == (3, lm.config.vocab_size)
    second = mixed.run_mixed([int(np.argmax(r)) for r in first[:2]], [len(p) + 1 for p in prompts],
                             long_prompt[20:], 20)
    # references: each sequence alone through the single-sequence program
    for b, ids in enumerate(prompts):
        ref_caches = single.new_caches()
        ref, _ = single.run(ids + [nexts[b]], 0, ref_caches)
        np.testing.assert_allclose(first[b], ref[-1], atol=2e-4, rtol=1e-4)
        assert int(np.argmax(first[b])) == int(np.argmax(ref[-1]))
    ref_caches = single.new_caches()
    head, _ = single.run(long_prompt[:20], 0, ref_caches)
    np.testing.assert_allclose(first[2], head[-1], atol=2e-4, rtol=1e-4)  # the chunk's last row
    tail, _ = single.run(long_prompt[20:], 20, ref_caches)
    np.testing.assert_allclose(second[2], tail[-1], atol=2e-4, rtol=1e-4)
    # the chunk's keys and values landed in slot 2, rows 0 .. 44, as the single-sequence program wrote them
    for name, want in ref_caches.items():  # positions first, whatever the layout
        got, want = (np.moveaxis(a, single.cache_row_axis, 0) for a in (mixed.slot_caches(2)[name], want))
        np.testing.assert_allclose(got[:45], want[:45], atol=1e-5, rtol=1e-5)
        assert not got[45:].any()


def test_decode_rows_do_not_depend_on_the_chunk_beside_them(tiny) -> None:
    """Whatever chunk rides along (its length, its tokens), the decode rows' logits stay within rounding of a
    plain batched step's, and a second decode row is not disturbed by the first."""
    _, single, mixed = tiny
    rng = np.random.default_rng(3)
    _clear(mixed)
    for slot in range(2):
        single.run(_ids(rng, 9 + slot), 0, mixed.slot_caches(slot))
    saved = {n: a.copy() for n, a in mixed.batched.caches.items()}
    plain = mixed.run([7, 9], [9, 10])
    for n in (1, 6, 32):
        for name, a in mixed.batched.caches.items():
            a[:] = saved[name]
        got = mixed.run_mixed([7, 9], [9, 10], _ids(rng, n), 0)
        np.testing.assert_allclose(got[:2], plain, atol=2e-4, rtol=1e-4)
        assert list(np.argmax(got[:2], axis=1)) == list(np.argmax(plain, axis=1))


def test_mixed_inputs_are_checked(tiny) -> None:
    lm, _, mixed = tiny
    vocab = lm.config.vocab_size
    assert mixed.chunk_error([1, 2], 0) is None
    assert "1 to 32" in mixed.chunk_error([], 0)
    assert "1 to 32" in mixed.chunk_error([1] * 33, 0)
    assert "context bound" in mixed.chunk_error([1, 2, 3], CTX - 2)
    assert f"[0, {vocab})" in mixed.chunk_error([1, vocab], 0)
    with pytest.raises(ValueError, match="token ids"):
        mixed.run_mixed([1], [3], [-1], 0)
    with pytest.raises(ValueError, match="1 to 3 sequences"):  # slot B must stay free for the chunk
        mixed.run_mixed([1] * MAX_BATCH, [3] * MAX_BATCH, [1], 0)
    with pytest.raises(ValueError, match="max_batch >= 2"):
        build_mixed(lm, CTX, 1, MAX_CHUNK)


def test_chunk_policy_steers_a_riding_chunk_to_half_a_step() -> None:
    policy = ChunkPolicy(max_chunk=128)
    assert policy.size(alone=False, mixed=True) == MIN_AUTO_CHUNK
    policy.decoded(0.020)
    for _ in range(30):  # a mixed step costs the 20 ms step + 1 ms + 0.5 ms a token: 18 tokens add 10 ms
        n = policy.size(alone=False, mixed=True)
        policy.mixed(n, 0.020 + 0.001 + 0.0005 * n)
    assert policy.size(alone=False, mixed=True) == 18
    assert policy.size(alone=False, mixed=True, queued=True) == 72   # four times the share, four times the size
    assert policy.size(alone=False, mixed=True, limit=10) == 10
    for _ in range(30):  # rows got dear (12 ms a token): the floor, as many as a call of its own would take
        n = policy.size(alone=False, mixed=True)
        policy.mixed(n, 0.020 + 0.001 + 0.012 * n)
    assert policy.size(alone=False, mixed=True) == MIN_MIXED_CHUNK == MIN_AUTO_CHUNK
    assert policy.size(alone=False, mixed=True, limit=2) == 2  # a step's room (chunk_limit) comes first
    for _ in range(30):  # and cheap again: it grows back
        n = policy.size(alone=False, mixed=True)
        policy.mixed(n, 0.020 + 0.0001 * n)
    assert policy.size(alone=False, mixed=True) == 100
    assert policy.size(alone=False) == MIN_AUTO_CHUNK                 # no separate prefill call measured yet


class Sink:
    def __init__(self, hold: bool = False):
        self.done, self.kind, self.error = threading.Event(), None, None
        self.pieces = 0
        self.hold, self.reached, self.go = hold, threading.Event(), threading.Event()

    def __call__(self, kind, payload):
        if kind == TEXT:
            self.pieces += 1
            if self.hold and self.pieces == 3:
                self.reached.set()
                self.go.wait(30)
        elif kind != "logprobs":
            self.kind = kind
            if kind == ERROR:
                self.error = payload
            self.done.set()


class CountingStep:
    """The single-sequence program, counting its calls (prefill outside the mixed steps)."""

    def __init__(self, step):
        self.step, self.calls = step, 0
        self.ctx, self.max_chunk, self.kv_update = step.ctx, step.max_chunk, step.kv_update

    def run(self, tokens, pos, caches):
        self.calls += 1
        return self.step.run(tokens, pos, caches)


def _submit(eng, lm, ids, max_tokens, hold=False):
    sink = Sink(hold)
    seq = Sequence(ids, RequestOptions(max_tokens=max_tokens, ignore_eos=True), lm.tokenizer, set(), sink)
    eng.submit(seq)
    return seq, sink


@pytest.mark.parametrize("chunk", [5, None])
def test_engine_carries_prompt_chunks_on_decode_steps(tiny, chunk) -> None:
    lm, single, mixed = tiny
    _clear(mixed)
    rng = np.random.default_rng(4)
    short, long_prompt = _ids(rng, 6), _ids(rng, 90)
    step = CountingStep(single)
    eng = Engine(step, mixed, prefill_chunk=chunk)
    eng.start()
    try:
        want = []
        for ids, n in ((short, 80), (long_prompt, 8)):
            seq, sink = _submit(eng, lm, ids, n)
            assert sink.done.wait(60) and sink.kind == DONE
            want.append(seq.token_ids)
        assert eng.stats()["mixed_steps"] == 0  # alone, prompts run in the program's own chunks
        running, stream = _submit(eng, lm, short, 80, hold=True)
        assert stream.reached.wait(30)
        calls = step.calls
        seq, sink = _submit(eng, lm, long_prompt, 8)
        stream.go.set()
        assert sink.done.wait(60) and stream.done.wait(60)
        assert sink.kind == DONE and stream.kind == DONE
        assert [running.token_ids, seq.token_ids] == want
        stats = eng.stats()
        # every chunk of the long prompt rode on a decode step: no call of its own while the stream ran
        assert stats["mixed_steps"] >= len(long_prompt) // MAX_CHUNK + 1
        if chunk is not None:
            assert step.calls == calls and stats["mixed_steps"] == -(-len(long_prompt) // chunk)
    finally:
        eng.stop(timeout=5)


def test_a_bad_token_in_a_riding_chunk_fails_only_its_prompt(tiny) -> None:
    lm, single, mixed = tiny
    _clear(mixed)
    rng = np.random.default_rng(5)
    eng = Engine(CountingStep(single), mixed, prefill_chunk=4)
    eng.start()
    try:
        running, stream = _submit(eng, lm, _ids(rng, 5), 40, hold=True)
        assert stream.reached.wait(30)
        bad, sink = _submit(eng, lm, _ids(rng, 6) + [lm.config.vocab_size + 5] + _ids(rng, 3), 4)
        stream.go.set()
        assert sink.done.wait(60) and sink.kind == ERROR and "token ids" in str(sink.error)
        assert stream.done.wait(60) and stream.kind == DONE and len(running.token_ids) == 40
    finally:
        eng.stop(timeout=5)


def test_auto_activations_keep_a_step_within_the_int16_rows(tiny):
    """Where "auto" is int16 for calls of up to 8 rows and float beyond (AVX2; AVX-512 with AMX or without VNNI), a
    decode row keeps its rounding only while the step and its chunk stay within that limit; where it has one
    rounding at every row count (float, or int16 on AVX-512 VNNI), and in the fixed modes, there is no bound."""
    lm, _, mixed = tiny
    auto = MixedStep(mixed.batched, lm, MAX_CHUNK, backend="c", activations="auto")
    limit = resolve_activations("auto")[1]
    assert auto.row_limit == limit
    want = [MAX_CHUNK, MAX_CHUNK] if limit is None else [max(0, min(MAX_CHUNK, limit - b)) for b in (1, 3)]
    assert [auto.chunk_limit(b) for b in (1, 3)] == want and auto.chunk_limit(MAX_BATCH) == 0
    assert [mixed.chunk_limit(b) for b in (1, 3)] == [MAX_CHUNK, MAX_CHUNK] and mixed.chunk_limit(MAX_BATCH) == 0


class NoRoom(MixedStep):
    """A mixed step that can carry nothing (as when the decode rows alone fill the int16 rows)."""

    def __init__(self, base: MixedStep):
        self.__dict__.update(base.__dict__)

    def chunk_limit(self, batch: int) -> int:
        return 0


def test_a_step_with_no_room_leaves_chunks_to_calls_of_their_own(tiny):
    lm, single, mixed = tiny
    _clear(mixed)
    rng = np.random.default_rng(6)
    step = CountingStep(single)
    eng = Engine(step, NoRoom(mixed), prefill_chunk=5)
    eng.start()
    try:
        running, stream = _submit(eng, lm, _ids(rng, 5), 60, hold=True)
        assert stream.reached.wait(30)
        calls = step.calls
        seq, sink = _submit(eng, lm, _ids(rng, 23), 4)
        stream.go.set()
        assert sink.done.wait(60) and stream.done.wait(60) and sink.kind == DONE
        assert eng.stats()["mixed_steps"] == 0 and step.calls - calls >= 23 // 5
    finally:
        eng.stop(timeout=5)


def test_the_chunks_attention_mask_divides_no_score_by_a_dimension(tiny) -> None:
    """The chunk's query rows are (token, head) pairs flattened over a symbolic key extent: its mask's row
    position is ``row // heads_per_kv + start``, not ``(keys*row + key) // (keys*heads_per_kv)`` evaluated per
    score (an integer division by a run-time value for every score: a third of the chunk's attention time
    at 1,500 keys on SmolLM2)."""
    _, _, mixed = tiny
    attention = [k for k in mixed.program.executor.plan.kernels if k.kind == "attention"]
    assert len(attention) == 2 * 2  # decode rows and chunk rows, per layer of the tiny model
    for k in attention:
        score = repr(k.template.score)
        assert "//(min(" not in score and "//(" + "chunk" not in score, score
    chunk_rows = [repr(k.template.score) for k in attention if "start" in repr(k.template.score)]
    assert len(chunk_rows) == 2 and all("//2)+start)" in score for score in chunk_rows), chunk_rows
