"""Neural-network building blocks: softmax, norms."""
from __future__ import annotations

from ..tensor import Tensor
from .elementwise import _float, exp, log, rsqrt


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    x = _float(x)
    e = exp(x - x.max(axis, keepdim=True))
    return e / e.sum(axis, keepdim=True)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    x = _float(x)
    shifted = x - x.max(axis, keepdim=True)
    return shifted - log(exp(shifted).sum(axis, keepdim=True))


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5,
               axis: int = -1) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over ``axis``."""
    x = _float(x)
    mu = x.mean(axis, keepdim=True)
    d = x - mu
    out = d * rsqrt((d * d).mean(axis, keepdim=True) + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6, axis: int = -1) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over ``axis``."""
    x = _float(x)
    out = x * rsqrt((x * x).mean(axis, keepdim=True) + eps)
    return out * weight if weight is not None else out
