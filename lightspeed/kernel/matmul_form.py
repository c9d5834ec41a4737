"""Matmul-like kernels: a sum over k of a product whose factors each miss one output axis.

``out[..., m, ..., n] = sum_k a(..., m, k) * b(..., k, n)`` where ``a`` reads no ``n`` and ``b`` no ``m``
(any views, casts or decode expressions around the loads). Such a kernel can be scheduled like a GEMM:
tiles of ``a`` and ``b`` are packed into contiguous panels and a register block of outputs accumulates
per step of ``k``. The factors stay IR expressions, so packing evaluates whatever they are (a transposed
weight, an unfolded convolution input, a quantized block decode).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import dtypes as dt
from .. import symbolic as sym
from ..ops import Op
from . import ir


@dataclass(eq=False)
class MatmulForm:
    """The parts of a matmul-like kernel value: output axes ``m`` and ``n`` (positions in the kernel's
    loop variables; ``n`` is the last), the reduction, and the factors ``a`` (free of n) and ``b`` (free
    of m). Other output axes are batch axes (fixed within a work item)."""
    m: int
    n: int
    reduce: ir.Reduce
    a: ir.IR
    b: ir.IR

    @property
    def batch(self) -> list[int]:
        return [i for i in range(self.n + 1) if i not in (self.m, self.n)]


def _nested(x: ir.IR) -> bool:
    """Whether ``x`` holds an inner reduction (packing evaluates a factor once per element, so a reduction
    inside one would be redone for every element; a gather is one lookup and stays)."""
    return any(isinstance(y, ir.Reduce) for y in x.walk())


def match_matmul(value: ir.IR, loop_vars: tuple[sym.Var, ...]) -> MatmulForm | None:
    """The matmul form of a kernel computing ``value`` over ``loop_vars``, or None.

    Only float32 sums whose factors hold no inner reduction are taken (packing loops evaluate each factor
    once per element), with the contiguous last output axis as ``n``."""
    if not isinstance(value, ir.Reduce) or value.op is not Op.SUM_REDUCE or value.dtype is not dt.float32:
        return None
    if len(loop_vars) < 2:
        return None
    body = value.body
    if not isinstance(body, ir.Alu) or body.op is not Op.MUL or body.dtype is not dt.float32:
        return None
    x, y = body.args
    if _nested(x) or _nested(y) or x.dtype is not dt.float32 or y.dtype is not dt.float32:
        return None
    n = len(loop_vars) - 1
    nvar = loop_vars[n]
    if sym.free_vars(value.size) & set(loop_vars):
        return None  # a reduction length that depends on the output index (not a plain matmul)
    xv, yv = ir.ir_vars(x), ir.ir_vars(y)
    for a, b, av, bv in ((x, y, xv, yv), (y, x, yv, xv)):
        if nvar in av or nvar not in bv:
            continue
        for m in range(n - 1, -1, -1):
            mvar = loop_vars[m]
            if mvar in av and mvar not in bv:
                return MatmulForm(m, n, value, a, b)
        for m in range(n - 1, -1, -1):  # one row (a matvec): an axis of size 1 that neither factor reads
            if loop_vars[m].hi == 0 and loop_vars[m] not in av | bv:
                return MatmulForm(m, n, value, a, b)
    return None


def unit_stride(e: sym.Expr, v: sym.Var) -> bool:
    """Whether index expression ``e`` moves by one when ``v`` does (a term ``v`` with coefficient 1)."""
    return isinstance(e, sym.Sum) and (v, 1) in e.terms or e == v


def pack_inner(x: ir.IR, first: sym.Var, second: sym.Var) -> sym.Var:
    """The loop variable a packing loop over factor ``x`` runs innermost: the one a load reading both
    variables (the operand's matrix, not a per-row or per-column vector beside it, e.g. a norm's scale)
    reads with unit stride; else as ``inner_var``."""
    for y in x.walk():
        if isinstance(y, (ir.Load, ir.Bytes)):
            e = sym.to_expr(y.offset)
            if {first, second} <= sym.free_vars(e):
                for v in (first, second):
                    if unit_stride(e, v):
                        return v
    return inner_var(x, first, second)


def inner_var(x: ir.IR, first: sym.Var, second: sym.Var) -> sym.Var:
    """Which of two loop variables a packing loop should run innermost: the one some load of ``x`` reads
    with unit stride (so the loop reads memory contiguously); ``second`` when neither is."""
    for y in x.walk():
        if isinstance(y, ir.Load):
            e = sym.to_expr(y.offset)
            if isinstance(e, sym.Sum) and (first, 1) in e.terms or e == first:
                return first
    return second


def static_sizes(shape: tuple, form: MatmulForm | None) -> tuple[int | None, int | None, int | None, int | None]:
    """(columns, rows, depth, batch) of a matmul-like kernel of ``shape`` and form ``form``, each None unless
    static (all None without a form): what heuristics size a schedule by."""
    if form is None:
        return None, None, None, None

    def static(x):
        return int(x) if sym.is_const(x) else None
    batch = sym.prod([shape[i] for i in form.batch]) if form.batch else 1
    return static(shape[form.n]), static(shape[form.m]), static(form.reduce.size), static(batch)
