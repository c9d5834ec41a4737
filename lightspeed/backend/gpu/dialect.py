"""The GPU dialects the shared renderer writes: OpenCL C and CUDA C, as data.

Everything that differs between the two is one entry of ``Dialect``: how a kernel is declared, how a work
item finds its index, the address-space qualifier of buffer pointers, the math functions, the integer type
names and the bit casts the float16 / bfloat16 conversions use. The helpers every kernel may call
(``PRELUDE_BODY``) are written once against these macros, so both dialects compute the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import dtypes as dt
from ...ops import Op


@dataclass(frozen=True)
class Dialect:
    """How one GPU language spells the pieces the renderer needs."""

    name: str
    header: str  # macro definitions and type names (LS_FN, LS_KERNEL, LS_GLOBAL, LS_GLOBAL_ID, ls_i64, ...)
    unary: dict  # Op -> format string of the float function, e.g. "log2({})"
    fmod: str  # float remainder with C's fmod semantics (numpy's fmod)
    long_suffix: str  # suffix of a 64-bit integer literal
    block: int  # work items per work group / threads per block of a loop kernel

    def prelude(self) -> str:
        """The text every program of this dialect starts with."""
        return self.header + PRELUDE_BODY + _f2i_helpers(self.long_suffix)


_TYPES_OPENCL = """typedef char ls_i8; typedef uchar ls_u8; typedef short ls_i16; typedef ushort ls_u16;
typedef int ls_i32; typedef uint ls_u32; typedef long ls_i64; typedef ulong ls_u64;
"""
_TYPES_CUDA = """typedef signed char ls_i8; typedef unsigned char ls_u8;
typedef short ls_i16; typedef unsigned short ls_u16; typedef int ls_i32; typedef unsigned int ls_u32;
typedef long long ls_i64; typedef unsigned long long ls_u64;
"""

OPENCL = Dialect(
    name="opencl",
    header=("/* Lightspeed generated OpenCL C */\n" + _TYPES_OPENCL +
            "#define LS_FN static inline\n"
            "#define LS_KERNEL __kernel void\n"
            "#define LS_GLOBAL __global\n"
            "#define LS_GLOBAL_ID ((ls_i64)get_global_id(0))\n"
            "#define LS_LOCAL_ID ((ls_i64)get_local_id(0))\n"
            "#define LS_GROUP_ID ((ls_i64)get_group_id(0))\n"
            "#define LS_SHARED __local\n"
            "#define LS_BARRIER barrier(CLK_LOCAL_MEM_FENCE)\n"
            "#define LS_AS_UINT(x) as_uint(x)\n"
            "#define LS_AS_FLOAT(x) as_float(x)\n"
            "#define LS_INF INFINITY\n"
            "#define LS_NAN NAN\n"),
    unary={Op.LOG2: "log2({})", Op.EXP2: "exp2({})", Op.SIN: "sin({})", Op.SQRT: "sqrt({})",
           Op.RECIP: "(1.0f / ({}))"},
    fmod="fmod",
    long_suffix="L",
    block=64,
)

CUDA = Dialect(
    name="cuda",
    header=("/* Lightspeed generated CUDA C */\n" + _TYPES_CUDA +
            "#define LS_FN static __device__ __forceinline__\n"
            "#define LS_KERNEL extern \"C\" __global__ void\n"
            "#define LS_GLOBAL\n"
            "#define LS_GLOBAL_ID ((ls_i64)blockIdx.x * (ls_i64)blockDim.x + (ls_i64)threadIdx.x)\n"
            "#define LS_LOCAL_ID ((ls_i64)threadIdx.x)\n"
            "#define LS_GROUP_ID ((ls_i64)blockIdx.x)\n"
            "#define LS_SHARED __shared__\n"
            "#define LS_BARRIER __syncthreads()\n"
            "#define LS_AS_UINT(x) __float_as_uint(x)\n"
            "#define LS_AS_FLOAT(x) __uint_as_float(x)\n"
            "#define LS_INF __uint_as_float(0x7f800000u)\n"
            "#define LS_NAN __uint_as_float(0x7fc00000u)\n"),
    unary={Op.LOG2: "log2f({})", Op.EXP2: "exp2f({})", Op.SIN: "sinf({})", Op.SQRT: "sqrtf({})",
           Op.RECIP: "(1.0f / ({}))"},
    fmod="fmodf",
    long_suffix="LL",
    block=256,
)

DIALECTS = {d.name: d for d in (OPENCL, CUDA)}

# Helpers written once for both dialects. float16 values are held as their bits (ls_u16) and converted in
# software with round-to-nearest-even: OpenCL devices need not support half arithmetic (PoCL's CPU device
# does not), and the same code gives CUDA the same bits as the reference backend.
PRELUDE_BODY = r"""
LS_FN ls_i64 ls_min(ls_i64 a, ls_i64 b) { return a < b ? a : b; }
LS_FN ls_i64 ls_max(ls_i64 a, ls_i64 b) { return a > b ? a : b; }
/* floor division and modulo (Python semantics); a zero divisor gives 0 instead of trapping, because index
   arithmetic is evaluated before the guards that make it meaningful */
LS_FN ls_i64 ls_floordiv(ls_i64 a, ls_i64 b) {
    if (b == 0) return 0;
    ls_i64 q = a / b;
    return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
LS_FN ls_i64 ls_floormod(ls_i64 a, ls_i64 b) { return a - ls_floordiv(a, b) * b; }

LS_FN float ls_bf16_to_f32(ls_u16 h) { return LS_AS_FLOAT((ls_u32)h << 16); }
LS_FN ls_u16 ls_f32_to_bf16(float f) {
    ls_u32 u = LS_AS_UINT(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ls_u16)0x7fc0;  /* NaN */
    return (ls_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);     /* round to nearest even */
}
LS_FN float ls_round_bf16(float f) { return ls_bf16_to_f32(ls_f32_to_bf16(f)); }

LS_FN float ls_f16_to_f32(ls_u16 h) {
    ls_u32 sign = ((ls_u32)h & 0x8000u) << 16, e = ((ls_u32)h >> 10) & 0x1fu, m = (ls_u32)h & 0x3ffu;
    if (e == 0x1fu) return LS_AS_FLOAT(sign | 0x7f800000u | (m << 13));  /* inf, NaN */
    if (e == 0u) {  /* zero and subnormals: m * 2**-24, exact in float */
        float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return LS_AS_FLOAT(sign | ((e + 112u) << 23) | (m << 13));
}
LS_FN ls_u16 ls_f32_to_f16(float f) {
    ls_u32 x = LS_AS_UINT(f);
    ls_u32 sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (ls_u16)(sign | 0x7e00u | ((ax & 0x7fffffu) >> 13));  /* NaN stays NaN */
    if (ax >= 0x477ff000u) return (ls_u16)(sign | 0x7c00u);  /* 65520 and above round to inf */
    if (ax < 0x38800000u) {  /* below 2**-14: a subnormal half (or zero) */
        ls_u32 e = ax >> 23;
        if (e < 102u) return (ls_u16)sign;
        ls_u32 m = (ax & 0x7fffffu) | 0x800000u, s = 126u - e;
        ls_u32 h = m >> s, rem = m & ((1u << s) - 1u), tie = 1u << (s - 1u);
        if (rem > tie || (rem == tie && (h & 1u))) h++;
        return (ls_u16)(sign | h);
    }
    ls_u32 r = ax - 0x38000000u;  /* rebias the exponent from 127 to 15 */
    r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
    return (ls_u16)(sign | r);
}
LS_FN float ls_round_f16(float f) { return ls_f16_to_f32(ls_f32_to_f16(f)); }
"""

# saturating float -> int conversions (NaN -> 0), matching the reference backend
F2I = {dt.int8: ("ls_f2i8", "ls_i8"), dt.uint8: ("ls_f2u8", "ls_u8"), dt.int16: ("ls_f2i16", "ls_i16"),
       dt.uint16: ("ls_f2u16", "ls_u16"), dt.int32: ("ls_f2i32", "ls_i32"), dt.uint32: ("ls_f2u32", "ls_u32"),
       dt.int64: ("ls_f2i64", "ls_i64")}


def int_literal(v: int, suffix: str) -> str:
    """A 64-bit integer literal (INT64_MIN has none: it is written as an expression)."""
    if v == -2**63:
        return f"(-9223372036854775807{suffix} - 1)"
    return f"{v}{suffix}" if abs(v) > 2**31 - 1 else str(v)


def _f2i_helpers(suffix: str) -> str:
    lines = []
    for d, (fn, t) in F2I.items():
        info = np.iinfo(d.np)
        lo, hi = float(np.float32(info.min)), float(np.float32(info.max))  # the bounds as floats (2**31 ...)
        lines.append(f"LS_FN {t} {fn}(float x) {{ return x != x ? ({t})0 : x <= {lo:.1f}f ? "
                     f"({t})({int_literal(int(info.min), suffix)}) : x >= {hi:.1f}f ? "
                     f"({t})({int_literal(int(info.max), suffix + ('U' if d.kind == 'u' else ''))}) : ({t})x; }}")
    return "\n".join(lines) + "\n"
