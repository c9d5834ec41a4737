"""What every language model in ``lightspeed.models`` provides, and how it becomes one program.

A model is a config plus weights that *builds a graph* with the Tensor API. A causal LM
implements three methods and inherits the rest:

- ``cache_specs(ctx)``: the KV-cache arrays it needs for a context bound ``ctx`` (static
  shapes, rows = ``ctx``), one graph input and one graph output each;
- ``forward(g, tokens, pos, caches)``: hidden states ``[seq, hidden]`` for ``tokens [seq]``
  sitting at positions ``pos .. pos+seq-1``, plus the updated caches (written with Scatter
  at rows ``pos .. pos+seq-1``);
- ``lm_head(g, hidden)``: logits ``[n, vocab]`` (float32).

``compile()`` builds ONE graph whose sequence length ``seq`` and position ``pos`` are
symbolic dimensions, so a prefill chunk of many tokens and a one-token decode step run
the same compiled program with different dimension values (no recompilation per token
or prompt length). The returned ``CompiledLM.run(tokens, pos, caches)`` feeds the cache
arrays in and hands the updated ones back.

To add a family (Gemma, ...): subclass ``ModelConfig`` with its hyper-parameters,
subclass ``CausalLM`` with ``from_gguf`` / ``from_folder`` constructors and the three
methods above, and register it in ``lightspeed.models.ARCHITECTURES``.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..graph import Graph
from ..symbolic import sint
from ..tensor import Tensor

if TYPE_CHECKING:
    from ..io import Tokenizer
    from .weights import WeightStore

DEFAULT_MAX_CHUNK = 128  # prompt tokens per prefill call: bounds the activation memory, not the prompt


@dataclass
class ModelConfig:
    """Hyper-parameters every language model has; families subclass it with their own fields."""

    architecture: str       # "llama", "qwen2", "mistral", ...
    vocab_size: int
    hidden_size: int
    n_layers: int
    context_length: int     # the longest context the model was trained for


@dataclass(frozen=True)
class CacheSpec:
    """One KV-cache array: a graph input of this static shape and dtype, and a graph output."""

    name: str
    shape: tuple[int, ...]
    dtype: dt.DType = dt.float32


class CausalLM(ABC):
    """A decoder-only language model: ``config``, ``weights`` (a ``WeightStore``), ``tokenizer``."""

    config: ModelConfig
    weights: "WeightStore"
    tokenizer: "Tokenizer | None"

    @abstractmethod
    def cache_specs(self, ctx: int) -> list[CacheSpec]:
        """The cache arrays for a context bound of ``ctx`` tokens."""

    @abstractmethod
    def forward(self, g: Graph, tokens: Tensor, pos: sint, caches: dict[str, Tensor]
                ) -> tuple[Tensor, dict[str, Tensor]]:
        """Hidden states ``[seq, hidden]`` (after the final norm) and the updated caches."""

    @abstractmethod
    def lm_head(self, g: Graph, hidden: Tensor) -> Tensor:
        """Logits ``[n, vocab]`` (float32) of hidden states ``[n, hidden]``."""

    # one program for prefill and decode -----------------------------------------------------------
    def default_context(self) -> int:
        """The context bound used when none is given: the model's own, capped to keep the cache small."""
        return min(self.config.context_length, 2048)

    def build(self, ctx: int, max_chunk: int = DEFAULT_MAX_CHUNK, last_only: bool = True
              ) -> tuple[Graph, list[Tensor], list[CacheSpec]]:
        """The step graph: inputs ``tokens [seq]`` (int32) and the caches; dims ``seq`` and ``pos``;
        outputs ``[logits, *updated caches]``. ``last_only`` keeps only the last position's logits
        (``[1, vocab]``), which is all generation needs, instead of ``[seq, vocab]``."""
        if ctx < 1 or max_chunk < 1:
            raise ValueError(f"build: ctx ({ctx}) and max_chunk ({max_chunk}) must be positive")
        max_chunk = min(max_chunk, ctx)
        g = Graph()
        seq = sym.dim("seq", 1, max_chunk)
        pos = sym.dim("pos", 0, ctx - 1)
        tokens = g.input("tokens", (seq,), dt.int32)
        specs = self.cache_specs(ctx)
        caches = {s.name: g.input(s.name, s.shape, s.dtype) for s in specs}
        hidden, updated = self.forward(g, tokens, pos, caches)
        if last_only:
            hidden = hidden.shrink([(sym.add(seq, -1), seq), None])
        logits = self.lm_head(g, hidden)
        missing = [s.name for s in specs if s.name not in updated]
        if missing:
            raise ValueError(f"{type(self).__name__}.forward did not return the updated caches {missing}")
        return g, [logits] + [updated[s.name] for s in specs], specs

    def compile(self, ctx: int | None = None, *, max_chunk: int = DEFAULT_MAX_CHUNK, last_only: bool = True,
                backend: str = "c", **options) -> "CompiledLM":
        """Build and compile the step program (see ``build``) for ``backend``."""
        ctx = self.default_context() if ctx is None else int(ctx)
        t0 = time.perf_counter()
        g, outputs, specs = self.build(ctx, max_chunk, last_only)
        t1 = time.perf_counter()
        program = g.compile(outputs, backend=backend, **options)
        t2 = time.perf_counter()
        return CompiledLM(program, specs, ctx, min(max_chunk, ctx), last_only, self.config.vocab_size,
                          build_seconds=t1 - t0, compile_seconds=t2 - t1)


class CompiledLM:
    """A compiled step program: ``run(tokens, pos, caches) -> (logits, updated caches)``."""

    def __init__(self, program, specs: list[CacheSpec], ctx: int, max_chunk: int, last_only: bool, vocab_size: int,
                 build_seconds: float = 0.0, compile_seconds: float = 0.0):
        self.program = program
        self.cache_specs = specs
        self.ctx, self.max_chunk, self.last_only, self.vocab_size = ctx, max_chunk, last_only, vocab_size
        self.build_seconds, self.compile_seconds = build_seconds, compile_seconds

    def new_caches(self) -> dict[str, np.ndarray]:
        """Zeroed cache arrays (zero pages: memory is only touched as the cache fills)."""
        return {s.name: np.zeros(s.shape, dtype=s.dtype.np) for s in self.cache_specs}

    def run(self, tokens, pos: int, caches: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Run ``tokens`` (at most ``max_chunk``) at positions ``pos ..``; returns the logits
        (``[1, vocab]`` or ``[len(tokens), vocab]``) and the updated cache arrays."""
        ids = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        n = ids.shape[0]
        if not 1 <= n <= self.max_chunk:
            raise ValueError(f"run: {n} tokens; a call takes 1 to {self.max_chunk} (split longer inputs)")
        if pos < 0 or pos + n > self.ctx:
            raise ValueError(f"run: positions {pos}..{pos + n - 1} exceed the context bound of {self.ctx} tokens")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError(f"run: token ids must lie in [0, {self.vocab_size}), got {ids.min()}..{ids.max()}")
        outs = self.program(dims={"pos": int(pos)}, tokens=ids, **caches)
        return outs[0], {s.name: o for s, o in zip(self.cache_specs, outs[1:])}


ProgressCallback = Callable[[str], None]
