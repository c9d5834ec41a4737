"""BERT encoders (all-MiniLM-L6-v2 and other sentence-transformers BERT models) from a
Hugging Face safetensors folder, as one graph with symbolic batch and sequence length.

    enc = Bert.from_folder(load_model_folder(path))
    prog = enc.compile(max_batch=32, max_seq=256)         # one program for every batch and length
    vectors = prog.run(ids, mask)                        # [batch, seq] int32 each -> [batch, hidden]

The encoder: word + position + token-type embeddings (type 0: one sentence per input), a
LayerNorm, then post-norm blocks ``x = LN(x + attention(x))``, ``x = LN(x + ffn(x))`` with
biases everywhere and GELU (erf) in the feed-forward layer. Padding is masked out of the
attention keys. The pooled output is a mean over the real tokens (or the first token,
or a max) and, when the model says so, L2-normalised — all inside the graph.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..frontend import gelu, layer_norm, linear, maximum, relu, scaled_dot_product_attention
from ..graph import Graph
from ..io import ModelFolder, ModelFormatError
from ..io.plausibility import (MAX_CONTEXT, MAX_LAYERS, MAX_VOCAB, REQUIRED, check_layers, check_shapes, meta_float,
                               meta_int)
from ..tensor import Tensor
from .weights import SafetensorsWeights

HF_MODEL_TYPES = ("bert",)
POOLINGS = ("mean", "cls", "max")
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
_PREFIXES = ("", "bert.", "model.")   # BertModel, BertFor* heads, wrapped checkpoints


@dataclass
class BertConfig:
    """A BERT encoder's hyper-parameters (config.json)."""

    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    activation: str = "gelu"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads

    @classmethod
    def from_hf(cls, cfg: dict, path: str) -> "BertConfig":
        if cfg.get("model_type") not in HF_MODEL_TYPES:
            raise ModelFormatError(path, f"model_type {cfg.get('model_type')!r} is not a BERT encoder")
        where = f"{path}/config.json" if not str(path).endswith(".json") else str(path)

        def count(key: str, default=REQUIRED, **bounds) -> int:
            if key not in cfg and default is REQUIRED:
                raise ModelFormatError(where, f"missing field {key!r}")
            return meta_int(where, key, cfg.get(key, default), **bounds)
        c = cls(vocab_size=count("vocab_size", hi=MAX_VOCAB), hidden_size=count("hidden_size"),
                n_layers=count("num_hidden_layers", hi=MAX_LAYERS), n_heads=count("num_attention_heads"),
                intermediate_size=count("intermediate_size"),
                max_positions=count("max_position_embeddings", 512, hi=MAX_CONTEXT),
                type_vocab_size=count("type_vocab_size", 2, hi=MAX_VOCAB),
                layer_norm_eps=meta_float(where, "layer_norm_eps", cfg.get("layer_norm_eps", 1e-12), below=1.0),
                activation=str(cfg.get("hidden_act", "gelu")))
        if c.hidden_size % c.n_heads:
            raise ModelFormatError(where, f"hidden_size {c.hidden_size} is not a multiple of num_attention_heads "
                                          f"{c.n_heads}")
        if c.activation not in ACTIVATIONS:
            raise ModelFormatError(path, f"config.json: hidden_act {c.activation!r} is not supported "
                                         f"(supported: {', '.join(ACTIVATIONS)})")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ModelFormatError(path, f"config.json: position_embedding_type "
                                         f"{cfg.get('position_embedding_type')!r} is not supported (absolute only)")
        return c


class Bert:
    """A BERT encoder over a model folder's weights (memory-mapped)."""

    def __init__(self, config: BertConfig, weights: SafetensorsWeights, prefix: str = ""):
        self.config, self.weights, self.prefix = config, weights, prefix

    @classmethod
    def from_folder(cls, mf: ModelFolder) -> "Bert":
        """The encoder of a Hugging Face BERT folder (config.json + safetensors)."""
        config = BertConfig.from_hf(mf.config, mf.path)
        prefix = next((p for p in _PREFIXES if p + "embeddings.word_embeddings.weight" in mf.tensors), None)
        if prefix is None:
            raise ModelFormatError(mf.path, "no embeddings.word_embeddings.weight tensor (under the prefixes "
                                            f"{', '.join(repr(p) for p in _PREFIXES)})")
        model = cls(config, SafetensorsWeights(mf, []), prefix)
        word = model.weights.shape(prefix + "embeddings.word_embeddings.weight")
        if word != (config.vocab_size, config.hidden_size):
            raise ModelFormatError(mf.path, f"embeddings.word_embeddings.weight has shape {word}, config.json "
                                            f"says ({config.vocab_size}, {config.hidden_size})")
        layer = prefix + "encoder.layer.{i}.attention.self.query.weight"
        check_layers(mf.path, "num_hidden_layers", config.n_layers, lambda i: layer.format(i=i) in mf.tensors, layer)
        h, f = config.hidden_size, config.intermediate_size
        check_shapes(mf.path, lambda n: model.weights.shape(prefix + n), {
            "embeddings.position_embeddings.weight": (config.max_positions, h),
            "encoder.layer.0.attention.self.query.weight": (h, h),
            "encoder.layer.0.intermediate.dense.weight": (f, h),
            "encoder.layer.0.output.dense.weight": (h, f)}, "config.json's sizes")
        return model

    # the graph ------------------------------------------------------------------------------------
    def _w(self, g: Graph, name: str) -> Tensor:
        return self.weights.tensor(g, self.prefix + name)

    def _dense(self, g: Graph, x: Tensor, name: str) -> Tensor:
        return linear(x, self._w(g, name + ".weight"), self._w(g, name + ".bias"))

    def _ln(self, g: Graph, x: Tensor, name: str) -> Tensor:
        return layer_norm(x, self._w(g, name + ".weight"), self._w(g, name + ".bias"), self.config.layer_norm_eps)

    def _act(self, x: Tensor) -> Tensor:
        a = self.config.activation
        return relu(x) if a == "relu" else gelu(x, approximate="none" if a == "gelu" else "tanh")

    def encode(self, g: Graph, ids: Tensor, mask: Tensor) -> Tensor:
        """Hidden states ``[batch, seq, hidden]`` of token ids ``[batch, seq]``; keys where ``mask``
        (bool ``[batch, seq]``) is False are not attended to."""
        c = self.config
        batch, seq = ids.shape
        e = "embeddings."
        x = self.weights.rows(g, self.prefix + e + "word_embeddings.weight", ids)
        x = x + self._w(g, e + "position_embeddings.weight")[0:seq]          # positions 0 .. seq-1
        x = x + self._w(g, e + "token_type_embeddings.weight")[0]            # every token is of type 0
        # the token axis is flat between attentions: [batch * seq, hidden] rows are what the C
        # backend's matrix-product kernels are tiled for
        rows = sym.mul(batch, seq)
        x = self._ln(g, x, e + "LayerNorm").reshape((rows, c.hidden_size))
        keys = mask.reshape((batch, 1, 1, seq))
        heads = lambda t: t.reshape((batch, seq, c.n_heads, c.head_dim)).permute(0, 2, 1, 3)  # noqa: E731
        for i in range(c.n_layers):
            p = f"encoder.layer.{i}."
            q, k, v = (heads(self._dense(g, x, p + "attention.self." + n)) for n in ("query", "key", "value"))
            a = scaled_dot_product_attention(q, k, v, keys)                       # [batch, heads, seq, d]
            a = a.permute(0, 2, 1, 3).reshape((rows, c.hidden_size)).contiguous()
            x = self._ln(g, x + self._dense(g, a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = self._act(self._dense(g, x, p + "intermediate.dense"))
            x = self._ln(g, x + self._dense(g, h, p + "output.dense"), p + "output.LayerNorm")
        return x.reshape((batch, seq, c.hidden_size))

    def build(self, max_batch: int, max_seq: int, pooling: str = "mean",
              normalize: bool = True) -> tuple[Graph, Tensor]:
        """The embedding graph: inputs ``ids`` and ``mask`` (int32 ``[batch, seq]``, mask 1 for real
        tokens, 0 for padding) with symbolic ``batch <= max_batch`` and ``seq <= max_seq``; output
        the pooled (and optionally L2-normalised) embeddings ``[batch, hidden]`` (float32)."""
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if not 1 <= max_seq <= self.config.max_positions:
            raise ValueError(f"max_seq {max_seq} must lie in [1, {self.config.max_positions}] (position embeddings)")
        if max_batch < 1:
            raise ValueError(f"max_batch must be positive, got {max_batch}")
        g = Graph()
        batch, seq = sym.dim("batch", 1, max_batch), sym.dim("seq", 1, max_seq)
        ids = g.input("ids", (batch, seq), dt.int32)
        mask = g.input("mask", (batch, seq), dt.int32)
        real = mask > 0
        h = self.encode(g, ids, real)
        if pooling == "cls":
            pooled = h[:, 0]
        elif pooling == "max":  # padding never wins: it is pushed to a very low value first
            pooled = real.unsqueeze(-1).where(h, -1e9).max(1)
        else:  # mean over the real tokens (at least one per row: a row of padding gives zeros)
            weights = real.cast(dt.float32).unsqueeze(-1)
            pooled = (h * weights).sum(1) / maximum(weights.sum(1), 1e-9)
        if normalize:  # x / max(|x|, eps), as torch.nn.functional.normalize
            norm = (pooled * pooled).sum(-1, keepdim=True).sqrt()
            pooled = pooled / maximum(norm, 1e-12)
        return g, pooled

    def compile(self, max_batch: int = 32, max_seq: int | None = None, *, pooling: str = "mean",
                normalize: bool = True, backend: str = "c", **options) -> "CompiledEncoder":
        """Build and compile the embedding program (see ``build``); ``max_seq`` defaults to the
        number of position embeddings."""
        max_seq = self.config.max_positions if max_seq is None else int(max_seq)
        t0 = time.perf_counter()
        g, out = self.build(max_batch, max_seq, pooling, normalize)
        t1 = time.perf_counter()
        program = g.compile([out], backend=backend, **options)
        return CompiledEncoder(program, max_batch, max_seq, self.config.vocab_size,
                               build_seconds=t1 - t0, compile_seconds=time.perf_counter() - t1)


class CompiledEncoder:
    """A compiled embedding program: ``run(ids, mask) -> [batch, hidden]``."""

    def __init__(self, program, max_batch: int, max_seq: int, vocab_size: int, build_seconds: float = 0.0,
                 compile_seconds: float = 0.0):
        self.program, self.max_batch, self.max_seq, self.vocab_size = program, max_batch, max_seq, vocab_size
        self.build_seconds, self.compile_seconds = build_seconds, compile_seconds

    def run(self, ids, mask) -> np.ndarray:
        """Embeddings of a padded batch: ``ids`` and ``mask`` are ``[batch, seq]`` (mask 1 = token,
        0 = padding), at most ``max_batch`` rows of at most ``max_seq`` tokens."""
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        mask = np.ascontiguousarray(mask, dtype=np.int32)
        if ids.ndim != 2 or ids.shape != mask.shape:
            raise ValueError(f"run: ids {ids.shape} and mask {mask.shape} must be the same [batch, seq] shape")
        b, s = ids.shape
        if not (1 <= b <= self.max_batch and 1 <= s <= self.max_seq):
            raise ValueError(f"run: a batch of {b} x {s} tokens; the program takes 1 to {self.max_batch} rows of "
                             f"1 to {self.max_seq} tokens")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError(f"run: token ids must lie in [0, {self.vocab_size}), got {ids.min()}..{ids.max()}")
        (out,) = self.program(ids=ids, mask=mask)
        return out

