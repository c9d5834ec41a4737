"""Extraction by measurement: the graph candidates the cost model ranked are compiled and timed on this
machine, and the fastest measured one is chosen.

The cost model ranks the candidates of graph search (the original, its rewrite, the e-graph's extraction);
it cannot know everything kernel formation and the compiler make of a program. So, at search level 2, the
candidates that are known to compute the reference's values (the original, the rewrite under the built-in
exact rules, any candidate that passed the reference check) and differ from each other are formed, rendered
and compiled as the compile itself would, run on the same random inputs at the tuning dimensions, checked to
agree with the first, and timed in alternating rounds (so a noisy machine slows them alike). The fastest by
its best run wins when it beats the model's choice by more than ``MIN_GAIN``; otherwise the model's choice
stands.

Then the chosen program's kernels are formed under other settings of which values get a buffer
(``MATERIALISATION``: the heuristics' recompute thresholds, every shared value stored, four times as much
recomputed); the settings that form different kernels are timed the same way and the fastest is taken, again
only by more than ``MIN_GAIN``.

The outcome is stored in the tuning cache under a key of the original program's structure, the dimension
values, the package's code, the compiler and the CPU: compiling the same program again takes the stored choice
without compiling or timing anything.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from ..backend.c.compiler import CompilerError, compile_shared, compiler_identity, cpu_signature, runtime_library
from ..backend.c.plan_cache import Uncacheable, plan_key
from ..backend.c.render import render_plan
from ..backend.c.scheduling import assign_schedules, integer_dot_for
from ..graph import Program
from ..kernel.fusion import form_kernels
from . import tuning_cache
from .check import outputs_agree, plan_tolerance, random_inputs
from .runner import PlanRunner, in_background

MIN_GAIN = 0.05  # a candidate must beat the cost model's choice by this fraction of its time to replace it
ROUNDS = 7       # alternating timed runs of every candidate, at least
MIN_TIMING_S = 0.3  # and more rounds until this long has passed (a small program's best run needs many)
MAX_ROUNDS = 500


# which values get a buffer (kernel.fusion.form_kernels): a value read by several kernels, or through a
# broadcast, is recomputed by each reader when cheaper than these costs; the heuristics' setting and two others
DEFAULT_MATERIALISATION = "heuristics"
MATERIALISATION: dict[str, dict[str, int]] = {
    DEFAULT_MATERIALISATION: {},
    "store-shared": {"recompute_max_cost": 0, "expand_max_cost": 0},   # every shared value stored once
    "recompute": {"recompute_max_cost": 48, "expand_max_cost": 32},    # four times as much recomputed
}


@dataclass
class MeasuredChoice:
    """What measurement decided: best seconds of a whole run per candidate name, the name chosen (None:
    the cost model's choice stands), the materialisation setting chosen for it (a key of ``MATERIALISATION``)
    and the times of those settings, whether it came from the tuning cache, and a note when nothing was
    measured."""
    seconds: dict[str, float] = field(default_factory=dict)
    chosen: str | None = None
    materialise: str = DEFAULT_MATERIALISATION
    materialise_seconds: dict[str, float] = field(default_factory=dict)
    from_cache: bool = False
    note: str = ""

    @property
    def form_options(self) -> dict[str, int]:
        """The form_kernels options of the chosen materialisation."""
        return dict(MATERIALISATION[self.materialise])


def choice_key(program: Program, env: dict[str, int], form_options: dict, cc: str) -> str | None:
    """The tuning-cache key of the measured choice for ``program`` at ``env`` (None: not describable)."""
    try:
        structure = plan_key(program, {"measured-extraction": 1, **form_options})
    except Uncacheable:
        return None
    h = hashlib.sha256()
    for part in (structure, repr(sorted(env.items())), compiler_identity(cc), cpu_signature()):
        h.update(part.encode())
        h.update(b"\0")
    return "graph-" + h.hexdigest()[:40]


def decide(seconds: dict[str, float], model_choice: str, same_as: dict[str, str]) -> str:
    """The candidate to take: the fastest measured, unless the cost model's choice (measured as
    ``same_as[model_choice]``, the candidate of the same structure) is within ``MIN_GAIN`` of it."""
    fastest = min(seconds, key=seconds.get)
    base = seconds.get(same_as.get(model_choice, model_choice))
    return model_choice if base is not None and seconds[fastest] >= base * (1 - MIN_GAIN) else fastest


def _timed(names: list[str], plans: list, original: Program, cc: str, flags: list[str], env: dict[str, int],
           deadline: float, seed: int) -> tuple[dict[str, float] | None, str]:
    """(best seconds of a whole run per name, "") for ``plans`` compiled and run on the same inputs, or (None,
    why not): a compile past ``deadline``, a compiler error, or a plan whose outputs disagree with the first's."""
    runtime_library()  # the thread pool, loaded with global symbols before any kernel library
    builds = [in_background(compile_shared, render_plan(p), flags, cc) for p in plans]
    try:
        paths = [f.result(timeout=max(deadline - time.perf_counter(), 0.0)) for f in builds]
    except cf.TimeoutError:
        return None, f"not measured: compiling {len(plans)} plans did not finish within the budget"
    except CompilerError as e:
        return None, f"not measured: {e}"
    inputs = random_inputs(original, env, np.random.default_rng(seed))
    runners = [PlanRunner(p, path, inputs, env, profile=False) for p, path in zip(plans, paths)]
    first = runners[0].outputs()
    rtol, atol = plan_tolerance(plans[0])
    for name, r in zip(names[1:], runners[1:]):
        if not outputs_agree(first, r.outputs(), rtol=rtol, atol=atol):
            return None, f"not measured: {name!r} disagrees with {names[0]!r} when compiled"
    best = [float("inf")] * len(runners)
    for r in runners:  # warm caches and the thread pool
        r.lib.ls_graph(r.ptrs, r.dims, r.arena)
    start = time.perf_counter()
    for rnd in range(MAX_ROUNDS):
        for k, r in enumerate(runners):
            t = time.perf_counter()
            r.lib.ls_graph(r.ptrs, r.dims, r.arena)
            best[k] = min(best[k], time.perf_counter() - t)
        now = time.perf_counter()
        if now > deadline or (rnd + 1 >= ROUNDS and now - start >= MIN_TIMING_S):
            break
    return dict(zip(names, best)), ""


def measure_candidates(original: Program, candidates: list, model_choice: str, form_options: dict, cc: str,
                       flags: list[str], env: dict[str, int], budget_s: float, seed: int = 0,
                       use_cache: bool = True) -> MeasuredChoice:
    """Time the ``candidates`` (graph_search.Candidate) known to be valid, as the compile would form them, then
    the chosen one's materialisation settings (``MATERIALISATION``); see the module docstring. ``model_choice``
    is the name the cost model chose."""
    deadline = time.perf_counter() + budget_s
    res = MeasuredChoice()
    known = [c for c in candidates if c.valid is True]
    distinct, first_of, rep = [], {}, {}
    for c in known:  # the rewrite often is the original: the same structure is compiled once
        try:
            k = plan_key(c.program, {"lower_only": sorted(c.lower_only) if c.lower_only is not None else None})
        except Uncacheable:
            k = id(c)
        if k not in first_of:
            first_of[k] = c.name
            distinct.append(c)
        rep[c.name] = first_of[k]
    key = choice_key(original, env, form_options, cc) if use_cache else None
    if key is not None:
        entry = tuning_cache.load(key)
        knobs = entry["knobs"] if entry is not None else {}
        if knobs.get("graph") in rep and knobs.get("materialise", DEFAULT_MATERIALISATION) in MATERIALISATION:
            res.chosen, res.materialise = knobs["graph"], knobs.get("materialise", DEFAULT_MATERIALISATION)
            res.seconds, res.from_cache = dict(entry.get("seconds", {})), True
            return res
    options = {k: v for k, v in form_options.items() if k != "lower_only"}
    pick = next((c for c in known if c.name == model_choice), distinct[0] if distinct else None)
    if pick is None:
        res.note = "no valid candidate to measure"
        return res
    if len(distinct) > 1:
        plans = [assign_schedules(form_kernels(c.program, **options, lower_only=c.lower_only),
                                  integer_dot=integer_dot_for(options)) for c in distinct]
        seconds, res.note = _timed([c.name for c in distinct], plans, original, cc, flags, env, deadline, seed)
        if seconds is None:
            return res
        res.seconds = seconds
        res.chosen = decide(seconds, model_choice, rep)
        pick = next(c for c in known if c.name == res.chosen)
    # which values get a buffer, for the chosen program: the heuristics' thresholds against the others
    plans, names, sources = [], [], set()
    for name, setting in MATERIALISATION.items():
        plan = assign_schedules(form_kernels(pick.program, **options, **setting, lower_only=pick.lower_only),
                                integer_dot=integer_dot_for(options))
        text = render_plan(plan)
        if text not in sources:  # a setting that forms the same kernels is not compiled again
            sources.add(text)
            plans.append(plan)
            names.append(name)
    if len(plans) > 1 and time.perf_counter() < deadline:
        seconds, note = _timed(names, plans, original, cc, flags, env, deadline, seed)
        if seconds is not None:
            res.materialise_seconds = seconds
            res.materialise = decide(seconds, DEFAULT_MATERIALISATION, {})
        else:
            res.note = note
    if res.chosen is None and res.materialise == DEFAULT_MATERIALISATION and not res.materialise_seconds:
        res.note = res.note or "one distinct valid candidate and one distinct kernel plan: nothing to measure"
        return res
    res.chosen = res.chosen or pick.name
    if key is not None:
        tuning_cache.store(key, {"knobs": {"graph": res.chosen, "materialise": res.materialise},
                                 "seconds": res.seconds, "materialise_seconds": res.materialise_seconds})
    return res
