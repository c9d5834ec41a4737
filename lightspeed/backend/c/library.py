"""The C interface of a compiled program's shared object, declared once for every loader of one (the executor,
search's plan runner)."""
from __future__ import annotations

from collections.abc import Callable

import cffi

FFI = cffi.FFI()
FFI.cdef("void ls_graph(void **bufs, const int64_t *dims, char *arena); extern int64_t ls_profile_ns[]; "
         "extern int ls_repack16_formats; "
         "void ls_repack16(const uint8_t *src, uint8_t *dst, int64_t rows, int64_t rb, int qt);")


def repack16(lib) -> Callable[[int, int, int, int, int], None]:
    """The library's ls_repack16 as a function of integer addresses ``(src, dst, rows, row_bytes, code)``, as
    ``repack.bind_repacks`` calls it."""
    def repack(src: int, dst: int, rows: int, row_bytes: int, code: int) -> None:
        lib.ls_repack16(FFI.cast("const uint8_t *", src), FFI.cast("uint8_t *", dst), rows, row_bytes, code)
    return repack
