"""The system headers every generated C source includes, precompiled once per compiler and flags (gcc).

Parsing ``<immintrin.h>`` under ``-march=native`` is most of the time gcc takes for a small generated
program (0.14 of 0.19 s for an element-wise kernel on an AVX-512 CPU, 0.07 s in all with the precompiled
header), and a test run or a search compiles hundreds of them. The header holds nothing of Lightspeed's: the
generated code is the same with it or without (its includes are guarded, so they become no-ops). It lives in
the cache directory, named by a hash of the compiler, its version, the flags and the text, beside its
``.gch``, which is built under a private temporary name and renamed into place. gcc checks a ``.gch``
against its own build and flags and parses the header text instead when they differ; a compile that fails
with the header is retried without it (compiler.py), and when that passes the ``.gch`` is removed (a truncated
one makes gcc fail), so a damaged file costs one compile's time, never a build.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from . import cache_files

HEADER = ("/* Lightspeed: system headers of the generated C sources, precompiled (backend/c/pch.py) */\n"
          "#include <stdint.h>\n#include <string.h>\n#include <math.h>\n"
          "#if defined(__x86_64__) || defined(__i386__)\n#include <immintrin.h>\n#endif\n")


def include_args(cc: str, identity: str, flags: list[str], d: Path, key: str) -> list[str]:
    """``-include`` arguments for the precompiled header of compiler ``cc`` (``identity``: its ``--version``
    line) and ``flags`` in cache directory ``d`` under ``key`` (a hash of all of those and ``HEADER``),
    building it on first use; [] where none can be built (clang, whose precompiled headers work otherwise, or
    a directory that cannot take the files): the sources then parse the headers themselves."""
    if "clang" in identity.lower():
        return []
    header, gch, failed = d / f"pch-{key}.h", d / f"pch-{key}.h.gch", d / f"pch-{key}.failed"
    try:
        if failed.exists():  # this compiler could not build it once: do not try on every compile
            return []
        if not gch.exists():
            if not header.exists() or header.read_text() != HEADER:
                cache_files.write_atomic(header, key, HEADER.encode())
            fd, tmp = cache_files.temp_file(d, key, ".gch")
            os.close(fd)
            try:
                cmd = cc.split() + [f for f in flags if f != "-shared"] + ["-x", "c-header", str(header), "-o", tmp]
                if subprocess.run(cmd, capture_output=True).returncode != 0:
                    cache_files.write_atomic(failed, key, b"")
                    return []
                os.replace(tmp, gch)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    except OSError:
        return []
    return ["-include", str(header)]


def discard(args: list[str]) -> None:
    """Remove the ``.gch`` behind ``include_args``' result ``args`` (a compile failed with it and passed
    without): the next compile builds it again."""
    if len(args) == 2:
        try:
            os.unlink(args[1] + ".gch")
        except OSError:
            pass
