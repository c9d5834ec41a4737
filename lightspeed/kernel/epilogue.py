"""Epilogues: the elementwise kernel that only reads a matmul's result folds into the matmul's kernel.

``relu(x @ W.T + b)`` forms two kernels: the "gemm" kernel stores the product in a temporary buffer and a
loop kernel reads it back to add the bias and clamp. When that loop kernel is the product's only reader,
reads it at its own output index (no broadcast, no shift), and everything else it reads is ready when the
gemm runs, the two become one: the gemm stores into the loop kernel's output and applies the loop kernel's
expression (its ``epilogue``) to each block of outputs it has just finished, while the block is in cache.
The temporary buffer and one pass over the product go away.

Values are unchanged: the epilogue is the loop kernel's expression at the same index, reading the stored
product (float32, as the temporary held it). The pass runs on a backend's request (the C backend); the
fused kernel is still "gemm", with ``value`` the product and ``epilogue`` set.
"""
from __future__ import annotations

import dataclasses

from .. import dtypes as dt
from .. import symbolic as sym
from . import ir
from .fusion import KernelPlan, kernel_reads, plan_memory

__all__ = ["fuse_epilogues", "replace_loads"]


def replace_loads(x: ir.IR, buf: ir.Buffer, by: ir.IR, memo: dict | None = None) -> ir.IR:
    """``x`` with every load of ``buf`` replaced by ``by`` (shared operands stay shared)."""
    memo = {} if memo is None else memo
    if id(x) in memo:
        return memo[id(x)]
    if isinstance(x, ir.Load) and x.buf is buf:
        y = by
    elif isinstance(x, ir.Alu):
        y = dataclasses.replace(x, args=tuple(replace_loads(a, buf, by, memo) for a in x.args))
    elif isinstance(x, ir.Cast):
        y = dataclasses.replace(x, arg=replace_loads(x.arg, buf, by, memo))
    elif isinstance(x, ir.Select):
        y = dataclasses.replace(x, value=replace_loads(x.value, buf, by, memo))
    else:
        y = x
    memo[id(x)] = y
    return y


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(sym.same(x, y) for x, y in zip(a, b))


def _same_size(a, b) -> bool:
    """Same shape, or constant shapes with the same number of elements (a reshape of the product)."""
    if _same_shape(a, b):
        return True
    if not all(sym.is_const(x) for x in (*a, *b)):
        return False
    return int(sym.prod(a)) == int(sym.prod(b))


def _unravel(flat: sym.sint, loop_vars, shape) -> dict:
    """Each of ``loop_vars`` (over ``shape``, row-major) at the flat position ``flat``."""
    out, stride = {}, 1
    for v, size in zip(reversed(loop_vars), reversed(shape)):
        out[v] = sym.mod(sym.floordiv(flat, stride), int(size))
        stride *= int(size)
    return out


def _epilogue_of(gemm: ir.Kernel, consumer: ir.Kernel) -> ir.IR | None:
    """The consumer's expression as an epilogue of ``gemm`` (over gemm's loop variables, reading the product
    from the consumer's output), or None when it is not elementwise on the product."""
    if consumer.kind != "loop" or consumer.template is not None or consumer.scatter_index is not None:
        return None
    if consumer.out.dtype is not dt.float32 or not _same_size(consumer.shape, gemm.shape):
        return None
    if consumer.out is gemm.out or consumer.out in consumer.reads:
        return None
    own = ir.dense_offset(consumer.loop_vars, consumer.shape)
    loads = 0
    for x in consumer.value.walk():
        if isinstance(x, (ir.Reduce, ir.Gather)):
            return None  # keeps the epilogue a plain function of the index
        if isinstance(x, ir.Bytes) and x.buf is gemm.out:
            return None
        if isinstance(x, ir.Load) and x.buf is gemm.out:
            if not sym.same(x.offset, own):
                return None
            loads += 1
    if not loads:
        return None
    # the consumer's index as a function of the gemm's: the same position in the same row-major order
    if _same_shape(consumer.shape, gemm.shape):
        mapping = dict(zip(consumer.loop_vars, gemm.loop_vars))
    else:
        mapping = _unravel(ir.dense_offset(gemm.loop_vars, gemm.shape), consumer.loop_vars, consumer.shape)
    try:
        epi = ir.substitute(consumer.value, mapping)
    except TypeError:
        return None
    product = ir.Load(consumer.out, ir.dense_offset(gemm.loop_vars, gemm.shape), dt.float32)
    return replace_loads(epi, gemm.out, product)


def _merge_stored_part(kernels: list, ai: int, bi: int) -> ir.Kernel | None:
    """Kernel ``bi`` with kernel ``ai``'s expression in place of its loads of ``ai``'s output, when ``ai`` is an
    elementwise part of ``bi`` stored only for ``bi`` (both over the same shape, ``bi`` reading it at its own
    index): an expensive subexpression (gelu's ``|x|``) that kernel formation stored so it is computed once.
    In the merged expression it is one shared node, which the renderer still computes once per element."""
    a, b = kernels[ai], kernels[bi]
    if a.kind != "loop" or b.kind != "loop" or a.out.kind != "temp" or not _same_shape(a.shape, b.shape):
        return None
    if a.out not in b.reads or a.template is not None or b.template is not None:
        return None
    if any(k is not None and k is not b and a.out in k.reads for k in kernels):
        return None
    own = ir.dense_offset(b.loop_vars, b.shape)
    for x in b.value.walk():
        if isinstance(x, (ir.Reduce, ir.Gather)) or (isinstance(x, ir.Bytes) and x.buf is a.out):
            return None
        if isinstance(x, ir.Load) and x.buf is a.out and not sym.same(x.offset, own):
            return None
    if any(isinstance(x, (ir.Reduce, ir.Gather)) for x in a.value.walk()):
        return None
    try:
        part = ir.substitute(a.value, dict(zip(a.loop_vars, b.loop_vars)))
    except TypeError:
        return None
    merged = dataclasses.replace(b, value=replace_loads(b.value, a.out, part))
    merged.reads = kernel_reads(merged)
    return merged


def fuse_epilogues(plan: KernelPlan) -> KernelPlan:
    """``plan`` with each gemm kernel's sole elementwise reader folded in as its epilogue (see the module
    docstring); a new plan (the kernels it changes are copies), or ``plan`` itself when nothing fuses."""
    kernels = list(plan.kernels)
    outputs = {id(b) for b in plan.outputs}
    writer = {id(k.out): i for i, k in enumerate(kernels)}
    changed = False
    for gi in range(len(kernels)):
        g = kernels[gi]
        if g is None or g.kind != "gemm" or g.epilogue is not None or g.out.kind != "temp":
            continue
        if g.out.dtype is not dt.float32 or id(g.out) in outputs:
            continue
        readers = [i for i, k in enumerate(kernels) if k is not None and i != gi and g.out in k.reads]
        if len(readers) == 2:  # gelu: a part of the expression stored once, then the rest reads both
            merged = _merge_stored_part(kernels, *readers)
            if merged is not None:
                kernels[readers[0]], kernels[readers[1]] = None, merged
                readers = [readers[1]]
        if len(readers) != 1:
            continue
        ci = readers[0]
        c = kernels[ci]
        # the fused kernel runs where the gemm did: what else the consumer reads must be ready by then, and
        # nothing between may touch the consumer's output
        if any(writer.get(id(b), -1) > gi for b in c.reads if b is not g.out):
            continue
        between = [k for k in kernels[gi + 1:ci] if k is not None]
        if any(c.out is k.out or c.out in k.reads for k in between):
            continue
        epi = _epilogue_of(g, c)
        if epi is None:
            continue
        fused = dataclasses.replace(g, out=c.out, epilogue=epi)
        fused.reads = kernel_reads(fused)
        kernels[gi], kernels[ci] = fused, None
        writer[id(c.out)] = gi
        changed = True
    if not changed:
        return plan
    kept = [k for k in kernels if k is not None]
    live = {id(b) for k in kept for b in [k.out, *k.reads, *k.scratch]}
    temps = [b for b in plan.temps if id(b) in live]
    out = dataclasses.replace(plan, kernels=kept, temps=temps)
    out.arena_bytes = plan_memory(out)
    return out
