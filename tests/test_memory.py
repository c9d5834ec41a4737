"""Weight memory (lightspeed/memory.py): huge-page regions and releasing file pages after a copy."""
from __future__ import annotations

import mmap
import os
import platform
import sys

import numpy as np
import pytest

import lightspeed as ls
from lightspeed import memory

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and madvise are Linux features")


def _smaps_entry(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds ``address``."""
    fields: dict[str, str] = {}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
                continue
            if inside:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    return fields


def test_region_arrays_are_aligned_distinct_and_hold_their_values() -> None:
    region = memory.HugePageRegion(1 << 20)
    arrays = [np.arange(n, dtype=np.float32) * 0.5 for n in (3, 1000, 70000)]
    copies = [region.copy(a) for a in arrays]
    for a, c in zip(arrays, copies):
        np.testing.assert_array_equal(a, c)
        assert c.ctypes.data % memory.ALIGN == 0
        assert memory.in_region(c) and not memory.in_region(a)
    for i in range(len(copies)):
        for j in range(i + 1, len(copies)):
            assert not np.shares_memory(copies[i], copies[j])
    with pytest.raises(MemoryError, match="do not fit"):
        region.take(region.nbytes, np.uint8, (region.nbytes,))


@linux
def test_region_is_private_and_advised_for_huge_pages() -> None:
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    mode = open(thp).read() if os.path.exists(thp) else "[never]"
    region = memory.HugePageRegion(4 << 20)
    a = region.take(4 << 20, np.uint8, (4 << 20,))
    a[...] = 1
    entry = _smaps_entry(a.ctypes.data)
    assert entry, "the region is not in /proc/self/smaps"
    if "[never]" in mode:
        pytest.skip("transparent huge pages are disabled on this machine")
    assert entry.get("THPeligible") == "1", entry


@linux
def test_release_file_pages_drops_only_read_only_file_pages(tmp_path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(np.arange(1 << 20, dtype=np.int32).tobytes())  # 4 MiB
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(m, dtype=np.int32)
    total = int(view.sum(dtype=np.int64))  # touch every page
    before = int(_smaps_entry(view.ctypes.data)["Rss"].split()[0])
    anon = np.ones(1 << 20, dtype=np.int32)
    assert memory.release_file_pages([view, anon]) == 1
    after = int(_smaps_entry(view.ctypes.data)["Rss"].split()[0])
    assert before >= 4000 and after < before // 4, (before, after)
    assert int(view.sum(dtype=np.int64)) == total  # read again from the file
    assert (anon == 1).all()


@linux
def test_copy_with_release_never_holds_a_large_file_twice(tmp_path, monkeypatch) -> None:
    """A releasing copy goes chunk by chunk: the source's resident pages stay about one chunk, and the
    copy holds the file's values (the C backend copies weights this way)."""
    monkeypatch.setattr(memory, "RELEASE_CHUNK", 256 << 10)
    path = tmp_path / "weights.bin"
    values = np.arange(4 << 20, dtype=np.int32).reshape(1024, 4096)  # 16 MiB
    path.write_bytes(values.tobytes())
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(m, dtype=np.int32).reshape(1024, 4096)
    region = memory.HugePageRegion(memory.region_bytes([view]))
    peak = []
    real_release = memory.release_file_pages

    def watch(arrays, maps=None):  # resident pages of the source just before each chunk's release
        peak.append(int(_smaps_entry(view.ctypes.data)["Rss"].split()[0]))
        return real_release(arrays, maps)
    monkeypatch.setattr(memory, "release_file_pages", watch)
    copy = region.copy(view, release=True)
    np.testing.assert_array_equal(copy, values)
    # KiB: a few chunks at most (the kernel may map pages around a fault, up to 2 MiB on tmpfs)
    assert len(peak) == 64 and max(peak) <= 4096, peak
    assert memory.in_region(copy) and not memory.in_region(view)


def test_c_backend_reads_weights_from_a_region_and_gives_the_same_results() -> None:
    g = ls.Graph()
    x = g.input("x", (4, 256), ls.float32)
    w = np.random.default_rng(0).standard_normal((512, 256)).astype(np.float32)  # 512 KiB: copied
    out = x @ g.constant(w).T
    xv = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    on = g.compile([out], backend="c")
    off = g.compile([out], backend="c", huge_pages=False)
    assert any(memory.in_region(a) for a in on.executor._consts)
    assert not any(memory.in_region(a) for a in off.executor._consts)
    np.testing.assert_array_equal(on(x=xv)[0], off(x=xv)[0])
    np.testing.assert_allclose(on(x=xv)[0], xv @ w.T, rtol=1e-4, atol=1e-4)


def test_programs_over_the_same_file_weights_share_one_copy(tmp_path) -> None:
    """Two programs over one read-only (file-mapped) weight read the same huge-page copy; a writable
    constant is copied for each program (it may change between compiles); the shared entry goes with the
    last program."""
    import gc

    from lightspeed.backend import c as cbackend
    path = tmp_path / "w.bin"
    w = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    path.write_bytes(w.tobytes())
    with open(path, "rb") as f:
        mapped = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.float32).reshape(256, 256)
    assert not mapped.flags.writeable
    writable = w.copy()
    progs = []
    for scale in (1.0, 2.0):  # two different graphs over the same constants
        g = ls.Graph()
        x = g.input("x", (2, 256), ls.float32)
        progs.append(g.compile([(x @ g.constant(mapped).T) * scale + (x @ g.constant(writable).T)], backend="c"))
    copies = [[a.ctypes.data for a in p.executor._consts if memory.in_region(a)] for p in progs]
    assert len(copies[0]) == 2 and len(copies[1]) == 2
    assert len(set(copies[0]) & set(copies[1])) == 1, "the file-mapped weight should be copied once"
    xv = np.ones((2, 256), np.float32)
    np.testing.assert_allclose(progs[1](x=xv)[0], 3 * (xv @ w.T), rtol=1e-4, atol=1e-3)
    key = (mapped.ctypes.data, mapped.nbytes, mapped.dtype.str, mapped.shape)
    assert key in cbackend._COPIES
    progs.clear()
    gc.collect()
    assert key not in cbackend._COPIES


def test_loading_a_gguf_model_releases_its_vocabulary_arrays() -> None:
    """The tokenizer keeps its own copy, so the file's token and merge lists (~16 MB of Python objects for
    SmolLM2) are dropped; asking the file for them again says how to get them."""
    from lightspeed import api
    from lightspeed.io import Tokenizer, load_gguf
    from lightspeed.models import load_model
    try:
        path = api.default_model_path()
    except api.ModelNotFoundError as e:
        pytest.skip(str(e))
    lm = load_model(path)
    assert "tokenizer.ggml.tokens" not in lm.weights.file.metadata
    assert "tokenizer.ggml.merges" not in lm.weights.file.metadata
    fresh = Tokenizer.from_gguf(load_gguf(path))
    text = "Hello world, the tokenizer still works: 12345 ünïcödé"
    assert lm.tokenizer.encode(text) == fresh.encode(text)
    with pytest.raises(ValueError, match="load the file again"):
        lm.weights.file.tokenizer_info()


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="malloc_trim is glibc's")
def test_freed_heap_pages_go_back_to_the_os() -> None:
    def anon_mb() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) // 1024 for line in f if line.startswith("RssAnon"))

    blocks = [bytearray(4000) for _ in range(30_000)]  # ~120 MB of heap blocks
    keep = blocks[::64]  # a few survivors pin the heap, so freeing the rest returns nothing by itself
    del blocks
    before = anon_mb()
    assert memory.release_freed_heap() is True
    assert before - anon_mb() > 50, "malloc_trim returned less than 50 MB of ~118 MB freed"
    assert len(keep) == 469
