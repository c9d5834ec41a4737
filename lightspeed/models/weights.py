"""Weight stores: a model's tensors by name, turned into graph tensors without copying.

A model asks for weights by their GGUF-style names (``blk.3.attn_q.weight``,
``token_embd.weight``); each store maps those names to its file and hands back
float32-valued graph tensors:

- packed GGUF blocks (Q8_0, Q4_1, Q4_K, ...) become a ``uint8`` constant of the raw
  block bytes decoded by ``quant.dequant_matrix_graph``, so the weight stays packed
  in memory and its decode fuses into the kernel that reads it;
- F32 / F16 / BF16 arrays become constants of the mapped file (a view, no copy),
  cast to float32 inside the graph.

``rows(g, name, ids)`` gathers rows before decoding them (an embedding lookup reads
only the rows it needs, still packed). Constants are cached per graph so a tensor
used twice (tied embeddings) is one constant.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, Protocol

import numpy as np

from .. import dtypes as dt
from ..graph import Graph
from ..io import GGUFFile, ModelFolder, ModelFormatError
from ..quant import QType, block_format, dequant_matrix_graph
from ..tensor import Tensor


class WeightStore(Protocol):
    """What a model needs from its weights (names are GGUF-style)."""

    path: str

    def __contains__(self, name: str) -> bool: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def tensor(self, g: Graph, name: str) -> Tensor: ...

    def rows(self, g: Graph, name: str, ids: Tensor) -> Tensor: ...

    def numpy(self, name: str) -> np.ndarray: ...


class _ConstantCache:
    """One graph constant per (graph, array name): the arrays are views of the mapped file."""

    def __init__(self) -> None:
        self._graph: Graph | None = None
        self._consts: dict[str, Tensor] = {}

    def get(self, g: Graph, key: str, make: Callable[[], Tensor]) -> Tensor:
        if self._graph is not g:
            self._graph, self._consts = g, {}
        t = self._consts.get(key)
        if t is None:
            t = self._consts[key] = make()
        return t


class GGUFWeights:
    """The tensors of a GGUF file (names as stored)."""

    def __init__(self, gf: GGUFFile):
        self.file = gf
        self.path = gf.path
        self._consts = _ConstantCache()

    def __contains__(self, name: str) -> bool:
        return name in self.file.tensors

    def _get(self, name: str):
        try:
            t = self.file.tensors[name]
        except KeyError:
            raise ModelFormatError(self.path, f"missing tensor {name!r}") from None
        if not t.supported:
            raise ModelFormatError(self.path, f"tensor {name!r} has type {t.qtype.name}, which Lightspeed cannot "
                                              f"decode (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K)")
        return t

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._get(name).shape)

    def _packed(self, t) -> bool:
        return t.qtype not in (QType.F32, QType.F16, QType.BF16)

    def _const(self, g: Graph, name: str) -> Tensor:
        t = self._get(name)
        if self._packed(t):
            return self._consts.get(g, name, lambda: g.constant(t.raw, dt.uint8))
        return self._consts.get(g, name, lambda: g.constant(t.numpy(), t.ls_dtype))

    def tensor(self, g: Graph, name: str) -> Tensor:
        t = self._get(name)
        c = self._const(g, name)
        if self._packed(t):
            if len(t.shape) != 2:
                raise ModelFormatError(self.path, f"quantized tensor {name!r} of shape {t.shape} is not a matrix")
            return dequant_matrix_graph(c, t.qtype)
        return c.cast(dt.float32)

    def rows(self, g: Graph, name: str, ids: Tensor) -> Tensor:
        t = self._get(name)
        picked = self._const(g, name).gather(ids)
        if not self._packed(t):
            return picked.cast(dt.float32)
        fmt = block_format(t.qtype)
        flat = picked.reshape((-1, picked.shape[-1]))
        out = dequant_matrix_graph(flat, t.qtype)
        return out.reshape(tuple(ids.shape) + (picked.shape[-1] // fmt.block_bytes * fmt.block_elems,))

    def numpy(self, name: str) -> np.ndarray:
        """The tensor as float32 values (decoded; a new array for packed or half types)."""
        t = self._get(name)
        a = t.numpy() if t.qtype is QType.F32 else t.dequantize()
        return np.asarray(a, dtype=np.float32)


class SafetensorsWeights:
    """The tensors of a Hugging Face folder, looked up by GGUF-style names through ``names``:
    a list of ``(gguf_pattern, hf_pattern)`` pairs where ``{i}`` stands for a layer number."""

    def __init__(self, folder: ModelFolder, names: Iterable[tuple[str, str]]):
        self.folder = folder
        self.path = folder.path
        self._rules = [(re.compile("^" + re.escape(a).replace(r"\{i\}", r"(\d+)") + "$"), b) for a, b in names]
        self._consts = _ConstantCache()

    def hf_name(self, name: str) -> str:
        """The Hugging Face name of a GGUF-style name (the name itself when no rule matches)."""
        for pattern, hf in self._rules:
            m = pattern.match(name)
            if m:
                return hf.replace("{i}", m.group(1)) if m.groups() else hf
        return name

    def __contains__(self, name: str) -> bool:
        return self.hf_name(name) in self.folder.tensors

    def _get(self, name: str):
        hf = self.hf_name(name)
        try:
            t = self.folder.tensors[hf]
        except KeyError:
            raise ModelFormatError(self.path, f"missing tensor {hf!r}") from None
        if t.ls_dtype is None or not t.ls_dtype.is_float:
            raise ModelFormatError(self.path, f"tensor {hf!r} has dtype {t.dtype}; weights must be F32, F16 or BF16")
        return t

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._get(name).shape)

    def _const(self, g: Graph, name: str) -> Tensor:
        t = self._get(name)
        return self._consts.get(g, name, lambda: g.constant(t.numpy(), t.ls_dtype))

    def tensor(self, g: Graph, name: str) -> Tensor:
        return self._const(g, name).cast(dt.float32)

    def rows(self, g: Graph, name: str, ids: Tensor) -> Tensor:
        return self._const(g, name).gather(ids).cast(dt.float32)

    def numpy(self, name: str) -> np.ndarray:
        return np.asarray(self._get(name).to_float32(), dtype=np.float32)
