"""Decode attention splits its keys across work items (backend/c/attention_split.py).

A work item with few query rows (decode, or a short prompt's rows: at most one row block) over more keys than
one part (kernel/attention.py SPLIT_KEYS) becomes one item per part; each part's partial softmax state goes
to the kernel's scratch and the launcher merges the parts in order. Checked against the reference interpreter
at and around the part boundaries, with the masks the models build (causal over grouped heads, sliding
window: whole parts masked, rows that see no key: the merge reruns the parts that skipped), float16 caches
and NaN keys; and for bits: the same with 1 and 2 threads, and a batched-step row the same alone and in a
batch.
"""
from __future__ import annotations

import numpy as np
import pytest
from tiny_gguf import write_tiny_llama

import lightspeed as ls
import lightspeed.backend.c as cb
from lightspeed import frontend as F
from lightspeed import symbolic as sym
from lightspeed.kernel.attention import SPLIT_KEYS
from lightspeed.models import load_model
from lightspeed.engine.batched import BatchedStep

KV_HEADS, REP, D = 2, 3, 64  # SmolLM2's grouping (3 query heads a KV head) and head size
MAX_POS = 1100
PK = SPLIT_KEYS
POSITIONS = [0, 30, PK - 2, PK - 1, PK, 2 * PK - 1, 2 * PK, 3 * PK + 17, 4 * PK, MAX_POS]  # keys: pos + 1


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ls_cache_attention_split"))


def build(mask_fn=None, kv_dtype=ls.float32, masked=None, d: int = D, dv: int = D, rep: int = REP):
    """One decode token of KV_HEADS x REP query rows (rows of a KV head at the same position) against
    keys 0 .. pos; ``mask_fn(query_pos [REP, 1], key_pos [1, keys])`` -> visible keys (None: causal)."""
    pos = ls.dim("pos", 0, MAX_POS)
    total = sym.add(pos, 1)
    g = ls.Graph()
    q = g.input("q", (KV_HEADS, rep, d))
    k = g.input("k", (KV_HEADS, total, d), kv_dtype).cast(ls.float32)
    v = g.input("v", (KV_HEADS, total, dv), kv_dtype).cast(ls.float32)
    qpos = F.arange(g, pos, total).reshape((1, 1)).expand((rep, 1))
    kpos = g.iota(total).reshape((1, total))
    visible = kpos <= qpos if mask_fn is None else mask_fn(qpos, kpos)
    if masked is None:
        o = F.scaled_dot_product_attention(q, k, v, visible)
    else:  # a mask with its own constant, e.g. -inf
        o = F.where(visible, q @ k.transpose(-1, -2) * d ** -0.5, masked).softmax(-1) @ v
    return g, o


def inputs(rng, p: int, kv_dtype=np.float32, d: int = D, dv: int = D, rep: int = REP):
    n = p + 1
    return {"q": rng.standard_normal((KV_HEADS, rep, d)).astype(np.float32),
            "k": rng.standard_normal((KV_HEADS, n, d)).astype(kv_dtype),
            "v": rng.standard_normal((KV_HEADS, n, dv)).astype(kv_dtype)}


def compiled(g, o, **options):
    prog = g.compile([o], backend="c", **options)
    (k,) = [k for k in prog.executor.plan.kernels if k.kind == "attention"]
    assert k.template.split is not None and k.scratch, "decode attention should split its keys"
    return prog, g.compile([o], backend="reference")


def check(g, o, positions, kv_dtype=np.float32, edit=None, seed=0, d: int = D, dv: int = D, rep: int = REP,
          **options):
    prog, ref = compiled(g, o, **options)
    rng = np.random.default_rng(seed)
    for p in positions:
        x = inputs(rng, p, kv_dtype, d, dv, rep)
        if edit is not None:
            edit(x, p)
        want, got = ref(dims={"pos": p}, **x)[0], prog(dims={"pos": p}, **x)[0]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"pos {p}")
        np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-6, err_msg=f"pos {p}")
    return prog


@pytest.mark.parametrize("portable", [False, True])
def test_causal_grouped_rows_around_part_boundaries(portable):
    check(*build(), POSITIONS, portable=portable)


def test_odd_head_and_value_sizes():
    """Head size 12, value width 20: the few-rows path without whole vectors, and a scalar merge."""
    check(*build(d=12, dv=20), POSITIONS, d=12, dv=20)


@pytest.mark.parametrize("rep,d,dv", [(1, 64, 64), (1, 256, 256), (2, 32, 48), (3, 16, 40), (3, 256, 256),
                                      (4, 64, 64), (4, 256, 256), (5, 16, 40), (6, 64, 48)])
def test_every_few_rows_count_and_value_width(rep, d, dv):
    """The few-rows path is rendered per row count (1-4 query rows of a KV head, 1-6 where the target has
    AVX-512's 32 vector registers; more take the register tiles), computes the dot products of 1-2 rows for
    several keys side by side, and takes the value columns in groups of up to 4 vectors (48 columns: 2 groups of
    3, 40: 5 of 1; Gemma's 256: 8 of 4), of fewer for 3-4 rows without AVX-512 (at most 8 accumulators)."""
    check(*build(d=d, dv=dv, rep=rep, kv_dtype=ls.float16), POSITIONS[:6], kv_dtype=np.float16, d=d, dv=dv,
          rep=rep)


@pytest.mark.parametrize("rep", [7, 9, 12])
def test_rows_of_a_register_tile_split_too(rep):
    """More query rows a KV head than the few-rows path takes (a short prompt's rows over a long context, a
    prefill chunk riding on a decode step): the register-tile path splits its keys as well, up to a work item's
    row block, so two threads share the parts instead of taking a KV head each."""
    from lightspeed.backend.c.attention import FEW_ROWS, FEW_ROWS_WIDE, ROWS
    from lightspeed.kernel.attention import SPLIT_ROWS
    assert max(FEW_ROWS, FEW_ROWS_WIDE) <= rep <= min(SPLIT_ROWS, ROWS)
    prog = check(*build(kv_dtype=ls.float16, rep=rep), POSITIONS, kv_dtype=np.float16, rep=rep)
    assert f"(NI <= {min(SPLIT_ROWS, ROWS)} && NJ > {PK})" in prog.executor.source


def test_sliding_window_masks_whole_parts():
    """A window of 100 keys: every part before it is skipped (m = -inf, l = 0 in the merge)."""
    check(*build(lambda qp, kp: (kp <= qp) & (qp - 100 < kp)), POSITIONS)


def test_rows_that_see_no_key_rerun_the_skipped_parts():
    """Keys up to pos - 300 only: rows at pos < 300 see none (the reference spreads the weight over all
    keys; the merge finds a skipped key with a weight and reruns those parts unskipped). With a -inf
    mask those rows are NaN, as in the reference, and the rows that see keys are not."""
    window = lambda qp, kp: kp <= qp - 300  # noqa: E731
    check(*build(window), POSITIONS)
    check(*build(window, masked=float("-inf")), POSITIONS)


def test_float16_caches():
    check(*build(kv_dtype=ls.float16), POSITIONS, kv_dtype=np.float16)


def test_nan_in_a_key_row():
    """A NaN key in the third part: every row that sees it is NaN, the window that does not see it is not."""
    def poison(x, p):
        if p >= 2 * PK + 5:
            x["k"][1, 2 * PK + 5, 7] = np.nan
    check(*build(), [2 * PK + 5, 4 * PK, MAX_POS], edit=poison)
    check(*build(lambda qp, kp: (kp <= qp) & (qp - 100 < kp)), [2 * PK + 5, 4 * PK, MAX_POS], edit=poison)


def test_bits_do_not_depend_on_the_thread_count():
    prog, _ = compiled(*build())
    rng = np.random.default_rng(5)
    cases = [(p, inputs(rng, p)) for p in (PK, 3 * PK + 17, MAX_POS)]
    before = cb.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            cb.set_num_threads(n)
            outs.append([prog(dims={"pos": p}, **x)[0] for p, x in cases])
    finally:
        cb.set_num_threads(before)
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def test_batched_row_alone_and_in_a_batch(tmp_path):
    """Rows at positions with several parts and with one: each row's logits are bit-identical alone and in
    the batch (the batch's key count covers parts that are all masked for its shorter rows)."""
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, seed=4)
    lm = load_model(path)
    ctx, chunk = 3 * PK + 40, 64
    bs = BatchedStep(lm, ctx, 3, backend="c")
    assert any(k.template.split is not None for k in bs.program.executor.plan.kernels if k.kind == "attention")
    single = lm.compile(ctx, max_chunk=chunk, backend="c")
    rng = np.random.default_rng(1)
    lengths = [3 * PK + 20, PK + 1, 40]
    for slot, n in enumerate(lengths):
        ids = [int(t) for t in rng.integers(3, 128, n)]
        for start in range(0, n, chunk):
            single.run(ids[start:start + chunk], start, bs.slot_caches(slot))
    saved = {k: v.copy() for k, v in bs.caches.items()}
    tokens = [int(t) for t in rng.integers(3, 128, 3)]
    full = bs.run(tokens, lengths)
    for b in range(3):
        for k, v in saved.items():
            bs.caches[k][...] = v
        bs.move_slot(b, 0, lengths[b])
        alone = bs.run([tokens[b]], [lengths[b]])
        np.testing.assert_array_equal(alone[0], full[b])
