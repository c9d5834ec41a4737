"""Give every kernel of a plan its schedule: the caller's choice where it makes one, else the heuristics'.

Kernels carry their schedule (``ir.Kernel.schedule``); the renderer reads it. "gemm" kernels get full
schedules; a matmul-like "loop" kernel (a matvec too small for a gemm kernel, the logits of one token) gets
one only for ``IntegerDot``; the other loop forms render with the C renderer's fixed loop structure.
"""
from __future__ import annotations

from typing import Callable

from ...graph import Program
from ...kernel import ir
from ...kernel.epilogue import fuse_epilogues
from ...kernel.fusion import KernelPlan, form_kernels
from ...kernel.heuristics import Target, gemm_schedule
from ...kernel.matmul_form import match_matmul, static_sizes
from ...kernel.schedule import IntegerDot, Schedule
from ...kernel.schedule_knobs import check_knobs, with_knobs
from .gemm import gemm_sizes
from .repack import add_repacks
from .target import host_target

ScheduleChoice = Callable[[ir.Kernel], "Schedule | None"]


def integer_dot_for(form_options: dict) -> bool:
    """Whether kernels formed with ``form_options`` sum int8-quantized blocks as integers in their few-rows form
    (``IntegerDot(16)``): when the activations may be rounded ("int16" or "int8"; "auto" resolves to one of
    them, or to "float", before forming)."""
    return form_options.get("activations") in ("int16", "int8")


def assign_schedules(plan: KernelPlan, target: Target | None = None, choose: ScheduleChoice | None = None,
                     integer_dot: bool = False) -> KernelPlan:
    """Set ``schedule`` on every gemm kernel of ``plan`` (in place; returns the plan): ``choose(kernel)`` when
    it gives one (validated: a schedule that cannot apply raises ScheduleError naming the kernel), else the
    default for ``target`` (the host when None). ``integer_dot``: the defaults carry ``IntegerDot("k", 16)``
    (the few-rows form sums int8 weight blocks as integers against int16 activations), and so does every
    matmul-like loop kernel."""
    target = target or host_target()
    for k in plan.kernels:
        if k.kind == "loop" and integer_dot and match_matmul(k.value, k.loop_vars) is not None:
            k.schedule = k.schedule or Schedule((IntegerDot("k", 16),))
        if k.kind != "gemm":
            continue
        form = match_matmul(k.value, k.loop_vars)
        default = gemm_schedule(target, *static_sizes(k.shape, form))
        if integer_dot:
            default = default.with_steps(IntegerDot("k", 16))
        chosen = choose(k) if choose is not None else None
        if chosen is not None:
            try:
                gemm_sizes(chosen)
            except ValueError as e:
                raise type(e)(f"kernel {k.name}: {e}") from None
        k.schedule = chosen or k.schedule or default
    return plan



def form_c_plan(program: Program, form_options: dict, choose: ScheduleChoice | None = None,
                knobs: dict | None = None) -> KernelPlan:
    """The C backend's plan of ``program``: kernels formed with ``form_options``, elementwise readers of
    matmuls folded in as epilogues, schedules assigned; ``knobs`` (kernel/schedule_knobs.py: name -> value)
    then edit the schedule of every kernel that reads them; int16 matmul weights read through repack slots
    (repack.py)."""
    plan = assign_schedules(fuse_epilogues(form_kernels(program, **form_options)), choose=choose,
                            integer_dot=integer_dot_for(form_options))
    if knobs:
        check_knobs(knobs)
        for k in plan.kernels:
            k.schedule = with_knobs(k.schedule, k.kind, knobs)
    return add_repacks(plan)

