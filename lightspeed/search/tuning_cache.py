"""The on-disk tuning cache: the best knobs found for a kernel, keyed by what determines them.

The key hashes the kernel's C text under the default knobs (which already names its shapes and
dtypes; kernels that differ only in their buffers render alike), the dimension values it was timed
at, the Lightspeed version, the compiler and the CPU. Entries live under ``<cache dir>/tuning`` and
are written atomically, so concurrent searches leave valid files.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from ..backend.c.compiler import cache_dir, compiler_identity, cpu_signature


def kernel_key(kernel_text: str, env: dict[str, int], cc: str) -> str:
    from .. import __version__
    h = hashlib.sha256()
    for part in (kernel_text, json.dumps(sorted(env.items())), __version__, compiler_identity(cc), cpu_signature()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def _dir() -> Path:
    d = cache_dir() / "tuning"
    d.mkdir(parents=True, exist_ok=True)
    return d


def load(key: str) -> dict | None:
    """The stored entry (``knobs``, ``seconds``, ``default_seconds``) or None."""
    path = _dir() / f"{key}.json"
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("knobs"), dict) else None


def store(key: str, entry: dict) -> None:
    d = _dir()
    fd, tmp = tempfile.mkstemp(prefix=".tune.", suffix=".json", dir=d)
    with os.fdopen(fd, "w") as f:
        json.dump(entry, f)
    os.replace(tmp, d / f"{key}.json")
