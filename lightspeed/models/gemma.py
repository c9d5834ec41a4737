"""Gemma 3 (the text model): a Llama-like decoder with Gemma's own details.

Per layer, with ``norm`` an RMS norm and both residual branches normed before and after::

    x += post_attention_norm(attention(attn_norm(x)))
    x += post_ffw_norm(down(gelu_tanh(gate(h)) * up(h)))      h = ffn_norm(x)

and, unlike Llama:

- token embeddings are multiplied by ``sqrt(hidden_size)``;
- RMS norms scale by ``1 + weight``. llama.cpp's converter stores ``1 + weight`` in the GGUF
  already (its norm weights sit around 1), Hugging Face checkpoints store ``weight`` (around 0),
  so ``norm_offset`` is 0 for GGUF and 1 for safetensors;
- q and k are RMS-normed per head (``attn_q_norm``/``attn_k_norm``) before RoPE (rotate-half
  layout in both formats);
- attention scores are scaled by ``query_pre_attn_scalar ** -0.5`` (not always ``head_dim``);
- layers alternate between sliding-window ("local") attention, where a query at position
  ``p`` sees keys ``p - window < j <= p`` and RoPE uses ``rope_local_theta`` (10 000), and
  global attention with ``rope_theta`` (1 000 000) and any RoPE scaling; by default every 6th
  layer is global;
- tied embeddings (the LM head is the embedding matrix), and optional final logit
  soft-capping ``cap * tanh(logits / cap)``. Gemma 3 configures none; its configs may carry an
  ``attn_logit_softcapping`` (a Gemma 2 feature) that transformers' and llama.cpp's Gemma 3
  ignore, and so does this model.

Every layer's KV cache holds ``ctx`` rows, sliding or not: the window is a mask, so one
program serves every position (the memory a ring buffer would save is small at ctx <= 2048).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..frontend import gelu, linear, rms_norm, rope, rope_inv_freq, scaled_dot_product_attention, tanh
from .. import symbolic as sym
from ..graph import Graph
from ..io import GGUFFile, ModelFolder, ModelFormatError, Tokenizer
from ..io.plausibility import (MAX_CONTEXT, MAX_LAYERS, MAX_VOCAB, REQUIRED, arch_float, arch_int, check_layers,
                               check_shapes, gguf_layer_count, meta_float, meta_int)
from ..tensor import Tensor
from .base import CacheSpec, CausalLM, KVAppend, ModelConfig
from .weights import GGUFWeights, SafetensorsWeights

GGUF_ARCHITECTURES = ("gemma3",)
HF_MODEL_TYPES = ("gemma3_text", "gemma3")
DEFAULT_SLIDING_PATTERN = 6     # layers i with (i + 1) % 6 == 0 are global
DEFAULT_LOCAL_THETA = 10000.0   # not stored in GGUF files; llama.cpp and transformers use this

# GGUF-style name -> Hugging Face name within the text model ({i} is the layer)
_HF_LAYER_NAMES = [
    ("token_embd.weight", "embed_tokens.weight"),
    ("output_norm.weight", "norm.weight"),
    ("blk.{i}.attn_norm.weight", "layers.{i}.input_layernorm.weight"),
    ("blk.{i}.post_attention_norm.weight", "layers.{i}.post_attention_layernorm.weight"),
    ("blk.{i}.ffn_norm.weight", "layers.{i}.pre_feedforward_layernorm.weight"),
    ("blk.{i}.post_ffw_norm.weight", "layers.{i}.post_feedforward_layernorm.weight"),
    ("blk.{i}.attn_q.weight", "layers.{i}.self_attn.q_proj.weight"),
    ("blk.{i}.attn_k.weight", "layers.{i}.self_attn.k_proj.weight"),
    ("blk.{i}.attn_v.weight", "layers.{i}.self_attn.v_proj.weight"),
    ("blk.{i}.attn_output.weight", "layers.{i}.self_attn.o_proj.weight"),
    ("blk.{i}.attn_q_norm.weight", "layers.{i}.self_attn.q_norm.weight"),
    ("blk.{i}.attn_k_norm.weight", "layers.{i}.self_attn.k_norm.weight"),
    ("blk.{i}.ffn_gate.weight", "layers.{i}.mlp.gate_proj.weight"),
    ("blk.{i}.ffn_up.weight", "layers.{i}.mlp.up_proj.weight"),
    ("blk.{i}.ffn_down.weight", "layers.{i}.mlp.down_proj.weight"),
]
# where the text model's tensors live: Gemma3ForCausalLM, and the two layouts of the
# multimodal Gemma3ForConditionalGeneration (original checkpoints, transformers >= 4.52)
_HF_PREFIXES = ("model.", "language_model.model.", "model.language_model.")

# the file's key of each checked field, for error messages
GGUF_KEYS = {"n_heads": "attention.head_count", "n_kv_heads": "attention.head_count_kv",
             "head_dim": "attention.key_length", "sliding_layers": "attention.sliding_window_pattern",
             "sliding_window": "attention.sliding_window"}
HF_KEYS = {"n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
           "sliding_layers": "layer_types", "sliding_window": "sliding_window"}


@dataclass
class GemmaConfig(ModelConfig):
    intermediate_size: int = 0
    n_heads: int = 0
    n_kv_heads: int = 0
    head_dim: int = 0
    rms_norm_eps: float = 1e-6
    norm_offset: float = 0.0                # added to every RMS-norm weight (see the module docstring)
    query_pre_attn_scalar: float = 0.0      # scores are scaled by its inverse square root
    rope_theta: float = 1_000_000.0         # global layers
    rope_local_theta: float = DEFAULT_LOCAL_THETA
    rope_global_inv_freq: np.ndarray | None = field(default=None, repr=False)  # scaled global frequencies
    sliding_window: int = 0
    sliding_layers: tuple[bool, ...] = ()   # per layer: True = sliding-window (local) attention
    final_logit_softcap: float | None = None

    def check(self, path: str, keys: Mapping[str, str] | None = None) -> None:
        """Raise ModelFormatError for inconsistent hyper-parameters; ``keys`` names the file's key of each
        field in the messages (``GGUF_KEYS`` / ``HF_KEYS``)."""
        key = (keys or {}).get
        if min(self.vocab_size, self.hidden_size, self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim,
               self.intermediate_size) <= 0 or self.query_pre_attn_scalar <= 0:
            raise ModelFormatError(path, f"invalid gemma hyper-parameters: {self}")
        if self.n_heads % self.n_kv_heads:
            raise ModelFormatError(path, f"{self.n_heads} attention heads ({key('n_heads', 'n_heads')}) are not a "
                                         f"multiple of {self.n_kv_heads} KV heads ({key('n_kv_heads', 'n_kv_heads')})")
        if self.head_dim % 2:
            raise ModelFormatError(path, f"head_dim {self.head_dim} ({key('head_dim', 'head_dim')}) must be even "
                                         "for rotary embeddings")
        if len(self.sliding_layers) != self.n_layers:
            raise ModelFormatError(path, f"{len(self.sliding_layers)} sliding-window flags "
                                         f"({key('sliding_layers', 'sliding_layers')}) for {self.n_layers} layers")
        if any(self.sliding_layers) and self.sliding_window < 1:
            raise ModelFormatError(path, f"sliding-window layers need a positive sliding_window "
                                         f"({key('sliding_window', 'sliding_window')}), got {self.sliding_window}")


def expected_shapes(c: GemmaConfig, weights) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor the model reads, as its hyper-parameters imply."""
    q, kv, h, f = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.hidden_size, c.intermediate_size
    out = {"token_embd.weight": (c.vocab_size, h), "output_norm.weight": (h,)}
    if "output.weight" in weights:
        out["output.weight"] = (c.vocab_size, h)
    layer = {"attn_norm.weight": (h,), "post_attention_norm.weight": (h,), "ffn_norm.weight": (h,),
             "post_ffw_norm.weight": (h,), "attn_q.weight": (q, h), "attn_k.weight": (kv, h), "attn_v.weight": (kv, h),
             "attn_output.weight": (h, q), "attn_q_norm.weight": (c.head_dim,), "attn_k_norm.weight": (c.head_dim,),
             "ffn_gate.weight": (f, h), "ffn_up.weight": (f, h), "ffn_down.weight": (h, f)}
    for i in range(c.n_layers):
        out.update({f"blk.{i}.{k}": v for k, v in layer.items()})
    return out


def sliding_pattern(n_layers: int, pattern: int) -> tuple[bool, ...]:
    """Gemma's layer pattern: every ``pattern``-th layer is global, the others slide."""
    return tuple(bool((i + 1) % pattern) for i in range(n_layers))


def _gguf_sliding_layers(gf: GGUFFile, n_layers: int) -> tuple[bool, ...]:
    """The sliding flags: ``attention.sliding_window_pattern`` as a period or per-layer flags, else
    the Gemma 3 default (llama.cpp does the same for files without the key)."""
    value = gf.arch("attention.sliding_window_pattern", DEFAULT_SLIDING_PATTERN)
    if isinstance(value, list):
        if len(value) != n_layers:
            raise ModelFormatError(gf.path, f"attention.sliding_window_pattern has {len(value)} entries for "
                                            f"{n_layers} layers")
        return tuple(bool(v) for v in value)
    if not isinstance(value, int) or value < 1:
        raise ModelFormatError(gf.path, f"attention.sliding_window_pattern must be a positive integer, got {value!r}")
    return sliding_pattern(n_layers, value)


def _hf_rope(cfg: dict[str, Any], head_dim: int, path: str) -> tuple[float, float, np.ndarray | None]:
    """(global theta, local theta, scaled global inv_freq or None) from a Gemma 3 config: the
    per-layer-type ``rope_parameters`` of transformers 5, or ``rope_theta``/``rope_local_base_freq``/
    ``rope_scaling`` of older configs."""
    params = cfg.get("rope_parameters") or {}
    full = params.get("full_attention") if isinstance(params.get("full_attention"), dict) else None
    local = params.get("sliding_attention") if isinstance(params.get("sliding_attention"), dict) else None
    if full is None:  # not split by layer type: the old keys, or one dict for the global layers
        full = dict(params) if params else dict(cfg.get("rope_scaling") or {})
        full.setdefault("rope_theta", cfg.get("rope_theta", 1_000_000.0))
    theta = float(full.get("rope_theta", cfg.get("rope_theta", 1_000_000.0)))
    local_theta = float((local or {}).get("rope_theta", cfg.get("rope_local_base_freq", DEFAULT_LOCAL_THETA)))
    kind = full.get("rope_type", full.get("type", "default"))
    if local and local.get("rope_type", "default") != "default":
        raise ModelFormatError(path, f"RoPE scaling {local.get('rope_type')!r} on sliding layers is not supported")
    if kind in (None, "default"):
        return theta, local_theta, None
    if kind == "linear":
        return theta, local_theta, rope_inv_freq(head_dim, theta) / np.float32(full["factor"])
    raise ModelFormatError(path, f"RoPE scaling type {kind!r} is not supported for gemma (supported: default, linear)")


class Gemma(CausalLM):
    """A Gemma 3 text model (see the module docstring)."""

    def __init__(self, config: GemmaConfig, weights, tokenizer: Tokenizer | None = None):
        self.config, self.weights, self.tokenizer = config, weights, tokenizer
        self.tied = "output.weight" not in weights

    # loading --------------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, gf: GGUFFile, tokenizer: Tokenizer | None = None) -> "Gemma":
        arch = gf.architecture
        if arch not in GGUF_ARCHITECTURES:
            raise ModelFormatError(gf.path, f"architecture {arch!r} is not a Gemma 3 model")
        weights = GGUFWeights(gf)
        # every number is checked as it is read, the layer count against the tensors first
        n_layers = gguf_layer_count(gf, weights.__contains__)
        hidden = arch_int(gf, "embedding_length")
        n_heads = arch_int(gf, "attention.head_count")
        head_dim = arch_int(gf, "attention.key_length", max(hidden // n_heads, 1))
        if arch_int(gf, "attention.value_length", head_dim) != head_dim:
            raise ModelFormatError(gf.path, "gemma3 needs attention.key_length == attention.value_length")
        theta = arch_float(gf, "rope.freq_base", 1_000_000.0)
        inv_freq = None
        scaling = gf.arch("rope.scaling.type", "none")
        if scaling == "linear":  # global layers only, as llama.cpp applies it
            inv_freq = rope_inv_freq(head_dim, theta) / np.float32(arch_float(gf, "rope.scaling.factor"))
        elif scaling not in ("none", None):
            raise ModelFormatError(gf.path, f"RoPE scaling type {scaling!r} is not supported (supported: linear)")
        vocab = gf.arch("vocab_size", None)
        vocab = weights.shape("token_embd.weight")[0] if vocab is None else arch_int(gf, "vocab_size", hi=MAX_VOCAB)
        # GGUF has no query_pre_attn_scalar: like llama.cpp, 27B (62 layers) scales by hidden / heads,
        # every other size by head_dim
        scalar = hidden / n_heads if n_layers == 62 else head_dim
        cap = gf.arch("final_logit_softcapping", None)
        config = GemmaConfig(
            architecture=arch, vocab_size=vocab, hidden_size=hidden, n_layers=n_layers,
            context_length=arch_int(gf, "context_length", 8192, hi=MAX_CONTEXT),
            intermediate_size=arch_int(gf, "feed_forward_length"), n_heads=n_heads,
            n_kv_heads=arch_int(gf, "attention.head_count_kv", n_heads), head_dim=head_dim,
            rms_norm_eps=arch_float(gf, "attention.layer_norm_rms_epsilon", 1e-6, below=1.0), norm_offset=0.0,
            query_pre_attn_scalar=float(scalar), rope_theta=theta, rope_global_inv_freq=inv_freq,
            sliding_window=arch_int(gf, "attention.sliding_window", 0, lo=0, hi=1 << 31),
            sliding_layers=_gguf_sliding_layers(gf, n_layers),
            final_logit_softcap=None if cap is None else arch_float(gf, "final_logit_softcapping"))
        config.check(gf.path, {k: f"{arch}.{v}" for k, v in GGUF_KEYS.items()})
        check_shapes(gf.path, weights.shape, expected_shapes(config, weights), "the metadata")
        return cls(config, weights, tokenizer)

    @classmethod
    def from_folder(cls, mf: ModelFolder, tokenizer: Tokenizer | None = None) -> "Gemma":
        cfg = mf.config
        kind = cfg.get("model_type")
        if kind not in HF_MODEL_TYPES:
            raise ModelFormatError(mf.path, f"model_type {kind!r} is not a Gemma 3 model")
        if kind == "gemma3":  # the multimodal model: its text part
            cfg = cfg.get("text_config")
            if not isinstance(cfg, dict):
                raise ModelFormatError(mf.path, "config.json: model_type gemma3 without a text_config")
        path = os.path.join(mf.path, "config.json")
        prefix = next((p for p in _HF_PREFIXES if p + "embed_tokens.weight" in mf.tensors), None)
        if prefix is None:
            raise ModelFormatError(mf.path, "no embed_tokens.weight under any of the prefixes "
                                            f"{', '.join(_HF_PREFIXES)}")
        names = [(a, prefix + b) for a, b in _HF_LAYER_NAMES] + [("output.weight", "lm_head.weight")]
        weights = SafetensorsWeights(mf, names)

        def num(key: str, default: Any = REQUIRED, **bounds: int) -> int:
            if default is REQUIRED and key not in cfg:
                raise ModelFormatError(path, f"missing field {key!r}")
            return meta_int(path, key, cfg.get(key, default), **bounds)

        try:
            n_layers = num("num_hidden_layers", hi=MAX_LAYERS)
            check_layers(path, "num_hidden_layers", n_layers, lambda i: f"blk.{i}.attn_norm.weight" in weights,
                         "tensor '" + prefix + "layers.{i}.input_layernorm.weight'")
            hidden, n_heads = num("hidden_size"), num("num_attention_heads")
            head_dim = num("head_dim") if cfg.get("head_dim") else max(hidden // n_heads, 1)
            layer_types = cfg.get("layer_types")
            if layer_types is not None:
                sliding = tuple(t == "sliding_attention" for t in layer_types)
            else:
                sliding = sliding_pattern(n_layers, num("sliding_window_pattern", DEFAULT_SLIDING_PATTERN))
            theta, local_theta, inv_freq = _hf_rope(cfg, head_dim, mf.path)
            meta_float(path, "rope_theta", theta)
            meta_float(path, "rope_local_base_freq", local_theta)
            if inv_freq is not None and not np.all(np.isfinite(inv_freq) & (inv_freq > 0)):
                raise ModelFormatError(path, "rope scaling gives non-finite frequencies")
            cap = cfg.get("final_logit_softcapping")
            config = GemmaConfig(
                architecture="gemma3", vocab_size=num("vocab_size", hi=MAX_VOCAB), hidden_size=hidden,
                n_layers=n_layers, context_length=num("max_position_embeddings", 8192, hi=MAX_CONTEXT),
                intermediate_size=num("intermediate_size"), n_heads=n_heads,
                n_kv_heads=num("num_key_value_heads") if cfg.get("num_key_value_heads") else n_heads,
                head_dim=head_dim, norm_offset=1.0,
                rms_norm_eps=meta_float(path, "rms_norm_eps", cfg.get("rms_norm_eps", 1e-6), below=1.0),
                query_pre_attn_scalar=meta_float(path, "query_pre_attn_scalar", cfg.get("query_pre_attn_scalar", 256)),
                rope_theta=theta, rope_local_theta=local_theta, rope_global_inv_freq=inv_freq,
                sliding_window=num("sliding_window", lo=0, hi=1 << 31) if cfg.get("sliding_window") else 0,
                sliding_layers=sliding,
                final_logit_softcap=None if cap is None else meta_float(path, "final_logit_softcapping", cap))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ModelFormatError):
                raise
            raise ModelFormatError(path, f"missing or invalid field {e}") from None
        if cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh")) not in ("gelu_pytorch_tanh",
                                                                                             "gelu_tanh"):
            raise ModelFormatError(mf.path, f"config.json: activation {cfg.get('hidden_activation')!r} is not "
                                            "supported (gemma uses gelu_pytorch_tanh)")
        config.check(path, HF_KEYS)
        check_shapes(mf.path, weights.shape, expected_shapes(config, weights), "the numbers in config.json",
                     weights.hf_name)
        model = cls(config, weights, tokenizer)
        if cfg.get("tie_word_embeddings", mf.config.get("tie_word_embeddings", True)) is False and model.tied:
            raise ModelFormatError(mf.path, "config.json says the embeddings are not tied, but lm_head.weight "
                                            "is missing")
        return model

    # the graph ------------------------------------------------------------------------------------
    def cache_specs(self, ctx: int) -> list[CacheSpec]:
        c = self.config
        shape = (ctx, c.n_kv_heads, c.head_dim)
        return [CacheSpec(f"{kv}{i}", shape) for i in range(c.n_layers) for kv in ("k", "v")]

    def _w(self, g: Graph, name: str) -> Tensor:
        return self.weights.tensor(g, name)

    def _norm(self, g: Graph, x: Tensor, name: str) -> Tensor:
        w = self._w(g, name)
        if self.config.norm_offset:
            w = w + self.config.norm_offset
        return rms_norm(x, w, self.config.rms_norm_eps)

    def _softcap(self, x: Tensor, cap: float | None) -> Tensor:
        return tanh(x * (1.0 / cap)) * cap if cap else x

    def attention(self, g: Graph, h: Tensor, i: int, kv: KVAppend) -> Tensor:
        """Self-attention of layer ``i`` on normed ``h [seq, hidden]``, appending to caches k<i>, v<i>."""
        c = self.config
        seq = h.shape[0]
        p = f"blk.{i}."
        sliding = c.sliding_layers[i]
        theta = c.rope_local_theta if sliding else c.rope_theta
        inv_freq = None if sliding else c.rope_global_inv_freq
        q = linear(h, self._w(g, p + "attn_q.weight")).reshape((seq, c.n_heads, c.head_dim))
        k = linear(h, self._w(g, p + "attn_k.weight")).reshape((seq, c.n_kv_heads, c.head_dim))
        v = linear(h, self._w(g, p + "attn_v.weight")).reshape((seq, c.n_kv_heads, c.head_dim))
        q = rope(self._norm(g, q, p + "attn_q_norm.weight"), pos=kv.pos, theta=theta, inv_freq=inv_freq)
        k = rope(self._norm(g, k, p + "attn_k_norm.weight"), pos=kv.pos, theta=theta, inv_freq=inv_freq)
        keys = kv.append(f"k{i}", k).permute(1, 0, 2)                           # [kv_heads, total, head_dim]
        values = kv.append(f"v{i}", v).permute(1, 0, 2)
        # the query heads that share a KV head are the rows of one attention problem (as in llama.py): row
        # r = s * rep + h is head kv * rep + h at position pos + s, so each block of keys and values is read once
        # for all of them, not once per query head
        rep = c.n_heads // c.n_kv_heads
        rows = sym.mul(seq, rep)
        grouped = q.reshape((seq, c.n_kv_heads, rep, c.head_dim)).permute(1, 0, 2, 3).contiguous()
        grouped = grouped.reshape((c.n_kv_heads, rows, c.head_dim))
        key_pos = g.iota(kv.total).reshape((1, kv.total))
        query_pos = kv.positions.reshape((seq, 1)).expand((seq, rep)).reshape((rows, 1))
        visible = key_pos <= query_pos
        if sliding:
            visible = visible & (query_pos - c.sliding_window < key_pos)
        scale = 1.0 / math.sqrt(c.query_pre_attn_scalar)
        out = scaled_dot_product_attention(grouped, keys, values, visible, scale=scale)  # [kv_heads, rows, head_dim]
        out = out.reshape((c.n_kv_heads, seq, rep, c.head_dim)).permute(1, 0, 2, 3)
        out = out.reshape((seq, c.n_heads * c.head_dim)).contiguous()
        return linear(out, self._w(g, p + "attn_output.weight"))

    def mlp(self, g: Graph, h: Tensor, i: int) -> Tensor:
        p = f"blk.{i}."
        gate = gelu(linear(h, self._w(g, p + "ffn_gate.weight")), approximate="tanh")
        up = linear(h, self._w(g, p + "ffn_up.weight"))
        return linear(gate * up, self._w(g, p + "ffn_down.weight"))

    def forward(self, g: Graph, tokens: Tensor, kv: KVAppend) -> Tensor:
        c = self.config
        # the scale is a float32 value, as transformers rounds it
        x = self.weights.rows(g, "token_embd.weight", tokens) * float(np.float32(math.sqrt(c.hidden_size)))
        for i in range(c.n_layers):
            p = f"blk.{i}."
            x = x + self._norm(g, self.attention(g, self._norm(g, x, p + "attn_norm.weight"), i, kv),
                               p + "post_attention_norm.weight")
            x = x + self._norm(g, self.mlp(g, self._norm(g, x, p + "ffn_norm.weight"), i),
                               p + "post_ffw_norm.weight")
        return self._norm(g, x, "output_norm.weight")

    def lm_head(self, g: Graph, hidden: Tensor) -> Tensor:
        logits = linear(hidden, self._w(g, "token_embd.weight" if self.tied else "output.weight"))
        return self._softcap(logits, self.config.final_logit_softcap)
