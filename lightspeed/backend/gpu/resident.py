"""A language model's step program on a GPU backend with its KV cache kept on the device.

``CompiledLM.run`` passes the cache arrays in and takes them back on every call (the portable contract).
Compiled with ``kv_update="scatter"`` the caches are donated inputs that the program updates in place, so
on a GPU backend their device buffers already hold the updated cache after a call: ``ResidentLM`` uploads
zeroed caches once, then names them ``resident`` (not uploaded) and fetches only the logits, so a decode
step moves the token ids in and the logits out, nothing else. One-token steps replay a recording of their
launches (graph.py: a CUDA graph on CUDA) instead of launching every kernel from Python; where recording
fails, ``graph_error`` says why and steps launch directly.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .executor import GpuExecutor
from .graph import GraphStep


class ResidentLM:
    """``run(tokens, pos) -> logits`` of a step program (``lm.compile(..., kv_update="scatter",
    backend="cuda" | "opencl")``) whose caches live on the device; ``reset()`` starts a new sequence."""

    def __init__(self, step, graphs: bool = True):
        executor = step.program.executor
        if not isinstance(executor, GpuExecutor):
            raise ValueError(f"ResidentLM needs a GPU backend's program, got {type(executor).__name__}")
        if step.kv_update != "scatter":
            raise ValueError("ResidentLM needs a program compiled with kv_update='scatter' (its caches are "
                             "updated in place on the device)")
        self.step, self.executor = step, executor
        self.names = [s.name for s in step.cache_specs]
        self._on_device = False
        self.graphs = graphs
        self.graph: GraphStep | None = None  # the one-token step's recording, made at the first such step
        self.graph_error: str | None = None

    def reset(self) -> None:
        """Forget the cache (the next run uploads zeroed caches; stale rows are never read anyway)."""
        self._on_device = False

    def run(self, tokens: Sequence[int], pos: int) -> np.ndarray:
        """Logits of ``tokens`` at positions ``pos ..`` (shape as ``CompiledLM.run`` returns them)."""
        step = self.step
        ids = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        n = ids.shape[0]
        if not 1 <= n <= step.max_chunk:
            raise ValueError(f"run: {n} tokens; a call takes 1 to {step.max_chunk}")
        if pos < 0 or pos + n > step.ctx:
            raise ValueError(f"run: positions {pos}..{pos + n - 1} exceed the context bound of {step.ctx} tokens")
        if ids.min() < 0 or ids.max() >= step.vocab_size:
            raise ValueError(f"run: token ids must lie in [0, {step.vocab_size}), got {ids.min()}..{ids.max()}")
        inputs = {"tokens": ids}
        if not self._on_device:
            inputs.update(step.new_caches())
        env = {"pos": int(pos), "seq": n}
        resident = self.names if self._on_device else ()
        if n == 1 and self.graphs and self.graph_error is None and self.graph is None:
            try:
                self.graph = GraphStep(self.executor, {"seq": 1}, getattr(self.executor, "small_form", "rows"))
            except Exception as e:  # a device that cannot record: launch directly, and say why
                self.graph_error = f"{type(e).__name__}: {e}"
        if n == 1 and self.graph is not None:
            outs = self.graph.run(inputs, env, resident=resident, fetch=(0,))
        else:
            outs = self.executor.run(inputs, env, resident=resident, fetch=(0,))
        self._on_device = True
        return outs[0]
