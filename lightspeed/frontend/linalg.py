"""Matrix products: a broadcast Mul feeding a SumReduce (never materialised by the C backend)."""
from __future__ import annotations

from .. import symbolic as sym
from ..shape import _shape_str
from ..tensor import Tensor, broadcast_shapes


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product with numpy's rules: 1-D operands are promoted, batch dimensions broadcast."""
    b = a._operand(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: operands must have at least one dimension")
    a2 = a.unsqueeze(0) if a.ndim == 1 else a
    b2 = b.unsqueeze(-1) if b.ndim == 1 else b
    k, k2 = a2.shape[-1], b2.shape[-2]
    if not sym.same(k, k2):
        raise ValueError(f"matmul: shapes {_shape_str(a.shape)} and {_shape_str(b.shape)} do not align "
                         f"({k} != {k2})")
    batch = broadcast_shapes(a2.shape[:-2], b2.shape[:-2], "matmul")
    m, n = a2.shape[-2], b2.shape[-1]
    x = a2.broadcast_to(batch + (m, k)).unsqueeze(-1)                       # [..., m, k, 1]
    y = b2.broadcast_to(batch + (k, n)).unsqueeze(-3)                       # [..., 1, k, n]
    out = (x * y).sum(-2)                                                   # [..., m, n]
    if a.ndim == 1:
        out = out.squeeze(-2)
    if b.ndim == 1:
        out = out.squeeze(-1)
    return out


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias, with weight laid out [out_features, in_features] as in PyTorch."""
    if weight.ndim != 2 or x.ndim < 1 or not sym.same(x.shape[-1], weight.shape[1]):
        raise ValueError(f"linear: input of shape {_shape_str(x.shape)} and weight of shape "
                         f"{_shape_str(weight.shape)} do not match (weight is [out_features, in_features])")
    if bias is not None and (bias.ndim != 1 or not sym.same(bias.shape[0], weight.shape[0])):
        raise ValueError(f"linear: bias of shape {_shape_str(bias.shape)} does not match weight of shape "
                         f"{_shape_str(weight.shape)}")
    out = matmul(x, weight.T)
    return out + bias if bias is not None else out
