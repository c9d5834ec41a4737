"""C rendering of the streaming (online-softmax) attention kernel (see kernel/attention.py).

A work item is a block of ROWS query rows of one (batch, head). Keys stream past in blocks of KEYS:
the block's scores are computed into a small tile, each row's running max m, running sum l and value
accumulator a are rescaled by 2^((m_old - m_new) c), then the block's weights multiply the value rows.
Nothing of size seq x seq is stored. When the score is ``f(sum_d q(i, d) * k(j, d))`` (a dot product
whose two factors each depend on one of the two indices), the key block is staged transposed and the
dot products of ROWS x KEYS scores are accumulated as a small register-blocked matrix product;
any other score expression is evaluated element by element. Register tiles use GNU vector types;
the source holds one tiling per vector width and the compiler's target (``-march=native``) picks.
With few query rows (decode; a short prompt over a long context: at most one row block) the keys of a
(batch, head) may be split across work items, their partial results merged after the items (attention_split.py).
"""
from __future__ import annotations

import dataclasses

from ... import dtypes as dt
from ... import symbolic as sym
from ...kernel import ir
from ...kernel.attention import MAX_STAGED_DEPTH, AttentionKernel
from ...kernel.ir import coefficient, dense_offset, ir_vars
from ...kernel.schedule import Schedule, Tile, Vectorize
from . import attention_split as ks
from .ctext import float_literal
from .attention_skip import block_test, key_mask, pass_close, pass_open
from ...ops import Op

ROWS = 32  # query rows per work item: they share each staged block of keys and values
KEYS = 32  # keys per streamed block (a multiple of 16)
# register tiles (rows, vectors) of the dot products and the value accumulation, per vector width:
# 32 vector registers (AVX-512) hold 4 x 4 accumulators, 16 (AVX2 and narrower) hold 4 x 2
TILES = {64: (4, 4), 32: (4, 2), 16: (4, 2)}
FEW_ROWS = 5  # a work item with fewer query rows than this (decode) computes dot products row by row
# (4 rows: Gemma 3's decode, 4 query heads a KV head; within 16 registers since NARROW_VALUE_ACCUMULATORS: 0.97-1.05
# against 1.39-1.44 ms of attention a step on the register-tile path, Zen 3, 2 threads)
# ... on targets with 32 vector registers (AVX-512): up to 6 rows' value accumulators (6 x 4 vectors) stay in
# registers, and a 2-token call of a model with 3 query heads a KV head (6 rows) skips staging the keys
# transposed for a register tile: SmolLM2's 2-token call at position 1300 took 2.70 ms of attention, 5.05 on
# the tile path (Zen 4, 2 threads)
FEW_ROWS_WIDE = 7
VECTOR_BYTES = 0  # 0: one tiling per vector width, chosen by the compiler's target; else only this width
# (ROWS, KEYS and VECTOR_BYTES are defaults: a kernel's schedule sets its own, see render_attention)


def _replace(x: ir.IR, target: ir.IR, new: ir.IR) -> ir.IR:
    """``x`` with the subtree ``target`` (by identity) replaced by ``new``."""
    if x is target:
        return new
    if isinstance(x, ir.Alu):
        return dataclasses.replace(x, args=tuple(_replace(a, target, new) for a in x.args))
    if isinstance(x, ir.Cast):
        return dataclasses.replace(x, arg=_replace(x.arg, target, new))
    if isinstance(x, ir.Select):
        return dataclasses.replace(x, value=_replace(x.value, target, new))
    if isinstance(x, ir.Reduce):
        return dataclasses.replace(x, body=_replace(x.body, target, new))
    if isinstance(x, ir.Gather):
        return dataclasses.replace(x, index=_replace(x.index, target, new), body=_replace(x.body, target, new))
    return x


@dataclasses.dataclass
class _Product:
    """score = post(sum_d q(i, d) * k(j, d)): the reduction, its two factors and the rest."""
    red: ir.Reduce
    q: ir.IR
    k: ir.IR
    depth: int


def split_product(t: AttentionKernel) -> _Product | None:
    """The dot product inside the score, if it has the product form (see the module docstring)."""
    reds = [y for y in t.score.walk() if isinstance(y, ir.Reduce)]
    for red in reds:
        if red.op is not Op.SUM_REDUCE or red.dtype is not dt.float32 or not sym.is_const(red.size):
            continue
        if int(red.size) > MAX_STAGED_DEPTH or sum(1 for y in t.score.walk() if y is red) != 1:
            continue
        body = red.body
        if not (isinstance(body, ir.Alu) and body.op is Op.MUL and len(body.args) == 2):
            continue
        if any(a.dtype is not dt.float32 for a in body.args):
            continue
        for qa, kb in (body.args, tuple(reversed(body.args))):
            if t.j not in ir_vars(qa) and t.i not in ir_vars(kb):
                return _Product(red, qa, kb, int(red.size))
    return None


def _vector_widths(schedule: Schedule) -> list[tuple[str, int]]:
    """(preprocessor condition, vector bytes) of the tilings to emit: one of ``Vectorize("d", lanes)`` floats
    when the schedule fixes it, else one per vector width, chosen by the compiler's target."""
    lanes = schedule.size(Vectorize, "d", VECTOR_BYTES // 4)
    if lanes:
        return [("1", 4 * lanes)]
    return [("defined(__AVX512F__)", 64), ("defined(__AVX__)", 32), ("1", 16)]


def _conditional(variants: list[tuple[str, list[str]]]) -> list[str]:
    if len(variants) == 1:
        return variants[0][1]
    out = []
    for k, (cond, lines) in enumerate(variants):
        if cond == "1" and k > 0:
            out.append("#else")
        else:
            out.append(f"#{'if' if k == 0 else 'elif'} {cond}")
        out += lines
    out.append("#endif")
    return out


def render_attention(r, k: ir.Kernel) -> tuple[str, str]:
    """(the kernel's static function, its launch statement) for renderer ``r`` (a KernelRenderer).

    The kernel's schedule may set its query rows per item (``Tile("q")``), its keys per block
    (``Tile("keys")``) and its vector width (``Vectorize("d")``, floats); ROWS, KEYS, VECTOR_BYTES otherwise."""
    PARALLEL_GRAIN = r.parallel_grain()
    schedule = k.schedule if k.schedule is not None else Schedule()
    t: AttentionKernel = k.template
    vars_ = list(k.loop_vars)
    prefix, shape = vars_[:-2], list(k.shape)
    QB, KB, EV = schedule.size(Tile, "q", ROWS), schedule.size(Tile, "keys", KEYS), t.width
    C = float_literal(float(t.c))
    prod = split_product(t)
    split = ks.active_split(k, t, QB, KB)  # few rows' keys split across items (attention_split.py)
    P = r.idx(sym.prod(shape[:-2])) if prefix else "1"
    NI, NJ = r.idx(shape[-2]), r.idx(t.keys)
    head = ["    const ls_launch *l = (const ls_launch *)vctx;", "    const ls_args *a = l->a;", "    (void)a;"]
    head += [f"    {d}" for d in r.decls(k)]
    head += [f"    const int64_t NI = {NI}, NJ = {NJ}, IB = (NI + {QB - 1}) / {QB};"]
    outer = [f"        const int64_t {r.var(v)} = row % {r.idx(sz)}; row /= {r.idx(sz)};"
             for v, sz in reversed(list(zip(prefix, shape[:-2])))]
    # items alternate from both ends (0, NT-1, 1, NT-2, ...): a causal mask makes later row blocks
    # dearer, and the pool hands out runs of consecutive items, so each run gets a mix
    alternate = "(p & 1) ? NT - 1 - (p >> 1) : (p >> 1)"
    if split is None:
        lines = ["static void KFN(void *vctx, int64_t p0, int64_t p1) {"] + MACROS + head + [
            *_few_rows_enum(),
            f"    const int64_t NT = ({P}) * IB;  (void)NT;",
            "    for (int64_t p = p0; p < p1; p++) {",
            f"        const int64_t q = {alternate};",
            "        int64_t row = q / IB;", "        const int64_t ib = q % IB;"]
    else:  # a rerun of the merge (first_pass 1) names its item directly
        lines = ["static void KFN_items(void *vctx, int64_t p0, int64_t p1, int first_pass) {"] + MACROS + head + [
            *_few_rows_enum(),
            f"    const int64_t S = {ks.parts(split, QB)};",
            f"    const int64_t NT = ({P}) * IB * S;  (void)NT; (void)first_pass;",
            "    for (int64_t p = p0; p < p1; p++) {",
            f"        const int64_t q = first_pass ? p : {alternate};"] + ks.item_lines()
    lines += outer + ["        (void)row;",
              f"        const int64_t i0 = ib * {QB}, nr = ls_min({QB}, NI - i0);",
              f"        float m[{QB}], lsum[{QB}], s[{QB}][{KB}], ps[{QB}][{KB}], acc[{QB}][{EV}], vt[{KB}][{EV}];",
              f"        int bad[{QB}];"]
    init = [f"        for (int rr = 0; rr < (nr < FEW_ROWS ? nr : {QB}); rr++) {{",
            "            m[rr] = -INFINITY; lsum[rr] = 0.0f; bad[rr] = 0;",
            f"            for (int e = 0; e < {EV}; e++) acc[rr][e] = 0.0f;",
            f"            for (int jj = 0; jj < {KB}; jj++) ps[rr][jj] = 0.0f;",
            "        }"]
    if prod is not None:
        # the item's query rows, staged once for every key block of the tile path (rows past nr: zeros)
        QP = -(-QB // 4) * 4  # a whole number of register-tile row groups (RB <= 4)
        lines.append(f"        float kt[{prod.depth}][{KB}], qa[{QP}][{prod.depth}];")
        r.rename[t.i] = "(i0 + rr)"
        r.rename[prod.red.var] = "d"
        lines += ["        if (nr >= FEW_ROWS) {",
                  f"            for (int64_t rr = 0; rr < {QP}; rr++) {{",
                  "                if (rr < nr) {",
                  "                    _Pragma(\"omp simd\")",
                  f"                    for (int64_t d = 0; d < {prod.depth}; d++) qa[rr][d] = {r.expr(prod.q)};",
                  "                } else memset(qa[rr], 0, sizeof qa[rr]);",
                  "            }",
                  "        }"]
        r.rename.pop(prod.red.var, None)
        r.rename.pop(t.i, None)
    if _lanes_fit(t, prod, KB):  # the few-rows path: staged key rows and query rows
        lines += ["        typedef int32_t ls_v8i __attribute__((vector_size(32)));"]
        lines += [f"        float kb[{KB}][{prod.depth}], qs[FEW_ROWS][{prod.depth}];",
                  f"        const float *kp[{KB}], *vp[{KB}];",
                  f"        const _Float16 *kph[{KB}], *vph[{KB}];  /* float16 rows read in place */",
                  f"        static const float ls_zero_row[{max(prod.depth, EV)}];",
                  f"        static const _Float16 ls_zero_row_h[{max(prod.depth, EV)}];"]
        r.rename[t.i] = "(i0 + rr)"
        r.rename[prod.red.var] = "d"
        lines += ["        if (nr < FEW_ROWS) {",
                  "            for (int64_t rr = 0; rr < nr; rr++) {",
                  "                _Pragma(\"omp simd\")",
                  f"                for (int64_t d = 0; d < {prod.depth}; d++) qs[rr][d] = {r.expr(prod.q)};",
                  "            }",
                  "        }"]
        r.rename.pop(prod.red.var, None)
        r.rename.pop(t.i, None)
    mask = key_mask(t)  # masked key blocks are skipped (pass 0) when that is exact, see attention_skip.py
    if split is not None:
        lines += ["        int part_skipped = 0;"] + (pass_open("first_pass") if mask else []) + init
        lines += ks.key_range(split, KB)
    else:
        lines += (pass_open() if mask else []) + init
        lines += [f"        for (int64_t j0 = 0; j0 < NJ; j0 += {KB}) {{",
                  f"            const int64_t jn = ls_min({KB}, NJ - j0);"]
    lines += block_test(r, t, mask) if mask else []
    r.rename[t.j] = "(j0 + jj)"
    r.rename[t.e] = "e"
    widths = _vector_widths(schedule)
    try:
        lines += _scores(r, t, prod, KB, widths)
        r.rename[t.i] = "(i0 + rr)"
        lines += _online_update(t, C, KB)
        lines += _values(r, t, KB, widths)
        out_off = r.idx(dense_offset(vars_, shape))
        M = float_literal(mask.masked) if mask else None
        lines += ["        }"] + (pass_close(mask, M, C, split is not None) if mask else [])
        empty = "m[rr] == -INFINITY ? 0.0f : " if t.zero_empty_rows else ""  # (a safe softmax: every score -inf)
        write = ["        for (int64_t rr = 0; rr < nr; rr++) {  /* no keys at all: an empty sum, 0 */",
                 "            const float inv = 1.0f / lsum[rr];",
                 f"            for (int64_t e = 0; e < {EV}; e++)",
                 f"                {r.buf(k.out)}[{out_off}] = NJ == 0 ? 0.0f : bad[rr] ? NAN : "
                 f"{empty}acc[rr][e] * inv;",
                 "        }"]
        if split is None:
            lines += write + ["    }", "}"]
        else:  # a part of a split item stores its partials; the merge writes the output
            lines += ["        if (S > 1) {"] + ks.store_lines(r, k, split) + ["        } else {"]
            lines += ["    " + ln for ln in write] + ["        }", "    }", "}"]
            lines += ["static void KFN(void *vctx, int64_t p0, int64_t p1) { KFN_items(vctx, p0, p1, 0); }"]
            lines += ks.merge_function(r, k, split, head, P, outer, out_off, M, C, QB)
    finally:
        for v in (t.i, t.j, t.e):
            r.rename.pop(v, None)
    depth = prod.depth if prod is not None else 1
    if split is not None:
        work = f"n0 * {QB} * NJ * {depth + EV}"
        return "\n".join(lines), ks.launch(split, NI, NJ, P, QB, work, PARALLEL_GRAIN)
    call = (f"    {{ const int64_t NI = {NI}, NJ = {NJ}; const int64_t n = ({P}) * ((NI + {QB - 1}) / {QB});\n"
            f"      if (n * {QB} * NJ * {depth + EV} >= {PARALLEL_GRAIN}) ls_parallel_for(KFN, &l, n); "
            f"else KFN(&l, 0, n); }}")
    return "\n".join(lines), call


def _scores(r, t: AttentionKernel, prod: _Product | None, KB: int, widths) -> list[str]:
    """Fill s[rr][jj] for the rows and keys of the block."""
    if prod is None:
        r.rename[t.i] = "(i0 + rr)"
        return ["            for (int64_t rr = 0; rr < nr; rr++)",
                "                for (int64_t jj = 0; jj < jn; jj++)",
                f"                    s[rr][jj] = {r.expr(t.score)};"]
    d = prod.red.var
    r.rename[d] = "d"
    placeholder = sym.Var("attn_dot", 0, 0)
    try:
        lines = (["            if (nr >= FEW_ROWS) {"] + _staged_keys(r, t, prod, KB)
                 + _conditional([(cond, _dot_tile(r, t, prod, KB, vb)) for cond, vb in widths]))
        r.rename[t.i] = "(i0 + rr)"
        # few query rows (decode): a register tile would mostly multiply zero rows and staging the keys
        # transposed would cost more than the dot products, so each score is one vectorised dot product
        if _lanes_fit(t, prod, KB):
            lines += ["            } else {"] + _few_rows_scores(r, t, prod, KB) + ["            }"]
        else:
            lines += ["            } else {",
                      "                for (int64_t rr = 0; rr < nr; rr++)",
                      "                    for (int64_t jj = 0; jj < jn; jj++) {",
                      "                        float dot = 0.0f;",
                      "                        _Pragma(\"omp simd reduction(+:dot)\")",
                      f"                        for (int64_t d = 0; d < {prod.depth}; d++) "
                      f"dot += ({r.expr(prod.q)}) * ({r.expr(prod.k)});",
                      "                        s[rr][jj] = dot;",
                      "                    }",
                      "            }"]
        r.rename[placeholder] = "s[rr][jj]"
        post = _replace(t.score, prod.red, ir.Index(placeholder, dt.float32))
        lines += ["            for (int64_t rr = 0; rr < nr; rr++) {",
                  "                _Pragma(\"omp simd\")",
                  "                for (int64_t jj = 0; jj < jn; jj++)",
                  f"                    s[rr][jj] = {r.expr(post)};",
                  "            }"]
    finally:
        r.rename.pop(d, None)
        r.rename.pop(placeholder, None)
    return lines


def _keep(v: str, vb: int) -> str:
    """Keep vector ``v`` in a register: gcc otherwise folds its load into each of the tile's FMAs that
    use it, and the loads (one per FMA plus the broadcasts) then bound the loop, not the FMAs. Only in
    the 32-byte tilings of AVX targets (x86: the "x" register constraint; see MACROS)."""
    return f" LS_KEEP32({v});" if vb == 32 else ""


def _dot_tile(r, t: AttentionKernel, prod: _Product, KB: int, vb: int) -> list[str]:
    """s[g + u][kc + c*lanes ...] = sum_d qa[g + u][d] * kt[d][...]: a register tile of RB rows by KV
    vectors (named variables, so they stay in registers), over all row groups and key chunks."""
    RB, KV = TILES[vb]
    LN = vb // 4
    KV = max(1, min(KV, KB // LN))
    step = KV * LN
    acc = [[f"sa{u}_{c}" for c in range(KV)] for u in range(RB)]
    lines = [f"            for (int64_t g = 0; g < nr; g += {RB}) {{",
             f"                typedef float vec __attribute__((vector_size({vb})));",
             f"                for (int64_t kc = 0; kc < {KB}; kc += {step}) {{",
             "                    vec " + ", ".join(f"{x} = {{0}}" for row in acc for x in row) + ";",
             f"                    for (int64_t d = 0; d < {prod.depth}; d++) {{"]
    lines += [f"                        const float q{u} = qa[g + {u}][d];" for u in range(RB)]
    for c in range(KV):
        lines.append(f"                        vec k{c}; memcpy(&k{c}, &kt[d][kc + {c * LN}], {vb});"
                     f"{_keep(f'k{c}', vb)}")
        lines += [f"                        {acc[u][c]} += q{u} * k{c};" for u in range(RB)]
    lines.append("                    }")
    for u in range(RB):
        stores = " ".join(f"memcpy(&s[g + {u}][kc + {c * LN}], &{acc[u][c]}, {vb});" for c in range(KV))
        lines.append(f"                    if (g + {u} < nr) {{ {stores} }}")
    lines += ["                }", "            }"]
    return lines


def _online_update(t: AttentionKernel, C: str, KB: int) -> list[str]:
    """Per row: the block max, the rescaling of what was accumulated, the block's weights ps."""
    return ["            for (int64_t rr = 0; rr < nr; rr++) {",
            "                float bm = -INFINITY; int bn = 0;",
            "                _Pragma(\"omp simd reduction(max:bm) reduction(|:bn)\")",
            "                for (int64_t jj = 0; jj < jn; jj++) { const float v = s[rr][jj]; bn |= v != v; "
            "bm = v > bm ? v : bm; }",
            "                bad[rr] |= bn;",
            "                const float mn = bm > m[rr] ? bm : m[rr];",
            "                if (mn == -INFINITY) {  /* every score so far is -inf: nothing to add yet */",
            f"                    for (int64_t jj = 0; jj < {KB}; jj++) ps[rr][jj] = 0.0f;",
            "                    continue;",
            "                }",
            f"                const float alpha = mn == m[rr] ? 1.0f : ls_exp2f((m[rr] - mn) * {C});  /* (exact) */",
            "                float bsum = 0.0f;",
            "                _Pragma(\"omp simd reduction(+:bsum)\")",
            "                for (int64_t jj = 0; jj < jn; jj++) {",
            f"                    ps[rr][jj] = ls_exp2f((s[rr][jj] - mn) * {C}); bsum += ps[rr][jj];",
            "                }",
            f"                for (int64_t jj = jn; jj < {KB}; jj++) ps[rr][jj] = 0.0f;",
            "                lsum[rr] = lsum[rr] * alpha + bsum;",
            "                if (alpha != 1.0f) {  /* the max grew: rescale what was accumulated */",
            "                    _Pragma(\"omp simd\")",
            f"                    for (int64_t e = 0; e < {t.width}; e++) acc[rr][e] *= alpha;",
            "                }",
            "                m[rr] = mn;",
            "            }"]


def _values(r, t: AttentionKernel, KB: int, widths) -> list[str]:
    """acc[rr] += ps[rr][jj] * value(j): the block's value rows are staged once, then register tiles of
    rows by vectors accumulate them."""
    lines = ["            if (nr >= FEW_ROWS) {"] + _staged_values(r, t, KB)
    lines += _conditional([(cond, _value_tile(t, vb)) for cond, vb in widths])
    if _lanes_fit(t, split_product(t), KB):
        return lines + ["            } else {"] + _few_rows_values(r, t) + ["            }"]
    # few rows: the value rows are read where they are, without staging
    return lines + ["            } else {",
                    "                for (int64_t rr = 0; rr < nr; rr++)",
                    "                    for (int64_t jj = 0; jj < jn; jj++) {",
                    "                        const float w = ps[rr][jj];",
                    "                        _Pragma(\"omp simd\")",
                    f"                        for (int64_t e = 0; e < {t.width}; e++) "
                    f"acc[rr][e] += w * ({r.expr(t.value)});",
                    "                    }",
                    "            }"]


LANES = 8  # floats per vector of the few-rows path (ls_v8 in the prelude)
# keys whose dot products the few-rows path computes side by side, by row count (a power of two dividing LANES)
KEYS_SIDE_BY_SIDE = {1: 4, 2: 2}
VALUE_CHUNKS = 4  # vectors of value columns the few-rows path accumulates at once per row, at most
# ... and per row count at most this many accumulators on targets with 16 vector registers (AVX2): nr x G of them,
# nr weight broadcasts and the value vector must fit, or gcc keeps the accumulators on the stack (3 rows x 4: every
# FMA of a key stored and reloaded; Zen 3, SmolLM2's decode attention at 544 keys in L2, one thread: 65.5 -> 32-34 us)
NARROW_VALUE_ACCUMULATORS = 8


def _lanes_fit(t: AttentionKernel, prod: _Product | None, KB: int) -> bool:
    """Whether the vectorised few-rows path applies: head sizes and the key block in whole vectors."""
    return prod is not None and prod.depth % LANES == 0 and t.width % LANES == 0 and KB % LANES == 0


def _row_source(x: ir.IR, var: sym.Var) -> tuple[ir.Load, bool] | None:
    """(the load, whether it is float16) when ``x`` is a float32 element read straight from a buffer
    that is contiguous along ``var``: a float32 load, or a float16 load widened to float32 (exact)."""
    half = isinstance(x, ir.Cast) and x.dtype is dt.float32 and isinstance(x.arg, ir.Load)
    load = x.arg if half else x
    if not isinstance(load, ir.Load) or coefficient(load.offset, var) != 1:
        return None
    want = dt.float16 if half else dt.float32
    if load.buf.dtype is not want or (not half and load.dtype is not dt.float32):
        return None
    return load, half


def _row_sources(x: ir.IR, var: sym.Var) -> list[tuple[sym.sint | None, ir.Load, bool]] | None:
    """``x`` (a key or value element, ``var`` its position in the row) as a sum of loads that are
    contiguous along ``var`` (see ``_row_source``), each under an optional condition independent of
    ``var``; else None."""
    one = _row_source(x, var)
    if one is not None:
        return [(None, *one)]
    if isinstance(x, ir.Select) and var not in sym.free_vars(x.valid):
        inner = _row_sources(x.value, var)
        return [(x.valid, *inner[0][1:])] if inner is not None and len(inner) == 1 and inner[0][0] is None else None
    if isinstance(x, ir.Alu) and x.op is Op.ADD:
        parts = [_row_sources(y, var) for y in x.args]
        return None if any(p_ is None for p_ in parts) else [z for p_ in parts for z in p_]
    return None


def _row_kind(x: ir.IR, var: sym.Var) -> str:
    """How the few-rows path reads key/value rows ``x``: "half" (every source is float16, widened as it
    is loaded), "float" (every source is float32) or "staged" (evaluated into float rows first)."""
    sources = _row_sources(x, var)
    if not sources:
        return "staged"
    kinds = {half for _, _, half in sources}
    return "staged" if len(kinds) > 1 else "half" if kinds == {True} else "float"


def _staged_rows(r, x: ir.IR, var: sym.Var, size: int, ptrs: str, stage: str, pad: str) -> list[str]:
    """Every row jj < jn of the block evaluated into ``stage[jj]`` (floats), pointed to by ``ptrs``."""
    v = r.var(var)
    return [f"{pad}for (int64_t jj = 0; jj < jn; jj++) {{",
            f"{pad}    _Pragma(\"omp simd\")",
            f"{pad}    for (int64_t {v} = 0; {v} < {size}; {v}++) {stage}[jj][{v}] = {r.expr(x)};",
            f"{pad}    {ptrs}[jj] = {stage}[jj];",
            f"{pad}}}"]


def _pad(ptrs: str, zero: str, L: int) -> str:
    """Rows past jn up to a whole vector of keys read zeros."""
    return f"                for (int64_t jj = jn; jj < ((jn + {L - 1}) / {L}) * {L}; jj++) {ptrs}[jj] = {zero};"


def _pick_source(r, x: ir.IR, var: sym.Var, pad: str) -> list[str]:
    """Lines that point ``src`` at the row of ``x`` (kind "half" or "float", see ``_row_kind``) for the
    current key, or at a zero row when no source is valid; ``nsrc`` counts the valid sources."""
    half = _row_kind(x, var) == "half"
    ctype, zero = ("_Float16", "ls_zero_row_h") if half else ("float", "ls_zero_row")
    lines = [f"{pad}const {ctype} *src = {zero}; int nsrc = 0;"]
    saved = r.rename.get(var)
    r.rename[var] = "0"  # the row's address: its element 0
    try:
        for valid, load, _ in _row_sources(x, var):
            take = f"src = &{r.buf(load.buf)}[{r.idx(load.offset)}]; nsrc++;"
            lines.append(f"{pad}{take}" if valid is None else f"{pad}if ({r.idx(valid)}) {{ {take} }}")
    finally:
        if saved is None:
            r.rename.pop(var, None)
        else:
            r.rename[var] = saved
    return lines


def _staged_keys(r, t: AttentionKernel, prod: _Product, KB: int) -> list[str]:
    """kt[d][jj] = key(j0 + jj, d), transposed for the register tiles (many query rows). Key rows are
    pointed to as in the few-rows path (read in place when one contiguous source, float16 widened with
    F16C, else evaluated into rows first), then 8 keys x 8 dims at a time are transposed in registers
    and stored as whole vectors."""
    D, L = prod.depth, LANES
    if not _lanes_fit(t, prod, KB):
        return [f"            for (int64_t jj = 0; jj < {KB}; jj++) {{",
                "                if (jj < jn) {",
                f"                    for (int64_t d = 0; d < {D}; d++) kt[d][jj] = {r.expr(prod.k)};",
                "                } else {",
                f"                    for (int64_t d = 0; d < {D}; d++) kt[d][jj] = 0.0f;",
                "                }",
                "            }"]

    def body(ptrs: str, load: str) -> list[str]:
        xs = [f"x{u}" for u in range(L)]
        lines = [f"                for (int64_t j8 = 0; j8 < {KB}; j8 += {L}) {{",
                 "                    if (j8 >= jn) {",
                 f"                        for (int64_t d = 0; d < {D}; d++) memset(&kt[d][j8], 0, {4 * L});",
                 "                        continue;",
                 "                    }",
                 f"                    for (int64_t d0 = 0; d0 < {D}; d0 += {L}) {{",
                 "                        const ls_v8 " + ", ".join(f"x{u} = {load}({ptrs}[j8 + {u}] + d0)"
                                                             for u in range(L)) + ";"]
        lines += ["                        " + ln for ln in _transpose8(xs, "c")]
        lines += [f"                        memcpy(&kt[d0 + {u}][j8], &c{u}, sizeof c{u});" for u in range(L)]
        return lines + ["                    }", "                }"]
    return ["            {"] + _row_pointers(r, prod.k, prod.red.var, D, "kp", "kb", L, body) + ["            }"]


def _transpose8(x: list[str], out: str) -> list[str]:
    """C statements: ``{out}u`` (u < 8) = lane u of each of the 8 vectors ``x`` (an 8 x 8 transpose in
    three rounds of two-input shuffles: pairs interleaved, pairs of pairs, halves)."""
    def shuf(a: str, b: str, idx: list[int]) -> str:
        return f"LS_SHUF8({a}, {b}, {', '.join(map(str, idx))})"
    lo, hi = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    lo2, hi2 = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    lo4, hi4 = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    u = []
    for k in range(0, 8, 2):
        u += [shuf(x[k], x[k + 1], lo), shuf(x[k], x[k + 1], hi)]
    lines = ["const ls_v8 " + ", ".join(f"{out}u{k} = {e}" for k, e in enumerate(u)) + ";"]
    v = {}
    for base in (0, 4):  # u[base], u[base+2] hold lanes (0,1 | 4,5); u[base+1], u[base+3] lanes (2,3 | 6,7)
        v[base + 0] = shuf(f"{out}u{base}", f"{out}u{base + 2}", lo2)
        v[base + 1] = shuf(f"{out}u{base}", f"{out}u{base + 2}", hi2)
        v[base + 2] = shuf(f"{out}u{base + 1}", f"{out}u{base + 3}", lo2)
        v[base + 3] = shuf(f"{out}u{base + 1}", f"{out}u{base + 3}", hi2)
    lines.append("const ls_v8 " + ", ".join(f"{out}v{k} = {v[k]}" for k in range(8)) + ";")
    cols = {}
    for k in range(4):  # v[k] holds lanes k and k + 4 of rows 0-3, v[k + 4] the same of rows 4-7
        cols[k] = shuf(f"{out}v{k}", f"{out}v{k + 4}", lo4)
        cols[k + 4] = shuf(f"{out}v{k}", f"{out}v{k + 4}", hi4)
    lines.append("const ls_v8 " + ", ".join(f"{out}{k} = {cols[k]}" for k in range(8)) + ";")
    return lines


MACROS = [  # emitted in every kernel (identical redefinitions are allowed)
    "#if defined(__AVX__)",
    "#define LS_KEEP32(v) __asm__(\"\" : \"+x\"(v))",
    "#else",
    "#define LS_KEEP32(v) ((void)0)",
    "#endif",
    # two-input shuffles of ls_v8
    "#if defined(__clang__)",
    "#define LS_SHUF8(a, b, ...) __builtin_shufflevector((a), (b), __VA_ARGS__)",
    "#else",
    "#define LS_SHUF8(a, b, ...) __builtin_shuffle((a), (b), (ls_v8i){__VA_ARGS__})",
    "#endif"]


def _staged_values(r, t: AttentionKernel, KB: int) -> list[str]:
    """vt[jj][e] = value(j0 + jj, e) for the register tiles (many query rows); contiguous rows are copied
    a vector at a time (float16 widened with F16C)."""
    E, L = t.width, LANES
    if not _lanes_fit(t, split_product(t), KB) or _row_kind(t.value, t.e) == "staged":
        return ["            for (int64_t jj = 0; jj < jn; jj++) {",
                "                _Pragma(\"omp simd\")",
                f"                for (int64_t e = 0; e < {E}; e++) vt[jj][e] = {r.expr(t.value)};",
                "            }"]
    load = "ls_load8h" if _row_kind(t.value, t.e) == "half" else "ls_load8"
    return (["            for (int64_t jj = 0; jj < jn; jj++) {"] + _pick_source(r, t.value, t.e, " " * 16) +
            ["                if (nsrc <= 1) {",
             f"                    for (int64_t e0 = 0; e0 < {E}; e0 += {L}) {{",
             f"                        const ls_v8 x = {load}(src + e0);",
             "                        memcpy(&vt[jj][e0], &x, sizeof x);",
             "                    }",
             "                } else {  /* overlapping sources: their sum, evaluated */",
             "                    _Pragma(\"omp simd\")",
             f"                    for (int64_t e = 0; e < {E}; e++) vt[jj][e] = {r.expr(t.value)};",
             "                }",
             "            }"])


def _row_pointers(r, x: ir.IR, var: sym.Var, size: int, ptrs: str, stage: str, L: int, body) -> list[str]:
    """Point ``ptrs[jj]`` at key/value row jj of the block (``size`` elements), then ``body(ptrs, load)``:
    the lines that read the rows with ``load`` (ls_load8 for float rows, ls_load8h for float16 rows).
    A row that is one contiguous source (e.g. a cached row or a new row of a concatenation) is read where
    it is; float16 rows stay float16 (half the bytes) and are widened as they are loaded. Any other row
    is evaluated into ``stage[jj]`` as floats; where the sources overlap (more than one valid for a
    float16 row) the whole block is."""
    kind = _row_kind(x, var)
    if kind == "staged":
        return (_staged_rows(r, x, var, size, ptrs, stage, " " * 16) + [_pad(ptrs, "ls_zero_row", L)]
                + body(ptrs, "ls_load8"))
    half = kind == "half"
    hp = f"{ptrs}h" if half else ptrs
    ctype, zero = ("_Float16", "ls_zero_row_h") if half else ("float", "ls_zero_row")
    lines = ([f"                int {ptrs}_staged = 0;"] if half else []) + [
        "                for (int64_t jj = 0; jj < jn; jj++) {"] + _pick_source(r, x, var, " " * 20)
    if half:
        lines += [f"                    {ptrs}_staged |= nsrc > 1;", f"                    {hp}[jj] = src;",
                  "                }", _pad(hp, zero, L),
                  f"                if (!{ptrs}_staged) {{"]
        lines += ["    " + ln for ln in body(hp, "ls_load8h")]
        lines += ["                } else {  /* overlapping sources: the block's rows evaluated as floats */"]
        lines += _staged_rows(r, x, var, size, ptrs, stage, " " * 20) + ["    " + _pad(ptrs, "ls_zero_row", L)]
        lines += ["    " + ln for ln in body(ptrs, "ls_load8")] + ["                }"]
        return lines
    return lines + [
        "                    if (nsrc > 1) {  /* overlapping sources: their sum, evaluated */",
        "                        _Pragma(\"omp simd\")",
        f"                        for (int64_t {r.var(var)} = 0; {r.var(var)} < {size}; {r.var(var)}++) "
        f"{stage}[jj][{r.var(var)}] = {r.expr(x)};",
        f"                        src = {stage}[jj];",
        "                    }",
        f"                    {ptrs}[jj] = src;",
        "                }", _pad(ptrs, zero, L)] + body(ptrs, "ls_load8")


def _few_rows_scores(r, t: AttentionKernel, prod: _Product, KB: int) -> list[str]:
    """s[rr][jj] for few query rows: LANES keys at a time get LANES independent vector dot products,
    summed across lanes together (ls_sum8x8). Key rows are read in place when they can be."""
    D, L = prod.depth, LANES

    def rows(nr: int, ptrs: str, load: str) -> list[str]:
        # each key's row is loaded (and widened) once for the nr query rows; every row's sums are those of
        # one row alone (the same products in the same order), so its bits do not depend on nr. U keys go
        # side by side, so that at least ~4 chains of FMAs are in flight (one row alone had one chain: every
        # FMA waited for the one before)
        U = KEYS_SIDE_BY_SIDE.get(nr, 1)
        return [f"                    for (int64_t jj = 0; jj < jn; jj += {L}) {{",
                f"                        ls_v8 dots[{nr}][{L}];",
                f"                        for (int u = 0; u < {L}; u += {U}) {{",
                f"                            ls_v8 d[{nr}][{U}] = {{{{{{0}}}}}};",
                f"                            for (int64_t c = 0; c < {D // L}; c++) {{",
                f"                                for (int v = 0; v < {U}; v++) {{",
                f"                                    const ls_v8 kc = {load}({ptrs}[jj + u + v] + {L} * c);",
                f"                                    for (int rr = 0; rr < {nr}; rr++) "
                f"d[rr][v] += ls_load8(&qs[rr][{L} * c]) * kc;",
                "                                }",
                "                            }",
                f"                            for (int rr = 0; rr < {nr}; rr++)",
                f"                                for (int v = 0; v < {U}; v++) dots[rr][u + v] = d[rr][v];",
                "                        }",
                f"                        for (int rr = 0; rr < {nr}; rr++) {{",
                "                            const ls_v8 sums = ls_sum8x8(dots[rr]);",
                "                            memcpy(&s[rr][jj], &sums, sizeof sums);",
                "                        }",
                "                    }"]

    def body(ptrs: str, load: str) -> list[str]:
        return _by_row_count(lambda nr: rows(nr, ptrs, load))
    return _row_pointers(r, prod.k, prod.red.var, D, "kp", "kb", L, body)


def _few_rows_enum() -> list[str]:
    """The C constant FEW_ROWS: the first row count that takes the register-tile path, by the target's registers."""
    return ["#if defined(__AVX512F__)", f"    enum {{ FEW_ROWS = {FEW_ROWS_WIDE} }};",
            "#else", f"    enum {{ FEW_ROWS = {FEW_ROWS} }};", "#endif"]


def _by_row_count(rows) -> list[str]:
    """``rows(nr)`` for each row count of the few-rows path, chosen at run time, so that its loops over rows
    have a constant bound (their accumulators stay in registers)."""
    lines = []
    for nr in range(1, max(FEW_ROWS, FEW_ROWS_WIDE)):
        lines += [f"                {'if' if nr == 1 else '} else if'} (nr == {nr}) {{"] + rows(nr)
    return lines + ["                }"]


def _few_rows_values(r, t: AttentionKernel) -> list[str]:
    """acc[rr] += sum_jj ps[rr][jj] * value(j0 + jj) for few query rows; each row's accumulator stays
    in vector registers over the block. Value rows are read in place when they can be."""
    E, L = t.width, LANES

    def groups(most: int) -> int:  # whole groups of vectors
        return max(g for g in range(1, max(1, most) + 1) if (E // L) % g == 0)

    def rows(nr: int, ptrs: str, load: str) -> list[str]:
        wide, narrow = groups(VALUE_CHUNKS), groups(min(VALUE_CHUNKS, NARROW_VALUE_ACCUMULATORS // nr))
        if wide == narrow:
            return rows_of(nr, ptrs, load, wide)
        return (["#if defined(__AVX512F__)"] + rows_of(nr, ptrs, load, wide) + ["#else"]
                + rows_of(nr, ptrs, load, narrow) + ["#endif"])

    def rows_of(nr: int, ptrs: str, load: str, G: int) -> list[str]:
        # G vectors of columns at a time: each value row's part is loaded (and widened) once for the nr query
        # rows; every element accumulates over the keys in order, as for one row alone (whatever G)
        return [f"                    for (int64_t e0 = 0; e0 < {E}; e0 += {G * L}) {{",
                f"                        ls_v8 av[{nr}][{G}];",
                f"                        for (int rr = 0; rr < {nr}; rr++)",
                f"                            for (int c = 0; c < {G}; c++) "
                f"av[rr][c] = ls_load8(&acc[rr][e0 + {L} * c]);",
                "                        for (int64_t jj = 0; jj < jn; jj++) {",
                f"                            for (int c = 0; c < {G}; c++) {{",
                f"                                const ls_v8 vc = {load}({ptrs}[jj] + e0 + {L} * c);",
                f"                                for (int rr = 0; rr < {nr}; rr++) av[rr][c] += ps[rr][jj] * vc;",
                "                            }",
                "                        }",
                # vector by vector: a memcpy of the whole of av[rr] kept av on the stack, every FMA's result stored
                # and reloaded (gcc 12; Gemma 3's head_dim 256)
                f"                        for (int rr = 0; rr < {nr}; rr++) for (int c = 0; c < {G}; c++) "
                f"memcpy(&acc[rr][e0 + {L} * c], &av[rr][c], sizeof av[rr][c]);",
                "                    }"]

    def body(ptrs: str, load: str) -> list[str]:
        return _by_row_count(lambda nr: rows(nr, ptrs, load))
    return _row_pointers(r, t.value, t.e, E, "vp", "vt", L, body)


def _value_tile(t: AttentionKernel, vb: int) -> list[str]:
    RB, EVV = TILES[vb]
    LN = vb // 4
    EV = t.width
    if EV % LN:
        LN, vb = 1, 4  # an odd width: one lane (still correct, only slower)
    EVV = max(1, min(EVV, EV // LN))
    step = EVV * LN
    acc = [[f"a{u}_{c}" for c in range(EVV)] for u in range(RB)]
    lines = [f"            for (int64_t g = 0; g < nr; g += {RB}) {{",
             f"                typedef float vec __attribute__((vector_size({vb})));",
             f"                for (int64_t ec = 0; ec + {step} <= {EV}; ec += {step}) {{",
             "                    vec " + ", ".join(f"{acc[u][c]}" for u in range(RB) for c in range(EVV)) + ";"]
    lines += [f"                    memcpy(&{acc[u][c]}, &acc[g + {u}][ec + {c * LN}], {vb});"
              for u in range(RB) for c in range(EVV)]
    lines.append("                    for (int64_t jj = 0; jj < jn; jj++) {")
    lines += [f"                        const float w{u} = ps[g + {u}][jj];" for u in range(RB)]
    for c in range(EVV):
        lines.append(f"                        vec v{c}; memcpy(&v{c}, &vt[jj][ec + {c * LN}], {vb});"
                     f"{_keep(f'v{c}', vb)}")
        lines += [f"                        {acc[u][c]} += w{u} * v{c};" for u in range(RB)]
    lines.append("                    }")
    lines += [f"                    memcpy(&acc[g + {u}][ec + {c * LN}], &{acc[u][c]}, {vb});"
              for u in range(RB) for c in range(EVV)]
    lines += ["                }"]
    if EV % step:  # the columns left over after whole chunks, one at a time
        lines += [f"                for (int64_t e = {EV - EV % step}; e < {EV}; e++)",
                  f"                    for (int64_t u = 0; u < {RB}; u++)",
                  "                        for (int64_t jj = 0; jj < jn; jj++)",
                  "                            acc[g + u][e] += ps[g + u][jj] * vt[jj][e];"]
    lines.append("            }")
    return lines
