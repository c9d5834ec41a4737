"""Streaming (online-softmax) attention, rediscovered from the primitive graph by the C backend.

The frontend builds attention from primitives only; kernel formation recognises
softmax(scores) @ V (kernel/attention.py) and runs it as one kernel that streams over key blocks
(backend/c/attention.py). These tests check values against the reference interpreter for the shapes,
masks and views attention comes in, that no seq x seq buffer exists (arena size at seq 4096, head
64), and that look-alike graphs which are not attention are left alone.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lightspeed as ls
from lightspeed import frontend as F


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ls_cache_attention"))


def schedules(prog) -> list[str]:
    return [k.kind for k in prog.executor.plan.kernels]


def run_both(g, outs, inputs, dims=None, **options):
    ref = g.compile(outs, backend="reference")(dims=dims, **inputs)
    prog = g.compile(outs, backend="c", **options)
    got = prog(dims=dims, **inputs)
    return prog, ref, got


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 3, 33, 70])
def test_sdpa_symbolic_seq(causal, n):
    seq = ls.dim("seq", 1, 256)
    g = ls.Graph()
    q, k, v = (g.input(name, (2, seq, 64)) for name in "qkv")
    o = F.scaled_dot_product_attention(q, k, v, causal=causal)
    rng = np.random.default_rng(n)
    inputs = {name: rand(rng, 2, n, 64) for name in "qkv"}
    prog, ref, got = run_both(g, [o], inputs)
    assert "attention" in schedules(prog)
    np.testing.assert_allclose(got[0], ref[0], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("mask_kind", ["bool", "float", "float-inf"])
def test_masks_gqa_and_batch(mask_kind):
    """Grouped-query heads (KV heads broadcast by a view), a batch axis and an explicit mask."""
    g = ls.Graph()
    B, Hq, Hkv, Sq, Skv, D = 2, 4, 2, 5, 37, 16
    q = g.input("q", (B, Hq, Sq, D))
    k = g.input("k", (B, Hkv, Skv, D))
    v = g.input("v", (B, Hkv, Skv, D))
    rng = np.random.default_rng(1)
    if mask_kind == "bool":
        m = g.input("m", (Sq, Skv), ls.bool_)
        mv = rng.random((Sq, Skv)) < 0.7
        mv[:, 0] = True
    else:
        m = g.input("m", (B, 1, Sq, Skv))
        mv = rand(rng, B, 1, Sq, Skv)
        if mask_kind == "float-inf":
            mv[0, 0, 1, :] = -np.inf  # a fully masked row: NaN, as in the reference (and PyTorch)
            mv[1, 0, 2, 5:] = -np.inf
    o = F.scaled_dot_product_attention(q, k, v, m)
    inputs = {"q": rand(rng, B, Hq, Sq, D), "k": rand(rng, B, Hkv, Skv, D), "v": rand(rng, B, Hkv, Skv, D), "m": mv}
    prog, ref, got = run_both(g, [o], inputs)
    assert "attention" in schedules(prog)
    np.testing.assert_allclose(got[0], ref[0], rtol=2e-5, atol=2e-6)
    if mask_kind == "float-inf":
        assert np.isnan(got[0][0, :, 1]).all() and not np.isnan(got[0][1]).any()


def test_decode_step_against_a_cache():
    """One query against a cache of pos + 1 keys (the KV-cache convention of causal attention)."""
    pos = ls.dim("pos", 0, 127)
    g = ls.Graph()
    q = g.input("q", (3, 1, 32))
    k = g.input("k", (3, ls.symbolic.add(pos, 1), 32))
    v = g.input("v", (3, ls.symbolic.add(pos, 1), 32))
    o = F.scaled_dot_product_attention(q, k, v, causal=True)
    rng = np.random.default_rng(2)
    for p in (0, 9, 127):
        inputs = {"q": rand(rng, 3, 1, 32), "k": rand(rng, 3, p + 1, 32), "v": rand(rng, 3, p + 1, 32)}
        prog, ref, got = run_both(g, [o], inputs, dims={"pos": p})
        assert "attention" in schedules(prog)
        np.testing.assert_allclose(got[0], ref[0], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("d,dv", [(24, 40), (64, 128), (8, 3)])
def test_head_sizes(d, dv):
    g = ls.Graph()
    q = g.input("q", (2, 19, d))
    k = g.input("k", (2, 45, d))
    v = g.input("v", (2, 45, dv))
    o = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    rng = np.random.default_rng(d)
    inputs = {"q": rand(rng, 2, 19, d), "k": rand(rng, 2, 45, d), "v": rand(rng, 2, 45, dv)}
    prog, ref, got = run_both(g, [o], inputs)
    assert "attention" in schedules(prog)
    np.testing.assert_allclose(got[0], ref[0], rtol=3e-5, atol=3e-6)


def test_hand_written_attention_with_permuted_views():
    """Not the frontend's sdpa: a user's own softmax(q k^T / sqrt(d)) v over [seq, heads, dim] tensors,
    with the head axis moved by permutes. The structure is found from the primitives."""
    g = ls.Graph()
    S, H, D = 21, 3, 16
    x = g.input("x", (S, H, 3 * D))
    q, k, v = x[:, :, :D].permute(1, 0, 2), x[:, :, D:2 * D].permute(1, 0, 2), x[:, :, 2 * D:].permute(1, 0, 2)
    w = (q @ k.transpose(-1, -2) * (1 / math.sqrt(D))).softmax(-1)
    o = (w @ v).permute(1, 0, 2).reshape(S, H * D)
    rng = np.random.default_rng(3)
    prog, ref, got = run_both(g, [o], {"x": rand(rng, S, H, 3 * D)})
    assert "attention" in schedules(prog)
    np.testing.assert_allclose(got[0], ref[0], rtol=2e-5, atol=2e-6)


def test_weights_also_an_output_are_still_right():
    """When the softmax weights are an output too they are materialised; the result is unchanged."""
    g = ls.Graph()
    q, k, v = (g.input(n, (2, 9, 8)) for n in "qkv")
    w = (q @ k.transpose(-1, -2)).softmax(-1)
    o = w @ v
    rng = np.random.default_rng(4)
    prog, ref, got = run_both(g, [o, w], {n: rand(rng, 2, 9, 8) for n in "qkv"})
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_look_alikes_are_not_attention():
    """Softmax over the query axis, or a plain max instead of the softmax's max, is not attention."""
    g = ls.Graph()
    q, k, v = (g.input(n, (2, 9, 8)) for n in "qkv")
    s = q @ k.transpose(-1, -2)
    wrong_axis = s.softmax(-2) @ v
    e = (s - s.max(-2, keepdim=True)).exp()
    wrong_max = (e / e.sum(-1, keepdim=True)) @ v
    no_shift = (s.exp() / s.exp().sum(-1, keepdim=True)) @ v
    rng = np.random.default_rng(5)
    inputs = {n: rand(rng, 2, 9, 8) for n in "qkv"}
    for out in (wrong_axis, wrong_max, no_shift):
        prog, ref, got = run_both(g, [out], inputs)
        assert "attention" not in schedules(prog)
        np.testing.assert_allclose(got[0], ref[0], rtol=2e-5, atol=2e-6)


def test_templates_off_materialises():
    g = ls.Graph()
    q, k, v = (g.input(n, (2, 9, 8)) for n in "qkv")
    o = F.scaled_dot_product_attention(q, k, v)
    assert "attention" not in schedules(g.compile([o], backend="c", templates=False))


@pytest.mark.parametrize("causal", [False, True])
def test_no_seq_by_seq_buffer_at_4096(causal):
    """Sequence length 4096, head size 64: the arena holds nothing of seq x seq size."""
    seq = ls.dim("seq", 1, 4096)
    g = ls.Graph()
    q, k, v = (g.input(name, (4, seq, 64)) for name in "qkv")
    o = F.scaled_dot_product_attention(q, k, v, causal=causal)
    score_bytes = 4096 * 4096 * 4
    streaming = g.compile([o], backend="c")
    materialising = g.compile([o], backend="c", templates=False)
    assert schedules(streaming) == ["attention"]
    assert streaming.arena_bytes < score_bytes // 64, streaming.arena_bytes
    assert materialising.arena_bytes >= score_bytes  # what the streaming kernel avoids
    rng = np.random.default_rng(6)
    inputs = {n: rand(rng, 4, 40, 64) for n in "qkv"}
    ref = g.compile([o], backend="reference")(**inputs)[0]
    np.testing.assert_allclose(streaming(**inputs)[0], ref, rtol=2e-5, atol=2e-6)


@pytest.fixture(scope="module")
def masked_attention(tmp_path_factory):
    """One compiled program with symbolic query and key counts, a float mask and a bool mask."""
    mp = pytest.MonkeyPatch()
    mp.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ls_cache_attention"))
    sq, skv = ls.dim("sq", 1, 80), ls.dim("skv", 1, 160)
    g = ls.Graph()
    q = g.input("q", (2, sq, 16))
    k = g.input("k", (2, skv, 16))
    v = g.input("v", (2, skv, 24))
    fm = g.input("fm", (sq, skv))
    bm = g.input("bm", (sq, skv), ls.bool_)
    o = F.scaled_dot_product_attention(q, k, v, fm) + F.scaled_dot_product_attention(q, k, v, bm, scale=2.0)
    prog = g.compile([o], backend="c")
    assert schedules(prog).count("attention") == 2
    yield prog, g.compile([o], backend="reference")
    mp.undo()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(sq=st.integers(1, 80), skv=st.integers(1, 160), seed=st.integers(0, 2**31), scale=st.sampled_from([0.1, 1, 30]),
       inf_rows=st.booleans())
def test_random_sizes_and_masks(masked_attention, sq, skv, seed, scale, inf_rows):
    """Sizes that are and are not multiples of the row and key blocks, large scores (the running max
    grows block after block), -inf in the float mask (whole rows: NaN, as the reference)."""
    prog, ref = masked_attention
    rng = np.random.default_rng(seed)
    inputs = {"q": rand(rng, 2, sq, 16) * scale, "k": rand(rng, 2, skv, 16), "v": rand(rng, 2, skv, 24),
              "fm": rand(rng, sq, skv), "bm": rng.random((sq, skv)) < 0.8}
    if inf_rows:
        inputs["fm"][rng.random((sq, skv)) < 0.3] = -np.inf
        inputs["fm"][0, :] = -np.inf
    want, got = ref(**inputs)[0], prog(**inputs)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=5e-5, atol=5e-5 * max(1.0, scale))


@pytest.mark.parametrize("knobs", [
    {"ATTENTION_ROWS": 8, "ATTENTION_KEYS": 16, "ATTENTION_VECTOR_BYTES": 16},
    {"ATTENTION_ROWS": 64, "ATTENTION_KEYS": 128, "ATTENTION_VECTOR_BYTES": 32},
    {"ATTENTION_ROWS": 4, "ATTENTION_KEYS": 32, "ATTENTION_VECTOR_BYTES": 64},
], ids=lambda k: "-".join(str(v) for v in k.values()))
def test_schedule_knobs_keep_values(knobs):
    """Every block size and vector width a schedule search may pick computes the same values."""
    g = ls.Graph()
    q, k = g.input("q", (3, 37, 24)), g.input("k", (3, 201, 24))
    v = g.input("v", (3, 201, 40))
    o = F.scaled_dot_product_attention(q, k, v, causal=True)
    rng = np.random.default_rng(7)
    inputs = {"q": rand(rng, 3, 37, 24), "k": rand(rng, 3, 201, 24), "v": rand(rng, 3, 201, 40)}
    prog = g.compile([o], backend="c", knobs=knobs)
    assert "attention" in schedules(prog)
    ref = g.compile([o], backend="reference")(**inputs)[0]
    np.testing.assert_allclose(prog(**inputs)[0], ref, rtol=3e-5, atol=3e-6)
