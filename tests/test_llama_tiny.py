"""Llama-family models with random weights, checked against Hugging Face transformers (torch).

Each test makes a tiny model with transformers, saves it as a safetensors folder (or
converts it to GGUF the way llama.cpp lays out Llama weights: q/k rows permuted for
interleaved RoPE, matrices quantized), loads it with Lightspeed and compares logits: a
whole prompt in one call, and the same prompt as a prefill followed by one-token decode
steps through the KV cache (the same compiled program with other dimension values).
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lightspeed import quant  # noqa: E402
from lightspeed.models import load_model  # noqa: E402
from lightspeed.models.llama import llama3_inv_freq  # noqa: E402

CTX = 24
TOKENS = [3, 17, 42, 5, 88, 61, 0, 96, 23, 23, 7, 50]
TOL = dict(rtol=1e-4, atol=1e-4)  # float32 with a different summation order

BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6)
CONFIGS = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
           "mistral": transformers.MistralConfig}


def make_hf_model(folder, model_type: str = "llama", seed: int = 0, dtype=None, **overrides):
    """A random transformers model saved to ``folder``; returns the float32 torch model whose
    weights equal the saved ones (after rounding to ``dtype``, if given)."""
    torch.manual_seed(seed)
    config = CONFIGS[model_type](**{**BASE, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
            if dtype is not None:
                p.copy_(p.to(dtype).to(torch.float32))
    # a copy is converted: converting the model itself would also round its RoPE frequency buffer
    (copy.deepcopy(model).to(dtype) if dtype is not None else model).save_pretrained(folder)
    return model


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def compile_full(lm, backend: str = "c", max_chunk: int = 16, kv_update: str = "rows"):
    # float activations on the C backend and a float32 cache: the bounds here are float32's (the default, "auto",
    # rounds a quantized matmul's activations to int16 in calls of few rows, and keys and values to float16)
    options = {"activations": "float"} if backend == "c" else {}
    return lm.compile(CTX, max_chunk=max_chunk, last_only=False, backend=backend, kv_update=kv_update,
                      kv_dtype="float32", **options)


def check_against(lm, ref, backend: str = "c", split: int = 5, kv_update: str = "rows") -> None:
    """All logits of TOKENS in one call, then prefill TOKENS[:split] and decode the rest one by one."""
    step = compile_full(lm, backend, kv_update=kv_update)
    want = hf_logits(ref, TOKENS)
    logits, _ = step.run(TOKENS, 0, step.new_caches())
    np.testing.assert_allclose(logits, want, **TOL)
    logits, caches = step.run(TOKENS[:split], 0, step.new_caches())
    np.testing.assert_allclose(logits, want[:split], **TOL)
    for p in range(split, len(TOKENS)):
        logits, caches = step.run(TOKENS[p:p + 1], p, caches)
        np.testing.assert_allclose(logits[0], want[p], **TOL, err_msg=f"decode step at position {p}")


@pytest.mark.parametrize("model_type,kv_update", [("llama", "rows"), ("qwen2", "rows"), ("mistral", "rows"),
                                                 ("llama", "scatter")])
def test_safetensors_folder_matches_transformers(tmp_path, model_type, kv_update):
    ref = make_hf_model(tmp_path, model_type)
    lm = load_model(tmp_path)
    assert lm.config.architecture == model_type
    assert lm.qkv_bias == (model_type == "qwen2")
    check_against(lm, ref, kv_update=kv_update)


def test_qwen2_biases_matter(tmp_path):
    """The q/k/v biases are used: zeroing them in the reference changes its logits beyond the tolerance."""
    ref = make_hf_model(tmp_path, "qwen2")
    step = compile_full(load_model(tmp_path))
    ours, _ = step.run(TOKENS, 0, step.new_caches())
    with torch.no_grad():
        for layer in ref.model.layers:
            layer.self_attn.q_proj.bias.zero_()
            layer.self_attn.k_proj.bias.zero_()
    assert not np.allclose(ours, hf_logits(ref, TOKENS), **TOL)


def test_tied_embeddings_and_bf16_weights(tmp_path):
    ref = make_hf_model(tmp_path, "llama", seed=1, dtype=torch.bfloat16, tie_word_embeddings=True)
    lm = load_model(tmp_path)
    assert lm.tied
    assert lm.weights.folder.tensors["model.embed_tokens.weight"].dtype == "BF16"
    check_against(lm, ref)


def test_llama3_rope_scaling_attention_and_mlp_biases(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8, "rope_theta": 500.0}
    ref = make_hf_model(tmp_path, "llama", seed=2, rope_parameters=scaling, attention_bias=True, mlp_bias=True,
                        dtype=torch.float16)
    lm = load_model(tmp_path)
    assert lm.config.rope_inv_freq is not None and lm.o_bias
    check_against(lm, ref)


@pytest.mark.parametrize("kv_update", ["rows", "scatter"])
def test_caches_are_updated_in_place(tmp_path, kv_update):
    """Both cache updates leave the new keys in the caller's arrays (scatter: the C backend writes
    into the donated inputs; rows: run() stores the returned rows) and touch no other row."""
    make_hf_model(tmp_path, "llama", seed=7)
    step = load_model(tmp_path).compile(CTX, max_chunk=8, kv_update=kv_update)
    caches = step.new_caches()
    before = {k: v.copy() for k, v in caches.items()}
    _, out = step.run(TOKENS[:3], 2, caches)
    for name, arr in caches.items():
        assert out[name] is arr, name
        assert np.array_equal(arr[:2], before[name][:2]) and np.array_equal(arr[5:], before[name][5:])
        assert np.abs(arr[2:5]).sum() > 0
    # both attend with the streaming kernel (scatter mode's keys extend to min(pos + seq, ctx))
    schedules = [k.kind for k in step.program.executor.plan.kernels]
    assert schedules.count("attention") == load_model(tmp_path).config.n_layers


@pytest.mark.parametrize("kv_update", ["rows", "scatter"])
def test_reference_backend_agrees(tmp_path, kv_update):
    """The numpy oracle runs the same graph (fewer tokens: it is slow)."""
    ref = make_hf_model(tmp_path, "qwen2", seed=3, num_hidden_layers=1)
    step = compile_full(load_model(tmp_path), backend="reference", kv_update=kv_update)
    want = hf_logits(ref, TOKENS[:4])
    logits, caches = step.run(TOKENS[:3], 0, step.new_caches())
    np.testing.assert_allclose(logits, want[:3], **TOL)
    logits, _ = step.run(TOKENS[3:4], 3, caches)
    np.testing.assert_allclose(logits[0], want[3], **TOL)


def test_last_only_program_returns_the_last_row(tmp_path):
    ref = make_hf_model(tmp_path, "llama", seed=4)
    step = load_model(tmp_path).compile(CTX, max_chunk=8, last_only=True, kv_dtype="float32")
    logits, caches = step.run(TOKENS[:6], 0, step.new_caches())
    want = hf_logits(ref, TOKENS[:7])
    assert logits.shape == (1, BASE["vocab_size"])
    np.testing.assert_allclose(logits[0], want[5], **TOL)
    logits, _ = step.run(TOKENS[6:7], 6, caches)
    np.testing.assert_allclose(logits[0], want[6], **TOL)


# GGUF ---------------------------------------------------------------------------------------------
def interleave_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder each head's rows from halves (0..d/2-1 | d/2..d-1) to pairs (0, d/2, 1, d/2+1, ...):
    the layout llama.cpp stores Llama q/k weights in, for its interleaved rotary embedding."""
    rows, cols = w.shape
    d = rows // n_heads
    return w.reshape(n_heads, 2, d // 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def write_gguf_from(model, path, qtypes: dict[str, str], arch: str = "llama") -> None:
    """Write ``model`` (a torch Llama or Qwen2) as a GGUF file of ``arch``; ``qtypes`` maps GGUF
    tensor-name suffixes to a quantization (F32 otherwise). As llama.cpp does, q/k rows are
    interleaved for 'llama' only. The torch model's matrices are replaced by their
    quantize/dequantize round trip so that both sides hold the same values."""
    gguf = pytest.importorskip("gguf")
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", cfg.num_hidden_layers)
    w.add_uint32(f"{arch}.context_length", cfg.max_position_embeddings)
    w.add_uint32(f"{arch}.embedding_length", cfg.hidden_size)
    w.add_uint32(f"{arch}.feed_forward_length", cfg.intermediate_size)
    w.add_uint32(f"{arch}.attention.head_count", cfg.num_attention_heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", cfg.num_key_value_heads)
    w.add_float32(f"{arch}.rope.freq_base", float(cfg.rope_parameters["rope_theta"]))
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in parts.items():
            for kind in ("weight", "bias"):
                names[f"model.layers.{i}.{hf}.{kind}"] = f"blk.{i}.{gg}.{kind}"
    heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
    with torch.no_grad():
        for hf_name, p in model.named_parameters():
            name = names[hf_name]
            x = p.numpy().astype(np.float32)
            layer_part = name.split(".")[-2]
            permute = arch == "llama" and layer_part in heads
            if permute:
                x = interleave_rows(x.reshape(x.shape[0], -1), heads[layer_part]).reshape(x.shape)
            q = next((q for suffix, q in qtypes.items() if name.endswith(suffix)), "F32")
            if q == "F32" or x.ndim == 1:
                w.add_tensor(name, x)
                continue
            raw = quant.quantize(x, q)
            w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[q])
            back = quant.dequantize(raw, q).reshape(x.shape)
            p.copy_(torch.from_numpy(pair_rows_to_halves(back, heads[layer_part]) if permute else back))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def pair_rows_to_halves(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The inverse of ``interleave_rows``."""
    rows, cols = w.shape
    d = rows // n_heads
    return w.reshape(n_heads, d // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def test_gguf_quantized_llama_matches_transformers(tmp_path):
    ref = make_hf_model(tmp_path / "hf", "llama", seed=5)
    path = tmp_path / "tiny.gguf"
    write_gguf_from(ref, path, {"token_embd.weight": "Q8_0", "attn_q.weight": "Q4_1", "attn_k.weight": "Q4_0",
                                "attn_v.weight": "Q8_0", "ffn_gate.weight": "Q4_1", "ffn_down.weight": "Q4_1",
                                "output.weight": "Q8_0"})
    lm = load_model(path, tokenizer=False)
    assert lm.config.rope_interleaved and lm.weights.file.tensors["blk.0.attn_q.weight"].qtype.name == "Q4_1"
    check_against(lm, ref)


def test_interleave_rows_round_trip():
    x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    y = interleave_rows(x, 2)
    assert y[:, 0].tolist() == [0, 6, 3, 9, 12, 18, 15, 21]
    assert np.array_equal(pair_rows_to_halves(y, 2), x)


def test_llama3_inv_freq_against_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 500000.0}
    cfg = transformers.LlamaConfig(**{**BASE, "hidden_size": 256, "num_attention_heads": 2},
                                   rope_parameters=scaling)
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    got = llama3_inv_freq(128, 500000.0, 8.0, 1.0, 4.0, 64)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)


def test_gguf_qwen2_with_biases_matches_transformers(tmp_path):
    """GGUF qwen2 keeps Hugging Face's q/k row order (rotate-half RoPE) and has q/k/v biases."""
    ref = make_hf_model(tmp_path / "hf", "qwen2", seed=6)
    path = tmp_path / "tiny_qwen2.gguf"
    write_gguf_from(ref, path, {"attn_q.weight": "Q8_0", "ffn_up.weight": "Q4_0"}, arch="qwen2")
    lm = load_model(path, tokenizer=False)
    assert not lm.config.rope_interleaved and lm.qkv_bias
    check_against(lm, ref)
