"""Every operation above the primitives, each a short composition of them.

Functions here take a Tensor first (creation functions such as ``arange`` and
``causal_mask`` take the Graph); the names in TENSOR_METHODS are also available
as Tensor methods (``x.softmax(-1)``, ``x.rms_norm(w)``, ``x.cumsum(0)``).
"""
from .attention import MASKED_SCORE, scaled_dot_product_attention
from .combine import concatenate, stack
from .conv import conv1d, conv2d, unfold
from .creation import arange, causal_mask, tril, triu
from .elementwise import (abs, clamp, cos, div, eq, erf, exp, ge, gelu, gt, le, log, logical_and, logical_not,
                          logical_or, lt, maximum, minimum, ne, neg, pow, relu, rsqrt, sigmoid, sign, silu, sin, sqrt,
                          sub, tanh, where)
from .linalg import linear, matmul
from .nn import embedding, layer_norm, log_softmax, rms_norm, softmax
from .reduce import argmax, argmin, cumsum, max, mean, min, sum, var
from .rope import rope, rope_inv_freq

cat = concatenate

TENSOR_METHODS = [
    "abs", "clamp", "cos", "div", "eq", "erf", "exp", "ge", "gelu", "gt", "le", "log", "logical_and",
    "logical_not", "logical_or", "lt", "maximum", "minimum", "ne", "neg", "pow", "relu", "rsqrt", "sigmoid",
    "sign", "silu", "sub", "tanh", "where", "matmul", "linear", "softmax", "log_softmax", "layer_norm",
    "rms_norm", "argmax", "argmin", "cumsum", "max", "mean", "min", "sum", "var", "tril", "triu", "rope",
    "unfold", "conv1d", "conv2d",
]

__all__ = TENSOR_METHODS + [
    "sin", "sqrt", "concatenate", "cat", "stack", "arange", "causal_mask", "embedding",
    "scaled_dot_product_attention", "rope_inv_freq", "MASKED_SCORE",
]
