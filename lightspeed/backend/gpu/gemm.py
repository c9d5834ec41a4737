"""GPU schedule of matmul-like ("gemm") kernels: a tile of outputs per work group, panels in local memory.

``out[.., m, .., n] = sum_k a(.., m, k) * b(.., k, n)`` (kernel/matmul_form.py). A work group of
``TILE x TILE`` work items computes a ``TILE x TILE`` tile of outputs of one batch index, one output per
work item. For each block of ``TILE`` steps of k, every work item evaluates one element of ``a``'s panel and
one of ``b``'s (the factors are IR expressions, so a transposed, padded or quantized operand is read through
its own index arithmetic, once per work group instead of once per output), the group synchronises, and each
work item accumulates its output from the two panels in local (shared) memory. Elements past the ends are
zeros in the panels and are not stored. The sum runs over k in order, as the plain loop does.
"""
from __future__ import annotations

from ... import symbolic as sym
from ...kernel.ir import dense_offset
from ...kernel.matmul_form import MatmulForm

TILE = 16  # outputs per side of a work group's tile, and steps of k per panel


def render_gemm(r, form: MatmulForm) -> tuple[str, sym.sint, int]:
    """(kernel text named ``KFN``, work items, work-group size) of gemm kernel ``r.kernel`` under the tile
    schedule; ``r`` is the KernelRenderer of that kernel."""
    k, em, T = r.kernel, r.em, TILE
    shape, vars_ = list(k.shape), list(k.loop_vars)
    mvar, nvar, kvar = vars_[form.m], vars_[form.n], form.reduce.var
    M, N = shape[form.m], shape[form.n]
    tiles_m = sym.floordiv(sym.add(M, T - 1), T)
    tiles_n = sym.floordiv(sym.add(N, T - 1), T)
    batch = [(vars_[i], shape[i]) for i in form.batch]
    groups = sym.mul(sym.prod([s for _, s in batch]), sym.mul(tiles_m, tiles_n))
    r.declare_buffers()
    em.line("const ls_i64 lid = LS_LOCAL_ID, ty = lid / %d, tx = lid %% %d;" % (T, T))
    em.line(f"LS_SHARED float As[{T}][{T}];")
    em.line(f"LS_SHARED float Bs[{T}][{T}];")
    em.line("ls_i64 rest = LS_GROUP_ID;")
    tn, tm = em.sym(tiles_n), em.sym(tiles_m)
    em.line(f"const ls_i64 n0 = (rest % {tn}) * {T}; rest = rest / {tn};")
    em.line(f"const ls_i64 m0 = (rest % {tm}) * {T}; rest = rest / {tm};")
    for pos in range(len(batch) - 1, -1, -1):
        v, size = batch[pos]
        name = r.local_name(v)
        if pos == 0:
            em.line(f"const ls_i64 {name} = rest;")
        else:
            s = em.sym(size)
            em.line(f"const ls_i64 {name} = rest % {s}; rest = rest / {s};")
        em.bind(v, name)
    Mt, Nt, K = em.sym(M), em.sym(N), em.sym(form.reduce.size)
    em.line("float acc = 0.0f;")
    with em.block(f"for (ls_i64 k0 = 0; k0 < {K}; k0 += {T})"):
        # a's panel: rows m0 + ty, columns k0 + tx; b's: rows k0 + ty, columns n0 + tx
        em.line("const ls_i64 am = m0 + ty, ak = k0 + tx, bk = k0 + ty, bn = n0 + tx;")
        em.line("float av = 0.0f, bv = 0.0f;")
        with em.block(f"if (am < {Mt} && ak < {K})"):
            em.bind(mvar, "am")
            em.bind(kvar, "ak")
            em.line(f"av = {r.expr(form.a)};")
        with em.block(f"if (bk < {K} && bn < {Nt})"):
            em.bind(kvar, "bk")
            em.bind(nvar, "bn")
            em.line(f"bv = {r.expr(form.b)};")
        em.line("As[ty][tx] = av; Bs[ty][tx] = bv;")
        em.line("LS_BARRIER;")
        em.line(f"const ls_i64 kn = ls_min({T}, {K} - k0);")
        em.line("for (ls_i64 kk = 0; kk < kn; kk++) acc += As[ty][kk] * Bs[kk][tx];")
        em.line("LS_BARRIER;")
    with em.block(f"if (m0 + ty < {Mt} && n0 + tx < {Nt})"):
        em.line("const ls_i64 om = m0 + ty, on = n0 + tx;")
        em.bind(mvar, "om")
        em.bind(nvar, "on")
        off = em.sym(dense_offset(vars_, shape))
        em.line(f"{r.buf(k.out)}[{off}] = {r.store_value(k.out.dtype, 'acc')};")
    return r.finish(), sym.mul(groups, T * T), T * T
