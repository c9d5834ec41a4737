"""The generation loop: streaming UTF-8, stop ids and strings, max tokens, chunked prefill,
KV-cache reuse and context limits (with a scripted stand-in for the compiled model), and
greedy generation of a real tiny model against transformers."""
from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers

from lightspeed.generate import ContextFullError, Generation, KVCache, SamplingParams
from lightspeed.io import Tokenizer


def byte_tokenizer() -> Tokenizer:
    """One token per byte (so a multi-byte character spans several tokens), plus <eos> = 256."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Backend(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<eos>"])
    return Tokenizer(backend, eos_token="<eos>")


class ScriptedStep:
    """Stands in for a CompiledLM: after the token at position p the logits favour ``script[p + 1]``
    (or, with ``noise``, are random but fixed per position). Records every call."""

    def __init__(self, script: list[int], vocab: int = 257, ctx: int = 256, max_chunk: int = 8, noise: bool = False):
        self.script, self.vocab_size, self.ctx, self.max_chunk, self.noise = script, vocab, ctx, max_chunk, noise
        self.calls: list[tuple[list[int], int]] = []

    def new_caches(self) -> dict:
        return {}

    def run(self, tokens, pos, caches):
        tokens = [int(t) for t in tokens]
        assert 1 <= len(tokens) <= self.max_chunk and pos + len(tokens) <= self.ctx
        self.calls.append((tokens, pos))
        last = pos + len(tokens) - 1
        if self.noise:
            row = np.random.default_rng(last).standard_normal(self.vocab_size).astype(np.float32)
        else:
            row = np.zeros(self.vocab_size, dtype=np.float32)
            row[self.script[last + 1] if last + 1 < len(self.script) else 0] = 10.0
        return row[None], caches


TOK = byte_tokenizer()
EOS = TOK.eos_id
PROMPT = TOK.encode("Say: ")
TARGET = "héllo wörld 🙂 done"


def scripted(target: str = TARGET, **kw) -> tuple[ScriptedStep, list[int]]:
    ids = TOK.encode(target)
    return ScriptedStep(PROMPT + ids + [EOS], **kw), ids


def test_streamed_pieces_are_whole_characters():
    step, ids = scripted()
    assert len(ids) > len(TARGET)  # several characters span several tokens
    gen = Generation(step, TOK, PROMPT, max_tokens=100)
    pieces = list(gen)
    assert "".join(pieces) == TARGET == gen.text
    assert all("\ufffd" not in p for p in pieces)
    assert gen.token_ids == ids and gen.finish_reason == "stop"
    assert len(pieces) < len(ids)  # the bytes of a character were held back, then emitted together
    assert gen.stats.generated_tokens == len(ids) and gen.stats.prompt_tokens == len(PROMPT)


def test_max_tokens_and_calls():
    step, ids = scripted()
    gen = Generation(step, TOK, PROMPT, max_tokens=5)
    text = gen.run()
    assert gen.token_ids == ids[:5] and gen.finish_reason == "length"
    assert text == TOK.decode(ids[:5]).rstrip("\ufffd")
    # one prefill call, then one call per generated token except the last
    assert step.calls[0] == (PROMPT, 0)
    assert [c[1] for c in step.calls[1:]] == list(range(len(PROMPT), len(PROMPT) + 4))
    assert Generation(scripted()[0], TOK, PROMPT, max_tokens=0).run() == ""


def test_stop_strings_and_stop_ids():
    step, ids = scripted()
    gen = Generation(step, TOK, PROMPT, max_tokens=100, stop_strings=["wörld"])
    assert gen.run() == "héllo " and gen.finish_reason == "stop"
    o_id = TOK.encode("o")[0]
    gen = Generation(scripted()[0], TOK, PROMPT, max_tokens=100, stop_ids=[o_id])
    assert gen.run() == "héll" and gen.finish_reason == "stop"


def test_long_prompts_run_in_chunks():
    prompt = TOK.encode("a much longer prompt than one chunk")
    step = ScriptedStep(prompt + TOK.encode("ok") + [EOS], max_chunk=8)
    assert Generation(step, TOK, prompt).run() == "ok"
    prefill = [c for c in step.calls if len(c[0]) > 1 or c[1] < len(prompt)]
    assert [c[1] for c in prefill] == list(range(0, len(prompt), 8))
    assert [c[0] for c in prefill] == [prompt[i:i + 8] for i in range(0, len(prompt), 8)]


def test_cache_reuse_runs_only_new_tokens():
    step, ids = scripted()
    cache = KVCache(step)
    first = Generation(step, TOK, PROMPT, max_tokens=4, cache=cache)
    first.run()
    assert cache.tokens == PROMPT + ids[:3]   # the last sampled token was never run
    step.calls.clear()
    follow = PROMPT + ids[:6]
    second = Generation(step, TOK, follow, max_tokens=2, cache=cache)
    second.run()
    assert second.stats.cached_tokens == len(PROMPT) + 3
    assert step.calls[0] == (ids[3:6], len(PROMPT) + 3)
    assert second.token_ids == ids[6:8]
    # a prompt that diverges drops the stale suffix
    step.calls.clear()
    Generation(step, TOK, PROMPT + [ids[0] + 1], max_tokens=1, cache=cache).run()
    assert step.calls[0] == ([ids[0] + 1], len(PROMPT))


def test_context_limits():
    step, ids = scripted(ctx=len(PROMPT) + 3)
    gen = Generation(step, TOK, PROMPT, max_tokens=100)
    gen.run()
    assert gen.finish_reason == "context" and len(gen.token_ids) == 4
    with pytest.raises(ContextFullError, match="context bound"):
        Generation(ScriptedStep(PROMPT, ctx=len(PROMPT) - 1), TOK, PROMPT).run()


def test_seeded_sampling_through_the_loop():
    def sample(seed):
        g = Generation(ScriptedStep([], noise=True), None, PROMPT, SamplingParams(temperature=1.0, seed=seed),
                       max_tokens=12, stop_ids=[])
        g.run()
        return g.token_ids
    assert sample(3) == sample(3)
    assert sample(3) != sample(4)
    greedy = Generation(ScriptedStep([], noise=True), None, PROMPT, max_tokens=3, stop_ids=[])
    greedy.run()
    want = [int(np.argmax(np.random.default_rng(len(PROMPT) - 1 + k).standard_normal(257))) for k in range(3)]
    assert greedy.token_ids == want


def test_on_finish_and_empty_prompt():
    step, _ = scripted()
    seen = []
    gen = Generation(step, TOK, PROMPT, max_tokens=3)
    gen.on_finish = seen.append
    gen.run()
    assert seen == [gen]
    with pytest.raises(ValueError, match="no tokens"):
        Generation(step, TOK, [])


# a real model -----------------------------------------------------------------------------------
def test_greedy_generation_matches_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from lightspeed.models import load_model
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    ref = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.5)
    ref.save_pretrained(tmp_path)
    prompt = [5, 9, 33, 2, 40]
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                            eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    step = load_model(tmp_path).compile(32, max_chunk=4)
    gen = Generation(step, None, prompt, max_tokens=12, stop_ids=[])
    gen.run()
    assert gen.token_ids == want
    # continuing from the cache gives what a fresh cache gives
    cache = KVCache(step)
    Generation(step, None, prompt, max_tokens=6, stop_ids=[], cache=cache).run()
    again = Generation(step, None, prompt + want[:6], max_tokens=6, stop_ids=[], cache=cache)
    again.run()
    assert again.stats.cached_tokens == len(prompt) + 5 and again.token_ids == want[6:]
