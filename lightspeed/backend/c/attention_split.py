"""C lines that split decode attention's keys across work items (flash-decoding), see kernel/attention.py
``KeySplit``.

In decode a work item is the few query rows of one (batch, head), so there are as few items as heads
(SmolLM2: 3) and the threads cannot share them evenly; so is a short prompt's (rows of one row block, on the
register-tile path). When the split applies (at most one row block, more keys than one part), the items
become (outer index, part): part ``s`` streams keys ``s * PK .. s * PK + PK - 1`` (whole key blocks) and
stores its running max m, sum l, NaN flag, accumulator and whether it skipped masked blocks in the kernel's
scratch. After the items the launcher merges each outer index's parts in order
s = 0, 1, ...: m = max m_s, l = sum l_s 2^((m_s - m) c), acc = sum acc_s 2^((m_s - m) c), out = acc / l,
a part with m_s = -inf weighing 0. Skipping masked blocks is checked once, against the merged max: if a
skipped key would have had a nonzero weight (a row that sees no key at all), the parts that skipped are
run again without skipping before the merge. Parts start at multiples of PK whatever the number of keys,
so a row's partials do not depend on the keys of other rows in a batch (the extra all-masked parts weigh
exactly 0) nor on the number of threads, and a row with one nonzero part gets the unsplit kernel's bits.
"""
from __future__ import annotations

from ...kernel import ir
from ...kernel.attention import AttentionKernel, KeySplit
from .attention_skip import ZERO_EXPONENT


def active_split(k: ir.Kernel, t: AttentionKernel, QB: int, KB: int) -> KeySplit | None:
    """The split of kernel ``k`` as rendered with ``QB`` rows and ``KB`` keys a block, if any."""
    s = t.split
    if s is None or not k.scratch or s.part_keys % KB or min(s.rows, QB) < 1:
        return None
    return s


def parts(s: KeySplit, QB: int) -> str:
    """C: the number of parts S (1: no split) from NI and NJ alone: rows that fit one work item's row block
    (and the records) split their keys, whichever path (few rows or register tiles) the item takes."""
    R, PK = min(s.rows, QB), s.part_keys
    return f"(NI <= {R} && NJ > {PK}) ? (NJ + {PK - 1}) / {PK} : 1"


def item_lines() -> list[str]:
    """The item's (outer, row block, part) from ``q`` (items of one outer index are consecutive)."""
    return ["        const int64_t part = q % S;",
            "        int64_t row = q / S / IB;", "        const int64_t ib = (q / S) % IB;"]


def key_range(s: KeySplit, KB: int) -> list[str]:
    """The key loop's head over the part's keys (all keys when S == 1)."""
    return [f"        const int64_t jlo = part * {s.part_keys}, jhi = S > 1 ? ls_min(NJ, jlo + {s.part_keys}) : NJ;",
            f"        for (int64_t j0 = jlo; j0 < jhi; j0 += {KB}) {{",
            f"            const int64_t jn = ls_min({KB}, jhi - j0);"]


def _fields(s: KeySplit, rec: str) -> dict[str, str]:
    R = s.rows
    return {"m": f"{rec}[rr]", "l": f"{rec}[{R} + rr]", "bad": f"{rec}[{2 * R} + rr]",
            "skipped": f"{rec}[{3 * R} + rr]", "acc": f"&{rec}[{4 * R} + rr * {s.width}]"}


def store_lines(r, k: ir.Kernel, s: KeySplit) -> list[str]:
    """Inside the item, after its key loop: the partials of rows 0 .. nr-1 into record q."""
    f = _fields(s, "rec")
    return [f"            float *rec = {r.buf(k.scratch[0])} + q * {s.record};",
            "            for (int64_t rr = 0; rr < nr; rr++) {",
            f"                {f['m']} = m[rr]; {f['l']} = lsum[rr]; {f['bad']} = (float)bad[rr]; "
            f"{f['skipped']} = (float)part_skipped;",
            f"                memcpy({f['acc']}, acc[rr], sizeof acc[rr]);",
            "            }"]


def merge_function(r, k: ir.Kernel, s: KeySplit, head: list[str], P: str, outer: list[str], out_off: str,
                   M: str | None, C: str, QB: int) -> list[str]:
    """``static void KFN_merge(void *vctx)``: every outer index's parts merged into the output. ``head``:
    the declarations (buffers, NI, NJ); ``P``: the number of outer indices; ``outer``: the lines that set the
    outer loop variables from ``row``; ``out_off``: the output offset at rows ``i0 + rr`` and column ``e``;
    ``M``: the mask's constant when masked blocks may have been skipped."""
    f = _fields(s, "part_rec(sp)")
    R, W = s.rows, s.width
    lines = ["static void KFN_merge(void *vctx) {"] + head + [
        f"    const int64_t S = {parts(s, QB)};",
        f"    for (int64_t g = 0; g < {P}; g++) {{",
        "        int64_t row = g;"] + outer + [
        "        (void)row;",
        "        const int64_t i0 = 0, nr = NI;",
        # (not the restrict pointer of the declarations: a rerun writes the records through its own)
        f"        float *recs = (float *)l->p[{r.kernel_buffers(k).index(k.scratch[0])}] + g * S * {s.record};",
        f"#define part_rec(sp) (recs + (sp) * {s.record})",
        f"        float mg[{R}]; int badg[{R}];",
        "        for (int64_t rr = 0; rr < nr; rr++) {",
        "            mg[rr] = -INFINITY; badg[rr] = 0;",
        "            for (int64_t sp = 0; sp < S; sp++) {",
        f"                mg[rr] = {f['m']} > mg[rr] ? {f['m']} : mg[rr]; badg[rr] |= {f['bad']} != 0.0f;",
        "            }",
        "        }"]
    if M is not None:  # the unsplit kernel's exactness test (attention_skip.pass_close), at the merged max
        lines += ["        int exact = 1;",
                  "        for (int64_t rr = 0; rr < nr; rr++)",
                  f"            exact &= badg[rr] || ({M} - mg[rr]) * {C} < {ZERO_EXPONENT}f;",
                  "        if (!exact) {  /* a skipped key has a weight: run the parts that skipped again, "
                  "unskipped */",
                  "            for (int64_t sp = 0; sp < S; sp++) {",
                  "                const float *rec0 = part_rec(sp);",
                  f"                if (rec0[{3 * R}] != 0.0f) KFN_items(vctx, g * S + sp, g * S + sp + 1, 1);",
                  "            }",
                  "            for (int64_t rr = 0; rr < nr; rr++) {",
                  "                mg[rr] = -INFINITY; badg[rr] = 0;",
                  "                for (int64_t sp = 0; sp < S; sp++) {",
                  f"                    mg[rr] = {f['m']} > mg[rr] ? {f['m']} : mg[rr]; "
                  f"badg[rr] |= {f['bad']} != 0.0f;",
                  "                }",
                  "            }",
                  "        }"]
    empty = "mg[rr] == -INFINITY ? 0.0f : " if k.template.zero_empty_rows else ""  # (a safe softmax)
    # per row: the parts' weights, then the accumulators summed over the parts a vector of columns at a time
    L = 8 if W % 8 == 0 else 1
    vec, load = ("ls_v8", "ls_load8") if L == 8 else ("float", "*")
    lines += [
        "        for (int64_t rr = 0; rr < nr; rr++) {",
        f"            float lg = 0.0f, w[{s.parts}], acc[{W}];",
        "            for (int64_t sp = 0; sp < S; sp++) {",
        f"                const float ms = {f['m']};",
        # a part that saw no key (m_s = -inf) weighs 0, also when no part saw one (no -inf - -inf)
        f"                w[sp] = ms == -INFINITY ? 0.0f : ms == mg[rr] ? 1.0f : ls_exp2f((ms - mg[rr]) * {C});",
        f"                lg += {f['l']} * w[sp];",
        "            }",
        f"            for (int64_t e0 = 0; e0 < {W}; e0 += {L}) {{",
        f"                {vec} av = {{0}};",
        f"                for (int64_t sp = 0; sp < S; sp++) av += {load}({f['acc']} + e0) * w[sp];",
        "                memcpy(&acc[e0], &av, sizeof av);",
        "            }",
        "            const float inv = 1.0f / lg;",
        f"            for (int64_t e = 0; e < {W}; e++)",
        f"                {r.buf(k.out)}[{out_off}] = badg[rr] ? NAN : {empty}acc[e] * inv;",
        "        }",
        "#undef part_rec",
        "    }",
        "}"]
    return lines


def launch(s: KeySplit, NI: str, NJ: str, P: str, QB: int, work: str, grain: int) -> str:
    """The launch: S parts of every item, then the merge when S > 1. ``work`` (C, from NJ and ``n0`` the
    number of unsplit items) decides whether the items run on the pool."""
    return (f"    {{ const int64_t NI = {NI}, NJ = {NJ}; const int64_t n0 = ({P}) * ((NI + {QB - 1}) / {QB});\n"
            f"      const int64_t S = {parts(s, QB)}, n = n0 * S;\n"
            f"      if ({work} >= {grain}) ls_parallel_for(KFN, &l, n); else KFN(&l, 0, n);\n"
            f"      if (S > 1) KFN_merge(&l); }}")

