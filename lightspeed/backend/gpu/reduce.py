"""GPU schedule of long reductions: a work group per output, its work items splitting the reduced axis.

A kernel whose value holds one reduction over at least ``MIN_SIZE`` elements (upper bound) — a row sum,
max or dot product with few outputs, such as a decode step's norms and matvecs, maybe under an epilogue
like ``rsqrt(mean(x * x) + eps)`` — gives each output a work group of ``GROUP`` work items: item ``i``
accumulates elements ``i, i + GROUP, ...`` in order, then the partial results are combined by a tree in
local (shared) memory and the first item computes the epilogue and stores. A sum that divides its index
by a constant (a quantized row's blocks of 32) runs by blocks instead: a few work items share a block,
each decoding its scale once and taking ``RUN`` consecutive elements of it (see ``_blocked_sum``). Float sums
therefore add in another order than the plain loop (within rounding); integer sums (wrapping) and max
(with its NaN flag) give the same bits.
"""
from __future__ import annotations

from ... import symbolic as sym
from ...kernel import ir
from ...kernel.ir import dense_offset, loop_var
from ...ops import Op
from ..c.loop_split import hoist_invariants, split_reduction

GROUP = 64  # work items per output (a power of two: the tree halves it)
RUN = 4  # consecutive elements of a block per work item, in a sum taken by blocks
MIN_SIZE = 128  # reductions shorter than this keep one work item per output


def row_reduction(k: ir.Kernel, kinds: tuple[str, ...] = ("loop", "tiled")) -> ir.Reduce | None:
    """The reduction kernel ``k`` computes under this schedule, or None: it must be of one of ``kinds`` and
    its value must hold exactly one reduction of at least ``MIN_SIZE`` elements, reached from the value
    through arithmetic and casts only (so it is evaluated unconditionally; an epilogue such as
    ``rsqrt(mean(x * x) + eps)`` is fine)."""
    if k.kind not in kinds:
        return None
    found: list[ir.Reduce] = []
    stack = [k.value]
    while stack:
        x = stack.pop()
        if isinstance(x, ir.Reduce):
            found.append(x)
        elif isinstance(x, (ir.Alu, ir.Cast)):
            stack.extend(x.children())
    if len(found) != 1 or sym.upper_bound(found[0].size) < MIN_SIZE:
        return None
    return found[0]


def render_row_reduction(r, red: ir.Reduce) -> tuple[str, sym.sint, int]:
    """(kernel text named ``KFN``, work items, work-group size) of ``r.kernel``, whose reduction is ``red``
    (see the module docstring); ``r`` is the kernel's KernelRenderer."""
    from .render import compute_type  # render.py imports this module
    k, em = r.kernel, r.em
    shape, vars_ = list(k.shape), list(k.loop_vars)
    acc_t = r.acc_type(red.dtype)
    float_max = red.op is Op.MAX_REDUCE and red.dtype.is_float
    r.declare_buffers()
    em.line("const ls_i64 lid = LS_LOCAL_ID;")
    em.line(f"LS_SHARED {acc_t} part[{GROUP}];")
    if float_max:
        em.line(f"LS_SHARED int part_nan[{GROUP}];")
    if vars_:
        em.line("ls_i64 rest = LS_GROUP_ID;")
    for pos in range(len(vars_) - 1, -1, -1):
        name = r.local_name(vars_[pos])
        if pos == 0:
            em.line(f"const ls_i64 {name} = rest;")
        else:
            size = em.sym(shape[pos])
            em.line(f"const ls_i64 {name} = rest % {size}; rest = rest / {size};")
        em.bind(vars_[pos], name)
    size = em.sym(red.size)
    em.line(f"{acc_t} acc = {r.reduce_init(red)};")
    if float_max:
        em.line("int nan = 0;")
    blocks = split_reduction(red, loop_var)
    if blocks is not None:
        _blocked_sum(r, blocks, compute_type)
    else:
        _strided_loop(r, red, size, acc_t, float_max)
    _combine(r, k, red, vars_, shape, acc_t, float_max, compute_type)
    outputs = sym.prod(shape) if shape else 1
    return r.finish(), sym.mul(outputs, GROUP), GROUP


def _blocked_sum(r, blocks: ir.Reduce, compute_type) -> None:
    """``acc`` of a sum split into blocks (a quantized row's blocks of 32: ``blocks`` sums over blocks a sum
    over a block's ``c`` contiguous elements). ``c / RUN`` work items share a block, each taking ``RUN``
    consecutive elements, so a pass of the group reads ``GROUP * RUN`` contiguous elements (neighbouring
    work items read neighbouring bytes: a GPU's loads coalesce) and what a block's elements share (its
    scale) is decoded once per ``RUN`` elements instead of once per element."""
    em, inner = r.em, blocks.body
    c = int(inner.size) if sym.is_const(inner.size) else 0
    share = c // RUN if c % RUN == 0 and c >= RUN and GROUP % (c // RUN) == 0 else 1
    run = c // share if share > 1 else 0
    hv = r.local_name(blocks.var)
    nb = em.sym(blocks.size)
    em.line(f"const ls_i64 part_block = lid / {share}, part_lane = lid % {share};")
    with em.block(f"for (ls_i64 {hv} = part_block; {hv} < {nb}; {hv} += {GROUP // share})"):
        em.bind(blocks.var, hv)
        body, hoisted = hoist_invariants(inner.body, inner.var, em.fresh("h") + "_")
        for name, y in hoisted:
            em.line(f"const {compute_type(y.dtype)} {name} = {r.expr(y)};")
        lv = r.local_name(inner.var)
        if run:
            header = f"for (ls_i64 j = 0; j < {run}; j++)"
            first = f"const ls_i64 {lv} = part_lane * {run} + j;"
        else:
            header = f"for (ls_i64 {lv} = 0; {lv} < {em.sym(inner.size)}; {lv}++)"
            first = None
        with em.block(header):
            if first:
                em.line(first)
            em.bind(inner.var, lv)
            em.line(f"acc += {r.expr(body)};")


def _strided_loop(r, red: ir.Reduce, size: str, acc_t: str, float_max: bool) -> None:
    """``acc`` of work item ``lid``: elements ``lid, lid + GROUP, ...`` of the reduction, in order."""
    em = r.em
    v = r.local_name(red.var)
    with em.block(f"for (ls_i64 {v} = lid; {v} < {size}; {v} += {GROUP})"):
        em.bind(red.var, v)
        body = r.expr(red.body)
        if red.op is Op.SUM_REDUCE:
            em.line(f"acc += {body};")
        elif float_max:
            em.line(f"nan |= {body} != {body}; acc = {body} > acc ? {body} : acc;")
        else:
            em.line(f"acc = ({acc_t}){body} > acc ? ({acc_t}){body} : acc;")


def _combine(r, k: ir.Kernel, red: ir.Reduce, vars_, shape, acc_t: str, float_max: bool, compute_type) -> None:
    """The tree over the work items' partial results, then the first item's epilogue and store."""
    em = r.em
    em.line("part[lid] = acc;" + (" part_nan[lid] = nan;" if float_max else ""))
    em.line("LS_BARRIER;")
    with em.block(f"for (ls_i64 s = {GROUP // 2}; s > 0; s >>= 1)"):
        with em.block("if (lid < s)"):
            if red.op is Op.SUM_REDUCE:
                em.line("part[lid] += part[lid + s];")
            else:
                em.line("part[lid] = part[lid + s] > part[lid] ? part[lid + s] : part[lid];")
                if float_max:
                    em.line("part_nan[lid] |= part_nan[lid + s];")
        em.line("LS_BARRIER;")
    with em.block("if (lid == 0)"):
        result = "(part_nan[0] ? LS_NAN : part[0])" if float_max else f"(({compute_type(red.dtype)})part[0])"
        em.line(f"const {compute_type(red.dtype)} reduced = {r.round16(result, red.dtype)};")
        r.define(red, "reduced")  # the epilogue reads the combined value in place of the reduction
        off = em.sym(dense_offset(vars_, shape)) if shape else "0"
        em.line(f"{r.buf(k.out)}[{off}] = {r.store_value(k.out.dtype, r.expr(k.value))};")
