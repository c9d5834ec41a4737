"""Memory for weights: anonymous regions the kernel may back with 2 MiB pages.

A decode step streams every weight once, and with 4 KiB pages the TLB misses of that stream
cost a quarter of the read bandwidth on the machines we measured (a 143 MB buffer read at
~22 GB/s on 4 KiB pages and ~29 GB/s on 2 MiB pages, 2 threads). Transparent huge pages are
often "madvise"-only, and file-backed mappings never get them, so weights are copied once into
a private anonymous region marked ``MADV_HUGEPAGE``. The pages of a read-only file mapping
that a copy came from are handed back (``MADV_DONTNEED``), so the process holds one copy.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import sys
import weakref

import numpy as np

ALIGN = 64  # every array starts on a cache line
HUGE_PAGE = 2 << 20
RELEASE_CHUNK = 16 << 20  # a copy that releases its source does so per chunk (each release reads /proc maps)

# live regions: start address -> (size, weak reference to the mapping); an entry goes when the
# mapping does (arrays keep their mapping alive through their buffer)
_REGIONS: dict[int, tuple[int, weakref.ref]] = {}


class HugePageRegion:
    """A private anonymous mapping of ``nbytes`` (advised for huge pages where the OS supports it),
    handed out as aligned numpy arrays with ``take`` and ``copy``."""

    def __init__(self, nbytes: int):
        size = max(HUGE_PAGE, -(-int(nbytes) // HUGE_PAGE) * HUGE_PAGE)
        flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
        # a shared anonymous map (Python's default) is shmem, which THP "madvise" mode leaves alone
        self._map = mmap.mmap(-1, size, flags=flags) if flags else mmap.mmap(-1, size)
        self.advised = False
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self._map.madvise(mmap.MADV_HUGEPAGE)  # before any page is touched
                self.advised = True
            except OSError:
                pass
        self.buffer = np.frombuffer(self._map, dtype=np.uint8)
        self.address = int(self.buffer.ctypes.data)
        self.nbytes = size
        self._next = 0
        address = self.address
        _REGIONS[address] = (size, weakref.ref(self._map, lambda _: _REGIONS.pop(address, None)))

    def take(self, nbytes: int, dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A new (uninitialised) array of ``shape`` and ``dtype`` in the region."""
        start = -(-self._next // ALIGN) * ALIGN
        if start + nbytes > self.nbytes:
            raise MemoryError(f"HugePageRegion: {nbytes} bytes do not fit ({self.nbytes - start} left)")
        self._next = start + nbytes
        return self.buffer[start:start + nbytes].view(dtype).reshape(shape)

    def copy(self, a: np.ndarray, release: bool = False, maps: list | None = None) -> np.ndarray:
        """A copy of ``a`` in the region (same shape and dtype, C order). With ``release``, the file pages
        under a C-contiguous ``a`` are released as each chunk is copied (``release_file_pages``), so a
        large weight is never resident twice; ``maps``: the process's mappings (``read_mappings``) when the
        caller has read them for several copies."""
        out = self.take(a.nbytes, a.dtype, a.shape)
        if not (release and a.flags.c_contiguous and a.nbytes > RELEASE_CHUNK):
            out[...] = a
            if release:
                release_file_pages([a], maps)
            return out
        maps = read_mappings() if maps is None else maps
        src, dst = a.reshape(-1).view(np.uint8), out.reshape(-1).view(np.uint8)
        for lo in range(0, a.nbytes, RELEASE_CHUNK):
            dst[lo:lo + RELEASE_CHUNK] = src[lo:lo + RELEASE_CHUNK]
            release_file_pages([src[lo:lo + RELEASE_CHUNK]], maps)
        return out


class SharedCopies:
    """Copies of read-only arrays (weights mapped from a file), so that programs over the same weights read one
    copy instead of making another. An entry is keyed by the source's address, size, dtype and shape plus a
    ``kind`` (what sort of copy it is), holds its source, so that address cannot be reused by other data while
    the copy lives, and goes when the copy does. A writable source may change: it is never shared."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[weakref.ref, np.ndarray]] = {}

    @staticmethod
    def key(source: np.ndarray, *kind) -> tuple:
        return (source.ctypes.data, source.nbytes, source.dtype.str, source.shape) + kind

    def __contains__(self, key: tuple) -> bool:
        return key in self._entries

    def get(self, source: np.ndarray, *kind) -> np.ndarray | None:
        """The live copy of ``source`` of that kind, if any."""
        entry = self._entries.get(self.key(source, *kind)) if not source.flags.writeable else None
        return entry[0]() if entry is not None else None

    def put(self, source: np.ndarray, copy: np.ndarray, *kind) -> None:
        """Share ``copy`` as the copy of ``source`` of that kind (nothing for a writable source)."""
        if source.flags.writeable:
            return
        key = self.key(source, *kind)
        self._entries[key] = (weakref.ref(copy), source)
        weakref.finalize(copy, self._entries.pop, key, None)


def region_bytes(arrays) -> int:
    """Bytes a region needs to hold copies of ``arrays``."""
    return sum(-(-a.nbytes // ALIGN) * ALIGN for a in arrays) + ALIGN


def in_region(a: np.ndarray) -> bool:
    """True if ``a``'s memory lies in a live ``HugePageRegion``."""
    lo = int(a.ctypes.data)
    hi = lo + a.nbytes
    for start, (size, ref) in list(_REGIONS.items()):
        if start <= lo and hi <= start + size and ref() is not None:
            return True
    return False


def region_spans() -> list[tuple[int, int]]:
    """(start address, size) of every live ``HugePageRegion``: what a memory report counts as weights."""
    return [(start, size) for start, (size, ref) in list(_REGIONS.items()) if ref() is not None]


def resident_bytes(address: int, nbytes: int) -> int | None:
    """Bytes of the pages under ``[address, address + nbytes)`` that are resident now (``mincore``; the
    pages at both ends count whole). Meant for anonymous memory: under a file mapping, mincore says which
    pages are in the page cache, mapped by this process or not. None where the OS has no such call or the
    range is not mapped."""
    libc = _libc()
    if libc is None or nbytes <= 0:
        return None if libc is None else 0
    page = mmap.PAGESIZE
    lo = address // page * page
    n_pages = -(-(address + nbytes - lo) // page)
    vec = (ctypes.c_ubyte * n_pages)()
    if libc.mincore(ctypes.c_void_p(lo), n_pages * page, vec) != 0:
        return None
    # bit 0 of each byte says whether that page is resident
    return int(np.count_nonzero(np.frombuffer(vec, dtype=np.uint8) & 1)) * page


@functools.cache
def _libc():
    # loaded once: find_library runs ldconfig, ~2.5 ms a call (a model's 211 weight copies took 0.54 s)
    if not sys.platform.startswith("linux"):
        return None
    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    lib.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    lib.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    return lib


def read_mappings() -> list[tuple[int, int, str, str]]:
    """(start, end, permissions, path) of this process's mappings, from /proc/self/maps (~2.6 ms to read: a
    caller releasing the pages under many arrays reads them once and passes them on)."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                a, b = (int(x, 16) for x in parts[0].split("-"))
                out.append((a, b, parts[1], parts[5].strip() if len(parts) > 5 else ""))
    except OSError:
        return []
    return out


def release_file_pages(arrays, maps: list | None = None) -> int:
    """Drop this process's resident pages under each array that views a read-only file mapping (the
    data stays in the file and the page cache and is read again on the next access). Anything else
    (anonymous or writable memory) is left alone. Returns how many arrays had pages released. ``maps``:
    ``read_mappings()`` from the caller (read here when None)."""
    libc = _libc()
    if libc is None or not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    maps = read_mappings() if maps is None else maps
    released = 0
    for a in arrays:
        lo = int(a.ctypes.data)
        hi = lo + a.nbytes
        start = -(-lo // mmap.PAGESIZE) * mmap.PAGESIZE
        end = hi // mmap.PAGESIZE * mmap.PAGESIZE
        if end <= start:
            continue
        for m_lo, m_hi, perms, path in maps:
            if m_lo <= lo and hi <= m_hi:
                if "w" not in perms and path.startswith("/"):
                    released += libc.madvise(ctypes.c_void_p(start), end - start, mmap.MADV_DONTNEED) == 0
                break
    return released


def release_freed_heap() -> bool:
    """Hand the C heap's free pages back to the OS (glibc's ``malloc_trim``): compiling frees many small
    Python objects, and glibc keeps the pages they sat on unless asked. False where there is no such call."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return False
    trim(ctypes.c_size_t(0))
    return True

