"""Opening model files: only regular files, so that a FIFO, a device or a directory given as a
model path is refused with a clear error instead of blocking (opening a FIFO for reading waits
for a writer) or reading without end."""
from __future__ import annotations

import os
import stat
from typing import BinaryIO

from .errors import ModelFormatError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: "str | os.PathLike[str]") -> BinaryIO:
    """``path`` opened for binary reading; ModelFormatError if it is not a regular file or cannot be opened.
    The open itself never blocks (O_NONBLOCK), and the type is checked on the opened descriptor."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise ModelFormatError(path, "is a directory, not a file") from None
    except OSError as e:
        raise ModelFormatError(path, f"cannot open: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ModelFormatError(path, f"is {_kind(mode)}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def require_regular(path: "str | os.PathLike[str]") -> str:
    """``path`` if it names a regular file (for files that another library opens); ModelFormatError if not."""
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise ModelFormatError(path, f"cannot open: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise ModelFormatError(path, f"is {_kind(mode)}, not a regular file")
    return path
