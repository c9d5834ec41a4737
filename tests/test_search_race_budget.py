"""The template race within its budget (search/template_race.py): a race whose two compiles do not finish
in the time it has is skipped, every template kept, and the caller does not wait for the compiles."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.graph import Program
from lightspeed.quant import QType
from lightspeed.quant.decode_graph import dequant_matrix_graph
from lightspeed.search import template_race as TR

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))


def _program() -> Program:
    from quant_blocks import random_raw
    g = ls.Graph()
    x = g.input("x", (ls.dim("seq", 1, 16), 64))
    outs = [x.linear(dequant_matrix_graph(g.constant(random_raw(q, 48, 64, np.random.default_rng(1))), q))
            for q in (QType.Q8_0, QType.Q4_1)]
    return Program.build(g, outs)


def test_a_race_past_its_budget_keeps_every_template(monkeypatch):
    from lightspeed.backend.c.compiler import default_flags, find_compiler
    program = _program()

    def slow_compile(*a, **kw):  # a compile that takes far longer than the race's budget
        time.sleep(3.0)
        raise AssertionError("not reached in time")
    monkeypatch.setattr(TR, "compile_shared", slow_compile)
    t0 = time.perf_counter()
    lower_only, res = TR.race_templates(program, None, {"use_templates": True}, find_compiler(), default_flags(),
                                        {"seq": 4}, budget_s=0.2)
    assert time.perf_counter() - t0 < 2.0  # it did not wait for the compiles
    assert lower_only is None and not res.dropped and "not raced" in res.note


def test_a_generated_plan_that_materialises_products_is_not_run(monkeypatch):
    """Without templates the Q4_1 matmul here becomes a [seq, 64, 48] product kernel and a reduction; when
    the estimate of that extra work exceeds the budget, nothing is compiled or run."""
    from lightspeed.backend.c.compiler import default_flags, find_compiler

    def no_compile(*a, **kw):
        raise AssertionError("the race compiled a plan it had estimated past its budget")
    monkeypatch.setattr(TR, "compile_shared", no_compile)
    lower_only, res = TR.race_templates(_program(), None, {"use_templates": True}, find_compiler(), default_flags(),
                                        {"seq": 4}, budget_s=1e-6)
    assert lower_only is None and "would take" in res.note
