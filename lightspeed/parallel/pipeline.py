"""One rank's stage of a pipeline-parallel Llama: consecutive layers compiled as one program.

Rank ``s`` of ``S`` is stage ``s`` (``lightspeed.parallel.stages``): it compiles only its layers, reads only
their weights, and its KV caches hold only its layers' keys and values. A forward pass is one native call per
stage:

    stage 0:       x = layers_0(embedding(tokens))           -> x [tokens, hidden] to stage 1
    stage s:       x = layers_s(x from stage s - 1)          -> x to stage s + 1
    last stage:    logits = lm_head(norm(layers_S-1(x)))     -> logits to every rank (or to rank 0)

The hidden states travel as float32 arrays through a ``PipeChannel`` (torch.distributed send/recv). With
``deliver = "all"`` (generate) the last stage broadcasts the logits, so every rank samples the same token, as
under tensor parallelism; with ``"first"`` (serve) only rank 0, whose engine samples, receives them.
``PipelineStep`` has the interface of ``CompiledLM`` (``run(tokens, pos, caches)``, ``new_caches()``, ``ctx``,
...), so ``KVCache`` and ``generate`` use it as they use a single program; every rank must make the same calls.
Its default activations are ``CausalLM.compile``'s (``DEFAULT_ACTIVATIONS``); serve's batched step of a stage is
compiled with the same (``activations``), as in one process (lightspeed.engine.factory).
"""
from __future__ import annotations

import time

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..frontend import rms_norm
from ..graph import Graph
from ..models.base import DEFAULT_ACTIVATIONS, DEFAULT_MAX_CHUNK, KVAppend, default_kv_dtype, with_kv_dtype
from ..row_step import RowStep
from .comm import DEFAULT_TIMEOUT_S, Communicator
from .pipe import PipeChannel
from .stages import PipelineError, StagePlan, StageWeights
from .step import check_call

__all__ = ["PipelineStep", "stage_model", "layer_of_cache"]

DELIVERIES = ("all", "first")


def layer_of_cache(name: str) -> int:
    """The layer of a Llama cache array's name (``k12`` -> 12)."""
    return int(name[1:])


def stage_model(lm, plan: StagePlan):
    """The Llama-family model ``lm`` as stage ``plan.stage`` sees it: the same config, only its weights."""
    from ..models.llama import Llama
    if not isinstance(lm, Llama):
        raise PipelineError(f"pipeline parallelism supports the Llama family; this model is "
                            f"{type(lm).__name__} ({lm.config.architecture})")
    weights = StageWeights(lm.weights, plan, tied="output.weight" not in lm.weights)
    return type(lm)(lm.config, weights, lm.tokenizer)


class PipelineStep:
    """Stage ``comm.rank``'s compiled layers (see the module docstring); ``run`` is ``CompiledLM.run``."""

    def __init__(self, lm, comm: Communicator, ctx: int | None = None, max_chunk: int = DEFAULT_MAX_CHUNK,
                 last_only: bool = True, kv_dtype: "str | dt.DType | None" = None, backend: str = "c",
                 timeout_s: float = DEFAULT_TIMEOUT_S, **options):
        t0 = time.perf_counter()
        self.comm = comm
        self.plan = StagePlan.for_config(lm.config, comm.world, comm.rank)
        self.local = stage_model(lm, plan=self.plan)
        self.channel = PipeChannel(comm, timeout_s) if comm.world > 1 else None
        ctx = lm.default_context() if ctx is None else int(ctx)
        if ctx < 1 or max_chunk < 1:
            raise ValueError(f"ctx ({ctx}) and max_chunk ({max_chunk}) must be positive")
        self.ctx, self.max_chunk, self.last_only = ctx, min(max_chunk, ctx), last_only
        self.vocab_size, self.hidden_size = lm.config.vocab_size, lm.config.hidden_size
        self.kv_update = "rows"
        self.deliver = "all"
        specs = with_kv_dtype(lm.cache_specs(ctx), kv_dtype or default_kv_dtype(backend))
        self.cache_specs = [s for s in specs if layer_of_cache(s.name) in self.plan.layers]
        g, outputs = self._graph()
        self.build_seconds = time.perf_counter() - t0
        if backend == "c" and "activations" not in options and not options.get("int8_activations"):
            options["activations"] = DEFAULT_ACTIVATIONS  # as CausalLM.compile: a stage is that program, split
        self.program = g.compile(outputs, backend=backend, **options)
        self.activations = options.get("activations")  # the batched steps of serve are compiled with the same
        self.compile_seconds = time.perf_counter() - t0 - self.build_seconds
        self._row_step: RowStep | None = None
        self._row_key: tuple = ()

    def _graph(self) -> tuple[Graph, list]:
        g = Graph()
        seq, pos = sym.dim("seq", 1, self.max_chunk), sym.dim("pos", 0, self.ctx - 1)
        c, w, plan = self.local.config, self.local.weights, self.plan
        if plan.first:
            x = w.rows(g, "token_embd.weight", g.input("tokens", (seq,), dt.int32))
        else:
            x = g.input("x", (seq, c.hidden_size), dt.float32)
        kv = KVAppend(g, self.cache_specs, seq, pos, "rows")
        for i in plan.layers:
            p = f"blk.{i}."
            x = x + self.local.attention(g, rms_norm(x, w.tensor(g, p + "attn_norm.weight"), c.rms_norm_eps), i, kv)
            x = x + self.local.mlp(g, rms_norm(x, w.tensor(g, p + "ffn_norm.weight"), c.rms_norm_eps), i)
        if plan.last:
            hidden = rms_norm(x, w.tensor(g, "output_norm.weight"), c.rms_norm_eps)
            if self.last_only:
                hidden = hidden.shrink([(sym.add(seq, -1), seq), None]).contiguous()
            out = self.local.lm_head(g, hidden)
        else:
            out = x
        return g, [out] + [kv.outputs[s.name] for s in self.cache_specs]

    # what a rank holds --------------------------------------------------------------------------------
    @property
    def kv_dtype(self) -> str:
        return self.cache_specs[0].dtype.name if self.cache_specs else "float32"

    def new_caches(self) -> dict[str, np.ndarray]:
        """This stage's cache arrays (its layers' keys and values), zeroed."""
        return {s.name: np.zeros(s.shape, dtype=s.dtype.np) for s in self.cache_specs}

    def layer_bytes(self) -> int:
        """Bytes of the layer weights this stage's program holds (see ``StageWeights.layer_bytes``)."""
        return self.local.weights.layer_bytes()

    def parallel_timings(self) -> dict:
        """The stage count and this rank's seconds and count of send/recv waits (``generate --json``)."""
        ch = self.channel
        return {"pipeline_parallel": self.comm.world, "sendrecv_s": round(ch.seconds, 4) if ch else 0.0,
                "sendrecv_calls": ch.calls if ch else 0}

    # running ------------------------------------------------------------------------------------------
    def check(self, tokens, pos: int, caches: dict[str, np.ndarray]) -> tuple[np.ndarray, int]:
        """The call's token ids and position; ValueError (before any transfer) when they do not fit."""
        return check_call(self, tokens, pos, caches, f" ({self.plan})")

    def _step_for(self, caches: dict[str, np.ndarray]) -> RowStep:
        """The RowStep over these cache arrays (made when they change): the new rows go straight in."""
        key = tuple(id(caches[s.name]) for s in self.cache_specs)
        if self._row_step is not None and key == self._row_key:
            return self._row_step
        first = self.plan.first
        inputs = {"tokens": np.zeros(1, np.int32)} if first else {"x": np.zeros((1, self.hidden_size), np.float32)}
        arrays = {s.name: caches[s.name] for s in self.cache_specs}
        self._row_step = RowStep(self.program, {**inputs, **arrays},
                                 writes={k: s.name for k, s in enumerate(self.cache_specs, 1)},
                                 varying=list(inputs), dims={"pos": 0})
        self._row_key = key  # the RowStep holds the arrays, so the ids stay theirs
        return self._row_step

    def run(self, tokens, pos: int, caches: dict[str, np.ndarray]) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
        """Run ``tokens`` at positions ``pos ..`` through this stage (every rank makes the same call); the
        logits (with ``deliver="first"``: on rank 0 and the last stage only, else None) and the caches,
        written in place."""
        ids, pos = self.check(tokens, pos, caches)
        n = ids.shape[0]
        plan, ch = self.plan, self.channel
        if plan.first:
            varying = {"tokens": ids}
        else:
            varying = {"x": ch.recv((n, self.hidden_size), np.float32, plan.stage - 1)}
        (out,) = self._step_for(caches).run(varying, {"pos": pos}, pos)
        if not plan.last:
            ch.send(np.ascontiguousarray(out, np.float32), plan.stage + 1)
        return self._logits(out if plan.last else None, 1 if self.last_only else n), caches

    def _logits(self, mine: np.ndarray | None, rows: int) -> np.ndarray | None:
        """The last stage's logits where ``deliver`` sends them."""
        ch, last = self.channel, self.comm.world - 1
        if ch is None:
            return mine
        if self.deliver == "all":
            buf = np.ascontiguousarray(mine, np.float32) if self.plan.last else \
                np.empty((rows, self.vocab_size), np.float32)
            ch.broadcast(buf, last)
            return buf
        if self.deliver != "first":
            raise ValueError(f"deliver must be one of {DELIVERIES}, got {self.deliver!r}")
        if self.plan.last:
            ch.send(np.ascontiguousarray(mine, np.float32), 0)
            return mine
        if self.plan.first:
            return ch.recv((rows, self.vocab_size), np.float32, last)
        return None
