"""What ``graph.compile(..., backend="c", search=level)`` runs: graph-level search, then kernel-level
schedule search on the resulting kernel plan, sharing one time budget.

Level 1 (quick): exact rewrites (the rewrite package's SAFE rules) and a few knob settings per kernel.
Level 2 (thorough): also the e-graph with rounding rules, and a grid of knob settings.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..graph import Program
from ..kernel.fusion import KernelPlan, form_kernels
from ..rewrite import rewrite_program, rules
from .schedule import ScheduleResult, tune_schedule

DEFAULT_BUDGET_S = {1: 30.0, 2: 120.0}
GRAPH_SHARE = 0.25  # of the budget, at most, for graph-level search (level 2)


@dataclass
class SearchReport:
    level: int
    budget_s: float
    graph: str = "original"  # original | rewrite | e-graph
    rewrites: dict = field(default_factory=dict)  # rule name -> times fired (level 1)
    schedule: ScheduleResult | None = None
    seconds: float = 0.0


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
    new = program
    if level == 1:
        result = rewrite_program(program, rules.SAFE)  # exact rules: the values cannot change
        if sum(result.fired.values()):
            new, report.graph, report.rewrites = result.program, "rewrite", dict(result.fired)
    else:
        from ..backend.c.compiler import CompilerError
        from .cost import CostModel, calibrate
        from .graph_search import search_graph
        try:
            model = calibrate()  # measured once per machine, then read from the cache
        except CompilerError:
            model = CostModel()
        g = search_graph(program, level=2, budget_s=max(budget * GRAPH_SHARE - (time.perf_counter() - t0), 0.1),
                         model=model)
        new, report.graph = g.program, g.chosen
    if new is not program:
        plan = form_kernels(new, **(form_options or {}))
    remaining = budget - (time.perf_counter() - t0)
    report.schedule = tune_schedule(new, plan, level, max(remaining, 0.0), cc, flags, dims, progress=progress)
    report.seconds = time.perf_counter() - t0
    return plan, report.schedule.schedule(), report
