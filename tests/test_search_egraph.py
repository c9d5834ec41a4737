"""Graph-level search: the e-graph (egglog) finds cheaper equivalent programs, and extraction only ever
returns a program that the reference interpreter validates."""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lightspeed as ls
from lightspeed.graph import Program
from lightspeed.ops import Op
from lightspeed.search import CostModel, program_cost, search_graph, validate_program
from lightspeed.search.egraph import Extractor, Rebuilder, encode, read_egraph, saturate, serialized

pytest.importorskip("egglog")


def _ops(program: Program) -> list[Op]:
    return [n.op for n in program.nodes]


def test_encoding_round_trips_without_rules():
    """With no rules the e-graph holds exactly the program, and extraction rebuilds an equal one."""
    g = ls.Graph()
    x = g.input("x", (3, 4))
    m = g.input("m", (3, 4), ls.bool_)
    i = g.input("i", (3,), ls.int32)
    y = ((x.T * 2.0).exp2().T + x.pad(((1, 0), (0, 0)))[:3]) * m
    z = (y.max(-1) + i.cast(ls.float32)).sum(0) + x.gather(i).sum()
    program = Program.build(g, [y, z, i * 2])
    enc = encode(program)
    eg, sat = saturate(enc.text, rulesets=())
    ex = Extractor(read_egraph(serialized(eg)), enc, CostModel())
    new = Rebuilder(program, ex).program_out()
    assert sorted(o.value for o in _ops(new)) == sorted(o.value for o in _ops(program))
    assert validate_program(new, program, trials=3)
    assert "MView" in enc.text and "Sel" in enc.text and "Leaf" in enc.text


def test_factoring_a_common_operand():
    g = ls.Graph()
    x, a, b = (g.input(n, (32, 32)) for n in "xab")
    program = Program.build(g, [x * a + x * b])
    r = search_graph(program, level=2)
    assert r.chosen == "e-graph"
    assert _ops(r.program).count(Op.MUL) == 1
    assert validate_program(r.program, program, trials=3)


def test_exact_level_keeps_rounding():
    """Level 1 uses only rules that keep every value: no reassociation or factoring."""
    g = ls.Graph()
    x, a, b = (g.input(n, (32, 32)) for n in "xab")
    program = Program.build(g, [x * a + x * b])
    r = search_graph(program, level=1)
    assert _ops(r.program).count(Op.MUL) == 2


def test_exp2_products_merge_and_sums_reorder():
    g = ls.Graph()
    x = g.input("x", (8, 16))
    y = g.input("y", (8, 16))
    program = Program.build(g, [(x.exp2() * y.exp2()).sum(0).sum(0)])
    r = search_graph(program, level=2)
    assert _ops(r.program).count(Op.EXP2) == 1
    assert validate_program(r.program, program, trials=3)


def test_wrong_rule_is_never_chosen():
    """A deliberately wrong rule makes the e-graph's cheapest program wrong: the reference check rejects
    it and the search returns a program that validates."""
    g = ls.Graph()
    x = g.input("x", (16, 16))
    program = Program.build(g, [x.exp2() * 3.0])
    r = search_graph(program, level=2, extra_egg="(rewrite (Exp2 a) a :ruleset exact)")
    egraph = [c for c in r.candidates if c.name == "e-graph"][0]
    assert egraph.cost < program_cost(program, CostModel())  # it was the cheapest ...
    assert egraph.valid is False  # ... but wrong
    assert r.chosen != "e-graph"
    assert validate_program(r.program, program, trials=3)


def test_time_budget_holds_for_an_exploding_egraph():
    """A long sum of products blows up under associativity and commutativity: limits stop it."""
    g = ls.Graph()
    xs = [g.input(f"x{k}", (4,)) for k in range(24)]
    acc = xs[0] * xs[1]
    for k in range(2, 24):
        acc = acc + xs[k] * xs[(k + 5) % 24]
    program = Program.build(g, [acc])
    t0 = time.perf_counter()
    r = search_graph(program, level=2, budget_s=1.0)
    elapsed = time.perf_counter() - t0
    assert elapsed < 6.0, elapsed  # the e-graph gets half the budget; one iteration may overrun it
    assert r.saturation is not None and r.saturation.stopped_by in ("time", "enodes", "iterations", "saturated")
    assert validate_program(r.program, program, trials=2)


# random float32 graphs ---------------------------------------------------------------------------

@st.composite
def float_graphs(draw):
    g = ls.Graph()
    pool = [g.input(f"x{k}", (3, 4)) for k in range(3)]
    for _ in range(draw(st.integers(2, 10))):
        kind = draw(st.sampled_from(["add", "mul", "recip", "exp2", "sum", "max", "view", "const", "select"]))
        a = draw(st.sampled_from(pool))
        b = draw(st.sampled_from(pool))
        if kind == "add":
            v = a + b
        elif kind == "mul":
            v = a * b
        elif kind == "recip":
            v = (a * a + 1.0).recip()
        elif kind == "exp2":
            v = (a * 0.5).exp2()
        elif kind in ("sum", "max"):
            r = a.sum(-1, keepdim=True) if kind == "sum" else a.max(0, keepdim=True)
            v = r.expand(a.shape) * b
        elif kind == "view":
            v = a.flip(0).pad(((0, 0), (1, 0)))[:, :4] + b
        elif kind == "const":
            v = a * draw(st.sampled_from([1.0, -1.0, 2.0, 0.5])) + b * 3.0
        else:
            v = ls.frontend.where(a.less_than(b), a, b * 2.0)
        pool.append(v)
    outs = pool[3:][-draw(st.integers(1, 3)):]
    return Program.build(g, outs)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(program=float_graphs(), level=st.sampled_from([1, 2]))
def test_extraction_always_validates(program, level):
    r = search_graph(program, level=level, budget_s=2.0)
    model = CostModel()
    assert program_cost(r.program, model) <= program_cost(program, model) + 1e-15
    assert validate_program(r.program, program, trials=2, seed=7)
    chosen = [c for c in r.candidates if c.name == r.chosen][0]
    assert chosen.valid is True
