"""A tiny random Llama written as a GGUF file with the gguf package (for bench and quantize tests).

Matrices are stored as the shipped SmolLM2 file stores them (Q4_1, with a Q8_0 embedding),
norms as F32, and the metadata has every GGUF value kind a real file has: strings, uint32,
float32, bools, and arrays of strings, int32 and float32 (a byte-level style vocabulary).
"""
from __future__ import annotations

import numpy as np

from lightspeed import quant

SHAPE = dict(vocab=128, hidden=64, ffn=96, layers=2, heads=4, kv_heads=2, context=256)


def write_tiny_llama(path, seed: int = 0, matrix_type: str = "Q4_1", embed_type: str = "Q8_0",
                     untied: bool = False) -> dict[str, np.ndarray]:
    """Write the model to ``path``; returns the float32 values written (before quantization) by name."""
    import gguf
    rng = np.random.default_rng(seed)
    s = SHAPE
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.name", "tiny random llama")
    w.add_uint32("llama.block_count", s["layers"])
    w.add_uint32("llama.context_length", s["context"])
    w.add_uint32("llama.embedding_length", s["hidden"])
    w.add_uint32("llama.feed_forward_length", s["ffn"])
    w.add_uint32("llama.attention.head_count", s["heads"])
    w.add_uint32("llama.attention.head_count_kv", s["kv_heads"])
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32("general.file_type", 3)
    w.add_string("tokenizer.ggml.model", "gpt2")
    # byte-level BPE pieces: printable ASCII, the space marker, the merged pieces, then fillers
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [chr(c) for c in range(33, 127)] + \
        ["\u0120", "t1", "t2", "\u0120t"]
    tokens += [f"x{i}" for i in range(s["vocab"] - len(tokens))]
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", [3, 3, 3] + [1] * (s["vocab"] - 3))
    w.add_array("tokenizer.ggml.scores", [float(-i) for i in range(s["vocab"])])
    w.add_array("tokenizer.ggml.merges", ["t 1", "t 2", "\u0120 t"])
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    head_dim = s["hidden"] // s["heads"]
    shapes = {"token_embd.weight": (s["vocab"], s["hidden"]), "output_norm.weight": (s["hidden"],)}
    if untied:
        shapes["output.weight"] = (s["vocab"], s["hidden"])
    for i in range(s["layers"]):
        shapes.update({
            f"blk.{i}.attn_norm.weight": (s["hidden"],), f"blk.{i}.ffn_norm.weight": (s["hidden"],),
            f"blk.{i}.attn_q.weight": (s["hidden"], s["hidden"]),
            f"blk.{i}.attn_k.weight": (s["kv_heads"] * head_dim, s["hidden"]),
            f"blk.{i}.attn_v.weight": (s["kv_heads"] * head_dim, s["hidden"]),
            f"blk.{i}.attn_output.weight": (s["hidden"], s["hidden"]),
            f"blk.{i}.ffn_gate.weight": (s["ffn"], s["hidden"]), f"blk.{i}.ffn_up.weight": (s["ffn"], s["hidden"]),
            f"blk.{i}.ffn_down.weight": (s["hidden"], s["ffn"])})
    values = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            x = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            w.add_tensor(name, x)
        else:
            x = (0.2 * rng.standard_normal(shape)).astype(np.float32)
            qtype = embed_type if name == "token_embd.weight" else matrix_type
            raw = quant.quantize(x, qtype)
            w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[qtype])
        values[name] = x
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return values
