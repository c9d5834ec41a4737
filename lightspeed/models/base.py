"""What every language model in ``lightspeed.models`` provides, and how it becomes one program.

A model is a config plus weights that *builds a graph* with the Tensor API. A causal LM
implements three methods and inherits the rest:

- ``cache_specs(ctx)``: the KV-cache arrays it needs for a context bound ``ctx`` (static
  shapes, rows = ``ctx``), each one graph input;
- ``forward(g, tokens, kv)``: hidden states ``[seq, hidden]`` for ``tokens [seq]`` sitting at
  positions ``kv.pos .. kv.pos+seq-1``. For each cache it calls ``kv.append(name, rows)``
  with the new rows ``[seq, ...]`` and gets back every row so far ``[kv.total, ...]`` to attend
  over (``kv.positions`` are the new tokens' positions, for RoPE and causal masks);
- ``lm_head(g, hidden)``: logits ``[n, vocab]`` (float32).

``compile()`` builds ONE graph whose sequence length ``seq`` and position ``pos`` are
symbolic dimensions, so a prefill chunk of many tokens and a one-token decode step run
the same compiled program with different dimension values (no recompilation per token
or prompt length). ``CompiledLM.run(tokens, pos, caches)`` feeds the cache arrays in and
returns the logits and the updated caches. How the cache is updated (``kv_update``):

- ``"scatter"``: the graph writes the new rows into the cache with Scatter at rows
  ``pos .. pos+seq-1`` and outputs the whole updated cache; attention reads that output.
  The cache inputs are donated (``Graph.compile(donate=...)``): the C backend then writes
  the rows into the caller's arrays in place; a backend that does not copies every cache
  on every step.
- ``"rows"``: the graph attends over ``concat(cache[:pos], new rows)`` and outputs
  only the new rows; ``run`` stores them into the cache arrays in place (``seq`` rows per
  cache per call, no copy of the cache). The caches are ``[ctx, kv_heads, head_dim]``.
- ``"heads"`` (the C backend's default, ``default_kv_update``): head-major caches
  ``[kv_heads, ctx, head_dim]``, so attention reads each KV head's keys and values as one
  contiguous run instead of ``head_dim`` of every ``kv_heads * head_dim`` elements (SmolLM2's
  decode attention at position 512 took 0.6x the time, benchmarks/README.md); the graph
  scatters the new rows into the donated caches in place, as ``"scatter"`` does, and
  outputs the caches. The positions are axis 1 (``CompiledLM.cache_row_axis``). The
  serving engine's batched steps (lightspeed.engine.batched, ``head_major``) take the same
  layout, so they share these caches slot by slot.

To add a family (Gemma, ...): subclass ``ModelConfig`` with its hyper-parameters,
subclass ``CausalLM`` with ``from_gguf`` / ``from_folder`` constructors and the three
methods above, and register it in ``lightspeed.models.ARCHITECTURES``.
"""
from __future__ import annotations

import dataclasses
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..frontend import arange, concatenate
from ..graph import Graph
from ..row_step import RowStep
from ..symbolic import sint
from ..tensor import Tensor

if TYPE_CHECKING:
    from ..io import Tokenizer
    from .weights import WeightStore

KV_UPDATES = ("rows", "scatter", "heads")
# the axis of a cache array that holds the positions, by kv_update
CACHE_ROW_AXIS = {"rows": 0, "scatter": 0, "heads": 1}
# the element types a KV cache may be stored in: float16 halves the bytes attention reads per token and
# the caches' memory; the values are rounded once, when their rows are appended
KV_DTYPES = {"float32": dt.float32, "float16": dt.float16}
# the default by evidence (issue 15's rule: the fastest mode whose greedy tokens equal transformers' on the
# parity prompts and whose held-out perplexity stays within 0.5% of float32's; tests/test_activation_default.py):
# on AVX-512 with AMX (Xeon), int16 for calls of up to 8 rows (decode: 1.7-2.1x float's speed on SmolLM2 Q4_1),
# float for prefill (int16 there was 0.86x); on AVX-512 VNNI without AMX (Zen 4) int16 at every row count
# (prefill 1.41x float's); on AVX2, int16 for up to 8 rows and qgemm.h's float kernel beyond (decode 1.5x on Zen
# 1); float elsewhere (backend/c/activations.py); benchmarks/README.md has figures
DEFAULT_ACTIVATIONS = "auto"
# the KV cache's default element type on the CPU, by the same rule (tests/test_activation_default.py):
# float16 keeps the greedy tokens equal to transformers' and the held-out perplexity within 0.01% of float32's,
# is not slower (SmolLM2 Q4_1 decode 1.01x at position 64 and 1.05-1.07x at 512, 8-row batched decode 1.05x /
# 1.18x, prefill 1.00x) and halves the cache's memory; benchmarks/README.md has the figures. kv_dtype="float32"
# (--kv-cache f32) keeps float32. The GPU backends read float16 caches too (tested on OpenCL) but default to
# float32: their speed with them was not measured (see default_kv_dtype)
DEFAULT_KV_DTYPE = "float16"
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
    """One KV-cache array: a graph input of this static shape (rows = the context bound) and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: dt.DType = dt.float32


def kv_dtype_of(kv_dtype: "str | dt.DType") -> dt.DType:
    """The cache element type named by ``kv_dtype`` ("float32" or "float16")."""
    if isinstance(kv_dtype, dt.DType) and kv_dtype in KV_DTYPES.values():
        return kv_dtype
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {tuple(KV_DTYPES)}, got {kv_dtype!r}")
    return KV_DTYPES[kv_dtype]


def default_kv_dtype(backend: str = "c") -> str:
    """The cache element type a step compiled for ``backend`` gets when none is asked for: ``DEFAULT_KV_DTYPE``
    on the C backend and the reference interpreter (which checks what C computes), float32 on the GPU ones."""
    return DEFAULT_KV_DTYPE if backend in ("c", "reference") else "float32"


def default_kv_update(backend: str = "c") -> str:
    """How a step compiled for ``backend`` updates its caches when not asked (see the module docstring):
    head-major caches on the C backend, whose scatter writes donated inputs in place and whose decode
    attention reads them faster; "rows" on the others (their attention was not measured with them)."""
    return "heads" if backend == "c" else "rows"


def head_major(specs: list[CacheSpec]) -> list[CacheSpec]:
    """``specs`` (``[ctx, kv_heads, head_dim]``) as head-major arrays ``[kv_heads, ctx, head_dim]``."""
    return [dataclasses.replace(s, shape=(s.shape[1], s.shape[0]) + s.shape[2:]) for s in specs]


def scatter_head_major(cache: Tensor, base: Tensor, rows: Tensor, ctx: int) -> Tensor:
    """Head-major ``cache`` (``[..., kv_heads, ctx, *rest]``) with ``rows [n, kv_heads, *rest]`` written: row ``i``'s
    head ``h`` at row ``base[i] + h * ctx`` of the cache seen as ``[..., *rest]`` (``base``: the position, plus the
    slot's offset in a batched cache). One Scatter over a contiguous view of the cache, which writes a donated
    cache in place; returns the updated cache in ``cache``'s shape."""
    n, heads, rest = rows.shape[0], rows.shape[1], tuple(rows.shape[2:])
    flat = cache.reshape((-1,) + rest)
    index = base.reshape((n, 1)) + (cache.graph.iota(heads) * ctx).reshape((1, heads))   # [n, kv_heads]
    count = sym.mul(n, heads)
    return flat.scatter(index.reshape((count,)), rows.reshape((count,) + rest)).reshape(cache.shape)


def with_kv_dtype(specs: list[CacheSpec], kv_dtype: "str | dt.DType") -> list[CacheSpec]:
    """``specs`` stored as ``kv_dtype`` (see ``KV_DTYPES``)."""
    d = kv_dtype_of(kv_dtype)
    return [dataclasses.replace(s, dtype=d) for s in specs]


class KVAppend:
    """The caches as a forward pass sees them: ``append(name, rows)`` adds ``rows [seq, ...]`` at
    positions ``pos ..`` and returns all rows ``[total, ...]`` (cached, then new) to attend over.
    It records the graph outputs that carry the update (see ``kv_update`` in the module docstring).
    A cache stored in another type than the rows (float16) gets the rows cast to its type, and attention
    reads every row, new ones included, through a cast back: a row attends the same values whether it
    was appended in this call or read from the cache later."""

    def __init__(self, g: Graph, specs: list[CacheSpec], seq: sint, pos: sint, mode: str = "rows"):
        if mode not in KV_UPDATES:
            raise ValueError(f"kv_update must be one of {KV_UPDATES}, got {mode!r}")
        self.g, self.seq, self.pos, self.mode = g, seq, pos, mode
        self.inputs = {s.name: g.input(s.name, s.shape, s.dtype) for s in specs}
        self.outputs: dict[str, Tensor] = {}
        ctx = specs[0].shape[CACHE_ROW_AXIS[mode]] if specs else sym.add(pos, seq)
        # rows mode reads pos cached rows then seq new ones; scatter and heads slice the updated cache,
        # where the min only keeps the bound provable (run() keeps pos + seq <= ctx)
        self.total: sint = sym.add(pos, seq) if mode == "rows" else sym.smin(sym.add(pos, seq), ctx)

    @property
    def positions(self) -> Tensor:
        """The positions ``pos .. pos+seq-1`` of the new tokens (int32 ``[seq]``)."""
        return arange(self.g, self.pos, sym.add(self.pos, self.seq))

    def append(self, name: str, rows: Tensor) -> Tensor:
        cache = self.inputs[name]
        if name in self.outputs:
            raise ValueError(f"cache {name!r} was appended to twice in one forward pass")
        rest = [None] * (cache.ndim - 1)
        compute = rows.dtype
        rows = rows.cast(cache.dtype)
        if self.mode == "heads":
            updated = scatter_head_major(cache, self.positions, rows, cache.shape[1])
            self.outputs[name] = updated
            every = updated.shrink([None, (0, self.total)] + rest[1:])
            return every.permute(1, 0, *range(2, cache.ndim)).cast(compute)
        if self.mode == "scatter":
            updated = cache.scatter(self.positions, rows)
            self.outputs[name] = updated
            return updated.shrink([(0, self.total)] + rest).cast(compute)
        self.outputs[name] = rows
        # each part is cast on its own, so the attention kernel can read both (cached and new rows)
        # where they are stored and widen them as it loads
        return concatenate([cache.shrink([(0, self.pos)] + rest).cast(compute), rows.cast(compute)], 0)


class CausalLM(ABC):
    """A decoder-only language model: ``config``, ``weights`` (a ``WeightStore``), ``tokenizer``."""

    config: ModelConfig
    weights: "WeightStore"
    tokenizer: "Tokenizer | None"

    @abstractmethod
    def cache_specs(self, ctx: int) -> list[CacheSpec]:
        """The cache arrays for a context bound of ``ctx`` tokens."""

    @abstractmethod
    def forward(self, g: Graph, tokens: Tensor, kv: KVAppend) -> Tensor:
        """Hidden states ``[seq, hidden]`` after the final norm; every cache appended to once."""

    @abstractmethod
    def lm_head(self, g: Graph, hidden: Tensor) -> Tensor:
        """Logits ``[n, vocab]`` (float32) of hidden states ``[n, hidden]``."""

    # one program for prefill and decode -----------------------------------------------------------
    def default_context(self) -> int:
        """The context bound used when none is given: the model's own, capped to keep the cache small."""
        return min(self.config.context_length, 2048)

    def build(self, ctx: int, max_chunk: int = DEFAULT_MAX_CHUNK, last_only: bool = True,
              kv_update: str = "rows", kv_dtype: "str | dt.DType | None" = None,
              ) -> tuple[Graph, list[Tensor], list[CacheSpec]]:
        """The step graph: inputs ``tokens [seq]`` (int32) and the caches; dims ``seq`` and ``pos``;
        outputs ``[logits, *cache updates]``. ``last_only`` keeps only the last position's logits
        (``[1, vocab]``), which is all generation needs, instead of ``[seq, vocab]``. ``kv_dtype``
        ("float32" or "float16", default ``DEFAULT_KV_DTYPE``) is the caches' element type."""
        kv_dtype = DEFAULT_KV_DTYPE if kv_dtype is None else kv_dtype
        if ctx < 1 or max_chunk < 1:
            raise ValueError(f"build: ctx ({ctx}) and max_chunk ({max_chunk}) must be positive")
        max_chunk = min(max_chunk, ctx)
        g = Graph()
        seq = sym.dim("seq", 1, max_chunk)
        pos = sym.dim("pos", 0, ctx - 1)
        tokens = g.input("tokens", (seq,), dt.int32)
        specs = with_kv_dtype(self.cache_specs(ctx), kv_dtype)
        if kv_update == "heads":
            specs = head_major(specs)
        kv = KVAppend(g, specs, seq, pos, kv_update)
        hidden = self.forward(g, tokens, kv)
        if last_only:
            # a dense row, so the LM head reads it like any activation (and a quantized matmul
            # kernel can take it)
            logits = self.lm_head(g, hidden.shrink([(sym.add(seq, -1), seq), None]).contiguous())
        else:
            logits = self.lm_head(g, hidden)
        missing = [s.name for s in specs if s.name not in kv.outputs]
        if missing:
            raise ValueError(f"{type(self).__name__}.forward did not append to the caches {missing}")
        return g, [logits] + [kv.outputs[s.name] for s in specs], specs

    def compile(self, ctx: int | None = None, *, max_chunk: int = DEFAULT_MAX_CHUNK, last_only: bool = True,
                kv_update: str | None = None, kv_dtype: "str | dt.DType | None" = None, backend: str = "c",
                **options) -> "CompiledLM":
        """Build and compile the step program (see ``build``) for ``backend``. The C backend's quantized
        matmuls take activations ``DEFAULT_ACTIVATIONS`` unless ``activations`` (or ``int8_activations``)
        is given; the caches are ``default_kv_dtype(backend)`` unless ``kv_dtype`` is given, and updated as
        ``default_kv_update(backend)`` says unless ``kv_update`` is given."""
        if kv_update is None:
            kv_update = default_kv_update(backend)
        if kv_update == "heads" and backend != "c":
            # run() and the engine keep the caches they pass in: the program must update them in place
            raise ValueError(f"kv_update='heads' needs a backend that updates the donated caches in place (c), "
                             f"not {backend!r}; use kv_update='rows' or 'scatter'")
        if kv_dtype is None:
            kv_dtype = default_kv_dtype(backend)
        if backend == "c" and "activations" not in options and not options.get("int8_activations"):
            options["activations"] = DEFAULT_ACTIVATIONS
        ctx = self.default_context() if ctx is None else int(ctx)
        t0 = time.perf_counter()
        g, outputs, specs = self.build(ctx, max_chunk, last_only, kv_update, kv_dtype)
        t1 = time.perf_counter()
        # scatter and heads donate the caches: a backend that can writes the new rows in place
        donate = [s.name for s in specs] if kv_update in ("scatter", "heads") else []
        program = g.compile(outputs, backend=backend, donate=donate, **options)
        t2 = time.perf_counter()
        return CompiledLM(program, specs, ctx, min(max_chunk, ctx), last_only, self.config.vocab_size, kv_update,
                          build_seconds=t1 - t0, compile_seconds=t2 - t1, activations=options.get("activations"))


class CompiledLM:
    """A compiled step program: ``run(tokens, pos, caches) -> (logits, updated caches)``."""

    def __init__(self, program, specs: list[CacheSpec], ctx: int, max_chunk: int, last_only: bool, vocab_size: int,
                 kv_update: str = "rows", build_seconds: float = 0.0, compile_seconds: float = 0.0,
                 activations: str | None = None):
        self.program = program
        # the quantized matmuls' activation mode it was compiled with (None: the backend's own); a program
        # that shares its caches (serve's batched steps) is compiled with the same, so it computes the same rows
        self.activations = activations
        self.cache_specs = specs
        self.ctx, self.max_chunk, self.last_only, self.vocab_size = ctx, max_chunk, last_only, vocab_size
        self.kv_update = kv_update
        self.build_seconds, self.compile_seconds = build_seconds, compile_seconds
        self._cache_names = tuple(s.name for s in specs)
        self._row_step: RowStep | None = None
        self._row_step_key: tuple = ()
        self._ids_in: dict[str, np.ndarray] = {}

    @property
    def cache_row_axis(self) -> int:
        """The axis of each cache array that holds its positions (1 for head-major caches)."""
        return CACHE_ROW_AXIS[self.kv_update]

    @property
    def kv_dtype(self) -> str:
        """The caches' element type ("float32" or "float16")."""
        return self.cache_specs[0].dtype.name if self.cache_specs else "float32"

    def new_caches(self) -> dict[str, np.ndarray]:
        """Zeroed cache arrays (zero pages: memory is only touched as the cache fills)."""
        return {s.name: np.zeros(s.shape, dtype=s.dtype.np) for s in self.cache_specs}

    def run(self, tokens, pos: int, caches: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Run ``tokens`` (at most ``max_chunk``) at positions ``pos ..``; returns the logits
        (``[1, vocab]`` or ``[len(tokens), vocab]``) and the updated caches: with ``kv_update="rows"``
        the same arrays, written in place; with ``"scatter"`` the program's new arrays; with ``"heads"`` the
        same arrays, updated in place by the program (arrays it cannot update, read-only or not C-contiguous,
        are refused with a ValueError naming them)."""
        ids = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        n = ids.shape[0]
        if not 1 <= n <= self.max_chunk:
            raise ValueError(f"run: {n} tokens; a call takes 1 to {self.max_chunk} (split longer inputs)")
        if type(pos) is not int:
            pos = int(pos)
        if pos < 0 or pos + n > self.ctx:
            raise ValueError(f"run: positions {pos}..{pos + n - 1} exceed the context bound of {self.ctx} tokens")
        lo, hi = (int(ids[0]), int(ids[0])) if n == 1 else (int(ids.min()), int(ids.max()))
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(f"run: token ids must lie in [0, {self.vocab_size}), got {lo}..{hi}")
        if self.kv_update == "scatter":
            outs = self.program(dims={"pos": pos}, tokens=ids, **caches)
            return outs[0], {s.name: o for s, o in zip(self.cache_specs, outs[1:])}
        # rows: the new rows are written straight into the caches (rows pos.. are not read by this step), so a
        # long prompt allocates no second copy of its keys and values; heads: the program writes them in place.
        # Either way the caches are checked once per set of arrays (a RowStep), not on every call
        step = self._row_step_for(caches)
        if step is not None:
            ids_in = self._ids_in
            ids_in["tokens"] = ids
            return step.run(ids_in, {"pos": pos}, pos)[0], caches
        outs = self.program(dims={"pos": pos}, tokens=ids, **caches)  # heads: refuses what it cannot update
        if self.kv_update == "heads":
            return outs[0], caches
        for s, rows in zip(self.cache_specs, outs[1:]):
            caches[s.name][pos:pos + n] = rows
        return outs[0], caches

    def row_writes(self) -> dict[int, str]:
        """The ``writes`` of a ``RowStep`` over this program: output k (1..) into the rows of cache k's array,
        or nothing where the program updates the (donated) caches itself."""
        if self.kv_update == "heads":
            return {}
        return {k: name for k, name in enumerate(self._cache_names, 1)}

    def _row_step_for(self, caches: dict[str, np.ndarray]) -> "RowStep | None":
        """The RowStep over these cache arrays (made when they differ from the last call's), or None where
        they cannot be written in place (read-only or non-contiguous: the caller copies rows instead)."""
        try:
            arrays = tuple(map(caches.__getitem__, self._cache_names))
        except KeyError as e:
            raise ValueError(f"run: the caches have no array {e.args[0]!r}; expected {list(self._cache_names)}") \
                from None
        key = tuple(map(id, arrays))
        if self._row_step is not None and self._row_step_key == key:
            return self._row_step
        if len(caches) != len(arrays):
            raise ValueError(f"run: unexpected cache arrays {sorted(set(caches) - set(self._cache_names))}")
        if not all(a.flags.c_contiguous and a.flags.writeable for a in arrays):
            return None
        ids = np.zeros(1, dtype=np.int32)
        self._row_step = RowStep(self.program, {"tokens": ids, **caches}, writes=self.row_writes(),
                                 varying=["tokens"], dims={"pos": 0})
        self._row_step_key = key  # the RowStep holds the arrays, so their ids stay theirs
        return self._row_step
