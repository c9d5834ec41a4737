"""GPT-2's byte-level BPE pieces: printable characters that stand for bytes (a space is "Ġ", and so on)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

__all__ = ["gpt2_byte_decoder", "is_byte_level"]


@lru_cache(maxsize=1)
def gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's table from the printable characters of byte-level pieces back to bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def is_byte_level(backend: Any) -> bool:
    """Whether a ``tokenizers.Tokenizer`` decodes with that table (a byte-level BPE)."""
    decoder = getattr(backend, "decoder", None)
    return type(decoder).__name__ == "ByteLevel" or "ByteLevel" in repr(decoder)
