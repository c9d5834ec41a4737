"""Graph search over repeated layers (search/egraph/windows.py): a program is cut into windows at its
period, each distinct window saturated once, and the union extracted as one e-graph; plus the guarantees
that hold whatever the e-graph holds: a planted slower equivalent form is never chosen, a planted wrong
rule never survives the reference check (also one that breaks the safe softmax of an attention)."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed import frontend as F
from lightspeed.frontend.extra_torch import any_true, eq_ieee
from lightspeed.graph import Program
from lightspeed.ops import Op
from lightspeed.rewrite import P, Rule
from lightspeed.rewrite.rule import ROUNDING
from lightspeed.search import CostModel, program_cost, search_graph, validate_program
from lightspeed.search.egraph.windows import find_windows

pytest.importorskip("egglog")

LAYERS = 6


def _layers(n: int = LAYERS) -> Program:
    """n identical blocks (different weights) whose products of exponentials the rounding rules merge:
    exp2(x W1) * exp2(x W2) -> exp2(x W1 + x W2)."""
    g = ls.Graph()
    x = g.input("x", (4, 8))
    rng = np.random.default_rng(0)
    for k in range(n):
        w1 = g.constant(rng.standard_normal((8, 8)).astype(np.float32) * 0.1)
        w2 = g.constant(rng.standard_normal((8, 8)).astype(np.float32) * 0.1)
        x = ((x @ w1).exp2() * (x @ w2).exp2()) * 0.5 + x
    return Program.build(g, [x])


def test_windows_follow_the_layers():
    program = _layers()
    windows = find_windows(program)
    assert sum(len(w) for w in windows) == len(program.nodes)
    assert [n.id for w in windows for n in w] == [n.id for n in program.nodes]  # consecutive, in order
    assert len(windows) >= LAYERS


def test_small_programs_are_one_window():
    g = ls.Graph()
    x = g.input("x", (4,))
    assert len(find_windows(Program.build(g, [x.exp2() + 1.0]))) == 1


def test_repeated_layers_saturate_once_and_every_layer_improves():
    program = _layers()
    # a small e-node limit forces the windowed path (the encoding takes more than a quarter of it)
    r = search_graph(program, level=2, budget_s=20.0, max_enodes=200)
    sat = r.saturation
    assert type(sat).__name__ == "WindowedSaturation"
    assert sat.saturated and sat.distinct < sat.windows
    assert r.chosen == "e-graph"
    ops = [n.op for n in r.program.nodes]
    assert ops.count(Op.EXP2) == LAYERS  # was 2 per layer
    assert validate_program(r.program, program, trials=3)


def test_planted_slower_form_is_never_chosen():
    """A rule that only adds work (x -> (x * 2) * 0.5, exact in real arithmetic) fills the e-graph with
    slower equivalent forms; extraction keeps the cheaper one."""
    program = _layers(4)
    slow = "(rewrite (Exp2 a) (Mul (Mul (Exp2 a) (Num 1073741824)) (Num 1056964608)) :ruleset rounding)"
    for limit in (200, 20_000):  # windowed and whole
        r = search_graph(program, level=2, budget_s=10.0, extra_egg=slow, max_enodes=limit)
        model = CostModel()
        assert program_cost(r.program, model) <= program_cost(program, model) + 1e-15
        assert [n.op for n in r.program.nodes].count(Op.MUL) <= [n.op for n in program.nodes].count(Op.MUL)


def test_planted_wrong_rule_never_survives_windowed():
    program = _layers(4)
    wrong = "(rewrite (Exp2 a) a :ruleset exact)"
    r = search_graph(program, level=2, budget_s=10.0, extra_egg=wrong, max_enodes=200)
    egraph = [c for c in r.candidates if c.name == "e-graph"][0]
    assert egraph.cost < program_cost(program, CostModel()) and egraph.valid is False
    assert r.chosen != "e-graph"
    assert validate_program(r.program, program, trials=3)


def _safe_attention() -> Program:
    """PyTorch's safe softmax over a boolean mask with two keys, so that random masks leave rows that see
    no key (0 in the safe softmax, NaN without the select)."""
    g = ls.Graph()
    q, k, v = g.input("q", (8, 4)), g.input("k", (2, 4)), g.input("v", (2, 4))
    m = g.input("m", (8, 2), ls.bool_)
    x = F.where(m, (q.reshape((8, 1, 4)) * k.reshape((1, 2, 4))).sum(-1), float("-inf"))
    keep = any_true(F.logical_not(eq_ieee(x, float("-inf"))), 1).reshape((8, 1))
    w = F.where(F.logical_not(keep), 0.0, F.softmax(x, -1))
    return Program.build(g, [(w.reshape((8, 2, 1)) * v.reshape((1, 2, 4))).sum(1)])


def test_planted_rule_dropping_the_safe_select_never_survives():
    """A rule that drops the safe softmax's select (Sel(q, W) -> W: cheaper, and equal wherever a row sees
    a key) is caught by the reference check on random masks."""
    def drop(m):
        return m.w if m.q.dtype is ls.bool_ and m.w.dtype is ls.float32 else None
    planted = Rule("drop-select", P.q * P.w, drop, ROUNDING, "wrong on rows whose every key is masked")
    program = _safe_attention()
    r = search_graph(program, level=1, budget_s=5.0, extra_rules=[planted], check_trials=4)
    rewrite = [c for c in r.candidates if c.name == "rewrite"][0]
    assert rewrite.valid is False
    assert validate_program(r.program, program, trials=4)
