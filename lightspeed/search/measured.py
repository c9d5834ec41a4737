"""Extraction by measurement: the graph candidates the cost model ranked are compiled and timed on this
machine, and the fastest measured one is chosen.

The cost model ranks the candidates of graph search (the original, its rewrite, the e-graph's extraction);
it cannot know everything kernel formation and the compiler make of a program. So, at search level 2, the
candidates that are known to compute the reference's values (the original, the rewrite under the built-in
exact rules, any candidate that passed the reference check) and differ from each other are formed, rendered
and compiled as the compile itself would (``form_c_plan``: epilogues fused, weights repacked), run on the same
random inputs at the tuning dimensions, checked to agree with the first, and timed in alternating rounds (so a
noisy machine slows them alike). The fastest by its best run wins when it beats the model's choice by more
than ``MIN_GAIN``; otherwise the model's choice stands.

Then which values get a buffer is decided for the chosen program, point by point: kernel formation reports
its materialisation points (kernel/materialise.py: nodes whose buffer it decided by a threshold, grouped by
structure, so one point covers every layer), the largest first (``MAX_POINTS``) are each formed the other way,
and the plans that differ are timed against the heuristics' plan in batches (``BATCH``, every batch times the
heuristics' plan again, so each choice is a ratio measured in one run). The choices faster by more than
``MIN_GAIN`` are then formed together, and the best single choice, the combination and the heuristics' plan
are timed once more: the fastest is taken only when it still beats the heuristics by ``MIN_GAIN`` there.

The outcome is stored in the tuning cache under a key of the original program's structure, the dimension
values, the package's code, the compiler and the CPU: compiling the same program again takes the stored choice
without compiling or timing anything.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..backend.c.compiler import CompilerError, compile_shared, compiler_identity, cpu_signature, runtime_library
from ..backend.c.plan_cache import Uncacheable, plan_key
from ..backend.c.render import render_plan
from ..backend.c.scheduling import form_c_plan
from ..graph import Program
from ..kernel.fusion import KernelPlan
from . import tuning_cache
from .check import outputs_agree, plan_tolerance, random_inputs
from .runner import PlanRunner, in_background

MIN_GAIN = 0.05  # a candidate must beat the cost model's choice by this fraction of its time to replace it
ROUNDS = 7       # alternating timed runs of every candidate, at least
MIN_TIMING_S = 0.3  # and more rounds until this long has passed (a small program's best run needs many)
MAX_ROUNDS = 500


MAX_POINTS = 16  # materialisation points tried, the largest (elements in all) first
BATCH = 4  # plans compiled and timed together: the heuristics' plan and three choices


@dataclass
class MeasuredChoice:
    """What measurement decided: best seconds of a whole run per candidate name, the name chosen (None:
    the cost model's choice stands), the materialisation decisions chosen for it (signature -> store, empty:
    the heuristics' thresholds everywhere) with their labels, the times of the plans tried for them (by label,
    "heuristics" for the thresholds' plan) and a note on what was not timed, whether it came from the tuning
    cache, and a note when no candidate was measured."""
    seconds: dict[str, float] = field(default_factory=dict)
    chosen: str | None = None
    materialise: dict[str, bool] = field(default_factory=dict)
    materialise_chosen: list[str] = field(default_factory=list)
    materialise_seconds: dict[str, float] = field(default_factory=dict)
    materialise_note: str = ""
    from_cache: bool = False
    note: str = ""

    @property
    def form_options(self) -> dict:
        """The form_kernels options of the chosen materialisation (none: the heuristics')."""
        return {"materialise": dict(self.materialise)} if self.materialise else {}


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


class _Formed(NamedTuple):
    """A kernel plan and its rendered source (rendered once: SmolLM2's step takes ~0.3 s)."""
    plan: KernelPlan
    source: str


def _formed(plan: KernelPlan) -> _Formed:
    return _Formed(plan, render_plan(plan))


def _timed(names: list[str], plans: list[_Formed], original: Program, cc: str, flags: list[str],
           env: dict[str, int], deadline: float, seed: int) -> tuple[dict[str, float] | None, str]:
    """(best seconds of a whole run per name, "") for ``plans`` compiled and run on the same inputs, or (None,
    why not): a compile past ``deadline``, a compiler error, or a plan whose outputs disagree with the first's."""
    runtime_library()  # the thread pool, loaded with global symbols before any kernel library
    builds = [in_background(compile_shared, f.source, flags, cc) for f in plans]
    try:
        paths = [f.result(timeout=max(deadline - time.perf_counter(), 0.0)) for f in builds]
    except cf.TimeoutError:
        return None, f"not measured: compiling {len(plans)} plans did not finish within the budget"
    except CompilerError as e:
        return None, f"not measured: {e}"
    inputs = random_inputs(original, env, np.random.default_rng(seed))
    runners = [PlanRunner(f.plan, path, inputs, env, profile=False) for f, path in zip(plans, paths)]
    first = runners[0].outputs()
    rtol, atol = plan_tolerance(plans[0].plan)
    dtypes = [b.dtype for b in plans[0].plan.outputs]
    for name, r in zip(names[1:], runners[1:]):
        if not outputs_agree(first, r.outputs(), rtol=rtol, atol=atol, dtypes=dtypes):
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
    the chosen one's materialisation points; see the module docstring. ``model_choice`` is the name the cost
    model chose."""
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
        stored = knobs.get("materialise", {})
        if knobs.get("graph") in rep and isinstance(stored, dict) \
                and all(isinstance(k, str) and isinstance(v, bool) for k, v in stored.items()):
            res.chosen, res.materialise = knobs["graph"], dict(stored)
            res.materialise_chosen = [str(x) for x in knobs.get("materialise_chosen", [])]
            res.seconds, res.from_cache = dict(entry.get("seconds", {})), True
            res.materialise_seconds = dict(entry.get("materialise_seconds", {}))
            return res
    options = {k: v for k, v in form_options.items() if k not in ("lower_only", "materialise")}
    pick = next((c for c in known if c.name == model_choice), distinct[0] if distinct else None)
    if pick is None:
        res.note = "no valid candidate to measure"
        return res
    if len(distinct) > 1:
        plans = [_formed(form_c_plan(c.program, dict(options, lower_only=c.lower_only))) for c in distinct]
        seconds, res.note = _timed([c.name for c in distinct], plans, original, cc, flags, env, deadline, seed)
        if seconds is None:
            return res
        res.seconds = seconds
        res.chosen = decide(seconds, model_choice, rep)
        pick = next(c for c in known if c.name == res.chosen)
    if time.perf_counter() < deadline:
        choice = _materialisation(pick, original, options, cc, flags, env, deadline, seed)
        res.materialise, res.materialise_chosen, res.materialise_seconds, res.materialise_note = choice
    else:
        res.materialise_note = "materialisation: not measured, no budget left"
    if res.chosen is None and not res.materialise_seconds:
        res.note = res.note or "one distinct valid candidate and no materialisation choice: nothing to measure"
        return res
    res.chosen = res.chosen or pick.name
    if key is not None:
        tuning_cache.store(key, {"knobs": {"graph": res.chosen, "materialise": res.materialise,
                                           "materialise_chosen": res.materialise_chosen},
                                 "seconds": res.seconds, "materialise_seconds": res.materialise_seconds})
    return res


class _Choice(NamedTuple):
    label: str  # e.g. "recompute Exp2[64, 128] x30"
    decisions: dict[str, bool]  # signature -> store
    plan: _Formed


def _materialisation(pick, original: Program, options: dict, cc: str, flags: list[str], env: dict[str, int],
                     deadline: float, seed: int) -> tuple[dict[str, bool], list[str], dict[str, float], str]:
    """(decisions, their labels, seconds by label, note) for the materialisation points of ``pick``'s program
    (see the module docstring); no decisions: the heuristics' plan stands."""
    def plan_of(decisions: dict[str, bool]) -> _Formed:
        return _formed(form_c_plan(pick.program, dict(options, lower_only=pick.lower_only, materialise=decisions)))

    def timed(choices: list[_Choice], seed: int) -> tuple[dict[str, float] | None, str]:
        return _timed(["heuristics"] + [c.label for c in choices], [base] + [c.plan for c in choices], original,
                      cc, flags, env, deadline, seed)

    base = plan_of({})
    seen = {base.source}
    tries: list[_Choice] = []
    for p in sorted(base.plan.materialise_points, key=lambda p: -p.elements):
        if len(tries) >= MAX_POINTS or time.perf_counter() >= deadline:
            break
        if p.stored and not p.may_recompute:
            continue
        decisions = {p.signature: not p.stored}
        plan = plan_of(decisions)
        if plan.source not in seen:  # a choice that forms the same kernels is not compiled
            seen.add(plan.source)
            tries.append(_Choice(p.describe(not p.stored), decisions, plan))
    seconds: dict[str, float] = {}
    ratios: dict[str, float] = {}
    note = ""
    for start in range(0, len(tries), BATCH - 1):
        if time.perf_counter() >= deadline:
            note = f"materialisation: {len(ratios)} of {len(tries)} choices timed within the budget"
            break
        batch = tries[start:start + BATCH - 1]
        got, why = timed(batch, seed)
        if got is None:
            note = "materialisation " + why
            continue
        seconds["heuristics"] = min(seconds.get("heuristics", float("inf")), got["heuristics"])
        for c in batch:
            seconds[c.label] = got[c.label]
            ratios[c.label] = got[c.label] / got["heuristics"]
    winners = sorted((c for c in tries if ratios.get(c.label, 1.0) < 1 - MIN_GAIN), key=lambda c: ratios[c.label])
    if not winners or time.perf_counter() >= deadline:
        return {}, [], seconds, note
    # confirm: the best single choice, and all winners together, against the heuristics once more
    finalists = [winners[0]]
    if len(winners) > 1:
        together = {k: v for c in winners for k, v in c.decisions.items()}
        finalists.append(_Choice(f"{len(winners)} choices together", together, plan_of(together)))
    got, why = timed(finalists, seed + 1)
    if got is None:
        return {}, [], seconds, "materialisation " + why
    seconds.update({f"{label} (again)": got[label] for label in got})
    best = min(finalists, key=lambda c: got[c.label])
    if got[best.label] >= got["heuristics"] * (1 - MIN_GAIN):
        return {}, [], seconds, note
    labels = [c.label for c in winners] if best is not finalists[0] else [best.label]
    return dict(best.decisions), labels, seconds, note
