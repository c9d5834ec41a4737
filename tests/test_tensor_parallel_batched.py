"""The tensor-parallel batched step and the serving mirror (lightspeed/parallel/batched.py, serving.py) on a tiny
random Llama: one rank of segments against the one-process batched step, two ranks' logits against it, and rank
0's engine mirrored on rank 1 giving the one-process engine's tokens."""
from __future__ import annotations

import json
import sys
import threading

import numpy as np
import pytest
from tiny_gguf import write_tiny_llama

from lightspeed.engine.batched import BatchedStep
from lightspeed.engine.scheduler import Engine
from lightspeed.engine.sequence import DONE, RequestOptions, Sequence
from lightspeed.models import load_model
from lightspeed.parallel import SingleProcess, TensorParallelError, TensorParallelStep
from lightspeed.parallel.batched import TensorParallelBatchedStep
from lightspeed.parallel.launch import run_ranks

CTX, CHUNK, BATCH = 96, 16, 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp") / "tiny.gguf"
    write_tiny_llama(path, seed=5)
    return str(path)


def _prefilled(lm, single_run, slot_caches, lengths, seed=0):
    """Prefill slot s with a random prompt of lengths[s] tokens through ``single_run``."""
    rng = np.random.default_rng(seed)
    for slot, n in enumerate(lengths):
        ids = [int(t) for t in rng.integers(3, 128, n)]
        for start in range(0, n, CHUNK):
            single_run(ids[start:start + CHUNK], start, slot_caches(slot))


@pytest.mark.parametrize("kv_dtype", ["float32", None])
def test_one_rank_of_segments_equals_the_batched_program(tiny, kv_dtype) -> None:
    """With a float32 cache within float32's rounding; with the default float16 one a key the shards sum in
    another order may round to the neighbouring float16 (measured on an AVX2 CPU: 2.1e-4 on logits of ~1)."""
    lm = load_model(tiny)
    tp = TensorParallelStep(lm, SingleProcess(), ctx=CTX, max_chunk=CHUNK, kv_dtype=kv_dtype)
    segments = TensorParallelBatchedStep(tp, BATCH)
    # float activations in all three: the C backend's default (the models' takes int16 for decode)
    whole = BatchedStep(lm, CTX, BATCH, kv_dtype=kv_dtype)
    single = lm.compile(CTX, max_chunk=CHUNK, activations="float", kv_dtype=kv_dtype)
    assert tp.kv_dtype == single.kv_dtype == (kv_dtype or "float16")
    lengths = [5, 40, 33]  # key counts on both sides of a key block
    _prefilled(lm, tp.run, segments.slot_caches, lengths)
    _prefilled(lm, single.run, whole.slot_caches, lengths)
    tokens = [7, 9, 11]
    a, b = segments.run(tokens, lengths), whole.run(tokens, lengths)
    tol = 1e-4 if kv_dtype == "float32" else 2e-2
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    assert (a.argmax(-1) == b.argmax(-1)).all()
    saved = {k: v.copy() for k, v in segments.caches.items()}
    for k, v in saved.items():  # the same step again, on fewer rows: each row's bits do not change
        segments.caches[k][...] = v
    np.testing.assert_array_equal(segments.run(tokens[:1], lengths[:1]), a[:1])
    segments.move_slot(2, 0, lengths[2])
    np.testing.assert_array_equal(segments.run(tokens[2:], lengths[2:]), a[2:])
    assert segments.slot_of(segments.slot_caches(1)) == 1
    with pytest.raises(ValueError, match="not a slot"):
        segments.slot_of({})
    with pytest.raises(ValueError, match="context bound"):
        segments.run([1], [CTX])
    with pytest.raises(TensorParallelError, match="at most 16 sequences"):
        TensorParallelBatchedStep(tp, CHUNK + 1)


RANK_SCRIPT = """
import json, sys, time
import lightspeed.api as lsa
from lightspeed.backend.c import set_num_threads
from lightspeed.engine.sequence import DONE, RequestOptions, Sequence
from lightspeed.parallel.serving import build_batched, follow, tensor_parallel_engine
set_num_threads(1)
path, out, requests = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
m = lsa.load(path, ctx={ctx}, max_chunk={chunk}, progress=False, tensor_parallel=2)
rank = m.step.comm.rank
if rank != 0:
    stepper, longest = build_batched(m.step, {batch})
    sys.exit(follow(m.step, stepper, longest))
engine = tensor_parallel_engine(m, {batch}, prefill_chunk=4)
engine.start()
ends = []
seqs = []
for ids, n in requests:
    tok = m.tokenizer
    seqs.append(Sequence(ids, RequestOptions(max_tokens=n, ignore_eos=True), tok, tok.stop_ids,
                         lambda kind, payload: ends.append(kind) if kind == DONE else None))
for s in seqs:
    engine.submit(s)
deadline = time.monotonic() + 120
while len(ends) < len(seqs) and time.monotonic() < deadline:
    time.sleep(0.02)
engine.stop(timeout=5)
with open(out, "w") as f:
    json.dump([s.token_ids for s in seqs], f)
"""


def test_rank_0_engine_mirrored_on_rank_1_gives_one_process_tokens(tiny, tmp_path) -> None:
    rng = np.random.default_rng(2)
    requests = [([int(t) for t in rng.integers(3, 128, int(n))], int(k))
                for n, k in zip(rng.integers(1, 30, 5), rng.integers(2, 20, 5))]
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(ctx=CTX, chunk=CHUNK, batch=BATCH))
    out = tmp_path / "tokens.json"
    assert run_ranks(2, [sys.executable, str(script), tiny, str(out), json.dumps(requests)]) == 0
    got = json.loads(out.read_text())
    lm = load_model(tiny)
    engine = Engine(lm.compile(CTX, max_chunk=CHUNK), BatchedStep(lm, CTX, BATCH), prefill_chunk=4)
    engine.start()
    done = threading.Semaphore(0)
    seqs = [Sequence(ids, RequestOptions(max_tokens=n, ignore_eos=True), lm.tokenizer, lm.tokenizer.stop_ids,
                     lambda kind, payload: done.release() if kind == DONE else None) for ids, n in requests]
    for s in seqs:
        engine.submit(s)
    for _ in seqs:
        assert done.acquire(timeout=60)
    engine.stop(timeout=5)
    assert got == [s.token_ids for s in seqs]
    assert [len(t) for t in got] == [n for _, n in requests]  # 5 requests through 3 slots: joins, leaves, moves
