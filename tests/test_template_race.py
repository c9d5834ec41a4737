"""Templates raced against the compiler's own kernels (search/template_race.py): the race's mechanics with
rigged timings (so the test does not depend on which one this machine runs faster), for quantized matmuls and
streaming attention, how a template's region maps to the kernels of the plan without templates
(search/race_regions.py), and the whole search path through ``g.compile(..., search=1)``."""
from __future__ import annotations

import numpy as np
import pytest

import lightspeed as ls
from lightspeed import frontend as F
from lightspeed.graph import Program
from lightspeed.quant import QType
from lightspeed.quant.decode_graph import dequant_matrix_graph
from lightspeed.search import explain
from lightspeed.search import knobs as K
from lightspeed.search import race_regions as RR
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
    """Every kernel of a plan with templates takes 1 s and every kernel of a plan without 0.1 s (or 2 s): a
    template's generated counterpart (at most 6 kernels here) is then faster (slower) than the template."""
    def timed(self, *a, **kw):
        templated = any(k.kind in TR.RACED_KINDS for k in self.plan.kernels)
        s = 1.0 if templated else (0.1 if generated_faster else 2.0)
        return s, [s] * len(self.plan.kernels)
    monkeypatch.setattr(PlanRunner, "time", timed)


def _race(program, env):
    from lightspeed.backend.c.compiler import default_flags, find_compiler
    return TR.race_templates(program, None, {"use_templates": True}, find_compiler(), default_flags(), env)


@pytest.mark.parametrize("generated_faster", [True, False])
def test_a_slower_template_is_dropped_and_a_faster_one_kept(monkeypatch, generated_faster):
    from lightspeed.backend.c.compiler import default_flags, find_compiler
    _, _, program = _program()
    _rig(monkeypatch, generated_faster)
    lower_only, res = TR.race_templates(program, None, {"use_templates": True}, find_compiler(), default_flags(),
                                        {"seq": 4})
    assert len(res.times) == 2 and set(res.kinds.values()) == {"qmatmul"}, res  # both quantized matmuls raced
    # the Q4_1 matmul's generated counterpart is its [seq, 64, 48] product kernel and the reduction, both counted
    assert sorted(len(generated) for _, generated in res.kernels.values()) == [1, 2], res.kernels
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


# --- streaming attention ---------------------------------------------------------------------------------------

def _attention_graph():
    """x -> q, k, v projections (2 heads of 16) -> causal attention -> heads back to [seq, 32]."""
    rng = np.random.default_rng(3)
    g = ls.Graph()
    seq = ls.dim("seq", 1, 64)
    x = g.input("x", (seq, 32))
    q, k, v = ((x @ g.constant(rng.standard_normal((32, 32)).astype(np.float32) / 6)).reshape((seq, 2, 16))
               .permute((1, 0, 2)) for _ in range(3))
    y = F.scaled_dot_product_attention(q, k, v, causal=True).permute((1, 0, 2)).reshape((seq, 32))
    return g, [y]


def _check(g, outs, prog, sizes=(1, 5, 64)) -> None:
    ref = g.compile(outs, backend="reference")
    for rows in sizes:
        xv = RNG.standard_normal((rows, 32)).astype(np.float32)
        for got, want in zip(prog(x=xv), ref(x=xv)):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("generated_faster", [True, False])
def test_the_attention_is_raced_against_its_score_and_softmax_kernels(monkeypatch, generated_faster):
    g, outs = _attention_graph()
    _rig(monkeypatch, generated_faster)
    lower_only, res = _race(Program.build(g, outs), {"seq": 64})
    (nid,) = res.times
    assert res.kinds == {nid: "attention"} and not res.skipped
    templated, generated = res.kernels[nid]
    assert templated == (f"k{nid}",)
    # the generated side: the scores, the softmax's max, exponentials, sum and weights, the weighted sum
    assert len(generated) >= 4 and f"k{nid}" in generated, generated
    assert res.times[nid] == (1.0, pytest.approx(len(generated) * (0.1 if generated_faster else 2.0)))
    if generated_faster:
        assert res.dropped == {nid} and lower_only == frozenset()
    else:
        assert not res.dropped and lower_only is None


def test_an_attention_measured_below_its_bounds_keeps_its_template(monkeypatch):
    """At 48 of up to 64 tokens: the generated form's scores grow with the square of the keys, so a time at
    one size is not taken for the bound."""
    g, outs = _attention_graph()
    _rig(monkeypatch, True)
    lower_only, res = _race(Program.build(g, outs), {"seq": 48})
    (nid,) = res.skipped
    assert res.kinds == {nid: "attention"} and not res.dropped and lower_only is None
    assert "seq=48 of up to 64" in res.skipped[nid], res.skipped


def test_an_attention_fused_across_its_border_is_not_raced(monkeypatch):
    """Four keys and a value read along the keys: without templates the weighted sum is a loop reduction
    inlined into the kernel of ``sin(2 o)``, whose time cannot be split at the region's border."""
    g = ls.Graph()
    q, k = (g.input(n, (1, 4, 16)) for n in "qk")
    o = F.scaled_dot_product_attention(q, k, g.input("v", (1, 16, 4)).permute((0, 2, 1)))
    _rig(monkeypatch, True)
    lower_only, res = _race(Program.build(g, [(o * 2.0).sin()]), {})
    (nid,) = res.skipped
    assert res.kinds == {nid: "attention"} and not res.times and not res.dropped and lower_only is None
    assert "which stores a node outside it" in res.skipped[nid], res.skipped
    assert "not raced" in explain(_report(res))


def _report(race):
    from lightspeed.search.driver import SearchReport
    return SearchReport(1, 1.0, race=race)


class _Plan:
    """The three maps race_regions.counterpart reads, for a made-up plan: kernel name -> nodes it computes."""

    def __init__(self, computes: dict[str, set[int]]):
        self.order = {k: i for i, k in enumerate(computes)}
        self.computes = {k: frozenset(v) for k, v in computes.items()}
        self.stores = {RR.kernel_node(k): [k] for k in computes}
        self.computed_by: dict[int, set[str]] = {}
        for k, nodes in computes.items():
            for n in nodes:
                self.computed_by.setdefault(n, set()).add(k)

    storing = RR.PlanNodes.storing


def test_a_node_one_side_stores_and_the_other_inlines_joins_both_sides():
    # region {10, 11, 12}: the template k12 reads node 5 from a buffer (k5, which inlines 4); the generated
    # score kernel k10 inlines 5 and 4, so k5 is the template side's too
    with_t = _Plan({"k5": {5, 4}, "k12": {12, 11, 10}, "k20": {20}})
    without = _Plan({"k10": {10, 5, 4}, "k11": {11}, "k12": {12}, "k20": {20}})
    cp = RR.counterpart(frozenset({10, 11, 12}), with_t, without, "k12", {"k12"})
    assert (cp.templated, cp.generated, cp.note) == (("k5", "k12"), ("k10", "k11", "k12"), "")
    # the same region when the generated plan inlines its root into the reader k20
    fused = _Plan({"k10": {10}, "k11": {11}, "k20": {20, 12}})
    assert "computes its node 12 in k20" in RR.counterpart(frozenset({10, 11, 12}), with_t, fused, "k12",
                                                           {"k12"}).note
    assert RR.kernel_node("k12_copy") == 12 and RR.kernel_node("other") is None


@pytest.mark.parametrize("generated_faster", [True, False])
def test_search_keeps_or_drops_the_attention_as_the_race_measured(monkeypatch, generated_faster):
    g, outs = _attention_graph()
    _rig(monkeypatch, generated_faster)
    from lightspeed.search import calibration, cost
    monkeypatch.setattr(calibration, "calibrate", lambda: cost.CostModel())
    monkeypatch.setattr(K, "configurations", lambda level: [{}])  # schedules: the heuristics only
    prog = g.compile(outs, backend="c", search=1, search_budget_s=60, search_dims={"seq": 64})
    race = prog.executor.search_report.race
    assert list(race.kinds.values()) == ["attention"] and len(race.times) == 1, race
    kinds = [k.kind for k in prog.executor.plan.kernels]
    if generated_faster:  # the scores and the softmax are kernels of their own
        assert race.dropped and "attention" not in kinds and kinds.count("loop") >= 3, kinds
    else:
        assert not race.dropped and "attention" in kinds, kinds
    text = explain(prog)
    assert f"attention k{next(iter(race.times))}: template" in text
    assert ("dropped" if generated_faster else "kept") in text.split("attention k")[-1], text
    _check(g, outs, prog)


def test_search_races_the_attention_unrigged_and_matches_the_reference(monkeypatch):
    g, outs = _attention_graph()
    from lightspeed.search import calibration, cost
    monkeypatch.setattr(calibration, "calibrate", lambda: cost.CostModel())
    monkeypatch.setattr(K, "configurations", lambda level: [{}])
    prog = g.compile(outs, backend="c", search=1, search_budget_s=60, search_dims={"seq": 64})
    race = prog.executor.search_report.race
    assert len(race.times) == 1 and race.kinds == {nid: "attention" for nid in race.times}, race
    kinds = [k.kind for k in prog.executor.plan.kernels]
    assert ("attention" in kinds) != bool(race.dropped), (kinds, race)  # formed as the race chose
    _check(g, outs, prog)
