"""``lightspeed bench --backend cuda|opencl``: the device's memory bandwidth (its own copy-kernel probe,
backend/gpu/probe.py), then prefill and decode tokens/s of the model on that backend with the KV cache on
the device (backend/gpu/resident.py), and decode as a percentage of the bandwidth limit (weight bytes per
token / measured bandwidth)."""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import numpy as np

PROBE_BYTES = {"cuda": 1 << 30, "opencl": 1 << 27}


def run_gpu_bench(backend: str, model: str | None, prompt_tokens: int, decode_tokens: int, runs: int,
                  probe_reps: int, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    """The report of ``lightspeed bench --backend BACKEND`` as a JSON-ready dict."""
    from ..api import default_model_path
    from ..backend.gpu.availability import require_runnable
    from ..backend.gpu.probe import device_bandwidth
    from ..backend.gpu.resident import ResidentLM
    from ..models import load_model
    from .runner import weight_bytes_per_token
    if prompt_tokens < 1 or decode_tokens < 1 or runs < 1:
        raise ValueError(f"bench: prompt tokens ({prompt_tokens}), decode tokens ({decode_tokens}) and runs "
                         f"({runs}) must be positive")
    require_runnable(backend)
    path = os.path.abspath(model) if model else default_model_path()
    log(f"measuring {backend} device bandwidth")
    probe = device_bandwidth(backend, PROBE_BYTES[backend], probe_reps)
    lm = load_model(path, tokenizer=False)
    per_token = weight_bytes_per_token(lm.weights.file.tensors) if hasattr(lm.weights, "file") else None
    ctx = prompt_tokens + decode_tokens
    chunk = min(prompt_tokens, 512)
    log(f"compiling for {backend}")
    t0 = time.perf_counter()
    step = ResidentLM(lm.compile(ctx, max_chunk=chunk, backend=backend, kv_update="scatter"))
    compile_s = time.perf_counter() - t0
    prompt = np.random.default_rng(seed).integers(0, lm.config.vocab_size, prompt_tokens)
    prefill, decode = [], []
    for r in range(runs + 1):  # the first run is untimed (lazy loading, first launches)
        step.reset()
        t0 = time.perf_counter()
        for start in range(0, prompt_tokens, chunk):
            logits = step.run(prompt[start:start + chunk], start)
        t1 = time.perf_counter()
        token = int(np.argmax(logits[-1]))
        for k in range(decode_tokens):
            token = int(np.argmax(step.run([token], prompt_tokens + k)[-1]))
        t2 = time.perf_counter()
        if r:
            prefill.append(prompt_tokens / (t1 - t0))
            decode.append(decode_tokens / (t2 - t1))
            log(f"run {r}/{runs}: {decode[-1]:.1f} tok/s decode, {prefill[-1]:.1f} tok/s prefill")
    report: dict[str, Any] = {
        "backend": backend, "model": path, "prompt_tokens": prompt_tokens, "decode_tokens": decode_tokens,
        "runs": runs, "compile_s": compile_s, "bandwidth": probe.as_dict(),
        "bandwidth_gb_per_s": probe.best_gb_per_s,
        "decode_tokens_per_s": statistics.median(decode), "decode_tokens_per_s_best": max(decode),
        "prefill_tokens_per_s": statistics.median(prefill), "prefill_tokens_per_s_best": max(prefill),
        "weight_bytes_per_token": per_token, "kv_cache": "on the device (kv_update=scatter)",
        "decode_replays_a_recording": step.graph is not None, "recording_error": step.graph_error}
    if per_token:
        limit = probe.best_gb_per_s * 1e9 / per_token
        report.update(limit_tokens_per_s=limit, percent_of_limit=100 * report["decode_tokens_per_s"] / limit)
    return report


def format_gpu_text(r: dict[str, Any]) -> str:
    """The report as a few lines of text."""
    lines = [f"backend {r['backend']}: {r['model']}",
             f"device bandwidth (copy probe): {r['bandwidth_gb_per_s']:.1f} GB/s",
             f"decode: {r['decode_tokens_per_s']:.1f} tok/s (best {r['decode_tokens_per_s_best']:.1f})",
             f"prefill: {r['prefill_tokens_per_s']:.1f} tok/s over {r['prompt_tokens']} tokens"]
    if "percent_of_limit" in r:
        lines.append(f"decode is {r['percent_of_limit']:.1f}% of the bandwidth limit of "
                     f"{r['limit_tokens_per_s']:.0f} tok/s ({r['weight_bytes_per_token'] / 1e6:.0f} MB per token)")
    return "\n".join(lines)
