"""Building a ``tokenizers.Tokenizer`` from the vocabulary a GGUF file stores.

Two GGUF tokenizer models are supported:

- ``gpt2``: byte-level BPE (SmolLM2, Llama 3, Qwen2, GPT-2...). Tokens are written in the
  byte-to-unicode alphabet ("Ġ" is a space); ``merges`` rank the pairs. The text is first
  split by a pre-tokenizer regex that depends on ``tokenizer.ggml.pre`` (see ``PRE_TOKENIZERS``).
- ``llama``: SentencePiece-style BPE (Llama 2, Mistral, Gemma). Tokens use "▁" for a
  space; pieces merge in order of their ``scores``; characters outside the vocabulary
  fall back to ``<0xXX>`` byte tokens. A "▁" is prepended to each run of plain text
  when ``add_space_prefix`` is set (as llama.cpp does after every special token).

Control tokens (type 3) and user-defined tokens (type 4) are matched verbatim in the
input text, like Hugging Face added tokens; control tokens count as special (dropped
by ``decode(..., skip_special_tokens=True)``).
"""
from __future__ import annotations

import warnings

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from .errors import ModelFormatError
from .gguf import GGUFTokenizerInfo

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Split patterns of the byte-level families (the GPT-2 one is built into ByteLevel(use_regex=True)).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _gpt2():
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2():
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _split_then_bytes(pattern: str):
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# tokenizer.ggml.pre -> (pre-tokenizer factory, ignore_merges: whole words in the vocabulary skip BPE)
PRE_TOKENIZERS = {
    **{name: (_gpt2, False) for name in ("default", "gpt-2", "gpt2", "mpt", "olmo", "jais")},
    **{name: (_digits_then_gpt2, False) for name in ("smollm", "starcoder", "refact", "command-r", "codeshell",
                                                      "exaone", "minerva")},
    **{name: (lambda: _split_then_bytes(_LLAMA3_SPLIT), True) for name in ("llama-bpe", "llama3", "smaug-bpe",
                                                                           "dbrx", "falcon3")},
    **{name: (lambda: _split_then_bytes(_QWEN2_SPLIT), False) for name in ("qwen2", "stablelm2", "deepseek-r1-qwen",
                                                                          "megrez")},
}


def _vocab(info: GGUFTokenizerInfo) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, tok in enumerate(info.tokens):
        vocab.setdefault(tok, i)  # a repeated string keeps its first id
    return vocab


def _added_tokens(info: GGUFTokenizerInfo) -> list[AddedToken]:
    types = info.token_types or []
    out = []
    for i, kind in enumerate(types):
        if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and info.tokens[i]:
            out.append(AddedToken(info.tokens[i], special=kind == TOKEN_CONTROL, normalized=False))
    return out


def _post_processor(info: GGUFTokenizerInfo, byte_level: bool):
    steps = [processors.ByteLevel(trim_offsets=False)] if byte_level else []
    single, specials = "$A", []
    if info.add_bos and info.bos_id is not None:
        single = f"{info.tokens[info.bos_id]}:0 {single}"
        specials.append((info.tokens[info.bos_id], info.bos_id))
    if info.add_eos and info.eos_id is not None:
        single = f"{single} {info.tokens[info.eos_id]}:0"
        specials.append((info.tokens[info.eos_id], info.eos_id))
    if specials:
        pair = single + " " + single.replace("$A", "$B").replace(":0", ":1")
        steps.append(processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials))
    return processors.Sequence(steps) if steps else None


def _byte_level_bpe(info: GGUFTokenizerInfo, path: str) -> Backend:
    if info.merges is None:
        raise ModelFormatError(path, "a gpt2 (byte-level BPE) tokenizer needs tokenizer.ggml.merges")
    merges = []
    for k, m in enumerate(info.merges):
        parts = m.split(" ")
        if len(parts) != 2:
            raise ModelFormatError(path, f"tokenizer.ggml.merges[{k}] = {m!r} is not two tokens separated by a space")
        merges.append((parts[0], parts[1]))
    pre = info.pre or "default"
    if pre not in PRE_TOKENIZERS:
        warnings.warn(f"{path}: unknown pre-tokenizer {pre!r}; using the GPT-2 split, which may tokenize "
                      f"some text differently from the model's training", stacklevel=3)
    make_pre, ignore_merges = PRE_TOKENIZERS.get(pre, PRE_TOKENIZERS["default"])
    tok = Backend(models.BPE(vocab=_vocab(info), merges=merges, ignore_merges=ignore_merges))
    tok.pre_tokenizer = make_pre()
    tok.decoder = decoders.ByteLevel()
    return tok


def _spm_merges(info: GGUFTokenizerInfo, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges: every split of a piece into two vocabulary pieces, ranked by the
    merged piece's score (highest first), so BPE by rank reproduces merging by score."""
    scores = info.scores or [0.0] * len(info.tokens)
    types = info.token_types or [TOKEN_NORMAL] * len(info.tokens)
    ranked = []
    for piece, pid in vocab.items():
        if types[pid] not in (TOKEN_NORMAL, TOKEN_USER_DEFINED) or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[pid], pid, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _sentencepiece_bpe(info: GGUFTokenizerInfo, path: str) -> Backend:
    vocab = _vocab(info)
    unk = info.tokens[info.unk_id] if info.unk_id is not None else None
    tok = Backend(models.BPE(vocab=vocab, merges=_spm_merges(info, vocab), unk_token=unk, fuse_unk=True,
                             byte_fallback=True))
    steps = [normalizers.Prepend("▁")] if info.add_space_prefix else []
    tok.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
    dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if info.add_space_prefix:
        dec.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(dec)
    return tok


def backend_from_gguf(info: GGUFTokenizerInfo, path: str) -> Backend:
    """A ``tokenizers.Tokenizer`` equivalent to the GGUF vocabulary ``info`` (from file ``path``)."""
    if info.model == "gpt2":
        tok = _byte_level_bpe(info, path)
    elif info.model == "llama":
        tok = _sentencepiece_bpe(info, path)
    else:
        raise NotImplementedError(f"{path}: GGUF tokenizer model (tokenizer.ggml.model) {info.model!r} is not "
                                  f"supported (supported: 'gpt2' byte-level BPE, 'llama' SentencePiece BPE); "
                                  f"load the model's tokenizer.json instead")
    tok.add_special_tokens([t for t in _added_tokens(info) if t.special])
    tok.add_tokens([t for t in _added_tokens(info) if not t.special])
    post = _post_processor(info, byte_level=info.model == "gpt2")
    if post is not None:
        tok.post_processor = post
    return tok
