"""``lightspeed compile --backend c --search 2 --explain``: a model's program compiled for this CPU with the
search, and the report of what the search did (candidates with their measured times, rules, schedules); bad
flag combinations are refused by name."""
from __future__ import annotations

import pytest
from tiny_gguf import write_tiny_llama

from lightspeed.cli import main

pytest.importorskip("egglog")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("compile_search") / "tiny.gguf"
    write_tiny_llama(path, seed=3)
    return str(path)


def test_compile_with_search_explains_it(tiny, capsys):
    assert main(["compile", "--backend", "c", "--model", tiny, "--ctx", "64", "--max-chunk", "8", "--search", "2",
                 "--search-budget", "15", "--explain"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("search level 2, budget 15 s")
    assert "candidate original" in out and "candidate rewrite" in out
    assert "measured candidates:" in out  # the timed candidates, or why none were timed
    assert "schedules:" in out and "compiled for this CPU" in err


@pytest.mark.parametrize("flags, message", [
    (["--explain"], "--explain reports a search"),
    (["--search", "3"], "--search must be 0, 1 or 2"),
    (["--search", "1", "--search-budget", "0"], "--search-budget must be positive"),
    (["--out", "somewhere"], "--out is for the GPU backends"),
])
def test_bad_flags_are_refused(tiny, capsys, flags, message):
    assert main(["compile", "--backend", "c", "--model", tiny] + flags) != 0
    assert message in capsys.readouterr().err


def test_gpu_backends_need_an_out_folder_and_take_no_search(tiny, capsys):
    assert main(["compile", "--backend", "opencl", "--model", tiny]) != 0
    assert "pass --out DIR" in capsys.readouterr().err
    assert main(["compile", "--backend", "opencl", "--model", tiny, "--out", "x", "--search", "1"]) != 0
    assert "--search and --explain are for --backend c" in capsys.readouterr().err
