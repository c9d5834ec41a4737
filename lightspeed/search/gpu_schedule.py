"""Measured GPU schedules: the gemm kernels of a GPU program timed on the device under a few candidate
schedules, the fastest kept per kernel, the whole program checked and timed against the heuristics' build,
and the choice stored in the tuning cache (keyed by each kernel's text under the heuristics' schedule, the
dimension values it was timed at and the device), so a second compile of the same program on the same
device times nothing.

The candidates (``candidates``) are the heuristics' schedule and variants of its tile sizes, register blocks
and panel depth that the device can hold, keeping its load orders (``Pack``) and tile order. A backend hands
in ``build(choose)``, which compiles the program with the schedules ``choose`` gives (None: the heuristics')
and returns a ready ``GpuExecutor``; this module never imports a backend.
"""
from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..backend.gpu.executor import GpuExecutor
from ..backend.gpu.gemm import gpu_gemm_sizes
from ..backend.gpu.scheduling import ScheduleChoice
from ..graph import Program
from ..kernel.heuristics import GpuTarget
from ..kernel.schedule import Register, Schedule, ScheduleError, Tile
from . import tuning_cache
from .check import outputs_agree, random_inputs, tune_dims

MIN_GAIN = 0.03  # the tuned program must beat the heuristics' by this fraction to replace it
# (tile m, tile n, panel depth, register m, register n): square and oblong tiles, small and large blocks
VARIANTS = ((64, 64, 16, 4, 4), (128, 128, 16, 8, 8), (64, 128, 16, 4, 8), (128, 64, 16, 8, 4), (32, 64, 16, 2, 4),
            (64, 64, 32, 4, 4), (64, 64, 16, 8, 8), (32, 32, 16, 2, 2), (64, 64, 32, 16, 16), (32, 64, 32, 4, 8),
            (64, 64, 8, 4, 4))
QUICK = 6  # level 1 tries the first this many candidates; level 2 all


@dataclass
class GpuScheduleResult:
    """What a GPU schedule search chose (kernel name -> schedule; empty: the heuristics') and what it did."""

    choice: dict[str, Schedule] = field(default_factory=dict)
    default_seconds: float | None = None
    tuned_seconds: float | None = None
    tried: int = 0  # candidate builds timed
    rejected: int = 0  # candidates that failed to build or disagreed with the heuristics' build
    from_cache: int = 0  # kernels whose schedule came from the tuning cache
    seconds: float = 0.0
    stopped_by: str = "done"  # done | budget | cached | nothing-to-tune | no-gain
    env: dict[str, int] = field(default_factory=dict)

    def choose(self) -> ScheduleChoice | None:
        """The ``schedules`` argument of a GPU backend that applies this choice (None: the heuristics)."""
        if not self.choice:
            return None
        chosen = dict(self.choice)
        return lambda k: chosen.get(k.name)


def candidates(default: Schedule, target: GpuTarget, level: int = 1) -> list[Schedule]:
    """The heuristics' schedule, then variants of its tiles, panel depth and register block (``VARIANTS``) that
    ``target`` can hold; level 1 the first ``QUICK`` of them, level 2 all."""
    out, seen = [default], {default.canonical()}
    for tm, tn, d, rm, rn in VARIANTS[:QUICK - 1] if level < 2 else VARIANTS:
        s = default.with_steps(Tile("m", tm), Tile("n", tn), Tile("k", d), Register("m", rm), Register("n", rn))
        try:
            gpu_gemm_sizes(s, target)
        except ScheduleError:
            continue
        if s.canonical() not in seen:
            seen.add(s.canonical())
            out.append(s)
    return out


def kernel_key(text: str, env: dict[str, int], device_id: str) -> str:
    """The tuning-cache key of a GPU kernel: its text under the heuristics' schedule, the dimension values
    and the device (its name, driver and compiler versions)."""
    from .. import __version__
    h = hashlib.sha256()
    for part in ("gpu-gemm", text, json.dumps(sorted(env.items())), __version__, device_id):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def _texts(ex: GpuExecutor) -> dict[str, str]:
    """Plan kernel name -> the text of its tile function (the kernel's identity in the tuning cache)."""
    return {launch.name: ex.gpu.functions[launch.function] for launch in ex.gpu.kernels}


def _time_whole(ex: GpuExecutor, inputs: dict, env: dict, rounds: int = 5) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        ex.run(inputs, env)
        out.append(time.perf_counter() - t0)
    return out


def tune_gpu_schedules(program: Program, build: Callable[[ScheduleChoice | None], GpuExecutor], target: GpuTarget,
                       device_id: str, level: int = 1, budget_s: float = 30.0, dims: dict[str, int] | None = None,
                       seed: int = 0) -> GpuScheduleResult:
    """Search schedules for the gemm kernels of ``program`` on the device ``build`` compiles for (see the
    module docstring); ``level`` 1 or 2 (how many candidates), ``budget_s`` seconds at most for the candidates
    (the final check and timing run after), ``dims``: the dimension values to time at."""
    t_start = time.perf_counter()
    env = tune_dims(program, dims)
    res = GpuScheduleResult(env=env)
    base = build(None)
    defaults = {k.name: k.schedule for k in base.plan.kernels if k.kind == "gemm" and k.schedule is not None}
    names = list(defaults)
    if not names:
        res.stopped_by, res.seconds = "nothing-to-tune", time.perf_counter() - t_start
        return res
    texts = _texts(base)
    keys = {n: kernel_key(texts[n], env, device_id) for n in names}
    cached = {n: tuning_cache.load(keys[n]) for n in names}
    if all(c is not None for c in cached.values()):
        for n, c in cached.items():
            s = Schedule.from_json(c["knobs"]["schedule"])
            if s.canonical() != defaults[n].canonical():
                res.choice[n] = s
        res.from_cache, res.stopped_by = len(names), "cached"
        res.seconds = time.perf_counter() - t_start
        return res

    inputs = random_inputs(program, env, np.random.default_rng(seed))
    expected = base.run(inputs, env)
    base.time_kernels(env, names)  # warm-up: first launches build and page in what they touch
    best = base.time_kernels(env, names)
    chosen = dict(defaults)
    tried = {n: candidates(defaults[n], target, level) for n in names}
    rounds = max(len(c) for c in tried.values())
    for i in range(1, rounds):
        if time.perf_counter() - t_start > budget_s:
            res.stopped_by = "budget"
            break
        pick = {n: c[i] for n, c in tried.items() if i < len(c)}
        res.tried += 1
        try:
            ex = build(lambda k, pick=pick: pick.get(k.name))
            if not outputs_agree(expected, ex.run(inputs, env)):
                res.rejected += 1
                continue
            times = ex.time_kernels(env, list(pick))
        except Exception:  # a candidate that fails to build or run is dropped; the heuristics stay
            res.rejected += 1
            continue
        for n, t in times.items():
            if t < best[n]:
                best[n], chosen[n] = t, pick[n]
    change = {n: s for n, s in chosen.items() if s is not defaults[n]}
    if change:
        tuned = build(lambda k: change.get(k.name))
        if not outputs_agree(expected, tuned.run(inputs, env)):
            change = {}
        else:
            a, b = [], []
            for _ in range(3):  # alternating rounds: load on the machine moves both alike
                a += _time_whole(base, inputs, env, 2)
                b += _time_whole(tuned, inputs, env, 2)
            res.default_seconds, res.tuned_seconds = statistics.median(a), statistics.median(b)
            if res.tuned_seconds > res.default_seconds * (1 - MIN_GAIN):
                change, res.stopped_by = {}, "no-gain" if res.stopped_by == "done" else res.stopped_by
    res.choice = change
    for n in names if res.stopped_by != "budget" else ():  # a search cut short is not remembered
        tuning_cache.store(keys[n], {"knobs": {"schedule": change.get(n, defaults[n]).to_json()},
                                     "seconds": best[n] if n in change else None})
    res.seconds = time.perf_counter() - t_start
    return res
