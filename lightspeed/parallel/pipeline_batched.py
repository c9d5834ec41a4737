"""One stage's batched decode step, with micro-batches flowing through the stages.

The serving engine's batched step advances ``B`` sequences by one token each (``lightspeed.engine.batched``).
Under pipeline parallelism each stage compiles that step over its own layers (inputs ``tokens`` on stage 0,
hidden states ``x [b, hidden]`` on the others; logits on the last) and the ``B`` rows are split into up to
``micro_batches`` micro-batches of consecutive rows. Each stage runs micro-batch ``m`` as soon as it has it
and sends the result on without waiting (``isend``), so while stage 1 works on micro-batch 1, stage 0 already
works on micro-batch 2; the last stage sends each micro-batch's logits to rank 0, whose engine samples.

Row ``b`` keeps its cache rows in slot ``b`` (rows ``b*ctx ..``), as in the one-process step. A micro-batch of
rows ``lo .. hi-1`` runs the program on the caches' view from slot ``lo``: the program's slot 0 is the view's
first slot. The program takes up to ``ceil(max_batch / micro_batches)`` rows, so the caches get that many
slots minus one beyond ``max_batch`` (zero pages, never written) for the view of the last micro-batch. As in
the one-process step, ``keys`` is rounded up to whole key blocks, so a row's result does not depend on which
rows share its micro-batch: the outputs equal one process's.
"""
from __future__ import annotations

import time

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..engine.batched import KEY_BLOCK, BatchedKV, SlottedCaches, check_step_inputs, llama_batched_attention
from ..frontend import rms_norm
from ..graph import Graph
from ..tensor import Tensor
from .pipeline import PipelineStep

__all__ = ["PipelineBatchedStep", "micro_batch_ranges"]

LOGITS_TAG = 1 << 16  # tags of the logits sent to rank 0 (hidden states use the micro-batch's index)


def micro_batch_ranges(rows: int, parts: int) -> list[tuple[int, int]]:
    """``rows`` rows split into at most ``parts`` consecutive ranges, as even as possible (earlier larger)."""
    parts = max(1, min(parts, rows))
    base, extra = divmod(rows, parts)
    out, lo = [], 0
    for m in range(parts):
        hi = lo + base + (m < extra)
        out.append((lo, hi))
        lo = hi
    return out


class PipelineBatchedStep(SlottedCaches):
    """The batched step's interface (``run``, ``slot_caches``, ``move_slot``, ``ctx``, ``max_batch``) over this
    stage's layers; ``step`` is the stage's single-sequence ``PipelineStep`` (prefill), whose stage model,
    channel, context and KV type it shares."""

    def __init__(self, step: PipelineStep, max_batch: int, micro_batches: int | None = None, backend: str = "c",
                 **options):
        if type(max_batch) is not int or max_batch < 1:
            raise ValueError(f"max_batch must be a positive number of sequences, got {max_batch!r}")
        micro = step.comm.world if micro_batches is None else micro_batches
        if type(micro) is not int or micro < 1:
            raise ValueError(f"micro_batches must be a positive number, got {micro!r}")
        t0 = time.perf_counter()
        self.step, self.plan, self.local, self.channel = step, step.plan, step.local, step.channel
        self.ctx, self.max_batch, self.vocab_size = step.ctx, max_batch, step.vocab_size
        self.micro_batches = min(micro, max_batch)
        self.rows_per_call = -(-max_batch // self.micro_batches)  # the program's largest micro-batch
        spec = step.cache_specs[0]
        self.row_shape, self.kv_dtype = tuple(spec.shape[1:]), spec.dtype
        self.names = [s.name for s in step.cache_specs]
        g, outputs = self._graph()
        self.build_seconds = time.perf_counter() - t0
        self.program = g.compile(outputs, backend=backend, donate=self.names, **options)
        self.compile_seconds = time.perf_counter() - t0 - self.build_seconds
        slots = max_batch + self.rows_per_call - 1
        # zero pages: memory is only touched as slots fill
        self.caches = {n: np.zeros((slots * self.ctx,) + self.row_shape, self.kv_dtype.np) for n in self.names}
        self._reset_views()

    # the stage's graph ------------------------------------------------------------------------------
    def _graph(self) -> tuple[Graph, list[Tensor]]:
        g = Graph()
        c, w, plan = self.local.config, self.local.weights, self.plan
        batch, keys = sym.dim("batch", 1, self.rows_per_call), sym.dim("keys", 1, self.ctx)
        positions = g.input("positions", (batch,), dt.int32)
        if plan.first:
            x = w.rows(g, "token_embd.weight", g.input("tokens", (batch,), dt.int32))
        else:
            x = g.input("x", (batch, c.hidden_size), dt.float32)
        kv = BatchedKV(g, self.names, self.row_shape, self.ctx, self.rows_per_call, batch, keys, positions,
                       self.kv_dtype)
        for i in plan.layers:
            p = f"blk.{i}."
            normed = rms_norm(x, w.tensor(g, p + "attn_norm.weight"), c.rms_norm_eps)
            x = x + llama_batched_attention(self.local, g, normed, i, kv)  # the one-process step's attention
            x = x + self.local.mlp(g, rms_norm(x, w.tensor(g, p + "ffn_norm.weight"), c.rms_norm_eps), i)
        if plan.last:
            x = self.local.lm_head(g, rms_norm(x, w.tensor(g, "output_norm.weight"), c.rms_norm_eps))
        return g, [x] + [kv.outputs[n] for n in self.names]

    # running ----------------------------------------------------------------------------------------
    def check(self, tokens, positions) -> tuple[np.ndarray, np.ndarray]:
        """The step's inputs as int32 arrays; ValueError (before any transfer) when they do not fit."""
        return check_step_inputs(tokens, positions, self.max_batch, self.ctx, self.vocab_size)

    def _run_part(self, lo: int, hi: int, pos: np.ndarray, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The program on rows ``lo .. hi-1`` (their slots' caches); its first output."""
        first, last = lo * self.ctx, (lo + self.rows_per_call) * self.ctx
        views = {n: a[first:last] for n, a in self.caches.items()}
        keys = min(-(-(int(pos.max()) + 1) // KEY_BLOCK) * KEY_BLOCK, self.ctx)  # whole key blocks
        outs = self.program(dims={"keys": keys}, positions=pos, **inputs, **views)
        for name, updated in zip(self.names, outs[1:]):
            if not np.may_share_memory(updated, views[name]):  # a backend that did not write in place
                views[name][...] = updated
        return np.array(outs[0], np.float32)  # a copy: it is sent while the next micro-batch runs

    def run(self, tokens, positions) -> np.ndarray | None:
        """One token per sequence (row ``b`` in slot ``b``; every rank makes the same call): on rank 0 the
        logits ``[B, vocab]`` (the last stage returns its own, a middle stage None); this stage's caches are
        updated in place."""
        ids, pos = self.check(tokens, positions)
        plan, ch = self.plan, self.channel
        parts = micro_batch_ranges(ids.shape[0], self.micro_batches)
        hidden = self.local.config.hidden_size
        pending, mine = [], []
        for m, (lo, hi) in enumerate(parts):
            if plan.first:
                inputs = {"tokens": ids[lo:hi]}
            else:
                inputs = {"x": ch.recv((hi - lo, hidden), np.float32, plan.stage - 1, tag=m)}
            out = self._run_part(lo, hi, pos[lo:hi], inputs)
            if not plan.last:
                pending.append(ch.isend(out, plan.stage + 1, tag=m))  # on at once: the next micro-batch runs
            else:
                mine.append(out)
                if ch is not None:
                    pending.append(ch.isend(out, 0, tag=LOGITS_TAG + m))
        if plan.first and not plan.last:
            mine = [ch.recv((hi - lo, self.vocab_size), np.float32, self.step.comm.world - 1, tag=LOGITS_TAG + m)
                    for m, (lo, hi) in enumerate(parts)]
        if ch is not None:
            ch.wait(pending)
        if not mine:
            return None
        return mine[0] if len(mine) == 1 else np.concatenate(mine)
