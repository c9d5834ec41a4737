"""lightspeed.search.explain: the report of what a search did, for a program compiled with search=1|2."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.search import explain

pytest.importorskip("egglog")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))


def test_explain_a_level_2_search():
    g = ls.Graph()
    x, y = g.input("x", (16, 32)), g.input("y", (16, 32))
    out = ((x.exp2() * y.exp2()).sum(1) * 1.0).recip()
    prog = g.compile([out], backend="c", search=2, search_budget_s=4.0)
    text = explain(prog)
    assert text.startswith("search level 2")
    assert "graph: chosen e-graph" in text  # exp2(x) * exp2(y) -> exp2(x + y) is cheaper
    assert "candidate original" in text and "candidate e-graph" in text and "passed the reference check" in text
    assert "rewrite rules fired: mul-one x1" in text
    assert "e-graph: " in text and "matches" in text
    assert "Exp2 2 -> 1" in text  # what changed in the program
    assert "schedules:" in text
    xs, ys = (np.random.default_rng(k).standard_normal((16, 32)).astype(np.float32) for k in range(2))
    want = 1.0 / (np.exp2(xs) * np.exp2(ys)).sum(1)
    np.testing.assert_allclose(prog(x=xs, y=ys)[0], want, rtol=1e-4)
    assert explain(prog.executor.search_report) == text


def test_explain_without_search_says_why():
    g = ls.Graph()
    x = g.input("x", (4,))
    prog = g.compile([x + 1.0], backend="c")
    with pytest.raises(ValueError, match="search=1 or 2"):
        explain(prog)
