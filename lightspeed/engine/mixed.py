"""A mixed step: one native call runs a decode token of every decoding sequence AND a chunk of the prompt
being prefilled, so the chunk rides on the decode step's pass over the weights.

Chunked prefill between decode steps (lightspeed.engine.scheduler) costs the running streams a whole extra
pass over the weights per chunk: a 4-token chunk took about as long as a decode step, so their gap between
tokens doubled while a long prompt arrived, whatever the chunk's size. Here the chunk's rows are extra rows
of the same matrix products; what they add is their own compute, roughly ``chunk * per-token cost``.

The graph (``build_mixed``), for ``B`` decoding sequences in slots ``0 .. B-1`` and the sequence being
prefilled in slot ``B`` (the engine keeps slots packed, so the filling one is always right after them):

- inputs ``tokens [B]`` / ``positions [B]`` (one token per decoding sequence, as in ``BatchedStep``),
  ``chunk [C]`` (the prompt's next tokens) and the dim ``start`` (the position of ``chunk[0]``);
- every projection and the MLP run on the ``B + C`` rows together; the new key/value rows of all of them are
  scattered into the batched caches in one Scatter (decode row ``b`` at ``b*ctx + positions[b]``, chunk row
  ``r`` at ``B*ctx + start + r``; head-major caches as ``BatchedStep``'s, lightspeed.engine.batched);
- attention splits: the decode rows attend as in ``BatchedStep`` (each over ``keys`` rows of its own slot,
  ``keys`` rounded to whole key blocks, so a decode row's attention is the same whatever else runs), the
  chunk's rows attend causally over slot ``B``'s rows ``0 .. start + C - 1``;
- the outputs are the logits of the ``B`` decode rows and of the chunk's LAST row (``[B + 1, vocab]``:
  only a prompt's last token needs logits, so the LM head skips the other chunk rows), and the caches.

A decode row's matrix products now run with ``B + C`` rows instead of ``B``, which may take another kernel path (a
few-row matvec against a blocked gemm) and sum its products in another order: its logits can differ in the last bits
from a plain batched step's, which changes a greedy token only where two logits tie that closely (as chunking a
prompt differently already may; lightspeed.engine.chunking). Under the C backend's "auto" activations, where they
are int16 for calls of up to 8 rows and float for longer ones (AVX2; AVX-512 with AMX or without VNNI),
the difference would be the activations' rounding, not the last bits, so ``chunk_limit`` keeps ``B + C`` within that
limit there.
"""
from __future__ import annotations

import time

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..frontend import arange, concatenate, rope, scaled_dot_product_attention
from ..graph import Graph
from ..models.base import DEFAULT_KV_DTYPE, CausalLM, with_kv_dtype
from ..models.llama import Llama
from ..tensor import Tensor
from ..backend.c.activations import AUTO, resolve_activations
from .batched import (KEY_BLOCK, BatchedStep, batched_cache_shape, check_step_inputs, llama_layers, scatter_rows,
                      slot_stride)


class MixedKV:
    """The batched caches as a mixed forward pass sees them: ``append(name, rows [B + C, ...])`` scatters all
    rows at once and returns the decode rows' keys ``[B, keys, ...]`` (own slot each) and the chunk's keys
    ``[start + C, ...]`` (slot ``B``)."""

    def __init__(self, g: Graph, names: list[str], row_shape: tuple[int, ...], ctx: int, max_batch: int,
                 batch: sym.Var, chunk: sym.Var, start: sym.Var, keys: sym.Var, positions: Tensor,
                 kv_dtype: dt.DType, head_major: bool = False):
        self.g, self.ctx, self.max_batch, self.row_shape = g, ctx, max_batch, row_shape
        self.batch, self.chunk, self.start, self.keys = batch, chunk, start, keys
        self.head_major = head_major
        shape = batched_cache_shape(max_batch, ctx, row_shape, head_major)
        self.inputs = {n: g.input(n, shape, kv_dtype) for n in names}
        self.outputs: dict[str, Tensor] = {}
        self.chunk_positions = arange(g, start, sym.add(start, chunk))                    # [C]
        self.positions = concatenate([positions, self.chunk_positions], 0)                # [B + C]
        stride = slot_stride(ctx, row_shape, head_major)
        base = sym.add(sym.mul(batch, stride), start)                                     # slot B, row start
        self.rows = concatenate([g.iota(batch) * stride + positions, arange(g, base, sym.add(base, chunk))], 0)
        # the chunk's keys; the min only keeps the bound provable (run_mixed keeps start + chunk <= ctx)
        self.total = sym.smin(sym.add(start, chunk), ctx)
        self.visible = g.iota(keys).reshape((1, keys)) <= positions.reshape((batch, 1))   # [B, keys]
        self.chunk_visible = g.iota(self.total).reshape((1, self.total)) <= self.chunk_positions.reshape((chunk, 1))

    def append(self, name: str, rows: Tensor) -> tuple[Tensor, Tensor]:
        if name in self.outputs:
            raise ValueError(f"cache {name!r} was appended to twice in one forward pass")
        cache = self.inputs[name]
        updated, per_slot = scatter_rows(cache, self.rows, rows.cast(cache.dtype), self.ctx, self.head_major)
        self.outputs[name] = updated
        rest = [None] * len(self.row_shape)
        decode = per_slot.shrink([(0, self.batch), (0, self.keys)] + rest).cast(dt.float32)
        filling = per_slot.shrink([(self.batch, sym.add(self.batch, 1)), (0, self.total)] + rest)
        return decode, filling.reshape((self.total,) + self.row_shape).cast(dt.float32)


def _llama_mixed_attention(lm: Llama, g: Graph, h: Tensor, i: int, kv: MixedKV) -> Tensor:
    c = lm.config
    n = h.shape[0]
    b, chunk = kv.batch, kv.chunk
    p = f"blk.{i}."

    def rotate(x: Tensor) -> Tensor:  # x [B + C, heads, head_dim] at kv.positions
        return rope(x, kv.positions, theta=c.rope_theta, interleaved=c.rope_interleaved, inv_freq=c.rope_inv_freq)

    q = rotate(lm._linear(g, h, p + "attn_q").reshape((n, c.n_heads, c.head_dim)))
    k = rotate(lm._linear(g, h, p + "attn_k").reshape((n, c.n_kv_heads, c.head_dim)))
    v = lm._linear(g, h, p + "attn_v").reshape((n, c.n_kv_heads, c.head_dim))
    keys, chunk_keys = kv.append(f"k{i}", k)
    values, chunk_values = kv.append(f"v{i}", v)
    rep = c.n_heads // c.n_kv_heads
    # decode rows: as BatchedStep's (the query heads of a KV head are the rows of one attention problem)
    q_dec = q[:b].reshape((b, c.n_kv_heads, rep, c.head_dim)).contiguous()
    out_dec = scaled_dot_product_attention(q_dec, keys.permute(0, 2, 1, 3), values.permute(0, 2, 1, 3),
                                           kv.visible.reshape((b, 1, 1, kv.keys)))
    out_dec = out_dec.reshape((b, c.n_heads * c.head_dim))
    # chunk rows: causal attention over the filling slot, grouped like the single-sequence program's
    rows = sym.mul(chunk, rep)
    q_ch = q[b:].reshape((chunk, c.n_kv_heads, rep, c.head_dim)).permute(1, 0, 2, 3).contiguous()
    q_ch = q_ch.reshape((c.n_kv_heads, rows, c.head_dim))
    visible = kv.chunk_visible.reshape((chunk, 1, kv.total)).expand((chunk, rep, kv.total)).reshape((rows, kv.total))
    out_ch = scaled_dot_product_attention(q_ch, chunk_keys.permute(1, 0, 2), chunk_values.permute(1, 0, 2), visible)
    out_ch = out_ch.reshape((c.n_kv_heads, chunk, rep, c.head_dim)).permute(1, 0, 2, 3)
    out_ch = out_ch.reshape((chunk, c.n_heads * c.head_dim))
    out = concatenate([out_dec, out_ch], 0).contiguous()
    return lm._linear(g, out, p + "attn_output")


def llama_mixed_forward(lm: Llama, g: Graph, tokens: Tensor, kv: MixedKV) -> Tensor:
    """Final hidden states ``[B + C, hidden]`` of the decode rows and then the chunk's rows."""
    return llama_layers(lm, g, tokens, kv, _llama_mixed_attention)


MIXED_FORWARDS = {Llama: llama_mixed_forward}


def supports_mixed(lm: CausalLM) -> bool:
    """Whether ``lm``'s family has a mixed (decode + prefill chunk) step."""
    return type(lm) in MIXED_FORWARDS


def build_mixed(lm: CausalLM, ctx: int, max_batch: int, max_chunk: int, kv_dtype: str = DEFAULT_KV_DTYPE,
                head_major: bool = False) -> tuple[Graph, list[Tensor], list[str]]:
    """The mixed step graph: outputs ``[logits [B + 1, vocab], *updated caches]``; the cache names.
    ``B`` (dim ``batch``) is at most ``max_batch - 1`` (the filling sequence holds slot ``B``), the chunk (dim
    ``chunk``) at most ``max_chunk`` tokens."""
    forward = MIXED_FORWARDS.get(type(lm))
    if forward is None:
        raise ValueError(f"no mixed decode/prefill step for {type(lm).__name__} models")
    if ctx < 1 or max_batch < 2 or max_chunk < 1:
        raise ValueError(f"build_mixed: needs ctx >= 1 ({ctx}), max_batch >= 2 ({max_batch}) and max_chunk >= 1 "
                         f"({max_chunk})")
    specs = with_kv_dtype(lm.cache_specs(ctx), kv_dtype)
    row_shape = tuple(specs[0].shape[1:])
    g = Graph()
    batch = sym.dim("batch", 1, max_batch - 1)
    chunk = sym.dim("chunk", 1, min(max_chunk, ctx))
    start = sym.dim("start", 0, ctx - 1)
    keys = sym.dim("keys", 1, ctx)
    tokens = g.input("tokens", (batch,), dt.int32)
    positions = g.input("positions", (batch,), dt.int32)
    chunk_tokens = g.input("chunk", (chunk,), dt.int32)
    names = [s.name for s in specs]
    kv = MixedKV(g, names, row_shape, ctx, max_batch, batch, chunk, start, keys, positions, specs[0].dtype,
                 head_major)
    hidden = forward(lm, g, concatenate([tokens, chunk_tokens], 0), kv)
    wanted = concatenate([hidden[:batch], hidden[sym.add(sym.add(batch, chunk), -1):]], 0)  # [B + 1, hidden]
    logits = lm.lm_head(g, wanted)
    return g, [logits] + [kv.outputs[n] for n in names], names


class MixedStep:
    """A batched step (``BatchedStep``'s caches and slots) that can also carry a prefill chunk:
    ``run_mixed(tokens, positions, chunk, start)``. Plain decode steps go to the batched step's program."""

    def __init__(self, batched: BatchedStep, lm: CausalLM, max_chunk: int, backend: str = "c",
                 kv_dtype: str | None = None, **options):
        t0 = time.perf_counter()
        if kv_dtype is None:  # the caches it shares with the batched step
            kv_dtype = next(iter(batched.caches.values())).dtype.name
        g, outputs, names = build_mixed(lm, batched.ctx, batched.max_batch, max_chunk, kv_dtype, batched.head_major)
        if names != batched.names:
            raise ValueError("the mixed step's caches differ from the batched step's")
        self.program = g.compile(outputs, backend=backend, donate=names, **options)
        self.compile_seconds = time.perf_counter() - t0
        self.batched, self.max_chunk = batched, min(max_chunk, batched.ctx)
        self.ctx, self.max_batch = batched.ctx, batched.max_batch
        # under the C backend's "auto" activations on some CPUs a call of more rows than this takes float
        # activations and a call of fewer int16 ones: a decode row keeps the rounding of a plain batched step
        # only while the step with its chunk stays within it (None: one rounding at every row count)
        auto = backend == "c" and options.get("activations") == AUTO
        self.row_limit = resolve_activations(AUTO)[1] if auto else None

    def chunk_limit(self, batch: int) -> int:
        """The most prompt tokens a step of ``batch`` decode rows should carry (0: none; then the chunk runs
        as a call of its own)."""
        top = self.max_chunk if self.row_limit is None else min(self.max_chunk, self.row_limit - batch)
        return max(top, 0) if batch < self.max_batch else 0

    # the stepper interface the engine uses, delegated to the batched step
    def slot_caches(self, slot: int) -> dict[str, np.ndarray]:
        return self.batched.slot_caches(slot)

    def move_slot(self, src: int, dst: int, rows: int) -> None:
        self.batched.move_slot(src, dst, rows)

    def run(self, tokens, positions) -> np.ndarray:
        return self.batched.run(tokens, positions)

    def chunk_error(self, chunk, start: int) -> str | None:
        """What is wrong with prefill chunk ``chunk`` at position ``start`` for this step, or None."""
        piece = np.asarray(chunk).reshape(-1)
        n = piece.shape[0]
        if not 1 <= n <= self.max_chunk:
            return f"a chunk of {n} tokens; a mixed step takes 1 to {self.max_chunk}"
        if start < 0 or start + n > self.ctx:
            return f"chunk positions {start}..{start + n - 1} exceed the context bound of {self.ctx}"
        vocab = self.batched.vocab_size
        if piece.min() < 0 or piece.max() >= vocab:
            return f"token ids must lie in [0, {vocab}), got {piece.min()}..{piece.max()}"
        return None

    def run_mixed(self, tokens, positions, chunk, start: int) -> np.ndarray:
        """Decode row ``b`` (token ``tokens[b]`` at ``positions[b]``, slot ``b``) for every ``b < B`` and the
        prompt tokens ``chunk`` at positions ``start ..`` of slot ``B``. Returns logits ``[B + 1, vocab]``: the
        decode rows', then the chunk's last token's. The caches are updated in place."""
        st = self.batched
        ids, pos = check_step_inputs(tokens, positions, self.max_batch - 1, self.ctx, st.vocab_size)
        piece = np.ascontiguousarray(chunk, dtype=np.int32).reshape(-1)
        problem = self.chunk_error(piece, start)
        if problem is not None:
            raise ValueError(f"run_mixed: {problem}")
        keys = min(-(-(int(pos.max()) + 1) // KEY_BLOCK) * KEY_BLOCK, self.ctx)
        outs = self.program(dims={"keys": keys, "start": int(start)}, tokens=ids, positions=pos, chunk=piece,
                            **st.caches)
        for name, updated in zip(st.names, outs[1:]):
            if updated is not st.caches[name]:  # a backend that did not write in place
                st.adopt(name, updated)
        return outs[0]
