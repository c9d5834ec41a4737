"""``torch.compile(model, backend="lightspeed")``: PyTorch models compiled by Lightspeed.

The backend is registered through the ``torch_dynamo_backends`` entry point, so installing
Lightspeed is enough. From a source tree that is not installed, call ``register()`` once (or
pass ``backend=lightspeed_backend`` to torch.compile).

Options (``torch.compile(..., options={...})``): ``backend`` ("c", default, or "reference"),
``fallback`` ("error", default, or "eager"), ``backend_options`` (passed to the Lightspeed backend).

Pipeline: backend.py (entry, options) -> aot_autograd with decompositions.py -> compiled.py
(CompiledFxGraph: binding, symbolic-dim bounds) -> fx_lowering.py (FX node by node) ->
lowering/ (one function per aten op) -> a Lightspeed graph compiled by the chosen backend;
partition.py splits a graph for the eager fallback.
"""
from .backend import BackendOptions, compile_fx, lightspeed_backend
from .compiled import STATS, CompiledFxGraph
from .errors import InferenceOnlyError, Problem, UnsupportedOpsError
from .fx_lowering import LoweringError


def register() -> None:
    """Make backend="lightspeed" known to torch.compile without the package's entry point."""
    from torch._dynamo.backends import registry
    registry._discover_entrypoint_backends()
    if "lightspeed" not in registry._COMPILER_FNS and registry._BACKENDS.get("lightspeed") is None:
        registry.register_backend(lightspeed_backend, name="lightspeed")


__all__ = ["register", "lightspeed_backend", "BackendOptions", "compile_fx", "CompiledFxGraph", "STATS",
           "UnsupportedOpsError", "InferenceOnlyError", "Problem", "LoweringError"]
