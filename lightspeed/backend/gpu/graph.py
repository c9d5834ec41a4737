"""A program's launches recorded once and replayed (a CUDA graph on CUDA), so a decode step costs a few
API calls instead of one Python-side launch per kernel.

The recorded kernels are the program rendered with its parameters in memory (``params_in_memory``): each
reads the dimension values from a small device buffer ``P`` and computes its own work items from them, so
one recording stays valid while a dimension changes (a decode step's position). The dimensions that pick
the kernels' forms and shapes (a step's ``seq``) are fixed per recording; for the others (``pos``) each
launch's grid is the upper bound of its work items, and work items (whole work groups, in the forms with
barriers) past the current count return at once. Buffers are the executor's: inputs, outputs, constants
and the arena are shared with its ordinary runs.
"""
from __future__ import annotations

from typing import Any, Collection, Mapping

import numpy as np

from ... import symbolic as sym
from .executor import GpuExecutor
from .render import SMALL_ROWS, render_program


class GraphStep:
    """The launches of ``executor`` for the dimension values ``fixed`` (names -> values), any values of the
    other dimensions; ``device`` is the executor's device with the program rendered with parameters in
    memory (``executor.graph_device``)."""

    def __init__(self, executor: GpuExecutor, fixed: Mapping[str, int], small_form: str = "rows"):
        plan, dev_dims = executor.plan, executor.plan.dims
        self.executor, self.fixed = executor, dict(fixed)
        self.free = [v for v in dev_dims if v.name not in self.fixed]
        gpu = render_program(plan, executor.gpu.dialect, small_form=small_form, params_in_memory=True)
        self.device = executor.graph_device(gpu.source)
        self.params = executor.device.alloc(8 * max(len(dev_dims), 1))
        fixed_vars = {v: int(self.fixed[v.name]) for v in dev_dims if v.name in self.fixed}
        self.launches = []  # (prepared kernel, groups, block)
        for launch in gpu.kernels:
            variant = launch
            if launch.small is not None:
                rows = sym.to_expr(launch.rows).substitute(fixed_vars)
                if sym.free_vars(rows):
                    names = sorted(v.name for v in sym.free_vars(rows))
                    raise ValueError(f"kernel {launch.name}: its form depends on {names}, which this recording "
                                     "does not fix")
                variant = launch.small if int(sym.evaluate(rows, {})) <= SMALL_ROWS else launch
            items = sym.upper_bound(sym.to_expr(variant.items).substitute(fixed_vars))
            if items <= 0:
                continue
            block = variant.block or executor.block
            prepared = self.device.prepare(variant.function, executor.buffer_arguments(variant), 0, [self.params])
            self.launches.append((prepared, (items + block - 1) // block, block))
        self.device.begin_capture()
        try:
            for prepared, groups, block in self.launches:
                self.device.launch(prepared, [], groups, block)
        finally:
            self.recording = self.device.end_capture()

    def run(self, inputs: Mapping[str, np.ndarray], env: Mapping[str, int], resident: Collection[str] = (),
            fetch: Collection[int] | None = None) -> list[np.ndarray | None]:
        """As ``GpuExecutor.run`` at ``env`` (whose fixed dimensions must have this recording's values)."""
        for name, value in self.fixed.items():
            if int(env[name]) != value:
                raise ValueError(f"this recording is for {name}={value}, got {name}={env[name]}")
        ex = self.executor
        params = np.array([int(env[v.name]) for v in ex.plan.dims] or [0], np.int64)
        return ex.run(inputs, env, resident=resident, fetch=fetch, launch=lambda: self._replay(params))

    def _replay(self, params: np.ndarray) -> Any:
        self.executor.upload(self.params, params)
        self.device.replay(self.recording)
