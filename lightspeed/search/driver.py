"""What ``graph.compile(..., backend="c", search=level)`` runs: graph-level search, then kernel-level
schedule search on the resulting kernel plan, sharing one time budget.

Level 1 (quick): exact rewrites (the rewrite package's SAFE rules), an e-graph holding the program and
its lowered kernels as alternatives (extracted by the calibrated cost model: which to lower), the templates
(quantized matmuls, streaming attention) timed against the compiler's own kernels for the same nodes
(template_race.py: a slower template is dropped), and a few knob settings per kernel.
Level 2 (thorough): the e-graph with exact and rounding rules and the lowered alternatives, the valid graph
candidates compiled and timed (measured.py: the machine, not the model, has the last word), and a grid of
knob settings.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from ..backend.c.compiler import default_flags, find_compiler
from ..backend.c.scheduling import form_c_plan
from ..graph import Program
from ..kernel.fusion import KernelPlan
from ..rewrite import rewrite_program, rules
from .lowering import LoweringChoice, choose_lowerings, find_alternatives
from .measured import MeasuredChoice, measure_candidates
from .check import tune_dims
from .schedule import ScheduleResult, tune_schedule
from .template_race import RaceResult, race_templates

DEFAULT_BUDGET_S = {1: 30.0, 2: 120.0}
GRAPH_SHARE = 0.25  # of the budget, at most, for graph-level search (level 2)
RACE_MIN_BUDGET_S = 5.0  # templates are raced against generated kernels when this much budget is left
RACE_SHARE = 0.5  # of the budget left, at most, for the race's two compiles (the rest: kernel schedules)
MEASURE_SHARE = 0.25  # of the budget left after graph search, at most, for timing its candidates (level 2)
MEASURE_MIN_BUDGET_S = 2.0  # graph candidates are timed when this much of that share is left


@dataclass
class SearchReport:
    level: int
    budget_s: float
    graph: str = "original"  # original | rewrite | e-graph
    rewrites: dict = field(default_factory=dict)  # rule name -> times fired (level 1)
    # the lowered kernels that were alternatives, their costs and which were chosen (``decisions``)
    lowering: LoweringChoice | None = None
    race: RaceResult | None = None  # templates against generated kernels, measured (template_race.py)
    schedule: ScheduleResult | None = None
    seconds: float = 0.0
    # level 2: the graph candidates (name, modelled seconds, valid: True/False/None = not needed, whether
    # a reference run decided it)
    # and the e-graph's saturation report (egraph.Saturation or windows.WindowedSaturation)
    candidates: list = field(default_factory=list)
    saturation: object = None
    measured: MeasuredChoice | None = None  # level 2: the valid graph candidates timed on this machine
    # what changed in the program: op name -> (count before, count after), for ops whose count changed
    ops_changed: dict = field(default_factory=dict)
    nodes: tuple = (0, 0)  # node count before and after


def search_compile(program: Program, plan: KernelPlan, level: int, budget_s: float | None = None, *,
                   cc: str | None = None, flags: list[str] | None = None, dims: dict[str, int] | None = None,
                   form_options: dict | None = None, progress: bool | None = None):
    """(kernel plan, schedule for ``render_plan``, SearchReport) for ``program`` at search ``level``.

    ``plan`` is the heuristic plan of ``program`` (formed with ``form_options``); it is kept unless a
    rewritten program replaces it."""
    if level not in (1, 2):
        raise ValueError(f"search level must be 0 (heuristics), 1 (quick) or 2 (thorough), got {level!r}")
    t0 = time.perf_counter()
    budget = DEFAULT_BUDGET_S[level] if budget_s is None else float(budget_s)
    if budget <= 0:
        raise ValueError(f"search_budget_s must be positive, got {budget_s!r}")
    report = SearchReport(level, budget)
    form_options = dict(form_options or {})
    templates = form_options.get("use_templates", True)
    model = _model() if level == 2 else None
    new = program
    lower_only = None
    if level == 1:
        result = rewrite_program(program, rules.NORMALISE)  # safe rules: the values cannot change
        if sum(result.fired.values()):
            new, report.graph, report.rewrites = result.program, "rewrite", dict(result.fired)
    else:
        from .graph_search import search_graph
        g = search_graph(new, level=2, budget_s=max(budget * GRAPH_SHARE - (time.perf_counter() - t0), 0.1),
                         model=model, rulesets=("exact", "rounding") + (("lowered",) if templates else ()))
        report.rewrites, report.saturation = dict(g.fired), g.saturation
        report.candidates = [(c.name, c.cost, c.valid, c.checked) for c in g.candidates]
        chosen = g.chosen
        left = (budget - (time.perf_counter() - t0)) * MEASURE_SHARE
        if left >= MEASURE_MIN_BUDGET_S:  # the model ranked them; the machine decides (measured.py)
            report.measured = measure_candidates(program, g.candidates, g.chosen, form_options,
                                                 cc or find_compiler(), list(flags) if flags is not None
                                                 else default_flags(), tune_dims(program, dims), budget_s=left)
            chosen = report.measured.chosen or chosen
            form_options.update(report.measured.form_options)  # which values get a buffer, as measured
        else:
            report.measured = MeasuredChoice(note=f"not measured: {left:.1f} s of budget left for it")
        pick = next(c for c in g.candidates if c.name == chosen)
        new, report.graph = pick.program, pick.name
        if pick.name == "e-graph" and templates:  # a new program: lower exactly what its extraction chose
            report.lowering = LoweringChoice(pick.decisions, pick.lower_only, getattr(g.saturation, "enodes", 0),
                                             g.seconds)
            lower_only = pick.lower_only
    alternatives = find_alternatives(new) if templates and report.lowering is None else []
    if alternatives:  # which matched lowered kernels to form: an e-graph of the program and them
        try:
            report.lowering = choose_lowerings(new, model or _model(), alternatives)
        except ImportError as e:  # no egglog: every match is lowered, as without search
            report.lowering = LoweringChoice(note=str(e))
        if not report.lowering.all_chosen:
            lower_only = report.lowering.lower_only
    left = budget - (time.perf_counter() - t0)
    if templates and left >= RACE_MIN_BUDGET_S:
        lower_only, report.race = race_templates(new, lower_only, form_options, cc or find_compiler(),
                                                 list(flags) if flags is not None else default_flags(),
                                                 tune_dims(new, dims), budget_s=left * RACE_SHARE)
    materialised = report.measured is not None and report.measured.form_options
    if new is not program or lower_only is not None or materialised:
        plan = form_c_plan(new, dict(form_options, lower_only=lower_only))  # as the heuristics' plan is formed
    remaining = budget - (time.perf_counter() - t0)
    report.schedule = tune_schedule(new, plan, level, max(remaining, 0.0), cc, flags, dims, progress=progress)
    report.nodes, report.ops_changed = (len(program.nodes), len(new.nodes)), _ops_changed(program, new)
    report.seconds = time.perf_counter() - t0
    return plan, report.schedule.schedule(), report


def _ops_changed(before: Program, after: Program) -> dict[str, tuple[int, int]]:
    a = Counter(n.op.value for n in before.nodes)
    b = Counter(n.op.value for n in after.nodes)
    return {op: (a[op], b[op]) for op in sorted(set(a) | set(b)) if a[op] != b[op]}


def _model():
    """The calibrated cost model (measured once per machine, then read from the cache)."""
    from ..backend.c.compiler import CompilerError
    from .calibration import calibrate
    from .cost import CostModel
    try:
        return calibrate()
    except CompilerError:
        return CostModel()
