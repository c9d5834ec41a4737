"""aten -> Lightspeed lowerings, one module per family; importing this package fills LOWERINGS."""
from . import conv, elementwise, indexing, nn, reductions, scatter, shapes, sorting  # noqa: F401
from .registry import LOWERINGS, LoweringContext, Unsupported, lowers

__all__ = ["LOWERINGS", "LoweringContext", "Unsupported", "lowers"]
