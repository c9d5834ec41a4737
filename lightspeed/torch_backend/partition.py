"""Fallback mode: split an FX graph into parts Lightspeed compiles and nodes PyTorch runs.

Nodes Lightspeed cannot lower are left in the top-level graph, where they run in eager
PyTorch; maximal groups of the other nodes become submodules (PyTorch's capability-based
partitioner keeps the result acyclic), and each submodule is compiled by Lightspeed.
"""
from __future__ import annotations

import warnings

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from .compiled import STATS, CompiledFxGraph
from .errors import Problem, UnsupportedOpsError


class _Supported(OperatorSupportBase):
    def __init__(self, unsupported: set[str]):
        self.unsupported = unsupported

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node.name not in self.unsupported


class _LightspeedPart(torch.nn.Module):
    """A partition compiled by Lightspeed, callable like the submodule it replaces."""

    def __init__(self, compiled: CompiledFxGraph, returns_tuple: bool):
        super().__init__()
        self.compiled = compiled
        self.returns_tuple = returns_tuple

    def forward(self, *args):
        out = self.compiled(list(args))
        return tuple(out) if self.returns_tuple else out[0]


def _returns_tuple(gm: torch.fx.GraphModule) -> bool:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return isinstance(out.args[0], (tuple, list))


def compile_with_fallback(gm: torch.fx.GraphModule, problems: list[Problem], backend: str,
                          backend_options: dict, rewrite: bool = True):
    """A callable (boxed) running the supported parts of ``gm`` with Lightspeed and the rest eagerly."""
    unsupported = {p.node for p in problems}
    summary = "; ".join(f"{p.target} ({p.reason})" for p in problems[:8])
    more = f" and {len(problems) - 8} more" if len(problems) > 8 else ""
    warnings.warn(f"Lightspeed: {len(problems)} op(s) run in eager PyTorch: {summary}{more}", stacklevel=2)
    partitioner = CapabilityBasedPartitioner(gm, _Supported(unsupported), allows_single_node_partition=True)
    fused = partitioner.fuse_partitions(partitioner.propose_partitions())
    for node in list(fused.graph.nodes):
        if node.op != "call_module":
            continue
        sub = getattr(fused, node.target)
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        for ph, arg in zip(placeholders, node.args):
            if isinstance(arg, torch.fx.Node) and "val" in arg.meta:
                ph.meta["val"] = arg.meta["val"]
        try:
            part = _LightspeedPart(CompiledFxGraph(sub, backend, backend_options, rewrite), _returns_tuple(sub))
        except UnsupportedOpsError:
            # lowering failed inside the part after all: it runs eagerly too
            STATS.eager_nodes += sum(1 for n in sub.graph.nodes if n.op == "call_function")
            continue
        setattr(fused, node.target, part)
    fused.recompile()
    STATS.eager_nodes += len(unsupported)

    def run(args: list):
        out = fused(*args)
        args.clear()
        return out
    run._boxed_call = True
    return run
