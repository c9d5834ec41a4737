"""Lowered kernels as alternatives of graph-level search: the e-graph holds the quantized matmul and the
streaming attention next to their primitive forms, extraction chooses by the cost model, and kernel
formation lowers only what was chosen; every result is checked against the reference interpreter."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed import frontend as F
from lightspeed.graph import Program
from lightspeed.kernel import form_kernels
from lightspeed.quant import QType
from lightspeed.quant.decode_graph import dequant_matrix_graph
from lightspeed.search import CostModel, search_graph, validate_program
from lightspeed.search import calibration as cost
from lightspeed.search import knobs as K
from lightspeed.search.lowering import choose_lowerings, find_alternatives

pytest.importorskip("egglog")

RIGGED = CostModel(qmatmul_flop_rate=1e3, attention_flop_rate=1e3)  # lowered kernels made very dear


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    # one cache for the module: the cost model is calibrated once
    monkeypatch.setenv("LIGHTSPEED_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ls_cache_lowered"))
    monkeypatch.setattr(K, "configurations", lambda level: [{}])  # schedules: the heuristics only


def _q4_1(rng, rows: int, k: int) -> np.ndarray:
    raw = rng.integers(0, 256, size=(rows, k // 32, 20), dtype=np.uint8)
    raw[:, :, 0:2] = np.array([0.02], np.float16).view(np.uint8)  # scale d
    raw[:, :, 2:4] = np.array([-0.1], np.float16).view(np.uint8)  # minimum m
    return raw.reshape(rows, -1)


def qmatmul_graph():
    rng = np.random.default_rng(0)
    g = ls.Graph()
    x = g.input("x", (3, 64))
    y = (x * 0.5).sin().linear(dequant_matrix_graph(g.constant(_q4_1(rng, 40, 64)), QType.Q4_1))
    return g, [y], {"x": rng.standard_normal((3, 64)).astype(np.float32)}, "qmatmul"


def attention_graph():
    rng = np.random.default_rng(1)
    g = ls.Graph()
    q, k, v = (g.input(name, (2, 48, 16)) for name in "qkv")
    o = F.scaled_dot_product_attention(q, k, v, causal=True)
    return g, [o], {name: rng.standard_normal((2, 48, 16)).astype(np.float32) for name in "qkv"}, "attention"


def _schedules(prog) -> list[str]:
    return [k.kind for k in prog.executor.plan.kernels]


def _check(g, outs, inputs, prog) -> None:
    want = g.compile(outs, backend="reference")(**inputs)
    for got, ref in zip(prog(**inputs), want):
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * max(float(np.abs(ref).max()), 1.0))


@pytest.mark.parametrize("case", [qmatmul_graph, attention_graph], ids=["qmatmul", "attention"])
def test_e_graph_holds_both_forms_and_picks_the_lowered_one(case, monkeypatch):
    from lightspeed.search.egraph import encode, read_egraph, saturate, serialized
    g, outs, inputs, kind = case()
    program = Program.build(g, outs)
    (alt,) = find_alternatives(program)
    assert alt.kind == kind
    enc = encode(program, [alt])
    eg, _ = saturate(enc.text, ("lowered",))
    view = read_egraph(serialized(eg))
    ops = sorted(e.op for e in view.classes[view.roots[alt.root.id]])
    assert ops == ["Lowered", "Sum"]  # the lowered kernel next to the primitive reduction it computes

    # a fixed model (the defaults, not a measurement: a loaded machine must not flip the choice)
    monkeypatch.setattr(cost, "calibrate", lambda: CostModel())
    choice = choose_lowerings(program, cost.calibrate())
    (d,) = choice.decisions
    assert (d.kind, d.node, d.chosen) == (kind, alt.root.id, True) and d.lowered_s < d.primitive_s

    # the cost model's choice as formed: no template race (test_template_race.py), whose timings of kernels
    # of microseconds may drop the attention here on a loaded machine
    from lightspeed.search import driver
    monkeypatch.setattr(driver, "RACE_MIN_BUDGET_S", float("inf"))
    prog = g.compile(outs, backend="c", search=1, search_budget_s=20)
    report = prog.executor.search_report
    assert [(d.kind, d.chosen) for d in report.lowering.decisions] == [(kind, True)]
    assert kind in _schedules(prog)
    # the lowered forms are cheaper: the same plan as without search
    assert _schedules(prog) == _schedules(g.compile(outs, backend="c"))
    _check(g, outs, inputs, prog)


@pytest.mark.parametrize("case", [qmatmul_graph, attention_graph], ids=["qmatmul", "attention"])
def test_dearer_lowered_form_is_not_formed(case, monkeypatch):
    g, outs, inputs, kind = case()
    program = Program.build(g, outs)
    (d,) = choose_lowerings(program, RIGGED).decisions
    assert not d.chosen and d.lowered_s > d.primitive_s
    assert kind not in [k.kind for k in form_kernels(program, lower_only=frozenset()).kernels]

    monkeypatch.setattr(cost, "calibrate", lambda: RIGGED)
    prog = g.compile(outs, backend="c", search=1, search_budget_s=20)
    assert [(d.kind, d.chosen) for d in prog.executor.search_report.lowering.decisions] == [(kind, False)]
    assert kind not in _schedules(prog)
    _check(g, outs, inputs, prog)


def test_search_off_lowers_every_match():
    for case in (qmatmul_graph, attention_graph):
        g, outs, inputs, kind = case()
        prog = g.compile(outs, backend="c")
        assert prog.executor.search_report is None and kind in _schedules(prog)
        _check(g, outs, inputs, prog)
        program = Program.build(g, outs)
        everything = frozenset(a.root.id for a in find_alternatives(program))
        default, chosen = (form_kernels(program, lower_only=s) for s in (None, everything))
        assert [(k.name, k.kind) for k in default.kernels] == [(k.name, k.kind) for k in chosen.kernels]


def test_level_two_keeps_lowering_through_rewrites():
    """The e-graph with rounding rules rebuilds the program (x*a + x*b -> x*(a+b)): the chosen lowered
    kernels are found again in the new program (the decoded weight's facts follow it) and are the nodes
    kernel formation may lower; under the rigged model none are."""
    g = ls.Graph()
    x, a, b = (g.input(n, (3, 64)) for n in "xab")
    w = dequant_matrix_graph(g.constant(_q4_1(np.random.default_rng(2), 40, 64)), QType.Q4_1)
    program = Program.build(g, [(x * a + x * b).linear(w)])
    for model, lowered in ((CostModel(), True), (RIGGED, False)):
        r = search_graph(program, level=2, model=model)
        assert r.chosen == "e-graph" and validate_program(r.program, program)
        assert [d.chosen for d in r.decisions] == [lowered]
        roots = {a.root.id for a in find_alternatives(r.program) if a.kind == "qmatmul"}
        assert r.lower_only == (roots if lowered else frozenset())
        assert ("qmatmul" in [k.kind for k in form_kernels(r.program, lower_only=r.lower_only).kernels]) == lowered
