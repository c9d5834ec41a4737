"""Lowerings of elementwise aten ops: math, comparisons, logic, activations.

Most entries are data: an aten packet and a function of Lightspeed tensors. Half-precision
inputs are computed in float32 and rounded once at the end, as PyTorch's CPU kernels do.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ... import dtypes as dt
from ... import frontend as F
from ...frontend import extra_torch as X
from ...tensor import Tensor
from .registry import LoweringContext, Unsupported, as_tensor, lowers, overloads

aten = torch.ops.aten
prims = torch.ops.prims
HALF = (dt.float16, dt.bfloat16)


def compute_dtype(d: dt.DType) -> dt.DType:
    """The dtype arithmetic for a result of dtype ``d`` runs in."""
    return dt.float32 if d in HALF else d


def float_compute(d: dt.DType | None) -> dt.DType:
    return dt.float32 if d is None or not d.is_float or d in HALF else d


# unary float functions: aten packet -> function of a float tensor -------------------------
FLOAT_UNARY = {
    aten.exp: F.exp,
    aten.exp2: lambda x: x.exp2(),
    aten.expm1: X.expm1,
    aten.log: F.log,
    aten.log2: lambda x: x.log2(),
    aten.log10: lambda x: x.log2() * math.log10(2.0),
    aten.log1p: X.log1p,
    aten.sqrt: F.sqrt,
    aten.rsqrt: F.rsqrt,
    aten.reciprocal: lambda x: x.recip(),
    aten.sin: lambda x: x.sin(),
    aten.cos: F.cos,
    aten.tan: X.tan,
    aten.asin: X.asin,
    aten.acos: X.acos,
    aten.atan: X.atan,
    aten.sinh: X.sinh,
    aten.cosh: X.cosh,
    aten.tanh: F.tanh,
    aten.asinh: X.asinh,
    aten.acosh: X.acosh,
    aten.atanh: X.atanh,
    aten.sigmoid: F.sigmoid,
    aten.erf: F.erf,
    aten.erfc: lambda x: 1.0 - F.erf(x),
    aten.silu: F.silu,
    aten.mish: lambda x: x * F.tanh(softplus_fn(x, 1.0, 20.0)),
}

# unary functions that keep integer dtypes --------------------------------------------
SAME_DTYPE_UNARY = {
    aten.abs: lambda x: x.abs(),
    aten.neg: lambda x: -x,
    aten.sign: lambda x: x.sign(),
    aten.sgn: lambda x: x.sign(),
    aten.relu: lambda x: x.maximum(0),
    aten.floor: X.floor,
    aten.ceil: X.ceil,
    aten.trunc: X.trunc,
    aten.round: X.round_half_even,
    aten.frac: lambda x: x - X.trunc(x),
}


def softplus_fn(x: Tensor, beta: float, threshold: float) -> Tensor:
    """log(1 + exp(beta*x)) / beta, linear above ``threshold`` (as torch.nn.functional.softplus)."""
    bx = x * beta
    return F.where(bx > threshold, x, X.log1p(F.exp(bx)) / beta)


def _unary_lowering(fn, keep_int: bool):
    def lower(ctx: LoweringContext, x):
        out = ctx.out_dtype()
        if keep_int and out is not None and not out.is_float:
            return fn(as_tensor(ctx, x, out))
        return fn(as_tensor(ctx, x, float_compute(out)))
    lower.__name__ = f"lower_{getattr(fn, '__name__', 'unary')}"
    return lower


for _packet, _fn in FLOAT_UNARY.items():
    lowers(*overloads(_packet, "default"))(_unary_lowering(_fn, keep_int=False))
for _packet, _fn in SAME_DTYPE_UNARY.items():
    lowers(*overloads(_packet, "default"))(_unary_lowering(_fn, keep_int=True))


@lowers(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(ctx, x):
    f = as_tensor(ctx, x, float_compute(ctx.out_dtype(0)))
    # log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)), stable for both signs
    out = f.minimum(0.0) - X.log1p(F.exp(-f.abs()))
    return out, ctx.full(ctx.out_shape(1), 0.0, ctx.out_dtype(1))


@lowers(aten.round.decimals)
def round_decimals(ctx, x, *, decimals=0):
    f = as_tensor(ctx, x, float_compute(ctx.out_dtype()))
    scale = 10.0 ** decimals
    return X.round_half_even(f * scale) / scale


# binary arithmetic ---------------------------------------------------------------------

def _operands(ctx, a, b, d: dt.DType) -> tuple[Tensor, Tensor]:
    return as_tensor(ctx, a, d), as_tensor(ctx, b, d)


def _scaled(ctx, b, alpha, d):
    if alpha is None or alpha == 1:
        return b
    if isinstance(b, Tensor):
        return as_tensor(ctx, b, d) * as_tensor(ctx, alpha, d)
    return b * alpha


@lowers(*overloads(aten.add, "Tensor", "Scalar"))
def add(ctx, a, b, *, alpha=1):
    out = ctx.out_dtype()
    if out is dt.bool_:
        return F.logical_or(*_operands(ctx, a, b, dt.bool_))
    d = compute_dtype(out)
    x, y = _operands(ctx, a, _scaled(ctx, b, alpha, d), d)
    return x + y


@lowers(*overloads(aten.sub, "Tensor", "Scalar"))
def sub(ctx, a, b, *, alpha=1):
    d = compute_dtype(ctx.out_dtype())
    x, y = _operands(ctx, a, _scaled(ctx, b, alpha, d), d)
    return x - y


@lowers(*overloads(aten.rsub, "Tensor", "Scalar"))
def rsub(ctx, a, b, *, alpha=1):
    return sub(ctx, b, a, alpha=alpha)


@lowers(*overloads(aten.mul, "Tensor", "Scalar"))
def mul(ctx, a, b):
    out = ctx.out_dtype()
    if out is dt.bool_:
        return F.logical_and(*_operands(ctx, a, b, dt.bool_))
    x, y = _operands(ctx, a, b, compute_dtype(out))
    return x * y


def _float_div_exact(a: Tensor, b: Tensor, mode: str) -> Tensor:
    """a / b rounded toward zero ("trunc") or down ("floor") without the error of a*recip(b):
    a - fmod(a, b) is a multiple of b, so its quotient is an integer up to rounding."""
    r = a.mod(b)
    q = X.round_half_even((a - r) / b)
    if mode == "floor":
        fix = F.logical_not(X.eq_ieee(r, 0.0)) & F.logical_not(X.eq_ieee((r < 0.0).cast(dt.int32),
                                                                         (b < 0.0).cast(dt.int32)))
        q = F.where(fix, q - 1.0, q)
    # b == 0 gives inf/NaN like a plain division
    return F.where(X.eq_ieee(b, 0.0), a / b, q)


@lowers(*overloads(aten.div, "Tensor", "Scalar", "Tensor_mode", "Scalar_mode"),
        *overloads(aten.true_divide, "Tensor", "Scalar"))
def div(ctx, a, b, *, rounding_mode=None):
    out = ctx.out_dtype()
    if rounding_mode is None:
        d = float_compute(out)
        x, y = _operands(ctx, a, b, d)
        return x / y
    if not out.is_float:
        raise Unsupported(f"integer division with rounding_mode={rounding_mode!r} (Lightspeed has no exact "
                          "integer division)")
    x, y = _operands(ctx, a, b, compute_dtype(out))
    return _float_div_exact(x, y, rounding_mode)


@lowers(aten.floor_divide.default, *overloads(aten.floor_divide, "Scalar"))
def floor_divide(ctx, a, b):
    return div(ctx, a, b, rounding_mode="floor")


@lowers(*overloads(aten.remainder, "Tensor", "Scalar", "Scalar_Tensor"))
def remainder(ctx, a, b):
    d = compute_dtype(ctx.out_dtype())
    x, y = _operands(ctx, a, b, d)
    r = x.mod(y)
    # Python's %: the result takes the sign of the divisor
    zero = r.const_like(0)
    y = y.broadcast_to(r.shape)
    fix = F.logical_not(X.eq_ieee(r, zero)) & F.logical_not(X.eq_ieee((r < zero).cast(dt.int32),
                                                                     (y < zero).cast(dt.int32)))
    return F.where(fix, r + y, r)


@lowers(*overloads(aten.fmod, "Tensor", "Scalar"))
def fmod(ctx, a, b):
    x, y = _operands(ctx, a, b, compute_dtype(ctx.out_dtype()))
    return x.mod(y)


def pow_general(x: Tensor, y: Tensor) -> Tensor:
    """x ** y for float tensors, with the signs of integer powers of negative bases."""
    mag = (y * x.abs().log2()).exp2()
    is_int = X.eq_ieee(y, X.trunc(y))
    odd = is_int & F.logical_not(X.eq_ieee(y.mod(2.0), 0.0))
    signed = F.where(x < 0.0, F.where(is_int, F.where(odd, -mag, mag), float("nan")), mag)
    # x**0 is 1 and 1**y is 1, even for NaN
    return F.where(X.eq_ieee(y, 0.0) | X.eq_ieee(x, 1.0), 1.0, signed)


@lowers(*overloads(aten.pow, "Tensor_Scalar", "Tensor_Tensor", "Scalar"))
def pow_(ctx, a, b):
    out = ctx.out_dtype()
    d = compute_dtype(out)
    if isinstance(b, (int, float)) and not isinstance(b, bool) and isinstance(a, Tensor):
        if float(b).is_integer() and abs(b) <= 16 and (out.is_float or b >= 0):
            return F.pow(as_tensor(ctx, a, d), int(b))
        if b == 0.5 and out.is_float:
            return F.sqrt(as_tensor(ctx, a, d))
    if not out.is_float:
        raise Unsupported("integer powers other than small non-negative integer exponents")
    x, y = _operands(ctx, a, b, d)
    return pow_general(x, y)


@lowers(*overloads(aten.atan2, "default"))
def atan2(ctx, a, b):
    x, y = _operands(ctx, a, b, float_compute(ctx.out_dtype()))
    return X.atan2(x, y)


@lowers(*overloads(aten.hypot, "default"))
def hypot(ctx, a, b):
    x, y = _operands(ctx, a, b, float_compute(ctx.out_dtype()))
    return F.sqrt(x * x + y * y)


@lowers(*overloads(aten.copysign, "Tensor", "Scalar"))
def copysign(ctx, a, b):
    x, y = _operands(ctx, a, b, float_compute(ctx.out_dtype()))
    return F.where(y < 0.0, -x.abs(), x.abs())


@lowers(*overloads(aten.xlogy, "Tensor", "Scalar_Self", "Scalar_Other"))
def xlogy(ctx, a, b):
    x, y = _operands(ctx, a, b, float_compute(ctx.out_dtype()))
    return F.where(X.isnan(y), y, F.where(X.eq_ieee(x, 0.0), 0.0, x * F.log(y)))


@lowers(*overloads(aten.logaddexp, "default"))
def logaddexp(ctx, a, b):
    x, y = _operands(ctx, a, b, float_compute(ctx.out_dtype()))
    m = x.maximum(y)
    m_safe = F.where(X.isinf(m), 0.0, m)
    return m_safe + F.log(F.exp(x - m_safe) + F.exp(y - m_safe))


@lowers(*overloads(aten.maximum, "default"))
def maximum(ctx, a, b):
    x, y = _operands(ctx, a, b, compute_dtype(ctx.out_dtype()))
    return X.maximum_nan(x, y)


@lowers(*overloads(aten.minimum, "default"))
def minimum(ctx, a, b):
    x, y = _operands(ctx, a, b, compute_dtype(ctx.out_dtype()))
    return X.minimum_nan(x, y)


@lowers(*overloads(aten.fmax, "default"))
def fmax(ctx, a, b):
    x, y = _operands(ctx, a, b, compute_dtype(ctx.out_dtype()))
    return F.where(X.isnan(x), y, F.where(X.isnan(y), x, F.where(x < y, y, x)))


@lowers(*overloads(aten.fmin, "default"))
def fmin(ctx, a, b):
    x, y = _operands(ctx, a, b, compute_dtype(ctx.out_dtype()))
    return F.where(X.isnan(x), y, F.where(X.isnan(y), x, F.where(y < x, y, x)))


def _bound(ctx, v, d):
    return None if v is None else as_tensor(ctx, v, d)


@lowers(*overloads(aten.clamp, "default", "Tensor"))
def clamp(ctx, x, min=None, max=None):
    d = compute_dtype(ctx.out_dtype())
    t = as_tensor(ctx, x, d)
    lo, hi = _bound(ctx, min, d), _bound(ctx, max, d)
    if lo is not None:
        t = F.where(t < lo, lo, t)  # NaN in t stays (the comparison is false)
    if hi is not None:
        t = F.where(hi < t, hi, t)
    return t


@lowers(*overloads(aten.clamp_min, "default", "Tensor"))
def clamp_min(ctx, x, min):
    return clamp(ctx, x, min=min)


@lowers(*overloads(aten.clamp_max, "default", "Tensor"))
def clamp_max(ctx, x, max):
    return clamp(ctx, x, max=max)


@lowers(aten.hardtanh.default)
def hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return clamp(ctx, x, min=min_val, max=max_val)


# comparisons (IEEE: NaN compares unequal and unordered) ----------------------------------

def _compare_operands(a, b) -> tuple[Tensor, Tensor]:
    if isinstance(a, Tensor):
        return a._broadcast_pair(b, "compare")
    x, y = b._broadcast_pair(a, "compare")
    return y, x


def _not_nan(t: Tensor) -> Tensor | None:
    return F.logical_not(X.isnan(t)) if t.dtype.is_float else None


def _le(a: Tensor, b: Tensor) -> Tensor:
    out = F.logical_not(b < a)
    for t in (a, b):
        ok = _not_nan(t)
        if ok is not None:
            out = out & ok
    return out


def _promote_for_compare(ctx, a, b):
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise Unsupported("a comparison of two scalars")
    x, y = _compare_operands(a, b)
    if x.dtype is not y.dtype:
        from ...tensor import promote
        d = promote(x.dtype, y.dtype)
        x, y = x.cast(d), y.cast(d)
    if x.dtype in HALF:
        x, y = x.cast(dt.float32), y.cast(dt.float32)
    return x, y


COMPARISONS = {
    aten.eq: lambda x, y: X.eq_ieee(x, y),
    aten.ne: lambda x, y: F.logical_not(X.eq_ieee(x, y)),
    aten.lt: lambda x, y: x < y,
    aten.gt: lambda x, y: y < x,
    aten.le: _le,
    aten.ge: lambda x, y: _le(y, x),
}


def _comparison_lowering(fn):
    def lower(ctx, a, b):
        if isinstance(a, Tensor) and isinstance(b, (int, float)) and not isinstance(b, bool):
            # a Python scalar takes the tensor's float type, else compares exactly in int64 / float32
            b = as_tensor(ctx, b, a.dtype if a.dtype.is_float else dt.int64 if isinstance(b, int) else dt.float32)
        x, y = _promote_for_compare(ctx, a, b)
        return fn(x, y)
    return lower


for _packet, _fn in COMPARISONS.items():
    lowers(*overloads(_packet, "Tensor", "Scalar"))(_comparison_lowering(_fn))


@lowers(aten.isnan.default)
def isnan(ctx, x):
    return X.isnan(x)


@lowers(aten.isinf.default)
def isinf(ctx, x):
    return X.isinf(x)


@lowers(*overloads(aten.isposinf, "default"))
def isposinf(ctx, x):
    return X.isinf(x) & (x > 0) if x.dtype.is_float else X.isnan(x)


@lowers(*overloads(aten.isneginf, "default"))
def isneginf(ctx, x):
    return X.isinf(x) & (x < 0) if x.dtype.is_float else X.isnan(x)


@lowers(*overloads(aten.isfinite, "default"))
def isfinite(ctx, x):
    return X.isfinite(x)


@lowers(aten.signbit.default)
def signbit(ctx, x):
    if not x.dtype.is_float:
        return x < 0
    t = x.cast(dt.float32)
    # -0.0 is the one negative number that compares equal to 0: its reciprocal is -inf
    return (t < 0.0) | (X.eq_ieee(t, 0.0) & (t.recip() < 0.0))


@lowers(*overloads(aten.ldexp, "Tensor"))
def ldexp(ctx, x, other):
    d = float_compute(ctx.out_dtype())
    return as_tensor(ctx, x, d) * as_tensor(ctx, other, d).exp2()


@lowers(*overloads(aten.angle, "default"))
def angle(ctx, x):
    t = as_tensor(ctx, x, float_compute(ctx.out_dtype()))
    return F.where(X.isnan(t), t, F.where(t < 0.0, math.pi, 0.0))


@lowers(*overloads(aten.erfinv, "default"))
def erfinv(ctx, x):
    return X.erfinv(as_tensor(ctx, x, float_compute(ctx.out_dtype())))


# logic -----------------------------------------------------------------------------------

def _bools(ctx, a, b):
    return _operands(ctx, a, b, dt.bool_)


@lowers(aten.logical_not.default)
def logical_not(ctx, x):
    return F.logical_not(x) if x.dtype is dt.bool_ else X.eq_ieee(x, x.const_like(0))  # NaN is truthy


@lowers(aten.logical_and.default)
def logical_and(ctx, a, b):
    return F.logical_and(*_truthy(ctx, a, b))


@lowers(aten.logical_or.default)
def logical_or(ctx, a, b):
    return F.logical_or(*_truthy(ctx, a, b))


@lowers(aten.logical_xor.default)
def logical_xor(ctx, a, b):
    x, y = _truthy(ctx, a, b)
    return F.logical_not(X.eq_ieee(x.cast(dt.int32), y.cast(dt.int32)))


def _truthy(ctx, a, b):
    def t(v):
        if isinstance(v, Tensor):
            return v if v.dtype is dt.bool_ else F.logical_not(X.eq_ieee(v, v.const_like(0)))
        return ctx.scalar(bool(v), dt.bool_)
    return t(a), t(b)


def _require_bool(ctx, name: str) -> None:
    if ctx.out_dtype() is not dt.bool_:
        raise Unsupported(f"{name} on integer tensors (Lightspeed has no bitwise primitives)")


@lowers(*overloads(aten.bitwise_and, "Tensor", "Scalar"))
def bitwise_and(ctx, a, b):
    _require_bool(ctx, "bitwise_and")
    return F.logical_and(*_bools(ctx, a, b))


@lowers(*overloads(aten.bitwise_or, "Tensor", "Scalar"))
def bitwise_or(ctx, a, b):
    _require_bool(ctx, "bitwise_or")
    return F.logical_or(*_bools(ctx, a, b))


@lowers(*overloads(aten.bitwise_xor, "Tensor", "Scalar"))
def bitwise_xor(ctx, a, b):
    _require_bool(ctx, "bitwise_xor")
    x, y = _bools(ctx, a, b)
    return F.logical_not(X.eq_ieee(x.cast(dt.int32), y.cast(dt.int32)))


@lowers(aten.bitwise_not.default)
def bitwise_not(ctx, x):
    if x.dtype is not dt.bool_:
        raise Unsupported("bitwise_not on integer tensors (Lightspeed has no bitwise primitives)")
    return F.logical_not(x)


# selection -------------------------------------------------------------------------------

@lowers(*overloads(aten.where, "self", "ScalarSelf", "ScalarOther", "Scalar"))
def where(ctx, cond, a, b):
    d = ctx.out_dtype()
    c = cond if cond.dtype is dt.bool_ else cond.cast(dt.bool_)
    return F.where(c, as_tensor(ctx, a, d), as_tensor(ctx, b, d))


@lowers(*overloads(aten.masked_fill, "Scalar", "Tensor"))
def masked_fill(ctx, x, mask, value):
    d = ctx.out_dtype()
    return F.where(mask.cast(dt.bool_), as_tensor(ctx, value, d), as_tensor(ctx, x, d))


@lowers(aten.nan_to_num.default)
def nan_to_num(ctx, x, nan=None, posinf=None, neginf=None):
    d = ctx.out_dtype()
    if not x.dtype.is_float:
        return x
    info = np.finfo(np.float32 if d is dt.float32 else (np.float16 if d is dt.float16 else np.float32))
    if d is dt.bfloat16:
        big = float(dt.bf16_to_f32(np.array([0x7F7F], np.uint16))[0])
    else:
        big = float(info.max)
    t = x.cast(compute_dtype(d))
    t = F.where(X.isnan(t), 0.0 if nan is None else float(nan), t)
    t = F.where(X.isinf(t) & (t > 0.0), big if posinf is None else float(posinf), t)
    return F.where(X.isinf(t) & (t < 0.0), -big if neginf is None else float(neginf), t)


# activations -------------------------------------------------------------------------------

@lowers(aten.gelu.default)
def gelu(ctx, x, *, approximate="none"):
    return F.gelu(as_tensor(ctx, x, float_compute(ctx.out_dtype())), approximate)


@lowers(aten.leaky_relu.default)
def leaky_relu(ctx, x, negative_slope=0.01):
    t = as_tensor(ctx, x, compute_dtype(ctx.out_dtype()))
    return F.where(t > 0.0, t, t * negative_slope)


@lowers(aten.elu.default)
def elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    t = as_tensor(ctx, x, compute_dtype(ctx.out_dtype()))
    return F.where(t > 0.0, t * scale, X.expm1(t * input_scale) * (alpha * scale))


@lowers(aten.softplus.default)
def softplus(ctx, x, beta=1.0, threshold=20.0):
    return softplus_fn(as_tensor(ctx, x, float_compute(ctx.out_dtype())), beta, threshold)


@lowers(*overloads(aten.hardsigmoid, "default"))
def hardsigmoid(ctx, x):
    t = as_tensor(ctx, x, float_compute(ctx.out_dtype()))
    return ((t + 3.0) / 6.0).clamp(0.0, 1.0)


@lowers(*overloads(aten.hardswish, "default"))
def hardswish(ctx, x):
    t = as_tensor(ctx, x, float_compute(ctx.out_dtype()))
    return t * ((t + 3.0) / 6.0).clamp(0.0, 1.0)


@lowers(*overloads(aten.logit, "default"))
def logit(ctx, x, eps=None):
    t = as_tensor(ctx, x, float_compute(ctx.out_dtype()))
    if eps is not None:
        t = t.clamp(eps, 1.0 - eps)
    return F.log(t / (1.0 - t))


@lowers(*overloads(aten.lerp, "Scalar", "Tensor"))
def lerp(ctx, start, end, weight):
    d = compute_dtype(ctx.out_dtype())
    s, e = _operands(ctx, start, end, d)
    w = as_tensor(ctx, weight, d)
    # PyTorch switches formulas at |w| = 0.5 so that w == 1 gives exactly `end`
    small = w.abs() < 0.5
    return F.where(small, s + w * (e - s), e - (e - s) * (1.0 - w))


@lowers(*overloads(aten.heaviside, "default"))
def heaviside(ctx, x, values):
    d = compute_dtype(ctx.out_dtype())
    t, v = _operands(ctx, x, values, d)
    return F.where(X.eq_ieee(t, 0.0), v, F.where(t > 0.0, 1.0, F.where(X.isnan(t), t, 0.0)))


@lowers(*overloads(aten.sinc, "default"))
def sinc(ctx, x):
    t = as_tensor(ctx, x, float_compute(ctx.out_dtype()))
    px = t * math.pi
    return F.where(X.eq_ieee(t, 0.0), 1.0, px.sin() / px)


@lowers(*overloads(aten.deg2rad, "default"))
def deg2rad(ctx, x):
    return as_tensor(ctx, x, float_compute(ctx.out_dtype())) * (math.pi / 180.0)


@lowers(*overloads(aten.rad2deg, "default"))
def rad2deg(ctx, x):
    return as_tensor(ctx, x, float_compute(ctx.out_dtype())) * (180.0 / math.pi)
