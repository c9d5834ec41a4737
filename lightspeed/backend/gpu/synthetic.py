"""Llama-shaped models with random Q8_0 weights, built in memory (no file): the GPU check's 8B-shaped
model, and the compile test's layers of it.

Every matrix is distinct random Q8_0 bytes (its own array, so its own device buffer: a decode step reads
every weight byte once, as a real model's does); the scale of each block of 32 is set so that a matrix
times a unit vector stays about unit-sized through the layers. Norm weights are ones. The token embedding
and the output matrix are separate (untied), as in Llama 3.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import dtypes as dt
from ...graph import Graph
from ...models.llama import Llama, LlamaConfig
from ...quant import QType, block_format, dequant_matrix_graph
from ...tensor import Tensor

Q8_BLOCK, Q8_BYTES = 32, 34  # elements and bytes of a Q8_0 block (a float16 scale, 32 int8)


@dataclass(frozen=True)
class LlamaShape:
    """The hyper-parameters a synthetic Llama is built with."""
    vocab: int
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    context: int = 8192
    rope_theta: float = 500000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


LLAMA3_8B = LlamaShape(vocab=128256, hidden=4096, ffn=14336, layers=32, heads=32, kv_heads=8)


def matrix_shapes(s: LlamaShape) -> dict[str, tuple[int, int]]:
    """Every quantized matrix of the model, by GGUF name: (out features, in features)."""
    kv = s.kv_heads * s.head_dim
    shapes = {"token_embd.weight": (s.vocab, s.hidden), "output.weight": (s.vocab, s.hidden)}
    for i in range(s.layers):
        shapes.update({f"blk.{i}.attn_q.weight": (s.hidden, s.hidden), f"blk.{i}.attn_k.weight": (kv, s.hidden),
                       f"blk.{i}.attn_v.weight": (kv, s.hidden), f"blk.{i}.attn_output.weight": (s.hidden, s.hidden),
                       f"blk.{i}.ffn_gate.weight": (s.ffn, s.hidden), f"blk.{i}.ffn_up.weight": (s.ffn, s.hidden),
                       f"blk.{i}.ffn_down.weight": (s.hidden, s.ffn)})
    return shapes


def random_q8_0(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q8_0 bytes of a (rows, cols) matrix: uint8 (rows, cols / 32 * 34)."""
    if cols % Q8_BLOCK:
        raise ValueError(f"a Q8_0 matrix needs columns in multiples of {Q8_BLOCK}, got {cols}")
    blocks = rng.integers(0, 256, size=(rows, cols // Q8_BLOCK, Q8_BYTES), dtype=np.uint8)
    # int8 values are ~uniform in [-128, 127] (std ~74): a scale of 1 / (74 sqrt(cols)) keeps W x ~ |x|
    scale = np.float16(1.0 / (74.0 * np.sqrt(cols)))
    blocks[:, :, :2] = np.frombuffer(scale.tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


class RandomQ8Weights:
    """A ``WeightStore`` (models/weights.py) of random Q8_0 matrices and unit norms, made on first use.
    ``random=False`` makes zero bytes instead (untouched pages: no memory until read), for building a
    graph whose kernels are compiled but never run."""

    def __init__(self, shape: LlamaShape, seed: int = 0, random: bool = True):
        self.random = random
        self.model_shape = shape
        self.matrices = matrix_shapes(shape)
        self.norms = {"output_norm.weight"} | {f"blk.{i}.{n}.weight" for i in range(shape.layers)
                                                 for n in ("attn_norm", "ffn_norm")}
        self.rng = np.random.default_rng(seed)
        self.raw: dict[str, np.ndarray] = {}
        self._nodes: dict[tuple[int, str], Tensor] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.matrices or name in self.norms

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.matrices:
            return self.matrices[name]
        if name in self.norms:
            return (self.model_shape.hidden,)
        raise KeyError(f"synthetic Llama: no tensor {name!r}")

    def _bytes(self, name: str) -> np.ndarray:
        if name not in self.raw:
            rows, cols = self.matrices[name]
            self.raw[name] = random_q8_0(rows, cols, self.rng) if self.random else \
                np.zeros((rows, cols // Q8_BLOCK * Q8_BYTES), np.uint8)
        return self.raw[name]

    def _const(self, g: Graph, name: str) -> Tensor:
        key = (id(g), name)
        if key not in self._nodes:
            if name in self.norms:
                self._nodes[key] = g.constant(np.ones(self.model_shape.hidden, np.float32))
            else:
                self._nodes[key] = g.constant(self._bytes(name), dt.uint8)
        return self._nodes[key]

    def tensor(self, g: Graph, name: str) -> Tensor:
        c = self._const(g, name)
        return c if name in self.norms else dequant_matrix_graph(c, QType.Q8_0)

    def rows(self, g: Graph, name: str, ids: Tensor) -> Tensor:
        picked = self._const(g, name).gather(ids)
        flat = picked.reshape((-1, picked.shape[-1]))
        fmt = block_format(QType.Q8_0)
        out = dequant_matrix_graph(flat, QType.Q8_0)
        return out.reshape(tuple(ids.shape) + (picked.shape[-1] // fmt.block_bytes * fmt.block_elems,))

    def numpy(self, name: str) -> np.ndarray:
        raise NotImplementedError("synthetic Llama: weights are only available as graph constants")

    def bytes_per_token(self) -> int:
        """Weight bytes a decode step reads: every matrix once, one row of the embedding table."""
        s = self.model_shape
        total = sum(r * c // Q8_BLOCK * Q8_BYTES for r, c in self.matrices.values())
        total -= (s.vocab - 1) * s.hidden // Q8_BLOCK * Q8_BYTES  # the embedding: one row is gathered
        return total + 4 * s.hidden * len(self.norms)


def synthetic_llama(shape: LlamaShape = LLAMA3_8B, seed: int = 0, random: bool = True) -> Llama:
    """A Llama of ``shape`` with random Q8_0 weights (made as the graph is built; no tokenizer);
    ``random=False``: zero weights that take no memory (see RandomQ8Weights)."""
    config = LlamaConfig(architecture="llama", vocab_size=shape.vocab, hidden_size=shape.hidden,
                         n_layers=shape.layers, context_length=shape.context, intermediate_size=shape.ffn,
                         n_heads=shape.heads, n_kv_heads=shape.kv_heads, head_dim=shape.head_dim,
                         rope_theta=shape.rope_theta)
    config.check("synthetic llama")
    return Llama(config, RandomQ8Weights(shape, seed, random))
