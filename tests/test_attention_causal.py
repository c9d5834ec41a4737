"""Streaming attention skips key blocks its mask hides from every row of a work item.

kernel/attention_mask.py proves from the score's IR which bool masks it to a constant and which of its
conjuncts are monotone in the key index; backend/c/attention_skip.py ends the key loop (or skips a
block) when no row of the item sees a key of it, and reruns the item unskipped when dropping those keys
would not be exact. Values are checked against the reference interpreter; whether blocks really are
skipped is seen through a NaN in a value row no row of the first work item may see.
"""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed import frontend as F
from lightspeed import symbolic as sym
from lightspeed.backend.c.attention_skip import key_mask

SMALL = {"ATTENTION_ROWS": 8, "ATTENTION_KEYS": 16}  # many blocks at small sizes


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ls_cache_attention_causal"))


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def attention_templates(prog):
    return [k.template for k in prog.executor.plan.kernels if k.kind == "attention"]


def build(mask_fn, rows_per_pos: int = 1, dv: int = 16):
    """q [2, seq * rows_per_pos, 16] against keys/values at positions 0 .. pos + seq - 1; ``mask_fn(g,
    query_positions [rows, 1], key_positions [1, total])`` -> bool mask or None (then causal=True)."""
    pos, seq = ls.dim("pos", 0, 96), ls.dim("seq", 1, 80)
    total, rows = sym.add(pos, seq), sym.mul(seq, rows_per_pos)
    g = ls.Graph()
    q = g.input("q", (2, rows, 16))
    k, v = g.input("k", (2, total, 16)), g.input("v", (2, total, dv))
    qpos = F.arange(g, pos, total).reshape((seq, 1)).expand((seq, rows_per_pos)).reshape((rows, 1))
    kpos = g.iota(total).reshape((1, total))
    m = mask_fn(g, qpos, kpos)
    o = F.scaled_dot_product_attention(q, k, v, m) if m is not None else \
        F.scaled_dot_product_attention(q, k, v, causal=True)
    return g, o


def inputs_for(rng, p: int, n: int, rows_per_pos: int = 1, dv: int = 16):
    return {"q": rand(rng, 2, n * rows_per_pos, 16), "k": rand(rng, 2, p + n, 16), "v": rand(rng, 2, p + n, dv)}


def check(g, o, cases, rows_per_pos: int = 1, knobs=None, dv: int = 16):
    prog = g.compile([o], backend="c", knobs=knobs)
    ref = g.compile([o], backend="reference")
    rng = np.random.default_rng(0)
    for p, n in cases:
        inputs = inputs_for(rng, p, n, rows_per_pos, dv)
        want, got = ref(dims={"pos": p, "seq": n}, **inputs)[0], prog(dims={"pos": p, "seq": n}, **inputs)[0]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-6, err_msg=f"pos {p}, seq {n}")
    return prog


CASES = [(0, 1), (0, 33), (0, 80), (5, 17), (40, 64), (96, 3), (7, 1)]  # chunked prefill and decode


@pytest.mark.parametrize("knobs", [None, SMALL], ids=["default", "small-blocks"])
def test_causal_with_positions(knobs):
    g, o = build(lambda g, qp, kp: None)
    prog = check(g, o, CASES, knobs=knobs)
    (t,) = attention_templates(prog)
    mask = key_mask(t)
    assert mask is not None and len(mask.upper) == 1 and not mask.lower


def test_grouped_query_rows_like_llama():
    """Rows r = s * rep + h at position pos + s (the SmolLM2 layout): j <= pos + r // rep is proven an
    upper bound, through the floor division."""
    g, o = build(lambda g, qp, kp: kp <= qp, rows_per_pos=3)
    prog = check(g, o, CASES, rows_per_pos=3, knobs=SMALL)
    (t,) = attention_templates(prog)
    mask = key_mask(t)
    assert mask is not None and len(mask.upper) == 1 and not mask.lower
    assert mask.masked < -1e38  # the frontend's MASKED_SCORE


def test_sliding_window_bounds_both_sides():
    g, o = build(lambda g, qp, kp: (kp <= qp) & (qp - 20 < kp))
    prog = check(g, o, CASES, knobs=SMALL)
    mask = key_mask(attention_templates(prog)[0])
    assert mask is not None and len(mask.upper) == 1 and len(mask.lower) == 1


def test_lower_bound_only():
    """j >= position: keys before each row's position are masked (a lower bound; the last row sees one key)."""
    g, o = build(lambda g, qp, kp: kp >= qp)
    prog = check(g, o, CASES, knobs=SMALL)
    mask = key_mask(attention_templates(prog)[0])
    assert mask is not None and not mask.upper and len(mask.lower) == 1


def test_non_monotone_masks_are_not_skipped():
    """A mask that alternates along the keys, and a mask read from an input, prove nothing."""
    alternating = lambda g, qp, kp: ((kp + qp) % 2) < 1  # noqa: E731
    g, o = build(alternating)
    prog = check(g, o, CASES, knobs=SMALL)
    assert key_mask(attention_templates(prog)[0]) is None
    g = ls.Graph()
    q, k, v = g.input("q", (2, 40, 16)), g.input("k", (2, 70, 16)), g.input("v", (2, 70, 16))
    m = g.input("m", (40, 70), ls.bool_)
    o = F.scaled_dot_product_attention(q, k, v, m)
    rng = np.random.default_rng(1)
    inputs = {"q": rand(rng, 2, 40, 16), "k": rand(rng, 2, 70, 16), "v": rand(rng, 2, 70, 16),
              "m": rng.random((40, 70)) < 0.3}
    prog = g.compile([o], backend="c", knobs=SMALL)
    assert key_mask(attention_templates(prog)[0]) is None
    np.testing.assert_allclose(prog(**inputs)[0], g.compile([o], backend="reference")(**inputs)[0],
                               rtol=3e-5, atol=3e-6)


def test_rows_that_see_no_key_are_recomputed():
    """Rows whose every key is masked get the reference's uniform weights over all keys (the item is rerun
    without skipping); with a -inf mask they are NaN, as in the reference."""
    g, o = build(lambda g, qp, kp: kp <= qp - 40)
    check(g, o, [(0, 80), (10, 50), (0, 5)], knobs=SMALL)
    pos, seq = ls.dim("pos", 0, 96), ls.dim("seq", 1, 80)
    total = sym.add(pos, seq)
    g = ls.Graph()
    q, k, v = g.input("q", (2, seq, 16)), g.input("k", (2, total, 16)), g.input("v", (2, total, 16))
    allowed = g.iota(total).reshape((1, total)) <= F.arange(g, pos, total).reshape((seq, 1)) - 30
    s = F.where(allowed, q @ k.transpose(-1, -2) * 0.25, float("-inf"))
    o = s.softmax(-1) @ v
    prog = check(g, o, [(0, 80), (20, 30), (40, 64)], knobs=SMALL)
    assert key_mask(attention_templates(prog)[0]).masked == float("-inf")


def test_blocks_past_every_row_are_never_read():
    """Seq 64 at pos 0 with 8-row items and 16-key blocks: the first item's rows see keys 0..7 only, so
    a NaN in value row 63 cannot reach them (it would if block 48..63 were computed: 0 * NaN), while
    the rows that see key 63 are NaN."""
    g, o = build(lambda g, qp, kp: None)
    prog = g.compile([o], backend="c", knobs=SMALL)
    rng = np.random.default_rng(2)
    inputs = inputs_for(rng, 0, 64)
    inputs["v"][:, 63] = np.nan
    got = prog(dims={"pos": 0, "seq": 64}, **inputs)[0]
    assert np.isfinite(got[:, :48]).all()
    assert np.isnan(got[:, 63]).all()
    reference = g.compile([o], backend="reference")
    want = reference(dims={"pos": 0, "seq": 64}, **inputs_for(np.random.default_rng(2), 0, 64))[0]
    np.testing.assert_allclose(got[:, :48], want[:, :48], rtol=3e-5, atol=3e-6)


def test_odd_value_width_and_head_size():
    g, o = build(lambda g, qp, kp: None, dv=12)
    check(g, o, [(0, 70), (13, 29)], dv=12)
