"""Kernel-level search: render a plan under several knob settings, compile the candidates in parallel
(with a timeout), run each on real buffers, check its outputs against the reference interpreter, time
every kernel, and keep the fastest setting per kernel — within a time budget, with results in the
on-disk tuning cache so the search runs once per machine.
"""
from __future__ import annotations

import concurrent.futures as cf
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..backend.c.compiler import CompilerError, compile_shared, default_flags, find_compiler, runtime_library
from ..backend.c.render import KernelRenderer, render_plan
from ..backend.reference import interpret
from ..graph import Program
from ..kernel.fusion import KernelPlan
from . import knobs as K
from . import tuning_cache
from .check import outputs_agree, random_inputs, rounded_activations, tune_dims
from .runner import PlanRunner, compare

REFERENCE_MAX_ELEMENTS = 1 << 26  # larger programs are checked against the heuristics' build instead
COMPILE_TIMEOUT_S = 120.0
MIN_GAIN = 0.03  # a tuned plan must beat the heuristics by this fraction to replace them


@dataclass
class ScheduleResult:
    """The chosen knobs per kernel name (empty: the heuristics) and what the search did."""

    choice: dict[str, dict] = field(default_factory=dict)
    default_seconds: float | None = None
    tuned_seconds: float | None = None
    tried: int = 0
    rejected: int = 0  # candidates that failed to compile, timed out, or disagreed with the reference
    from_cache: int = 0  # kernels whose knobs came from the tuning cache
    seconds: float = 0.0
    stopped_by: str = "done"  # done | budget | cached | nothing-to-tune
    env: dict[str, int] = field(default_factory=dict)
    oracle: str = "reference"  # what candidates were checked against: reference | heuristics

    def schedule(self):
        """The ``schedule`` argument of ``render_plan`` (None for the heuristics)."""
        return K.per_kernel(self.choice) if self.choice else None


def reference_elements(program: Program, env: dict[str, int]) -> int:
    """How many elements the reference interpreter materialises for ``program`` at ``env``."""
    from .. import symbolic as sym
    total = 0
    for n in program.nodes:
        size = 1
        for d in n.shape:
            size *= int(sym.evaluate(d, env))
        total += size
        for _, st in n.srcs:  # views are materialised too (a broadcast operand of a matmul)
            size = 1
            for d in st.shape:
                size *= int(sym.evaluate(d, env))
            total += size
    return total


def _progress(total: int, enabled: bool | None):
    """A tqdm bar on a terminal (or when asked), else a stand-in that does nothing."""
    show = sys.stderr.isatty() if enabled is None else enabled
    if show:
        try:
            from tqdm import tqdm
            return tqdm(total=total, desc="schedule search", unit="candidate", leave=False)
        except ImportError:  # pragma: no cover - tqdm is optional
            pass

    class _Quiet:
        def update(self, n=1): pass
        def set_postfix_str(self, s): pass
        def close(self): pass
    return _Quiet()


def kernel_keys(plan: KernelPlan, env: dict[str, int], cc: str) -> list[str]:
    """The tuning-cache key of every kernel (its C text under the heuristics' knobs)."""
    r = KernelRenderer(plan)
    keys = []
    for k in plan.kernels:
        f, c = r.kernel(k)
        keys.append(tuning_cache.kernel_key(f + "\n" + c, env, cc))
    return keys


def tune_schedule(program: Program, plan: KernelPlan, level: int = 1, budget_s: float = 30.0,
                  cc: str | None = None, flags: list[str] | None = None, dims: dict[str, int] | None = None,
                  seed: int = 0, progress: bool | None = None, use_cache: bool = True) -> ScheduleResult:
    """Measured knobs for the kernels of ``plan`` (the kernel plan of ``program``); see the module docstring.

    ``level`` 1 tries a few settings, 2 a grid; ``budget_s`` bounds the whole search (compiles, runs and
    the reference run); ``dims`` fixes the dimension values timed at."""
    t0 = time.perf_counter()
    deadline = t0 + budget_s
    cc = cc or find_compiler()
    flags = list(flags) if flags is not None else default_flags()
    env = tune_dims(program, dims)
    res = ScheduleResult(env=env)
    if budget_s <= 0:
        res.stopped_by = "budget"
        return res
    tunable = [k for k in plan.kernels if K.BY_SCHEDULE.get(k.kind)]
    if not tunable:
        res.stopped_by, res.seconds = "nothing-to-tune", time.perf_counter() - t0
        return res
    keys = dict(zip((k.name for k in plan.kernels), kernel_keys(plan, env, cc)))
    todo = []
    for k in tunable:
        entry = tuning_cache.load(keys[k.name]) if use_cache else None
        if entry is not None:
            if entry["knobs"]:
                res.choice[k.name] = entry["knobs"]
            res.from_cache += 1
        else:
            todo.append(k)
    if not todo:
        res.stopped_by, res.seconds = "cached", time.perf_counter() - t0
        return res

    runtime_library()
    rng = np.random.default_rng(seed)
    inputs = random_inputs(program, env, rng)
    # the reference interpreter materialises every node (a matmul's [m, k, n] product too): when that is
    # too big, the heuristics' own build (which the test suite checks against the reference) is the oracle
    # quantized matmuls that round their activations (int16/int8) do not compute the reference's values either,
    # and a schedule does not change that rounding: their heuristics' build is the oracle too
    expected = interpret(program, inputs, dict(env)) if reference_elements(program, env) <= REFERENCE_MAX_ELEMENTS \
        and rounded_activations(plan) is None else None
    dtypes = [n.dtype for n, _ in program.outputs]
    configs = K.configurations(level)
    times: list[tuple[dict, list[float], float]] = []  # (config, per-kernel seconds, total)
    bar = _progress(len(configs), progress)
    slowest_compile = 0.0

    def build(cfg):
        src = render_plan(plan, profile=True, schedule=K.uniform(cfg))
        t = time.perf_counter()
        path = compile_shared(src, flags, cc)
        return path, time.perf_counter() - t

    # not a ``with`` block: leaving one waits for compiles still running, which would break the budget
    pool = cf.ThreadPoolExecutor(max_workers=2)
    futures = [(cfg, pool.submit(build, cfg)) for cfg in configs]
    for cfg, fut in futures:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            res.stopped_by = "budget"
            break
        try:
            path, took = fut.result(timeout=min(remaining, COMPILE_TIMEOUT_S))
            slowest_compile = max(slowest_compile, took)
            runner = PlanRunner(plan, path, inputs, env, profile=True)
            got = runner.outputs()
            if expected is None and cfg == {}:
                expected, res.oracle = got, "heuristics"
            elif expected is None or not outputs_agree(expected, got, dtypes=dtypes):
                raise ValueError("outputs disagree with the reference")
            total, per_kernel = runner.time()
            times.append((cfg, per_kernel, total))
            bar.set_postfix_str(f"best {min(t for _, _, t in times) * 1e3:.3f} ms")
        except (cf.TimeoutError, CompilerError, ValueError):
            res.rejected += 1
        res.tried += 1
        bar.update(1)
    pool.shutdown(wait=False, cancel_futures=True)
    bar.close()
    if not times or times[0][0] != {}:
        res.seconds = time.perf_counter() - t0
        return res  # the heuristics themselves were not measured: nothing to compare with
    index = {k.name: i for i, k in enumerate(plan.kernels)}
    default_times = times[0][1]
    choice = dict(res.choice)
    measured: dict[str, tuple[float, float]] = {}
    for k in todo:
        i = index[k.name]
        cfg, per = min(((c, p[i]) for c, p, _ in times), key=lambda cp: cp[1])
        knobs = K.relevant(k, cfg)
        if per > default_times[i] * (1 - MIN_GAIN):
            knobs = {}  # not clearly better than the heuristics
        if knobs:
            choice[k.name] = knobs
        measured[k.name] = (per, default_times[i])
    res.choice = choice
    res.default_seconds = times[0][2]
    res.tuned_seconds = _confirm(program, plan, res, inputs, env, expected, dtypes, flags, cc, deadline,
                                 slowest_compile)
    if use_cache and res.stopped_by != "budget":
        # stored after the confirmation, so the cache answers what this search finally chose (a choice
        # the whole-program check dropped is cached as "keep the heuristics")
        for k in todo:
            per, default = measured[k.name]
            tuning_cache.store(keys[k.name], {"knobs": res.choice.get(k.name, {}), "seconds": per,
                                              "default_seconds": default, "env": env})
    res.seconds = time.perf_counter() - t0
    return res


def _confirm(program, plan, res: ScheduleResult, inputs, env, expected, dtypes, flags, cc, deadline,
             slowest_compile) -> float | None:
    """Compile the per-kernel choice as it will run, check it and time it against the heuristics; fall
    back to the heuristics when it is not faster, wrong, or there is no time left to check it."""
    if not res.choice:
        return res.default_seconds
    if deadline - time.perf_counter() < 2 * slowest_compile + 0.5:
        res.choice, res.stopped_by = {}, "budget"
        return None
    try:
        tuned = PlanRunner(plan, compile_shared(render_plan(plan, schedule=res.schedule()), flags, cc), inputs, env,
                           profile=False)
        default = PlanRunner(plan, compile_shared(render_plan(plan), flags, cc), inputs, env, profile=False)
    except CompilerError:
        res.choice = {}
        return None
    if not outputs_agree(expected, tuned.outputs(), dtypes=dtypes):
        res.choice = {}
        return None
    t_tuned, t_default = compare(tuned, default)
    res.default_seconds = t_default
    if t_tuned > t_default * (1 - MIN_GAIN):
        res.choice = {}
        return t_default
    return t_tuned
