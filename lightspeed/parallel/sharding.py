"""How a Llama-family model splits across ``world`` ranks (tensor parallelism), and the weights one rank holds.

Attention splits by KV-head groups (a KV head and the query heads that share it stay together), the FFN by
its intermediate columns: q/k/v and gate/up are column-parallel (each rank keeps a contiguous range of their
output rows), o and down are row-parallel (each rank keeps the matching range of their input columns, so
its product is a partial sum of the full output: summing the ranks' partials — the all-reduce — gives it).
Norms, the embedding and the LM head are replicated. Packed weights stay packed: a row range is a view of
the file; an input-column range starts and ends on a block boundary (32 values; 256 for K-quants), copied
once into a contiguous array of that rank's half.

Ranges are as even as the units allow: 3 KV heads over 2 ranks give 2 and 1 (the query heads follow), so a
model whose KV heads do not divide by ``world`` still runs; fewer KV heads than ranks is refused by name.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .. import dtypes as dt
from ..graph import Graph
from ..quant import QType, block_format, dequant_matrix_graph
from ..tensor import Tensor

__all__ = ["ShardPlan", "ShardedWeights", "TensorParallelError", "even_ranges", "shard_config"]

COLUMN_PARALLEL = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")  # output rows split
ROW_PARALLEL = ("attn_output", "ffn_down")                              # input columns split


class TensorParallelError(ValueError):
    """A model cannot be split the way asked (the message names the field)."""


def even_ranges(n: int, parts: int, unit: int = 1) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering ``0..n`` in multiples of ``unit``, as even as the units allow
    (earlier ranges take the remainder)."""
    if n % unit:
        raise TensorParallelError(f"{n} is not a multiple of {unit}")
    units = n // unit
    if units < parts:
        raise TensorParallelError(f"{units} units of {unit} cannot be split over {parts} ranks")
    base, extra = divmod(units, parts)
    out, start = [], 0
    for r in range(parts):
        size = (base + (r < extra)) * unit
        out.append((start, start + size))
        start += size
    return out


@dataclass(frozen=True)
class ShardPlan:
    """Rank ``rank`` of ``world``: its KV heads ``kv`` (a range), query heads ``heads``, FFN columns ``ffn``."""

    world: int
    rank: int
    kv: tuple[int, int]
    heads: tuple[int, int]
    ffn: tuple[int, int]
    head_dim: int

    @classmethod
    def for_config(cls, config, world: int, rank: int, ffn_unit: int = 32) -> "ShardPlan":
        """The plan of ``rank`` for a Llama config; ``ffn_unit`` is the block size the FFN columns must keep
        (the largest block of the down projection's type)."""
        if world < 1 or not 0 <= rank < world:
            raise TensorParallelError(f"rank {rank} of {world} ranks")
        if config.n_kv_heads < world:
            raise TensorParallelError(f"the model has {config.n_kv_heads} KV heads (attention.head_count_kv), "
                                      f"fewer than the {world} ranks asked for: each rank needs one")
        rep = config.n_heads // config.n_kv_heads
        kv = even_ranges(config.n_kv_heads, world)[rank]
        try:
            ffn = even_ranges(config.intermediate_size, world, ffn_unit)[rank]
        except TensorParallelError as e:
            raise TensorParallelError(f"the FFN width {config.intermediate_size} (feed_forward_length) cannot be "
                                      f"split over {world} ranks at blocks of {ffn_unit}: {e}") from None
        return cls(world, rank, kv, (kv[0] * rep, kv[1] * rep), ffn, config.head_dim)

    @property
    def q_columns(self) -> tuple[int, int]:
        """This rank's range of the attention output's input columns (its query heads' values)."""
        return self.heads[0] * self.head_dim, self.heads[1] * self.head_dim

    def rows_of(self, kind: str) -> tuple[int, int]:
        """The output-row range of a column-parallel weight ``kind`` (attn_q, attn_k, ...)."""
        d = self.head_dim
        return {"attn_q": self.q_columns, "attn_k": (self.kv[0] * d, self.kv[1] * d),
                "attn_v": (self.kv[0] * d, self.kv[1] * d), "ffn_gate": self.ffn, "ffn_up": self.ffn}[kind]

    def columns_of(self, kind: str) -> tuple[int, int]:
        """The input-column range of a row-parallel weight ``kind`` (attn_output, ffn_down)."""
        return {"attn_output": self.q_columns, "ffn_down": self.ffn}[kind]


def shard_config(config, plan: ShardPlan):
    """The config one rank's layers see: its heads and FFN columns."""
    return dataclasses.replace(config, n_heads=plan.heads[1] - plan.heads[0], n_kv_heads=plan.kv[1] - plan.kv[0],
                               intermediate_size=plan.ffn[1] - plan.ffn[0])


def _kind(name: str) -> tuple[str | None, str]:
    """(projection kind or None, "weight" | "bias") of a GGUF-style tensor name."""
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in COLUMN_PARALLEL + ROW_PARALLEL:
        return parts[2], parts[3]
    return None, parts[-1]


class ShardedWeights:
    """The weights one rank reads (see the module docstring): the same names as the full store, the shapes of
    its shard. Wraps a GGUF store (``GGUFWeights``); ``sharded_bytes`` counts the bytes of the split weights
    this rank holds."""

    def __init__(self, full, plan: ShardPlan):
        if not hasattr(full, "file"):
            raise TensorParallelError("tensor parallelism reads GGUF files (a model folder is not supported yet)")
        self.full, self.plan, self.path = full, plan, full.path
        self._graph: Graph | None = None
        self._cache: dict[str, Tensor] = {}
        self._arrays: dict[str, np.ndarray] = {}

    def __contains__(self, name: str) -> bool:
        if name in self.full and self._kind_bias_dropped(name):
            return False
        return name in self.full

    def _kind_bias_dropped(self, name: str) -> bool:
        # a row-parallel bias is added once: by rank 0 (the others would add it again in the all-reduce)
        kind, part = _kind(name)
        return kind in ROW_PARALLEL and part == "bias" and self.plan.rank != 0

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._array(name)[1])

    def _tensor(self, name: str):
        try:
            return self.full.file.tensors[name]
        except KeyError:
            raise TensorParallelError(f"{self.path}: missing tensor {name!r}") from None

    def _array(self, name: str) -> tuple[np.ndarray, tuple[int, ...], QType]:
        """(this rank's stored array — raw blocks for packed types —, its logical shape, the type)."""
        tensor = self._tensor(name)
        kind, part = _kind(name)
        shape = tuple(tensor.shape)
        stored = tensor.numpy()  # raw blocks for packed types; a view of the file either way
        if kind is None:
            return stored, shape, tensor.qtype
        if kind in COLUMN_PARALLEL:
            a, b = self.plan.rows_of(kind)
            return stored[a:b], (b - a,) + shape[1:], tensor.qtype  # whole rows: still a view of the file
        if part == "bias":  # of a row-parallel projection: the full output's bias (rank 0 adds it)
            return stored, shape, tensor.qtype
        a, b = self.plan.columns_of(kind)
        unit, nbytes = _block(tensor.qtype)
        if a % unit or b % unit:
            raise TensorParallelError(f"{name} ({tensor.qtype.name}) cannot be split at columns {a}..{b}: its "
                                      f"blocks hold {unit} values")
        part_array = self._arrays.get(name)
        if part_array is None:  # an input-column range: one contiguous copy of this rank's part
            part_array = self._arrays[name] = np.ascontiguousarray(stored[:, a // unit * nbytes:b // unit * nbytes])
        return part_array, (shape[0], b - a), tensor.qtype

    def _const(self, g: Graph, name: str) -> Tensor:
        if self._graph is not g:  # constants of one graph at a time (as the full stores keep them)
            self._graph, self._cache = g, {}
        c = self._cache.get(name)
        if c is None:
            c = self._cache[name] = g.constant(self._array(name)[0], self._tensor(name).ls_dtype)
        return c

    def tensor(self, g: Graph, name: str) -> Tensor:
        if self._kind_bias_dropped(name):
            raise TensorParallelError(f"{name} is added by rank 0 only")
        qtype = self._tensor(name).qtype
        c = self._const(g, name)
        if qtype in _PLAIN:
            return c.cast(dt.float32)
        return dequant_matrix_graph(c, qtype)

    def rows(self, g: Graph, name: str, ids: Tensor) -> Tensor:
        if _kind(name)[0] is not None:
            raise TensorParallelError(f"rows() of the split weight {name}")
        return self.full.rows(g, name, ids)

    def numpy(self, name: str) -> np.ndarray:
        return self.full.numpy(name)

    def sharded_bytes(self) -> int:
        """Bytes of this rank's shards of the split weights (q/k/v/o, gate/up/down of every layer)."""
        total = 0
        for name in self.full.file.tensors:
            if _kind(name)[0] is not None and not self._kind_bias_dropped(name):
                total += self._array(name)[0].nbytes
        return total


_PLAIN = {QType.F32: dt.float32, QType.F16: dt.float16, QType.BF16: dt.bfloat16}


def _block(qtype: QType) -> tuple[int, int]:
    """(values per block, bytes per block) of a type (1 and the element size for plain types)."""
    if qtype in _PLAIN:
        return 1, _PLAIN[qtype].itemsize
    fmt = block_format(qtype)
    return fmt.block_elems, fmt.block_bytes
