"""The CUDA launch path without a GPU: the CUDA backend's executor over a stand-in for the driver API
(backend/cuda/driver.Device), which records what a real driver would be asked. Checks that every kernel
of a program is launched in plan order with the grid the executor computes, that each argument address
points at the right value (buffer pointer + byte offset, work items, dimensions), that weights go up
once, and that outputs come back from the buffers the kernels wrote. Kernels do not run here, so the
values are the stand-in's own; this catches mistakes in the Python side of the launch before GPU time
is spent on it."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.backend.cuda import available

REASON = available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"NVRTC unavailable: {REASON}")


class FakeDevice:
    """Device memory as host bytearrays at made-up addresses; launches recorded."""

    def __init__(self, index: int = 0):
        self.memory: dict[int, bytearray] = {}
        self.next = 1 << 20
        self.launches: list[tuple] = []
        self.uploads = 0

    def arch(self) -> str:
        return "sm_90"

    def current(self) -> None:
        pass

    def load(self, cubin: bytes):
        assert cubin[:4] == b"\x7fELF"
        return "module"

    def function(self, module, name: str):
        return name

    def alloc(self, nbytes: int) -> int:
        addr = self.next
        self.memory[addr] = bytearray(max(int(nbytes), 1))
        self.next += (max(int(nbytes), 1) + 255) // 256 * 256 + 256
        return addr

    def upload(self, dst: int, a: np.ndarray) -> None:
        self.memory[dst][:a.nbytes] = a.tobytes()
        self.uploads += 1

    def download(self, a: np.ndarray, src: int) -> None:
        a.view(np.uint8).reshape(-1)[:] = np.frombuffer(bytes(self.memory[src][:a.nbytes]), np.uint8)

    def launch(self, fn, blocks: int, threads: int, args: np.ndarray) -> None:
        values = [ctypes.c_uint64.from_address(int(a)).value for a in args]
        (self.captured if self.captured is not None else self.launches).append((fn, blocks, threads, values))

    def synchronize(self) -> None:
        pass

    captured: list | None = None
    replays = 0

    def begin_capture(self) -> None:
        self.captured = []

    def end_capture(self):
        recording, self.captured = self.captured, None
        return recording, "graph"

    def graph_launch(self, recording) -> None:
        self.replays += 1
        self.launches.extend(recording[0])


def test_launches_arguments_and_memory(monkeypatch) -> None:
    import lightspeed.backend.cuda as cuda_backend
    monkeypatch.setattr(cuda_backend, "Device", FakeDevice)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((40, 48)).astype(np.float32)
    g = ls.Graph()
    n = ls.dim("n", 1, 64)
    x = g.input("x", (n, 48))
    y = (x @ g.constant(w).T).relu()
    prog = g.compile([y, x.sum(-1)], backend="cuda")
    ex = prog.executor
    dev = ex.device.device
    assert dev.uploads == 1  # the weight, once, at set-up
    xa = rng.standard_normal((3, 48)).astype(np.float32)
    outs = prog(x=xa)
    assert dev.uploads == 2  # then only the input
    dims = [3]  # plan.dims: n
    assert len(dev.launches) == len(ex.gpu.kernels)
    for (fn, blocks, threads, values), launch in zip(dev.launches, ex.gpu.kernels):
        variant = launch.launch_for({"n": 3})
        assert fn == variant.function
        items = int(ls.symbolic.evaluate(variant.items, {"n": 3}))
        assert threads == (variant.block or ex.block) and blocks == -(-items // threads)
        pointers = values[:2 * len(variant.buffers)]
        for b, (ptr, off) in zip(variant.buffers, zip(pointers[::2], pointers[1::2])):
            assert ptr in dev.memory  # a live allocation
            assert off == (b.offset if b.kind == "temp" else 0)
        assert values[2 * len(variant.buffers):] == [items] + dims
    # what comes back is what the output buffers hold (here: zeros, since no kernel ran)
    assert [o.shape for o in outs] == [(3, 40), (3,)]
    assert all(not o.any() for o in outs)


def test_few_rows_take_the_row_form(monkeypatch) -> None:
    import lightspeed.backend.cuda as cuda_backend
    monkeypatch.setattr(cuda_backend, "Device", FakeDevice)
    g = ls.Graph()
    n = ls.dim("n", 1, 64)
    x = g.input("x", (n, 256))
    w = g.input("w", (96, 256))
    prog = g.compile([x @ w.T], backend="cuda")
    (gemm,) = [k for k in prog.executor.gpu.kernels if k.small is not None]
    dev = prog.executor.device.device
    for rows, function in ((1, gemm.small.function), (8, gemm.small.function), (9, gemm.function)):
        dev.launches.clear()
        prog(x=np.ones((rows, 256), np.float32), w=np.ones((96, 256), np.float32))
        assert function in [f for f, *_ in dev.launches], rows


def test_decode_steps_replay_one_recording(monkeypatch, tmp_path) -> None:
    """ResidentLM on CUDA: the one-token step is recorded once (its kernels compiled with the dimensions in
    memory: NVRTC compiles that program too) and replayed per step; every recorded launch's last argument
    is the dimension buffer, which holds the step's position and length when it replays."""
    import lightspeed.backend.cuda as cuda_backend
    from tiny_gguf import write_tiny_llama
    from lightspeed.backend.gpu.resident import ResidentLM
    from lightspeed.models import load_model
    monkeypatch.setattr(cuda_backend, "Device", FakeDevice)
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, seed=2)
    run = ResidentLM(load_model(path).compile(32, max_chunk=8, backend="cuda", kv_update="scatter"))
    dev = run.executor.device.device
    run.run([1, 2, 3], 0)
    assert dev.replays == 0 and run.graph is None  # a prompt: launched directly
    for k in range(3):
        run.run([4 + k], 3 + k)
        assert run.graph is not None, run.graph_error
        assert dev.replays == k + 1
        params = np.frombuffer(bytes(dev.memory[run.graph.params][:16]), np.int64)
        assert params.tolist() == [3 + k, 1]  # plan.dims: pos, seq
    recorded = run.graph.recording[0]
    assert recorded and all(values[-1] == run.graph.params for _, _, _, values in recorded)
