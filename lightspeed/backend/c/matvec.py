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

from ... import dtypes as dt
from ... import symbolic as sym
from ...kernel import ir
from ...kernel.ir import loop_var
from ...kernel.matmul_form import MatmulForm
from ...kernel.schedule import IntegerDot
from ...ops import Op
from .loop_split import block_split, hoist_invariants, substitute

ROWS = 4  # outputs per step (register blocking over n)
ITEM = 64  # outputs per work item
PLAIN_BLOCK = 16  # block of a sum without a quantization block (a float weight row)
INTEGER_MAX = 1 << 16  # activation elements of a call (rows x k) quantized on the stack by IntegerDot's form


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


def integer_parts(body: ir.IR, lo: sym.Var, row: sym.Var) -> tuple[ir.IR, ir.IR | None, ir.IR] | None:
    """(activation, weight scale or None, int8 weight) when a block's product ``body`` (over ``lo``, for weight
    row ``row``) is ``a * (s * w)``: ``a`` free of the row, ``s`` free of ``lo`` and ``w`` an int8 element read
    at unit stride along ``lo`` (a Q8_0 block's quant, an int8 matrix), in any order of the factors; else None.
    Such a block can be summed as integers (``IntegerDot``)."""
    if not isinstance(body, ir.Alu) or body.op is not Op.MUL:
        return None
    for a, b in (body.args, body.args[::-1]):
        if row in ir.ir_vars(a):
            continue
        pairs = [(None, b)]
        if isinstance(b, ir.Alu) and b.op is Op.MUL:
            pairs += [(b.args[0], b.args[1]), (b.args[1], b.args[0])]
        for scale, w in pairs:
            if (scale is None or lo not in ir.ir_vars(scale)) and int8_element(w, lo) is not None:
                return a, scale, w
    return None


def int8_element(w: ir.IR, lo: sym.Var) -> tuple[ir.Buffer, sym.sint] | None:
    """(buffer, offset at lo = 0) of an int8 element read at unit stride along ``lo`` as float32, else None."""
    if isinstance(w, ir.Bytes) and w.stored is dt.int8:
        buf, off = w.buf, w.offset
    elif isinstance(w, ir.Cast) and isinstance(w.arg, ir.Load) and w.arg.dtype is dt.int8:
        buf, off = w.arg.buf, w.arg.offset
    else:
        return None
    e = sym.to_expr(off)
    base = e.substitute({lo: 0})
    return (buf, base) if w.dtype is dt.float32 and sym.same(e, sym.add(base, lo)) else None


def render_matvec(r, k: ir.Kernel, form: MatmulForm, blocks: tuple, dense: sym.sint, grain: int) -> tuple[str, str]:
    """(function text, launch text) of ``k`` as blocked dot products (see the module docstring); ``r`` is the
    KernelRenderer, ``dense`` the output offset over the kernel's loop variables. Under a schedule with
    ``IntegerDot(16)``, a kernel without batch axes whose blocks are 32 int8 weights also gets an integer form
    (``integer_functions``), which a call of at most ``INTEGER_MAX`` activation elements takes."""
    c, hi, lo, body = blocks
    vars_, shape = list(k.loop_vars), list(k.shape)
    mvar, nvar = vars_[form.m], vars_[form.n]
    others = [i for i in range(len(vars_)) if i not in (form.m, form.n)]
    nblk = int(form.reduce.size) // c
    M, N = r.idx(shape[form.m]), r.idx(shape[form.n])
    rows = [loop_var(f"{nvar.name}_r{t}", shape[form.n]) for t in range(ROWS)]
    lines = _head(r, k, "KFN", "    const ls_launch *l = (const ls_launch *)vctx;") + [
        f"    const int64_t M = {M}, N = {N}, NI = (N + {ITEM - 1}) / {ITEM};",
        "    for (int64_t p = p0; p < p1; p++) {",
        "        int64_t q = p;",
        "        const int64_t nb = q % NI; q /= NI;"]
    for i in reversed(others):
        lines.append(f"        const int64_t {r.var(vars_[i])} = q % {r.idx(shape[i])}; q /= {r.idx(shape[i])};")
    lines.append("        (void)q;")
    lines += float_steps(r, blocks, rows, nvar, mvar, nblk, dense, k) + ["    }", "}"]
    B = r.idx(sym.prod([shape[i] for i in others])) if others else "1"
    work = r.idx(sym.mul(sym.prod(shape), form.reduce.size))
    call = (f"    {{ const int64_t N = {N}; const int64_t n = ({B}) * ((N + {ITEM - 1}) / {ITEM});\n"
            f"      if (({work}) >= {grain}) ls_parallel_for(KFN, &l, n); else KFN(&l, 0, n); }}")
    bits = k.schedule.size(IntegerDot, "k", 0) if k.schedule is not None else 0
    parts = integer_parts(substitute(body, {nvar: rows[0]}), lo, rows[0]) if bits == 16 and c == 32 else None
    if parts is not None and not others:
        K = nblk * c
        r.uses_integer_dot = True
        lines += [""] + integer_functions(r, blocks, rows, nvar, mvar, nblk, dense, k, parts[0])
        call = (f"    {{ const int64_t M = {M}, N = {N}; const int64_t n = (N + {ITEM - 1}) / {ITEM};\n"
                f"      if (M * {K} <= {INTEGER_MAX}) {{\n"
                f"        int16_t qa[M * {K}] __attribute__((aligned(32))); float qs[M * {nblk}];\n"
                "        KFN_quant(lp, qa, qs);\n"
                "        const ls_idot_launch g = {*lp, qa, qs};\n"
                f"        if (({work}) >= {grain}) ls_parallel_for(KFN_int, (void *)&g, n); "
                "else KFN_int((void *)&g, 0, n);\n"
                f"      }} else {{\n  {call.strip()}\n      }} }}")
    return "\n".join(lines), call


def _head(r, k: ir.Kernel, name: str, launch: str) -> list[str]:
    """The first lines of a work-item function ``name``: its launch (``launch`` declares ``l``), its buffers."""
    return [f"static void {name}(void *vctx, int64_t p0, int64_t p1) {{", launch,
            "    const ls_args *a = l->a;", "    (void)a;"] + [f"    {d}" for d in r.decls(k)]


def float_steps(r, blocks: tuple, rows: list, nvar: sym.Var, mvar: sym.Var, nblk: int, dense: sym.sint,
                k: ir.Kernel) -> list[str]:
    """The loops of one work item in float: ``ROWS`` outputs a step, ``c`` lanes of partial sums each."""
    c, hi, lo, body = blocks
    mv, hv, lv = r.var(mvar), r.var(hi), r.var(lo)
    # rows of the call innermost but one: a step's weight rows (ROWS x k) are re-read from L1 for each
    lines = [f"        for (int64_t j0 = nb * {ITEM}; j0 < ls_min(N, nb * {ITEM} + {ITEM}); j0 += {ROWS}) {{",
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
    return lines + ["            }", "        }"]


def integer_functions(r, blocks: tuple, rows: list, nvar: sym.Var, mvar: sym.Var, nblk: int, dense: sym.sint,
                      k: ir.Kernel, a_expr: ir.IR) -> list[str]:
    """``KFN_quant`` and ``KFN_int``: the integer form (``IntegerDot(16)``, idot.h). The launcher quantizes the
    call's activation rows once, per block of 32, to int16 with one scale each (``ls_quantize16``); each work
    item then sums every block of each output with ``ls_idot16x32`` (eight exact int32 lanes), converted to
    float and added into eight float lanes times the product of the two blocks' scales, and one horizontal sum
    (lane order) per output. ``a_expr``: the activation factor (``integer_parts``), the same for every row."""
    c, hi, lo, body = blocks
    mv, hv, lv = r.var(mvar), r.var(hi), r.var(lo)
    K = nblk * c
    lines = ["static void KFN_quant(const ls_launch *l, int16_t *restrict qa, float *restrict qs) {",
             "    const ls_args *a = l->a;", "    (void)a;"] + [f"    {d}" for d in r.decls(k)] + [
             f"    const int64_t M = {r.idx(k.shape[k.loop_vars.index(mvar)])};",
             f"    for (int64_t {mv} = 0; {mv} < M; {mv}++) {{",
             f"        for (int64_t {hv} = 0; {hv} < {nblk}; {hv}++) {{",
             f"            float av[{c}];",
             f"            for (int64_t {lv} = 0; {lv} < {c}; {lv}++) av[{lv}] = {r.expr(a_expr)};",
             f"            qs[{mv} * {nblk} + {hv}] = ls_quantize16(av, {c}, qa + {mv} * {K} + {hv} * {c});",
             "        }",
             "    }",
             "}",
             ""]
    lines += _head(r, k, "KFN_int", "    const ls_idot_launch *g = (const ls_idot_launch *)vctx;\n"
                                    "    const ls_launch *l = &g->l;")
    n_, m_ = k.shape[k.loop_vars.index(nvar)], k.shape[k.loop_vars.index(mvar)]
    lines += [f"    const int64_t M = {r.idx(m_)}, N = {r.idx(n_)};",
              "    for (int64_t p = p0; p < p1; p++) {",
              f"        for (int64_t j0 = p * {ITEM}; j0 < ls_min(N, p * {ITEM} + {ITEM}); j0 += {ROWS}) {{",
              f"            for (int64_t {mv} = 0; {mv} < M; {mv}++) {{"]
    lines += [f"                const int64_t {r.var(v)} = ls_min(j0 + {t}, N - 1);" for t, v in enumerate(rows)]
    lines += [f"                ls_vf32x8 acc[{ROWS}] = {{{{0}}}};",
              f"                const int16_t *qrow = g->qa + {mv} * {K};",
              f"                for (int64_t {hv} = 0; {hv} < {nblk}; {hv}++) {{",
              f"                    const float as = g->qs[{mv} * {nblk} + {hv}];"]
    for t, v in enumerate(rows):
        _, scale, w = integer_parts(substitute(body, {nvar: v}), lo, v)
        buf, base = int8_element(w, lo)
        lines.append(f"                    const int8_t *w{t} = (const int8_t *)({r.buf(buf)}) + ({r.idx(base)});")
        lines.append(f"                    __builtin_prefetch(w{t} + {ROWS} * ({_row_stride(r, base, v)}), 0, 3);")
        s = f"as * ({r.expr(scale)})" if scale is not None else "as"
        dot = f"ls_idot16x32(qrow + {hv} * {c}, w{t})"
        lines.append(f"                    acc[{t}] = ls_idot_acc(acc[{t}], {dot}, {s});")
    lines.append("                }")
    for t, v in enumerate(rows):
        off = r.idx(sym.to_expr(dense).substitute({nvar: v}))
        lines.append(f"                if (j0 + {t} < N) {r.buf(k.out)}[{off}] = ls_hsum8(acc[{t}]);")
    return lines + ["            }", "        }", "    }", "}"]


def _row_stride(r, base: sym.sint, row: sym.Var) -> str:
    """The distance in elements between two consecutive weight rows at ``base`` (prefetch distance unit)."""
    e = sym.to_expr(base)
    return r.idx(sym.add(e.substitute({row: sym.add(row, 1)}), sym.mul(e, -1)))
