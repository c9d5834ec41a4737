"""Streaming attention found in formulations other than Lightspeed's own: PyTorch's SDPA decomposition (a
"safe" softmax, batch x heads flattened into bmm, causal / boolean / additive masks, GQA) and Hugging Face
Llama, GPT-2 and BERT through torch.compile(backend="lightspeed").

The torch backend rewrites each program under the rewrite package's normalising safe rules
(``rules.NORMALISE``: where(c, 0, W) becomes the select Sel(not c, W), double negations go), and kernel
formation proves that the select keeps exactly the rows with a score above -inf
(``kernel/attention_rows.py``), so the kernel gives those rows 0 as PyTorch does. The checks: values
against eager PyTorch (or the reference interpreter), an attention kernel in the plan, and no kernel
output of seq x seq elements or more (the score matrix is never stored).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import lightspeed as ls
from lightspeed import frontend as F
from lightspeed import symbolic as sym
from lightspeed.backend import get_backend
from lightspeed.frontend.extra_torch import any_true, eq_ieee
from lightspeed.graph import Program
from lightspeed.rewrite import rewrite_program, rules
from lightspeed.runtime import CompiledGraph
from fx_graphs import record_built_graphs

torch = pytest.importorskip("torch")
TF = torch.nn.functional


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ls_cache_search_attention"))


@pytest.fixture
def built(monkeypatch):
    """Every CompiledFxGraph the torch backend builds in the test (its program, its kernel plan)."""
    yield record_built_graphs(monkeypatch, torch)
    torch._dynamo.reset()


@pytest.fixture(params=["pattern", "derived"])
def matcher(request, monkeypatch):
    """Which lowered-kernel matchers kernel formation runs: both (the pattern first, as compiles do), or only
    the e-graph's derivation (kernel/attention_derived.py), which must find every attention the pattern finds."""
    if request.param == "derived":
        pytest.importorskip("egglog")
        from lightspeed.kernel import fusion
        from lightspeed.kernel.attention_derived import match_derived_attention
        monkeypatch.setattr(fusion, "LOWERED_MATCHERS", [match_derived_attention])
    return request.param


def _big_buffers(plan, seq: int) -> list:
    """Kernel outputs with at least seq x seq elements (upper bounds of symbolic sizes)."""
    out = []
    for k in plan.kernels:
        n = 1
        for d in k.out.shape:
            n *= max(sym.upper_bound(d), 1)
        if n >= seq * seq:
            out.append((k.name, k.kind, k.out.shape))
    return out


def _check_streaming(graphs, seq: int, attentions: int) -> None:
    plans = [g.program.executor.plan for g in graphs if g.program is not None]
    from lightspeed.kernel import fusion
    if fusion.LOWERED_MATCHERS != [fusion.match_attention, fusion.match_derived_attention]:  # only derived
        for g in graphs:
            if g.program is not None:
                former = fusion.Former(g.program.program)
                assert all(type(low).__name__ == "DerivedAttention" for low in former.lowered.values())
    kinds = [k.kind for p in plans for k in p.kernels]
    assert kinds.count("attention") == attentions, kinds
    for p in plans:
        assert not _big_buffers(p, seq), _big_buffers(p, seq)
        assert p.arena_bytes < seq * seq * 4  # less than one head's score matrix


# --- PyTorch's scaled_dot_product_attention, decomposed ---------------------------------------------------

class SDPA(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, q, k, v, m):
        if self.kind == "plain":
            return TF.scaled_dot_product_attention(q, k, v)
        if self.kind == "causal":
            return TF.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.kind == "bool":
            return TF.scaled_dot_product_attention(q, k, v, attn_mask=m)
        if self.kind == "additive":
            return TF.scaled_dot_product_attention(q, k, v, attn_mask=torch.where(m, 0.0, float("-inf")))
        if self.kind == "gqa":
            return TF.scaled_dot_product_attention(q, k[:, :2], v[:, :2], attn_mask=m, enable_gqa=True)
        if self.kind == "window":  # a sliding window of 32 keys and causal
            i = torch.arange(q.shape[-2])[:, None]
            j = torch.arange(k.shape[-2])[None, :]
            return TF.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (j > i - 32))
        s = q @ k.transpose(-1, -2) * 0.25  # "manual": the softmax written out by the model
        return s.softmax(-1) @ v


@pytest.mark.parametrize("kind", ["plain", "causal", "bool", "additive", "gqa", "window", "manual"])
def test_sdpa_decomposition_streams(built, kind, matcher):
    seq = 256
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, seq, 16, generator=g) for _ in range(3))
    m = torch.rand(seq, seq, generator=g) > 0.3
    m[5] = False  # a query that sees no key: PyTorch gives 0 there, not NaN
    mod = SDPA(kind)
    with torch.no_grad():
        out = torch.compile(mod, backend="lightspeed")(q, k, v, m)
        ref = mod(q, k, v, m)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    if kind in ("bool", "additive", "gqa"):
        assert torch.all(out[:, :, 5] == 0)
    _check_streaming(built, seq, 1)


def test_without_the_rewrite_the_scores_are_stored(built):
    """The check above can fail: with options={"rewrite": False} the safe softmax is not recognised and
    the score matrix is materialised."""
    seq = 256
    q = torch.randn(1, 2, seq, 16)
    mod = SDPA("causal")
    with torch.no_grad():
        out = torch.compile(mod, backend="lightspeed", options={"rewrite": False})(q, q, q, None)
        torch.testing.assert_close(out, mod(q, q, q, None), rtol=1e-4, atol=1e-5)
    plan = built[0].program.executor.plan
    assert "attention" not in [k.kind for k in plan.kernels]
    assert _big_buffers(plan, seq)


# --- Hugging Face models at sequence length 2048 -----------------------------------------------------------

SEQ = 2048


def _hf(name: str):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "llama":  # 4 query heads over 2 KV heads (repeat_kv), causal and left padding
        cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                                       attn_implementation="sdpa")
        return transformers.LlamaForCausalLM(cfg).eval(), "logits"
    if name == "gpt2":  # causal
        cfg = transformers.GPT2Config(vocab_size=96, n_embd=64, n_layer=1, n_head=2, n_positions=SEQ,
                                      bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
        return transformers.GPT2LMHeadModel(cfg).eval(), "logits"
    cfg = transformers.BertConfig(vocab_size=96, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=128, max_position_embeddings=SEQ, attn_implementation="sdpa")
    return transformers.BertModel(cfg).eval(), "last_hidden_state"  # bidirectional, padding mask


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_hf_models_stream_at_2048(built, name, matcher):
    model, key = _hf(name)
    ids = torch.randint(0, 96, (1, SEQ), generator=torch.Generator().manual_seed(1))
    kwargs = {"input_ids": ids}
    if name in ("llama", "bert"):
        mask = torch.ones(1, SEQ, dtype=torch.long)
        mask[0, : SEQ // 3] = 0
        kwargs["attention_mask"] = mask
    if name != "bert":
        kwargs["use_cache"] = False
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = getattr(torch.compile(model, backend="lightspeed")(**kwargs), key)
        ref = getattr(model(**kwargs), key)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    _check_streaming(built, SEQ, 1)


# --- the row-select proof, on Lightspeed graphs -------------------------------------------------------------

def _compile(program: Program, backend: str) -> CompiledGraph:
    return CompiledGraph(program, get_backend(backend)(program))


def _safe_attention(kind: str, sq: int, skv: int):
    """softmax(scores) @ v with PyTorch's safe-softmax where(keep, softmax, 0); ``kind`` says what ``keep``
    is (only "any-not-neginf" is the safe softmax; the others are look-alikes that are not)."""
    g = ls.Graph()
    q, k, v = g.input("q", (2, sq, 16)), g.input("k", (2, skv, 16)), g.input("v", (2, skv, 16))
    m = g.input("m", (2, sq, skv))
    x = (q.reshape((2, sq, 1, 16)) * k.reshape((2, 1, skv, 16))).sum(-1) * 0.25 + m
    w = F.softmax(x, -1)
    ne = F.logical_not(eq_ieee(x, float("-inf")))
    keep = {"any-not-neginf": lambda: any_true(ne, 2),
            "any-greater": lambda: any_true(x > float("-inf"), 2),  # differs where a score is NaN
            "all-not-neginf": lambda: F.logical_not(any_true(F.logical_not(ne), 2)),
            "any-of-mask": lambda: any_true(F.logical_not(eq_ieee(m, float("-inf"))), 2)}[kind]()
    w = F.where(F.logical_not(keep.reshape((2, sq, 1))), 0.0, w)
    out = (w.reshape((2, sq, skv, 1)) * v.reshape((2, 1, skv, 16))).sum(2)
    return g, out


def _inputs(sq: int, skv: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    m = np.where(rng.random((2, sq, skv)) < 0.6, 0.0, -np.inf).astype(np.float32)
    m[0, sq // 2] = -np.inf  # a row with no visible key
    m[1, sq - 1, 3] = np.nan  # a NaN score: that row is NaN in every form
    return {"q": rng.standard_normal((2, sq, 16)).astype(np.float32),
            "k": rng.standard_normal((2, skv, 16)).astype(np.float32),
            "v": rng.standard_normal((2, skv, 16)).astype(np.float32), "m": m}


@pytest.mark.parametrize("kind,lowered", [("any-not-neginf", True), ("any-greater", False),
                                          ("all-not-neginf", False), ("any-of-mask", False)])
@pytest.mark.parametrize("sq,skv", [(37, 300), (1, 600)])  # prefill rows; a decode row (keys split in parts)
def test_row_select_is_proven_not_guessed(kind, lowered, sq, skv, matcher):
    g, out = _safe_attention(kind, sq, skv)
    program = Program.build(g, [out])
    new = rewrite_program(program, rules.NORMALISE).program
    inputs = _inputs(sq, skv)
    (ref,) = _compile(program, "reference")(**inputs)
    prog = _compile(new, "c")
    (got,) = prog(**inputs)
    kinds = [k.kind for k in prog.executor.plan.kernels]
    assert ("attention" in kinds) == lowered, kinds
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)
    if kind == "any-not-neginf":
        assert np.all(got[0, sq // 2] == 0) and np.all(np.isnan(got[1, sq - 1]))
