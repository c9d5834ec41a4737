"""Give every gemm kernel of a GPU plan its schedule: the caller's choice where it makes one, else the
heuristics' for the device (``kernel/heuristics.gpu_gemm_schedule``). The GPU renderer (gemm.py) reads it.
"""
from __future__ import annotations

from typing import Callable

from ...kernel import ir
from ...kernel.fusion import KernelPlan
from ...kernel.heuristics import GpuTarget, gpu_gemm_schedule
from ...kernel.matmul_form import MatmulForm, match_matmul, pack_inner, static_sizes
from ...kernel.schedule import Schedule, ScheduleError
from .gemm import gpu_gemm_sizes

ScheduleChoice = Callable[[ir.Kernel], "Schedule | None"]


def default_gpu_schedule(k: ir.Kernel, form: MatmulForm, target: GpuTarget) -> Schedule:
    """The heuristics' schedule of gemm kernel ``k`` (of matmul form ``form``) on ``target``: its static
    sizes, and the axis along which each factor's loads have unit stride (the panels load along it)."""
    mvar, nvar, kvar = k.loop_vars[form.m], k.loop_vars[form.n], form.reduce.var
    a_along = "m" if pack_inner(form.a, mvar, kvar) is mvar else "k"
    b_along = "n" if pack_inner(form.b, nvar, kvar) is nvar else "k"
    columns, rows, _, _ = static_sizes(k.shape, form)
    return gpu_gemm_schedule(target, columns, rows, a_along, b_along)


def assign_gpu_schedules(plan: KernelPlan, target: GpuTarget, choose: ScheduleChoice | None = None) -> KernelPlan:
    """Set ``schedule`` on every gemm kernel of ``plan`` (in place; returns the plan): ``choose(kernel)`` when it
    gives one, else the default for ``target``. A schedule that cannot apply on ``target`` (a step the GPU
    renderer does not apply, too many work items, panels larger than local memory) raises ScheduleError
    naming the kernel."""
    for k in plan.kernels:
        if k.kind != "gemm":
            continue
        form = match_matmul(k.value, k.loop_vars)
        if form is None:
            continue
        chosen = choose(k) if choose is not None else None
        schedule = chosen if chosen is not None else default_gpu_schedule(k, form, target)
        try:
            gpu_gemm_sizes(schedule, target)
        except ScheduleError as e:
            raise ScheduleError(f"kernel {k.name}: {e}") from None
        k.schedule = schedule
    return plan
