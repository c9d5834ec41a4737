"""One rank's batched decode step of a tensor-parallel Llama: ``lightspeed.engine.batched`` as segments.

The serving engine's batched step advances ``B`` sequences by one token each, every row at its own position,
with slot ``b`` of caches ``[max_batch * ctx, kv_heads, head_dim]`` holding row ``b``'s keys and values (see
``lightspeed.engine.batched``). Under tensor parallelism that program splits as ``TensorParallelStep`` splits the
single-sequence one: an attention segment and an FFN segment per layer, each ending in a partial sum that the
ranks add up (the all-reduce) before the next segment, and a head segment for the logits. This rank's caches
hold its own KV heads only. The rows' inputs (``tokens``, ``positions``) must be the same on every rank; the
serving mirror (``lightspeed.parallel.serving``) sends them from rank 0.

As in the one-process batched step, ``keys`` is rounded up to whole key blocks, so a row's result does not
depend on which rows share its step.
"""
from __future__ import annotations

import time

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..engine.batched import KEY_BLOCK, BatchedKV, SlottedCaches, check_step_inputs
from ..frontend import linear, rms_norm, rope, scaled_dot_product_attention
from ..graph import Graph
from ..tensor import Tensor
from .sharding import TensorParallelError
from .step import TensorParallelStep

__all__ = ["TensorParallelBatchedStep"]


class TensorParallelBatchedStep(SlottedCaches):
    """The batched step's interface (``run``, ``slot_caches``, ``move_slot``, ``ctx``, ``max_batch``) over this
    rank's segments; ``step`` is the rank's single-sequence ``TensorParallelStep`` (prefill), whose sharded
    model, communicator, context and KV type it shares."""

    def __init__(self, step: TensorParallelStep, max_batch: int, backend: str = "c", **options):
        if type(max_batch) is not int or max_batch < 1:
            raise ValueError(f"max_batch must be a positive number of sequences, got {max_batch!r}")
        if max_batch > step.max_chunk:  # the all-reduce buffers hold max_chunk rows
            raise TensorParallelError(f"a tensor-parallel batched step takes at most {step.max_chunk} sequences "
                                      f"(the step's max_chunk), got max_batch {max_batch}")
        t0 = time.perf_counter()
        self.step, self.comm, self.local = step, step.comm, step.local
        self.ctx, self.max_batch = step.ctx, max_batch
        self.vocab_size = step.vocab_size
        spec = step.cache_specs[0]
        self.row_shape, self.kv_dtype = tuple(spec.shape[1:]), spec.dtype
        self.names = [s.name for s in step.cache_specs]
        n_layers = self.local.config.n_layers
        graphs = [self._attention_graph(i) if kind == "attention" else self._ffn_graph(i)
                  for i in range(n_layers) for kind in ("attention", "ffn")]
        graphs.append(self._head_graph())
        self.build_seconds = time.perf_counter() - t0
        self.segments = [g.compile(outs, backend=backend, donate=donate, **options) for g, outs, donate in graphs]
        self.compile_seconds = time.perf_counter() - t0 - self.build_seconds
        # zero pages: memory is only touched as slots fill
        self.caches = {n: np.zeros((max_batch * self.ctx,) + self.row_shape, self.kv_dtype.np) for n in self.names}
        self._reset_views()

    # the segment graphs ---------------------------------------------------------------------------
    def _dims(self):
        return sym.dim("batch", 1, self.max_batch), sym.dim("keys", 1, self.ctx)

    def _residual(self, g: Graph, batch) -> Tensor:
        hidden = self.local.config.hidden_size
        return g.input("x", (batch, hidden), dt.float32) + g.input("r", (batch, hidden), dt.float32)

    def _linear(self, g: Graph, x: Tensor, name: str) -> Tensor:
        w = self.local.weights
        bias = f"{name}.bias"  # a row-parallel bias is in rank 0's weights only (ShardedWeights)
        return linear(x, w.tensor(g, f"{name}.weight"), w.tensor(g, bias) if bias in w else None)

    def _attention_graph(self, i: int):
        g = Graph()
        batch, keys = self._dims()
        c, w = self.local.config, self.local.weights
        positions = g.input("positions", (batch,), dt.int32)
        if i == 0:
            x = w.rows(g, "token_embd.weight", g.input("tokens", (batch,), dt.int32))
        else:
            x = self._residual(g, batch)
        names = [f"k{i}", f"v{i}"]
        kv = BatchedKV(g, names, self.row_shape, self.ctx, self.max_batch, batch, keys, positions, self.kv_dtype)
        h = rms_norm(x, w.tensor(g, f"blk.{i}.attn_norm.weight"), c.rms_norm_eps)
        partial = self._attention(g, h, i, kv, batch)
        return g, [x, partial, kv.outputs[names[0]], kv.outputs[names[1]]], names

    def _attention(self, g: Graph, h: Tensor, i: int, kv: BatchedKV, batch) -> Tensor:
        """This rank's heads of layer ``i``'s attention on ``h [B, hidden]``: the output projection's partial
        sum ``[B, hidden]``."""
        c = self.local.config
        p = f"blk.{i}."

        def rotate(x: Tensor) -> Tensor:  # row b at positions[b]
            return rope(x, kv.positions, theta=c.rope_theta, interleaved=c.rope_interleaved, inv_freq=c.rope_inv_freq)

        q = rotate(self._linear(g, h, p + "attn_q").reshape((batch, c.n_heads, c.head_dim)))
        k = rotate(self._linear(g, h, p + "attn_k").reshape((batch, c.n_kv_heads, c.head_dim)))
        v = self._linear(g, h, p + "attn_v").reshape((batch, c.n_kv_heads, c.head_dim))
        keys = kv.append(f"k{i}", k).permute(0, 2, 1, 3)                     # [B, kv_heads, keys, head_dim]
        values = kv.append(f"v{i}", v).permute(0, 2, 1, 3)
        mask = kv.visible.reshape((batch, 1, 1, kv.keys))
        rep = c.n_heads // c.n_kv_heads  # the query heads of one KV head attend as the rows of one problem
        grouped = q.reshape((batch, c.n_kv_heads, rep, c.head_dim)).contiguous()
        out = scaled_dot_product_attention(grouped, keys, values, mask)    # [B, kv_heads, rep, head_dim]
        out = out.reshape((batch, c.n_heads * c.head_dim)).contiguous()
        return self._linear(g, out, p + "attn_output")

    def _ffn_graph(self, i: int):
        g = Graph()
        batch, _ = self._dims()
        c, w = self.local.config, self.local.weights
        x = self._residual(g, batch)
        partial = self.local.mlp(g, rms_norm(x, w.tensor(g, f"blk.{i}.ffn_norm.weight"), c.rms_norm_eps), i)
        return g, [x, partial], []

    def _head_graph(self):
        g = Graph()
        batch, _ = self._dims()
        c, w = self.local.config, self.local.weights
        hidden = rms_norm(self._residual(g, batch), w.tensor(g, "output_norm.weight"), c.rms_norm_eps)
        return g, [self.local.lm_head(g, hidden)], []

    # running ----------------------------------------------------------------------------------------
    def check(self, tokens, positions) -> tuple[np.ndarray, np.ndarray]:
        """The step's inputs as int32 arrays; ValueError (before any collective) when they do not fit."""
        return check_step_inputs(tokens, positions, self.max_batch, self.ctx, self.vocab_size)

    def _attend(self, i: int, dims: dict, pos: np.ndarray, **inputs) -> tuple[np.ndarray, np.ndarray]:
        k, v = f"k{i}", f"v{i}"
        x, partial, new_k, new_v = self.segments[2 * i](dims=dims, positions=pos, **inputs,
                                                        **{k: self.caches[k], v: self.caches[v]})
        for name, updated in ((k, new_k), (v, new_v)):
            if updated is not self.caches[name]:  # a backend that did not write in place
                self.adopt(name, updated)
        return x, partial

    def run(self, tokens, positions) -> np.ndarray:
        """One token per sequence (row ``b`` in slot ``b``; every rank must make the same call): the logits
        ``[B, vocab]``, the same on every rank; this rank's caches are updated in place."""
        ids, pos = self.check(tokens, positions)
        keys = min(-(-(int(pos.max()) + 1) // KEY_BLOCK) * KEY_BLOCK, self.ctx)  # whole key blocks
        dims = {"keys": keys}
        reduce = self.comm.all_reduce
        x, partial = self._attend(0, dims, pos, tokens=ids)
        for j, prog in enumerate(self.segments[1:-1]):
            reduce(partial)
            if j % 2 == 0:  # the FFN of layer j // 2
                x, partial = prog(x=x, r=partial)
            else:
                x, partial = self._attend(j // 2 + 1, dims, pos, x=x, r=partial)
        reduce(partial)
        (logits,) = self.segments[-1](x=x, r=partial)
        return logits
