"""The callable that runs a lowered FX graph: binds torch tensors as numpy views, runs the
Lightspeed program, and wraps its outputs as torch tensors.

Symbolic dims are read from the arguments on every call. When a dim exceeds the upper
bound the program was built with, the FX graph is lowered and compiled again with a
doubled bound (PyTorch does not recompile: its graph and guards are unchanged).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.fx

from .. import symbolic as sym
from .errors import Problem, UnsupportedOpsError
from .fx_lowering import FxLowering, LoweredGraph
from .symbols import SymbolTable
from .tensors import to_numpy, to_torch


@dataclass
class Stats:
    """Counters tests and users can read: how often each stage ran."""

    fx_graphs: int = 0          # FX graphs handed to the backend by aot_autograd
    builds: int = 0             # Lightspeed lowerings + compilations (including bound growth)
    bound_growths: int = 0      # rebuilds because a symbolic dim outgrew its upper bound
    eager_nodes: int = 0        # FX nodes left to eager PyTorch (fallback mode)

    def reset(self) -> None:
        self.fx_graphs = self.builds = self.bound_growths = self.eager_nodes = 0


STATS = Stats()


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def compile_lowered(lowered: LoweredGraph, backend: str, options: dict, rewrite: bool = True):
    """The compiled program of a lowered FX graph (None when it has no outputs). With ``rewrite`` (and a
    backend other than the reference interpreter, which stays the oracle) the program is first rewritten
    to a fixpoint under the rewrite package's normalising safe rules (EXACT or VALUE: no value changes, a zero may
    change sign): aten's formulations become the forms kernel formation recognises, e.g. PyTorch's safe
    softmax ``where(c, 0, softmax)`` the select that streaming attention reads (docs/search.md)."""
    if not lowered.outputs:
        return None
    if not rewrite or backend == "reference":
        return lowered.graph.compile(lowered.outputs, backend=backend, **options)
    from ..backend import get_backend
    from ..graph import Program
    from ..rewrite import rewrite_program, rules
    from ..runtime import CompiledGraph
    program = rewrite_program(Program.build(lowered.graph, list(lowered.outputs)), rules.NORMALISE).program
    return CompiledGraph(program, get_backend(backend)(program, **options))


class CompiledFxGraph:
    """Runs an FX graph of aten ops with Lightspeed. Called by aot_autograd with a list of arguments."""

    _boxed_call = True  # aot_autograd passes one list of arguments

    def __init__(self, gm: torch.fx.GraphModule, backend: str = "c", backend_options: dict | None = None,
                 rewrite: bool = True):
        self.gm = gm
        self.backend = backend
        self.backend_options = dict(backend_options or {})
        self.rewrite = rewrite
        self.upper: dict[str, int] = {}
        self._lock = threading.Lock()
        self._build()

    def _build(self) -> None:
        lowered = FxLowering(self.gm, SymbolTable(upper=self.upper)).run()
        if lowered.problems:
            raise UnsupportedOpsError(lowered.problems)
        self._check_sources(lowered)
        self.lowered: LoweredGraph = lowered
        self.vars = dict(lowered.symbols.vars)
        self.upper = {name: v.hi for name, v in self.vars.items()}
        self.program = compile_lowered(lowered, self.backend, self.backend_options, self.rewrite)
        used = set(self.program.input_names) if self.program is not None else set()
        self.input_specs = [s for s in lowered.inputs if s.name in used]
        self.program_dims = [v.name for v in self.program.program.dims] if self.program is not None else []
        STATS.builds += 1

    def _check_sources(self, lowered: LoweredGraph) -> None:
        missing = [name for name in lowered.symbols.vars if name not in lowered.dim_sources]
        if missing:
            raise UnsupportedOpsError([Problem("<inputs>", "symbolic sizes", f"the size {name} cannot be read from "
                                               "any input of the graph") for name in missing], hint=False)

    def dims_of(self, args) -> dict[str, int]:
        env = {}
        for name, (k, axis) in self.lowered.dim_sources.items():
            a = args[k]
            env[name] = int(a.shape[axis]) if axis is not None else int(a)
        return env

    def __call__(self, args: list):
        env = self.dims_of(args)
        too_big = {n: v for n, v in env.items() if n in self.vars and v > self.vars[n].hi}
        if too_big:
            with self._lock:
                for n, v in too_big.items():
                    self.upper[n] = _next_pow2(max(2 * self.vars[n].hi, v))
                STATS.bound_growths += 1
                self._build()
        outs = ()
        if self.program is not None:
            arrays = {s.name: to_numpy(args[s.arg_index]) for s in self.input_specs}
            dims = {n: env[n] for n in self.program_dims}
            outs = self.program(dims=dims, **arrays)
        results = []
        for plan in self.lowered.output_plan:
            kind = plan[0]
            if kind == "tensor":
                results.append(to_torch(outs[plan[1]], plan[2]))
            elif kind == "sym":
                results.append(int(sym.evaluate(plan[1], env)))
            else:
                results.append(plan[1])
        args.clear()  # the boxed convention: the caller's references are no longer needed
        return results
