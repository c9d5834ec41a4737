"""C rendering of matmul-like kernels under their schedule: packed panels and a register-blocked micro-kernel.

A work item is one tile of ``Tile("m")`` x ``Tile("n")`` outputs (of one batch index). For each block of
``Tile("k")`` reduction steps it packs the item's tile of ``b`` into panels of ``Register("n")`` columns
(the factors are IR expressions, so a transposed, strided or quantized operand is read through its own
index arithmetic once and then streams densely; a weight stored ``[n, k]`` is packed by register block
transposes), and runs the micro-kernel on every panel and block of ``Register("m")`` rows of ``a``: an
``MR x NR`` block of accumulators held in GCC vector-extension registers of ``Vectorize("n")`` lanes,
updated by one broadcast multiply-add per row and vector per step of k (``Unroll("k")``). ``a`` is read
in one of three ways: with ``Pack("a")`` each item packs panels of its rows; without it a plain load is
read where it lies, and any other factor is packed once per call into panels all items share (a first
parallel pass). Partial tiles compute on zero-padded panels (or a repeated last row) and store their
valid part. No intrinsics: the vector types lower to AVX-512, AVX2, NEON or plain code, whatever the
compiler targets.

Work items are enumerated m-major (the column tile ``nb`` varies fastest) unless ``Order(("n", "m"))`` makes
the row tile fastest, so consecutive items share a panel of b; an Order naming ``"k"`` must name it last (k
runs inside every item either way), and any other Order is refused.

``SplitReduce("k", P)`` splits each tile's sum over k into ``S = min(P, number of k tiles)`` parts of whole
``Tile("k")`` tiles (so the packing's blocks are kept and no part is empty; one tile: no split), each a work
item of its own: part 0 sums into the output, part s > 0 into the calling thread's partial-sum buffer
(``ls_gemm_partials``, laid out like the output; without memory for it the call runs unsplit). A second
parallel pass (``_merge``) then adds parts 1, 2, ... to part 0 in index order, a row at a time, and applies the
epilogue to the merged row, so the result is the same bits every run and for any number of threads. Split k
applies with every way of reading a (in place, per item, shared panels) and to batched kernels; the few-rows
form does not split.

Few rows (``M < Register("m") / 2``: decode) make packing a loss, so such calls run the kernel's plain loop
form instead (rendered by the caller as ``small``).
"""
from __future__ import annotations

from ... import dtypes as dt
from ... import symbolic as sym
from ...kernel import ir
from ...kernel.ir import loop_var
from ...kernel.matmul_form import MatmulForm, pack_inner
from ...kernel.schedule import (IntegerDot, Order, Register, Schedule, ScheduleError, SplitReduce, Tile, Unroll,
                                Vectorize)
from .loop_split import block_split, hoist_invariants

AXES = ("m", "n", "k")
# the tile orders the renderer applies (outermost first) -> whether m is the fastest-varying tile index;
# k runs inside every work item, so a trailing "k" says what the renderer does anyway
ORDERS = {("m", "n"): False, ("n", "m"): True, ("m", "n", "k"): False, ("n", "m", "k"): True}


def _refused(step) -> bool:
    """Whether the C renderer cannot apply ``step`` (it vectorises n, blocks m and n in registers and
    splits only the reduction)."""
    return (isinstance(step, Vectorize) and step.axis != "n") or (isinstance(step, Register) and step.axis == "k") \
        or (isinstance(step, SplitReduce) and step.axis != "k") \
        or (isinstance(step, IntegerDot) and (step.axis, step.bits) != ("k", 16))


def gemm_sizes(s: Schedule) -> dict[str, int]:
    """The sizes a gemm schedule sets (MC, NC, KC tiles, MR x NR register block, W lanes, U unroll, P parts of
    k, NMAJOR: 1 when the tile order is n-major)."""
    s.validate(AXES)
    for step in s:
        if _refused(step):
            raise ScheduleError(f"gemm schedule: the C renderer does not apply {step} (it vectorises n, blocks m "
                                f"and n in registers, splits only k, and sums blocks of k as 16-bit integers)")
        if isinstance(step, Order) and tuple(step.axes) not in ORDERS:
            raise ScheduleError(f"gemm schedule: the C renderer does not apply {step}: it orders the tiles "
                                f"('m', 'n') or ('n', 'm'), with k (if named) last")
    out = {"MC": s.size(Tile, "m", 96), "NC": s.size(Tile, "n", 256), "KC": s.size(Tile, "k", 256),
           "MR": s.size(Register, "m", 6), "NR": s.size(Register, "n", 16), "W": s.size(Vectorize, "n", 8),
           "U": s.size(Unroll, "k", 1), "P": s.size(SplitReduce, "k", 1)}
    order = s.find(Order)
    out["NMAJOR"] = int(order is not None and ORDERS[tuple(order.axes)])
    if out["NR"] % out["W"]:
        raise ScheduleError(f"gemm schedule: Register('n', {out['NR']}) is not a multiple of "
                            f"Vectorize('n', {out['W']})")
    if out["MC"] % out["MR"] or out["NC"] % out["NR"]:
        raise ScheduleError(f"gemm schedule: tiles {out['MC']}x{out['NC']} are not multiples of the register "
                            f"block {out['MR']}x{out['NR']}")
    if out["W"] & (out["W"] - 1):
        raise ScheduleError(f"gemm schedule: Vectorize width {out['W']} is not a power of two")
    if out["MR"] * out["NR"] // out["W"] > 64:
        raise ScheduleError(f"gemm schedule: {out['MR']}x{out['NR']} accumulators of {out['W']} lanes is too many")
    if not s.packs("b"):
        raise ScheduleError("gemm schedule: the micro-kernel reads b from packed panels (Pack('b', 'k'))")
    return out


def pack_floats(s: Schedule) -> int:
    """Floats of the per-thread packing buffer a kernel under ``s`` needs (a panel of each operand)."""
    z = gemm_sizes(s)
    return z["MC"] * z["KC"] + z["KC"] * z["NC"] + z["MR"] * z["NR"]


def micro_kernel(MR: int, NR: int, W: int, U: int, packed_a: bool = True) -> tuple[str, str]:
    """(name, C text) of the MR x NR micro-kernel with W-lane vectors: c[i, j] (=|+=) sum_kk a[i, kk] b[kk, j]
    over a packed panel ``bp`` (kc x NR) of b and either a packed panel ``ap`` (kc x MR; ``lda`` unused) or,
    ``packed_a`` False, ``a`` in place: row i at ``ap + i * lda``, unit stride along k (rows past ``mr`` read
    row ``mr - 1`` again, so a partial block reads no memory past the operand); ``tile`` receives partial
    blocks."""
    name = f"ls_ukr_{MR}x{NR}_w{W}_u{U}" + ("" if packed_a else "_ia")
    nv = NR // W
    vt = f"ls_vf{W}"
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(MR)]
    lines = [f"static inline __attribute__((always_inline)) void {name}(int64_t kc, const float *restrict ap, "
             "int64_t lda, const float *restrict bp, float *restrict c, int64_t ldc, int64_t mr, int64_t nr, "
             "int first, float *restrict tile) {"]
    if packed_a:
        lines.append("    (void)lda;")
        a_at = [f"ap[kk * {MR} + {i}]" for i in range(MR)]
    else:
        lines += [f"    const float *restrict a{i} = ap + ({i} < mr ? {i} : mr - 1) * lda;" for i in range(MR)]
        a_at = [f"a{i}[kk]" for i in range(MR)]
    lines += [f"    {vt} " + ", ".join(f"{a} = {{0}}" for a in row) + ";" for row in acc]
    lines += [f'    _Pragma("GCC unroll {U}")' if U > 1 else "",
              "    for (int64_t kk = 0; kk < kc; kk++) {"]
    lines += [f"        const {vt} b{v} = ls_vload{W}(bp + kk * {NR} + {v * W});" for v in range(nv)]
    for i in range(MR):
        lines.append(f"        {{ const float a = {a_at[i]}; "
                     + " ".join(f"{acc[i][v]} += a * b{v};" for v in range(nv)) + " }")
    lines += ["    }",
              f"    if (mr == {MR} && nr == {NR}) {{",
              "        if (first) {"]
    lines += [f"            ls_vstore{W}(c + {i} * ldc + {v * W}, {acc[i][v]});" for i in range(MR) for v in range(nv)]
    lines += ["        } else {"]
    lines += [f"            ls_vstore{W}(c + {i} * ldc + {v * W}, ls_vload{W}(c + {i} * ldc + {v * W}) + {acc[i][v]});"
              for i in range(MR) for v in range(nv)]
    lines += ["        }", "        return;", "    }"]
    lines += [f"    ls_vstore{W}(tile + {i * NR + v * W}, {acc[i][v]});" for i in range(MR) for v in range(nv)]
    lines += ["    for (int64_t i = 0; i < mr; i++)",
              "        for (int64_t j = 0; j < nr; j++)",
              f"            c[i * ldc + j] = first ? tile[i * {NR} + j] : c[i * ldc + j] + tile[i * {NR} + j];",
              "}"]
    return name, "\n".join(x for x in lines if x)


def _pack_lines(dst: str, x: ir.IR, r, ov: str, kv: str, o0: str, on: str, R: int, outer_inner: bool,
                blocks: tuple | None = None) -> list[str]:
    """Lines that pack factor ``x`` for outputs ``o0 .. o0 + on`` (C variable ``ov``) and reductions
    ``k0 .. k0 + kc`` (``kv``) into ``dst``: panels of ``R`` outputs, ``kc x R`` each, outputs past ``on``
    zero. ``outer_inner``: the factor reads memory contiguously along the output axis (so the lanes of a
    panel are the inner loop); else along k (so k is). ``blocks`` (c, hi, lo, x over hi and lo; see
    loop_split.block_split): k runs as blocks of c, so the per-block part of ``x`` (a quantized block's
    scale) is computed once per block and the inner loop has no division."""
    text = r.expr(x)
    head = [f"            for (int64_t o = 0; o < {on}; o += {R}) {{",
            f"                float *restrict pan = {dst} + o * kc;",
            f"                const int64_t rn = ls_min({R}, {on} - o);",
            f"                if (rn < {R}) for (int64_t t = 0; t < kc * {R}; t++) pan[t] = 0.0f;"]
    if outer_inner:
        body = ["                for (int64_t kk = 0; kk < kc; kk++) {",
                f"                    const int64_t {kv} = k0 + kk;",
                '                    _Pragma("omp simd")',
                "                    for (int64_t t = 0; t < rn; t++) {",
                f"                        const int64_t {ov} = {o0} + o + t;",
                f"                        pan[kk * {R} + t] = {text};",
                "                    }", "                }"]
    elif blocks is not None:
        c, hi, lo, xb = blocks
        hv, lv = r.var(hi), r.var(lo)
        # what a block shares (its scale decode) is computed once before the loop over its elements
        xb, hoisted = hoist_invariants(xb, lo, f"h{dst}")
        body = ["                for (int64_t t = 0; t < rn; t++) {",
                f"                    const int64_t {ov} = {o0} + o + t;",
                f"                    for (int64_t {hv} = k0 / {c}; {hv} < (k0 + kc) / {c}; {hv}++) {{",
                f"                        float *restrict row = pan + ({hv} * {c} - k0) * {R} + t;"]
        body += [f"                        const float {name} = {r.expr(h)};" for name, h in hoisted]
        body += ['                        _Pragma("omp simd")',
                 f"                        for (int64_t {lv} = 0; {lv} < {c}; {lv}++) row[{lv} * {R}] = {r.expr(xb)};",
                 "                    }", "                }"]
    else:
        body = ["                for (int64_t t = 0; t < rn; t++) {",
                f"                    const int64_t {ov} = {o0} + o + t;",
                '                    _Pragma("omp simd")',
                "                    for (int64_t kk = 0; kk < kc; kk++) {",
                f"                        const int64_t {kv} = k0 + kk;",
                f"                        pan[kk * {R} + t] = {text};",
                "                    }", "                }"]
    return head + body + ["            }"]


def _transposed_pack_lines(r, x: ir.IR, rows: tuple, ov: str, kv: str, R: int, W: int) -> list[str]:
    """Lines that pack factor ``x`` = ``buf[base + o * stride + k]`` (a matrix stored along k, e.g. a weight
    ``[n, k]``) for outputs ``j0 .. j0 + nc`` into panels of ``R`` like ``_pack_lines``: W x W blocks are
    transposed in registers (``ls_transpose{W}``); the columns and k steps past the last whole block are
    copied one by one."""
    buf, base, stride = rows
    text = r.expr(x)
    src = f"{r.buf(buf)} + ({r.idx(base)}) + (j0 + o + tb) * ({r.idx(stride)}) + k0"
    return [f"            for (int64_t o = 0; o < nc; o += {R}) {{",
            "                float *restrict pan = bp + o * kc;",
            f"                const int64_t rn = ls_min({R}, nc - o);",
            f"                if (rn < {R}) for (int64_t t = 0; t < kc * {R}; t++) pan[t] = 0.0f;",
            "                int64_t tb = 0;",
            f"                for (; tb + {W} <= rn; tb += {W}) {{",
            "                    int64_t kk = 0;",
            f"                    for (; kk + {W} <= kc; kk += {W})",
            f"                        ls_transpose{W}({src} + kk, ({r.idx(stride)}), pan + kk * {R} + tb, {R});",
            "                    for (; kk < kc; kk++) {",
            f"                        const int64_t {kv} = k0 + kk;",
            f"                        for (int64_t t = tb; t < tb + {W}; t++) {{",
            f"                            const int64_t {ov} = j0 + o + t;",
            f"                            pan[kk * {R} + t] = {text};",
            "                        }", "                    }", "                }",
            "                for (int64_t t = tb; t < rn; t++) {",
            f"                    const int64_t {ov} = j0 + o + t;",
            "                    for (int64_t kk = 0; kk < kc; kk++) {",
            f"                        const int64_t {kv} = k0 + kk;",
            f"                        pan[kk * {R} + t] = {text};",
            "                    }", "                }", "            }"]


TILES_HELPER = """extern int ls_get_num_threads(void);
/* a gemm kernel's launch: the step's buffers, the tile sizes its launcher chose for this call, the shared
 * panels of a, and (split k) the number of parts and the partial sums of parts 1 .. parts - 1 */
typedef struct { ls_launch l; int64_t mt, nt; float *ash; int64_t parts; float *part; } ls_gemm_launch;
#include <stdlib.h>
/* the calling thread's buffer for a call's shared panels (grown on demand; NULL past LS_SHARE_MAX_FLOATS,
 * 256 MiB, or when memory is short: the kernel then packs per work item). Per thread, so concurrent calls
 * from several threads do not share it. */
#ifndef LS_SHARE_MAX_FLOATS
#define LS_SHARE_MAX_FLOATS ((int64_t)1 << 26)
#endif
static _Thread_local float *ls_share_buf;
static _Thread_local int64_t ls_share_cap;
/* the calling thread's buffer for a split-k call's partial sums (a buffer of its own: a call may use both),
 * under the same limit; without it the call runs unsplit */
static _Thread_local float *ls_part_buf;
static _Thread_local int64_t ls_part_cap;
static inline float *ls_grow_buf(float **buf, int64_t *cap, int64_t n) {
    if (n > LS_SHARE_MAX_FLOATS) return NULL;
    if (n > *cap) {
        void *p = NULL;
        free(*buf);
        *buf = NULL;
        *cap = 0;
        if (posix_memalign(&p, 64, (size_t)n * sizeof(float)) != 0) return NULL;
        *buf = (float *)p;
        *cap = n;
    }
    return *buf;
}
static inline float *ls_gemm_share(int64_t n) { return ls_grow_buf(&ls_share_buf, &ls_share_cap, n); }
static inline float *ls_gemm_partials(int64_t n) { return ls_grow_buf(&ls_part_buf, &ls_part_cap, n); }
/* runtime tile sizes: the schedule's tiles, halved (in whole register blocks) while a call has fewer
 * than three work items per thread, so small matrices still spread over the threads */
static inline void ls_gemm_tiles(int64_t B, int64_t M, int64_t N, int64_t MC, int64_t NC, int64_t MR, int64_t NR,
                                 int packs_a, int64_t *mt, int64_t *nt) {
    const int64_t want = 3 * (int64_t)ls_get_num_threads();
    int64_t mc = ls_min(MC, (M + MR - 1) / MR * MR), nc = ls_min(NC, (N + NR - 1) / NR * NR);
    /* an item packs mc + nc panel rows per mc * nc outputs (least when square: halve the longer side first);
     * with a read in place it packs only nc, once for all its rows: halve n first, so b is packed once */
    while (B * ((M + mc - 1) / mc) * ((N + nc - 1) / nc) < want) {
        if (!packs_a && nc >= 2 * NR) nc = (nc / 2 + NR - 1) / NR * NR;
        else if (mc >= nc && mc >= 2 * MR) mc = (mc / 2 + MR - 1) / MR * MR;
        else if (nc >= 2 * NR) nc = (nc / 2 + NR - 1) / NR * NR;
        else if (mc >= 2 * MR) mc = (mc / 2 + MR - 1) / MR * MR;
        else break;
    }
    if (!packs_a) {
        /* whole panels per item: of the widths that still give `want` items (or no wider than halving left),
         * the one whose busiest thread computes the fewest panels, the widest of those (1152 columns: 6
         * items of 3 panels, not 9 of 2) */
        const int64_t T = ls_get_num_threads(), pan = (N + NR - 1) / NR, rest = B * ((M + mc - 1) / mc);
        int64_t best = nc / NR, span = -1;
        for (int64_t per = ls_min(NC / NR, pan); per >= 1; per--) {
            const int64_t items = rest * ((pan + per - 1) / per);
            if (items < want && per > nc / NR) continue;
            const int64_t s = (items + T - 1) / T * per;
            if (span < 0 || s < span) { span = s; best = per; }
        }
        nc = best * NR;
    }
    *mt = mc; *nt = nc;
}
"""


SHUFFLE_HELPER = """/* a two-vector shuffle with constant lane indices (GCC and Clang spell it differently) */
#if defined(__clang__)
#define LS_SHUF(T, IT, x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
#else
#define LS_SHUF(T, IT, x, y, ...) __builtin_shuffle(x, y, (IT){__VA_ARGS__})
#endif
"""


def transpose_helper(w: int) -> str:
    """C text of ``ls_transpose{w}(src, ld, dst, ldd)``: the w x w block of floats whose row i is at
    ``src + i * ld`` stored transposed, row j at ``dst + j * ldd``, by log2(w) rounds of two-vector
    shuffles (round b swaps the off-diagonal b x b blocks of each 2b x 2b block)."""
    lines = [f"typedef int ls_vi{w} __attribute__((vector_size({4 * w})));",
             f"static inline void ls_transpose{w}(const float *restrict src, int64_t ld, float *restrict dst, "
             "int64_t ldd) {",
             f"    ls_vf{w} " + ", ".join(f"r{i} = ls_vload{w}(src + {i} * ld)" for i in range(w)) + ";"]
    b = 1
    while b < w:
        for i in range(w):
            if i & b:
                continue
            lo = [lane if not lane & b else w + lane - b for lane in range(w)]
            hi = [lane + b if not lane & b else w + lane for lane in range(w)]
            lines.append(f"    {{ const ls_vf{w} x = r{i}, y = r{i + b};")
            lines.append(f"      r{i} = LS_SHUF(ls_vf{w}, ls_vi{w}, x, y, {', '.join(map(str, lo))});")
            lines.append(f"      r{i + b} = LS_SHUF(ls_vf{w}, ls_vi{w}, x, y, {', '.join(map(str, hi))}); }}")
        b *= 2
    lines += [f"    ls_vstore{w}(dst + {i} * ldd, r{i});" for i in range(w)]
    return "\n".join(lines + ["}"])


def vector_helpers(widths) -> str:
    """Typedefs and unaligned load/store helpers for float vectors of the given lane counts, their block
    transposes (packing a weight stored [n, k]), and the runtime tile-size helper of gemm kernels."""
    out = [TILES_HELPER, SHUFFLE_HELPER]
    for w in sorted(set(widths)):
        out += [f"typedef float ls_vf{w} __attribute__((vector_size({4 * w})));",
                f"static inline ls_vf{w} ls_vload{w}(const float *p) "
                f"{{ ls_vf{w} v; memcpy(&v, p, sizeof v); return v; }}",
                f"static inline void ls_vstore{w}(float *p, ls_vf{w} v) {{ memcpy(p, &v, sizeof v); }}",
                transpose_helper(w)]
    return "\n".join(out) + "\n"


def _blocks(x: ir.IR, kvar: sym.Var, size: sym.sint, kc: int) -> tuple | None:
    """The block split of factor ``x`` along k (loop_split.block_split) when k tiles of ``kc`` hold whole
    blocks, else None."""
    if not sym.is_const(size):
        return None
    found = block_split(x, kvar, int(size), loop_var)
    return found if found is not None and kc % found[0] == 0 else None


def in_place(x: ir.IR, ovar: sym.Var, kvar: sym.Var) -> tuple[ir.Buffer, sym.sint, sym.sint] | None:
    """(buffer, offset at ``ovar = kvar = 0``, stride of ``ovar``) when factor ``x`` is a float32 load whose
    offset is that base plus ``ovar`` times the stride plus ``kvar`` (unit stride along k, the stride and base
    free of both), so the micro-kernel can read it where it lies; else None."""
    if not isinstance(x, ir.Load) or x.dtype is not dt.float32 or x.buf.dtype is not dt.float32:
        return None
    off = sym.to_expr(x.offset)
    base = off.substitute({ovar: 0, kvar: 0})
    stride = sym.add(off.substitute({ovar: 1, kvar: 0}), sym.mul(base, -1))
    if sym.free_vars(base, stride) & {ovar, kvar}:
        return None
    if not sym.same(off, sym.add(sym.add(base, sym.mul(ovar, stride)), kvar)):
        return None
    return x.buf, base, stride


def _item_lines(r, k: ir.Kernel, form: MatmulForm, nmajor: bool, split: bool) -> list[str]:
    """Lines that decode work item ``p`` into its tile (``mb``, ``nb``: rows ``i0 .. i0 + mc``, columns
    ``j0 .. j0 + nc``), its batch indices and, ``split``, its ``part`` of k. The tile index the order makes
    fastest comes first (``nb`` by default: m-major; ``mb`` n-major, so consecutive items share a panel of b);
    the part is slowest, so the items of one part are the unsplit call's items in their order."""
    vars_, shape = k.loop_vars, k.shape
    tiles = [("mb", "nmb"), ("nb", "nnb")]
    lines = ["        int64_t q = p;"]
    for v, count in (tiles if nmajor else tiles[::-1]):
        lines.append(f"        const int64_t {v} = q % {count}; q /= {count};")
    for i in reversed(form.batch):
        lines.append(f"        const int64_t {r.var(vars_[i])} = q % {r.idx(shape[i])}; q /= {r.idx(shape[i])};")
    lines.append("        const int64_t part = q;" if split else "        (void)q;")
    return lines + ["        const int64_t i0 = mb * MT, mc = ls_min(MT, M - i0);",
                    "        const int64_t j0 = nb * NT, nc = ls_min(NT, N - j0);"]


def _epilogue_lines(r, k: ir.Kernel, form: MatmulForm, dense: sym.Expr, rows: tuple[str, str],
                    cols: tuple[str, str], pad: str) -> list[str]:
    """Lines (indented by ``pad``) that apply ``k.epilogue`` in place to the outputs of tile rows
    ``rows[0] .. rows[1]`` and columns ``cols[0] .. cols[1]`` (C bounds, relative to ``i0``, ``j0``)."""
    m, n = r.var(k.loop_vars[form.m]), r.var(k.loop_vars[form.n])
    return [f"{pad}for (int64_t ii = {rows[0]}; ii < {rows[1]}; ii++) {{",
            f"{pad}    const int64_t {m} = i0 + ii;",
            f'{pad}    _Pragma("omp simd")',
            f"{pad}    for (int64_t jj = {cols[0]}; jj < {cols[1]}; jj++) {{",
            f"{pad}        const int64_t {n} = j0 + jj;",
            f"{pad}        {r.buf(k.out)}[{r.idx(dense)}] = {r.expr(k.epilogue)};",
            f"{pad}    }}", f"{pad}}}"]


def _fn_head(r, k: ir.Kernel, name: str) -> list[str]:
    """The first lines of one of a gemm kernel's parallel functions: its launch and buffer declarations."""
    return [f"static void {name}(void *vctx, int64_t p0, int64_t p1) {{",
            "    const ls_gemm_launch *g = (const ls_gemm_launch *)vctx;",
            "    const ls_launch *l = &g->l;", "    const ls_args *a = l->a;", "    (void)a;"] \
        + [f"    {d}" for d in r.decls(k)]


def render_gemm(r, k: ir.Kernel, schedule: Schedule, form: MatmulForm, small: tuple[str, str], dense: sym.sint,
                grain: int, epilogue_pass: tuple[str, str] | None = None) -> tuple[str, str]:
    """(function text, launch text) of gemm kernel ``k`` under ``schedule``; ``small`` is the kernel's plain
    loop form (function, launch) with ``KFN`` names, run when the call has few rows. ``r`` is the
    KernelRenderer (expression rendering, buffer and variable names); ``dense`` the output's offset over
    the loop variables; ``grain`` the work below which the call runs on the calling thread. A kernel with an
    epilogue applies it to each finished block (split k: to each merged row); ``epilogue_pass`` (a loop form
    over the whole output, with ``KFN`` names) applies it after the few-rows form."""
    z = gemm_sizes(schedule)
    MC, NC, KC, MR, NR, W, U, P = (z[x] for x in ("MC", "NC", "KC", "MR", "NR", "W", "U", "P"))
    nmajor, split = bool(z["NMAJOR"]), P > 1
    vars_, shape = list(k.loop_vars), list(k.shape)
    mvar, nvar, kvar = vars_[form.m], vars_[form.n], form.reduce.var
    batch = form.batch
    # without Pack('a') a plain load reads where it lies; any other factor (a view with guards, a decode) is packed
    direct = None if schedule.packs("a") else in_place(form.a, mvar, kvar)
    # ... and the other factors of an unbatched kernel are packed once per call into panels every item reads
    shared = not schedule.packs("a") and direct is None and not batch
    ukr, ukr_text = micro_kernel(MR, NR, W, U, packed_a=direct is None)
    r.gemm_support[ukr] = ukr_text
    r.gemm_widths.add(W)
    r.pack_floats = max(r.pack_floats, pack_floats(schedule))
    M, N, K = r.idx(shape[form.m]), r.idx(shape[form.n]), r.idx(form.reduce.size)
    ldc = r.idx(sym.prod(shape[form.m + 1:]))
    outn = r.idx(sym.prod(shape))  # a part's partial sums lie like the output (the same offsets)
    dense = sym.to_expr(dense)
    base = dense.substitute({mvar: 0, nvar: 0})
    B = r.idx(sym.prod([shape[i] for i in batch])) if batch else "1"
    out = r.buf(k.out)
    lines = _fn_head(r, k, "KFN")
    lines += [f"    const int64_t M = {M}, N = {N}, K = {K}, ldc = {ldc}, MT = g->mt, NT = g->nt;",
              f"    const int64_t nmb = (M + MT - 1) / MT, nnb = (N + NT - 1) / NT, Mp = (M + {MR - 1}) / {MR} * {MR};",
              "    (void)Mp;"]
    if split:
        lines.append(f"    const int64_t S = g->parts, nkb = (K + {KC - 1}) / {KC}, OUTN = {outn};")
    lines += ["    float *restrict ap = ls_pack_buf;",
              f"    float *restrict bp = ls_pack_buf + {MC * KC};",
              f"    float *restrict tile = ls_pack_buf + {MC * KC + KC * NC};",
              "    for (int64_t p = p0; p < p1; p++) {"]
    lines += _item_lines(r, k, form, nmajor, split)
    if split:  # part s sums k tiles [s * nkb / S, (s + 1) * nkb / S): whole tiles, none empty (S <= nkb)
        lines += [f"        const int64_t klo = part * nkb / S * {KC}, khi = ls_min(K, (part + 1) * nkb / S * {KC});",
                  f"        float *restrict cb = (part ? g->part + (part - 1) * OUTN : {out}) + ({r.idx(base)});",
                  f"        for (int64_t k0 = klo; k0 < khi; k0 += {KC}) {{",
                  f"            const int64_t kc = ls_min({KC}, khi - k0);"]
    else:
        lines += [f"        float *restrict cb = {out} + ({r.idx(base)});",
                  f"        for (int64_t k0 = 0; k0 < K; k0 += {KC}) {{",
                  f"            const int64_t kc = ls_min({KC}, K - k0);"]
    b_rows = in_place(form.b, nvar, kvar)  # b stored [n, k] (x @ w.T): its panels are blocks transposed
    if b_rows is not None:
        lines += _transposed_pack_lines(r, form.b, b_rows, r.var(nvar), r.var(kvar), NR, W)
    else:
        lines += _pack_lines("bp", form.b, r, r.var(nvar), r.var(kvar), "j0", "nc", NR,
                             pack_inner(form.b, nvar, kvar) is nvar, _blocks(form.b, kvar, form.reduce.size, KC))
    a_pack = _pack_lines("ap", form.a, r, r.var(mvar), r.var(kvar), "i0", "mc", MR,
                         pack_inner(form.a, mvar, kvar) is mvar, _blocks(form.a, kvar, form.reduce.size, KC))
    if shared:  # the call's panels of a, or (no memory for them) the item's own
        lines += ["            const float *restrict as = g->ash + k0 * Mp + i0 * kc;",
                  "            if (!g->ash) {"] + ["    " + x for x in a_pack] + ["            }"]
        a_at, lda = "(g->ash ? as : ap) + ir * kc", "0"
    elif direct is None:
        lines += a_pack
        a_at, lda = "ap + ir * kc", "0"
    else:
        abuf, abase, astride = direct
        lines.append(f"            const float *restrict ad = {r.buf(abuf)} + ({r.idx(abase)}) + k0;")
        a_at, lda = f"ad + (i0 + ir) * ({r.idx(astride)})", f"({r.idx(astride)})"
    lines += [f"            for (int64_t jr = 0; jr < nc; jr += {NR})",
              f"                for (int64_t ir = 0; ir < mc; ir += {MR}) {{",
              f"                    {ukr}(kc, {a_at}, {lda}, bp + jr * kc, cb + (i0 + ir) * ldc + j0 + jr, ldc, "
              f"ls_min({MR}, mc - ir), ls_min({NR}, nc - jr), k0 == {'klo' if split else '0'}, tile);"]
    if k.epilogue is not None:  # the register block is complete and in L1: apply the epilogue over it
        # (split into parts, a block holds a partial sum: the merge applies the epilogue instead)
        lines.append(f"                    if ({'S == 1 && ' if split else ''}k0 + kc >= K)")
        lines += _epilogue_lines(r, k, form, dense, ("ir", f"ls_min(ir + {MR}, mc)"), ("jr", f"ls_min(jr + {NR}, nc)"),
                                 " " * 24)
    lines += ["                }", "        }", "    }", "}"]
    small_fn, small_call = small
    if epilogue_pass is not None:  # the few-rows form stores the product; a loop then applies the epilogue
        epi_fn, epi_call = epilogue_pass
        small_fn += "\n\n" + epi_fn.replace("KFN", "KFN_epi")
        small_call = small_call + "\n" + epi_call.replace("KFN", "KFN_epi")
    work = "M * N * K"
    pre, packs_a = "", str(int(direct is None))
    if shared:
        lines += [""] + _shared_pass(r, k, form, a_pack, M, K, MR, KC)
        pre = (f"      const int64_t Mp = (M + {MR - 1}) / {MR} * {MR}, nkb = (K + {KC - 1}) / {KC};\n"
               f"      const int64_t na = nkb * ((Mp + {SHARE_ROWS * MR - 1}) / {SHARE_ROWS * MR});\n"
               f"      g.ash = ls_gemm_share(Mp * nkb * {KC});\n"
               f"      if (g.ash) {{ if (({work}) >= {grain}) ls_parallel_for(KFN_apack, &g, na); "
               f"else KFN_apack(&g, 0, na); }}\n")
        packs_a = "g.ash == 0"
    tiles_b, items, post = B, f"({B})", ""  # (unsplit: the launch text as before, so tuning-cache keys hold)
    if split:
        lines += [""] + _merge_pass(r, k, form, dense, base, M, N, ldc, outn, nmajor)
        pre += (f"      g.parts = ls_min({P}, (K + {KC - 1}) / {KC});\n"
                f"      if (g.parts > 1 && !(g.part = ls_gemm_partials((g.parts - 1) * ({outn})))) g.parts = 1;\n")
        tiles_b = items = f"({B}) * g.parts"  # every part of a tile is a work item of its own
        post = (f"\n      if (g.parts > 1) {{ const int64_t n0 = n / g.parts;\n"
                f"        if (({B}) * M * N * g.parts >= {grain}) ls_parallel_for(KFN_merge, &g, n0); "
                f"else KFN_merge(&g, 0, n0); }}")
    call = (f"    {{ const int64_t M = {M}, N = {N}, K = {K};\n"
            f"      if (M * 2 < {MR} || K == 0) {{\n{small_call.replace('KFN', 'KFN_small')}\n      }} else {{\n"
            f"      ls_gemm_launch g = {{*lp, 0, 0, 0}};\n{pre}"
            f"      ls_gemm_tiles({tiles_b}, M, N, {MC}, {NC}, {MR}, {NR}, {packs_a}, &g.mt, &g.nt);\n"
            f"      const int64_t n = {items} * ((M + g.mt - 1) / g.mt) * ((N + g.nt - 1) / g.nt);\n"
            f"      if (({work}) >= {grain}) ls_parallel_for(KFN, &g, n); else KFN(&g, 0, n);{post} }} }}")
    return small_fn.replace("KFN", "KFN_small") + "\n\n" + "\n".join(lines), call


def _merge_pass(r, k: ir.Kernel, form: MatmulForm, dense: sym.Expr, base: sym.Expr, M: str, N: str, ldc: str,
                outn: str, nmajor: bool) -> list[str]:
    """Lines of ``KFN_merge`` (split k): work item p adds the partial sums of parts 1 .. S - 1 to part 0's (in
    the output) over one tile, a row at a time and the parts in index order, so every output is the same sum
    whatever the threads' timing; then it applies the kernel's epilogue to the merged row."""
    lines = _fn_head(r, k, "KFN_merge")
    lines += [f"    const int64_t M = {M}, N = {N}, ldc = {ldc}, MT = g->mt, NT = g->nt, S = g->parts, OUTN = {outn};",
              "    const int64_t nmb = (M + MT - 1) / MT, nnb = (N + NT - 1) / NT;",
              "    for (int64_t p = p0; p < p1; p++) {"]
    lines += _item_lines(r, k, form, nmajor, split=False)
    lines += [f"        float *restrict cb = {r.buf(k.out)} + ({r.idx(base)});",
              f"        const float *restrict pb = g->part + ({r.idx(base)});",
              "        for (int64_t ri = 0; ri < mc; ri++) {",
              "            float *restrict crow = cb + (i0 + ri) * ldc + j0;",
              "            for (int64_t sp = 1; sp < S; sp++) {",
              "                const float *restrict prow = pb + (sp - 1) * OUTN + (i0 + ri) * ldc + j0;",
              '                _Pragma("omp simd")',
              "                for (int64_t jj = 0; jj < nc; jj++) crow[jj] += prow[jj];",
              "            }"]
    if k.epilogue is not None:
        lines += _epilogue_lines(r, k, form, dense, ("ri", "ri + 1"), ("0", "nc"), " " * 12)
    return lines + ["        }", "    }", "}"]


SHARE_ROWS = 8  # register blocks of rows per work item of the shared packing pass


def _shared_pass(r, k: ir.Kernel, form: MatmulForm, a_pack: list[str], M: str, K: str, MR: int, KC: int
                 ) -> list[str]:
    """Lines of ``KFN_apack``: work item p packs the rows ``SHARE_ROWS * MR`` wide chunk of a's panels for
    one k block into the call's shared buffer (``g->ash``: k block k0 at ``k0 * Mp``, its panel of rows i0
    at ``i0 * kc`` after that), with the same packing lines an item would run on its own buffer."""
    ch = SHARE_ROWS * MR
    lines = _fn_head(r, k, "KFN_apack")
    lines += [f"    const int64_t M = {M}, K = {K}, Mp = (M + {MR - 1}) / {MR} * {MR}, nch = (Mp + {ch - 1}) / {ch};",
              "    for (int64_t p = p0; p < p1; p++) {",
              f"        const int64_t k0 = p / nch * {KC}, kc = ls_min({KC}, K - k0);",
              f"        const int64_t i0 = p % nch * {ch}, mc = ls_min({ch}, M - i0);",
              "        float *restrict ap = g->ash + k0 * Mp + i0 * kc;",
              "        {"]
    lines += a_pack
    lines += ["        }", "    }", "}"]
    return lines

