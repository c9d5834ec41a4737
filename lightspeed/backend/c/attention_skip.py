"""C lines that skip masked key blocks in the streaming attention kernel (see kernel/attention_mask.py).

Per block of keys the kernel evaluates the mask's monotone conjuncts for each query row of the work item:
an "upper" conjunct at the block's first key, a "lower" one at its last. When every row is past its last
visible key the key loop ends; when every row sees none of the block's keys the block is skipped. Those
keys all score the mask's constant M, so dropping them changes nothing exactly when their weight
exp2((M - max) c) rounds to 0 for every row: the kernel checks that after the loop and otherwise runs
the work item again without skipping (e.g. a row whose every key is masked, where the reference
spreads the weight over all keys).
"""
from __future__ import annotations

from ...kernel.attention import AttentionKernel
from ...kernel.attention_mask import KeyMask, split_mask

# exp2 of an exponent below this is 0 in float32 (it rounds below half the smallest subnormal, 2**-149)
ZERO_EXPONENT = -150.0


def key_mask(t: AttentionKernel) -> KeyMask | None:
    """The proven key mask of ``t``'s score, if any (proven from its index-resolved form, equal to it)."""
    return split_mask(t.score if t.mask_score is None else t.mask_score, t.j, t.c)


def _all(r, conds, t: AttentionKernel, key: str) -> str:
    saved = r.rename.get(t.j)
    r.rename[t.j] = key
    try:
        return " && ".join(f"({r.expr(c)})" for c in conds) if conds else "1"
    finally:
        if saved is None:
            r.rename.pop(t.j, None)
        else:
            r.rename[t.j] = saved


def block_test(r, t: AttentionKernel, mask: KeyMask) -> list[str]:
    """At the top of the key loop (``j0``, ``jn`` defined, rows ``i0 + rr``): end the loop or skip the
    block when no row of the item sees any of its keys (only in pass 0; ``skipped`` records it)."""
    saved = r.rename.get(t.i)
    r.rename[t.i] = "(i0 + rr)"
    try:
        up = _all(r, mask.upper, t, "(j0)")
        lo = _all(r, mask.lower, t, "(j0 + jn - 1)")
    finally:
        if saved is None:
            r.rename.pop(t.i, None)
        else:
            r.rename[t.i] = saved
    return ["            if (pass == 0) {  /* keys no row of the item sees score M: skip them */",
            "                int past = 1, hidden = 1;",
            "                for (int64_t rr = 0; rr < nr; rr++) {",
            f"                    const int up = {up};",
            f"                    const int lo = {lo};",
            "                    past &= !up; hidden &= !(up && lo);",
            "                }",
            "                if (past) { skipped = 1; break; }",
            "                if (hidden) { skipped = 1; continue; }",
            "            }"]


def pass_open(first: str = "0") -> list[str]:
    """Before the item's state is initialised: pass 0 skips, pass 1 (if needed) does not; ``first``: the
    first pass (C)."""
    return [f"        for (int pass = {first}; pass < 2; pass++) {{", "        int skipped = 0;"]


def pass_close(mask: KeyMask, M: str, C: str, split: bool = False) -> list[str]:
    """After the key loop: done unless a skipped key would have had a nonzero weight in some row (a row
    with NaN scores is NaN either way). With ``split`` a part of a split item (S > 1) records whether it
    skipped and is done: the merge decides, at the merged max (attention_split.py)."""
    return (["        if (S > 1) { part_skipped = skipped; break; }"] if split else []) + [
            "        if (!skipped) break;",
            "        int exact = 1;",
            "        for (int64_t rr = 0; rr < nr; rr++)",
            f"            exact &= bad[rr] || ({M} - m[rr]) * {C} < {ZERO_EXPONENT}f;",
            "        if (exact) break;",
            "        }"]
