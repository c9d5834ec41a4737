"""The lowering table: aten op overload -> a function that builds Lightspeed ops.

A lowering is called like the aten op, with a ``LoweringContext`` first: FX nodes in
its arguments are already replaced by Lightspeed Tensors (tensor values) or ints and
symbolic expressions (SymInt values). It returns a Tensor, a number, or a tuple/list of
them, shaped like the op's result. The caller then casts every tensor result to the dtype
PyTorch recorded for that node and checks its shape, so a lowering never has to repeat
PyTorch's type-promotion rules to be correct, only to be precise.

A lowering that meets arguments it cannot handle raises ``Unsupported`` with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ... import dtypes as dt
from ... import symbolic as sym
from ...graph import Graph
from ...tensor import Tensor
from ..tensors import carrier_dtype

LOWERINGS: dict[Any, Callable] = {}


class Unsupported(Exception):
    """A lowering cannot express this call (the message says why)."""


def lowers(*targets):
    """Decorator: register the function as the lowering of every op overload in ``targets``."""
    def wrap(fn):
        for t in targets:
            if t in LOWERINGS:
                raise ValueError(f"{t} already has a lowering ({LOWERINGS[t].__name__})")
            LOWERINGS[t] = fn
        return fn
    return wrap


def overloads(packet, *names: str) -> list:
    """The named overloads of an op packet that exist in this PyTorch (``default`` when none named)."""
    out = []
    for n in names or ("default",):
        o = getattr(packet, n, None)
        if o is not None:
            out.append(o)
    return out


@dataclass
class LoweringContext:
    """What a lowering may use besides its arguments."""

    graph: Graph
    node: Any  # the torch.fx.Node being lowered
    symbols: Any  # SymbolTable
    notes: list[str] = field(default_factory=list)

    @property
    def meta(self):
        return self.node.meta.get("val")

    def out_dtype(self, index: int | None = None) -> dt.DType | None:
        """The Lightspeed dtype PyTorch recorded for this node's result (or result ``index``)."""
        v = self.meta
        if index is not None and isinstance(v, (tuple, list)):
            v = v[index]
        if isinstance(v, torch.Tensor):
            return carrier_dtype(v.dtype)
        return None

    def out_shape(self, index: int | None = None) -> tuple:
        v = self.meta
        if index is not None and isinstance(v, (tuple, list)):
            v = v[index]
        return self.symbols.shape(v)

    def scalar(self, value, dtype: dt.DType) -> Tensor:
        """A 0-d constant; ``value`` may be a Python number or a symbolic size."""
        if isinstance(value, sym.Expr) and not sym.is_const(value):
            return self.graph.constant_dim(value, dtype)
        if isinstance(value, sym.Expr):
            value = int(value)
        if dtype.is_int and isinstance(value, float):
            if not value.is_integer():
                raise Unsupported(f"the float {value} cannot be used as {dtype.name}")
            value = int(value)
        return self.graph.constant(value, dtype)

    def full(self, shape, value, dtype: dt.DType) -> Tensor:
        c = self.scalar(value, dtype)
        shape = tuple(shape)
        return c.reshape((1,) * len(shape)).expand(shape) if shape else c


def as_tensor(ctx: LoweringContext, x, dtype: dt.DType) -> Tensor:
    """``x`` as a Tensor of ``dtype`` (Python numbers and symbolic sizes become constants)."""
    if isinstance(x, Tensor):
        return x.cast(dtype)
    if isinstance(x, bool):
        return ctx.scalar(x, dt.bool_).cast(dtype)
    return ctx.scalar(x, dtype)
