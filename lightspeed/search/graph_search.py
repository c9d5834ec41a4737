"""Graph-level search: rewrite rules to a fixpoint, then an e-graph of equivalent programs, extraction by
the cost model, and a reference check of every candidate before it is chosen.

The original program is always a candidate, so the result is never worse (by the model) and never
wrong (by the check): a candidate that fails the reference check is discarded, whatever its cost.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..graph import Program
from ..rewrite import rewrite_program, rules
from .check import validate_program
from .cost import CostModel, program_cost


@dataclass
class Candidate:
    name: str
    program: Program
    cost: float
    valid: bool | None = None  # None: not checked (not needed)


@dataclass
class GraphSearchResult:
    program: Program
    chosen: str
    candidates: list[Candidate] = field(default_factory=list)
    saturation: object = None  # egraph.saturate.Saturation, when the e-graph ran
    seconds: float = 0.0
    note: str = ""


def e_graph_candidate(program: Program, rulesets: tuple[str, ...], model: CostModel, max_iterations: int,
                      max_enodes: int, time_limit_s: float, extra_rules: str = ""):
    """(the cheapest program the e-graph holds, the saturation report)."""
    from .egraph import Extractor, Rebuilder, encode, read_egraph, saturate, serialized
    enc = encode(program)
    eg, sat = saturate(enc.text, rulesets, max_iterations, max_enodes, time_limit_s, extra_rules)
    ex = Extractor(read_egraph(serialized(eg)), enc, model)
    return Rebuilder(program, ex).program_out(), sat


def search_graph(program: Program, level: int = 1, budget_s: float = 5.0, model: CostModel | None = None,
                 rulesets: tuple[str, ...] | None = None, check_trials: int = 2,
                 extra_rules: list | None = None, extra_egg: str = "") -> GraphSearchResult:
    """The cheapest program, by ``model``, among: the original, its rewrite to a fixpoint under the safe
    rules, and the e-graph's extraction (``level`` 1: exact e-graph rules; 2: also rules that change
    rounding). Every candidate other than the original must pass ``validate_program``. ``extra_rules``
    (rewrite.Rule) and ``extra_egg`` (egglog rule text) add rules to the two stages."""
    t0 = time.perf_counter()
    model = model or CostModel()
    cands = [Candidate("original", program, program_cost(program, model), True)]
    note = ""
    safe = rewrite_program(program, rules.SAFE + list(extra_rules or [])).program
    cands.append(Candidate("rewrite", safe, program_cost(safe, model)))
    sat = None
    if rulesets is None:
        rulesets = ("exact",) if level <= 1 else ("exact", "rounding")
    remaining = budget_s - (time.perf_counter() - t0)
    if remaining > 0:
        try:
            extracted, sat = e_graph_candidate(safe, rulesets, model, 4 if level <= 1 else 10,
                                               5_000 if level <= 1 else 20_000, remaining * 0.5, extra_egg)
            cands.append(Candidate("e-graph", extracted, program_cost(extracted, model)))
        except ImportError as e:
            note = str(e)
        except RuntimeError as e:  # an extraction that does not form a program is skipped
            note = f"e-graph extraction failed: {e}"
    chosen = cands[0]
    for c in sorted(cands, key=lambda c: c.cost):
        if c.cost >= chosen.cost:
            break
        c.valid = validate_program(c.program, program, trials=check_trials)
        if c.valid:
            chosen = c
            break
    return GraphSearchResult(chosen.program, chosen.name, cands, sat, time.perf_counter() - t0, note)
