"""Neural-network building blocks: softmax, norms, embedding lookup."""
from __future__ import annotations

from .. import symbolic as sym
from ..shape import _shape_str
from ..tensor import Tensor, _norm_axis, broadcast_shapes
from .elementwise import _float, exp, log, rsqrt


def _check_param(x: Tensor, p: Tensor | None, what: str, name: str) -> None:
    """A weight or bias must broadcast against x without changing x's shape."""
    if p is None:
        return
    try:
        out = broadcast_shapes(x.shape, p.shape, what)
    except ValueError:
        out = None
    if out is None or len(out) != x.ndim or any(not sym.same(a, b) for a, b in zip(out, x.shape)):
        raise ValueError(f"{what}: {name} of shape {_shape_str(p.shape)} does not match x of shape "
                         f"{_shape_str(x.shape)}")


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """exp(x) / sum(exp(x)) along ``axis``, shifted by the max so large inputs cannot overflow.
    -inf entries get weight 0 (a row that is entirely -inf is NaN, as in PyTorch)."""
    axis = _norm_axis(axis, x.ndim, "softmax")
    x = _float(x)
    e = exp(x - x.max(axis, keepdim=True))
    return e / e.sum(axis, keepdim=True)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """x - logsumexp(x) along ``axis``, computed from the max-shifted values."""
    axis = _norm_axis(axis, x.ndim, "log_softmax")
    x = _float(x)
    shifted = x - x.max(axis, keepdim=True)
    return shifted - log(exp(shifted).sum(axis, keepdim=True))


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5,
               axis: int = -1) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over ``axis`` (biased variance, as PyTorch)."""
    axis = _norm_axis(axis, x.ndim, "layer_norm")
    _check_param(x, weight, "layer_norm", "weight")
    _check_param(x, bias, "layer_norm", "bias")
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
    """x / sqrt(mean(x^2) + eps) * weight over ``axis`` (Llama's RMSNorm)."""
    axis = _norm_axis(axis, x.ndim, "rms_norm")
    _check_param(x, weight, "rms_norm", "weight")
    x = _float(x)
    out = x * rsqrt((x * x).mean(axis, keepdim=True) + eps)
    return out * weight if weight is not None else out


def embedding(weight: Tensor, ids: Tensor) -> Tensor:
    """Rows of ``weight [vocab, dim]`` picked by integer ``ids`` of any shape -> ``ids.shape + (dim,)``.
    Out-of-range ids give zero rows (Gather's semantics)."""
    if not isinstance(ids, Tensor) or not ids.dtype.is_int:
        raise ValueError(f"embedding: ids must be an integer Tensor, got "
                         f"{getattr(ids, 'dtype', type(ids).__name__)}")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be [vocab, dim], got shape {_shape_str(weight.shape)}")
    return weight.gather(ids)
