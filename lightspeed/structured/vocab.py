"""llguidance's tokenizer built from a model's ``lightspeed.io.Tokenizer``.

Every Lightspeed tokenizer wraps a Hugging Face ``tokenizers`` backend: the model folder's
tokenizer.json as is, or one built from the GGUF vocabulary (``io.gguf_vocab``). llguidance reads
that backend's JSON directly, which gives it each token's bytes exactly as the model's decoder
produces them. Should it refuse the JSON (a normalizer or decoder it does not know), the tokenizer
is built instead from each token's bytes, recovered from the vocabulary: byte-level pieces through
GPT-2's byte table, SentencePiece pieces with "▁" as a space and ``<0xNN>`` byte tokens.

The tokens that end a sequence (end of sequence, end of turn) are the grammar's end: the mask
allows them exactly when the text so far is a complete sentence of the grammar.
"""
from __future__ import annotations

import re
from typing import Any

from ..io.byte_level import gpt2_byte_decoder, is_byte_level

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tokenizer: Any, n_vocab: int) -> list[bytes]:
    """The bytes of each of the ``n_vocab`` token ids (b"" for an id the vocabulary lacks; a special
    token's bytes are its text)."""
    backend = tokenizer.backend
    specials = set(tokenizer.special_tokens)
    table = gpt2_byte_decoder() if is_byte_level(backend) else None
    out: list[bytes] = []
    for i in range(n_vocab):
        piece = backend.id_to_token(i)
        if piece is None:
            out.append(b"")
        elif i in specials:
            out.append(piece.encode("utf-8"))
        elif table is not None and all(c in table for c in piece):
            out.append(bytes(table[c] for c in piece))
        elif m := _BYTE_TOKEN.fullmatch(piece):
            out.append(bytes([int(m.group(1), 16)]))
        else:
            out.append(piece.replace("▁", " ").encode("utf-8"))
    return out


class _VocabWrapper:
    """What llguidance's ``TokenizerWrapper`` reads: token bytes, the end and special ids, and encoding."""

    def __init__(self, tokenizer: Any, n_vocab: int, stop_ids: list[int]):
        self._tok = tokenizer
        self.tokens = token_bytes(tokenizer, n_vocab)
        self.eos_token_id = stop_ids[0]
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = sorted(set(tokenizer.special_tokens) | set(stop_ids))

    def __call__(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)


def grammar_tokenizer(tokenizer: Any, n_vocab: int) -> Any:
    """An ``llguidance.LLTokenizer`` for ``tokenizer`` over ``n_vocab`` ids (the model's logits; ids the
    tokenizer lacks are never allowed). Building it takes about a second for a 50k vocabulary (3 s for
    262k): build it once per model."""
    import llguidance

    stop_ids = sorted(tokenizer.stop_ids)
    if not stop_ids:
        raise ValueError("the tokenizer has no end-of-sequence token, which a grammar needs to end the output")
    n_vocab = max(n_vocab, tokenizer.vocab_size)
    try:
        return llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=n_vocab, eos_token=stop_ids)
    except Exception:  # noqa: BLE001 - a tokenizer.json llguidance cannot read: build it from the bytes
        return from_token_bytes(tokenizer, n_vocab)


def from_token_bytes(tokenizer: Any, n_vocab: int) -> Any:
    """The same tokenizer built from the recovered token bytes (the fallback of ``grammar_tokenizer``)."""
    import llguidance

    stop_ids = sorted(tokenizer.stop_ids)
    n_vocab = max(n_vocab, tokenizer.vocab_size)
    wrapper = llguidance.TokenizerWrapper(_VocabWrapper(tokenizer, n_vocab, stop_ids))
    return llguidance.LLTokenizer(wrapper, n_vocab=n_vocab, eos_token=stop_ids)
