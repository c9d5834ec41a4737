"""Math that PyTorch models need beyond the core frontend: IEEE-aware comparisons, rounding,
inverse trigonometry, hyperbolic functions, products. Each is a short composition of the
frontend ops and primitives; none adds a primitive.

NaN: LessThan is false whenever an operand is NaN, so ``x`` is NaN exactly when neither
``x < inf`` nor ``-inf < x`` holds. The helpers here use that to give NaN-correct results
where the core frontend (``eq``, ``maximum``) treats NaN loosely.
"""
from __future__ import annotations

import math

from .. import dtypes as dt
from .. import symbolic as sym
from ..tensor import Tensor, _norm_axis
from .elementwise import exp, log, logical_not, logical_or, sqrt, where

INF = float("inf")
# below 2**23 a float32 may have a fraction; at or above it every float32 is an integer
_EXACT = float(2 ** 23)
# atan(x) = x + x*z*P(z), z = x*x, on [0, tan(pi/8)]: a least-squares fit (max rel. error 3e-9)
_ATAN_P = (-0.06506821892, 0.1076372298, -0.1426630883, 0.1999963643, -0.3333333262)


def _f32(x: Tensor) -> Tensor:
    """Half-precision values are computed in float32 (as PyTorch does internally)."""
    return x.cast(dt.float32) if x.dtype in (dt.float16, dt.bfloat16) or not x.dtype.is_float else x


def isnan(x: Tensor) -> Tensor:
    """True where x is NaN (always False for integer and bool tensors)."""
    if not x.dtype.is_float:
        return x.const_like(False, dt.bool_) if x.ndim else x.graph.constant(False, dt.bool_)
    return logical_not(logical_or(x < INF, x > -INF))


def isinf(x: Tensor) -> Tensor:
    """True where x is +inf or -inf."""
    if not x.dtype.is_float:
        return isnan(x)
    return logical_or(x < INF, x > -INF) & logical_not(isfinite(x))


def isfinite(x: Tensor) -> Tensor:
    """True where x is neither infinite nor NaN."""
    if not x.dtype.is_float:
        return logical_not(isnan(x))
    return (x < INF) & (x > -INF)


def eq_ieee(a: Tensor, b) -> Tensor:
    """a == b with IEEE semantics: NaN equals nothing, itself included."""
    x, y = a._broadcast_pair(b, "eq")
    same = logical_not(logical_or(x < y, y < x))
    if x.dtype.is_float or y.dtype.is_float:
        same = same & logical_not(isnan(x)) & logical_not(isnan(y))
    return same


def maximum_nan(a: Tensor, b) -> Tensor:
    """Elementwise maximum that is NaN where either operand is NaN (torch.maximum)."""
    x, y = a._broadcast_pair(b, "maximum")
    out = where(x < y, y, x)  # NaN in x already propagates: x < y is false
    return where(isnan(y), y, out) if y.dtype.is_float else out


def minimum_nan(a: Tensor, b) -> Tensor:
    """Elementwise minimum that is NaN where either operand is NaN (torch.minimum)."""
    x, y = a._broadcast_pair(b, "minimum")
    out = where(y < x, y, x)
    return where(isnan(y), y, out) if y.dtype.is_float else out


# rounding ----------------------------------------------------------------------

def trunc(x: Tensor) -> Tensor:
    """Round toward zero (integers are returned unchanged; inf and NaN pass through)."""
    if not x.dtype.is_float:
        return x
    f = _f32(x)
    small = f.abs() < _EXACT
    # the cast only matters where |x| < 2**23, so it cannot overflow there
    t = where(small, f, 0.0).cast(dt.int32).cast(dt.float32)
    return where(small, t, f).cast(x.dtype)


def floor(x: Tensor) -> Tensor:
    """Largest integer <= x."""
    if not x.dtype.is_float:
        return x
    f = _f32(x)
    t = trunc(f)
    return (t - (f < t).cast(dt.float32)).cast(x.dtype)


def ceil(x: Tensor) -> Tensor:
    """Smallest integer >= x."""
    if not x.dtype.is_float:
        return x
    f = _f32(x)
    t = trunc(f)
    return (t + (f > t).cast(dt.float32)).cast(x.dtype)


def round_half_even(x: Tensor) -> Tensor:
    """Round to the nearest integer, ties to even (torch.round, numpy.round)."""
    if not x.dtype.is_float:
        return x
    f = _f32(x)
    r = floor(f + 0.5)
    tie = (r - f).eq(0.5)
    odd = (r.mod(2.0)).abs().eq(1.0)
    r = where(tie & odd, r - 1.0, r)
    return where(f.abs() < _EXACT / 2, r, f).cast(x.dtype)


# exponentials and logarithms near zero -------------------------------------------

def expm1(x: Tensor) -> Tensor:
    """e**x - 1, accurate near 0 (u - 1 scaled by x / log(u), Kahan's trick)."""
    f = _f32(x)
    u = exp(f)
    um1 = u - 1.0
    # where() is a select: the NaN of 0/0 at u == 1 never leaks
    out = where(u.eq(1.0), f, where(um1.abs() > 0.5, um1, um1 * f / log(u)))
    return out.cast(x.dtype) if x.dtype.is_float else out


def log1p(x: Tensor) -> Tensor:
    """log(1 + x), accurate near 0 (log(u) scaled by x / (u - 1) with u = 1 + x)."""
    f = _f32(x)
    u = f + 1.0
    d = u - 1.0
    out = where(d.eq(0.0), f, log(u) * (f / d))
    out = where(isinf(f), log(u), out)
    return out.cast(x.dtype) if x.dtype.is_float else out


# trigonometry -------------------------------------------------------------------

def _atan_unit(t: Tensor) -> Tensor:
    """atan(t) for 0 <= t <= 1."""
    # tan(pi/8) splits [0, 1]: above it atan(t) = pi/4 + atan((t - 1) / (t + 1))
    hi = t > math.tan(math.pi / 8)
    r = where(hi, (t - 1.0) / (t + 1.0), t)
    z = r * r
    p = z * 0.0 + _ATAN_P[0]
    for c in _ATAN_P[1:]:
        p = p * z + c
    a = r + r * z * p
    return where(hi, a + math.pi / 4, a)


def atan(x: Tensor) -> Tensor:
    """Arctangent, radians."""
    f = _f32(x)
    t = f.abs()
    big = t > 1.0
    a = _atan_unit(where(big, where(big, t, 1.0).recip(), t))
    a = where(big, math.pi / 2 - a, a)
    out = where(f < 0.0, -a, a)
    return where(isnan(f), f, out).cast(x.dtype) if x.dtype.is_float else out


def atan2(y: Tensor, x) -> Tensor:
    """The angle of the point (x, y), in (-pi, pi]."""
    yy, xx = y._broadcast_pair(x, "atan2")
    yy, xx = _f32(yy), _f32(xx)
    ay, ax = yy.abs(), xx.abs()
    swap = ay > ax
    num = where(swap, ax, ay)
    den = where(swap, ay, ax)
    both_zero = den.eq(0.0)
    # both infinite: the angle is a multiple of pi/4
    both_inf = isinf(num) & isinf(den)
    ratio = where(both_zero | both_inf, where(both_inf, 1.0, 0.0), num / where(both_zero, 1.0, den))
    a = _atan_unit(ratio)
    a = where(swap, math.pi / 2 - a, a)
    a = where(xx < 0.0, math.pi - a, a)
    a = where(yy < 0.0, -a, a)
    return where(isnan(xx) | isnan(yy), xx + yy, a)


def asin(x: Tensor) -> Tensor:
    """Arcsine, radians (NaN outside [-1, 1])."""
    f = _f32(x)
    out = atan2(f, sqrt((1.0 - f) * (1.0 + f)))
    return out.cast(x.dtype) if x.dtype.is_float else out


def acos(x: Tensor) -> Tensor:
    """Arccosine, radians (NaN outside [-1, 1])."""
    f = _f32(x)
    out = atan2(sqrt((1.0 - f) * (1.0 + f)), f)
    return out.cast(x.dtype) if x.dtype.is_float else out


# pi/2 as the sum of two float32 values: HALF_PI_HI - x is exact for x in [pi/4, pi]
_HALF_PI_HI = 1.5707963705062866
_HALF_PI_LO = -4.371139006309477e-08


def tan(x: Tensor) -> Tensor:
    """Tangent, as sin/cos. Near the poles cos(|x|) is taken as sin(pi/2 - |x|) with pi/2 split
    in two parts, so the small denominator keeps its relative precision."""
    f = _f32(x)
    a = f.abs()
    near_pole = (a > math.pi / 4) & (a < math.pi)
    c = where(near_pole, ((_HALF_PI_HI - a) + _HALF_PI_LO).sin(), f.cos())
    out = f.sin() / c
    return out.cast(x.dtype) if x.dtype.is_float else out


# hyperbolic functions --------------------------------------------------------------

def sinh(x: Tensor) -> Tensor:
    """Hyperbolic sine (a Taylor polynomial near 0, where the exponentials cancel)."""
    f = _f32(x)
    z = f * f
    series = f * (1.0 + z * (1.0 / 6 + z * (1.0 / 120 + z * (1.0 / 5040))))
    e = exp(f.abs())
    far = (e - e.recip()) * 0.5
    far = where(f < 0.0, -far, far)
    out = where(f.abs() < 0.5, series, far)
    return out.cast(x.dtype) if x.dtype.is_float else out


def cosh(x: Tensor) -> Tensor:
    """Hyperbolic cosine."""
    f = _f32(x)
    e = exp(f.abs())
    out = (e + e.recip()) * 0.5
    return out.cast(x.dtype) if x.dtype.is_float else out


def asinh(x: Tensor) -> Tensor:
    """Inverse hyperbolic sine."""
    f = _f32(x)
    a = f.abs()
    big = a > 1e18  # a*a would overflow: asinh(a) = log(2a) there
    inner = log1p(a + a * a / (sqrt(a * a + 1.0) + 1.0))
    out = where(big, log(a) + math.log(2.0), inner)
    out = where(f < 0.0, -out, out)
    return out.cast(x.dtype) if x.dtype.is_float else out


def acosh(x: Tensor) -> Tensor:
    """Inverse hyperbolic cosine (NaN below 1)."""
    f = _f32(x)
    big = f > 1e18
    t = f - 1.0
    inner = log1p(t + sqrt(t * t + t * 2.0))
    out = where(big, log(f) + math.log(2.0), inner)
    return out.cast(x.dtype) if x.dtype.is_float else out


def atanh(x: Tensor) -> Tensor:
    """Inverse hyperbolic tangent."""
    f = _f32(x)
    out = log1p(f * 2.0 / (1.0 - f)) * 0.5
    return out.cast(x.dtype) if x.dtype.is_float else out


def erfinv(x: Tensor) -> Tensor:
    """Inverse error function: a closed-form first guess (Winitzki's, a = 0.147) refined by
    three Newton steps on erf(y) = x. NaN outside [-1, 1], +-inf at +-1."""
    from .elementwise import erf
    f = _f32(x)
    a = 0.147
    ln = log((1.0 - f) * (1.0 + f))
    t = 2.0 / (math.pi * a) + ln * 0.5
    y = sqrt(sqrt(t * t - ln * (1.0 / a)) - t)
    y = where(f < 0.0, -y, y)
    for _ in range(3):
        # erf'(y) = 2/sqrt(pi) * exp(-y^2)
        y = y - (erf(y) - f) / (exp(-(y * y)) * (2.0 / math.sqrt(math.pi)))
    edge = f.abs().eq(1.0)
    out = where(edge, where(f > 0.0, INF, -INF), y)
    out = where((f.abs() > 1.0) | isnan(f), float("nan"), out)
    return out.cast(x.dtype) if x.dtype.is_float else out


# sliding windows ---------------------------------------------------------------------

def strided_slice(x: Tensor, axis: int, start: int, count: sym.sint, step: int) -> Tensor:
    """x[start : start + count*step : step] along ``axis`` as a view; ``count`` may be symbolic.
    The axis is padded (a view: nothing is allocated) so that the last block always fits; for a
    symbolic length the padding also covers the length's range, which lets the bounds prover see
    that the block fits without reasoning about the floor division inside ``count``."""
    axis = _norm_axis(axis, x.ndim, "strided_slice")
    n = sym.to_expr(x.shape[axis])
    pads = [(0, 0)] * x.ndim
    pads[axis] = (0, step + (n.hi - n.lo if not sym.is_const(n) else 0))
    t = x.pad(pads)
    keep = [None] * x.ndim
    keep[axis] = (start, sym.add(start, sym.mul(count, step)))
    t = t.shrink(keep)
    t = t.reshape(t.shape[:axis] + (count, step) + t.shape[axis + 1:])
    pick = [None] * t.ndim
    pick[axis + 1] = (0, 1)
    t = t.shrink(pick)
    return t.reshape(t.shape[:axis + 1] + t.shape[axis + 2:])


def windows(x: Tensor, axis: int, kernel: int, stride: int = 1, dilation: int = 1) -> Tensor:
    """Sliding windows like ``frontend.unfold`` (axis -> [Lout, kernel]); also for a symbolic
    length with stride > 1, where the windows are ``kernel`` strided slices stacked together."""
    from .conv import unfold
    from .combine import stack
    axis = _norm_axis(axis, x.ndim, "windows")
    length = x.shape[axis]
    if sym.is_const(length) or stride == 1:
        return unfold(x, axis, kernel, stride, dilation)
    span = dilation * (kernel - 1) + 1
    if not sym.proven_ge(length, span):
        raise ValueError(f"windows: axis {axis} (length {length}) may be shorter than the window span {span}")
    count = sym.add(sym.floordiv(sym.add(length, -span), stride), 1)
    taps = [strided_slice(x, axis, j * dilation, count, stride) for j in range(kernel)]
    return stack(taps, axis + 1)


# reductions ------------------------------------------------------------------------

def prod(x: Tensor, axis: int, keepdim: bool = False) -> Tensor:
    """Product over one static axis, by halving: pad with 1s to a power of two, then multiply
    the two halves until one element is left (log2(n) multiplications of views)."""
    axis = _norm_axis(axis, x.ndim, "prod")
    n = x.shape[axis]
    if not sym.is_const(n):
        raise NotImplementedError(f"prod: the reduced axis must have a static size, got {n}")
    n = int(n)
    if n == 0:
        shape = tuple(1 if k == axis else s for k, s in enumerate(x.shape))
        out = x.graph.constant(1, x.dtype).reshape((1,) * x.ndim).expand(shape)
    else:
        m = 1
        while m < n:
            m *= 2
        out = x
        if m != n:
            pads = [(0, 0)] * x.ndim
            pads[axis] = (0, m - n)
            out = x.pad(pads, value=1)
        while m > 1:
            m //= 2
            lo = [None] * x.ndim
            hi = [None] * x.ndim
            lo[axis], hi[axis] = (0, m), (m, 2 * m)
            out = out.shrink(lo) * out.shrink(hi)
    return out if keepdim else out.squeeze(axis)


def any_true(x: Tensor, axis) -> Tensor:
    """Whether any element along ``axis`` (an int or a list of ints) is non-zero, keeping no axes."""
    b = x if x.dtype is dt.bool_ else logical_not(eq_ieee(x, x.const_like(0)))
    return b.cast(dt.int32).max(axis).cast(dt.bool_)


__all__ = ["isnan", "isinf", "isfinite", "eq_ieee", "maximum_nan", "minimum_nan", "trunc", "floor", "ceil",
           "round_half_even", "expm1", "log1p", "atan", "atan2", "asin", "acos", "tan", "sinh", "cosh", "asinh",
           "acosh", "atanh", "erfinv", "strided_slice", "windows", "prod", "any_true"]
