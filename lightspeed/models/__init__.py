"""Language models written with the Tensor API, loaded from GGUF files or Hugging Face folders.

    model = load_model("SmolLM2-135M-Instruct.Q4_1.gguf")   # or a folder with config.json + safetensors
    step = model.compile(ctx=2048)                          # one program for prefill and decode
    logits, caches = step.run(ids, pos=0, caches=step.new_caches())

``ARCHITECTURES`` maps a GGUF ``general.architecture`` or a config.json ``model_type`` to
the class that builds it (a ``CausalLM`` with ``from_gguf`` and ``from_folder``).
"""
from __future__ import annotations

import os

from ..io import ModelFormatError, Tokenizer, load_gguf, load_model_folder
from .base import CacheSpec, CausalLM, CompiledLM, KVAppend, ModelConfig
from .gemma import Gemma, GemmaConfig
from .llama import Llama, LlamaConfig
from .weights import GGUFWeights, SafetensorsWeights, WeightStore

ARCHITECTURES: dict[str, type[CausalLM]] = {"llama": Llama, "mistral": Llama, "qwen2": Llama,
                                             "gemma3": Gemma, "gemma3_text": Gemma}


def _lookup(arch: str | None, path: str, what: str) -> type[CausalLM]:
    cls = ARCHITECTURES.get(arch or "")
    if cls is None:
        raise ModelFormatError(path, f"unsupported {what} {arch!r}; supported: {', '.join(sorted(ARCHITECTURES))}")
    return cls


def load_model(path: "str | os.PathLike[str]", tokenizer: bool = True) -> CausalLM:
    """The model stored at ``path``: a ``.gguf`` file or a Hugging Face folder (config.json and
    safetensors). Weights are memory-mapped. ``tokenizer=False`` skips loading the tokenizer."""
    path = os.fspath(path)
    if os.path.isdir(path):
        mf = load_model_folder(path)
        cls = _lookup(mf.config.get("model_type"), path, "model_type")
        tok = Tokenizer.from_folder(mf) if tokenizer and mf.tokenizer_json else None
        return cls.from_folder(mf, tok)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no model at {path!r} (expected a .gguf file or a Hugging Face model folder)")
    gf = load_gguf(path)
    cls = _lookup(gf.architecture, path, "architecture")
    model = cls.from_gguf(gf, Tokenizer.from_gguf(gf) if tokenizer else None)
    if tokenizer:
        gf.release_vocabulary()  # the tokenizer has its own copy; the metadata's is ~16 MB of Python objects
    return model


__all__ = ["load_model", "ARCHITECTURES", "CausalLM", "CompiledLM", "ModelConfig", "CacheSpec", "Llama",
           "LlamaConfig", "Gemma", "GemmaConfig", "KVAppend", "WeightStore", "GGUFWeights", "SafetensorsWeights"]
