"""Templates against the compiler's own kernels, by measurement: which quantized matmuls keep their template.

A hand-written kernel (``qmatmul``, kernel/quantized.py) is an alternative for the primitive subgraph it
computes, not a rule: the plan with the templates and the plan with the compiler's own kernels (gemm kernels
and blocked dot products) are compiled with per-kernel timing, run on the same random inputs at the tuning
dimensions, and a template whose generated counterpart (the kernel of the same node) is faster by more than
``MIN_GAIN`` is dropped from ``lower_only``. Both plans' outputs must agree (within the check's tolerance),
else nothing is dropped.
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass, field

import numpy as np

from .. import symbolic as sym
from ..backend.c.compiler import CompilerError, compile_shared, runtime_library
from ..backend.c.render import render_plan
from ..backend.c.scheduling import assign_schedules
from ..graph import Program
from ..kernel.fusion import form_kernels
from .check import outputs_agree, plan_tolerance, random_inputs
from .cost import CostModel
from .lowering import find_alternatives
from .runner import PlanRunner, in_background

MIN_GAIN = 0.05  # a generated kernel must beat the template by this fraction to replace it


@dataclass
class RaceResult:
    """Per raced node id: (template seconds, generated seconds); ``dropped``: templates the race removed."""
    times: dict[int, tuple[float, float]] = field(default_factory=dict)
    dropped: frozenset[int] = frozenset()
    note: str = ""


def written(plan, env: dict[str, int]) -> int:
    """Elements the kernels of ``plan`` write at dimension values ``env`` (each kernel's loop nest)."""
    total = 0
    for k in plan.kernels:
        n = 1
        for d in k.shape:
            n *= int(sym.evaluate(d, env))
        total += n
    return total


def _extra_seconds(without, with_t, env: dict[str, int]) -> float:
    """A lower-bound-style estimate of how much longer the plan without templates runs: the float32 elements
    it writes beyond the other plan, at the default model's byte rate, times its factor for the primitive
    form of a quantized matmul (each such element is a decoded weight times an activation)."""
    model = CostModel()
    extra = max(written(without, env) - written(with_t, env), 0)
    return model.seconds(0, 4 * extra) * model.primitive_factor("qmatmul")


def race_templates(program: Program, lower_only: frozenset[int] | None, form_options: dict, cc: str,
                   flags: list[str], env: dict[str, int], seed: int = 0,
                   budget_s: float | None = None) -> tuple[frozenset[int] | None, RaceResult]:
    """(the ``lower_only`` to form with, what the race measured); see the module docstring. ``budget_s``
    bounds the two compiles (a large model's plan without templates can take gcc minutes): past it the
    race is skipped and every template kept."""
    t0 = time.perf_counter()
    res = RaceResult()
    alternatives = find_alternatives(program)
    lowered = frozenset(a.root.id for a in alternatives) if lower_only is None else lower_only
    options = {k: v for k, v in form_options.items() if k not in ("use_templates", "lower_only")}
    with_t = assign_schedules(form_kernels(program, use_templates=True, lower_only=lowered, **options))
    raced = [k for k in with_t.kernels if k.kind == "qmatmul" and int(k.name[1:]) in lowered]
    if not raced:
        res.note = "no quantized matmul template to race"
        return lower_only, res
    without = assign_schedules(form_kernels(program, use_templates=False, **options))
    estimate = _extra_seconds(without, with_t, env)
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
    if not outputs_agree(runners[0].outputs(), runners[1].outputs(), rtol=rtol, atol=atol):
        res.note = "not raced: the two plans' outputs disagree"
        return lower_only, res
    per = []
    for runner, plan in zip(runners, (with_t, without)):
        _, kernel_s = runner.time()
        per.append(dict(zip((k.name for k in plan.kernels), kernel_s)))
    dropped = set()
    for k in raced:
        t, g = per[0][k.name], per[1].get(k.name)
        if g is None:
            continue
        nid = int(k.name[1:])
        res.times[nid] = (t, g)
        if g < t * (1 - MIN_GAIN):
            dropped.add(nid)
    res.dropped = frozenset(dropped)
    return (lowered - res.dropped) if dropped else lower_only, res
