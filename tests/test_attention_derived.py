"""Streaming attention derived by the e-graph's online-softmax rules where the hand pattern does not match.

``kernel/attention.py`` matches one formulation (the softmax's weights, then the weighted sum). These
formulations compute the same thing another way; the pattern finds none of them, and the e-graph
(``kernel/online_softmax.py``, ``search/egraph/rules/online.egg``) rewrites each into the blocked
online-softmax form the streaming kernel computes. Checks: the pattern alone finds nothing, the derived
kernel is formed, values agree with the reference interpreter, no seq x seq buffer at 2048 keys,
look-alikes that are not attention are left alone, and a planted wrong rule is refused by the check.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import lightspeed as ls
from lightspeed import frontend as F
from lightspeed.graph import Program
from lightspeed.kernel import ir
from lightspeed.kernel.attention import match_attention
from lightspeed.kernel.attention_derived import DerivedAttention, match_derived_attention
from lightspeed.kernel.fusion import Former
from lightspeed.kernel.online_softmax import derive, translate

pytest.importorskip("egglog")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ls_cache_derived"))


def _scores(q, k, mask=None):
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]))
    return s if mask is None else s + mask


def deferred(q, k, v, mask=None):
    """Normalised after the weighted sum: (e @ v) / sum(e), as flash-style code writes it."""
    s = _scores(q, k, mask)
    e = F.exp(s - s.max(-1, keepdim=True))
    return (e @ v) / e.sum(-1, keepdim=True)


def broadcast_product(q, k, v, mask=None):
    """The weighted sum as a broadcast product summed over keys, normalised inside the sum."""
    s = _scores(q, k, mask)
    e = F.exp(s - s.max(-1, keepdim=True))
    return ((e.unsqueeze(-1) * v.unsqueeze(-3)) / e.sum(-1, keepdim=True).unsqueeze(-1)).sum(-2)


def scale_on_both_terms(q, k, v, mask=None):
    """exp(s*c - max(s)*c): the scale multiplied into both terms instead of their difference."""
    s = _scores(q, k, mask)
    e = F.exp(s * 0.7 - s.max(-1, keepdim=True) * 0.7)
    return (e / e.sum(-1, keepdim=True)) @ v


def log_sum_exp(q, k, v, mask=None):
    """Base-2 log-sum-exp: 2^(z - log2(sum 2^z)) with z = (s - max s) c, then the weighted sum."""
    s = _scores(q, k, mask)
    z = (s - s.max(-1, keepdim=True)) * 0.5
    return (z - z.exp2().sum(-1, keepdim=True).log2()).exp2() @ v


FORMS = [deferred, broadcast_product, scale_on_both_terms, log_sum_exp]


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _lowered(g, outs):
    former = Former(Program.build(g, outs))
    return former, list(former.lowered.values())


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.__name__)
def test_formulations_the_pattern_misses_are_derived(form):
    g = ls.Graph()
    q, k, v = (g.input(n, (2, 19, 16)) for n in "qkv")
    out = form(q, k, v)
    former, lowered = _lowered(g, [out])
    assert match_attention(former) == []  # the hand pattern does not see it
    (low,) = lowered
    assert isinstance(low, DerivedAttention) and low.node is out.node
    d = low.derivation
    assert d.scale > 0 and 1 <= d.iterations <= 16
    used = {rule for rule, n in d.matches if n > 0}
    assert {"sum-in-blocks", "max-in-blocks", "rescale-at-block-max", "blocked-online-softmax"} <= used
    rng = np.random.default_rng(1)
    inputs = {n: _rand(rng, 2, 19, 16) for n in "qkv"}
    prog = g.compile([out], backend="c")
    assert [kern.kind for kern in prog.executor.plan.kernels] == ["attention"]
    want = g.compile([out], backend="reference")(**inputs)[0]
    np.testing.assert_allclose(prog(**inputs)[0], want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("form", [deferred, log_sum_exp], ids=lambda f: f.__name__)
def test_masks_and_grouped_heads(form):
    """A causal mask added to the scores and two query heads per KV head (a broadcast view)."""
    g = ls.Graph()
    q = g.input("q", (2, 4, 7, 16))
    k = g.input("k", (2, 2, 7, 16))
    v = g.input("v", (2, 2, 7, 16))
    mask = g.input("mask", (7, 7))
    kk = k.unsqueeze(2).expand(2, 2, 2, 7, 16).reshape(2, 4, 7, 16)
    vv = v.unsqueeze(2).expand(2, 2, 2, 7, 16).reshape(2, 4, 7, 16)
    out = form(q, kk, vv, mask)
    _, lowered = _lowered(g, [out])
    assert [type(low) for low in lowered] == [DerivedAttention]
    rng = np.random.default_rng(2)
    causal = np.triu(np.full((7, 7), -np.inf, np.float32), 1)
    inputs = {"q": _rand(rng, 2, 4, 7, 16), "k": _rand(rng, 2, 2, 7, 16), "v": _rand(rng, 2, 2, 7, 16),
              "mask": causal}
    prog = g.compile([out], backend="c")
    assert "attention" in [kern.kind for kern in prog.executor.plan.kernels]
    want = g.compile([out], backend="reference")(**inputs)[0]
    np.testing.assert_allclose(prog(**inputs)[0], want, rtol=3e-5, atol=3e-6)


def test_no_seq_by_seq_buffer_at_2048():
    seq = ls.dim("seq", 1, 2048)
    g = ls.Graph()
    q, k, v = (g.input(n, (2, seq, 64)) for n in "qkv")
    out = deferred(q, k, v)
    streaming = g.compile([out], backend="c")
    materialising = g.compile([out], backend="c", templates=False)
    score_bytes = 2048 * 2048 * 4
    assert [kern.kind for kern in streaming.executor.plan.kernels] == ["attention"]
    assert streaming.arena_bytes < score_bytes // 64, streaming.arena_bytes
    assert materialising.arena_bytes >= score_bytes  # what the derivation saves
    rng = np.random.default_rng(3)
    inputs = {n: _rand(rng, 2, 300, 64) for n in "qkv"}
    want = g.compile([out], backend="reference")(**inputs)[0]
    np.testing.assert_allclose(streaming(**inputs)[0], want, rtol=3e-5, atol=3e-6)


def test_look_alikes_are_not_derived():
    """No max shift (a different float program that overflows), a max over the query axis, a max of other
    scores, and an exponential of the scores without the max: none is attention."""
    g = ls.Graph()
    q, k, v = (g.input(n, (2, 9, 8)) for n in "qkv")
    s = q @ k.transpose(-1, -2)
    no_shift = (s.exp() @ v) / s.exp().sum(-1, keepdim=True)
    e = (s - s.max(-2, keepdim=True)).exp()
    wrong_axis = (e @ v) / e.sum(-1, keepdim=True)
    t = q @ q.transpose(-1, -2)
    e2 = (s - t.max(-1, keepdim=True)).exp()
    other_max = (e2 @ v) / e2.sum(-1, keepdim=True)
    e3 = (s - s.max(-1, keepdim=True)).exp()
    two_sums = (e3 @ v) / (e3 * 2).sum(-1, keepdim=True)  # normalised by twice the sum
    rng = np.random.default_rng(4)
    inputs = {n: _rand(rng, 2, 9, 8) for n in "qkv"}
    for out in (no_shift, wrong_axis, other_max, two_sums):
        _, lowered = _lowered(g, [out])
        assert lowered == []
        prog = g.compile([out], backend="c")
        assert "attention" not in [kern.kind for kern in prog.executor.plan.kernels]
        want = g.compile([out], backend="reference")(**inputs)[0]
        np.testing.assert_allclose(prog(**inputs)[0], want, rtol=2e-5, atol=2e-6)


def _terms(form):
    g = ls.Graph()
    q, k, v = (g.input(n, (2, 19, 16)) for n in "qkv")
    out = form(q, k, v)
    idx = [ir.loop_var(f"o{a}", s) for a, s in enumerate(out.shape)]
    return translate(out.node, idx, 19, ir.loop_var("j", 19))


def test_a_planted_wrong_rule_is_refused():
    terms = _terms(deferred)
    assert derive(terms) is not None
    # a "recognition" that swaps the score and the value: it reaches the form, the check refuses it
    planted = ("(rule ((= o (Root 0))) ((set (StreamScore) (At 1)) (set (StreamValue) (At 0)) "
               "(set (StreamScale) (Num 1065353216))) :ruleset online)")
    assert derive(terms, extra_rules=planted) is None


def test_search_decides_the_derived_kernel_and_explains_it(monkeypatch):
    """With search on, the derived attention is an alternative the cost model decides like a matched one, and
    explain names the rules that derived it."""
    from lightspeed.search import CostModel, driver, explain, find_alternatives
    from lightspeed.search import calibration as cost
    g = ls.Graph()
    q, k, v = (g.input(n, (2, 40, 16)) for n in "qkv")
    out = deferred(q, k, v)
    (alt,) = find_alternatives(Program.build(g, [out]))
    assert alt.kind == "attention" and alt.root.id == out.node.id and alt.derivation is not None
    former = Former(Program.build(g, [out]), lower_only=frozenset())
    assert match_derived_attention(former) == []  # search's choice "primitive" is respected

    monkeypatch.setattr(cost, "calibrate", lambda: CostModel())  # the defaults: a loaded machine cannot flip it
    monkeypatch.setattr(driver, "RACE_MIN_BUDGET_S", float("inf"))  # the model's choice, no template race
    prog = g.compile([out], backend="c", search=1, search_budget_s=20)
    low = prog.executor.search_report.lowering
    assert [(d.kind, d.node, d.chosen) for d in low.decisions] == [("attention", out.node.id, True)]
    assert set(low.derived) == {out.node.id}
    text = explain(prog)
    assert f"attention k{out.node.id}: derived by the online-softmax rules" in text
    assert "rescale-at-block-max x" in text and "depends-" not in text
    rng = np.random.default_rng(5)
    inputs = {n: _rand(rng, 2, 40, 16) for n in "qkv"}
    want = g.compile([out], backend="reference")(**inputs)[0]
    np.testing.assert_allclose(prog(**inputs)[0], want, rtol=2e-5, atol=2e-6)


# --- hand-written attention in PyTorch, through torch.compile ---------------------------------------------

def _torch_modules():
    torch = pytest.importorskip("torch")

    class Deferred(torch.nn.Module):
        """softmax's pieces by hand, normalised after the weighted sum; torch.amax propagates NaN (a select)."""
        def forward(self, q, k, v):
            s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            e = torch.exp(s - s.amax(-1, keepdim=True))
            return (e @ v) / e.sum(-1, keepdim=True)

    class MaskedLogSumExp(torch.nn.Module):
        """A causal mask added to the scores and the weights as exp(s - logsumexp(s)) by hand (base 2)."""
        def forward(self, q, k, v):
            n = q.shape[-2]
            mask = torch.full((n, n), float("-inf")).triu(1)
            s = (q @ k.transpose(-1, -2)) * 0.125 + mask
            z = (s - s.max(-1, keepdim=True).values) * 1.5
            return torch.exp2(z - torch.log2(torch.exp2(z).sum(-1, keepdim=True))) @ v

    return torch, [Deferred, MaskedLogSumExp]


@pytest.mark.parametrize("which", [0, 1], ids=["deferred-amax", "masked-log-sum-exp"])
def test_torch_compile_hand_written_attention_streams(which, monkeypatch):
    torch, modules = _torch_modules()
    from fx_graphs import record_built_graphs
    graphs = record_built_graphs(monkeypatch, torch)
    try:
        model = modules[which]()
        seq = 2048
        gen = torch.Generator().manual_seed(which)
        q, k, v = (torch.randn(1, 2, seq, 64, generator=gen) for _ in range(3))
        compiled_model = torch.compile(model, backend="lightspeed")
        torch.testing.assert_close(compiled_model(q, k, v), model(q, k, v), rtol=1e-4, atol=2e-5)
        k[0, 1, 7, 0] = float("nan")  # one NaN key: every row of that head is NaN, in eager and here
        want = model(q, k, v)
        assert int(want.isnan().sum()) == seq * 64
        torch.testing.assert_close(compiled_model(q, k, v), want, rtol=1e-4, atol=2e-5, equal_nan=True)
    finally:
        torch._dynamo.reset()
    plans = [g.program.executor.plan for g in graphs if g.program is not None]
    assert [kern.kind for p in plans for kern in p.kernels].count("attention") == 1
    for p in plans:
        assert p.arena_bytes < seq * seq * 4  # less than one head's score matrix


def test_lightspeed_models_without_the_pattern(tmp_path, monkeypatch):
    """With the pattern matcher off, the derivation finds every attention of a Lightspeed model (the tests' tiny
    GGUF Llama: causal mask, grouped heads, a KV cache) and generates the same tokens."""
    from tiny_gguf import write_tiny_llama

    import lightspeed.api as lsa
    from lightspeed.kernel import fusion
    model = tmp_path / "tiny.gguf"
    write_tiny_llama(model, seed=3)
    want = lsa.load(model, ctx=64, progress=False).generate_text("abc", max_tokens=12)
    derived: list = []

    def derive_only(former):
        found = match_derived_attention(former)
        derived.extend(found)
        return found
    monkeypatch.setattr(fusion, "LOWERED_MATCHERS", [derive_only])
    got = lsa.load(model, ctx=64, progress=False).generate_text("abc", max_tokens=12)
    assert got == want
    assert derived and all(d.derivation.scale > 0 for d in derived)
