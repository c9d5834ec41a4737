"""Every operation above the primitives, each a short composition of them.

Functions here take a Tensor first; the names in TENSOR_METHODS are also
available as Tensor methods (``x.softmax(-1)``).
"""
from .elementwise import (abs, clamp, cos, div, eq, erf, exp, ge, gelu, gt, le, log, logical_and, logical_not,
                          logical_or, lt, maximum, minimum, ne, neg, pow, relu, rsqrt, sigmoid, sign, silu, sqrt,
                          sub, tanh, where)
from .linalg import linear, matmul
from .nn import layer_norm, log_softmax, rms_norm, softmax
from .reduce import argmax, argmin, cumsum, max, mean, min, sum, var

TENSOR_METHODS = [
    "abs", "clamp", "cos", "div", "eq", "erf", "exp", "ge", "gelu", "gt", "le", "log", "logical_and",
    "logical_not", "logical_or", "lt", "maximum", "minimum", "ne", "neg", "pow", "relu", "rsqrt", "sigmoid",
    "sign", "silu", "sub", "tanh", "where", "matmul", "linear", "softmax", "log_softmax", "layer_norm",
    "rms_norm", "argmax", "argmin", "cumsum", "max", "mean", "min", "sum", "var",
]
