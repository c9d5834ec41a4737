"""One rank's step program of a tensor-parallel Llama: compiled segments between the all-reduces.

A rank cannot run its forward pass as one native call: twice per layer (after the attention's output
projection and after the FFN's down projection) its partial sums must be added to the other ranks' before
the next norm. So the forward pass is compiled as segments, each a program of its own:

    attention segment i:  x' = x + r;  partial = o(attention(norm(x')))  (rows appended to k<i>, v<i>)
    FFN segment i:        x' = x + r;  partial = down(silu(gate(norm(x'))) * up(norm(x')))
    head:                 x' = x + r;  logits = lm_head(norm(x'))

where ``r`` is the previous segment's partial after the all-reduce (segment 0 starts from the embedding).
``x`` stays replicated (every rank holds the same full hidden state), so the head's logits are the same on
every rank and each samples the same token. ``TensorParallelStep`` has the interface of ``CompiledLM``
(``run(tokens, pos, caches)``, ``new_caches()``, ``ctx``, ...), so ``KVCache`` and ``generate`` use it as
they use a single program.
"""
from __future__ import annotations

import time

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..frontend import rms_norm
from ..graph import Graph
from ..models.base import DEFAULT_MAX_CHUNK, KVAppend, default_kv_dtype, with_kv_dtype
from ..row_step import RowStep
from .comm import Communicator
from .sharding import ShardedWeights, ShardPlan, TensorParallelError, shard_config

__all__ = ["TensorParallelStep", "shard_model"]


def shard_model(lm, plan: ShardPlan):
    """The Llama-family model ``lm`` as rank ``plan.rank`` sees it: its heads, FFN columns and weights."""
    from ..models.llama import Llama
    if not isinstance(lm, Llama):
        raise TensorParallelError(f"tensor parallelism supports the Llama family; this model is "
                                  f"{type(lm).__name__} ({lm.config.architecture})")
    return type(lm)(shard_config(lm.config, plan), ShardedWeights(lm.weights, plan), lm.tokenizer)


def _ffn_unit(lm) -> int:
    """The block size the FFN split must keep: the values per block of the down projection's type."""
    t = lm.weights.file.tensors.get("blk.0.ffn_down.weight")
    from ..quant import QType, block_format
    if t is None or t.qtype in (QType.F32, QType.F16, QType.BF16):
        return 32
    return max(32, block_format(t.qtype).block_elems)


def check_call(step, tokens, pos: int, caches: dict[str, np.ndarray], where: str = "") -> tuple[np.ndarray, int]:
    """A rank's call's token ids (int32) and position, checked against ``step``'s ``max_chunk``, ``ctx``,
    ``vocab_size`` and ``cache_specs`` before any collective; ValueError naming the problem (``where`` is added
    to the message about missing caches)."""
    ids = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
    n = ids.shape[0]
    if not 1 <= n <= step.max_chunk:
        raise ValueError(f"run: {n} tokens; a call takes 1 to {step.max_chunk} (split longer inputs)")
    pos = int(pos)
    if pos < 0 or pos + n > step.ctx:
        raise ValueError(f"run: positions {pos}..{pos + n - 1} exceed the context bound of {step.ctx} tokens")
    if int(ids.min()) < 0 or int(ids.max()) >= step.vocab_size:
        raise ValueError(f"run: token ids must lie in [0, {step.vocab_size}), got {ids.min()}..{ids.max()}")
    missing = [s.name for s in step.cache_specs if s.name not in caches]
    if missing:
        raise ValueError(f"run: the caches have no arrays {missing[:4]}{where}")
    return ids, pos


class TensorParallelStep:
    """Rank ``comm.rank``'s compiled segments (see the module docstring); ``run`` is ``CompiledLM.run``."""

    def __init__(self, lm, comm: Communicator, ctx: int | None = None, max_chunk: int = DEFAULT_MAX_CHUNK,
                 last_only: bool = True, kv_dtype: "str | dt.DType | None" = None, backend: str = "c", **options):
        t0 = time.perf_counter()
        self.comm = comm
        self.plan = ShardPlan.for_config(lm.config, comm.world, comm.rank, _ffn_unit(lm))
        self.local = shard_model(lm, self.plan)
        ctx = lm.default_context() if ctx is None else int(ctx)
        if ctx < 1 or max_chunk < 1:
            raise ValueError(f"ctx ({ctx}) and max_chunk ({max_chunk}) must be positive")
        self.ctx, self.max_chunk, self.last_only = ctx, min(max_chunk, ctx), last_only
        self.vocab_size = lm.config.vocab_size
        self.kv_update = "rows"
        self.cache_specs = with_kv_dtype(self.local.cache_specs(ctx), kv_dtype or default_kv_dtype(backend))
        self._specs = {s.name: s for s in self.cache_specs}
        graphs = [self._attention_graph(i) if kind == "attention" else self._ffn_graph(i)
                  for i in range(lm.config.n_layers) for kind in ("attention", "ffn")]
        graphs.append(self._head_graph())
        self.build_seconds = time.perf_counter() - t0
        self.segments = [g.compile(outs, backend=backend, **options) for g, outs in graphs]
        self.compile_seconds = time.perf_counter() - t0 - self.build_seconds
        self._row_steps: list | None = None
        self._row_key: tuple = ()

    # the segment graphs ---------------------------------------------------------------------------
    def _dims(self):
        return sym.dim("seq", 1, self.max_chunk), sym.dim("pos", 0, self.ctx - 1)

    def _residual(self, g: Graph, seq) -> object:
        hidden = self.local.config.hidden_size
        return g.input("x", (seq, hidden), dt.float32) + g.input("r", (seq, hidden), dt.float32)

    def _attention_graph(self, i: int):
        g = Graph()
        seq, pos = self._dims()
        c, w = self.local.config, self.local.weights
        if i == 0:
            x = w.rows(g, "token_embd.weight", g.input("tokens", (seq,), dt.int32))
        else:
            x = self._residual(g, seq)
        kv = KVAppend(g, [self._specs[f"k{i}"], self._specs[f"v{i}"]], seq, pos, "rows")
        partial = self.local.attention(g, rms_norm(x, w.tensor(g, f"blk.{i}.attn_norm.weight"), c.rms_norm_eps),
                                       i, kv)
        return g, [x, partial, kv.outputs[f"k{i}"], kv.outputs[f"v{i}"]]

    def _ffn_graph(self, i: int):
        g = Graph()
        seq, _ = self._dims()
        c, w = self.local.config, self.local.weights
        x = self._residual(g, seq)
        partial = self.local.mlp(g, rms_norm(x, w.tensor(g, f"blk.{i}.ffn_norm.weight"), c.rms_norm_eps), i)
        return g, [x, partial]

    def _head_graph(self):
        g = Graph()
        seq, _ = self._dims()
        c, w = self.local.config, self.local.weights
        hidden = rms_norm(self._residual(g, seq), w.tensor(g, "output_norm.weight"), c.rms_norm_eps)
        if self.last_only:
            hidden = hidden.shrink([(sym.add(seq, -1), seq), None]).contiguous()
        return g, [self.local.lm_head(g, hidden)]

    # running ----------------------------------------------------------------------------------------
    @property
    def kv_dtype(self) -> str:
        return self.cache_specs[0].dtype.name if self.cache_specs else "float32"

    def new_caches(self) -> dict[str, np.ndarray]:
        """This rank's cache arrays (its KV heads), zeroed."""
        return {s.name: np.zeros(s.shape, dtype=s.dtype.np) for s in self.cache_specs}

    def sharded_bytes(self) -> int:
        """Bytes of the split weights this rank holds (see ``ShardedWeights.sharded_bytes``)."""
        return self.local.weights.sharded_bytes()

    def _attention_steps(self, caches: dict[str, np.ndarray]) -> list[RowStep]:
        """One RowStep per attention segment over these cache arrays (made when they change)."""
        key = tuple(id(caches[s.name]) for s in self.cache_specs)
        if self._row_steps is not None and key == self._row_key:
            return self._row_steps
        hidden = self.local.config.hidden_size
        steps = []
        for i, prog in enumerate(self.segments[0:-1:2]):
            k, v = caches[f"k{i}"], caches[f"v{i}"]
            if i == 0:
                inputs, varying = {"tokens": np.zeros(1, np.int32)}, ["tokens"]
            else:
                inputs = {"x": np.zeros((1, hidden), np.float32), "r": np.zeros((1, hidden), np.float32)}
                varying = ["x", "r"]
            steps.append(RowStep(prog, {**inputs, f"k{i}": k, f"v{i}": v}, writes={2: f"k{i}", 3: f"v{i}"},
                                 varying=varying, dims={"pos": 0}))
        self._row_steps, self._row_key = steps, key  # the steps hold the arrays, so the ids stay theirs
        return steps

    def run(self, tokens, pos: int, caches: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Run ``tokens`` at positions ``pos ..`` on this rank (every rank must make the same call); the
        logits (the same on every rank) and the caches, written in place."""
        ids, pos = check_call(self, tokens, pos, caches)
        attention = self._attention_steps(caches)
        dims = {"pos": pos}
        reduce = self.comm.all_reduce
        x, partial = attention[0].run({"tokens": ids}, dims, pos)
        for i, prog in enumerate(self.segments[1:-1]):
            reduce(partial)
            if i % 2 == 0:  # the FFN of layer i // 2
                x, partial = prog(x=x, r=partial)
            else:
                x, partial = attention[i // 2 + 1].run({"x": x, "r": partial}, dims, pos)
        reduce(partial)
        (logits,) = self.segments[-1](x=x, r=partial)
        return logits, caches

