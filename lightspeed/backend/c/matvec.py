"""C rendering of a matmul-like kernel called with few rows (decode): a dot product per output, blocked.

``b`` reads memory contiguously along k (a weight stored ``[n, k]``, a quantized row of blocks). The sum
over k runs as blocks of ``c`` elements (the quantization block when ``b`` has one: loop_split.block_split,
else 16): within a block the loop over its elements is contiguous and vectorised, and what the block
shares (its scale decode) is computed once before it (loop_split.hoist_invariants). ``ROWS`` outputs are
computed together, so each activation element is loaded once for all of them, and each output keeps
``c`` lanes of partial sums across blocks (one horizontal sum at the end, not one per block). Work items
are runs of ``ITEM`` outputs; the few rows of the call are a loop inside each item.
"""
from __future__ import annotations

from ... import symbolic as sym
from ...kernel import ir
from ...kernel.ir import loop_var
from ...kernel.matmul_form import MatmulForm
from .loop_split import block_split, hoist_invariants, substitute

ROWS = 4  # outputs per step (register blocking over n)
ITEM = 64  # outputs per work item
PLAIN_BLOCK = 16  # block of a sum without a quantization block (a float weight row)


def blocked_form(form: MatmulForm, k: ir.Kernel) -> tuple[int, sym.Var, sym.Var, ir.IR] | None:
    """(c, hi, lo, the product over hi and lo) when the sum can run in blocks of c, else None."""
    size = form.reduce.size
    if not sym.is_const(size):
        return None
    n = int(size)
    found = block_split(form.reduce.body, form.reduce.var, n, loop_var)
    if found is not None:
        return found
    if n % PLAIN_BLOCK or n < PLAIN_BLOCK:
        return None
    hi, lo = loop_var(f"{form.reduce.var.name}_hi", n // PLAIN_BLOCK), loop_var(f"{form.reduce.var.name}_lo",
                                                                                   PLAIN_BLOCK)
    body = substitute(form.reduce.body, {form.reduce.var: sym.add(sym.mul(hi, PLAIN_BLOCK), lo)})
    return PLAIN_BLOCK, hi, lo, body


def _prefetches(r, row_body: ir.IR, row: sym.Var, lo: sym.Var) -> list[str]:
    """Software prefetches of the weight bytes the step after this one reads at the same block: the loads of
    ``row_body`` that walk its row (``row``) along the block (``lo``), ``ROWS`` rows ahead (a few KiB: the
    hardware prefetcher alone leaves a decode's weight stream at a fraction of the memory bandwidth)."""
    out, seen = [], set()
    for y in row_body.walk():
        if not isinstance(y, (ir.Load, ir.Bytes)) or y.buf.kind not in ("const", "input"):
            continue
        free = sym.free_vars(y.offset)
        if row not in free or lo not in free or id(y.buf) in seen:
            continue
        seen.add(id(y.buf))
        ahead = sym.to_expr(y.offset).substitute({row: sym.add(row, ROWS), lo: 0})
        out.append(f"__builtin_prefetch(&{r.buf(y.buf)}[{r.idx(ahead)}], 0, 3);")
    return out


def render_matvec(r, k: ir.Kernel, form: MatmulForm, blocks: tuple, dense: sym.sint, grain: int) -> tuple[str, str]:
    """(function text, launch text) of ``k`` as blocked dot products (see the module docstring); ``r`` is the
    KernelRenderer, ``dense`` the output offset over the kernel's loop variables."""
    c, hi, lo, body = blocks
    vars_, shape = list(k.loop_vars), list(k.shape)
    mvar, nvar = vars_[form.m], vars_[form.n]
    others = [i for i in range(len(vars_)) if i not in (form.m, form.n)]
    nblk = int(form.reduce.size) // c
    M, N = r.idx(shape[form.m]), r.idx(shape[form.n])
    rows = [loop_var(f"{nvar.name}_r{t}", shape[form.n]) for t in range(ROWS)]
    lines = ["static void KFN(void *vctx, int64_t p0, int64_t p1) {",
             "    const ls_launch *l = (const ls_launch *)vctx;", "    const ls_args *a = l->a;", "    (void)a;"]
    lines += [f"    {d}" for d in r.decls(k)]
    lines += [f"    const int64_t M = {M}, N = {N}, NI = (N + {ITEM - 1}) / {ITEM};",
              "    for (int64_t p = p0; p < p1; p++) {",
              "        int64_t q = p;",
              "        const int64_t nb = q % NI; q /= NI;"]
    for i in reversed(others):
        lines.append(f"        const int64_t {r.var(vars_[i])} = q % {r.idx(shape[i])}; q /= {r.idx(shape[i])};")
    mv, hv, lv = r.var(mvar), r.var(hi), r.var(lo)
    # rows of the call innermost but one: a step's weight rows (ROWS x k) are re-read from L1 for each
    lines += ["        (void)q;",
              f"        for (int64_t j0 = nb * {ITEM}; j0 < ls_min(N, nb * {ITEM} + {ITEM}); j0 += {ROWS}) {{",
              f"            for (int64_t {mv} = 0; {mv} < M; {mv}++) {{"]
    # rows past N recompute the last row (no branch in the loop) and are not stored
    lines += [f"                const int64_t {r.var(v)} = ls_min(j0 + {t}, N - 1);" for t, v in enumerate(rows)]
    lines += [f"                float acc[{ROWS}][{c}] __attribute__((aligned(64)));",
              f"                for (int t = 0; t < {ROWS}; t++) for (int e = 0; e < {c}; e++) acc[t][e] = 0.0f;",
              f"                for (int64_t {hv} = 0; {hv} < {nblk}; {hv}++) {{"]
    steps = []
    for t, v in enumerate(rows):
        row_body, hoisted = hoist_invariants(substitute(body, {nvar: v}), lo, f"hs{t}_")
        lines += [f"                    const float {name} = {r.expr(h)};" for name, h in hoisted]
        lines += [f"                    {p}" for p in _prefetches(r, row_body, v, lo)]
        steps.append(f"acc[{t}][{lv}] += {r.expr(row_body)};")
    lines += ['                    _Pragma("omp simd")',
              f"                    for (int64_t {lv} = 0; {lv} < {c}; {lv}++) {{ " + " ".join(steps) + " }",
              "                }"]
    for t, v in enumerate(rows):
        off = r.idx(sym.to_expr(dense).substitute({nvar: v}))
        lines += [f"                if (j0 + {t} < N) {{ float s = 0.0f; "
                  f"for (int e = 0; e < {c}; e++) s += acc[{t}][e]; {r.buf(k.out)}[{off}] = s; }}"]
    lines += ["            }", "        }", "    }", "}"]
    B = r.idx(sym.prod([shape[i] for i in others])) if others else "1"
    call = (f"    {{ const int64_t N = {N}; const int64_t n = ({B}) * ((N + {ITEM - 1}) / {ITEM});\n"
            f"      if (({r.idx(sym.mul(sym.prod(shape), form.reduce.size))}) >= {grain}) "
            f"ls_parallel_for(KFN, &l, n); else KFN(&l, 0, n); }}")
    return "\n".join(lines), call
