"""A cache of the key/value rows of token prefixes, shared by every sequence of a server.

Requests often share a beginning: the system prompt, the earlier turns of a chat. The key and value
rows of position ``p`` depend only on the tokens ``0 .. p`` (attention is causal and positions are
absolute), so a sequence whose first tokens were seen before can copy those rows instead of
computing them again, and prefill only the rest.

Rows are kept in blocks of ``block`` tokens. A block is named by a hash of every token up to its end
(a chain: each block's key hashes its parent's key and its own tokens), so a block is found only
behind the exact same prefix. ``load`` copies the longest run of cached blocks into a sequence's
cache rows; ``store`` copies the full blocks of a sequence's rows into the cache (those it lacks).
The cache holds at most ``max_bytes`` of rows and evicts the least recently used block first. A
lookup touches a prefix's blocks from the last to the first, so a prefix's first blocks are always
more recent than its later ones: eviction takes the ends of prefixes before their beginnings, and
no cached block is ever unreachable because its parent went first.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

DEFAULT_BLOCK = 32


class PrefixCache:
    """Cached KV rows by token prefix: blocks of ``block`` tokens, at most ``max_bytes`` of rows, LRU."""

    def __init__(self, max_bytes: int, block: int = DEFAULT_BLOCK):
        if block < 1 or max_bytes < 0:
            raise ValueError(f"PrefixCache: block ({block}) must be >= 1 and max_bytes ({max_bytes}) >= 0")
        self.block, self.max_bytes = int(block), int(max_bytes)
        self._blocks: OrderedDict[bytes, dict[str, np.ndarray]] = OrderedDict()  # oldest first
        self.bytes = 0
        self.lookups = 0       # load() calls
        self.hit_tokens = 0    # tokens whose rows came from the cache
        self.stored_blocks = 0
        self.evicted_blocks = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def _keys(self, ids: Sequence[int], n_blocks: int) -> list[bytes]:
        keys, prev = [], b""
        b = self.block
        for i in range(n_blocks):
            chunk = np.asarray(ids[i * b:(i + 1) * b], dtype=np.int64).tobytes()
            prev = hashlib.blake2b(prev + chunk, digest_size=16).digest()
            keys.append(prev)
        return keys

    def match(self, ids: Sequence[int], limit: int | None = None) -> int:
        """How many leading tokens of ``ids`` (at most ``limit``) have cached rows, in whole blocks."""
        return len(self._found(ids, limit)) * self.block

    def _found(self, ids: Sequence[int], limit: int | None) -> list[bytes]:
        n = len(ids) if limit is None else max(0, min(len(ids), int(limit)))
        found = []
        for key in self._keys(ids, n // self.block):
            if key not in self._blocks:
                break
            found.append(key)
        return found

    def load(self, ids: Sequence[int], caches: dict[str, np.ndarray], limit: int | None = None,
             axis: int = 0) -> int:
        """Copy the cached rows of the longest cached prefix of ``ids`` (at most ``limit`` tokens) into
        rows ``0 ..`` of ``caches`` (one sequence's arrays, positions along ``axis``: 0 for ``[ctx, ...]``,
        1 for head-major ``[kv_heads, ctx, ...]``); the number of tokens copied."""
        self.lookups += 1
        found = self._found(ids, limit)
        b = self.block
        for i, key in enumerate(found):
            rows = self._blocks[key]
            at = _rows(axis, i * b, (i + 1) * b)
            for name, dst in caches.items():
                dst[at] = rows[name]
        for key in reversed(found):  # the first blocks end up the most recent (see the module docstring)
            self._blocks.move_to_end(key)
        self.hit_tokens += len(found) * b
        return len(found) * b

    def store(self, ids: Sequence[int], caches: dict[str, np.ndarray], n: int | None = None, axis: int = 0) -> int:
        """Cache the rows of the full blocks of ``ids[:n]`` (rows ``0 .. n-1`` of ``caches`` along ``axis``
        hold them) that are not cached yet; the number of blocks added. Blocks are stored as ``caches`` lay
        them out, so one cache is loaded and stored with one ``axis``."""
        n = len(ids) if n is None else min(int(n), len(ids))
        keys = self._keys(ids, n // self.block)
        if not keys or self.max_bytes == 0:
            return 0
        b, added = self.block, 0
        for i, key in enumerate(keys):
            if key in self._blocks:
                continue
            at = _rows(axis, i * b, (i + 1) * b)
            rows = {name: np.array(a[at]) for name, a in caches.items()}
            size = sum(r.nbytes for r in rows.values())
            if size > self.max_bytes:
                return added
            self._blocks[key] = rows
            self.bytes += size
            added += 1
        for key in reversed(keys):
            self._blocks.move_to_end(key)
        self.stored_blocks += added
        self._evict(protect=set(keys))
        return added

    def _evict(self, protect: set[bytes]) -> None:
        """Drop least recently used blocks until the rows fit (the blocks just stored go last)."""
        order = [k for k in self._blocks if k not in protect] + [k for k in self._blocks if k in protect]
        for key in order:
            if self.bytes <= self.max_bytes:
                return
            rows = self._blocks.pop(key)
            self.bytes -= sum(r.nbytes for r in rows.values())
            self.evicted_blocks += 1

    def stats(self) -> dict:
        return {"blocks": len(self._blocks), "block_tokens": self.block, "bytes": self.bytes,
                "max_bytes": self.max_bytes, "lookups": self.lookups, "hit_tokens": self.hit_tokens,
                "stored_blocks": self.stored_blocks, "evicted_blocks": self.evicted_blocks}


def _rows(axis: int, start: int, stop: int) -> tuple:
    """The index of rows ``start .. stop - 1`` along ``axis``."""
    return (slice(None),) * axis + (slice(start, stop),)
