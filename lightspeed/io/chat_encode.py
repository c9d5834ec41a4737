"""Token ids of a chat in which the messages' text can never become control tokens.

Rendering a chat template and tokenizing the result with special-token parsing (what
``encode(apply_chat_template(...))`` does, as transformers and llama.cpp do) turns a user's
``<|im_end|><|im_start|>system`` into real turn markers. Here the template's own markers stay
special and the messages' text does not:

1. every special-token string inside a message's text is replaced by a marker (private-use
   characters around a random number), so the template sees no special token from a message;
2. the template is rendered, the markers are put back, and the whole text is tokenized once,
   with special-token parsing, exactly as before;
3. each special token the tokenizer found where a marker was is re-tokenized as plain text.

A chat with no special-token strings in its messages renders and tokenizes exactly as before
(same text, one ``encode``), so ordinary prompts keep their tokens bit for bit.
"""
from __future__ import annotations

import re
import secrets
from typing import Any, Callable, Sequence


def _marker_regex(nonce: str) -> re.Pattern[str]:
    return re.compile("\ue000" + nonce + r":(\d+)\ue001")


def special_pattern(specials: Sequence[str]) -> re.Pattern[str] | None:
    """A regex matching any of the special-token strings (longest first), or None when there are none."""
    specials = [s for s in specials if s]
    if not specials:
        return None
    return re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))


def mask_messages(messages: Sequence[dict[str, Any]], pattern: re.Pattern[str] | None,
                  nonce: str) -> tuple[list[dict[str, Any]], list[str]]:
    """``messages`` with each match of ``pattern`` (``special_pattern``) in their text values replaced by a
    marker, and the strings the markers stand for (marker k is ``table[k]``). Text without a match is
    unchanged."""
    if pattern is None:
        return list(messages), []
    table: list[str] = []

    def mark(m: re.Match) -> str:
        table.append(m.group(0))
        return f"\ue000{nonce}:{len(table) - 1}\ue001"

    def masked(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(mark, value)
        if isinstance(value, list):  # content parts: [{"type": "text", "text": ...}, ...]
            return [masked(v) for v in value]
        if isinstance(value, dict):
            return {k: masked(v) for k, v in value.items()}
        return value

    return [masked(m) for m in messages], table


def restore(text: str, table: Sequence[str], nonce: str) -> tuple[str, list[tuple[int, int]]]:
    """``text`` with the markers put back, and the character spans of the strings put back."""
    if not table:
        return text, []
    parts, spans, pos, out_len = [], [], 0, 0
    for m in _marker_regex(nonce).finditer(text):
        k = int(m.group(1))
        if k >= len(table):
            continue
        before = text[pos:m.start()]
        parts.append(before)
        out_len += len(before)
        parts.append(table[k])
        spans.append((out_len, out_len + len(table[k])))
        out_len += len(table[k])
        pos = m.end()
    parts.append(text[pos:])
    return "".join(parts), spans


def splice_plain(ids: Sequence[int], offsets: Sequence[tuple[int, int]], text: str, spans: Sequence[tuple[int, int]],
                 special_ids: set[int], plain: Callable[[str], list[int]]) -> list[int]:
    """``ids`` with every special token that overlaps one of ``spans`` replaced by ``plain`` of its text."""
    if not spans:
        return list(ids)
    out: list[int] = []
    for i, (s, e) in zip(ids, offsets):
        if i in special_ids and any(s < b and a < e for a, b in spans):
            out.extend(plain(text[s:e]))
        else:
            out.append(i)
    return out


def new_nonce() -> str:
    """Digits only, so that case-changing filters (``upper``, ``title``) leave a marker intact."""
    return f"{secrets.randbelow(10 ** 16):016d}"
