"""Graph-level search: rewrite rules to a fixpoint, then an e-graph of equivalent programs, extraction by
the cost model, and a reference check of every candidate before it is chosen.

The original program is always a candidate, so the result is never worse (by the model) and never
wrong (by the check): a candidate that fails the reference check is discarded, whatever its cost. (The
rewrite under the built-in safe rules is exact by construction, each rule property-tested, and is not run
through the reference again; with extra rules it is.)

Lowered kernels (``lowering.py``) are alternatives in the e-graph: the e-graph candidate comes with the
set of nodes to lower (``lower_only``); the original and the rewrite lower every match, as kernel
formation does by default. Each candidate is costed as it will be formed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..graph import Program
from ..rewrite import rewrite_program, rules
from .check import validate_program
from .cost import CostModel
from .decision import Decision
from .lowering import find_alternatives, lowered_program_cost


@dataclass
class Candidate:
    name: str
    program: Program
    cost: float
    valid: bool | None = None  # None: not checked (not needed)
    lower_only: frozenset[int] | None = None  # nodes to lower (None: every match)
    decisions: list[Decision] = field(default_factory=list)  # the e-graph's lowered alternatives
    checked: bool = False  # whether ``valid`` came from a reference run (else: the original, or exact rules)


@dataclass
class GraphSearchResult:
    program: Program
    chosen: str
    candidates: list[Candidate] = field(default_factory=list)
    saturation: object = None  # egraph.saturate.Saturation, when the e-graph ran
    seconds: float = 0.0
    note: str = ""
    lower_only: frozenset[int] | None = None  # the chosen candidate's
    decisions: list[Decision] = field(default_factory=list)
    fired: dict = field(default_factory=dict)  # rewrite rule name -> times applied (the "rewrite" candidate)


WINDOW_SHARE = 0.25  # a program whose encoding alone takes more of the e-node limit is cut into windows


def e_graph_candidate(program: Program, rulesets: tuple[str, ...], model: CostModel, max_iterations: int,
                      max_enodes: int, time_limit_s: float, extra_rules: str = "", alternatives=()):
    """(the cheapest program the e-graph holds, the saturation report, the node ids of that program to
    lower, the decisions on the lowered ``alternatives``). A program whose encoding takes more than
    ``WINDOW_SHARE`` of ``max_enodes`` is saturated window by window, repeated layers once
    (egraph/windows.py), with ``max_enodes`` per distinct window."""
    from .egraph import Extractor, Rebuilder, encode, read_egraph, saturate, serialized
    from .egraph.windows import saturate_windows
    enc = encode(program, alternatives)
    if enc.text.count("\n") > WINDOW_SHARE * max_enodes:
        view, enc, sat = saturate_windows(program, rulesets, max_iterations, max_enodes, time_limit_s, extra_rules,
                                          alternatives)
    else:
        eg, sat = saturate(enc.text, rulesets, max_iterations, max_enodes, time_limit_s, extra_rules)
        view = read_egraph(serialized(eg))
    ex = Extractor(view, enc, model)
    rb = Rebuilder(program, ex)
    return rb.program_out(), sat, frozenset(rb.lowered_roots), ex.lowered_decisions()


def _cost(program: Program, model: CostModel, lower_only: frozenset[int] | None = None) -> float:
    alts = find_alternatives(program)
    return lowered_program_cost(program, model, [a for a in alts if lower_only is None or a.root.id in lower_only])


def search_graph(program: Program, level: int = 1, budget_s: float = 5.0, model: CostModel | None = None,
                 rulesets: tuple[str, ...] | None = None, check_trials: int = 2,
                 extra_rules: list | None = None, extra_egg: str = "",
                 max_enodes: int | None = None) -> GraphSearchResult:
    """The cheapest program, by ``model``, among: the original, its rewrite to a fixpoint under the safe
    rules, and the e-graph's extraction (``level`` 1: exact e-graph rules; 2: also rules that change
    rounding; both with the lowered kernels as alternatives). Every candidate other than the original and
    the rewrite under the built-in safe rules alone must pass ``validate_program``. ``extra_rules``
    (rewrite.Rule) and ``extra_egg`` (egglog rule text) add rules to the two stages; ``max_enodes`` is
    the e-graph's size limit (default 5,000 at level 1, 20,000 at level 2; per distinct window when the
    program is cut into windows, see ``e_graph_candidate``)."""
    t0 = time.perf_counter()
    model = model or CostModel()
    cands = [Candidate("original", program, _cost(program, model), True)]
    note = ""
    rewritten = rewrite_program(program, rules.NORMALISE + list(extra_rules or []))
    safe = rewritten.program
    # the built-in safe rules are EXACT or VALUE, each property-tested (tests/test_rewrite_rules.py): their
    # rewrite needs no reference run (a large model's takes minutes); with extra rules it is checked
    cands.append(Candidate("rewrite", safe, _cost(safe, model), None if extra_rules else True))
    sat = None
    if rulesets is None:
        rulesets = ("exact", "lowered") if level <= 1 else ("exact", "rounding", "lowered")
    remaining = budget_s - (time.perf_counter() - t0)
    if remaining > 0:
        try:
            alts = find_alternatives(safe) if "lowered" in rulesets else []
            extracted, sat, lower_only, decisions = e_graph_candidate(
                safe, rulesets, model, 4 if level <= 1 else 10,
                max_enodes or (5_000 if level <= 1 else 20_000), remaining * 0.5,
                extra_egg, alts)
            cands.append(Candidate("e-graph", extracted, _cost(extracted, model, lower_only), None, lower_only,
                                   decisions))
        except ImportError as e:
            note = str(e)
        except RuntimeError as e:  # an extraction that does not form a program is skipped
            note = f"e-graph extraction failed: {e}"
    chosen = cands[0]
    for c in sorted(cands, key=lambda c: c.cost):
        if c.cost >= chosen.cost:
            break
        if c.valid is None:
            c.valid, c.checked = validate_program(c.program, program, trials=check_trials), True
        if c.valid:
            chosen = c
            break
    return GraphSearchResult(chosen.program, chosen.name, cands, sat, time.perf_counter() - t0, note,
                             chosen.lower_only, chosen.decisions, dict(rewritten.fired))
