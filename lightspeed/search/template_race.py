"""Templates against the compiler's own kernels, by measurement: which quantized matmuls keep their template.

A hand-written kernel (``qmatmul``, kernel/quantized.py) is an alternative for the primitive subgraph it
computes, not a rule: the plan with the templates and the plan with the compiler's own kernels (gemm kernels
and blocked dot products) are compiled with per-kernel timing, run on the same random inputs at the tuning
dimensions, and a template whose generated counterpart (the kernel of the same node) is faster by more than
``MIN_GAIN`` is dropped from ``lower_only``. Both plans' outputs must agree (within the check's tolerance),
else nothing is dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..backend.c.compiler import CompilerError, compile_shared, runtime_library
from ..backend.c.render import render_plan
from ..backend.c.scheduling import assign_schedules
from ..graph import Program
from ..kernel.fusion import form_kernels
from .check import outputs_agree, random_inputs
from .lowering import find_alternatives
from .runner import PlanRunner

MIN_GAIN = 0.05  # a generated kernel must beat the template by this fraction to replace it


@dataclass
class RaceResult:
    """Per raced node id: (template seconds, generated seconds); ``dropped``: templates the race removed."""
    times: dict[int, tuple[float, float]] = field(default_factory=dict)
    dropped: frozenset[int] = frozenset()
    note: str = ""


def race_templates(program: Program, lower_only: frozenset[int] | None, form_options: dict, cc: str,
                   flags: list[str], env: dict[str, int], seed: int = 0) -> tuple[frozenset[int] | None, RaceResult]:
    """(the ``lower_only`` to form with, what the race measured); see the module docstring."""
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
    inputs = random_inputs(program, env, np.random.default_rng(seed))
    try:
        runtime_library()  # the thread pool, loaded with global symbols before any kernel library
        runners = [PlanRunner(p, compile_shared(render_plan(p, profile=True), flags, cc), inputs, env, profile=True)
                   for p in (with_t, without)]
    except CompilerError as e:
        res.note = f"not raced: {e}"
        return lower_only, res
    if not outputs_agree(runners[0].outputs(), runners[1].outputs()):
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
