"""Elementwise math composed from the primitive ops.

Every function takes a Tensor first (the others may be Tensors or Python scalars)
and broadcasts with numpy's rules. Integer inputs to transcendental functions are
computed in float32.
"""
from __future__ import annotations

import builtins
import math

import numpy as np

from .. import dtypes as dt
from ..ops import Op
from ..tensor import Tensor, broadcast_shapes, promote

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)


def _float(x: Tensor) -> Tensor:
    return x if x.dtype.is_float else x.cast(dt.float32)


def neg(x: Tensor) -> Tensor:
    """-x (unsigned integers wrap around, as in C and numpy)."""
    if x.dtype is dt.bool_:
        raise ValueError("neg: not defined for bool tensors; use logical_not")
    if x.dtype.kind == "u":
        # multiplying by 2**bits - 1 is multiplying by -1 modulo 2**bits
        return x * int(np.iinfo(x.dtype.np).max)
    return x * -1


def sub(x: Tensor, y) -> Tensor:
    """x - y"""
    a, b = x._broadcast_pair(y, "sub")
    return a + neg(b)


def div(x: Tensor, y) -> Tensor:
    """x / y (true division; integers become float32)."""
    a, b = x._broadcast_pair(y, "div")
    return _float(a) * _float(b).recip()


def exp(x: Tensor) -> Tensor:
    """e**x, as exp2(x * log2(e))."""
    return (_float(x) * LOG2E).exp2()


def log(x: Tensor) -> Tensor:
    """Natural logarithm, as log2(x) * ln(2)."""
    return _float(x).log2() * LN2


def sqrt(x: Tensor) -> Tensor:
    """Square root (integers become float32)."""
    return _float(x)._unary(Op.SQRT)


def rsqrt(x: Tensor) -> Tensor:
    """1 / sqrt(x)."""
    return sqrt(x).recip()


def pow(x: Tensor, y) -> Tensor:
    """x ** y. Small integer exponents use repeated multiplication (exact, negative bases allowed);
    other exponents use exp2(y * log2(x)), which is NaN for negative bases as in numpy."""
    if isinstance(y, (int, float)) and not isinstance(y, bool) and float(y).is_integer() and builtins.abs(y) <= 16:
        n = int(y)
        if n == 0:
            return x.const_like(1)
        base = _float(x) if n < 0 else x
        out, p, k = None, base, builtins.abs(n)
        while k:
            if k & 1:
                out = p if out is None else out * p
            k >>= 1
            if k:
                p = p * p
        return out.recip() if n < 0 else out
    if isinstance(y, float) and y == 0.5:
        return sqrt(x)
    a, b = x._broadcast_pair(y, "pow")
    return (_float(b) * _float(a).log2()).exp2()


def sin(x: Tensor) -> Tensor:
    """Sine, radians."""
    return _float(x).sin()


def cos(x: Tensor) -> Tensor:
    """Cosine, as 1 - 2*sin(x/2)**2.

    Halving is exact in floating point, so unlike sin(x + pi/2) this adds no
    rounding that grows with |x| (rotary angles reach thousands of radians)."""
    s = (_float(x) * 0.5).sin()
    return 1.0 - s * s * 2.0


def tanh(x: Tensor) -> Tensor:
    """Hyperbolic tangent, as 2*sigmoid(2x) - 1 (no overflow for large |x|)."""
    return sigmoid(_float(x) * 2.0) * 2.0 - 1.0


def sigmoid(x: Tensor) -> Tensor:
    """1 / (1 + e**-x); saturates to exactly 0 or 1 instead of overflowing."""
    return ((_float(x) * -LOG2E).exp2() + 1.0).recip()


def relu(x: Tensor) -> Tensor:
    """max(x, 0)."""
    return x.maximum(0)


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x) (also called swish)."""
    return _float(x) * sigmoid(x)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU: ``approximate="none"`` for the exact erf form, ``"tanh"`` for the tanh approximation."""
    x = _float(x)
    if approximate == "tanh":
        return x * 0.5 * (tanh((x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)) + 1.0)
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return x * 0.5 * (erf(x * (1.0 / math.sqrt(2.0))) + 1.0)


def erf(x: Tensor) -> Tensor:
    """The error function, to about 1.2e-7 relative error.

    erfc(|x|) is approximated as t*exp(-x^2 + P(t)) with t = 1/(1 + |x|/2) and P a
    degree-9 polynomial (the classic Chebyshev-fitted erfc); erf = sign(x)*(1 - erfc)."""
    x = _float(x)
    s = x.sign()
    a = x.abs()
    t = (a * 0.5 + 1.0).recip()
    poly = (-1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
        0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
    erfc = t * exp(a * a * -1.0 + poly)
    return s * (1.0 - erfc)


def abs(x: Tensor) -> Tensor:
    """|x| (identity for unsigned and bool tensors)."""
    if x.dtype.kind in "ub":
        return x
    return where(x < 0, -x, x)


def sign(x: Tensor) -> Tensor:
    """-1, 0 or 1 with the dtype of x."""
    return (x > 0).cast(x.dtype) - (x < 0).cast(x.dtype)


def maximum(x: Tensor, y) -> Tensor:
    """Elementwise maximum (NaN in x propagates)."""
    a, b = x._broadcast_pair(y, "maximum")
    return where(a < b, b, a)


def minimum(x: Tensor, y) -> Tensor:
    """Elementwise minimum (NaN in x propagates)."""
    a, b = x._broadcast_pair(y, "minimum")
    return where(b < a, b, a)


def clamp(x: Tensor, lo=None, hi=None) -> Tensor:
    """x limited to [lo, hi]; either bound may be None, a scalar or a Tensor."""
    if lo is not None:
        x = x.maximum(lo)
    if hi is not None:
        x = x.minimum(hi)
    return x


def where(cond: Tensor, a, b) -> Tensor:
    """a where cond else b: a select, so inf/NaN in the branch not taken do not leak."""
    if not isinstance(cond, Tensor):
        raise TypeError("where: the condition must be a Tensor")
    if cond.dtype is not dt.bool_:
        cond = cond.cast(dt.bool_)
    ta = a if isinstance(a, Tensor) else None
    tb = b if isinstance(b, Tensor) else None
    ref = ta if ta is not None else tb
    if ref is None:
        ref = cond.cast(dt.float32)
    a_t = ref._operand(a) if ta is None else ta
    b_t = ref._operand(b) if tb is None else tb
    d = promote(a_t.dtype, b_t.dtype)
    shape = broadcast_shapes(broadcast_shapes(cond.shape, a_t.shape, "where"), b_t.shape, "where")
    c = cond.broadcast_to(shape)
    a_t, b_t = a_t.cast(d).broadcast_to(shape), b_t.cast(d).broadcast_to(shape)
    if d is dt.bool_:  # bool*bool is logical and; an Add would turn bools into ints
        return logical_or(c * a_t, logical_not(c) * b_t)
    return c * a_t + logical_not(c) * b_t


# comparisons and logic --------------------------------------------------------

def logical_not(x: Tensor) -> Tensor:
    """not x (non-zero counts as true)."""
    b = x if x.dtype is dt.bool_ else x.cast(dt.bool_)
    return b.less_than(True)


def logical_and(x: Tensor, y) -> Tensor:
    """x and y, elementwise."""
    a, b = x._broadcast_pair(y, "logical_and")
    return a.cast(dt.bool_) * b.cast(dt.bool_)


def logical_or(x: Tensor, y) -> Tensor:
    """x or y, elementwise."""
    a, b = x._broadcast_pair(y, "logical_or")
    return logical_not(logical_and(logical_not(a), logical_not(b)))


def eq(x: Tensor, y) -> Tensor:
    """x == y, as not(x < y or y < x). Note: NaN compares equal to everything here."""
    a, b = x._broadcast_pair(y, "eq")
    return logical_not(logical_or(a < b, b < a))


def ne(x: Tensor, y) -> Tensor:
    """x != y."""
    return logical_not(eq(x, y))


def gt(x: Tensor, y) -> Tensor:
    """x > y."""
    return x.less_than(y, reverse=True)


def ge(x: Tensor, y) -> Tensor:
    """x >= y (true when either side is NaN)."""
    return logical_not(x.less_than(y))


def lt(x: Tensor, y) -> Tensor:
    """x < y."""
    return x.less_than(y)


def le(x: Tensor, y) -> Tensor:
    """x <= y (true when either side is NaN)."""
    return logical_not(x.less_than(y, reverse=True))
