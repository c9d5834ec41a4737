"""The serving engine without HTTP, on a tiny random Llama: the batched step against the
single-sequence program, and the engine's outputs against ``Generation`` and against themselves
under every kind of concurrency (joins, leaves, slot packing, cancellation, queue limits)."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from tiny_gguf import write_tiny_llama

from lightspeed.engine.batched import BatchedStep, supports
from lightspeed.engine.scheduler import Engine, QueueFullError, SequentialStepper
from lightspeed.engine.sequence import DONE, ERROR, TEXT, RequestOptions, Sequence
from lightspeed.generate import Generation, SamplingParams
from lightspeed.models import load_model

CTX, MAX_BATCH, CHUNK = 96, 4, 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "tiny.gguf"
    write_tiny_llama(path, seed=3)
    lm = load_model(path)
    # float activations, as the batched step's (the C backend's default; the models' takes int16 for decode)
    single = lm.compile(CTX, max_chunk=CHUNK, backend="c", activations="float")
    batched = BatchedStep(lm, CTX, MAX_BATCH, backend="c")
    return lm, single, batched


def _prefill(single, caches, ids):
    logits = None
    for start in range(0, len(ids), CHUNK):
        logits, _ = single.run(ids[start:start + CHUNK], start, caches)
    return logits


def test_batched_rows_do_not_depend_on_the_batch(tiny) -> None:
    """Each row's logits are bit-identical alone, in any batch size, and close to the single program's."""
    lm, single, bs = tiny
    assert supports(lm)
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(1, CTX - 1, MAX_BATCH)]
    lengths[1] = 40  # rows whose key counts straddle a key block
    for slot, n in enumerate(lengths):
        _prefill(single, bs.slot_caches(slot), [int(t) for t in rng.integers(3, 128, n)])
    saved = {k: v.copy() for k, v in bs.caches.items()}

    def restore():
        for k, v in saved.items():
            bs.caches[k][...] = v

    tokens = [int(t) for t in rng.integers(3, 128, MAX_BATCH)]
    full = bs.run(tokens, lengths)
    assert full.shape == (MAX_BATCH, lm.config.vocab_size)
    for b in range(1, MAX_BATCH + 1):
        restore()
        part = bs.run(tokens[:b], lengths[:b])
        np.testing.assert_array_equal(part, full[:b])
    for b in range(MAX_BATCH):  # row b alone, moved into slot 0
        restore()
        bs.move_slot(b, 0, lengths[b])
        alone = bs.run([tokens[b]], [lengths[b]])
        np.testing.assert_array_equal(alone[0], full[b])
        caches = {k: v.copy() for k, v in bs.slot_caches(0).items()}
        want, _ = single.run([tokens[b]], lengths[b], caches)
        np.testing.assert_allclose(alone[0], want[0], rtol=1e-4, atol=1e-4)
    restore()


def test_batched_step_checks_its_inputs(tiny) -> None:
    _, _, bs = tiny
    with pytest.raises(ValueError, match="1 to 4"):
        bs.run([1] * (MAX_BATCH + 1), [0] * (MAX_BATCH + 1))
    with pytest.raises(ValueError, match="context bound"):
        bs.run([1], [CTX])
    with pytest.raises(ValueError, match="token ids"):
        bs.run([10 ** 6], [0])


class Collector:
    """A sink that records a sequence's events and signals its end."""

    def __init__(self):
        self.pieces: list[str] = []
        self.end: tuple[str, object] | None = None
        self.done = threading.Event()

    def __call__(self, kind: str, payload: object) -> None:
        if kind == TEXT:
            self.pieces.append(payload)
        else:
            self.end = (kind, payload)
            self.done.set()


def _sequence(lm, ids, **options):
    tok = lm.tokenizer
    sink = Collector()
    seq = Sequence(ids, RequestOptions(**options), tok, tok.stop_ids, sink)
    return seq, sink


def _run_all(engine, lm, requests, timeout=120.0):
    """Submit every (ids, options) at once; the token ids and text of each."""
    made = [_sequence(lm, ids, **opts) for ids, opts in requests]
    for seq, _ in made:
        engine.submit(seq)
    for seq, sink in made:
        assert sink.done.wait(timeout), "a sequence did not finish"
        assert sink.end[0] == DONE, sink.end
    return [(seq.token_ids, "".join(sink.pieces), seq.finish_reason) for seq, sink in made]


def _requests(lm, n, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ids = [int(t) for t in rng.integers(3, 128, int(rng.integers(1, 40)))]
        out.append((ids, {"max_tokens": int(rng.integers(1, 30)), "ignore_eos": bool(i % 2)}))
    return out


@pytest.fixture(scope="module")
def engine(tiny):
    _, single, bs = tiny
    eng = Engine(single, bs, max_queue=64)
    eng.start()
    yield eng
    eng.stop(timeout=5)


def test_engine_concurrency_does_not_change_outputs(tiny, engine) -> None:
    """Eleven requests through 4 slots (joining, leaving, slots packed by moves) give the same
    tokens as each one alone."""
    lm = tiny[0]
    reqs = _requests(lm, 11)
    alone = [_run_all(engine, lm, [r])[0] for r in reqs]
    together = _run_all(engine, lm, reqs)
    assert together == alone
    assert engine.stats()["active"] == 0
    assert any(len(t) > 5 for t, _, _ in alone) and len({len(t) for t, _, _ in alone}) > 3  # mixed lengths


def test_sequence_matches_generation(tiny) -> None:
    """Served one token per step, a sequence produces Generation's tokens, text and finish reason,
    stop strings and sampling included (SequentialStepper runs the very same program)."""
    lm, single, _ = tiny
    eng = Engine(single, SequentialStepper(single, 3))
    eng.start()
    try:
        rng = np.random.default_rng(5)
        cases = []
        for i in range(6):
            ids = [int(t) for t in rng.integers(3, 128, int(rng.integers(2, 30)))]
            params = SamplingParams(temperature=0.9 if i % 2 else 0.0, top_p=0.9, seed=i)
            cases.append((ids, {"max_tokens": 20, "params": params, "stop": ["t", "x1"] if i == 2 else []}))
        got = _run_all(eng, lm, cases)
        for (ids, opts), (tokens, text, finish) in zip(cases, got):
            p = opts["params"]
            gen = Generation(single, lm.tokenizer, ids, SamplingParams(p.temperature, top_p=p.top_p, seed=p.seed),
                             max_tokens=20, stop_strings=opts["stop"])
            gen.run()
            assert (tokens, text) == (gen.token_ids, gen.text)
            assert finish == {"context": "length"}.get(gen.finish_reason, gen.finish_reason)
    finally:
        eng.stop(timeout=5)


def test_logit_bias_and_penalties(tiny, engine) -> None:
    lm = tiny[0]
    forced = _run_all(engine, lm, [([5, 6, 7], {"max_tokens": 6, "logit_bias": {42: 100.0}})])[0]
    assert forced[0] == [42] * 6
    plain, penalised = _run_all(engine, lm, [([5, 6, 7], {"max_tokens": 12, "ignore_eos": True}),
                                             ([5, 6, 7], {"max_tokens": 12, "ignore_eos": True,
                                                          "presence_penalty": 2.0, "frequency_penalty": 2.0})])
    assert len(set(penalised[0])) >= len(set(plain[0]))
    assert penalised[0] != plain[0] or len(set(plain[0])) == 12


class _Gate(Collector):
    """A sink that holds the engine at its second piece of text until the test lets it go (so a cancel made
    meanwhile is seen before the sequence could finish, however the threads are scheduled)."""

    def __init__(self) -> None:
        super().__init__()
        self.reached, self.go = threading.Event(), threading.Event()

    def __call__(self, kind: str, payload: object) -> None:
        super().__call__(kind, payload)
        if kind == TEXT and len(self.pieces) == 2:
            self.reached.set()
            self.go.wait(30)


def test_cancel_frees_the_slot(tiny, engine) -> None:
    lm = tiny[0]
    seqs = [_sequence(lm, [3 + i, 4, 5], max_tokens=CTX - 4, ignore_eos=True) for i in range(MAX_BATCH)]
    gate = _Gate()
    seqs[0] = (Sequence([3, 4, 5], RequestOptions(max_tokens=CTX - 4, ignore_eos=True), lm.tokenizer,
                        lm.tokenizer.stop_ids, gate), gate)
    for seq, _ in seqs:
        engine.submit(seq)
    first, sink = seqs[0]
    assert gate.reached.wait(60)
    first.cancel()
    gate.go.set()
    engine.wake()
    for seq, s in seqs[1:]:
        assert s.done.wait(60) and s.end[0] == DONE and len(seq.token_ids) == CTX - 4
    assert first.finish_reason == "cancelled" and len(first.token_ids) < CTX - 4
    assert not sink.done.is_set()  # a cancelled sequence reports nothing more
    assert engine.stats()["active"] == 0


def test_queue_limit(tiny) -> None:
    lm, single, bs = tiny
    eng = Engine(single, bs, max_queue=2)  # not started: nothing leaves the queue
    seqs = [_sequence(lm, [3, 4], max_tokens=2)[0] for _ in range(MAX_BATCH + 3)]
    for seq in seqs[:MAX_BATCH + 2]:  # the free slots, then two queued
        eng.submit(seq)
    with pytest.raises(QueueFullError):
        eng.submit(seqs[-1])
    eng.start()
    eng.stop(timeout=30)
    assert all(s.finish_reason == "length" for s in seqs[:-1])


def test_stop_ends_leftover_work_with_an_error(tiny) -> None:
    lm, single, bs = tiny
    eng = Engine(single, bs)
    eng.start()
    made = [_sequence(lm, [3, 4, 5 + i], max_tokens=CTX - 4, ignore_eos=True) for i in range(MAX_BATCH + 2)]
    for seq, _ in made:
        eng.submit(seq)
    eng.stop(timeout=0)
    assert all(sink.done.wait(10) for _, sink in made)
    assert any(sink.end[0] == ERROR for _, sink in made)  # the queued ones at least


def test_sequential_stepper_matches_the_program(tiny) -> None:
    """SequentialStepper (a checked call per slot) gives the single-sequence program's logits, slots taking
    turns and after a move; bad tokens and positions are refused by name."""
    lm, single, _ = tiny
    stepper = SequentialStepper(single, 3)
    rng = np.random.default_rng(9)
    lengths = [5, 17, 9]
    for slot, n in enumerate(lengths):
        _prefill(single, stepper.slot_caches(slot), [int(t) for t in rng.integers(3, 128, n)])
    copies = [{k: v.copy() for k, v in stepper.slot_caches(s).items()} for s in range(3)]
    for _ in range(3):
        tokens = [int(t) for t in rng.integers(3, 128, 3)]
        got = stepper.run(tokens, lengths)
        for slot in range(3):
            want, _ = single.run([tokens[slot]], lengths[slot], copies[slot])
            np.testing.assert_array_equal(got[slot], want[-1])
        lengths = [n + 1 for n in lengths]
    stepper.move_slot(2, 0, lengths[2])
    copies[0], copies[2] = copies[2], copies[0]
    got = stepper.run([7], [lengths[2]])
    want, _ = single.run([7], lengths[2], copies[0])
    np.testing.assert_array_equal(got[0], want[-1])
    with pytest.raises(ValueError, match="token ids"):
        stepper.run([10 ** 6], [3])
    with pytest.raises(ValueError, match="pos"):
        stepper.run([5], [CTX])
