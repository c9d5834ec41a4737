"""``generate`` and ``chat`` on the engine (lightspeed.engine.local): the same text as the direct generation loop
(greedy and seeded sampling, stop strings, a JSON schema), a chat's later turns prefilled from the prefix cache,
cancellation freeing the slot, and the CLI commands going through it. On the tiny random Llama of
test_generate_api_cli (a Hugging Face folder with a byte-level tokenizer)."""
from __future__ import annotations

import io
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_generate_api_cli import folder, hf_greedy  # noqa: E402,F401 - the tiny model's fixture and reference

from lightspeed import api, cli  # noqa: E402
from lightspeed.engine import local as local_engine  # noqa: E402
from lightspeed.engine.local import EngineChat, LocalEngine  # noqa: E402
from lightspeed.generate import ContextFullError  # noqa: E402


@pytest.fixture(scope="module")
def model(folder):  # noqa: F811
    return api.load(folder[0], ctx=96, max_chunk=16, progress=False)


@pytest.fixture()
def local(model):
    with LocalEngine(model) as eng:
        yield eng


def test_greedy_text_equals_the_direct_loop_and_transformers(model, local, folder):  # noqa: F811
    ids = model.prompt_ids("Hello, wörld")
    gen = local.generate(ids, max_tokens=12)
    pieces = list(gen)
    direct = model.generate("Hello, wörld", max_tokens=12)
    direct.run()
    assert gen.token_ids == direct.token_ids == hf_greedy(folder[1], ids, 12)
    assert "".join(pieces) == gen.text == direct.text and gen.finish_reason == direct.finish_reason == "length"
    s = gen.stats
    assert s.prompt_tokens == len(ids) and s.generated_tokens == 12 and s.decode_steps == 11
    assert s.prefill_seconds > 0 and s.decode_seconds > 0


@pytest.mark.parametrize("options", [dict(temperature=1.3, top_k=30, top_p=0.9, seed=5),
                                     dict(temperature=0.8, min_p=0.05, repetition_penalty=1.2, seed=9),
                                     dict(stop=["e"], temperature=1.0, seed=2)])
def test_sampled_text_equals_the_direct_loop(model, local, options):
    gen = local.generate(model.prompt_ids("abc"), max_tokens=20, **options)
    direct = model.generate("abc", max_tokens=20, **options)
    assert gen.run() == direct.run() and gen.token_ids == direct.token_ids
    assert gen.finish_reason == direct.finish_reason


def test_chat_turns_reuse_the_cached_conversation(model, local):
    chat = EngineChat(local, system="be brief")
    direct = model.chat_session(system="be brief")
    first = chat.send("hi there", max_tokens=6)
    assert first.run() == direct.send("hi there", max_tokens=6).run()
    assert first.stats.cached_tokens == 0
    second = chat.send("more", max_tokens=6)
    assert second.run() == direct.send("more", max_tokens=6).run()
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant", "user", "assistant"]
    # what the first turn ran (its prompt and reply) and the second prompt share came from the prefix cache,
    # in whole 32-token blocks
    ran = first.prompt_ids + first.token_ids
    common = next((i for i, (a, b) in enumerate(zip(ran, second.prompt_ids)) if a != b), len(ran))
    assert second.stats.cached_tokens == common // 32 * 32 > 0
    assert second.stats.prompt_tokens == len(second.prompt_ids) - second.stats.cached_tokens
    chat.reset()
    assert chat.messages == [{"role": "system", "content": "be brief"}]


def test_a_prompt_that_fills_the_context_is_refused(model, local):
    with pytest.raises(ContextFullError, match="96 tokens"):
        local.generate(list(range(3, 99)), max_tokens=4)
    gen = local.generate(list(range(3, 90)), max_tokens=50)  # 87 tokens: 9 positions left
    gen.run()
    # one token per free position, and the last one sampled, which needs no row of its own
    assert gen.finish_reason == "context" and len(gen.token_ids) == 96 - 87 + 1


def test_closing_a_stream_frees_the_slot(model, local):
    import threading
    release = threading.Event()
    held = local.engine.call(lambda: release.wait(30))  # the engine thread waits here, between turns
    gen = local.generate(model.prompt_ids("abc"), max_tokens=80)
    gen.close()  # the consumer goes away before its first piece
    release.set()
    held.result(timeout=30)
    again = local.generate(model.prompt_ids("abc"), max_tokens=5)  # the only slot is free for the next one
    assert len(again.run()) > 0 and again.finish_reason == "length"
    assert gen.seq.cancelled and gen.seq.token_ids == [] and local.engine.stats()["active"] == 0


def test_an_engine_error_is_raised_to_the_consumer(model, local):
    gen = local.generate([3, 4, model.config.vocab_size + 7], max_tokens=3)
    with pytest.raises(ValueError, match="prefill failed"):
        gen.run()


def test_the_cli_generates_on_the_engine(folder, monkeypatch, capsys):  # noqa: F811
    made = []

    class Counting(LocalEngine):
        def generate(self, ids, **options):
            made.append(ids)
            return super().generate(ids, **options)

    monkeypatch.setattr(local_engine, "LocalEngine", Counting)
    assert cli.main(["generate", "--model", str(folder[0]), "--ctx", "96", "--max-tokens", "7", "--json",
                     "Hello"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(made) == 1 and out["prompt_ids"] == made[0] and len(out["token_ids"]) == 7
    assert out["token_ids"] == hf_greedy(folder[1], made[0], 7)
    assert out["timings"]["generated_tokens"] == 7 and out["timings"]["decode_tokens_per_s"] > 0
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\nwhat next\n"))
    assert cli.main(["chat", "--model", str(folder[0]), "--ctx", "96", "--max-tokens", "4"]) == 0
    assert len(made) == 3  # one engine generation per turn
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
