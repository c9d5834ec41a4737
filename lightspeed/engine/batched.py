"""A batched decode step: one native call advances every active sequence by one token.

The single-sequence step program (``CausalLM.compile``) runs ``seq`` tokens of ONE sequence at
positions ``pos ..``. Serving many requests at once needs the transpose: one token of each of
``B`` sequences, every sequence at its own position. This module builds that graph:

- inputs ``tokens [B]`` and ``positions [B]`` (int32), ``B`` a symbolic dim ``batch`` in
  ``1 .. max_batch``; a dim ``keys`` (the longest sequence's length after this step, i.e.
  ``max(positions) + 1``) bounds how many cache rows attention reads;
- caches ``k<i>``/``v<i>`` of shape ``[max_batch * ctx, kv_heads, head_dim]``: slot ``s`` owns
  rows ``s*ctx .. s*ctx+ctx-1``. Row ``b`` of the batch lives in slot ``b`` (the scheduler keeps
  the active sequences packed in slots ``0 .. B-1``). The new key/value rows are written with
  Scatter at rows ``b*ctx + positions[b]``; the caches are donated, so the C backend writes them
  in place;
- RoPE with per-row positions, and attention of each row over keys ``0 .. keys-1`` of its own
  slot (a view of the updated cache, no gather), masked to ``j <= positions[b]``.

A row's result must not depend on which other rows share its step (batching must not change
greedy output). Masked keys add exact zeros to the softmax, but the attention kernel's sums are
vectorised over blocks of keys, and how a partial block is summed depends on its length. So
``keys`` is rounded up to a multiple of ``KEY_BLOCK`` (the kernel's block of keys): every block
a row sees is whole, and the extra all-masked blocks add exact zeros. A row is then bit-identical
whether it runs alone or with others (tested). It may differ in the last bits from the
single-sequence program, which sums exactly ``pos + 1`` keys.

Prefill of a new request runs through the model's single-sequence program directly on its
slot: ``slot_caches(s)`` are ``[ctx, kv_heads, head_dim]`` views of the batched caches, which
that program (``kv_update="rows"``) reads and writes in place, so no rows are copied. With
``head_major`` the caches are ``[max_batch, kv_heads, ctx, head_dim]`` and slot ``s`` is ``[s]``, the
layout of a program compiled with ``kv_update="heads"`` (the C backend's default), which updates it in
place; each row's scatter then writes every KV head's row (``scatter_rows``).

Only the Llama family has a batched forward here (``BATCHED_FORWARDS``); ``supports(lm)`` says
whether a model has one.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..frontend import rms_norm, rope, scaled_dot_product_attention
from ..graph import Graph
from ..models.base import (DEFAULT_KV_DTYPE, CausalLM, default_kv_dtype, default_kv_update, scatter_head_major,
                           with_kv_dtype)
from ..models.llama import Llama
from ..tensor import Tensor

KEY_BLOCK = 32  # keys per streamed block of the C attention kernel (backend/c/attention.py KEYS)


def batched_cache_shape(max_batch: int, ctx: int, row_shape: tuple[int, ...], head_major: bool) -> tuple[int, ...]:
    """The shape of a batched cache: ``[max_batch * ctx, kv_heads, head_dim]`` (slot ``s`` owns rows ``s*ctx ..``)
    or, head-major, ``[max_batch, kv_heads, ctx, head_dim]`` (slot ``s`` is ``[s]``, the single-sequence
    program's head-major layout)."""
    if head_major:
        return (max_batch, row_shape[0], ctx) + tuple(row_shape[1:])
    return (max_batch * ctx,) + tuple(row_shape)


def slot_stride(ctx: int, row_shape: tuple[int, ...], head_major: bool) -> int:
    """Rows of the scatter's flat view between one slot's position ``p`` and the next slot's."""
    return ctx * row_shape[0] if head_major else ctx


def scatter_rows(cache: Tensor, base: Tensor, rows: Tensor, ctx: int, head_major: bool) -> tuple[Tensor, Tensor]:
    """``cache`` with ``rows [n, kv_heads, ...]`` written at slot-and-position rows ``base [n]`` (``slot *
    slot_stride + position``); returns the updated cache (the graph output) and a view of it as ``[max_batch,
    ctx, kv_heads, ...]`` to read slots through. Head-major caches get every head's row in one Scatter over their
    ``[max_batch * kv_heads * ctx, ...]`` view, which writes the donated cache in place."""
    if not head_major:
        updated = cache.scatter(base, rows)
        return updated, updated.reshape((cache.shape[0] // ctx, ctx) + tuple(cache.shape[1:]))
    updated = scatter_head_major(cache, base, rows, ctx)
    return updated, updated.permute(0, 2, 1, *range(3, cache.ndim))


class BatchedKV:
    """The batched caches as a forward pass sees them: ``append(name, rows [B, ...])`` scatters the
    rows at position ``positions[b]`` of slot ``b`` and returns each row's keys ``[B, keys, ...]`` (its own
    slot's rows ``0 .. keys-1``); ``visible [B, keys]`` masks the keys past each row's position."""

    def __init__(self, g: Graph, names: list[str], row_shape: tuple[int, ...], ctx: int, max_batch: int,
                 batch: sym.Var, keys: sym.Var, positions: Tensor, kv_dtype: dt.DType = dt.float32,
                 head_major: bool = False):
        self.g, self.ctx, self.max_batch, self.batch, self.keys = g, ctx, max_batch, batch, keys
        self.row_shape, self.head_major = row_shape, head_major
        self.positions = positions
        shape = batched_cache_shape(max_batch, ctx, row_shape, head_major)
        self.inputs = {n: g.input(n, shape, kv_dtype) for n in names}
        self.outputs: dict[str, Tensor] = {}
        self.rows = g.iota(batch) * slot_stride(ctx, row_shape, head_major) + positions   # [B] slot and position
        self.visible = g.iota(keys).reshape((1, keys)) <= positions.reshape((batch, 1))  # [B, keys]

    def append(self, name: str, rows: Tensor) -> Tensor:
        if name in self.outputs:
            raise ValueError(f"cache {name!r} was appended to twice in one forward pass")
        cache = self.inputs[name]
        updated, per_slot = scatter_rows(cache, self.rows, rows.cast(cache.dtype), self.ctx, self.head_major)
        self.outputs[name] = updated
        rest = [None] * len(self.row_shape)
        # a float16 cache is read through a cast back to float32, as in KVAppend
        return per_slot.shrink([(0, self.batch), (0, self.keys)] + rest).cast(dt.float32)


# the Llama family's batched forward -------------------------------------------------------------------
def llama_batched_attention(lm: Llama, g: Graph, h: Tensor, i: int, kv: BatchedKV) -> Tensor:
    """Layer ``i``'s attention on normed ``h [B, hidden]``, row ``b`` at ``kv.positions[b]`` in its own slot."""
    c = lm.config
    b = h.shape[0]
    p = f"blk.{i}."

    def rotate(x: Tensor) -> Tensor:  # x [B, heads, head_dim], row b at positions[b]
        return rope(x, kv.positions, theta=c.rope_theta, interleaved=c.rope_interleaved, inv_freq=c.rope_inv_freq)

    q = rotate(lm._linear(g, h, p + "attn_q").reshape((b, c.n_heads, c.head_dim)))
    k = rotate(lm._linear(g, h, p + "attn_k").reshape((b, c.n_kv_heads, c.head_dim)))
    v = lm._linear(g, h, p + "attn_v").reshape((b, c.n_kv_heads, c.head_dim))
    keys = kv.append(f"k{i}", k).permute(0, 2, 1, 3)                         # [B, kv_heads, keys, head_dim]
    values = kv.append(f"v{i}", v).permute(0, 2, 1, 3)
    mask = kv.visible.reshape((b, 1, 1, kv.keys))
    # the query heads that share a KV head are the query rows of one attention problem (head h
    # uses KV head h // rep, as in grouped-query attention): the attention kernel then stages
    # each block of keys once for all of them instead of once per head
    rep = c.n_heads // c.n_kv_heads
    grouped = q.reshape((b, c.n_kv_heads, rep, c.head_dim)).contiguous()  # rotated once, not per key block
    out = scaled_dot_product_attention(grouped, keys, values, mask)             # [B, kv_heads, rep, head_dim]
    out = out.reshape((b, c.n_heads * c.head_dim)).contiguous()
    return lm._linear(g, out, p + "attn_output")


def llama_layers(lm: Llama, g: Graph, tokens: Tensor, kv, attention: Callable[..., Tensor]) -> Tensor:
    """Hidden states after the final norm of the rows of ``tokens`` (the blocks of ``Llama.forward``), with
    ``attention(lm, g, normed, layer, kv)`` as each layer's attention."""
    c = lm.config
    x = lm.weights.rows(g, "token_embd.weight", tokens)
    for i in range(c.n_layers):
        p = f"blk.{i}."
        x = x + attention(lm, g, rms_norm(x, lm._w(g, p + "attn_norm.weight"), c.rms_norm_eps), i, kv)
        x = x + lm.mlp(g, rms_norm(x, lm._w(g, p + "ffn_norm.weight"), c.rms_norm_eps), i)
    return rms_norm(x, lm._w(g, "output_norm.weight"), c.rms_norm_eps)


def llama_batched_forward(lm: Llama, g: Graph, tokens: Tensor, kv: BatchedKV) -> Tensor:
    """Hidden states ``[B, hidden]`` of one token per sequence."""
    return llama_layers(lm, g, tokens, kv, llama_batched_attention)


# model class -> its batched forward; a family without one is served one sequence at a time
BATCHED_FORWARDS: dict[type, Callable[..., Tensor]] = {Llama: llama_batched_forward}


def supports(lm: CausalLM) -> bool:
    """Whether ``lm``'s family has a batched decode step."""
    return type(lm) in BATCHED_FORWARDS


def build_batched(lm: CausalLM, ctx: int, max_batch: int, kv_dtype: str = DEFAULT_KV_DTYPE,
                  head_major: bool = False) -> tuple[Graph, list[Tensor], list[str]]:
    """The batched step graph: outputs ``[logits [B, vocab], *updated caches]``; the cache names.
    ``kv_dtype`` ("float32" or "float16") is the caches' element type; ``head_major`` lays them out as
    ``batched_cache_shape`` says."""
    forward = BATCHED_FORWARDS.get(type(lm))
    if forward is None:
        raise ValueError(f"no batched decode step for {type(lm).__name__} models (supported: "
                         f"{', '.join(t.__name__ for t in BATCHED_FORWARDS)})")
    if ctx < 1 or max_batch < 1:
        raise ValueError(f"build_batched: ctx ({ctx}) and max_batch ({max_batch}) must be positive")
    specs = with_kv_dtype(lm.cache_specs(ctx), kv_dtype)
    row_shape = tuple(specs[0].shape[1:])
    if any(tuple(s.shape[1:]) != row_shape or s.shape[0] != ctx for s in specs):
        raise ValueError("build_batched: every cache must have the same row shape and ctx rows")
    g = Graph()
    batch = sym.dim("batch", 1, max_batch)
    keys = sym.dim("keys", 1, ctx)
    tokens = g.input("tokens", (batch,), dt.int32)
    positions = g.input("positions", (batch,), dt.int32)
    names = [s.name for s in specs]
    kv = BatchedKV(g, names, row_shape, ctx, max_batch, batch, keys, positions, specs[0].dtype, head_major)
    hidden = forward(lm, g, tokens, kv)
    logits = lm.lm_head(g, hidden)
    return g, [logits] + [kv.outputs[n] for n in names], names


def check_step_inputs(tokens, positions, max_batch: int, ctx: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A batched step's token ids and positions as int32 arrays (one of each per sequence); ValueError when
    their count, a position or an id is out of range."""
    ids = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
    pos = np.ascontiguousarray(positions, dtype=np.int32).reshape(-1)
    n = ids.shape[0]
    if not 1 <= n <= max_batch or pos.shape[0] != n:
        raise ValueError(f"run: {n} tokens and {pos.shape[0]} positions; a step takes 1 to {max_batch} "
                         "sequences, one position each")
    if pos.min() < 0 or pos.max() >= ctx:
        raise ValueError(f"run: positions {pos.min()}..{pos.max()} exceed the context bound of {ctx}")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"run: token ids must lie in [0, {vocab_size}), got {ids.min()}..{ids.max()}")
    return ids, pos


class SlottedCaches:
    """Batched caches ``[slots * ctx, ...]`` (``self.caches``) in slots of ``self.ctx`` rows, or head-major
    ``[slots, kv_heads, ctx, ...]`` (``head_major``), for the engine's steppers: ``slot_caches`` views,
    ``slot_of``, ``move_slot`` and ``adopt``. A subclass sets ``caches``, ``ctx`` and ``max_batch`` (and
    ``head_major`` when true) and calls ``_reset_views``."""

    caches: dict[str, np.ndarray]
    ctx: int
    max_batch: int
    head_major: bool = False

    def _reset_views(self) -> None:
        self._views: list[dict[str, np.ndarray] | None] = [None] * self.max_batch

    def slot_caches(self, slot: int) -> dict[str, np.ndarray]:
        """Views ``[ctx, ...]`` (head-major: ``[kv_heads, ctx, ...]``) of slot ``slot`` in every cache (the
        layout the single-sequence program takes; writes through them land in the batched caches)."""
        if not 0 <= slot < self.max_batch:
            raise ValueError(f"slot {slot} is outside 0..{self.max_batch - 1}")
        # the same views every time: the single-sequence program checks a set of cache arrays once
        # (lightspeed.row_step), so new views per prefill chunk would cost that check every chunk
        views = self._views[slot]
        if views is None:
            lo = slot * self.ctx
            views = self._views[slot] = {n: a[slot] if self.head_major else a[lo:lo + self.ctx]
                                         for n, a in self.caches.items()}
        return views

    def slot_of(self, caches: dict[str, np.ndarray]) -> int:
        """The slot whose ``slot_caches`` dict ``caches`` is (ValueError for any other dict)."""
        for slot, views in enumerate(self._views):
            if views is caches:
                return slot
        raise ValueError(f"these caches are not a slot of this {type(self).__name__}")

    def move_slot(self, src: int, dst: int, rows: int) -> None:
        """Copy the first ``rows`` rows of slot ``src`` into slot ``dst`` (packing after a sequence leaves)."""
        if self.head_major:
            for a in self.caches.values():
                a[dst, :, :rows] = a[src, :, :rows]
            return
        s, d = src * self.ctx, dst * self.ctx
        for a in self.caches.values():
            a[d:d + rows] = a[s:s + rows]

    def adopt(self, name: str, updated: np.ndarray) -> None:
        """Take ``updated`` as cache ``name`` (a program returned a new array instead of writing in place)."""
        self.caches[name] = updated
        self._reset_views()


class BatchedStep(SlottedCaches):
    """The compiled batched step and its caches (``max_batch`` slots of ``ctx`` rows each; ``head_major``: the
    caches of a single-sequence program compiled with ``kv_update="heads"``, else of ``"rows"``; by default
    those of ``default_kv_update(backend)``)."""

    def __init__(self, lm: CausalLM, ctx: int, max_batch: int, backend: str = "c", kv_dtype: str | None = None,
                 head_major: bool | None = None, **options):
        t0 = time.perf_counter()
        if head_major is None:  # the layout of the single-sequence program compiled for the same backend
            head_major = default_kv_update(backend) == "heads"
        g, outputs, names = build_batched(lm, ctx, max_batch, kv_dtype or default_kv_dtype(backend), head_major)
        t1 = time.perf_counter()
        self.program = g.compile(outputs, backend=backend, donate=names, **options)
        self.build_seconds, self.compile_seconds = t1 - t0, time.perf_counter() - t1
        self.ctx, self.max_batch, self.names, self.head_major = ctx, max_batch, names, head_major
        self.vocab_size = lm.config.vocab_size
        first = g.inputs[names[0]]
        # zero pages: memory is only touched as slots fill
        self.caches = {n: np.zeros(tuple(first.shape), dtype=first.dtype.np) for n in names}
        self._reset_views()

    def run(self, tokens, positions) -> np.ndarray:
        """One token per sequence: row ``b`` (token ``tokens[b]`` at ``positions[b]``) uses slot ``b``.
        Returns the logits ``[B, vocab]``; the caches are updated in place."""
        ids, pos = check_step_inputs(tokens, positions, self.max_batch, self.ctx, self.vocab_size)
        keys = min(-(-(int(pos.max()) + 1) // KEY_BLOCK) * KEY_BLOCK, self.ctx)  # whole blocks (see module doc)
        outs = self.program(dims={"keys": keys}, tokens=ids, positions=pos, **self.caches)
        for name, updated in zip(self.names, outs[1:]):
            if updated is not self.caches[name]:  # a backend that did not write in place
                self.adopt(name, updated)
        return outs[0]
