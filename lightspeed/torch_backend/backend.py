"""The torch.compile backend: ``torch.compile(model, backend="lightspeed", options={...})``.

Dynamo hands us an FX graph of torch calls; aot_autograd turns it into an aten graph with
our decomposition table (functionalised: no mutation, views made explicit); each aten
node is lowered to Lightspeed ops and the graph is compiled (C backend by default).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .compiled import STATS, CompiledFxGraph
from .errors import InferenceOnlyError, UnsupportedOpsError

FALLBACKS = ("error", "eager")


@dataclass(frozen=True)
class BackendOptions:
    """``options=`` of torch.compile. ``backend``: the Lightspeed backend ("c" or "reference");
    ``fallback``: "error" (raise, listing every unsupported op) or "eager" (run those ops in
    eager PyTorch, compile the rest); ``backend_options``: passed on to the Lightspeed backend;
    ``rewrite``: apply the rewrite package's safe rules before compiling (compiled.compile_lowered)."""

    backend: str = "c"
    fallback: str = "error"
    backend_options: dict | None = None
    rewrite: bool = True

    @staticmethod
    def parse(options: dict | None) -> "BackendOptions":
        options = dict(options or {})
        known = {"backend", "fallback", "backend_options", "rewrite"}
        extra = sorted(set(options) - known)
        if extra:
            raise ValueError(f"unknown Lightspeed option(s) {extra}; known: {sorted(known)}")
        opts = BackendOptions(**options)
        if opts.fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {opts.fallback!r}")
        from ..backend import available_backends
        if opts.backend not in available_backends():
            raise ValueError(f"unknown Lightspeed backend {opts.backend!r}; available: {available_backends()}")
        return opts


def _needs_grad(example_inputs: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def compile_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], opts: BackendOptions):
    """Compile an aten FX graph (the aot_autograd forward/inference compiler)."""
    STATS.fx_graphs += 1
    try:
        return CompiledFxGraph(gm, opts.backend, opts.backend_options, opts.rewrite)
    except UnsupportedOpsError as e:
        if opts.fallback != "eager":
            raise
        from .partition import compile_with_fallback
        return compile_with_fallback(gm, e.problems, opts.backend, opts.backend_options or {}, opts.rewrite)


def lightspeed_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict | None = None):
    """The dynamo backend registered as "lightspeed" (``torch_dynamo_backends`` entry point)."""
    opts = BackendOptions.parse(options)
    if _needs_grad(example_inputs):
        if opts.fallback == "eager":
            return gm.forward
        raise InferenceOnlyError(
            "Lightspeed compiles inference only, but this graph needs gradients (grad mode is on and an input or "
            "parameter requires grad). Run the model under torch.no_grad() or torch.inference_mode(), or pass "
            'options={"fallback": "eager"} to run such graphs in eager PyTorch.')
    from torch._dynamo.backends.common import aot_autograd
    from .decompositions import decomposition_table

    def fw_compiler(fx_gm, inputs):
        return compile_fx(fx_gm, inputs, opts)

    def bw_compiler(fx_gm, inputs):
        raise InferenceOnlyError("Lightspeed compiles inference only; no backward graph")

    return aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler,
                        decompositions=decomposition_table())(gm, example_inputs)
