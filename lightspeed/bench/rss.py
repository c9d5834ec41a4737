"""Where a process's resident memory goes: a breakdown of RSS by kind, for ``lightspeed bench``.

``/proc/self/smaps`` gives the resident bytes of every mapping; a mapping is the model file, a shared
library, another file, or anonymous memory (heap, Python's object arenas, numpy buffers, thread stacks).
Inside the anonymous part, ``mincore`` counts the resident pages under ranges the caller names (the
huge-page weight regions of lightspeed/memory.py, the KV cache arrays), so the rest is what Python
objects, malloc and the libraries' own allocations hold.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

import numpy as np

from .. import memory

_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$")


def _mappings_rss(smaps: str = "/proc/self/smaps") -> list[tuple[str, int]]:
    """(path or "" for anonymous, resident bytes) of every mapping; empty where smaps is missing."""
    out = []
    path = None
    try:
        with open(smaps) as f:
            for line in f:
                m = _HEADER.match(line)
                if m:
                    path = m.group(4).strip()
                elif line.startswith("Rss:") and path is not None:
                    out.append((path, int(line.split()[1]) * 1024))
    except OSError:
        return []
    return out


def _is_library(path: str) -> bool:
    name = os.path.basename(path)
    return name.endswith(".so") or ".so." in name


def _resident(arrays: Iterable[np.ndarray]) -> int:
    total = 0
    for a in arrays:
        got = memory.resident_bytes(int(a.ctypes.data), a.nbytes)
        total += got or 0
    return total


def rss_breakdown(model_path: str | None = None,
                  named: Mapping[str, Iterable[np.ndarray]] | None = None) -> dict[str, int]:
    """Resident bytes now, by kind: ``weights_huge_pages`` (the regions weights were copied into),
    ``model_file`` (pages of ``model_path``'s mapping), ``shared_libraries``, ``other_files``, one entry
    per name in ``named`` (the resident pages under those arrays, e.g. the KV cache; they must be
    anonymous memory, not inside a weight region), ``anonymous_other`` (Python objects, malloc, stacks:
    the anonymous rest) and ``total``. An empty dict where ``/proc/self/smaps`` cannot be read."""
    maps = _mappings_rss()
    if not maps:
        return {}
    model = os.path.realpath(model_path) if model_path else None
    out = dict.fromkeys(("model_file", "shared_libraries", "other_files"), 0)
    anonymous = 0
    for path, rss in maps:
        if not path.startswith("/"):  # "", [heap], [stack], [anon:...], [vdso]
            anonymous += rss
        elif model is not None and os.path.realpath(path.removesuffix(" (deleted)")) == model:
            out["model_file"] += rss
        elif _is_library(path):
            out["shared_libraries"] += rss
        else:
            out["other_files"] += rss
    weights = sum(memory.resident_bytes(start, size) or 0 for start, size in memory.region_spans())
    parts = {"weights_huge_pages": weights}
    for name, arrays in (named or {}).items():
        parts[name] = _resident(arrays)
    result = {**parts, **out}
    result["anonymous_other"] = max(0, anonymous - sum(parts.values()))
    result["total"] = sum(rss for _, rss in maps)
    return result
