"""Render a KernelPlan as one C translation unit exporting ``ls_graph(bufs, dims, arena)``.

Each kernel becomes a static function over a range of parallel work items, run by
the warm thread pool of the native runtime when the work is large enough, inline
otherwise. Inner reductions and gathers are GNU statement expressions, so a value
under a validity guard (padding) is never evaluated out of bounds.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
from pathlib import Path

from ... import dtypes as dt
from ... import symbolic as sym
from ...kernel import ir
from ...kernel.fusion import KernelPlan
from ...kernel.ir import dense_offset, loop_var
from ...kernel.heuristics import Target, gemm_schedule
from ...kernel.schedule import Grain, Register, Schedule
from ...kernel.matmul_form import inner_var, match_matmul
from ...kernel.quantized import (FEW_ROWS_INT16_QTYPES, HALF_QTYPES, TEMPLATE_QTYPES, activation_scratch_layout,
                                 quantized_rows_bound)
from ...quant import QType, block_format
from ...ops import Op
from .cse import Cse, is_node, sym_c
from .gemm import render_gemm, vector_helpers
from .target import host_target
from .ctext import float_literal
from .matvec import blocked_form, render_matvec
from .loop_split import Split, split_inner, split_reductions, substitute

PRELUDE = "".join((Path(__file__).with_name(h)).read_text()
                  for h in ("prelude.h", "qdecode.h", "qdot16x16.h", "qdot16x4.h", "qamx.h", "qvnni.h", "qgemm.h",
                            "repack8.h", "repack.h", "qdot16k.h", "hgemm.h", "idot.h"))
# defaults of what a kernel's schedule may set (Grain, a tiled kernel's Register n / m): read, never written
PARALLEL_GRAIN = 1 << 15  # estimated operations below which a kernel runs on the calling thread
TILE = 16  # outputs accumulated at once by a tiled reduction
SHORT_REDUCE = 8  # a constant reduction of at most this many terms is written out term by term
QMM_L2_BYTES = 64 * 1024  # weight bytes per work item of a quantized matmul (re-read from L2 per row group)
QMM_DECODE_BYTES = 16 * 1024  # ... when one row group is all there is (decode): small items balance the threads
QMM_ROWS = 8  # activation rows per pass over a weight row (LS_QMM_ROWS in qdecode.h)
QDOT_QTYPES = (QType.Q8_0, QType.Q4_0, QType.Q4_1)  # with qdecode.h's row-group kernels (AVX-512)
ROW_BLOCK = 4  # rows accumulated at once by a tiled reduction (register blocking)

# --- lowered kernels (search hook): schedule name -> function (renderer, kernel) -> (function, launch)
from .attention import render_attention  # noqa: E402

LOWERED_RENDERERS = {"attention": render_attention}

STORAGE = {
    dt.float32: "float", dt.float16: "_Float16", dt.bfloat16: "uint16_t", dt.int8: "int8_t", dt.uint8: "uint8_t",
    dt.int16: "int16_t", dt.uint16: "uint16_t", dt.int32: "int32_t", dt.uint32: "uint32_t", dt.int64: "int64_t",
    dt.bool_: "uint8_t",
}
UNSIGNED_OF = {"int8_t": "uint8_t", "int16_t": "uint16_t", "int32_t": "uint32_t", "int64_t": "uint64_t",
               "uint8_t": "uint8_t", "uint16_t": "uint16_t", "uint32_t": "uint32_t"}
# unary primitives in C (float compute type); exp2/log2/sin are the prelude's vectorisable versions
UNARY_C = {Op.LOG2: "ls_log2f({})", Op.EXP2: "ls_exp2f({})", Op.SIN: "ls_sinf({})", Op.SQRT: "sqrtf({})",
           Op.RECIP: "(1.0f / ({}))"}
F2I = {dt.int8: "ls_f2i8", dt.uint8: "ls_f2u8", dt.int16: "ls_f2i16", dt.uint16: "ls_f2u16", dt.int32: "ls_f2i32",
       dt.uint32: "ls_f2u32", dt.int64: "ls_f2i64"}


def compute_type(d: dt.DType) -> str:
    """The C type values of ``d`` are computed in."""
    if d.is_float:
        return "float"
    if d is dt.bool_:
        return "int"
    return STORAGE[d]


WHOLE_LIMIT = 1 << 24  # float32 holds every whole number up to this exactly


def whole_range(x: ir.IR) -> tuple[int, int] | None:
    """(lo, hi) when float value ``x`` is a whole number in [lo, hi] with 0 <= lo and hi < 2**24 at every
    index, and so is every float value it is computed from (so none of them is -0.0), else None: casts of
    unsigned or bounded integers, non-negative whole constants, and sums, products and modulos of such
    values (a modulo by a constant c >= 1 lies in [0, c - 1])."""
    if isinstance(x, ir.Const):
        v = x.value
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer() and 0 <= v < WHOLE_LIMIT
        return (int(v), int(v)) if ok and math.copysign(1.0, float(v)) > 0 else None
    if isinstance(x, ir.Cast) and not x.arg.dtype.is_float:
        src = x.arg.dtype
        if src is dt.bool_:
            return (0, 1)
        lo, hi = (0, 2 ** (8 * src.itemsize) - 1) if src.kind == "u" else (None, None)
        if lo is None or hi >= WHOLE_LIMIT:
            return None
        return (lo, hi)
    if isinstance(x, ir.Alu) and x.dtype.is_float and x.op in (Op.ADD, Op.MUL, Op.MOD):
        r = [whole_range(a) for a in x.args]
        if None in r:
            return None
        (alo, ahi), (blo, bhi) = r
        if x.op is Op.ADD:
            lo, hi = alo + blo, ahi + bhi
        elif x.op is Op.MUL:
            lo, hi = alo * blo, ahi * bhi
        else:
            if blo < 1:
                return None
            lo, hi = 0, min(ahi, bhi - 1)
        return (lo, hi) if hi < WHOLE_LIMIT else None
    return None


class KernelRenderer:
    """Renders the IR of one kernel; keeps counters for unique local names."""

    def __init__(self, plan: KernelPlan, target: Target | None = None):
        self.plan = plan
        self.target = target or host_target()  # what default schedules are chosen for
        self.dims = set(plan.dims)
        self.rename: dict[sym.Var, str] = {}  # loop variables rendered as an expression (unrolled copies)
        self.cse: Cse | None = None  # while an expression renders: its repeated subexpressions are named once
        self.gemm_support: dict[str, str] = {}  # micro-kernels the plan's gemm kernels call, by name
        self.uses_integer_dot = False  # a matvec rendered an IntegerDot form (matvec.py): its launch type
        self.gemm_widths: set[int] = set()  # vector lane counts they use
        self.pack_floats = 0  # floats of the per-thread packing buffer they need
        self.start_kernel(None)

    def start_kernel(self, k: ir.Kernel | None) -> None:
        """Reset the per-kernel names: buffers and loop variables are numbered in order of use, so two
        kernels that differ only in which buffers they touch render to the same text (and one function)."""
        self.n = 0
        self.local: dict[sym.Var, str] = {}
        self.kbufs: dict[int, int] = {}
        # the kernel's schedule (kernel/schedule.py): what its form reads of it (grain, tiled blocks) is read
        # when it renders, so a search that edits the schedule changes this kernel alone
        self.kernel_schedule = k.schedule if k is not None and k.schedule is not None else Schedule()
        self.kernel_kind = k.kind if k is not None else None
        if k is not None:
            for b in self.kernel_buffers(k):
                self.kbufs[id(b)] = len(self.kbufs)

    @staticmethod
    def kernel_buffers(k: ir.Kernel) -> list[ir.Buffer]:
        return [k.out] + [b for b in k.reads if b is not k.out] + list(k.scratch)

    def var(self, v: sym.Var) -> str:
        """C name of a variable: program dimensions are D_<name>, loop variables get per-kernel names."""
        if v in self.rename:
            return self.rename[v]
        if v in self.dims:
            return f"D_{v.name}"
        name = self.local.get(v)
        if name is None:
            name = self.local[v] = f"{v.name.rstrip('0123456789')}_{len(self.local)}"
        return name

    def idx(self, e: sym.sint) -> str:
        """C text of an index expression (int64), its repeated subexpressions named once (cse.py)."""
        if not is_node(e):
            return sym.render_c(e, self.var)
        if self.cse is None:
            return self._named_once(e, self.idx)
        return self.cse.node(e, lambda: sym_c(e, self.idx, self.guarded), "int64_t")

    def _named_once(self, root, entry) -> str:
        def new_name() -> str:
            self.n += 1
            return f"_x{self.n}"
        self.cse = Cse(new_name)
        try:
            return self.cse.run(root, entry)
        finally:
            self.cse = None

    def guarded(self, x, bound: sym.Var | None = None) -> str:
        """C text of an operand (IR or index) that the text around it evaluates only under a condition
        (``bound``: the loop or gather variable it reads); nothing in it is named outside that condition."""
        entry = self.expr if isinstance(x, ir.IR) else self.idx
        if self.cse is None:
            return entry(x)
        return self.cse.region(x, entry, bound)

    def buf(self, b: ir.Buffer) -> str:
        return f"bp{self.kbufs[id(b)]}"

    def load(self, b: ir.Buffer, off: sym.sint) -> str:
        ref = f"{self.buf(b)}[{self.idx(off)}]"
        if b.dtype is dt.bfloat16:
            return f"ls_bf16_to_f32({ref})"
        if b.dtype is dt.float16:
            return f"((float){ref})"
        if b.dtype is dt.bool_:
            return f"((int){ref})"
        return ref

    def store_value(self, d: dt.DType, v: str) -> str:
        if d is dt.bfloat16:
            return f"ls_f32_to_bf16({v})"
        if d is dt.float16:
            return f"(_Float16)({v})"
        if d is dt.bool_:
            return f"(uint8_t)(({v}) != 0)"
        return f"({STORAGE[d]})({v})"

    def const(self, value, d: dt.DType) -> str:
        if d.is_float:
            return float_literal(float(value))
        if d is dt.bool_:
            return "1" if value else "0"
        if d is dt.int64:
            return f"((int64_t){int(value)}LL)"
        return f"(({STORAGE[d]}){int(value)})"

    def zero(self, d: dt.DType) -> str:
        return "0.0f" if d.is_float else "0"

    def expr(self, x: ir.IR) -> str:
        """C expression for IR ``x`` in its compute type, its repeated subexpressions named once (cse.py)."""
        if not is_node(x):
            return self._expr(x)
        if self.cse is None:
            return self._named_once(x, self.expr)
        return self.cse.node(x, lambda: self._expr(x), compute_type(x.dtype))

    def _expr(self, x: ir.IR) -> str:
        if isinstance(x, ir.Load):
            return self.load(x.buf, x.offset)
        if isinstance(x, ir.Const):
            return self.const(x.value, x.dtype)
        if isinstance(x, ir.Index):
            return f"(({compute_type(x.dtype)})({self.idx(x.expr)}))"
        if isinstance(x, ir.Select):
            return f"(({self.idx(x.valid)}) ? ({self.guarded(x.value)}) : {self.zero(x.dtype)})"
        if isinstance(x, ir.Cast):
            return self.cast(x.arg, x.dtype)
        if isinstance(x, ir.Alu):
            return self.round16(self.alu(x), x.dtype)
        if isinstance(x, ir.Reduce):
            return self.round16(self.reduce(x), x.dtype)
        if isinstance(x, ir.Gather):
            return self.gather(x)
        if isinstance(x, ir.Bound):
            return x.name
        if isinstance(x, ir.Bytes):  # one load and conversion (sign extension, F16C where there is one)
            if x.stored is dt.int8:
                return f"((float)((const int8_t *){self.buf(x.buf)})[{self.idx(x.offset)}])"
            return f"ls_f16_at({self.buf(x.buf)} + ({self.idx(x.offset)}))"
        raise NotImplementedError(f"C renderer: {type(x).__name__}")

    @staticmethod
    def round16(v: str, d: dt.DType) -> str:
        """16-bit float values are computed in float and rounded after every op, as the reference does."""
        if d is dt.float16:
            return f"((float)(_Float16)({v}))"
        if d is dt.bfloat16:
            return f"ls_bf16_to_f32(ls_f32_to_bf16({v}))"
        return v

    def cast(self, arg: ir.IR, to: dt.DType) -> str:
        v, src = self.expr(arg), arg.dtype
        if to is dt.bool_:
            return f"(({v}) != 0)"
        if to.is_float:
            if to is dt.float16:
                return f"((float)(_Float16)({v}))"
            if to is dt.bfloat16:
                return f"ls_bf16_to_f32(ls_f32_to_bf16((float)({v})))"
            return f"((float)({v}))"
        if src.is_float:
            return f"{F2I[to]}({v})"
        return f"(({STORAGE[to]})({v}))"

    def alu(self, x: ir.Alu) -> str:
        op, d = x.op, x.dtype
        a = self.operands(x)
        if op in UNARY_C:
            return UNARY_C[op].format(a[0])
        if op is Op.LESS_THAN:
            return f"(({a[0]}) < ({a[1]}))"
        if op is Op.MUL:
            ta, tb = x.args[0].dtype, x.args[1].dtype
            if ta is dt.bool_ and tb is dt.bool_:
                return f"(({a[0]}) & ({a[1]}))"
            if ta is dt.bool_:
                return f"(({a[0]}) ? ({a[1]}) : {self.zero(d)})"
            if tb is dt.bool_:
                return f"(({a[1]}) ? ({a[0]}) : {self.zero(d)})"
        if op is Op.MOD:
            if d.is_float:
                if d is dt.float32 and whole_range(x) is not None:
                    # both operands are whole numbers >= 0 (a byte of a quantized block, say): the integer
                    # remainder is fmodf's exact value, and it vectorises (fmodf is a libm call)
                    return f"((float)((uint32_t)({a[0]}) % (uint32_t)({a[1]})))"
                c = x.args[1]
                if d is dt.float32 and isinstance(c, ir.Const) and float(c.value) > 0 and \
                        math.isfinite(float(c.value)) and math.frexp(float(c.value))[0] == 0.5:
                    return f"ls_fmod_pow2({a[0]}, {a[1]}, {float_literal(1.0 / float(c.value))})"
                return f"fmodf({a[0]}, {a[1]})"
            t = compute_type(d)
            # x % 0 is 0 (as in the reference) and x % -1 is 0 (INT_MIN % -1 would trap)
            return f"({{ {t} _m = ({a[1]}); (_m == 0 || _m == -1) ? ({t})0 : ({t})(({a[0]}) % _m); }})"
        sym_op = "+" if op is Op.ADD else "*"
        if d.is_float:
            return f"(({a[0]}) {sym_op} ({a[1]}))"
        t = compute_type(d)
        u = UNSIGNED_OF.get(t, t)  # wrap-around integer arithmetic, as numpy does
        return f"(({t})(({u})({a[0]}) {sym_op} ({u})({a[1]})))"

    def operands(self, x: ir.Alu) -> list[str]:
        """The texts of ``x``'s operands in order; the dividend of an integer modulo and the value operand of
        a product with a boolean are evaluated only under a condition (see ``alu``)."""
        ta = [s.dtype is dt.bool_ for s in x.args]
        if x.op is Op.MOD and not x.dtype.is_float:
            cond = {0}
        elif x.op is Op.MUL and ta[0] != ta[1]:
            cond = {1 if ta[0] else 0}
        else:
            cond = set()
        return [self.guarded(s) if i in cond else self.expr(s) for i, s in enumerate(x.args)]

    def _acc_type(self, d: dt.DType) -> str:
        return "float" if d.is_float else ("int64_t" if d.kind in "ib" else "uint64_t")

    def reduce(self, x: ir.Reduce) -> str:
        self.n += 1
        acc = f"acc{self.n}"
        t = self._acc_type(x.dtype)
        init = self.reduce_init(x)
        body = self.guarded(x.body, x.var)
        nested = any(isinstance(y, (ir.Reduce, ir.Gather)) for y in x.body.walk())
        v = self.var(x.var)
        loop = f"for (int64_t {v} = 0; {v} < {self.idx(x.size)}; {v}++)"
        # a few terms (a pooling window) are written out, one block per term with its index a constant, so
        # the loop over outputs around them vectorises (GCC vectorises no loop around one it has not unrolled)
        short = sym.is_const(x.size) and 0 < int(x.size) <= SHORT_REDUCE and not nested

        def terms(step: str, pragma: str) -> str:
            if short:
                return " ".join(f"{{ const int64_t {v} = {i}; {step}; }}" for i in range(int(x.size)))
            return f"{pragma}{loop} {{ {step}; }}"

        if x.op is Op.MAX_REDUCE and x.dtype.is_float:
            # a plain max vectorises; NaN (which numpy propagates) is tracked in a separate flag (counted in the
            # written-out form: an OR of it beside a select keeps GCC from vectorising the loop around)
            nan = f"nan{self.n}"
            pragma = "" if nested else f'_Pragma("omp simd reduction(max:{acc}) reduction(|:{nan})") '
            flag = f"{nan} += _v != _v" if short else f"{nan} |= _v != _v"
            step = f"float _v = ({body}); {flag}; {acc} = _v > {acc} ? _v : {acc}"
            return f"({{ float {acc} = {init}; int {nan} = 0; {terms(step, pragma)} {nan} ? NAN : {acc}; }})"
        pragma = ""
        if x.op is Op.SUM_REDUCE and not nested:
            pragma = f'_Pragma("omp simd reduction(+:{acc})") '
        step = self.reduce_step(x, acc, body)
        return f"({{ {t} {acc} = {init}; {terms(step, pragma)} ({compute_type(x.dtype)}){acc}; }})"

    def reduce_init(self, x: ir.Reduce) -> str:
        if x.op is Op.SUM_REDUCE:
            return "0.0f" if x.dtype.is_float else "0"
        if x.dtype.is_float:
            return "(-INFINITY)"
        if x.dtype is dt.int64:
            return "INT64_MIN"
        return f"({int(np.iinfo(x.dtype.np).min)}LL)" if x.dtype.kind == "i" else "0"

    def reduce_step(self, x: ir.Reduce, acc: str, body: str) -> str:
        if x.op is Op.SUM_REDUCE:
            return f"{acc} += ({body})"
        if x.dtype.is_float:
            return f"{acc} = ls_maxf({acc}, ({body}))"
        return f"{{ {self._acc_type(x.dtype)} _v = ({body}); {acc} = _v > {acc} ? _v : {acc}; }}"

    def gather(self, x: ir.Gather) -> str:
        g = self.var(x.var)
        return (f"({{ const int64_t {g} = (int64_t)({self.expr(x.index)}); ({g} >= 0 && {g} < "
                f"{self.guarded(x.rows)}) ? ({self.guarded(x.body, x.var)}) : {self.zero(x.dtype)}; }})")

    # kernels -----------------------------------------------------------------------
    def kernel(self, k: ir.Kernel) -> tuple[str, str]:
        """(the kernel's static function, the statement in ls_graph that runs it)."""
        self.start_kernel(k)
        if k.kind == "qmatmul":
            return self.quantized_matmul(k)
        if k.kind in LOWERED_RENDERERS:  # --- lowered kernels (search hook), e.g. attention.py
            return LOWERED_RENDERERS[k.kind](self, k)
        if k.kind == "gemm":
            form = match_matmul(k.value, k.loop_vars)
            if form is None:
                raise ValueError(f"kernel {k.name}: kind 'gemm' but its value is not matmul-like")
            small = self.few_rows(k, form, "tiled")
            epilogue_pass = None
            if k.epilogue is not None:  # in place over the output: reads each element, then stores it
                epilogue_pass = self.loop_kernel(dataclasses.replace(k, value=k.epilogue, kind="loop",
                                                                     epilogue=None), "loop")
            sched = k.schedule
            if sched is None or sched.find(Register) is None:  # knobs alone (a grain): the heuristics' under them
                sched = gemm_schedule(self.target).with_steps(*(sched.steps if sched is not None else ()))
            return render_gemm(self, k, sched, form, small,
                               dense_offset(k.loop_vars, k.shape), self.parallel_grain(), epilogue_pass)
        if k.kind == "loop":
            form = match_matmul(k.value, k.loop_vars)  # a matmul too small for a gemm kernel (a matvec)
            if form is not None:
                return self.few_rows(k, form, "loop")  # kernel formation chose the loop form over the tiled
            return self.loop_kernel(self.blocked_reductions(k), k.kind)
        return self.loop_kernel(k, k.kind)

    def few_rows(self, k: ir.Kernel, form, along_n: str) -> tuple[str, str]:
        """A matmul-like kernel for calls with few rows: blocked dot products (matvec.py) when b is read along
        k, else the loop form ``along_n`` ("tiled": vectorised along n; "loop": as kernel formation chose)."""
        if inner_var(form.b, k.loop_vars[form.n], form.reduce.var) is k.loop_vars[form.n]:
            return self.loop_kernel(k if along_n == "tiled" else self.blocked_reductions(k), along_n)
        blocks = blocked_form(form, k)
        if blocks is None:
            return self.loop_kernel(self.blocked_reductions(k), "loop")
        return render_matvec(self, k, form, blocks, dense_offset(k.loop_vars, k.shape), self.parallel_grain())

    @staticmethod
    def blocked_reductions(k: ir.Kernel) -> ir.Kernel:
        """``k`` with its block-structured sums split at the block size (loop_split.split_reduction)."""
        value = split_reductions(k.value, loop_var)
        return k if value is k.value else dataclasses.replace(k, value=value)

    def parallel_grain(self) -> int:
        """Estimated operations below which the kernel rendering now runs on the calling thread: its
        schedule's ``Grain``, else ``PARALLEL_GRAIN``."""
        g = self.kernel_schedule.find(Grain)
        return g.ops if g is not None else PARALLEL_GRAIN

    def tiled_blocks(self) -> tuple[int, int]:
        """(TILE columns, ROW_BLOCK rows) a tiled reduction accumulates per step: a "tiled" kernel's schedule
        (``Register("n")``, ``Register("m")``) over the module defaults; a gemm kernel's few-rows tiled form
        keeps the defaults (its schedule's register block is the micro-kernel's)."""
        if self.kernel_kind != "tiled":
            return TILE, ROW_BLOCK
        s = self.kernel_schedule
        return s.size(Register, "n", TILE), s.size(Register, "m", ROW_BLOCK)

    def loop_kernel(self, k: ir.Kernel, kind: str) -> tuple[str, str]:
        """A kernel of loop form ``kind`` ("loop", "tiled" or "scatter"): (function, launch)."""
        shape, vars_ = list(k.shape), list(k.loop_vars)
        if not shape:  # a scalar: one iteration of a size-1 loop
            shape, vars_ = [1], [loop_var("ko_scalar", 1)]
        outer, last = shape[:-1], shape[-1]
        blocked = kind == "tiled" and len(outer) >= 1  # rows of the tiled reduction go MR at a time
        rb = self.tiled_blocks()[1]  # rows a step of a tiled reduction accumulates
        lines = ["static void KFN(void *vctx, int64_t p0, int64_t p1) {",
                 "    const ls_launch *l = (const ls_launch *)vctx;", "    const ls_args *a = l->a;", "    (void)a;"]
        lines += [f"    {d}" for d in self.decls(k)]
        if blocked:
            M = self.idx(outer[-1])
            P = self.idx(sym.mul(sym.prod(outer[:-1]), sym.floordiv(sym.add(outer[-1], rb - 1), rb)))
        else:
            P = self.idx(sym.prod(outer)) if outer else "1"
        L = self.idx(last)
        dense = dense_offset(vars_, shape) if k.shape else 0
        plain = kind not in ("tiled", "scatter")
        split = split_inner(k.value, dense, vars_[-1], last, loop_var) if plain else None
        # a split loop's chunks hold whole groups of split.c elements
        C = f"((L + nch - 1) / nch + {split.c - 1}) / {split.c} * {split.c}" if split else "(L + nch - 1) / nch"
        lines += [f"    const int64_t P = {P}, L = {L};", "    (void)P;",
                  f"    const int64_t nch = ls_chunks(P, L), C = {C};",
                  "    for (int64_t p = p0; p < p1; p++) {",
                  "        int64_t row = p / nch;", "        const int64_t ch = p % nch;"]
        decomposed = list(zip(vars_[:-1], outer))
        if blocked:
            decomposed = decomposed[:-1]
            lines.append(f"        const int64_t m0 = (row % (({M} + {rb - 1}) / {rb})) * {rb}; "
                         f"row /= ({M} + {rb - 1}) / {rb};")
            lines.append(f"        const int64_t mr = ls_min({rb}, {M} - m0);")
        for v, s in reversed(decomposed):
            lines.append(f"        const int64_t {self.var(v)} = row % {self.idx(s)}; row /= {self.idx(s)};")
        lines += ["        (void)row;", "        const int64_t jb = ch * C, je = ls_min(L, jb + C);"]
        jv = self.var(vars_[-1])
        if kind == "tiled":
            lines += self.tiled_body(k, vars_, jv, vars_[-2] if blocked else None)
        elif kind == "scatter":
            lines += self.scatter_body(k, vars_, jv)
        elif split is not None:
            lines += self.split_loop_body(k, vars_[-1], dense, split)
        else:
            value = self.expr(k.value)
            nested = any(isinstance(y, (ir.Reduce, ir.Gather)) for y in k.value.walk())
            off = self.idx(dense)
            if not nested:
                lines.append("        _Pragma(\"omp simd\")")
            lines += [f"        for (int64_t {jv} = jb; {jv} < je; {jv}++) {{",
                      f"            {self.buf(k.out)}[{off}] = {self.store_value(k.out.dtype, value)};",
                      "        }"]
        lines += ["    }", "}"]
        work = sym.mul(sym.prod(shape), self.work_per_item(k.value))
        call = (f"    {{ const int64_t P = {P}, L = {L}; const int64_t n = P * ls_chunks(P, L);\n"
                f"      if (({self.idx(work)}) >= {self.parallel_grain()}) ls_parallel_for(KFN, &l, n); "
                f"else KFN(&l, 0, n); }}")
        return "\n".join(lines), call

    def split_loop_body(self, k: ir.Kernel, j: sym.Var, dense: sym.sint, split: Split) -> list[str]:
        """The innermost loop over ``j`` in [jb, je) as the two loops of ``split`` (see loop_split.py)."""
        c, hv, lv = split.c, self.var(split.hi), self.var(split.lo)
        out = self.buf(k.out)

        def store(lo: sym.sint, pad: str) -> str:
            mapping = {j: sym.add(sym.mul(split.hi, c), lo)}
            value = self.expr(substitute(k.value, mapping))
            off = self.idx(sym.to_expr(dense).substitute(mapping))
            return f"{pad}{out}[{off}] = {self.store_value(k.out.dtype, value)};"
        lines = [f"        for (int64_t {hv} = jb / {c}; {hv} < je / {c}; {hv}++) {{"]
        if split.unrolled:
            lines = ["        _Pragma(\"omp simd\")"] + lines + [store(r, " " * 12) for r in range(c)]
        else:
            lines += ["            _Pragma(\"omp simd\")",
                      f"            for (int64_t {lv} = 0; {lv} < {c}; {lv}++) {{", store(split.lo, " " * 16),
                      "            }"]
        return lines + ["        }"]

    def quantized_matmul(self, k: ir.Kernel) -> tuple[str, str]:
        """out[m, n] = sum_k x[m, k] * decode(raw)[n, k]: weight rows decoded block by block in registers
        (qgemm.h), or for quantized activations up to QMM_ROWS activation rows a pass (qdecode.h); work items
        are chunks of weight rows (``_weight_rows_kernel``)."""
        q = k.template
        if q.qtype in HALF_QTYPES:
            return self.half_matmul(k)
        fmt = block_format(q.qtype)
        E, BB = fmt.block_elems, fmt.block_bytes
        K = q.in_features
        nblk = K // E
        row_bytes = nblk * BB
        tname = TEMPLATE_QTYPES[q.qtype]
        x_buf, raw_buf = k.template_reads
        quant_lines, quantize = [], ""
        short_only = q.qtype in FEW_ROWS_INT16_QTYPES  # int16 in short calls only, by per-row kernels
        mode16 = q.activations == "int16"
        # ... but where this build reads the weights repacked (q5_0, repack.py), at every row count: the GGUF
        # layout's float kernel has no weights to read then
        every_count = f"defined(LS_REPACK16_{tname})" if short_only and q.weights_layout == "r16" else None

        def row_groups_from(start) -> list[str]:  # the loop over groups of QMM_ROWS activation rows
            return [f"        for (int64_t m0 = {start}; m0 < M; m0 += {QMM_ROWS}) {{",
                    f"            const int64_t mr = ls_min({QMM_ROWS}, M - m0);"]
        row_groups = row_groups_from(0)
        if k.scratch:  # quantized activations (int8 or int16), quantized once per call by the launcher
            mode = q.activations
            # q5_0, q4_k, q6_k: int16 for calls of at most QMM_ROWS rows, longer ones float (below); the scratch
            # holds those
            d_off, s_off, _ = activation_scratch_layout(
                quantized_rows_bound(q.qtype, sym.upper_bound(q.rows), q.weights_layout), K, mode)
            sc = self.buf(k.scratch[0])
            # int8 has SIMD kernels only (elsewhere the float path below runs); int16 has a portable form too
            guard = ["#if defined(LS_HAVE_QDOT8) && !defined(LS_PORTABLE)"] if mode == "int8" else []
            itype, bits = ("int8_t", "8") if mode == "int8" else ("int16_t", "16")
            nb32 = K // 32  # the activations' blocks of 32 (a k-quant's super-block holds eight)
            xargs = (f"(const {itype} *){sc} + m0 * {K}LL, (const float *)({sc} + {d_off}) + m0 * {nb32}, "
                     f"(const float *)({sc} + {s_off}) + m0 * {nb32}, {K}, {nb32}, mr, out + m0 * N + n, N);")
            # int8 on AVX-512 VNNI: the weight rows two at a time (qvnni.h), the same bits as one at a time;
            # int16 there: 16 at a time (qdot16x16.h), all of the item's rows
            wide = ("LS_HAVE_QDOT8X2", "ls_qdot8x2") if mode == "int8" else (f"LS_HAVE_QDOT16X16_{tname}",
                                                                             "ls_qdot16x16")
            # int16 on AVX2 without AVX-512: four at a time for one or two activation rows (qdot16x4.h)
            narrow = [] if mode == "int8" else [
                f"#elif defined(LS_HAVE_QDOT16X4_{tname})",
                f"            n += ls_qdot16x4_{tname}(wraw + n * {row_bytes}LL, {row_bytes}, n1 - n, {xargs}"]
            # weights repacked where this build reads them so (repack.py): for the 16-row kernels (AVX-512), or in
            # groups of 8 rows (AVX2, repack8.h)
            repacked = [f"#if defined(LS_REPACK16_{tname})",
                        f"            n += ls_qdot16x16r_{tname}(wraw + n * {row_bytes}LL, {row_bytes}, n1 - n, "
                        f"{xargs}",
                        f"#elif defined(LS_REPACK8_{tname})",
                        f"            n += ls_qdot16x8r_{tname}(wraw + n * {row_bytes}LL, {row_bytes}, n1 - n, "
                        f"{xargs}",
                        f"#elif defined({wide[0]})"] if q.weights_layout == "r16" else [f"#if defined({wide[0]})"]
            pairs = ["            int64_t n = n0;", *repacked,
                     f"            n += {wide[1]}_{tname}(wraw + n * {row_bytes}LL, {row_bytes}, n1 - n, {xargs}",
                     *narrow,
                     "#endif",
                     "            for (; n < n1; n++)"]
            # "auto" on AMX: a long call's first rows & ~15 on bfloat16 tiles (qamx.h), the rest as below (every
            # format of QUANT_ACT_QTYPES has a tile kernel; the long calls of FEW_ROWS_INT16_QTYPES are float)
            tiles = mode == "int16" and not short_only
            first = ["#if defined(LS_HAVE_QAMX)",
                     "        const int64_t m_tiles = ls_qamx_rows(M);",
                     f"        if (m_tiles > 0) ls_qamx_{tname}(wraw + n0 * {row_bytes}LL, {row_bytes}, n1 - n0, "
                     f"(const uint16_t *){sc}, m_tiles, {K}, out + n0, N);",
                     "#else",
                     "        const int64_t m_tiles = 0;",
                     "#endif"] + row_groups_from("m_tiles") if tiles else row_groups
            quant_lines = guard + first + pairs + [
                f"                ls_qdot{bits}_{tname}(wraw + n * {row_bytes}LL, {xargs}",
                "        }"]
            lp = "((const ls_launch *)(&l))"
            x_i = self.kernel_buffers(k).index(x_buf)
            s_i = self.kernel_buffers(k).index(k.scratch[0])
            split = "" if mode == "int8" else f", LS_SPLIT16_{tname}"  # whether to store qdot16x16.h's layout
            rows_fn = f"ls_quantize_rows{bits if bits == '16' else ''}"
            quantize = (f"      {{ uint8_t *sc = (uint8_t *){lp}->p[{s_i}]; {rows_fn}"
                        f"((const float *){lp}->p[{x_i}], M, {K}, ({itype} *)sc, (float *)(sc + {d_off}), "
                        f"(float *)(sc + {s_off}){split}); }}")
            if tiles:  # after the int16 scratch is written: the tile rows' bfloat16 over the start of it
                quantize += (f"\n#if defined(LS_HAVE_QAMX)\n      ls_qamx_prepare((const float *){lp}->p[{x_i}], M, "
                             f"{K}, (int16_t *){lp}->p[{s_i}]);\n#endif")
            if short_only:
                quantize = f"      if (M <= {QMM_ROWS})\n{quantize}" if every_count is None else \
                    f"#if !{every_count}\n      if (M <= {QMM_ROWS})\n#endif\n{quantize}"
            quantize = "\n".join([""] + guard + [quantize] + (["#endif", ""] if guard else [""]))
        lines, call = self._weight_rows_kernel(k, row_bytes, f"const uint8_t *restrict wraw = (const uint8_t *)"
                                               f"{self.buf(raw_buf)};", x_buf, quantize,
                                               group=16 if k.scratch and mode16 and (not short_only or every_count)
                                               else 1)
        if k.scratch and short_only:  # a long call: float activations, qgemm.h's kernel
            lines += [f"#if !{every_count}"] if every_count else []
            lines += [f"        if (M > {QMM_ROWS}) {{"]
            lines += ["    " + ln for ln in self.qgemm_lines(q, tname, K, nblk, row_bytes, row_groups, False)]
            lines += ["            continue;", "        }"] + (["#endif"] if every_count else []) + quant_lines
        elif k.scratch and q.activations == "int16":  # int16 has a portable form: no float path to fall back to
            # ... except "auto" on AVX2: a call of many rows takes qgemm.h's float kernel
            qgemm_call = (f"ls_qgemm_{{}}{tname}(wraw + n0 * {row_bytes}LL, {row_bytes}, xs, M, {K}, n1 - n0, "
                          f"out + n0, N);")
            long_call = [f"            {qgemm_call.format('')}"]
            if q.weights_layout == "r16":  # the float kernel over the AVX2 layout where this build reads it
                long_call = [f"#if defined(LS_REPACK8_{tname})", f"            {qgemm_call.format('r8_')}",
                             "#else", *long_call, "#endif"]
            lines += ["#if defined(LS_AUTO_QGEMM)", "        if (M > LS_QUANT_ROWS_MAX) {", *long_call,
                      "            continue;", "        }", "#endif"] + quant_lines
        else:  # every template format has qgemm.h's kernels
            lines += quant_lines + self.qgemm_lines(q, tname, K, nblk, row_bytes, row_groups, bool(quant_lines))
        lines += ["    }", "}"]
        return "\n".join(lines), call

    def _weight_rows_kernel(self, k: ir.Kernel, row_bytes: int, weights: str, x_buf, before_launch: str = "",
                            group: int = 1) -> tuple[list[str], str]:
        """The opening lines of a matmul kernel whose work items are chunks of weight rows (``M``, ``N``,
        ``R`` rows an item, ``xs``, ``out``, the ``weights`` pointer declaration, then the item loop with
        ``n0 .. n1``), and its launch. An item is small enough to stay in L2 while every row group streams
        past it, so the weights come from memory once per call; with one row group (decode, batched decode)
        nothing is re-read, and smaller items spread the weight stream evenly over the threads. ``group``: item
        sizes rounded to a multiple of it (a kernel doing that many rows at once, qdot16x16.h)."""
        q = k.template
        M, N, K = self.idx(q.rows), self.idx(q.out_features), q.in_features
        rows_l2 = max(1, min(QMM_L2_BYTES // row_bytes, 64))
        rows_one = max(1, min(QMM_DECODE_BYTES // row_bytes, rows_l2))
        rows_l2, rows_one = (max(group, (r + group // 2) // group * group) for r in (rows_l2, rows_one))
        rows_per_item = f"(M <= {QMM_ROWS} ? {rows_one} : {rows_l2})"
        lines = ["static void KFN(void *vctx, int64_t p0, int64_t p1) {",
                 "    const ls_launch *l = (const ls_launch *)vctx;", "    const ls_args *a = l->a;"]
        lines += [f"    {d}" for d in self.decls(k)]
        lines += [f"    const int64_t M = {M}, N = {N}, R = {rows_per_item};", f"    {weights}",
                  f"    const float *restrict xs = {self.buf(x_buf)};",
                  f"    float *restrict out = {self.buf(k.out)};",
                  "    for (int64_t p = p0; p < p1; p++) {",
                  "        const int64_t n0 = p * R, n1 = ls_min(N, n0 + R);"]
        call = (f"    {{ const int64_t M = {M}, N = {N}; const int64_t R = {rows_per_item}, n = (N + R - 1) / R;"
                f"{before_launch}\n"
                f"      if ((M * N * {K}LL) >= {self.parallel_grain()}) ls_parallel_for(KFN, &l, n); "
                f"else KFN(&l, 0, n); }}")
        return lines, call

    def half_matmul(self, k: ir.Kernel) -> tuple[str, str]:
        """out[m, n] = sum_k x[m, k] * w[n, k] for float16 / bfloat16 weights, widened in registers by hgemm.h
        (F16C / a shift on AVX2, else its portable form with the same bits). Work items are chunks of
        weight rows, sized as for the quantized formats (2 bytes a weight)."""
        q = k.template
        tname, K = HALF_QTYPES[q.qtype], q.in_features
        x_buf, w_buf = k.template_reads
        args = f"(w + n0 * {K}LL, xs, M, {K}, n1 - n0, out + n0, N);"
        lines, call = self._weight_rows_kernel(k, 2 * K, f"const uint16_t *restrict w = (const uint16_t *)"
                                               f"{self.buf(w_buf)};", x_buf)
        lines += [f"#if defined(LS_HAVE_HGEMM_{tname.upper()}) && !defined(LS_PORTABLE)",
                  f"        ls_hgemm_{tname}{args}",
                  "#else",
                  f"        ls_hgemm_portable_{tname}{args}",
                  "#endif",
                  "    }", "}"]
        return "\n".join(lines), call

    @staticmethod
    def qgemm_lines(q, tname: str, K: int, nblk: int, row_bytes: int, row_groups: list[str], elif_: bool
                    ) -> list[str]:
        """Float activations: the register-blocked kernel of qgemm.h on AVX2, and on AVX-512 the row-group
        kernel of qdecode.h for q8_0, q4_0 and q4_1 and qgemm.h's AVX2 kernel for q5_0, q4_k and q6_k (the
        per-block float decode they had before was 8-14x slower there), else qgemm.h's portable form;
        qgemm.h's kernels give a row the same bits alone and in any batch."""
        args = f"(wraw + n0 * {row_bytes}LL, {row_bytes}, xs, M, {K}, n1 - n0, out + n0, N);"
        if q.qtype not in QDOT_QTYPES:  # no AVX-512 kernel of their own: qgemm.h's AVX2 one on AVX-512 too
            return [f"#{'elif' if elif_ else 'if'} defined(LS_HAVE_QGEMM_AVX2) && !defined(LS_PORTABLE)",
                    f"        ls_qgemm_{tname}{args}",
                    "#else",
                    f"        ls_qgemm_portable_{tname}{args}",
                    "#endif"]
        q41 = q.qtype is QType.Q4_1
        return [
            f"#{'elif' if elif_ else 'if'} defined(LS_HAVE_QGEMM) && !defined(LS_PORTABLE)",
            f"        ls_qgemm_{tname}{args}",
            f"#elif defined(LS_HAVE_QDOT_{tname}) && !defined(LS_PORTABLE)",
        ] + row_groups + ([f"            float xsum[{QMM_ROWS * nblk}];  /* q4_1's min term: block sums of the rows */",
                           f"            ls_block_sums(xs + m0 * {K}LL, mr, {K}, xsum);"] if q41 else []) + [
            "            for (int64_t n = n0; n < n1; n++)",
            f"                ls_qdot_{tname}(wraw + n * {row_bytes}LL, xs + m0 * {K}LL, "
            f"{'xsum' if q41 else '0'}, {K}, {nblk}, mr, out + m0 * N + n, N);",
            "        }",
            "#else",
            f"        ls_qgemm_portable_{tname}{args}",
            "#endif"]

    def work_per_item(self, x: ir.IR) -> sym.sint:
        if isinstance(x, ir.Reduce):
            return sym.mul(x.size, sym.add(self.work_per_item(x.body), 1))
        total: sym.sint = 1
        for c in x.children():
            total = sym.add(total, self.work_per_item(c))
        return total

    def tiled_body(self, k: ir.Kernel, vars_, jv: str, row_var: sym.Var | None) -> list[str]:
        """Accumulate a block of rows x columns (``tiled_blocks``) per step of the reduced axis; full blocks are
        unrolled over rows so that operands shared by the rows are loaded once (register blocking)."""
        red = k.value
        assert isinstance(red, ir.Reduce)
        tile, rb = self.tiled_blocks()
        mr_max = rb if row_var is not None else 1
        out_t, acc_t = k.out.dtype, self._acc_type(red.dtype)
        nested = any(isinstance(y, (ir.Reduce, ir.Gather)) for y in red.body.walk())
        simd = "" if nested else "_Pragma(\"omp simd\") "
        rv, size = self.var(red.var), self.idx(red.size)
        off = self.idx(dense_offset(vars_, k.shape))
        rowname = self.var(row_var) if row_var is not None else None
        unrolled = []
        for c in range(mr_max):
            if row_var is not None:
                self.rename[row_var] = f"(m0 + {c})"
            unrolled.append(self.reduce_step(red, f"acc[{c}][jj]", self.expr(red.body)))
        self.rename.pop(row_var, None)
        generic = self.reduce_step(red, "acc[ii][jj]", self.expr(red.body))
        row_decl = f"const int64_t {rowname} = m0 + ii; " if rowname else ""
        mr = "mr" if row_var is not None else "1"
        lines = [f"        for (int64_t j0 = jb; j0 < je; j0 += {tile}) {{",
                 f"            const int64_t jn = ls_min({tile}, je - j0);",
                 f"            {acc_t} acc[{mr_max}][{tile}];",
                 f"            for (int ii = 0; ii < {mr_max}; ii++) for (int jj = 0; jj < {tile}; jj++) "
                 f"acc[ii][jj] = {self.reduce_init(red)};",
                 f"            if ({mr} == {mr_max} && jn == {tile}) {{",
                 f"                for (int64_t {rv} = 0; {rv} < {size}; {rv}++) {{",
                 f"                    {simd}for (int64_t jj = 0; jj < {tile}; jj++) {{",
                 f"                        const int64_t {jv} = j0 + jj;"]
        lines += [f"                        {step};" for step in unrolled]
        lines += ["                    }", "                }",
                  "            } else {",
                  f"                for (int64_t {rv} = 0; {rv} < {size}; {rv}++) {{",
                  f"                    for (int64_t ii = 0; ii < {mr}; ii++) {{ {row_decl}",
                  f"                        {simd}for (int64_t jj = 0; jj < jn; jj++) {{",
                  f"                            const int64_t {jv} = j0 + jj;",
                  f"                            {generic};",
                  "                        }", "                    }", "                }", "            }",
                  f"            for (int64_t ii = 0; ii < {mr}; ii++) {{ {row_decl}",
                  "                for (int64_t jj = 0; jj < jn; jj++) {",
                  f"                    const int64_t {jv} = j0 + jj;",
                  f"                    {self.buf(k.out)}[{off}] = "
                  f"{self.store_value(out_t, f'({compute_type(red.dtype)})acc[ii][jj]')};",
                  "                }", "            }", "        }"]
        return lines

    def scatter_body(self, k: ir.Kernel, vars_, jv: str) -> list[str]:
        rows_var = loop_var("kid", k.scatter_rows)
        kid = self.var(rows_var)
        # the scattered node's own shape (its buffer may be an output stored under a reshaped shape)
        off = self.idx(dense_offset([rows_var] + list(vars_[1:]), (k.scatter_rows,) + tuple(k.shape[1:])))
        return [f"        for (int64_t {jv} = jb; {jv} < je; {jv}++) {{",
                f"            const int64_t {kid} = (int64_t)({self.expr(k.scatter_index)});",
                f"            if ({kid} >= 0 && {kid} < {self.idx(k.scatter_rows)}) "
                f"{self.buf(k.out)}[{off}] = {self.store_value(k.out.dtype, self.expr(k.value))};",
                "        }"]

    def decls(self, k: ir.Kernel) -> list[str]:
        out = []
        for i, b in enumerate(self.kernel_buffers(k)):
            qual = "" if b is k.out or b in k.scratch else "const "
            out.append(f"{qual}{STORAGE[b.dtype]} *restrict {self.buf(b)} = ({qual}{STORAGE[b.dtype]} *)l->p[{i}];")
        for i, v in enumerate(self.plan.dims):
            out.append(f"const int64_t D_{v.name} = a->dims[{i}]; (void)D_{v.name};")
        return out


def render_plan(plan: KernelPlan, profile: bool = False, schedule=None) -> str:
    """The complete C source of a plan.

    Kernels that render to the same text (the same computation on different buffers, e.g. every
    layer of a model) share one function and one launcher; ``ls_graph`` walks a static table of
    steps (launcher + buffer pointers), which keeps the source, and the compile, small. With
    ``profile``, ``ls_graph`` also accumulates the nanoseconds of step ``k`` in ``ls_profile_ns[k]``.
    ``schedule`` (search hook) maps a kernel to a context manager under which it is rendered, e.g. one
    that edits its schedule's tiled blocks (lightspeed/search/knobs.py)."""
    r = KernelRenderer(plan)
    dims = "".join(f"const int64_t D_{v.name} = a->dims[{i}]; (void)D_{v.name}; " for i, v in enumerate(plan.dims))
    functions: dict[tuple[str, str], str] = {}  # (body, launch) -> name
    steps = []
    for k in plan.kernels:
        with schedule(k) if schedule is not None else contextlib.nullcontext():  # --- search hook
            f, c = r.kernel(k)
        name = functions.setdefault((f, c), f"kfn{len(functions)}")
        ptrs = [b.slot if b.kind != "temp" else -1 - b.offset for b in r.kernel_buffers(k)]
        steps.append((name, ptrs, k.name))
    max_ptrs = max([len(p) for _, p, _ in steps] + [1])
    support = ""
    if r.pack_floats:  # gemm kernels: vector types, micro-kernels and one packing buffer per thread
        support = (vector_helpers(r.gemm_widths) + "\n".join(r.gemm_support.values()) + "\n"
                   f"static _Thread_local float ls_pack_buf[{r.pack_floats}] __attribute__((aligned(64)));\n")
    header = ("typedef struct { const ls_args *a; void *p[" + str(max_ptrs) + "]; } ls_launch;\n"
              + ("typedef struct { ls_launch l; const int16_t *qa; const float *qs; } ls_idot_launch;\n"
                 if r.uses_integer_dot else "")
              + "typedef struct { void (*run)(const ls_launch *); int n; int64_t ptr[" + str(max_ptrs)
              + "]; } ls_step;\n")
    funcs = []
    for (body, launch), name in functions.items():
        funcs.append(body.replace("KFN", name))
        funcs.append(f"static void {name}_run(const ls_launch *lp) {{\n    const ls_args *a = lp->a; {dims}\n"
                     + launch.replace("&l", "(void *)lp").replace("KFN", name) + "\n}")
    table = ",\n".join(f"    {{{name}_run, {len(p)}, {{{', '.join(f'{v}LL' for v in p)}}}}} /* {kname} */"
                        for name, p, kname in steps)
    main = [f"static const ls_step LS_STEPS[{max(len(steps), 1)}] = {{\n{table}\n}};",
            "/* buffer pointers: a slot of bufs when >= 0, else arena offset -1-v */",
            "void ls_graph(void **bufs, const int64_t *dims, char *arena) {",
            "    ls_args a = {bufs, dims, arena};",
            f"    for (int s = 0; s < {len(steps)}; s++) {{",
            "        const ls_step *st = &LS_STEPS[s];",
            "        ls_launch l;",
            "        l.a = &a;",
            "        for (int i = 0; i < st->n; i++)",
            "            l.p[i] = st->ptr[i] >= 0 ? bufs[st->ptr[i]] : (void *)(arena + (-1 - st->ptr[i]));",
            "        " + ("{ const int64_t t0 = ls_now_ns(); st->run(&l); ls_profile_ns[s] += ls_now_ns() - t0; }"
                         if profile else "st->run(&l);"),
            "    }",
            "}"]
    if profile:
        header += ("#include <time.h>\n"
                   f"int64_t ls_profile_ns[{max(len(plan.kernels), 1)}];\n"
                   "static inline int64_t ls_now_ns(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); "
                   "return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec; }\n")
    return PRELUDE + header + support + "\n" + "\n\n".join(funcs) + "\n\n" + "\n".join(main) + "\n"
