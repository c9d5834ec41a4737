"""Gemma 3 with random weights, checked against Hugging Face transformers (torch).

The tests make tiny Gemma 3 text models with transformers, save them as safetensors folders
(or write them as GGUF the way llama.cpp's converter does: GGUF names, ``1 + weight`` stored
for every RMS norm, matrices quantized), load them with Lightspeed and compare logits: a whole
prompt in one call, and a prefill followed by one-token decode steps through the KV cache. The
prompt is longer than the sliding window, and the local layers use another RoPE theta than the
global ones, so a wrong window or a wrong per-layer theta shows in the logits.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lightspeed import quant  # noqa: E402
from lightspeed.io import ModelFormatError  # noqa: E402
from lightspeed.models import Gemma, load_model  # noqa: E402

CTX = 24
TOKENS = [3, 17, 42, 5, 88, 61, 0, 96, 23, 23, 7, 50, 64, 2]
TOL = dict(rtol=1e-4, atol=1e-4)  # float32, another summation order

BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=20, sliding_window=4,
            max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0, rope_local_base_freq=50.0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"])


def make_hf_gemma(folder, seed: int = 0, **overrides):
    """A random Gemma3ForCausalLM saved to ``folder`` (norm weights random around 0, so the
    ``1 + weight`` matters); returns the float32 torch model."""
    torch.manual_seed(seed)
    config = transformers.Gemma3TextConfig(**{**BASE, **overrides})
    config._attn_implementation = "eager"
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((0.3 if name.endswith("norm.weight") else 0.2) * torch.randn_like(p))
    if folder is not None:
        model.save_pretrained(folder)
    return model


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def check_against(lm, ref, backend: str = "c", split: int = 6, tokens=TOKENS) -> None:
    """All logits of ``tokens`` in one call, then a prefill of ``split`` tokens and one-token decode steps."""
    # float activations on the C backend and a float32 cache: the bounds are float32's (the default "auto" rounds
    # to int16, the default cache keys and values to float16)
    options = {"activations": "float"} if backend == "c" else {}
    step = lm.compile(CTX, max_chunk=16, last_only=False, backend=backend, kv_dtype="float32", **options)
    want = hf_logits(ref, tokens)
    logits, _ = step.run(tokens, 0, step.new_caches())
    np.testing.assert_allclose(logits, want, **TOL)
    logits, caches = step.run(tokens[:split], 0, step.new_caches())
    np.testing.assert_allclose(logits, want[:split], **TOL)
    for p in range(split, len(tokens)):
        logits, caches = step.run(tokens[p:p + 1], p, caches)
        np.testing.assert_allclose(logits[0], want[p], **TOL, err_msg=f"decode step at position {p}")


@pytest.fixture(scope="module")
def folder_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma")
    ref = make_hf_gemma(folder)
    return load_model(folder), ref


def test_safetensors_folder_matches_transformers(folder_model):
    lm, ref = folder_model
    c = lm.config
    assert isinstance(lm, Gemma) and lm.tied
    assert c.sliding_layers == (True, False, True) and c.sliding_window == 4 and c.norm_offset == 1.0
    assert (c.rope_theta, c.rope_local_theta, c.query_pre_attn_scalar) == (10000.0, 50.0, 20.0)
    # the numpy oracle: the GGUF test below compiles the same architecture with the C backend
    check_against(lm, ref, backend="reference")


def test_sliding_window_and_local_theta_matter(folder_model):
    """Transformers without the window (all layers global), or with the global theta on local
    layers, gives other logits than ours beyond the tolerance: the test above can see both."""
    lm, ref = folder_model
    step = lm.compile(CTX, max_chunk=16, last_only=False, backend="reference", kv_dtype="float32")
    ours, _ = step.run(TOKENS, 0, step.new_caches())
    for change in (dict(layer_types=["full_attention"] * 3), dict(rope_local_base_freq=10000.0)):
        other = make_hf_gemma(None, **change)
        other.load_state_dict(ref.state_dict())
        assert not np.allclose(ours, hf_logits(other, TOKENS), **TOL), change


def test_softcap_linear_rope_scaling_and_untied_head(tmp_path):
    """Final logit soft-capping, linear RoPE scaling on the global layers only, an untied LM head
    (on the reference backend); attn_logit_softcapping is ignored, as transformers' Gemma 3 does."""
    ref = make_hf_gemma(tmp_path, seed=1, final_logit_softcapping=3.0, attn_logit_softcapping=0.5,
                        tie_word_embeddings=False, rope_scaling={"rope_type": "linear", "factor": 4.0})
    lm = load_model(tmp_path)
    assert not lm.tied and lm.config.final_logit_softcap == 3.0 and lm.config.rope_global_inv_freq is not None
    check_against(lm, ref, backend="reference", split=8, tokens=TOKENS[:10])


# GGUF, laid out as llama.cpp's converter writes Gemma 3 --------------------------------------------
GGUF_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
              "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
              "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
              "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def write_gemma_gguf(model, path, qtypes: dict[str, str], pattern: int | list[bool] | None = None) -> None:
    """Write a torch Gemma 3 as a GGUF 'gemma3' file; ``qtypes`` maps name suffixes to a quantization
    (F32 otherwise). The torch model's matrices become their quantize/dequantize round trip.
    ``pattern`` adds an ``attention.sliding_window_pattern`` key."""
    gguf = pytest.importorskip("gguf")
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "gemma3")
    for key, value in (("context_length", cfg.max_position_embeddings), ("embedding_length", cfg.hidden_size),
                       ("block_count", cfg.num_hidden_layers), ("feed_forward_length", cfg.intermediate_size),
                       ("attention.head_count", cfg.num_attention_heads),
                       ("attention.head_count_kv", cfg.num_key_value_heads),
                       ("attention.key_length", cfg.head_dim), ("attention.value_length", cfg.head_dim),
                       ("attention.sliding_window", cfg.sliding_window)):
        w.add_uint32(f"gemma3.{key}", value)
    w.add_float32("gemma3.rope.freq_base", float(cfg.rope_parameters["full_attention"]["rope_theta"]))
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    if isinstance(pattern, int):
        w.add_uint32("gemma3.attention.sliding_window_pattern", pattern)
    elif pattern is not None:
        w.add_array("gemma3.attention.sliding_window_pattern", pattern)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in GGUF_NAMES.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    with torch.no_grad():
        for hf_name, p in model.named_parameters():
            name = names[hf_name]
            x = p.numpy().astype(np.float32)
            if name.endswith("norm.weight"):
                w.add_tensor(name, x + 1.0)  # llama.cpp stores Gemma's norms as 1 + weight
                continue
            q = next((q for suffix, q in qtypes.items() if name.endswith(suffix)), "F32")
            if q == "F32":
                w.add_tensor(name, x)
                continue
            raw = quant.quantize(x, q)
            w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[q])
            p.copy_(torch.from_numpy(quant.dequantize(raw, q).reshape(x.shape)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_quantized_gemma_matches_transformers(tmp_path):
    """Six layers with GGUF's defaults (every 6th layer global, local theta 10000, scale by head_dim)."""
    ref = make_hf_gemma(None, seed=2, num_hidden_layers=6, layer_types=None, query_pre_attn_scalar=32,
                        rope_local_base_freq=10000.0, rope_theta=1000.0)
    assert ref.config.layer_types[5] == "full_attention" and ref.config.layer_types[4] == "sliding_attention"
    path = tmp_path / "tiny-gemma3.gguf"
    write_gemma_gguf(ref, path, {"token_embd.weight": "Q8_0", "attn_q.weight": "Q4_1", "attn_k.weight": "Q4_0",
                                 "attn_v.weight": "Q8_0", "ffn_gate.weight": "Q4_1", "ffn_down.weight": "Q8_0"})
    lm = load_model(path, tokenizer=False)
    c = lm.config
    assert c.norm_offset == 0.0 and c.sliding_layers == (True,) * 5 + (False,)
    assert (c.rope_theta, c.rope_local_theta, c.query_pre_attn_scalar) == (1000.0, 10000.0, 32.0)
    check_against(lm, ref)


def test_gguf_sliding_window_pattern_key(tmp_path):
    """A ``gemma3.attention.sliding_window_pattern`` key overrides the default period (an int) or
    flags each layer (a list of bools, True = sliding)."""
    ref = make_hf_gemma(None, seed=3, num_hidden_layers=4, layer_types=None)
    for i, (value, want) in enumerate(((2, (True, False, True, False)),
                                       ([False, True, True, False], (False, True, True, False)))):
        path = tmp_path / f"pattern{i}.gguf"
        write_gemma_gguf(ref, path, {}, pattern=value)
        assert load_model(path, tokenizer=False).config.sliding_layers == want
    write_gemma_gguf(ref, tmp_path / "bad.gguf", {}, pattern=[True, False])
    with pytest.raises(ModelFormatError, match="2 entries for 4 layers"):
        load_model(tmp_path / "bad.gguf", tokenizer=False)


# config errors ----------------------------------------------------------------------------------------
def test_bad_configs_name_the_problem(tmp_path):
    make_hf_gemma(tmp_path, seed=4)
    import json
    cfg_path = tmp_path / "config.json"
    good = json.loads(cfg_path.read_text())
    for change, message in ((dict(num_key_value_heads=3), "not a multiple"),
                            (dict(hidden_activation="silu"), "activation"),
                            (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 2.0},
                                                   "sliding_attention": {"rope_type": "default"}}), "yarn"),
                            (dict(layer_types=["full_attention"]), "sliding-window flags")):
        cfg_path.write_text(json.dumps({**good, **change}))
        with pytest.raises(ModelFormatError, match=message):
            load_model(tmp_path, tokenizer=False)
    del good["hidden_size"]
    cfg_path.write_text(json.dumps(good))
    with pytest.raises(ModelFormatError, match="hidden_size"):
        load_model(tmp_path, tokenizer=False)


def test_multimodal_checkpoint_layout(tmp_path, folder_model):
    """A Gemma3ForConditionalGeneration folder (model_type gemma3, the text config nested, tensors
    under language_model.model.) loads its text model: the same logits as the text-only folder."""
    import json

    from safetensors.numpy import save_file
    lm, ref = folder_model
    text_cfg = json.loads(ref.config.to_json_string())
    tensors = {"language_model.model." + k.removeprefix("model."): v.numpy() for k, v in ref.state_dict().items()
               if k.startswith("model.")}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text_cfg}))
    both = [m.compile(CTX, max_chunk=8, last_only=False, backend="reference") for m in (lm, load_model(tmp_path))]
    want, got = (step.run(TOKENS[:8], 0, step.new_caches())[0] for step in both)
    np.testing.assert_array_equal(got, want)
