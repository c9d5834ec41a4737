"""Lightspeed: an ahead-of-time inference compiler for graphs of primitive ops."""
from . import dtypes
from .dtypes import (DType, bfloat16, bool_, float16, float32, int8, int16, int32, int64, uint8, uint16,
                     uint32)
from .graph import Graph, Program
from .ops import Op
from .symbolic import Var, dim
from .tensor import Tensor, _attach_frontend

_attach_frontend()

from . import frontend  # noqa: E402
from .backend import available_backends, register_backend  # noqa: E402

__version__ = "0.1.0"

__all__ = ["Graph", "Tensor", "Program", "Op", "Var", "dim", "DType", "dtypes", "frontend", "register_backend",
           "available_backends", "float32", "float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int32",
           "uint32", "int64", "bool_", "__version__"]
