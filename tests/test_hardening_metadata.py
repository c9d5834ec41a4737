"""Absurd model metadata is refused before anything is allocated from it, each time with a message that
names the file and the key or tensor; only regular files are opened as models (a FIFO never blocks)."""
from __future__ import annotations

import json
import math
import os
import struct
import time

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from time_limit import time_limit

from lightspeed.io import ModelFormatError, Tokenizer, load_gguf, load_model_folder, load_safetensors
from lightspeed.models import load_model

HIDDEN, FFN, HEADS, KV_HEADS, LAYERS, VOCAB = 64, 96, 4, 2, 2, 40
HEAD_DIM = HIDDEN // HEADS
LLAMA_META = {"block_count": LAYERS, "context_length": 256, "embedding_length": HIDDEN, "feed_forward_length": FFN,
              "attention.head_count": HEADS, "attention.head_count_kv": KV_HEADS, "rope.freq_base": 10000.0,
              "attention.layer_norm_rms_epsilon": 1e-5}
LLAMA_LAYER = {"attn_norm.weight": (HIDDEN,), "ffn_norm.weight": (HIDDEN,), "attn_q.weight": (HIDDEN, HIDDEN),
               "attn_k.weight": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_v.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
               "attn_output.weight": (HIDDEN, HIDDEN), "ffn_gate.weight": (FFN, HIDDEN),
               "ffn_up.weight": (FFN, HIDDEN), "ffn_down.weight": (HIDDEN, FFN)}
GEMMA_LAYER = {**LLAMA_LAYER, "post_attention_norm.weight": (HIDDEN,), "post_ffw_norm.weight": (HIDDEN,),
               "attn_q_norm.weight": (HEAD_DIM,), "attn_k_norm.weight": (HEAD_DIM,)}
DELETE = object()


def _add(w, key: str, value) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value) if 0 <= value < 2 ** 32 else w.add_int64(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    else:
        w.add_array(key, value)


def write_model(path, arch: str = "llama", meta: dict | None = None, shapes: dict | None = None,
                tokenizer_model: str = "gpt2") -> str:
    """A tiny F32 model of ``arch`` with metadata ``meta`` overriding the plausible defaults (DELETE removes
    a key) and tensors ``shapes`` overriding theirs (None removes a tensor)."""
    values = {**LLAMA_META, **({"attention.sliding_window": 16} if arch == "gemma3" else {}), **(meta or {})}
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in values.items():
        if value is not DELETE:
            _add(w, f"{arch}.{key}", value)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [chr(c) for c in range(97, 97 + VOCAB - 4)] + ["ab"]
    w.add_string("tokenizer.ggml.model", tokenizer_model)
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", [3, 3, 3] + [1] * (VOCAB - 3))
    w.add_array("tokenizer.ggml.merges", ["a b"])
    layer = GEMMA_LAYER if arch == "gemma3" else LLAMA_LAYER
    tensors = {"token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,)}
    tensors.update({f"blk.{i}.{k}": v for i in range(LAYERS) for k, v in layer.items()})
    tensors.update(shapes or {})
    rng = np.random.default_rng(0)
    for name, shape in tensors.items():
        if shape is not None:
            w.add_tensor(name, (0.1 * rng.standard_normal(shape)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _refused(path: str, *needles: str) -> ModelFormatError:
    """Loading ``path`` fails fast with a ModelFormatError naming the file and every needle."""
    t0 = time.monotonic()
    with time_limit(20, f"loading {path}"), pytest.raises(ModelFormatError) as e:
        load_model(path)
    assert time.monotonic() - t0 < 10
    message = str(e.value)
    assert e.value.path.startswith(path) and message.startswith(e.value.path + ": ")
    for needle in needles:
        assert needle in message, message
    return e.value


def test_the_plausible_files_load(tmp_path) -> None:
    for arch in ("llama", "gemma3"):
        m = load_model(write_model(tmp_path / f"{arch}.gguf", arch))
        assert m.config.n_layers == LAYERS and m.config.hidden_size == HIDDEN


# GGUF metadata: (key, value, words the message must hold); each on a llama and a gemma3 file
ABSURD = [
    ("block_count", 10 ** 6, ["block_count = 1000000", "implausible"]),
    ("block_count", 3, ["block_count = 3", "tensors for 2 layers", "blk.2.attn_norm.weight"]),
    ("block_count", 0, ["block_count = 0"]),
    ("block_count", [1, 2], ["block_count must be an integer"]),
    ("block_count", "2", ["block_count must be an integer", "str"]),
    ("embedding_length", 10 ** 9, ["embedding_length = 1000000000"]),
    ("embedding_length", 32, ["token_embd.weight", "(40, 64)", "(40, 32)"]),
    ("feed_forward_length", 128, ["blk.0.ffn_gate.weight", "(96, 64)", "(128, 64)"]),
    ("attention.head_count", 0, ["attention.head_count = 0"]),
    ("attention.head_count_kv", 4, ["blk.0.attn_k.weight"]),
    ("attention.head_count_kv", 3, ["attention.head_count_kv", "not a multiple"]),
    ("attention.key_length", 15, ["attention.key_length", "even"]),
    ("attention.layer_norm_rms_epsilon", math.nan, ["layer_norm_rms_epsilon = nan", "finite"]),
    ("attention.layer_norm_rms_epsilon", math.inf, ["layer_norm_rms_epsilon = inf"]),
    ("attention.layer_norm_rms_epsilon", 0.0, ["layer_norm_rms_epsilon = 0.0"]),
    ("attention.layer_norm_rms_epsilon", -1e-5, ["layer_norm_rms_epsilon"]),
    ("attention.layer_norm_rms_epsilon", 2.0, ["layer_norm_rms_epsilon = 2.0", "between 0 and 1"]),
    ("rope.freq_base", math.nan, ["rope.freq_base = nan"]),
    ("rope.freq_base", 0.0, ["rope.freq_base = 0.0"]),
    ("rope.freq_base", -math.inf, ["rope.freq_base = -inf"]),
    ("context_length", 0, ["context_length = 0"]),
    ("context_length", 2 ** 40, ["context_length = 1099511627776"]),
    ("vocab_size", 10 ** 9, ["vocab_size = 1000000000"]),
    ("vocab_size", 41, ["token_embd.weight", "(41, 64)"]),
]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("case", range(len(ABSURD)), ids=[f"{k}={v!r}" for k, v, _ in ABSURD])
def test_absurd_gguf_metadata_is_refused_naming_file_and_key(tmp_path, arch, case) -> None:
    key, value, words = ABSURD[case]
    path = write_model(tmp_path / "m.gguf", arch, {key: value})
    _refused(path, f"{arch}.{key}" if not any(w.startswith(("token_embd", "blk.")) for w in words) else "tensor",
             *words)


def test_missing_required_key_is_named(tmp_path) -> None:
    path = write_model(tmp_path / "m.gguf", meta={"block_count": DELETE})
    _refused(path, "missing metadata key 'llama.block_count'")


@pytest.mark.parametrize("name, shape, words", [
    ("blk.1.attn_q.weight", (HIDDEN, 32), ["blk.1.attn_q.weight", "(64, 32)", "(64, 64)"]),
    ("blk.0.attn_norm.weight", (HIDDEN + 1,), ["blk.0.attn_norm.weight", "(65,)"]),
    ("output.weight", (VOCAB + 1, HIDDEN), ["output.weight", "(41, 64)"]),
    ("blk.1.ffn_down.weight", None, ["missing tensor 'blk.1.ffn_down.weight'"]),
    ("blk.1.attn_norm.weight", None, ["tensors for 1 layers", "blk.1.attn_norm.weight"]),
    ("rope_freqs.weight", (3,), ["rope_freqs.weight", "(3,)", "(8,)"]),
])
def test_tensor_shapes_are_checked_against_the_metadata(tmp_path, name, shape, words) -> None:
    _refused(write_model(tmp_path / "m.gguf", shapes={name: shape}), *words)


def test_unknown_tokenizer_model_is_named(tmp_path) -> None:
    path = write_model(tmp_path / "m.gguf", tokenizer_model="gibberish")
    with pytest.raises(ModelFormatError, match="tokenizer.ggml.model is 'gibberish'") as e:
        Tokenizer.from_gguf(path)
    assert e.value.path == path


# Hugging Face folders ------------------------------------------------------------------------------
def _write_safetensors(path, tensors: dict[str, tuple[int, ...]]) -> None:
    header, offset, blobs = {}, 0, []
    for name, shape in tensors.items():
        data = np.zeros(shape, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


HF_CONFIG = {"model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": FFN, "num_attention_heads": HEADS,
             "num_key_value_heads": KV_HEADS, "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256}
HF_LAYER = {"input_layernorm.weight": (HIDDEN,), "post_attention_layernorm.weight": (HIDDEN,),
            "self_attn.q_proj.weight": (HIDDEN, HIDDEN), "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN), "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            "mlp.gate_proj.weight": (FFN, HIDDEN), "mlp.up_proj.weight": (FFN, HIDDEN),
            "mlp.down_proj.weight": (HIDDEN, FFN)}


def write_folder(folder, config: dict | None = None, raw_config: str | None = None) -> str:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        f.write(raw_config if raw_config is not None else json.dumps({**HF_CONFIG, **(config or {})}))
    tensors = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    tensors.update({f"model.layers.{i}.{k}": v for i in range(LAYERS) for k, v in HF_LAYER.items()})
    _write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    return str(folder)


@pytest.mark.parametrize("key, value, words", [
    ("num_hidden_layers", 10 ** 6, ["num_hidden_layers = 1000000"]),
    ("num_hidden_layers", 5, ["num_hidden_layers = 5", "tensors for 2 layers",
                              "model.layers.2.input_layernorm.weight"]),
    ("hidden_size", "64", ["hidden_size must be an integer"]),
    ("hidden_size", 32, ["model.embed_tokens.weight", "config.json"]),
    ("rms_norm_eps", 0, ["rms_norm_eps = 0"]),
    ("rms_norm_eps", -1.0, ["rms_norm_eps = -1.0"]),
    ("rope_theta", -5.0, ["rope_theta = -5.0"]),
    ("num_key_value_heads", 3, ["num_key_value_heads", "not a multiple"]),
    ("vocab_size", None, ["vocab_size must be an integer"]),
])
def test_absurd_config_json_is_refused_naming_file_and_key(tmp_path, key, value, words) -> None:
    folder = write_folder(tmp_path / "hf", {key: value})
    e = _refused(folder, key if key != "hidden_size" or value != 32 else "tensor", *words)
    assert e.path.startswith(folder)


def test_nan_in_config_json_is_refused(tmp_path) -> None:
    raw = json.dumps(HF_CONFIG).replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": NaN')
    assert "NaN" in raw
    _refused(write_folder(tmp_path / "hf", raw_config=raw), "config.json", "rms_norm_eps = nan")


def test_plausible_folder_loads(tmp_path) -> None:
    assert load_model(write_folder(tmp_path / "hf")).config.n_layers == LAYERS


# only regular files ---------------------------------------------------------------------------------
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


@needs_fifo
@pytest.mark.parametrize("loader", [load_gguf, load_safetensors, load_model])
def test_a_fifo_is_refused_without_blocking(tmp_path, loader) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with time_limit(5, "opening a FIFO"), pytest.raises(ModelFormatError, match="FIFO") as e:
        loader(str(fifo))
    assert e.value.path == str(fifo)


@needs_fifo
@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "chat_template.jinja", "model.safetensors"])
def test_a_fifo_inside_a_model_folder_is_refused_without_blocking(tmp_path, name) -> None:
    folder = write_folder(tmp_path / "hf")
    target = os.path.join(folder, name)
    if os.path.exists(target):
        os.remove(target)
    os.mkfifo(target)
    with time_limit(5, f"a FIFO as {name}"), pytest.raises(ModelFormatError, match="FIFO") as e:
        mf = load_model_folder(folder)
        Tokenizer.from_folder(mf)
    assert e.value.path == target


def test_a_directory_is_refused_as_a_gguf_file(tmp_path) -> None:
    d = tmp_path / "model.gguf"
    d.mkdir()
    with pytest.raises(ModelFormatError, match="is a directory") as e:
        load_gguf(str(d))
    assert e.value.path == str(d)
    with pytest.raises(ModelFormatError, match="is a directory, not a GGUF file"):
        load_model(str(d))
