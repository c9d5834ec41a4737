"""Quantized-matmul templates raced against the compiler's own kernels (search/template_race.py): the race's
mechanics with rigged timings (so the test does not depend on which one this machine runs faster), and the
whole search path through ``g.compile(..., search=1)``."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.graph import Program
from lightspeed.quant import QType
from lightspeed.quant.decode_graph import dequant_matrix_graph
from lightspeed.search import template_race as TR
from lightspeed.search.runner import PlanRunner

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))


def _program():
    from quant_blocks import random_raw
    g = ls.Graph()
    seq = ls.dim("seq", 1, 16)
    x = g.input("x", (seq, 64))
    outs = [x.linear(dequant_matrix_graph(g.constant(random_raw(q, 48, 64, RNG)), q)) for q in (QType.Q8_0, QType.Q4_1)]
    return g, outs, Program.build(g, outs)


def _rig(monkeypatch, generated_faster: bool) -> None:
    """Every kernel of the template plan takes 1 s and every kernel of the generated plan 0.5 s (or 2 s)."""
    def timed(self, *a, **kw):
        templated = any(k.kind == "qmatmul" for k in self.plan.kernels)
        s = 1.0 if templated else (0.5 if generated_faster else 2.0)
        return s, [s] * len(self.plan.kernels)
    monkeypatch.setattr(PlanRunner, "time", timed)


@pytest.mark.parametrize("generated_faster", [True, False])
def test_a_slower_template_is_dropped_and_a_faster_one_kept(monkeypatch, generated_faster):
    from lightspeed.backend.c.compiler import default_flags, find_compiler
    _, _, program = _program()
    _rig(monkeypatch, generated_faster)
    lower_only, res = TR.race_templates(program, None, {"use_templates": True}, find_compiler(), default_flags(),
                                        {"seq": 4})
    assert len(res.times) == 2, res  # both quantized matmuls were raced
    if generated_faster:
        assert res.dropped == frozenset(res.times) and lower_only is not None and not lower_only & res.dropped
    else:
        assert res.dropped == frozenset() and lower_only is None


def test_nothing_is_dropped_when_the_plans_disagree(monkeypatch):
    from lightspeed.backend.c.compiler import default_flags, find_compiler
    _, _, program = _program()
    _rig(monkeypatch, True)
    monkeypatch.setattr(TR, "outputs_agree", lambda a, b, **tolerance: False)
    lower_only, res = TR.race_templates(program, None, {"use_templates": True}, find_compiler(), default_flags(),
                                        {"seq": 4})
    assert lower_only is None and not res.dropped and "disagree" in res.note


def test_search_forms_what_the_race_chose_and_matches_the_reference(monkeypatch):
    g, outs, _ = _program()
    _rig(monkeypatch, True)
    from lightspeed.search import calibration, cost
    monkeypatch.setattr(calibration, "calibrate", lambda: cost.CostModel())
    prog = g.compile(outs, backend="c", search=1, search_budget_s=60, search_dims={"seq": 4})
    report = prog.executor.search_report
    assert report.race is not None and report.race.dropped
    kinds = [k.kind for k in prog.executor.plan.kernels]
    assert "qmatmul" not in kinds and "gemm" in kinds  # the generated kernels replaced both templates
    assert all(k.schedule is not None for k in prog.executor.plan.kernels if k.kind == "gemm")
    ref = g.compile(outs, backend="reference")
    for rows in (1, 3, 16):
        xv = RNG.standard_normal((rows, 64)).astype(np.float32)
        for got, want in zip(prog(x=xv), ref(x=xv)):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
