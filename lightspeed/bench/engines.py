"""The engines a benchmark times: Lightspeed's compiled step and, as peers, llama.cpp (through
llama-cpp-python) and PyTorch eager (transformers; float32 and bfloat16), all reading the same GGUF file.

Every engine runs the same work: prefill a prompt of token ids, then decode ``n`` tokens one
at a time, each fed back as the greedy choice (argmax) of the previous logits. ``run``
returns the seconds of the two phases.
"""
from __future__ import annotations

import inspect
import os
import time
from typing import Protocol

import numpy as np


class Engine(Protocol):
    name: str
    label: str  # name and version, for reports

    def run(self, prompt: np.ndarray, n_decode: int) -> tuple[float, float]:
        """(prefill seconds, decode seconds) of ``prompt`` then ``n_decode`` greedy tokens."""


class LightspeedEngine:
    """A compiled step program (``CompiledLM``); prompts longer than its ``max_chunk`` run in chunks."""

    name = "lightspeed"

    def __init__(self, step) -> None:
        from .. import __version__
        self.step = step
        self.label = f"lightspeed {__version__}"
        self.caches = step.new_caches()

    def run(self, prompt: np.ndarray, n_decode: int) -> tuple[float, float]:
        step, caches = self.step, self.caches
        if len(prompt) + n_decode > step.ctx:
            raise ValueError(f"lightspeed: {len(prompt)} + {n_decode} tokens exceed the compiled context of {step.ctx}")
        t0 = time.perf_counter()
        pos = 0
        for start in range(0, len(prompt), step.max_chunk):
            chunk = prompt[start:start + step.max_chunk]
            logits, caches = step.run(chunk, pos, caches)
            pos += len(chunk)
        t1 = time.perf_counter()
        token = int(np.argmax(logits[-1]))
        for _ in range(n_decode):
            logits, caches = step.run([token], pos, caches)
            token = int(np.argmax(logits[-1]))
            pos += 1
        t2 = time.perf_counter()
        self.caches = caches
        return t1 - t0, t2 - t1


class LlamaCppEngine:
    """llama.cpp through llama-cpp-python (ImportError when it is not installed)."""

    name = "llama.cpp"

    def __init__(self, path: str, threads: int, ctx: int, batch: int) -> None:
        import llama_cpp
        self.label = f"llama.cpp (llama-cpp-python {getattr(llama_cpp, '__version__', '?')})"
        self.llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=ctx,
                                   n_batch=batch, n_ubatch=batch, verbose=False)
        self._api, self.n_vocab = llama_cpp, self.llm.n_vocab()

    def _last_logits(self) -> np.ndarray:
        # Llama.eval keeps no logits unless logits_all (which computes every row): read the context's
        # logits of the last evaluated token through the C API instead
        ptr = self._api.llama_get_logits(self.llm.ctx)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def run(self, prompt: np.ndarray, n_decode: int) -> tuple[float, float]:
        llm = self.llm
        llm.reset()  # the next eval starts at position 0 and drops the cached keys beyond it
        t0 = time.perf_counter()
        llm.eval([int(t) for t in prompt])
        t1 = time.perf_counter()
        token = int(np.argmax(self._last_logits()))
        for _ in range(n_decode):
            llm.eval([token])
            token = int(np.argmax(self._last_logits()))
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1


class TorchEngine:
    """PyTorch eager: transformers loads the GGUF (dequantized to ``dtype``: "float32", or "bfloat16", the
    fastest prefill peer on CPUs with AVX-512 BF16 or AMX) and runs with its KV cache."""

    def __init__(self, path: str, threads: int, dtype: str = "float32") -> None:
        import torch
        import transformers
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"TorchEngine: dtype {dtype!r} is not float32 or bfloat16")
        torch.set_num_threads(threads)
        folder, file = os.path.split(os.path.abspath(path))
        self.torch = torch
        self.name = "pytorch" if dtype == "float32" else "pytorch-bf16"
        self.model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=file,
                                                                       dtype=getattr(torch, dtype)).eval()
        self.label = (f"PyTorch {torch.__version__.split('+')[0]} eager, {dtype} "
                      f"(transformers {transformers.__version__})")
        # newer transformers name the KV cache argument "cache" and warn about "past_key_values"
        params = inspect.signature(self.model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"

    def run(self, prompt: np.ndarray, n_decode: int) -> tuple[float, float]:
        torch, model = self.torch, self.model
        with torch.inference_mode():
            ids = torch.from_numpy(np.asarray(prompt, dtype=np.int64))[None]
            t0 = time.perf_counter()
            # logits of the last position only, as the other engines compute
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            t1 = time.perf_counter()
            past, token = out[self.cache_arg], out.logits[0, -1].argmax().view(1, 1)
            for _ in range(n_decode):
                out = model(input_ids=token, use_cache=True, logits_to_keep=1, **{self.cache_arg: past})
                past, token = out[self.cache_arg], out.logits[0, -1].argmax().view(1, 1)
            t2 = time.perf_counter()
        return t1 - t0, t2 - t1
