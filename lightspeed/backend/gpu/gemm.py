"""GPU schedule of matmul-like ("gemm") kernels: a tile of outputs per work group, panels in local memory,
a register block of outputs per work item.

``out[.., m, .., n] = sum_k a(.., m, k) * b(.., k, n)`` (kernel/matmul_form.py). A work group of
``THREADS`` (256) work items computes a ``TILE x TILE`` (64 x 64) tile of outputs of one batch index; each
work item holds ``REG x REG`` (4 x 4) of them in registers, rows ``ty + 16 i`` and columns ``tx + 16 j`` of
the tile (strided, so a warp's loads from the panels and its stores are contiguous). For each block of
``DEPTH`` (16) steps of k, the work items evaluate the ``TILE x DEPTH`` panel of ``a`` and the ``DEPTH x
TILE`` panel of ``b`` into local (shared) memory, four elements each (the factors are IR expressions, so a
transposed, padded or quantized operand is read through its own index arithmetic, once per work group
instead of once per output), the group synchronises, and each work item accumulates its 16 outputs from
4 + 4 panel values per step (16 multiply-adds for 8 local loads, where one output per item needs 2 loads
per multiply-add). Elements past the ends are zeros in the panels and are not stored. Each output's sum
runs over k in order, as the plain loop does.
"""
from __future__ import annotations

from ... import symbolic as sym
from ...kernel.ir import dense_offset
from ...kernel.matmul_form import MatmulForm

TILE = 64  # outputs per side of a work group's tile
DEPTH = 16  # steps of k per panel
REG = 4  # outputs per side of a work item's register block
SIDE = TILE // REG  # work items per side of the group (16)
THREADS = SIDE * SIDE  # 256


def render_gemm(r, form: MatmulForm) -> tuple[str, sym.sint, int]:
    """(kernel text named ``KFN``, work items, work-group size) of gemm kernel ``r.kernel`` under the tile
    schedule; ``r`` is the KernelRenderer of that kernel."""
    k, em, T, D = r.kernel, r.em, TILE, DEPTH
    shape, vars_ = list(k.shape), list(k.loop_vars)
    mvar, nvar, kvar = vars_[form.m], vars_[form.n], form.reduce.var
    M, N = shape[form.m], shape[form.n]
    tiles_m = sym.floordiv(sym.add(M, T - 1), T)
    tiles_n = sym.floordiv(sym.add(N, T - 1), T)
    batch = [(vars_[i], shape[i]) for i in form.batch]
    groups = sym.mul(sym.prod([s for _, s in batch]), sym.mul(tiles_m, tiles_n))
    r.declare_buffers()
    em.line(f"const ls_i64 lid = LS_LOCAL_ID, ty = lid / {SIDE}, tx = lid % {SIDE};")
    em.line(f"LS_SHARED float As[{T}][{D}];")
    em.line(f"LS_SHARED float Bs[{D}][{T}];")
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
    em.line(f"float acc[{REG}][{REG}];")
    em.line(f"for (int i = 0; i < {REG}; i++) for (int j = 0; j < {REG}; j++) acc[i][j] = 0.0f;")
    per_item = T * D // THREADS
    with em.block(f"for (ls_i64 k0 = 0; k0 < {K}; k0 += {D})"):
        with em.block(f"for (int e = 0; e < {per_item}; e++)"):
            # a's panel: element q = lid + 256 e is row q / DEPTH, column q % DEPTH (rows m, columns k);
            # b's: row q / TILE (k), column q % TILE (n), so consecutive work items read consecutive n
            em.line(f"const ls_i64 q = lid + {THREADS} * e;")
            em.line(f"const ls_i64 am = m0 + q / {D}, ak = k0 + q % {D}, bk = k0 + q / {T}, bn = n0 + q % {T};")
            em.line("float av = 0.0f, bv = 0.0f;")
            with em.block(f"if (am < {Mt} && ak < {K})"):
                em.bind(mvar, "am")
                em.bind(kvar, "ak")
                em.line(f"av = {r.expr(form.a)};")
            with em.block(f"if (bk < {K} && bn < {Nt})"):
                em.bind(kvar, "bk")
                em.bind(nvar, "bn")
                em.line(f"bv = {r.expr(form.b)};")
            em.line(f"As[q / {D}][q % {D}] = av; Bs[q / {T}][q % {T}] = bv;")
        em.line("LS_BARRIER;")
        em.line(f"const ls_i64 kn = ls_min({D}, {K} - k0);")
        with em.block("for (ls_i64 kk = 0; kk < kn; kk++)"):
            em.line(f"float ar[{REG}], br[{REG}];")
            em.line(f"for (int i = 0; i < {REG}; i++) ar[i] = As[ty + {SIDE} * i][kk];")
            em.line(f"for (int j = 0; j < {REG}; j++) br[j] = Bs[kk][tx + {SIDE} * j];")
            em.line(f"for (int i = 0; i < {REG}; i++) for (int j = 0; j < {REG}; j++) acc[i][j] += ar[i] * br[j];")
        em.line("LS_BARRIER;")
    with em.block(f"for (int i = 0; i < {REG}; i++)"):
        with em.block(f"for (int j = 0; j < {REG}; j++)"):
            em.line(f"const ls_i64 om = m0 + ty + {SIDE} * i, on = n0 + tx + {SIDE} * j;")
            with em.block(f"if (om < {Mt} && on < {Nt})"):
                em.bind(mvar, "om")
                em.bind(nvar, "on")
                off = em.sym(dense_offset(vars_, shape))
                em.line(f"{r.buf(k.out)}[{off}] = {r.store_value(k.out.dtype, 'acc[i][j]')};")
    return r.finish(), sym.mul(groups, THREADS), THREADS
