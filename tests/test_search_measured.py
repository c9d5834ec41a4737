"""Extraction by measurement (lightspeed.search.measured): the graph candidates are compiled and timed, a
planted slower equivalent form the cost model prefers is not chosen, a candidate that computes something else
is caught, and the choice is stored so the next compile of the same program measures nothing."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed.backend.c.compiler import default_flags, find_compiler
from lightspeed.graph import Program
from lightspeed.kernel.fusion import form_kernels
from lightspeed.search import explain, measured
from lightspeed.search.graph_search import Candidate

N = 256


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path))


def _programs(wrong: bool = False) -> tuple[Program, Program]:
    """exp(x) + y, and the same values the slow way: the max over 2,048 broadcast copies of exp(x) is
    exp(x) exactly (``wrong``: plus one, a planted mistake)."""
    g = ls.Graph()
    x, y = g.input("x", (N, 64)), g.input("y", (N, 64))
    fast = Program.build(g, [x.exp() + y])
    g2 = ls.Graph()
    x2, y2 = g2.input("x", (N, 64)), g2.input("y", (N, 64))
    copies = x2.exp().reshape((N, 64, 1)).expand((N, 64, 2048)).max(2)
    slow = Program.build(g2, [(copies + 1.0 if wrong else copies) + y2])
    return fast, slow


def _measure(fast: Program, slow: Program, **kw) -> measured.MeasuredChoice:
    # the model ranks the slow form cheaper (planted) and chose it
    cands = [Candidate("original", fast, 1.0, True), Candidate("rewrite", slow, 0.5, True)]
    return measured.measure_candidates(fast, cands, "rewrite", {}, find_compiler(), default_flags(), {},
                                       budget_s=60.0, **kw)


def test_a_slower_form_the_model_prefers_is_not_chosen():
    fast, slow = _programs()
    res = _measure(fast, slow, use_cache=False)
    assert set(res.seconds) == {"original", "rewrite"} and not res.from_cache
    assert res.seconds["rewrite"] > 3 * res.seconds["original"], res.seconds
    assert res.chosen == "original"


def test_the_models_choice_stands_unless_another_is_clearly_faster():
    same = {"original": "original", "rewrite": "original", "e-graph": "e-graph"}
    assert measured.decide({"original": 1.0, "e-graph": 0.97}, "original", same) == "original"  # within 5%
    assert measured.decide({"original": 1.0, "e-graph": 0.90}, "original", same) == "e-graph"
    assert measured.decide({"original": 0.90, "e-graph": 1.0}, "e-graph", same) == "original"
    # the rewrite has the original's structure: it was measured as the original, and stays chosen
    assert measured.decide({"original": 1.0, "e-graph": 0.99}, "rewrite", same) == "rewrite"
    assert measured.decide({"original": 1.0, "e-graph": 0.5}, "rewrite", same) == "e-graph"


def test_a_candidate_that_computes_something_else_is_caught():
    fast, wrong = _programs(wrong=True)
    res = _measure(fast, wrong, use_cache=False)
    assert res.chosen is None and "disagrees" in res.note


def test_one_distinct_candidate_is_not_measured():
    fast, _ = _programs()
    cands = [Candidate("original", fast, 1.0, True), Candidate("rewrite", fast, 1.0, True),
             Candidate("e-graph", fast, 0.5, None)]  # unchecked: not known to be valid, so never timed
    res = measured.measure_candidates(fast, cands, "original", {}, find_compiler(), default_flags(), {}, 60.0)
    assert res.chosen is None and "one distinct" in res.note


def test_the_choice_is_stored_and_reused(monkeypatch):
    fast, slow = _programs()
    first = _measure(fast, slow)
    assert first.chosen == "original" and not first.from_cache

    def no_compile(*a, **k):
        raise AssertionError("a stored choice needs no compile")
    monkeypatch.setattr(measured, "compile_shared", no_compile)
    again = _measure(fast, slow)
    assert again.from_cache and again.chosen == "original" and again.seconds == first.seconds


def test_a_level_2_compile_reports_its_measurement():
    pytest.importorskip("egglog")
    g = ls.Graph()
    x, y = g.input("x", (64, 128)), g.input("y", (64, 128))
    out = ((x * 1.0).exp() + y).sum(1)  # the rewrite (x * 1 -> x) differs from the original
    prog = g.compile([out], backend="c", search=2, search_budget_s=40.0)
    report = prog.executor.search_report
    m = report.measured
    assert m is not None and set(m.seconds) == {"original", "rewrite"}, (m, report.candidates)
    assert report.graph == m.chosen
    assert "measured candidates: original" in explain(prog)
    xs, ys = (np.random.default_rng(k).standard_normal((64, 128)).astype(np.float32) for k in range(2))
    np.testing.assert_allclose(prog(x=xs, y=ys)[0], (np.exp(xs) + ys).sum(1), rtol=1e-5)


def _shared_value_program() -> tuple[Program, object]:
    """A value of moderate cost read by two reductions: the heuristics store it; the other choice computes it
    inside each reduction."""
    g = ls.Graph()
    x = g.input("x", (64, 128))
    v = ((x * 1.7).exp().sin() * x + 0.5).exp()
    return g, [v.sum(1), v.max(1)]


def test_materialisation_points_are_measured():
    g, outs = _shared_value_program()
    program = Program.build(g, outs)
    cands = [Candidate("original", program, 1.0, True)]
    res = measured.measure_candidates(program, cands, "original", {}, find_compiler(), default_flags(), {},
                                      budget_s=60.0, use_cache=False)
    # the shared value is the one point (stored by the thresholds): it is timed recomputed against them
    assert set(res.materialise_seconds) >= {"heuristics", "recompute Exp2[64, 128] x1"}, res
    assert res.chosen == "original"
    assert all(isinstance(k, str) and isinstance(v, bool) for k, v in res.materialise.items())


def test_a_materialisation_choice_overrides_the_thresholds():
    g, outs = _shared_value_program()
    program = Program.build(g, outs)
    base = form_kernels(program)
    (point,) = base.materialise_points
    assert point.stored and point.may_recompute and point.describe(False) == "recompute Exp2[64, 128] x1"
    assert len(base.kernels) == 3 and len(base.temps) == 1  # the value, then the two reductions
    flipped = form_kernels(program, materialise={point.signature: False})
    assert len(flipped.kernels) == 2 and not flipped.temps
    # an unknown signature changes nothing
    assert len(form_kernels(program, materialise={"0" * 16: False}).kernels) == 3


def test_a_point_has_one_signature_in_every_layer():
    g = ls.Graph()
    h = g.input("x", (32, 64)) + 1.0 + 1.0  # what the first layer reads looks like what the others read
    outs = []
    for layer in range(3):  # the same layer three times, each over its own weight
        w = g.constant(np.random.default_rng(layer).standard_normal((64,)).astype(np.float32))
        v = (h * w).exp()
        outs += [v.sum(1), v.max(1)]
        h = h + 1.0
    points = form_kernels(Program.build(g, outs)).materialise_points
    assert [p.nodes for p in points if p.op == "Exp2"] == [3], points


def test_a_faster_materialisation_is_the_one_formed(monkeypatch):
    pytest.importorskip("egglog")
    rigged = []

    def timed(names, plans, *args):  # the plan that recomputes the shared value is planted as much faster
        rigged.append(list(names))
        return {n: (0.2 if n.startswith("recompute") else 1.0) for n in names}, ""
    monkeypatch.setattr(measured, "_timed", timed)
    g, outs = _shared_value_program()
    prog = g.compile(outs, backend="c", search=2, search_budget_s=40.0)
    m = prog.executor.search_report.measured
    label = "recompute Exp2[64, 128] x1"
    assert ["heuristics", label] in rigged and m.materialise_chosen == [label], (m, rigged)
    assert list(m.materialise.values()) == [False]
    assert len(prog.executor.plan.kernels) == 2  # the shared value is computed inside both reductions
    xs = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    v = np.exp(np.sin(np.exp(xs * 1.7)) * xs + 0.5)
    got = prog(x=xs)
    np.testing.assert_allclose(got[0], v.sum(1), rtol=2e-4)  # vectorised exp and sin
    np.testing.assert_allclose(got[1], v.max(1), rtol=2e-4)
    assert "measured materialisation: heuristics" in explain(prog) and f"chosen {label}" in explain(prog)


def test_a_choice_that_is_not_faster_again_is_not_taken(monkeypatch):
    calls = []

    def timed(names, plans, *args):  # faster in its batch, as slow as the heuristics when confirmed
        calls.append(list(names))
        fast = len(calls) == 1
        return {n: (0.5 if fast and n != "heuristics" else 1.0) for n in names}, ""
    monkeypatch.setattr(measured, "_timed", timed)
    g, outs = _shared_value_program()
    program = Program.build(g, outs)
    res = measured.measure_candidates(program, [Candidate("original", program, 1.0, True)], "original", {},
                                      find_compiler(), default_flags(), {}, budget_s=60.0, use_cache=False)
    assert len(calls) == 2 and res.materialise == {} and res.materialise_chosen == [], (calls, res)


def test_winning_choices_are_confirmed_together(monkeypatch):
    g = ls.Graph()
    x = g.input("x", (64, 128))
    a = ((x * 1.7).exp().sin() * x + 0.5).exp()
    b = ((x * 0.3).exp().sin() * x - 0.5).exp()
    outs = [a.sum(1), a.max(1), b.sum(1), b.max(1)]
    program = Program.build(g, outs)
    calls = []

    def timed(names, plans, *args):  # each choice alone is faster; together faster still
        calls.append(list(names))
        return {n: 0.3 if "together" in n else 1.0 if n == "heuristics" else 0.6 for n in names}, ""
    monkeypatch.setattr(measured, "_timed", timed)
    res = measured.measure_candidates(program, [Candidate("original", program, 1.0, True)], "original", {},
                                      find_compiler(), default_flags(), {}, budget_s=60.0, use_cache=False)
    assert calls[-1][-1] == "2 choices together", calls
    assert len(res.materialise) == 2 and not any(res.materialise.values()) and len(res.materialise_chosen) == 2
    assert len(form_kernels(program, **res.form_options).kernels) == 4  # both values computed in their readers


def test_a_stored_materialisation_is_reused(monkeypatch):
    monkeypatch.setattr(measured, "_timed", lambda names, plans, *a: ({n: 0.2 if n != "heuristics" else 1.0
                                                                       for n in names}, ""))
    g, outs = _shared_value_program()
    program = Program.build(g, outs)
    cands = [Candidate("original", program, 1.0, True)]
    args = (program, cands, "original", {}, find_compiler(), default_flags(), {}, 60.0)
    first = measured.measure_candidates(*args)
    assert first.materialise and not first.from_cache

    def no_timing(*a, **k):
        raise AssertionError("a stored choice needs no timing")
    monkeypatch.setattr(measured, "_timed", no_timing)
    again = measured.measure_candidates(*args)
    assert again.from_cache and again.materialise == first.materialise
    assert again.materialise_chosen == first.materialise_chosen
