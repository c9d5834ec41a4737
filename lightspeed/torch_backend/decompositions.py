"""The decomposition table aot_autograd applies before lowering.

PyTorch's core-ATen decompositions reduce several hundred ops to about 180 core ops;
Lightspeed lowers those (see lowering/). Two fused inference kernels that PyTorch's
nn.TransformerEncoderLayer and nn.MultiheadAttention call in eval mode have no
decomposition in PyTorch, so they get one here, written with ordinary torch functions
(which the table then decomposes further).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as TF

aten = torch.ops.aten

# core decompositions we drop: Lightspeed lowers these ops directly, more cheaply
KEEP_AS_OPS = [
    aten.native_layer_norm.default,
    aten.native_group_norm.default,
    aten.linalg_vector_norm.default,
    aten.var_mean.correction,
    aten.var.correction,
    aten.logsumexp.default,
    aten.embedding.default,
    aten.repeat.default,
    aten.diagonal.default,
    aten.hardtanh.default,
    aten.gelu.default,
    aten.silu.default,
    aten.mish.default,
    aten.elu.default,
    aten.leaky_relu.default,
    aten.softplus.default,
    aten.hardsigmoid.default,
    aten.hardswish.default,
    aten.logit.default,
    aten.clamp_min.default,
    aten.clamp_max.default,
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
    aten.std.correction,
    aten.nan_to_num.default,
    aten.xlogy.Tensor,
    aten.heaviside.default,
    aten.sinc.default,
    aten.deg2rad.default,
    aten.rad2deg.default,
    aten.isposinf.default,
    aten.isneginf.default,
    aten.isfinite.default,
    aten.logaddexp.default,
]


def _attention(q, k, v, num_heads: int, mask, mask_type, need_weights: bool, average: bool):
    """Multi-head attention core: [B, S, E] projections -> ([B, S, E], weights)."""
    b, s, e = q.shape
    kv_len = k.shape[1]
    d = e // num_heads
    qh = q.reshape(b, s, num_heads, d).transpose(1, 2)
    kh = k.reshape(b, kv_len, num_heads, d).transpose(1, 2)
    vh = v.reshape(b, kv_len, num_heads, d).transpose(1, 2)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * (1.0 / (d ** 0.5))
    if mask is not None:
        if mask_type == 1 and mask.dim() == 2:      # key padding mask [B, S_kv]
            mask = mask.reshape(b, 1, 1, kv_len)
        elif mask.dim() == 2:                        # attention mask [S, S_kv]
            mask = mask.reshape(1, 1, s, kv_len)
        elif mask.dim() == 3:                        # [B*H or B, S, S_kv]
            mask = mask.reshape(b, -1, s, kv_len)
        if mask.dtype == torch.bool:                 # True marks a masked-out key
            scores = scores.masked_fill(mask, float("-inf"))
        else:
            scores = scores + mask
    weights = torch.softmax(scores, dim=-1)
    out = torch.matmul(weights, vh).transpose(1, 2).reshape(b, s, e)
    if not need_weights:
        return out, None
    return out, (weights.mean(dim=1) if average else weights)


def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):
    """nn.TransformerEncoderLayer's fused eval-mode kernel, in plain torch functions."""
    def self_attention(x):
        qkv = TF.linear(x, qkv_weight, qkv_bias)
        q, k, v = qkv.split(embed_dim, dim=-1)
        out, _ = _attention(q, k, v, num_heads, mask, mask_type, False, False)
        return TF.linear(out, proj_weight, proj_bias)

    def feed_forward(x):
        h = TF.linear(x, ffn_weight_1, ffn_bias_1)
        h = TF.gelu(h) if use_gelu else TF.relu(h)
        return TF.linear(h, ffn_weight_2, ffn_bias_2)

    shape = (embed_dim,)
    x = src
    if norm_first:
        x = x + self_attention(TF.layer_norm(x, shape, norm_weight_1, norm_bias_1, eps))
        x = x + feed_forward(TF.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps))
    else:
        x = TF.layer_norm(x + self_attention(x), shape, norm_weight_1, norm_bias_1, eps)
        x = TF.layer_norm(x + feed_forward(x), shape, norm_weight_2, norm_bias_2, eps)
    return x


def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                                mask_type=None):
    """nn.MultiheadAttention's fused eval-mode kernel, in plain torch functions."""
    wq, wk, wv = qkv_weight.split(embed_dim, dim=0)
    bq, bk, bv = qkv_bias.split(embed_dim, dim=0)
    q, k, v = TF.linear(query, wq, bq), TF.linear(key, wk, bk), TF.linear(value, wv, bv)
    out, weights = _attention(q, k, v, num_head, mask, mask_type, need_weights, average_attn_weights)
    out = TF.linear(out, proj_weight, proj_bias)
    if weights is None:
        weights = out.new_empty((0,))
    return out, weights


EXTRA = {
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
    aten._native_multi_head_attention.default: native_multi_head_attention,
}


@functools.cache
def decomposition_table() -> dict:
    """PyTorch's core-ATen decompositions, minus KEEP_AS_OPS, plus EXTRA (built once)."""
    from torch._decomp import core_aten_decompositions
    table = dict(core_aten_decompositions())
    for op in KEEP_AS_OPS:
        table.pop(op, None)
    table.update(EXTRA)
    return table
