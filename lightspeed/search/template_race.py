"""Templates against the compiler's own kernels, by measurement: which lowered kernels keep their template.

A hand-written kernel (``qmatmul``: kernel/quantized.py; ``attention``: the streaming attention of
kernel/attention.py) is an alternative for the primitive subgraph it computes, not a rule: the plan with the
templates and the plan with the compiler's own kernels (gemm kernels, blocked dot products, the scores and
softmax as loops) are compiled with per-kernel timing and run on the same random inputs at the tuning
dimensions. A template's generated counterpart is the set of kernels of the plan without templates that
compute its region (race_regions.py: for a quantized matmul its gemm kernel, or its product and reduction
kernels; for an attention the score, max, sum, exponential and weighted-sum kernels), against the kernels of
the plan with templates that compute the same nodes (the template, and what it reads from a buffer that the
generated side inlines). A template whose counterpart's summed time is lower by more than ``MIN_GAIN`` is
dropped from ``lower_only``. A region whose work one plan fuses into a kernel of a node outside it is not
raced and keeps its template: that kernel's time cannot be split at the border, and counting all of it would
charge the generated side with work the other plan does elsewhere. Nor is an attention measured below the
upper bounds of its dimensions (its generated form's scores grow with the square of the keys). Both plans'
outputs must agree (within the check's tolerance), else nothing is dropped.
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass, field

import numpy as np

from .. import symbolic as sym
from ..backend.c.compiler import CompilerError, compile_shared, runtime_library
from ..backend.c.render import render_plan
from ..backend.c.scheduling import assign_schedules, integer_dot_for
from ..graph import Program
from ..kernel.fusion import Former
from .check import outputs_agree, plan_tolerance, random_inputs
from .cost import CostModel
from .lowering import alternatives_of, find_alternatives
from .race_regions import Counterpart, PlanNodes, counterpart, kernel_node
from .runner import PlanRunner, in_background

MIN_GAIN = 0.05  # a generated kernel must beat the template by this fraction to replace it
RACED_KINDS = ("qmatmul", "attention")  # the templates' kernel kinds (kernel/fusion.py)
ROUNDS = 3  # the two plans are timed in this many alternating rounds


@dataclass
class RaceResult:
    """Per raced node id (the root of a template's region): (template seconds, generated seconds), each the
    sum over the kernels ``kernels`` names (templated, generated); ``kinds``: the kind of every template
    considered; ``skipped``: the regions not raced, and why; ``dropped``: templates the race removed;
    ``note``: why nothing was raced, if so."""
    times: dict[int, tuple[float, float]] = field(default_factory=dict)
    dropped: frozenset[int] = frozenset()
    note: str = ""
    kinds: dict[int, str] = field(default_factory=dict)
    kernels: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)


def written(plan, env: dict[str, int], names=None) -> int:
    """Elements the kernels of ``plan`` (those ``names`` lists, if given) write at dimension values ``env``
    (each kernel's loop nest)."""
    total = 0
    for k in plan.kernels:
        if names is not None and k.name not in names:
            continue
        n = 1
        for d in k.shape:
            n *= int(sym.evaluate(d, env))
        total += n
    return total


def _extra_seconds(without, with_t, env: dict[str, int], attention: tuple[set[str], set[str]]) -> float:
    """A lower-bound-style estimate of how much longer the plan without templates runs: the float32 elements
    it writes beyond the other plan, at the default model's byte rate, times the factor of the primitive form
    they belong to. ``attention``: the kernels of the attention regions (without, with templates): without
    streaming attention they store the seq x seq scores and softmax values (per element a score the
    template keeps in registers: the attention factor); every other extra element is taken for a decoded
    weight times an activation (the quantized matmul's factor, far larger)."""
    model = CostModel()
    extra = max(written(without, env) - written(with_t, env), 0)
    scores = min(max(written(without, env, attention[0]) - written(with_t, env, attention[1]), 0), extra)
    return (model.seconds(0, 4 * (extra - scores)) * model.primitive_factor("qmatmul")
            + model.seconds(0, 4 * scores) * model.primitive_factor("attention"))


def _counterparts(regions: dict[int, frozenset[int]], raced: dict[str, str], with_t: PlanNodes,
                  without: PlanNodes, res: RaceResult) -> dict[int, Counterpart]:
    """The counterpart of each raced template (kernel name -> kind in ``raced``) by the root of its region;
    a region that cannot be raced goes to ``res.skipped`` and keeps its template."""
    found = {}
    for name, kind in raced.items():
        nid = kernel_node(name)
        res.kinds[nid] = kind
        cp = counterpart(regions.get(nid, frozenset({nid})), with_t, without, name, set(raced))
        if cp.note:
            res.skipped[nid] = cp.note
        else:
            found[nid] = cp
    return found


def _below_bounds(plan, names: tuple[str, ...], env: dict[str, int]) -> list[str]:
    """The dimensions that the kernels ``names`` of ``plan`` span and ``env`` sets below their upper bound."""
    out = set()
    for k in plan.kernels:
        if k.name in names:
            out |= {f"{v.name}={env[v.name]} of up to {v.hi}" for v in sym.free_vars(*k.shape)
                    if v.name in env and env[v.name] < v.hi}
    return sorted(out)


def _at_bounds_only(pairs: dict[int, Counterpart], without, env: dict[str, int], res: RaceResult) -> None:
    """Leave out of ``pairs`` (into ``res.skipped``) the attention regions measured below the upper bounds of
    their dimensions: the generated form stores seq x seq scores, so its time and its arena grow with the
    square of the keys and a time at the tuning size says little of the bound. (A quantized matmul's race
    stands for every size, as before: the work of both its forms is linear in the rows.)"""
    for nid in [n for n in pairs if res.kinds[n] == "attention"]:
        below = _below_bounds(without, pairs[nid].generated, env)
        if below:
            res.skipped[nid] = f"measured at {', '.join(below)}: the stored scores grow with the square of the keys"
            del pairs[nid]


def _kernel_seconds(runners: list[PlanRunner], plans) -> list[dict[str, float]]:
    """Per plan: each kernel's best seconds over ``ROUNDS`` alternating rounds of timing both plans, so that
    a change of load on the machine affects both alike (kernels of microseconds flip the race otherwise)."""
    best = [dict.fromkeys((k.name for k in plan.kernels), float("inf")) for plan in plans]
    for _ in range(ROUNDS):
        for runner, plan, times in zip(runners, plans, best):
            _, kernel_s = runner.time()
            for k, t in zip(plan.kernels, kernel_s):
                times[k.name] = min(times[k.name], t)
    return best


def _build(program: Program, **options) -> tuple[Former, object]:
    former = Former(program, **options)
    return former, assign_schedules(former.plan(), integer_dot=integer_dot_for(options))


def race_templates(program: Program, lower_only: frozenset[int] | None, form_options: dict, cc: str,
                   flags: list[str], env: dict[str, int], seed: int = 0,
                   budget_s: float | None = None) -> tuple[frozenset[int] | None, RaceResult]:
    """(the ``lower_only`` to form with, what the race measured); see the module docstring. ``budget_s``
    bounds the two compiles (a large model's plan without templates can take gcc minutes): past it the
    race is skipped and every template kept."""
    t0 = time.perf_counter()
    res = RaceResult()
    lowered = frozenset(a.root.id for a in find_alternatives(program)) if lower_only is None else lower_only
    options = {k: v for k, v in form_options.items() if k not in ("use_templates", "lower_only")}
    former_t, with_t = _build(program, use_templates=True, lower_only=lowered, **options)
    raced = {k.name: k.kind for k in with_t.kernels if k.kind in RACED_KINDS and kernel_node(k.name) in lowered}
    if not raced:
        res.note = "no template to race"
        return lower_only, res
    former_g, without = _build(program, use_templates=False, **options)
    regions = {a.root.id: a.region for a in alternatives_of(former_t)}
    nodes_t, nodes_g = PlanNodes(former_t, with_t), PlanNodes(former_g, without)
    pairs = _counterparts(regions, raced, nodes_t, nodes_g, res)
    _at_bounds_only(pairs, without, env, res)
    if not pairs:
        res.note = "no template's region could be raced"
        return lower_only, res
    attention = set().union(*(regions.get(n, ()) for n, kind in res.kinds.items() if kind == "attention"))
    estimate = _extra_seconds(without, with_t, env, (set(nodes_g.storing(attention)),
                                                      set(nodes_t.storing(attention))))
    if budget_s is not None and estimate > budget_s:
        # the generated plan materialises what the templates never store (decoded weight products per row:
        # SmolLM2's plan without templates writes [seq, 1536, 576] products and ran 278 s where the
        # templates' plan ran 0.4 s); running it would spend the budget and more
        res.note = f"not raced: the plan without templates would take ~{estimate:.0f} s more (budget {budget_s:.0f} s)"
        return lower_only, res
    inputs = random_inputs(program, env, np.random.default_rng(seed))
    runtime_library()  # the thread pool, loaded with global symbols before any kernel library
    builds = [in_background(compile_shared, render_plan(p, profile=True), flags, cc) for p in (with_t, without)]
    try:
        deadline = None if budget_s is None else t0 + budget_s
        paths = [f.result(timeout=None if deadline is None else max(deadline - time.perf_counter(), 0.0))
                 for f in builds]
        runners = [PlanRunner(p, path, inputs, env, profile=True) for p, path in zip((with_t, without), paths)]
    except cf.TimeoutError:
        res.note = f"not raced: compiling the two plans took longer than the {budget_s:.1f} s it had"
        return lower_only, res
    except CompilerError as e:
        res.note = f"not raced: {e}"
        return lower_only, res
    # the templates may round their activations (int16/int8), the generated kernels never do
    rtol, atol = plan_tolerance(with_t)
    # float16/bfloat16 outputs (KV caches) are compared within their own rounding, as everywhere else
    if not outputs_agree(runners[0].outputs(), runners[1].outputs(), rtol=rtol, atol=atol,
                         dtypes=[b.dtype for b in with_t.outputs]):
        res.note = "not raced: the two plans' outputs disagree"
        return lower_only, res
    per = _kernel_seconds(runners, (with_t, without))
    dropped = set()
    for nid, cp in pairs.items():
        # a kernel that several regions share (a mask stored once for every layer's attention, an activation
        # stored once for three projections) counts in each of them although it runs once: a small overcount
        # of the side that has it, rather than a guess at how to divide its time
        t, g = sum(per[0][k] for k in cp.templated), sum(per[1][k] for k in cp.generated)
        res.times[nid], res.kernels[nid] = (t, g), (cp.templated, cp.generated)
        if g < t * (1 - MIN_GAIN):
            dropped.add(nid)
    res.dropped = frozenset(dropped)
    return (lowered - res.dropped) if dropped else lower_only, res
