"""``lightspeed.structured`` without a model run: grammars compiled against SmolLM2's vocabulary, masks that
keep randomly sampled output inside a JSON schema, a regex and a forced tool call, batched masks equal to
one-at-a-time masks, the vocabulary bridge, every refusal as a GrammarError, and the tool-call parser."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from lightspeed.structured import (GrammarCompiler, GrammarError, GrammarLimits, MaskWorker, json_object,  # noqa: E402
                                   json_schema, lark, regex)
from lightspeed.structured.tools import (CallParser, Tool, call_grammar, check_tools, render_messages,  # noqa: E402
                                         split_calls, template_renders_tools)
from lightspeed.structured.vocab import from_token_bytes, grammar_tokenizer  # noqa: E402

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "pets": {"type": "array", "items": {"enum": ["cat", "dog"]},
                                                    "maxItems": 3}},
          "required": ["name", "age", "pets"], "additionalProperties": False}
WEATHER = Tool("get_weather", "The weather of a city", {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False})
ADD = Tool("add", None, {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                                          "b": {"type": "integer", "minimum": -99, "maximum": 99}},
                         "required": ["a", "b"], "additionalProperties": False})


@pytest.fixture(scope="module")
def tokenizer():
    import lightspeed.api as lsa
    from lightspeed.io import Tokenizer
    try:
        return Tokenizer.from_gguf(lsa.default_model_path())
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(tokenizer, tokenizer.vocab_size, GrammarLimits(max_source_bytes=4096))


def _sample(compiler, tokenizer, spec, seed: int, max_tokens: int = 200, batch: int = 1) -> list[tuple[str, bool]]:
    """Texts sampled from random logits under ``spec`` (``batch`` sequences, masks computed by a MaskWorker),
    each with whether its grammar completed."""
    grammar = compiler.compile(spec)
    rng = np.random.default_rng(seed)
    cons = [grammar.new_constraint() for _ in range(batch)]
    out: list[list[int]] = [[] for _ in cons]
    done = [False] * batch
    worker = MaskWorker()
    try:
        for _ in range(max_tokens):
            live = [k for k in range(batch) if not done[k]]
            if not live:
                break
            job = worker.start([cons[k] for k in live])
            if job is not None:
                job.result()
            for k in live:
                x = cons[k].apply(rng.standard_normal(compiler.n_vocab).astype(np.float32) * 3)
                finite = np.flatnonzero(np.isfinite(x))
                p = np.exp(x[finite] - x[finite].max())
                token = int(rng.choice(finite, p=p / p.sum()))
                if token in cons[k].stop_ids:
                    done[k] = True
                    continue
                cons[k].consume(token)
                out[k].append(token)
                done[k] = cons[k].finished
    finally:
        worker.close()
    return [(tokenizer.decode(o), d) for o, d in zip(out, done)]


def test_sampled_json_always_satisfies_the_schema(compiler, tokenizer) -> None:
    for seed in range(5):
        for text, complete in _sample(compiler, tokenizer, json_schema(PERSON), seed, batch=4):
            assert complete, text
            jsonschema.validate(json.loads(text), PERSON)
            assert text.startswith('{"name": "')  # the server's layout: ", " and ": ", no free whitespace


def test_regex_and_lark(compiler, tokenizer) -> None:
    for text, complete in _sample(compiler, tokenizer, regex(r"[0-9]{3}-(yes|no)"), 0, batch=3):
        assert complete and len(text) in (6, 7) and text[:3].isdigit() and text[4:] in ("yes", "no")
    grammar = 'start: "a" mid "z"\nmid: /[b-d]{1,4}/'
    for text, complete in _sample(compiler, tokenizer, lark(grammar), 1, batch=3):
        assert complete and text[0] == "a" and text[-1] == "z" and set(text[1:-1]) <= set("bcd"), text


def test_json_object_is_an_object(compiler, tokenizer) -> None:
    grammar = compiler.compile(json_object())
    c = grammar.new_constraint()
    allowed = c.allowed()
    assert allowed.any() and all(tokenizer.decode([int(i)]).startswith("{") for i in np.flatnonzero(allowed))


def test_forced_tool_call_parses(compiler, tokenizer) -> None:
    names = {"get_weather", "add"}
    for seed in range(3):
        for text, complete in _sample(compiler, tokenizer, call_grammar([WEATHER, ADD]), seed, batch=4):
            assert complete, text
            content, calls = split_calls(text, names)
            assert content == "" and len(calls) == 1, text
            streamed = split_calls(text, names, stream_arguments=True)  # the model's text, not re-serialised
            assert streamed[0] == content and [(n, json.loads(a)) for n, a in streamed[1]] == \
                [(n, json.loads(a)) for n, a in calls]
            name, args = calls[0]
            jsonschema.validate(json.loads(args), (WEATHER if name == "get_weather" else ADD).parameters)
    (text, _), = _sample(compiler, tokenizer, call_grammar([WEATHER, ADD], "add"), 7)
    assert split_calls(text, names)[1][0][0] == "add"


def test_batched_masks_equal_single_masks(compiler) -> None:
    grammar = compiler.compile(json_schema(PERSON))
    rng = np.random.default_rng(3)
    cons = [grammar.new_constraint() for _ in range(3)]
    for _ in range(12):  # advance each along its own random path
        for c in cons:
            c.consume(int(rng.choice(np.flatnonzero(c.allowed()))))
    single = [c.allowed().copy() for c in cons]
    for c in cons:
        c.fresh = False
    worker = MaskWorker()
    worker.fill(cons)
    worker.close()
    assert all(c.fresh for c in cons)
    for c, want in zip(cons, single):
        np.testing.assert_array_equal(c.allowed(), want)
    logits = rng.standard_normal(compiler.n_vocab).astype(np.float32)
    masked = cons[0].apply(logits)
    assert np.array_equal(np.isfinite(masked), single[0]) and np.array_equal(masked[single[0]], logits[single[0]])


def test_vocab_bridge_from_token_bytes_matches_tokenizer_json(tokenizer) -> None:
    a, b = grammar_tokenizer(tokenizer, tokenizer.vocab_size), from_token_bytes(tokenizer, tokenizer.vocab_size)
    assert a.vocab_size == b.vocab_size == tokenizer.vocab_size
    assert sorted(a.eos_tokens) == sorted(b.eos_tokens) == sorted(tokenizer.stop_ids)
    ids = list(range(0, tokenizer.vocab_size, 7))
    assert [a.decode_bytes([i]) for i in ids] == [b.decode_bytes([i]) for i in ids]


@pytest.mark.parametrize("spec, code, words", [
    (json_schema({"not": {"type": "string"}}), "invalid_grammar", "not"),
    (json_schema({"type": "objekt"}), "invalid_grammar", "objekt"),
    (json_schema({"type": "integer", "minimum": 5, "maximum": 1}), "invalid_grammar", "minimum"),
    (json_schema({"$ref": "#/$defs/missing"}), "invalid_grammar", "missing"),
    (json_schema([1, 2]), "invalid_schema", "JSON object"),
    (json_schema({"enum": ["x" * 100] * 50}), "grammar_too_large", "at most 4096"),
    (regex("[a-"), "invalid_grammar", "unclosed"),
    (lark("start: nothing_defined"), "invalid_grammar", "nothing_defined"),
    (lark("   "), "invalid_grammar", "non-empty"),
])
def test_refused_grammars(compiler, spec, code, words) -> None:
    with pytest.raises(GrammarError) as e:
        compiler.compile(spec)
    assert e.value.code == code and words in str(e.value)


def test_deeply_nested_schema_is_refused_not_a_crash(compiler) -> None:
    schema: dict = {"type": "string"}
    for _ in range(300):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    big = GrammarCompiler(compiler.tokenizer, compiler.n_vocab, GrammarLimits(max_source_bytes=1 << 20))
    big._llg_tokenizer = compiler.grammar_tokenizer
    with pytest.raises(GrammarError, match="recursion"):
        big.compile(json_schema(schema))


def test_grammar_the_vocabulary_cannot_write(tmp_path) -> None:
    from tiny_gguf import write_tiny_llama

    from lightspeed.io import Tokenizer
    write_tiny_llama(tmp_path / "tiny.gguf", seed=1)
    tok = Tokenizer.from_gguf(str(tmp_path / "tiny.gguf"))  # ASCII bytes and a few pieces
    tiny = GrammarCompiler(tok, tok.vocab_size)
    assert tiny.compile(regex("t1( t2)*")).new_constraint().allowed().any()
    with pytest.raises(GrammarError) as e:
        tiny.compile(regex("é+"))
    assert e.value.code == "grammar_unwritable" and "vocabulary" in str(e.value)


# tools ------------------------------------------------------------------------------------------------
def test_check_tools() -> None:
    check_tools([WEATHER, ADD])
    for bad, words in [([WEATHER, WEATHER], "two tools"), ([Tool("bad name", None, {})], "letters"),
                       ([Tool("f", None, {"type": "string"})], "object schema")]:
        with pytest.raises(ValueError, match=words):
            check_tools(bad)


def test_call_parser_streams_like_the_whole_text() -> None:
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    text = f"Let me add.\n{call}\n<tool_call>not json</tool_call> and <tool_call>{{\"name\": \"nope\"}}</tool_call>" \
           f" a <tool_ tag\n{call}"
    whole = split_calls(text, {"add"})
    assert whole[1] == [("add", '{"a": 1, "b": 2}')] * 2
    assert whole[0] == "Let me add.<tool_call>not json</tool_call> and " \
                       '<tool_call>{"name": "nope"}</tool_call> a <tool_ tag'
    for size in (1, 3, 11):
        parser = CallParser({"add"})
        events = []
        for i in range(0, len(text), size):
            events += parser.push(text[i:i + size])
        events += parser.flush()
        assert "".join(e[1] for e in events if e[0] == "text") == whole[0]
        assert [(e[1], e[2]) for e in events if e[0] == "call"] == whole[1]
    # an unfinished block (max_tokens cut it) stays text
    assert split_calls('Hi <tool_call>\n{"name": "add"', {"add"}) == ('Hi <tool_call>\n{"name": "add"', [])


def test_streamed_arguments_arrive_as_they_are_written() -> None:
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "s": "x}\\"{"}}\n</tool_call>'
    assert split_calls(text, {"add"}, stream_arguments=True) == ("", [("add", '{"a": 12, "s": "x}\\"{"}')])
    for size in (1, 2, 5):
        parser = CallParser({"add"}, stream_arguments=True)
        events = []
        for i in range(0, len(text), size):
            events += parser.push(text[i:i + size])
        events += parser.flush()
        kinds = [e[0] for e in events]
        assert kinds[0] == "call_start" and kinds[-1] == "call_done" and set(kinds[1:-1]) == {"arguments"}
        assert len(kinds) > 3  # the arguments came in several pieces
        assert "".join(e[1] for e in events if e[0] == "arguments") == events[-1][2] == '{"a": 12, "s": "x}\\"{"}'
    # cut short by max_tokens: the call ends with what was written
    assert split_calls(text[:50], {"add"}, stream_arguments=True) == ("", [("add", '{"a": 12,')])
    assert split_calls(text[:40], {"add"}, stream_arguments=True) == (text[:40], [])  # not begun: text


def test_default_rendering_of_tools_and_calls() -> None:
    from lightspeed.structured.tools import ToolCall
    messages = [{"role": "user", "content": "add 1 and 2"},
                {"role": "assistant", "content": "", "tool_calls": [ToolCall("c1", "add", '{"a": 1, "b": 2}')]},
                {"role": "tool", "tool_call_id": "c1", "content": "3"},
                {"role": "tool", "tool_call_id": "c1", "content": "again 3"}]
    out, extra = render_messages(messages, [ADD], template_tools=False)
    assert extra == {} and [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert '"name": "add"' in out[0]["content"] and "<tool_call>" in out[0]["content"]
    assert out[2]["content"] == '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert out[3]["content"] == "<tool_response>\n3\n</tool_response>\n<tool_response>\nagain 3\n</tool_response>"
    # a template with a tools section gets them as variables, and the calls as OpenAI dicts
    out, extra = render_messages(messages, [ADD], template_tools=True)
    assert extra["tools"][0]["function"]["name"] == "add" and out[1]["tool_calls"][0]["function"]["arguments"] == \
        {"a": 1, "b": 2} and out[2]["role"] == "tool"
    assert template_renders_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    assert not template_renders_tools("{% for m in messages %}{{ m.content }}{% endfor %}")
