"""The causal masks of Hugging Face Llama and GPT-2 under torch.compile(backend="lightspeed") are proven.

aten's attention adds ``where(mask, 0, -inf)`` to the scores, and the mask compares positions computed into
buffers (a wrapped iota plus an offset, read through gathers, GPT-2) or plain iotas (Llama). The attention
kernels must prove the causal conjunct (kernel/index_values.py resolves the index-valued buffers,
kernel/attention_mask.py folds the additive mask), so that key blocks above the diagonal are skipped.
Checked on the kernels formed (one proven upper bound per attention, masked score -inf), on the values
(against eager PyTorch, with left padding and a dynamic batch and length) and on the skipping itself: a NaN
in the last token's embedding reaches only the rows of the work items that compute its key block (computed,
a NaN score would make every row NaN: NaN + -inf is NaN).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import lightspeed.torch_backend.backend as ls_backend  # noqa: E402
from lightspeed.backend.c.attention_skip import key_mask  # noqa: E402

SEQ = 300
VOCAB = 96


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ls_cache_attention_mask_torch"))


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(4)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=512, bos_token_id=0,
                     eos_token_id=0, attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg).eval()


MODELS = {"llama": llama, "gpt2": gpt2}


def inputs(name: str, batch: int, seq: int, padded: bool = True) -> dict:
    g = torch.Generator().manual_seed(batch * 1000 + seq)
    kw = {"input_ids": torch.randint(1, VOCAB, (batch, seq), generator=g), "use_cache": False}
    if name == "llama" and padded:
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[0, : seq // 3] = 0  # left padding in the first row: its first rows see no key at all
        kw["attention_mask"] = mask
    return kw


def compile_recorded(model, monkeypatch, **options):
    """The model under torch.compile with Lightspeed, and the list its compiled FX graphs are appended to."""
    graphs = []
    compile_fx = ls_backend.compile_fx

    def record(gm, example_inputs, opts):
        graphs.append(compile_fx(gm, example_inputs, opts))
        return graphs[-1]
    monkeypatch.setattr(ls_backend, "compile_fx", record)
    torch._dynamo.reset()
    return torch.compile(model, backend="lightspeed", **options), graphs


def attention_templates(graphs) -> list:
    return [k.template for g in graphs if g.program is not None
            for k in g.program.executor.plan.kernels if k.kind == "attention"]


def logits(model, kw) -> torch.Tensor:
    with torch.no_grad():
        return model(**kw).logits


@pytest.mark.parametrize("name", list(MODELS))
def test_the_causal_conjunct_is_proven_and_values_match_eager(name, monkeypatch):
    """Every layer's attention proves one upper bound (the causal conjunct; Llama's padding and GPT-2's
    packed-sequence conjuncts are not monotone and stay computed) with -inf as the masked score."""
    model = MODELS[name]()
    compiled, graphs = compile_recorded(model, monkeypatch, dynamic=True)
    for batch, seq in ((2, SEQ), (3, SEQ - 37)):  # the second call reuses the dynamic program
        kw = inputs(name, batch, seq)
        torch.testing.assert_close(logits(compiled, kw), logits(model, kw), rtol=1e-4, atol=1e-4)
    templates = attention_templates(graphs)
    assert len(graphs) == 1 and len(templates) == 2  # one a layer
    for t in templates:
        mask = key_mask(t)
        assert mask is not None, f"{name}: no key mask proven"
        assert len(mask.upper) == 1 and not mask.lower and mask.masked == float("-inf")


@pytest.mark.parametrize("name", list(MODELS))
def test_key_blocks_past_every_row_are_skipped(name, monkeypatch):
    """A NaN embedding for the last token: its key and value rows are NaN from the first layer on. The first
    rows never see it and their blocks of keys are skipped, so they stay finite and equal eager PyTorch's
    values at a finite input (the last token then only has to differ for rows that see it)."""
    model = MODELS[name]()
    compiled, graphs = compile_recorded(model, monkeypatch)
    kw = inputs(name, 1, SEQ, padded=False)
    kw["input_ids"][0, -1] = 0
    want = logits(model, kw)
    with torch.no_grad():
        model.get_input_embeddings().weight[0] = float("nan")
    got = logits(compiled, kw).numpy()[..., 1:]  # (token 0's logit reads the tied NaN row everywhere)
    assert all(key_mask(t) is not None for t in attention_templates(graphs))
    assert np.isnan(got[0, -1]).all()
    assert np.isfinite(got[0, : SEQ // 2]).all(), "rows that never see the NaN key got NaN: no block was skipped"
    np.testing.assert_allclose(got[0, : SEQ // 2], want[0, : SEQ // 2, 1:].numpy(), rtol=1e-4, atol=1e-4)
