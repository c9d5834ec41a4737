"""Render a KernelPlan as GPU kernels: one kernel function per plan kernel, in OpenCL C or CUDA C.

Schedules: every output element is one work item. A kernel's output axes are flattened into one global
range of ``items`` work items (rounded up to whole work groups; the extra ones return at once), and a work
item unravels its index into the loop variables. Inner reductions and gathers are loops and guarded blocks
inside the work item, so a "tiled" kernel is a plain per-output reduction loop. A "gemm" kernel instead
computes a tile of outputs per work group from panels in local memory, as its schedule says (gemm.py,
scheduling.py), and a kernel that is one
long reduction gives each output a work group that splits the reduced axis (reduce.py). Kernels that
render to the same text share one function.

The semantics follow the C renderer (backend/c/render.py) and so the reference backend: 16-bit floats
are computed in float and rounded after every op, float -> int casts saturate (NaN -> 0), integer
arithmetic wraps, ``x % 0`` and ``x % -1`` are 0, float max propagates NaN.

Kernel arguments, in order: for each buffer of the kernel (its output first, then what it reads) a base
pointer and a byte offset (temporaries live in one arena buffer at ``Buffer.offset``), then the number of
work items, then the value of every program dimension (``plan.dims`` order).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ... import dtypes as dt
from ... import symbolic as sym
from ...kernel import ir
from ...graph import Program
from ...kernel import form_kernels
from ...kernel.fusion import KernelPlan
from ...kernel.heuristics import GpuTarget
from ...kernel.ir import dense_offset, loop_var
from ...kernel.matmul_form import match_matmul
from ...ops import Op
from ..c.loop_split import hoist_invariants, split_reductions
from .dialect import F2I, Dialect
from .emit import Emitter
from .gemm import render_gemm
from .reduce import render_row_reduction, row_reduction
from .scheduling import ScheduleChoice, assign_gpu_schedules

STORAGE = {
    dt.float32: "float", dt.float16: "ls_u16", dt.bfloat16: "ls_u16", dt.int8: "ls_i8", dt.uint8: "ls_u8",
    dt.int16: "ls_i16", dt.uint16: "ls_u16", dt.int32: "ls_i32", dt.uint32: "ls_u32", dt.int64: "ls_i64",
    dt.bool_: "ls_u8",
}
UNSIGNED_OF = {"ls_i8": "ls_u8", "ls_i16": "ls_u16", "ls_i32": "ls_u32", "ls_i64": "ls_u64"}
LOOP_KINDS = ("loop", "tiled", "gemm", "scatter")  # lowered kinds (qmatmul, attention) need use_templates=False


def compute_type(d: dt.DType) -> str:
    """The type values of ``d`` are computed in (16-bit floats in float, bools in int)."""
    if d.is_float:
        return "float"
    if d is dt.bool_:
        return "int"
    return STORAGE[d]


def float_literal(v: float) -> str:
    """An exact float literal (hexadecimal) for ``v``; infinities and NaN through the dialect's macros."""
    if math.isnan(v):
        return "LS_NAN"
    if math.isinf(v):
        return "LS_INF" if v > 0 else "(-LS_INF)"
    v = float(np.float32(v))
    return f"{v.hex()}f" if v != int(v) or abs(v) >= 2**24 else f"{v:.1f}f"


PARAMS_MARK = "/* LS_PARAMS */"  # where a kernel with parameters in memory reads them (params_header)
# a gemm kernel whose output has at most this many rows (a decode step's matrix-vector products) runs its
# row form: a work group per output splitting k (reduce.py), not a 16 x 16 tile of which one row is used
SMALL_ROWS = 8


@dataclass
class GpuKernel:
    """One launch: plan kernel ``name`` runs function ``function`` over ``items`` work items. A gemm kernel
    may carry ``small``, the launch of its row form, taken when its output's ``rows`` are at most
    ``SMALL_ROWS`` at run time (``launch_for``)."""
    name: str
    function: str
    buffers: list[ir.Buffer]
    items: sym.sint
    block: int | None = None  # work-group size the function needs (None: the launcher's choice)
    rows: sym.sint | None = None
    small: "GpuKernel | None" = None

    def launch_for(self, env: dict[str, int]) -> "GpuKernel":
        """The launch to run at dimension values ``env`` (this one, or its row form for few rows)."""
        if self.small is not None and int(sym.evaluate(self.rows, env)) <= SMALL_ROWS:
            return self.small
        return self


@dataclass
class GpuProgram:
    """The source of every kernel function of a plan and the launches in plan order."""
    dialect: Dialect
    source: str
    functions: dict[str, str]  # function name -> its text (without the prelude)
    kernels: list[GpuKernel]


def _ir_key(x: ir.IR, memo: dict) -> tuple:
    """A structural key of ``x``: equal keys compute equal values (so they are computed once)."""
    got = memo.get(id(x))
    if got is not None:
        return got
    if isinstance(x, ir.Load):
        k = ("L", id(x.buf), x.offset, x.dtype)
    elif isinstance(x, ir.Const):
        k = ("C", repr(x.value), x.dtype)
    elif isinstance(x, ir.Index):
        k = ("I", x.expr, x.dtype)
    elif isinstance(x, ir.Alu):
        k = ("A", x.op, tuple(_ir_key(a, memo) for a in x.args), x.dtype)
    elif isinstance(x, ir.Cast):
        k = ("K", _ir_key(x.arg, memo), x.dtype)
    elif isinstance(x, ir.Select):
        k = ("S", x.valid, _ir_key(x.value, memo), x.dtype)
    elif isinstance(x, ir.Reduce):
        k = ("R", x.op, x.var, x.size, _ir_key(x.body, memo), x.dtype)
    elif isinstance(x, ir.Gather):
        k = ("G", _ir_key(x.index, memo), x.var, x.rows, _ir_key(x.body, memo), x.dtype)
    elif isinstance(x, ir.Bytes):
        k = ("B", id(x.buf), x.offset, x.stored)
    elif isinstance(x, ir.Bound):
        k = ("N", x.name)
    else:
        raise NotImplementedError(f"GPU renderer: {type(x).__name__}")
    memo[id(x)] = k
    return k


class KernelRenderer:
    """Renders the IR of one plan kernel as statements of ``Emitter`` (a fresh renderer per kernel)."""

    def __init__(self, plan: KernelPlan, dialect: Dialect, k: ir.Kernel, tiled_gemm: bool = True,
                 row_reductions: bool = True, row_form: bool = False, params_in_memory: bool = False):
        self.dialect = dialect
        self.tiled_gemm = tiled_gemm  # gemm kernels under the tile schedule (gemm.py), else plain loops
        self.row_reductions = row_reductions  # long reductions: a work group per output (reduce.py)
        self.row_kinds = ("loop", "tiled", "gemm") if row_form else ("loop", "tiled")
        # the dimension values come from a device buffer P and the kernel computes its own work items, so
        # a launch recorded once (a CUDA graph) stays valid for other values (see graph.py)
        self.params_in_memory = params_in_memory
        self.plan = plan
        self.kernel = k
        self.em = Emitter(dialect, list(plan.dims))
        self.buffers = [k.out] + [b for b in k.reads if b is not k.out]
        self.slot = {id(b): i for i, b in enumerate(self.buffers)}
        self.keys: dict = {}

    def local_name(self, v: sym.Var) -> str:
        """A per-kernel name for a loop variable (numbered in order of use: equal kernels render equally)."""
        base = v.name.rstrip("0123456789") or "v"
        return self.em.fresh(base + "_")

    def buf(self, b: ir.Buffer) -> str:
        return f"b{self.slot[id(b)]}"

    # values ------------------------------------------------------------------------------------------
    def define(self, x: ir.IR, name: str) -> None:
        """In the current scope, ``x`` (and every IR equal to it) is the local ``name``."""
        self.em.remember(("ir", _ir_key(x, self.keys)), name)

    def expr(self, x: ir.IR) -> str:
        """A name or literal holding ``x`` in its compute type (statements go to the emitter)."""
        if isinstance(x, ir.Const):
            return self.const(x.value, x.dtype)
        key = ("ir", _ir_key(x, self.keys))
        got = self.em.lookup(key)
        if got is not None:
            return got
        text = self._value(x)
        if not text.isidentifier():
            name = self.em.fresh("v")
            self.em.line(f"const {compute_type(x.dtype)} {name} = {text};")
            text = name
        self.em.remember(key, text)
        return text

    def _value(self, x: ir.IR) -> str:
        em = self.em
        if isinstance(x, ir.Load):
            return self.load(x.buf, x.offset)
        if isinstance(x, ir.Index):
            return f"(({compute_type(x.dtype)})({em.sym(x.expr)}))"
        if isinstance(x, ir.Select):
            valid = em.sym(x.valid)
            name = em.fresh("v")
            em.line(f"{compute_type(x.dtype)} {name} = {self.zero(x.dtype)};")
            with em.block(f"if ({valid})"):
                em.line(f"{name} = {self.expr(x.value)};")
            return name
        if isinstance(x, ir.Cast):
            return self.cast(x.arg, x.dtype)
        if isinstance(x, ir.Alu):
            return self.round16(self.alu(x), x.dtype)
        if isinstance(x, ir.Reduce):
            return self.round16(self.reduce(x), x.dtype)
        if isinstance(x, ir.Gather):
            return self.gather(x)
        if isinstance(x, ir.Bytes):
            return self.bytes_value(x)
        if isinstance(x, ir.Bound):  # a value computed before the loop that reads it (see reduce)
            return x.name
        raise NotImplementedError(f"GPU renderer: {type(x).__name__}")

    def bytes_value(self, x: ir.Bytes) -> str:
        """A float16 or int8 stored little-endian in a byte buffer at any byte offset (a quantized block's
        scale, its weights), as float: byte loads, since the offset need not be aligned."""
        b, off = self.buf(x.buf), self.em.sym(x.offset)
        if x.stored is dt.int8:
            return f"((float)(ls_i8){b}[{off}])"
        if x.stored is dt.float16:
            return f"ls_f16_to_f32((ls_u16)((ls_u16){b}[{off}] | ((ls_u16){b}[{off} + 1] << 8)))"
        raise NotImplementedError(f"GPU renderer: bytes holding {x.stored}")

    def load(self, b: ir.Buffer, off: sym.sint) -> str:
        ref = f"{self.buf(b)}[{self.em.sym(off)}]"
        if b.dtype is dt.bfloat16:
            return f"ls_bf16_to_f32({ref})"
        if b.dtype is dt.float16:
            return f"ls_f16_to_f32({ref})"
        if b.dtype is dt.bool_:
            return f"((int){ref})"
        return ref

    @staticmethod
    def store_value(d: dt.DType, v: str) -> str:
        if d is dt.bfloat16:
            return f"ls_f32_to_bf16({v})"
        if d is dt.float16:
            return f"ls_f32_to_f16({v})"
        if d is dt.bool_:
            return f"(ls_u8)(({v}) != 0)"
        return f"({STORAGE[d]})({v})"

    def const(self, value, d: dt.DType) -> str:
        if d.is_float:
            return float_literal(float(value))
        if d is dt.bool_:
            return "1" if value else "0"
        return f"(({STORAGE[d]}){self.em.literal(int(value))})"

    @staticmethod
    def zero(d: dt.DType) -> str:
        return "0.0f" if d.is_float else "0"

    @staticmethod
    def round16(v: str, d: dt.DType) -> str:
        """16-bit float values are computed in float and rounded after every op, as the reference does."""
        if d is dt.float16:
            return f"ls_round_f16({v})"
        if d is dt.bfloat16:
            return f"ls_round_bf16({v})"
        return v

    def cast(self, arg: ir.IR, to: dt.DType) -> str:
        v, src = self.expr(arg), arg.dtype
        if to is dt.bool_:
            return f"(({v}) != 0)"
        if to.is_float:
            return self.round16(f"((float)({v}))", to)
        if src.is_float:
            return f"{F2I[to][0]}({v})"
        return f"(({STORAGE[to]})({v}))"

    def alu(self, x: ir.Alu) -> str:
        op, d = x.op, x.dtype
        a = [self.expr(s) for s in x.args]
        if op in self.dialect.unary:
            return self.dialect.unary[op].format(a[0])
        if op is Op.LESS_THAN:
            return f"(({a[0]}) < ({a[1]}))"
        ta, tb = (s.dtype is dt.bool_ for s in x.args)
        if op is Op.MUL:
            if ta and tb:
                return f"(({a[0]}) & ({a[1]}))"
            if ta:
                return f"(({a[0]}) ? ({a[1]}) : {self.zero(d)})"
            if tb:
                return f"(({a[1]}) ? ({a[0]}) : {self.zero(d)})"
        if op is Op.ADD and ta and tb:
            return f"(({a[0]}) | ({a[1]}))"  # numpy: bool + bool is logical or
        if op is Op.MOD:
            if d.is_float:
                return self.float_mod(x, a)
            t = compute_type(d)
            # x % 0 is 0 (as in the reference) and x % -1 is 0 (INT_MIN % -1 would trap)
            return f"((({a[1]}) == 0 || ({a[1]}) == -1) ? ({t})0 : ({t})(({a[0]}) % ({a[1]})))"
        sym_op = "+" if op is Op.ADD else "*"
        if op not in (Op.ADD, Op.MUL):
            raise NotImplementedError(f"GPU renderer: {op}")
        if d.is_float:
            return f"(({a[0]}) {sym_op} ({a[1]}))"
        t = compute_type(d)
        u = UNSIGNED_OF.get(t, t)  # wrap-around integer arithmetic, as numpy does
        return f"(({t})(({u})({a[0]}) {sym_op} ({u})({a[1]})))"

    def float_mod(self, x: ir.Alu, a: list[str]) -> str:
        """C's fmod (numpy's). By a constant power of two 2**k (a quantized block's nibble and bit fields
        are cut out of a byte this way) it is computed exactly without the library call, which is slow on
        some devices: ``a * 2**-k`` and ``trunc(.) * 2**k`` are exact scalings, their difference is the
        exact remainder (representable, so the subtraction returns it), and the sign of a zero remainder is
        ``a``'s as fmod's is; infinities give NaN through ``inf - inf``, NaN stays NaN."""
        c = x.args[1]
        if isinstance(c, ir.Const) and x.dtype is dt.float32:
            v = float(c.value)
            if v > 0 and math.isfinite(v) and math.frexp(v)[0] == 0.5:
                inv, t = float_literal(1.0 / v), self.em.fresh("t")
                self.em.line(f"const float {t} = {a[0]};")
                return f"copysign({t} - trunc({t} * {inv}) * {a[1]}, {t})"
        return f"{self.dialect.fmod}({a[0]}, {a[1]})"

    @staticmethod
    def acc_type(d: dt.DType) -> str:
        return "float" if d.is_float else ("ls_i64" if d.kind in "ib" else "ls_u64")

    def reduce_init(self, x: ir.Reduce) -> str:
        if x.op is Op.SUM_REDUCE:
            return "0.0f" if x.dtype.is_float else "0"
        if x.dtype.is_float:
            return "(-LS_INF)"
        if x.dtype.kind == "i":
            return self.em.literal(int(np.iinfo(x.dtype.np).min))
        return "0"

    def reduce(self, x: ir.Reduce) -> str:
        em = self.em
        size = em.sym(x.size)
        acc, t = em.fresh("acc"), self.acc_type(x.dtype)
        em.line(f"{t} {acc} = {self.reduce_init(x)};")
        float_max = x.op is Op.MAX_REDUCE and x.dtype.is_float
        nan = em.fresh("nan") if float_max else ""
        if float_max:
            em.line(f"int {nan} = 0;")
        v = self.local_name(x.var)
        with em.block(f"for (ls_i64 {v} = 0; {v} < {size}; {v}++)"):
            em.bind(x.var, v)
            inner = x.body
            if isinstance(inner, ir.Reduce):  # blocks of a split sum: what a block shares, computed once
                hoisted_body, hoisted = hoist_invariants(inner.body, inner.var, em.fresh("h") + "_")
                for name, y in hoisted:
                    em.line(f"const {compute_type(y.dtype)} {name} = {self.expr(y)};")
                inner = ir.Reduce(inner.op, inner.var, inner.size, hoisted_body, inner.dtype)
            body = self.expr(inner)
            if x.op is Op.SUM_REDUCE:
                em.line(f"{acc} += {body};")
            elif float_max:  # NaN (which numpy propagates) is tracked in a flag
                em.line(f"{nan} |= {body} != {body}; {acc} = {body} > {acc} ? {body} : {acc};")
            else:
                em.line(f"{acc} = ({t}){body} > {acc} ? ({t}){body} : {acc};")
        if float_max:
            return f"({nan} ? LS_NAN : {acc})"
        return f"(({compute_type(x.dtype)}){acc})"

    def gather(self, x: ir.Gather) -> str:
        em = self.em
        index = self.expr(x.index)
        g = self.local_name(x.var)
        em.line(f"const ls_i64 {g} = (ls_i64)({index});")
        rows = em.sym(x.rows)
        name = em.fresh("v")
        em.line(f"{compute_type(x.dtype)} {name} = {self.zero(x.dtype)};")
        with em.block(f"if ({g} >= 0 && {g} < {rows})"):
            em.bind(x.var, g)
            em.line(f"{name} = {self.expr(x.body)};")
        return name

    # the kernel function -------------------------------------------------------------------------------
    def declare_buffers(self) -> None:
        """Typed pointers to the kernel's buffers (each argument is a byte pointer and a byte offset)."""
        for i, b in enumerate(self.buffers):
            qual = "" if b is self.kernel.out else "const "
            t = STORAGE[b.dtype]
            self.em.line(f"LS_GLOBAL {qual}{t} *{self.buf(b)} = (LS_GLOBAL {qual}{t} *)(p{i} + o{i});")

    def finish(self) -> str:
        """The kernel function (named ``KFN``) around the statements written so far."""
        params = []
        for i, b in enumerate(self.buffers):
            qual = "" if b is self.kernel.out else "const "
            params.append(f"LS_GLOBAL {qual}ls_u8 *p{i}, const ls_i64 o{i}")
        if self.params_in_memory:
            params.append("LS_GLOBAL const ls_i64 *P")
            lines = [PARAMS_MARK] + self.em.lines
        else:
            params.append("const ls_i64 n_items")
            params += [f"const ls_i64 D_{v.name}" for v in self.plan.dims]
            lines = self.em.lines
        return "LS_KERNEL KFN(" + ", ".join(params) + ") {\n" + "\n".join(lines) + "\n}\n"

    def params_header(self, items: sym.sint, block: int | None) -> str:
        """The first lines of a kernel whose parameters are in memory: the dimension values from ``P``, its
        work items, and (for forms with a fixed work-group size) the exit of whole groups past them."""
        h = Emitter(self.dialect, list(self.plan.dims), names="p_")
        for i, v in enumerate(self.plan.dims):
            h.line(f"const ls_i64 D_{v.name} = P[{i}];")
        h.line(f"const ls_i64 n_items = {h.sym(items)};")
        if block is not None:  # the whole group leaves, before any barrier
            h.line(f"if (LS_GROUP_ID * {block} >= n_items) return;")
        return "\n".join(h.lines)

    def function(self) -> tuple[str, sym.sint, int | None]:
        """(the kernel function's text, named ``KFN``; the number of work items it runs over; its work-group
        size, None for the dialect's default)."""
        text, items, block = self._function()
        if self.params_in_memory:
            text = text.replace(PARAMS_MARK, self.params_header(items, block))
        return text, items, block

    def _function(self) -> tuple[str, sym.sint, int | None]:
        k, em = self.kernel, self.em
        if k.kind not in LOOP_KINDS:
            raise NotImplementedError(f"GPU renderer: kernel {k.name} is a lowered {k.kind!r} kernel; "
                                      "form the plan with use_templates=False")
        red = row_reduction(k, self.row_kinds) if self.row_reductions else None
        if red is not None:
            return render_row_reduction(self, red)
        if k.kind == "gemm" and self.tiled_gemm:
            form = match_matmul(k.value, k.loop_vars)
            if form is not None:
                return render_gemm(self, form)
        shape, vars_ = list(k.shape), list(k.loop_vars)
        items = sym.prod(shape) if shape else 1
        em.line("const ls_i64 gid = LS_GLOBAL_ID;")
        em.line("if (gid >= n_items) return;")
        self.declare_buffers()
        if vars_:
            em.line("ls_i64 rest = gid;")
        for pos in range(len(vars_) - 1, -1, -1):
            name = self.local_name(vars_[pos])
            if pos == 0:
                em.line(f"const ls_i64 {name} = rest;")
            else:
                size = em.sym(shape[pos])
                em.line(f"const ls_i64 {name} = rest % {size}; rest = rest / {size};")
            em.bind(vars_[pos], name)
        if k.kind == "scatter":
            self.scatter_body()
        else:
            off = em.sym(dense_offset(vars_, shape)) if shape else "0"
            # a sum that divides its index by a constant (a quantized block's k // 32) runs as blocks of
            # contiguous elements, the per-block values (the block's scale) computed once per block
            value = self.expr(split_reductions(k.value, loop_var))
            em.line(f"{self.buf(k.out)}[{off}] = {self.store_value(k.out.dtype, value)};")
        return self.finish(), items, None

    def scatter_body(self) -> None:
        """Write ``value`` at the row the scatter index names (rows out of range write nothing)."""
        k, em = self.kernel, self.em
        rows_var = loop_var("kid", k.scatter_rows)
        index = self.expr(k.scatter_index)
        kid = self.local_name(rows_var)
        em.line(f"const ls_i64 {kid} = (ls_i64)({index});")
        rows = em.sym(k.scatter_rows)
        with em.block(f"if ({kid} >= 0 && {kid} < {rows})"):
            em.bind(rows_var, kid)
            # the scattered node's own shape (its buffer may be an output stored under a reshaped shape)
            off = em.sym(dense_offset([rows_var] + list(k.loop_vars[1:]), (k.scatter_rows,) + tuple(k.shape[1:])))
            value = self.expr(k.value)
            em.line(f"{self.buf(k.out)}[{off}] = {self.store_value(k.out.dtype, value)};")


def form_plan(program: Program, target: GpuTarget | None = None, schedules: ScheduleChoice | None = None
              ) -> KernelPlan:
    """The kernel plan the GPU backends render: generated kernels only (the C-only lowered templates are
    not formed), float16 scales read from their bytes with one load each (``ir.Bytes``), and a product
    with a dequantized weight computed inside its reduction (a gemm kernel) instead of stored. Every gemm
    kernel gets its schedule: ``schedules(kernel)`` where that gives one, else the heuristics' for
    ``target`` (a device of ``GpuTarget``'s defaults when None)."""
    plan = form_kernels(program, use_templates=False, byte_loads=True, fuse_reduced=True)
    return assign_gpu_schedules(plan, target or GpuTarget(), schedules)


def render_kernel(plan: KernelPlan, k: ir.Kernel, dialect: Dialect, tiled_gemm: bool = True,
                  row_reductions: bool = True, row_form: bool = False,
                  params_in_memory: bool = False) -> tuple[str, list[ir.Buffer], sym.sint, int | None]:
    """(function text named ``KFN``, its buffers in argument order, its work items, its work-group size or
    None) of plan kernel ``k``; ``row_form`` renders a gemm kernel as a row reduction (reduce.py);
    ``params_in_memory``: the dimension values are read from a last argument ``P`` (a device buffer), and
    the kernel computes its work items from them (see KernelRenderer)."""
    r = KernelRenderer(plan, dialect, k, tiled_gemm, row_reductions, row_form, params_in_memory)
    text, items, block = r.function()
    return text, r.buffers, items, block


def _small_rows(k: ir.Kernel) -> sym.sint | None:
    """The rows of a gemm kernel that has a row form (its reduction is long enough), else None."""
    if k.kind != "gemm" or row_reduction(k, ("gemm",)) is None:
        return None
    form = match_matmul(k.value, k.loop_vars)
    return None if form is None else k.shape[form.m]


def render_program(plan: KernelPlan, dialect: Dialect, prefix: str = "ls_k", tiled_gemm: bool = True,
                   row_reductions: bool = True, small_form: str = "rows",
                   params_in_memory: bool = False) -> GpuProgram:
    """Every kernel of ``plan`` as functions of ``dialect`` (equal texts share one function) and the
    launches in plan order; ``tiled_gemm=False`` renders gemm kernels, ``row_reductions=False`` long
    reductions, as plain per-output loops. With both, a tiled gemm kernel also gets a form for few rows:
    ``small_form="rows"`` a work group per output splitting k (GPUs: the group's loads of a weight row
    coalesce), ``"loop"`` a work item per output looping over k (CPUs such as PoCL's, where a work group
    and its barriers cost more than the loop). ``params_in_memory``: see ``render_kernel``."""
    if small_form not in ("rows", "loop"):
        raise ValueError(f"small_form must be 'rows' or 'loop', got {small_form!r}")
    by_text: dict[str, str] = {}

    def launch(k: ir.Kernel, tiles: bool = tiled_gemm, rows: bool = row_reductions,
               row_form: bool = False) -> GpuKernel:
        text, buffers, items, block = render_kernel(plan, k, dialect, tiles, rows, row_form, params_in_memory)
        name = by_text.setdefault(text, f"{prefix}{len(by_text)}")
        return GpuKernel(k.name, name, buffers, items, block)

    launches = []
    for k in plan.kernels:
        main = launch(k)
        rows = _small_rows(k) if tiled_gemm and row_reductions else None
        if rows is not None:
            small = launch(k, row_form=True) if small_form == "rows" else launch(k, tiles=False, rows=False)
            main.rows, main.small = rows, small
        launches.append(main)
    functions = {name: text.replace("KFN", name) for text, name in by_text.items()}
    source = dialect.prelude() + "\n" + "\n".join(functions.values())
    return GpuProgram(dialect, source, functions, launches)
