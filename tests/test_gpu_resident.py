"""Device memory of the GPU backends (backend/gpu/executor.py), on OpenCL: weights are uploaded once per
compiled program, and a donated KV cache stays on the device between calls (backend/gpu/resident.py), so a
decode step uploads only its token ids. Counted with the executor's upload counters. Also: the GPU backends
refuse C-backend options by name. Skips, with the reason printed, where no OpenCL device exists."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.backend.opencl import unavailable_reason

REASON = unavailable_reason()
if REASON is not None:
    print(f"tests/test_gpu_resident.py: skipped: {REASON}")
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no OpenCL device: {REASON}")


def test_weights_are_uploaded_once() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    g = ls.Graph()
    n = ls.dim("n", 1, 8)
    x = g.input("x", (n, 32))
    y = x @ g.constant(w).T
    prog = g.compile([y], backend="opencl")
    ex = prog.executor
    assert ex.uploads == 1 and ex.uploaded_bytes == w.nbytes  # the weight, at set-up
    for k in (1, 5, 8):
        xa = rng.standard_normal((k, 32)).astype(np.float32)
        before = ex.uploaded_bytes
        (got,) = prog(x=xa)
        np.testing.assert_allclose(got, xa @ w.T, rtol=1e-5, atol=1e-5)
        assert ex.uploaded_bytes - before == xa.nbytes  # only the input went up


def test_resident_kv_cache_decode_uploads_only_token_ids(tmp_path) -> None:
    from tiny_gguf import write_tiny_llama
    from lightspeed.backend.gpu.resident import ResidentLM
    from lightspeed.models import load_model
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, seed=5)
    lm = load_model(path)
    portable = lm.compile(32, max_chunk=8, backend="opencl", kv_update="scatter")
    resident = ResidentLM(lm.compile(32, max_chunk=8, backend="opencl", kv_update="scatter"))
    ex = resident.executor
    prompt = [5, 17, 42, 99, 3]
    caches = portable.new_caches()
    want, caches = portable.run(prompt, 0, caches)
    got = resident.run(prompt, 0)  # uploads the zeroed caches once
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    token, pos = int(np.argmax(want[-1])), len(prompt)
    for _ in range(6):
        before, count = ex.uploaded_bytes, ex.uploads
        got = resident.run([token], pos)
        assert resident.graph is not None, resident.graph_error  # one-token steps replay a recording
        # one int32 token id, and the recording's dimension values (pos, seq: two int64)
        assert (ex.uploads - count, ex.uploaded_bytes - before) == (2, 4 + 16)
        want, caches = portable.run([token], pos, caches)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"logits at position {pos}")
        token, pos = int(np.argmax(want[-1])), pos + 1
    resident.reset()  # a new sequence: the caches are uploaded again
    np.testing.assert_allclose(resident.run(prompt, 0), portable.run(prompt, 0, portable.new_caches())[0],
                               rtol=1e-5, atol=1e-5)


def test_resident_inputs_must_be_updated_in_place() -> None:
    g = ls.Graph()
    x = g.input("x", (4,))
    prog = g.compile([x.exp()], backend="opencl")
    with pytest.raises(ValueError, match="resident input 'x' is not an input this program updates in place"):
        prog.executor.run({}, {}, resident=["x"])


def test_c_backend_options_are_refused_by_name() -> None:
    g = ls.Graph()
    x = g.input("x", (4,))
    with pytest.raises(ValueError, match="backend 'opencl' does not take the option.s. activations"):
        g.compile([x.exp()], backend="opencl", activations="int8")
    # float32 activations are what the GPU kernels take: asking for them is accepted
    prog = g.compile([x.exp()], backend="opencl", activations="float")
    np.testing.assert_allclose(prog(x=np.zeros(4, np.float32))[0], np.ones(4), rtol=1e-6)


def test_bench_backend_opencl_reports_bandwidth_and_percent(tmp_path, capsys) -> None:
    import json

    from tiny_gguf import write_tiny_llama
    from lightspeed.cli import main
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, seed=1)
    assert main(["bench", "--backend", "opencl", "--model", str(path), "--prompt-tokens", "8", "--decode-tokens",
                 "4", "--runs", "1", "--probe-reps", "2", "--json", "--quiet"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["backend"] == "opencl" and r["bandwidth_gb_per_s"] > 0 and r["bandwidth"]["passes"] == 2
    assert r["decode_tokens_per_s"] > 0 and r["prefill_tokens_per_s"] > 0
    assert r["percent_of_limit"] == pytest.approx(100 * r["decode_tokens_per_s"] / r["limit_tokens_per_s"])


def test_recorded_decode_equals_direct_launches(tmp_path) -> None:
    """One-token steps replayed from a recording (kernels reading their dimensions from a device buffer,
    grids at the upper bound over the position) give the bits of the kernels launched one by one."""
    from tiny_gguf import write_tiny_llama
    from lightspeed.backend.gpu.resident import ResidentLM
    from lightspeed.models import load_model
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, seed=6)
    lm = load_model(path)
    runs = [ResidentLM(lm.compile(32, max_chunk=8, backend="opencl", kv_update="scatter"), graphs=g)
            for g in (True, False)]
    prompt = [3, 1, 4, 1, 5, 9]
    for r in runs:
        r.run(prompt, 0)
    for k, token in enumerate([2, 6, 5, 3, 5, 8, 9, 7]):  # positions 6..13: attention over more keys each step
        recorded, direct = (r.run([token], len(prompt) + k) for r in runs)
        np.testing.assert_array_equal(recorded, direct, err_msg=f"position {len(prompt) + k}")
    assert runs[0].graph is not None and runs[1].graph is None
