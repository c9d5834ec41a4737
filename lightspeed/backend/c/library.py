"""The C interface of a compiled program's shared object, declared once for every loader of one (the executor,
search's plan runner)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import cffi

FFI = cffi.FFI()
FFI.cdef("void ls_graph(void **bufs, const int64_t *dims, char *arena); extern int64_t ls_profile_ns[]; "
         "extern int ls_repack16_formats; extern int ls_repack_rows; "
         "void ls_repack16(const uint8_t *src, uint8_t *dst, int64_t rows, int64_t rb, int qt);")


@dataclass(frozen=True)
class RepackLayout:
    """How a build reads repacked weights (repack.py): ``formats``, bit ``code`` set for each format it reads
    repacked (ls_repack16_formats); ``rows``, the rows of a group of its layout (ls_repack_rows: 16 on AVX-512, 8
    on AVX2); ``make(src, dst, rows, row_bytes, code)``, its ls_repack16 over integer addresses."""

    formats: int
    rows: int
    make: Callable[[int, int, int, int, int], None]


def repack_layout(lib) -> RepackLayout:
    """The repacked-weights layout of the loaded library ``lib``."""
    def make(src: int, dst: int, rows: int, row_bytes: int, code: int) -> None:
        lib.ls_repack16(FFI.cast("const uint8_t *", src), FFI.cast("uint8_t *", dst), rows, row_bytes, code)
    return RepackLayout(int(lib.ls_repack16_formats), int(lib.ls_repack_rows), make)
