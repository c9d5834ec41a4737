"""Token log-probabilities for OpenAI's ``logprobs``, shaped per endpoint (the engine computes them per
sampled token: ``lightspeed.engine.logprobs``).

Two response shapes:

- chat completions: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}, ...]}, ...], "refusal": None}``;
- legacy completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``,
  offsets counted in characters from the start of the completion (the prompt is not echoed).
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from ..engine.logprobs import TokenLogprob
from ..io.byte_level import gpt2_byte_decoder, is_byte_level

REPLACEMENT = "\ufffd"


class TokenText:
    """Each token's text and bytes, as OpenAI reports them: a token that holds part of a UTF-8 character
    has no text of its own, so its exact bytes are recovered from a byte-level vocabulary when there is
    one, and its text is written ``bytes:\\xNN...`` (as OpenAI does)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._byte_level = gpt2_byte_decoder() if is_byte_level(getattr(tokenizer, "backend", None)) else None
        self.lookup = lru_cache(maxsize=65536)(self._lookup)

    def _lookup(self, token: int) -> tuple[str, tuple[int, ...]]:
        text = self.tokenizer.decode([token])
        if REPLACEMENT not in text:
            return text, tuple(text.encode("utf-8"))
        piece = self.tokenizer.id_to_token(token) or ""
        if self._byte_level is not None and piece and all(c in self._byte_level for c in piece):
            raw = bytes(self._byte_level[c] for c in piece)
            try:
                return raw.decode("utf-8"), tuple(raw)
            except UnicodeDecodeError:
                return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), tuple(raw)
        return text, tuple(text.encode("utf-8"))


def chat_logprobs(entries: Sequence[TokenLogprob], text: TokenText) -> dict:
    """Chat completions' ``logprobs`` object for ``entries``."""
    def one(token: int, logprob: float) -> dict:
        s, b = text.lookup(token)
        return {"token": s, "logprob": logprob, "bytes": list(b)}

    return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(i, lp) for i, lp in e.top]}
                        for e in entries], "refusal": None}


def completion_logprobs(entries: Sequence[TokenLogprob], text: TokenText) -> dict:
    """Legacy completions' ``logprobs`` object for ``entries``."""
    def name(token: int) -> str:
        return text.lookup(token)[0]

    return {"tokens": [name(e.token) for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{name(i): lp for i, lp in e.top} for e in entries],
            "text_offset": [e.offset for e in entries]}
