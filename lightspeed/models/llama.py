"""The Llama family: Llama 2/3, SmolLM2, Mistral (without a sliding window) and Qwen2 (q/k/v biases).

Pre-norm decoder blocks: ``x += o(attention(rope(q), rope(k), v))`` on ``rms_norm(x)``, then
``x += down(silu(gate(h)) * up(h))`` on ``rms_norm(x)``; grouped-query attention over a KV
cache; a final RMS norm and an LM head (tied to the embedding when the file has none).

Weights are read by GGUF names from a GGUF file or a Hugging Face safetensors folder.
One layout difference matters: llama.cpp's converter permutes the rows of the q/k weights
of ``llama`` models so that rotary pairs are adjacent (interleaved RoPE), while Hugging
Face checkpoints (and GGUF ``qwen2``) rotate the two halves of each head. ``rope_interleaved``
records which one the weights expect.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .. import symbolic as sym
from ..frontend import linear, rms_norm, rope, rope_inv_freq, scaled_dot_product_attention, silu
from ..graph import Graph
from ..io import GGUFFile, ModelFolder, ModelFormatError, Tokenizer
from ..io.plausibility import (MAX_CONTEXT, MAX_LAYERS, MAX_VOCAB, REQUIRED, arch_float, arch_int, check_layers,
                               check_shapes, gguf_layer_count, meta_float, meta_int)
from ..symbolic import sint
from ..tensor import Tensor
from .base import CacheSpec, CausalLM, KVAppend, ModelConfig
from .weights import GGUFWeights, SafetensorsWeights

# GGUF-style name -> Hugging Face name ({i} is the layer)
HF_NAMES = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("blk.{i}.attn_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    ("blk.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
    ("blk.{i}.attn_q.weight", "model.layers.{i}.self_attn.q_proj.weight"),
    ("blk.{i}.attn_k.weight", "model.layers.{i}.self_attn.k_proj.weight"),
    ("blk.{i}.attn_v.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    ("blk.{i}.attn_output.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    ("blk.{i}.attn_q.bias", "model.layers.{i}.self_attn.q_proj.bias"),
    ("blk.{i}.attn_k.bias", "model.layers.{i}.self_attn.k_proj.bias"),
    ("blk.{i}.attn_v.bias", "model.layers.{i}.self_attn.v_proj.bias"),
    ("blk.{i}.attn_output.bias", "model.layers.{i}.self_attn.o_proj.bias"),
    ("blk.{i}.ffn_gate.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    ("blk.{i}.ffn_up.weight", "model.layers.{i}.mlp.up_proj.weight"),
    ("blk.{i}.ffn_down.weight", "model.layers.{i}.mlp.down_proj.weight"),
    ("blk.{i}.ffn_gate.bias", "model.layers.{i}.mlp.gate_proj.bias"),
    ("blk.{i}.ffn_up.bias", "model.layers.{i}.mlp.up_proj.bias"),
    ("blk.{i}.ffn_down.bias", "model.layers.{i}.mlp.down_proj.bias"),
]

GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2")
HF_MODEL_TYPES = ("llama", "mistral", "qwen2")

# the file's key of each checked field, for error messages
GGUF_KEYS = {"n_heads": "attention.head_count", "n_kv_heads": "attention.head_count_kv",
             "head_dim": "attention.key_length", "sliding_layers": "attention.sliding_window_pattern",
             "sliding_window": "attention.sliding_window"}
HF_KEYS = {"n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
           "sliding_layers": "layer_types", "sliding_window": "sliding_window"}


@dataclass
class LlamaConfig(ModelConfig):
    intermediate_size: int = 0
    n_heads: int = 0
    n_kv_heads: int = 0
    head_dim: int = 0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_interleaved: bool = False
    rope_inv_freq: np.ndarray | None = field(default=None, repr=False)  # scaled frequencies, when not theta's
    sliding_window: int | None = None  # Mistral v0.1: contexts beyond it are refused

    def check(self, path: str, keys: Mapping[str, str] | None = None) -> None:
        """Raise ModelFormatError for inconsistent hyper-parameters; ``keys`` names the file's key of each
        field in the messages (``GGUF_KEYS`` / ``HF_KEYS``)."""
        key = (keys or {}).get
        if min(self.vocab_size, self.hidden_size, self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim,
               self.intermediate_size) <= 0:
            raise ModelFormatError(path, f"invalid llama hyper-parameters: {self}")
        if self.n_heads % self.n_kv_heads:
            raise ModelFormatError(path, f"{self.n_heads} attention heads ({key('n_heads', 'n_heads')}) are not a "
                                         f"multiple of {self.n_kv_heads} KV heads ({key('n_kv_heads', 'n_kv_heads')})")
        if self.head_dim % 2:
            raise ModelFormatError(path, f"head_dim {self.head_dim} ({key('head_dim', 'head_dim')}) must be even "
                                         "for rotary embeddings")


def llama3_inv_freq(head_dim: int, theta: float, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_context: int) -> np.ndarray:
    """Llama 3.1's scaled RoPE frequencies: long wavelengths divided by ``factor``, short ones kept,
    a smooth blend between."""
    inv = rope_inv_freq(head_dim, theta).astype(np.float64)
    wavelen = 2 * math.pi / inv
    low_wavelen = original_context / low_freq_factor
    high_wavelen = original_context / high_freq_factor
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv / factor + smooth * inv
    out = np.where(wavelen > low_wavelen, inv / factor, np.where(wavelen < high_wavelen, inv, blended))
    return out.astype(np.float32)


def expected_shapes(c: LlamaConfig, weights) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor the model reads, as its hyper-parameters imply (biases where present)."""
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    out = {"token_embd.weight": (c.vocab_size, c.hidden_size), "output_norm.weight": (c.hidden_size,)}
    if "output.weight" in weights:
        out["output.weight"] = (c.vocab_size, c.hidden_size)
    for i in range(c.n_layers):
        layer = {"attn_norm.weight": (c.hidden_size,), "ffn_norm.weight": (c.hidden_size,),
                 "attn_q.weight": (q, c.hidden_size), "attn_k.weight": (kv, c.hidden_size),
                 "attn_v.weight": (kv, c.hidden_size), "attn_output.weight": (c.hidden_size, q),
                 "ffn_gate.weight": (c.intermediate_size, c.hidden_size),
                 "ffn_up.weight": (c.intermediate_size, c.hidden_size),
                 "ffn_down.weight": (c.hidden_size, c.intermediate_size)}
        biases = {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,),
                  "attn_output.bias": (c.hidden_size,), "ffn_gate.bias": (c.intermediate_size,),
                  "ffn_up.bias": (c.intermediate_size,), "ffn_down.bias": (c.hidden_size,)}
        out.update({f"blk.{i}.{k}": v for k, v in layer.items()})
        out.update({f"blk.{i}.{k}": v for k, v in biases.items() if f"blk.{i}.{k}" in weights})
    return out


def _hf_rope(cfg: dict[str, Any], head_dim: int, path: str) -> tuple[float, np.ndarray | None]:
    """(theta, scaled inv_freq or None) from config.json (``rope_theta``/``rope_scaling`` or the
    newer ``rope_parameters``)."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or params
    theta = float(cfg.get("rope_theta", params.get("rope_theta", 10000.0)))
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind in (None, "default"):
        return theta, None
    if kind == "linear":
        return theta, rope_inv_freq(head_dim, theta) / np.float32(scaling["factor"])
    if kind == "llama3":
        return theta, llama3_inv_freq(head_dim, theta, float(scaling["factor"]), float(scaling["low_freq_factor"]),
                                      float(scaling["high_freq_factor"]),
                                      int(scaling["original_max_position_embeddings"]))
    raise ModelFormatError(path, f"RoPE scaling type {kind!r} is not supported (supported: default, linear, llama3)")


class Llama(CausalLM):
    """A Llama-family model (see the module docstring)."""

    def __init__(self, config: LlamaConfig, weights, tokenizer: Tokenizer | None = None):
        self.config, self.weights, self.tokenizer = config, weights, tokenizer
        self.qkv_bias = "blk.0.attn_q.bias" in weights
        self.o_bias = "blk.0.attn_output.bias" in weights
        self.tied = "output.weight" not in weights

    # loading --------------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, gf: GGUFFile, tokenizer: Tokenizer | None = None) -> "Llama":
        arch = gf.architecture
        if arch not in GGUF_ARCHITECTURES:
            raise ModelFormatError(gf.path, f"architecture {arch!r} is not a Llama-family model")
        weights = GGUFWeights(gf)
        # every number is checked as it is read, the layer count against the tensors first (nothing is
        # allocated from the metadata before these checks)
        n_layers = gguf_layer_count(gf, weights.__contains__)
        hidden = arch_int(gf, "embedding_length")
        n_heads = arch_int(gf, "attention.head_count")
        head_dim = arch_int(gf, "attention.key_length", max(hidden // n_heads, 1))
        theta = arch_float(gf, "rope.freq_base", 10000.0)
        vocab = gf.arch("vocab_size", None)
        vocab = weights.shape("token_embd.weight")[0] if vocab is None else arch_int(gf, "vocab_size", hi=MAX_VOCAB)
        inv_freq = None
        scaling = gf.arch("rope.scaling.type", "none")
        if scaling == "linear":
            inv_freq = rope_inv_freq(head_dim, theta) / np.float32(arch_float(gf, "rope.scaling.factor"))
        elif scaling not in ("none", None):
            raise ModelFormatError(gf.path, f"RoPE scaling type {scaling!r} is not supported (supported: linear)")
        if "rope_freqs.weight" in weights:  # Llama 3.1: per-frequency divisors
            check_shapes(gf.path, weights.shape, {"rope_freqs.weight": (head_dim // 2,)}, "the metadata")
            inv_freq = (inv_freq if inv_freq is not None else rope_inv_freq(head_dim, theta)) / \
                weights.numpy("rope_freqs.weight").reshape(-1)
        window = gf.arch("attention.sliding_window", None)
        config = LlamaConfig(
            architecture=arch, vocab_size=vocab, hidden_size=hidden, n_layers=n_layers,
            context_length=arch_int(gf, "context_length", 2048, hi=MAX_CONTEXT),
            intermediate_size=arch_int(gf, "feed_forward_length"), n_heads=n_heads,
            n_kv_heads=arch_int(gf, "attention.head_count_kv", n_heads), head_dim=head_dim,
            rms_norm_eps=arch_float(gf, "attention.layer_norm_rms_epsilon", 1e-5, below=1.0), rope_theta=theta,
            rope_interleaved=arch != "qwen2", rope_inv_freq=inv_freq,
            sliding_window=None if window is None else arch_int(gf, "attention.sliding_window", hi=MAX_CONTEXT))
        config.check(gf.path, {k: f"{arch}.{v}" for k, v in GGUF_KEYS.items()})
        check_shapes(gf.path, weights.shape, expected_shapes(config, weights), "the metadata")
        return cls(config, weights, tokenizer)

    @classmethod
    def from_folder(cls, mf: ModelFolder, tokenizer: Tokenizer | None = None) -> "Llama":
        cfg = mf.config
        kind = cfg.get("model_type")
        if kind not in HF_MODEL_TYPES:
            raise ModelFormatError(mf.path, f"model_type {kind!r} is not a Llama-family model")
        path = os.path.join(mf.path, "config.json")
        weights = SafetensorsWeights(mf, HF_NAMES)

        def num(key: str, default: Any = REQUIRED, **bounds: int) -> int:
            if default is REQUIRED and key not in cfg:
                raise ModelFormatError(path, f"missing field {key!r}")
            return meta_int(path, key, cfg.get(key, default), **bounds)

        try:
            n_layers = num("num_hidden_layers", hi=MAX_LAYERS)
            check_layers(path, "num_hidden_layers", n_layers, lambda i: f"blk.{i}.attn_norm.weight" in weights,
                         "tensor 'model.layers.{i}.input_layernorm.weight'")
            hidden, n_heads = num("hidden_size"), num("num_attention_heads")
            head_dim = num("head_dim") if cfg.get("head_dim") else max(hidden // n_heads, 1)
            theta, inv_freq = _hf_rope(cfg, head_dim, mf.path)
            meta_float(path, "rope_theta", theta)
            if inv_freq is not None and not np.all(np.isfinite(inv_freq) & (inv_freq > 0)):
                raise ModelFormatError(path, f"rope_scaling {cfg.get('rope_scaling')!r} gives non-finite frequencies")
            window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
            config = LlamaConfig(
                architecture=kind, vocab_size=num("vocab_size", hi=MAX_VOCAB), hidden_size=hidden,
                n_layers=n_layers, context_length=num("max_position_embeddings", 2048, hi=MAX_CONTEXT),
                intermediate_size=num("intermediate_size"), n_heads=n_heads,
                n_kv_heads=num("num_key_value_heads") if cfg.get("num_key_value_heads") else n_heads,
                head_dim=head_dim, rms_norm_eps=meta_float(path, "rms_norm_eps", cfg.get("rms_norm_eps", 1e-6),
                                                           below=1.0),
                rope_theta=theta, rope_interleaved=False, rope_inv_freq=inv_freq,
                sliding_window=None if window is None else num("sliding_window", hi=1 << 31))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ModelFormatError):
                raise
            raise ModelFormatError(path, f"missing or invalid field {e}") from None
        config.check(path, HF_KEYS)
        check_shapes(mf.path, weights.shape, expected_shapes(config, weights), "the numbers in config.json",
                     weights.hf_name)
        model = cls(config, weights, tokenizer)
        if cfg.get("tie_word_embeddings") is False and model.tied:
            raise ModelFormatError(mf.path, "config.json says the embeddings are not tied, but lm_head.weight "
                                            "is missing")
        return model

    # the graph ------------------------------------------------------------------------------------
    def default_context(self) -> int:
        ctx = super().default_context()
        return min(ctx, self.config.sliding_window) if self.config.sliding_window else ctx

    def cache_specs(self, ctx: int) -> list[CacheSpec]:
        c = self.config
        window = c.sliding_window
        if window and ctx > window:
            raise ValueError(f"a context of {ctx} tokens exceeds this model's sliding window of {window}; "
                             "sliding-window attention is not implemented, so use ctx <= the window")
        shape = (ctx, c.n_kv_heads, c.head_dim)
        return [CacheSpec(f"{kv}{i}", shape) for i in range(c.n_layers) for kv in ("k", "v")]

    def _w(self, g: Graph, name: str) -> Tensor:
        return self.weights.tensor(g, name)

    def _linear(self, g: Graph, x: Tensor, name: str) -> Tensor:
        """``x @ W.T (+ b)`` for weight ``<name>.weight`` and its bias when the file has one."""
        return linear(x, *self._params(g, name))

    def _params(self, g: Graph, name: str) -> tuple[Tensor, Tensor | None]:
        """The weight of linear layer ``name`` and its bias (None when the file has none)."""
        bias = f"{name}.bias"
        return self.weights.tensor(g, f"{name}.weight"), self.weights.tensor(g, bias) if bias in self.weights else None

    def _rope(self, x: Tensor, pos: sint) -> Tensor:
        c = self.config
        return rope(x, pos=pos, theta=c.rope_theta, interleaved=c.rope_interleaved, inv_freq=c.rope_inv_freq)

    def _layer_key(self) -> tuple:
        """Everything the layer graphs depend on besides their inputs (see ``_memoised``)."""
        c = self.config
        inv = None if c.rope_inv_freq is None else (c.rope_inv_freq.dtype.str, c.rope_inv_freq.shape,
                                                    c.rope_inv_freq.tobytes())
        return (type(self).__qualname__, c.n_heads, c.n_kv_heads, c.head_dim, c.rope_theta.hex()
                if isinstance(c.rope_theta, float) else c.rope_theta, c.rope_interleaved, inv)

    def _memoised(self, g: Graph, key: tuple, inputs: list[Tensor], params: list[tuple[Tensor, Tensor | None]],
                  build):
        """``build(*inputs, params)`` through ``Graph.memoised``: every layer has the same graph over its
        own inputs and weights, so it is built once and replayed (graph construction time)."""
        has_bias = tuple(b is not None for _, b in params)
        flat = list(inputs) + [t for w, b in params for t in (w, b) if t is not None]
        n_in = len(inputs)

        def unflattened(*ts: Tensor):
            rest = list(ts[n_in:])
            pairs = [(rest.pop(0), rest.pop(0) if bias else None) for bias in has_bias]
            return build(*ts[:n_in], pairs)

        return g.memoised(key + (self._layer_key(), has_bias), flat, unflattened)

    def attention(self, g: Graph, h: Tensor, i: int, kv: KVAppend) -> Tensor:
        """Self-attention of layer ``i`` on normed ``h [seq, hidden]``, appending to caches k<i>, v<i>."""
        p = f"blk.{i}."
        qkv = [self._params(g, p + name) for name in ("attn_q", "attn_k", "attn_v")]
        q, k, v = self._memoised(g, ("llama.qkv", kv.pos), [h], qkv, lambda h, ps: self._qkv(h, ps, kv.pos))
        keys = kv.append(f"k{i}", k).permute(1, 0, 2)                           # [kv_heads, total, head_dim]
        values = kv.append(f"v{i}", v).permute(1, 0, 2)
        return self._memoised(g, ("llama.attend", kv.pos, kv.seq, kv.total), [q, keys, values],
                              [self._params(g, p + "attn_output")], lambda *a: self._attend(*a, kv))

    def _qkv(self, h: Tensor, params: list[tuple[Tensor, Tensor | None]], pos: sint) -> tuple[Tensor, Tensor, Tensor]:
        """Rotated queries ``[seq, heads, head_dim]``, rotated keys and values ``[seq, kv_heads, head_dim]``."""
        c = self.config
        seq = h.shape[0]
        q, k, v = (linear(h, w, b) for w, b in params)
        q = self._rope(q.reshape((seq, c.n_heads, c.head_dim)), pos)
        k = self._rope(k.reshape((seq, c.n_kv_heads, c.head_dim)), pos)
        return q, k, v.reshape((seq, c.n_kv_heads, c.head_dim))

    def _attend(self, q: Tensor, keys: Tensor, values: Tensor, params: list[tuple[Tensor, Tensor | None]],
                kv: KVAppend) -> Tensor:
        """The output projection of attention of ``q [seq, heads, head_dim]`` over ``keys``/``values``
        ``[kv_heads, total, head_dim]``, causal in positions."""
        c = self.config
        seq = q.shape[0]
        g = q.graph
        rep = c.n_heads // c.n_kv_heads
        # the query heads that share a KV head are the query rows of one attention problem: row
        # r = s * rep + h is head kv * rep + h at position pos + s, so each block of keys and values is read
        # once for all of them (a decode step has rep rows per KV head instead of one row per head)
        rows = sym.mul(seq, rep)
        grouped = q.reshape((seq, c.n_kv_heads, rep, c.head_dim)).permute(1, 0, 2, 3).contiguous()
        grouped = grouped.reshape((c.n_kv_heads, rows, c.head_dim))
        position = kv.positions.reshape((seq, 1)).expand((seq, rep)).reshape((rows, 1))
        visible = g.iota(kv.total).reshape((1, kv.total)) <= position  # key j <= the row's position
        out = scaled_dot_product_attention(grouped, keys, values, visible)  # [kv_heads, seq * rep, head_dim]
        # dense rows, so the output projection reads them like any activation (and a quantized
        # matmul kernel can take it)
        out = out.reshape((c.n_kv_heads, seq, rep, c.head_dim)).permute(1, 0, 2, 3)
        out = out.reshape((seq, c.n_heads * c.head_dim)).contiguous()
        return linear(out, *params[0])

    def mlp(self, g: Graph, h: Tensor, i: int) -> Tensor:
        p = f"blk.{i}."
        params = [self._params(g, p + name) for name in ("ffn_gate", "ffn_up", "ffn_down")]
        return self._memoised(g, ("llama.mlp",), [h], params, self._mlp)

    @staticmethod
    def _mlp(h: Tensor, params: list[tuple[Tensor, Tensor | None]]) -> Tensor:
        (wg, bg), (wu, bu), (wd, bd) = params
        return linear(silu(linear(h, wg, bg)) * linear(h, wu, bu), wd, bd)

    def forward(self, g: Graph, tokens: Tensor, kv: KVAppend) -> Tensor:
        c = self.config
        x = self.weights.rows(g, "token_embd.weight", tokens)
        for i in range(c.n_layers):
            p = f"blk.{i}."
            x = x + self.attention(g, rms_norm(x, self._w(g, p + "attn_norm.weight"), c.rms_norm_eps), i, kv)
            x = x + self.mlp(g, rms_norm(x, self._w(g, p + "ffn_norm.weight"), c.rms_norm_eps), i)
        return rms_norm(x, self._w(g, "output_norm.weight"), c.rms_norm_eps)

    def lm_head(self, g: Graph, hidden: Tensor) -> Tensor:
        return self._linear(g, hidden, "token_embd" if self.tied else "output")
