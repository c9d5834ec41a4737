"""FX graph (aten ops) -> Lightspeed graph.

Every node is lowered in order. Tensor placeholders become Lightspeed inputs (with
symbolic dims where PyTorch's sizes are symbolic); SymInt placeholders become the
symbolic expressions they stand for. After each node the result is cast to the dtype
PyTorch recorded for it and its shape is checked against PyTorch's, so a lowering bug
shows up as an error, not as a wrong number.

A node that cannot be lowered is recorded as a Problem and replaced by a fresh input
of its recorded shape, so that the nodes after it are still tried: the caller gets the
complete list of what is unsupported (for the error message, or to decide which nodes
run in eager PyTorch).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from .. import symbolic as sym
from ..graph import Graph
from ..tensor import Tensor
from . import lowering  # noqa: F401  (fills the table)
from .errors import Problem
from .lowering.registry import LOWERINGS, LoweringContext, Unsupported
from .symbols import SymbolTable, UnsupportedSymbolicExpr
from .tensors import CARRIED_AS, carrier_dtype, is_supported_dtype, ls_dtype


class LoweringError(RuntimeError):
    """A lowering produced something that disagrees with PyTorch's metadata (a bug)."""


@dataclass
class InputSpec:
    name: str          # the Lightspeed input name
    arg_index: int     # position among the compiled function's arguments


@dataclass
class LoweredGraph:
    graph: Graph
    outputs: list[Tensor]
    # per FX output: ("tensor", index into outputs, torch dtype) | ("sym", expression) | ("value", python value)
    output_plan: list[tuple]
    inputs: list[InputSpec]
    dim_sources: dict[str, tuple[int, int | None]]  # dim name -> (arg index, axis or None for a SymInt arg)
    symbols: SymbolTable
    problems: list[Problem] = field(default_factory=list)
    unsupported_nodes: set[str] = field(default_factory=set)


def _where(node: torch.fx.Node) -> str:
    """The last user source line PyTorch recorded for this node."""
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    for k in range(len(lines) - 1, -1, -1):
        if lines[k].startswith("File "):
            code = lines[k + 1] if k + 1 < len(lines) else ""
            return f"{lines[k]}: {code}" if code else lines[k]
    return ""


def _target_name(target) -> str:
    if isinstance(target, str):
        return target
    return str(target) if hasattr(target, "_schema") or hasattr(target, "overloadpacket") else \
        getattr(target, "__name__", str(target))


def _tensors_in(v) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors_in(x)]
    return []


# SymInt arithmetic that appears as plain Python operators in dynamic graphs
SYMBOLIC_OPS: dict[Any, Any] = {
    operator.add: sym.add,
    operator.mul: sym.mul,
    operator.sub: lambda a, b: sym.add(a, sym.mul(b, -1)),
    operator.floordiv: sym.floordiv,
    operator.mod: sym.mod,
    operator.neg: lambda a: sym.mul(a, -1),
    torch.sym_max: sym.smax,
    torch.sym_min: sym.smin,
}
# casts: the only ops that may touch float64 values (carried as float32, see tensors.CARRIED_AS)
CASTS = {torch.ops.prims.convert_element_type.default, torch.ops.aten._to_copy.default}
# checks PyTorch inserts for dynamic shapes: they hold by construction of the guards
NO_OPS = {"aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default",
          "aten._assert_tensor_metadata.default", "aten.sym_constrain_range.default"}


class FxLowering:
    """Lower one FX GraphModule of aten ops into a new Lightspeed graph."""

    def __init__(self, gm: torch.fx.GraphModule, symbols: SymbolTable | None = None):
        self.gm = gm
        self.symbols = symbols or SymbolTable()
        self.graph = Graph()
        self.env: dict[torch.fx.Node, Any] = {}
        self.inputs: list[InputSpec] = []
        self.dim_sources: dict[str, tuple[int, int | None]] = {}
        self.problems: list[Problem] = []
        self.unsupported: set[str] = set()
        self.outputs: list[Tensor] = []
        self.output_plan: list[tuple] = []

    def run(self) -> LoweredGraph:
        arg_index = 0
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node, arg_index)
                arg_index += 1
            elif node.op == "call_function":
                self._call(node)
            elif node.op == "get_attr":
                self._get_attr(node)
            elif node.op == "output":
                self._output(node)
            else:
                self._fail(node, f"FX node kind {node.op!r} is not supported")
        return LoweredGraph(self.graph, self.outputs, self.output_plan, self.inputs, self.dim_sources,
                            self.symbols, self.problems, self.unsupported)

    # sources -------------------------------------------------------------------------
    def _placeholder(self, node: torch.fx.Node, k: int) -> None:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            if not (is_supported_dtype(val.dtype) or val.dtype in CARRIED_AS) or val.device.type != "cpu":
                self.env[node] = _Unavailable(f"input {node.name} has dtype {val.dtype} on {val.device}")
                return
            try:
                shape = self.symbols.shape(val)
            except UnsupportedSymbolicExpr as e:
                self.env[node] = _Unavailable(str(e))
                return
            name = f"in{k}"
            self.env[node] = self.graph.input(name, shape, carrier_dtype(val.dtype))
            self.inputs.append(InputSpec(name, k))
            for axis, s in enumerate(shape):
                if isinstance(s, sym.Var) and s.name not in self.dim_sources:
                    self.dim_sources[s.name] = (k, axis)
        elif isinstance(val, torch.SymInt):
            try:
                e = self.symbols.size(val)
            except UnsupportedSymbolicExpr as err:
                self.env[node] = _Unavailable(str(err))
                return
            self.env[node] = e
            if isinstance(e, sym.Var):
                self.dim_sources.setdefault(e.name, (k, None))
        elif isinstance(val, (int, float, bool)) or val is None:
            self.env[node] = val
        else:
            self.env[node] = _Unavailable(f"input {node.name} of type {type(val).__name__}")

    def _get_attr(self, node: torch.fx.Node) -> None:
        obj = self.gm
        for part in node.target.split("."):
            obj = getattr(obj, part)
        if not isinstance(obj, torch.Tensor) or not is_supported_dtype(obj.dtype):
            self._fail(node, f"attribute {node.target} of type {type(obj).__name__}")
            return
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        from .tensors import to_numpy
        with unset_fake_temporarily():  # compilers run under fake mode; this tensor is real
            arr = to_numpy(obj).copy()  # a constant folded into the graph: PyTorch may free the original
        self.env[node] = self.graph.constant(arr, ls_dtype(obj.dtype)) if arr.ndim else \
            self.graph.constant(arr.reshape(1), ls_dtype(obj.dtype)).reshape(())

    # ops -------------------------------------------------------------------------------
    def _arg(self, a):
        if isinstance(a, torch.fx.Node):
            v = self.env[a]
            if isinstance(v, _Unavailable):
                raise Unsupported(v.reason)
            return v
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x) for x in a)
        if isinstance(a, dict):
            return {k: self._arg(v) for k, v in a.items()}
        if isinstance(a, torch.SymInt):
            return self.symbols.size(a)
        return a

    def _check_dtypes(self, node: torch.fx.Node) -> None:
        vals = _tensors_in(node.meta.get("val"))
        for a in node.all_input_nodes:
            vals += _tensors_in(a.meta.get("val"))
        for t in vals:
            # float64 is carried as float32: through casts, and in 0-d scalar arithmetic (Python
            # floats dynamo passes as tensors), where it costs at most an ulp of the float32 result
            if t.dtype in CARRIED_AS and (node.target in CASTS or t.dim() == 0):
                continue
            if not is_supported_dtype(t.dtype):
                raise Unsupported(f"dtype {t.dtype} is not supported by Lightspeed")
            if t.device.type != "cpu":
                raise Unsupported(f"tensors on {t.device} (Lightspeed runs on the CPU)")

    def _call(self, node: torch.fx.Node) -> None:
        target = node.target
        name = _target_name(target)
        if name in NO_OPS:
            self.env[node] = None
            return
        try:
            self._check_dtypes(node)
            args, kwargs = self._arg(node.args), self._arg(node.kwargs)
            if target is operator.getitem:
                value = args[0][args[1]]
            elif target in SYMBOLIC_OPS:
                value = SYMBOLIC_OPS[target](*args, **kwargs)
            elif name in ("aten.sym_size.int", "aten.sym_size"):
                value = args[0].shape[args[1]]
            elif name == "aten.sym_numel.default":
                value = args[0].numel()
            else:
                fn = LOWERINGS.get(target)
                if fn is None:
                    raise Unsupported("no lowering for this op")
                ctx = LoweringContext(self.graph, node, self.symbols)
                value = fn(ctx, *args, **kwargs)
            self.env[node] = self._conform(node, value)
        except (Unsupported, NotImplementedError, UnsupportedSymbolicExpr) as e:
            self._fail(node, str(e) or type(e).__name__)
        except LoweringError as e:
            self._fail(node, f"lowering error: {e}")
        except (ValueError, TypeError, IndexError, KeyError, AttributeError, AssertionError) as e:
            self._fail(node, f"lowering failed: {type(e).__name__}: {e}")

    def _fail(self, node: torch.fx.Node, reason: str) -> None:
        self.problems.append(Problem(node.name, _target_name(node.target), reason, _where(node)))
        self.unsupported.add(node.name)
        self.env[node] = self._substitute(node)

    def _substitute(self, node: torch.fx.Node):
        """A stand-in for a node that was not lowered: fresh inputs of the shapes PyTorch recorded."""
        def make(v, suffix):
            if isinstance(v, torch.Tensor) and is_supported_dtype(v.dtype):
                try:
                    return self.graph.input(f"sub_{node.name}{suffix}", self.symbols.shape(v), ls_dtype(v.dtype))
                except UnsupportedSymbolicExpr as e:
                    return _Unavailable(str(e))
            if isinstance(v, torch.SymInt):
                try:
                    return self.symbols.size(v)
                except UnsupportedSymbolicExpr as e:
                    return _Unavailable(str(e))
            if isinstance(v, (list, tuple)):
                return type(v)(make(x, f"{suffix}_{i}") for i, x in enumerate(v))
            if isinstance(v, (int, float, bool)) or v is None:
                return v
            return _Unavailable(f"the result of {node.name}")
        return make(node.meta.get("val"), "")

    # checking results against PyTorch's metadata ----------------------------------------
    def _conform(self, node: torch.fx.Node, value):
        meta = node.meta.get("val")
        if isinstance(meta, torch.Tensor):
            return self._conform_tensor(node, value, meta)
        if isinstance(meta, (list, tuple)):
            if not isinstance(value, (list, tuple)) or len(value) != len(meta):
                raise LoweringError(f"{node.name}: expected {len(meta)} results, got "
                                    f"{len(value) if isinstance(value, (list, tuple)) else type(value).__name__}")
            return type(value)(self._conform_tensor(node, v, m) if isinstance(m, torch.Tensor) else v
                               for v, m in zip(value, meta))
        return value

    def _conform_tensor(self, node: torch.fx.Node, value, meta: torch.Tensor) -> Tensor:
        want_dtype = carrier_dtype(meta.dtype)
        if not isinstance(value, Tensor):
            if isinstance(value, (int, float, bool, sym.Expr)):
                value = LoweringContext(self.graph, node, self.symbols).scalar(value, want_dtype)
            else:
                raise LoweringError(f"{node.name}: expected a tensor result, got {type(value).__name__}")
        value = value.cast(want_dtype)
        want = self.symbols.shape(meta)
        have = value.shape
        if len(want) == len(have) and all(sym.same(a, b) for a, b in zip(want, have)):
            return value
        if len(want) == len(have) and self._equal_at_hints(want, have):
            # the same sizes written differently (e.g. a min() PyTorch simplified): take PyTorch's
            return value.reshape(want)
        raise LoweringError(f"the lowering of {_target_name(node.target)} produced shape "
                            f"{tuple(have)} but PyTorch expects {tuple(want)}")

    def _equal_at_hints(self, a, b) -> bool:
        """Whether two shapes agree at the traced sizes and at a few other sizes in bounds
        (two spellings of one size agree everywhere; a transposed pair of sizes does not)."""
        import random
        rng = random.Random(0)
        envs = [dict(self.symbols.hints)]
        for _ in range(4):
            envs.append({n: rng.randint(v.lo, max(v.lo, min(v.hi, v.lo + 200))) for n, v in self.symbols.vars.items()})
        try:
            return all(int(sym.evaluate(x, env)) == int(sym.evaluate(y, env))
                       for env in envs for x, y in zip(a, b))
        except (ValueError, TypeError, ZeroDivisionError):
            return False

    # outputs ------------------------------------------------------------------------------
    def _output(self, node: torch.fx.Node) -> None:
        (outs,) = node.args
        for o in (outs if isinstance(outs, (list, tuple)) else [outs]):
            v = self.env.get(o) if isinstance(o, torch.fx.Node) else o
            if isinstance(v, _Unavailable):
                self.output_plan.append(("unavailable", v.reason))
            elif isinstance(v, Tensor):
                meta = o.meta.get("val") if isinstance(o, torch.fx.Node) else None
                if meta is not None and meta.dtype in CARRIED_AS:
                    self._fail(o, f"a {meta.dtype} graph output (Lightspeed carries {meta.dtype} only between casts)")
                self.output_plan.append(("tensor", len(self.outputs), meta.dtype if meta is not None else None))
                self.outputs.append(v)
            elif isinstance(v, sym.Expr):
                self.output_plan.append(("sym", v))
            else:
                self.output_plan.append(("value", v))


@dataclass
class _Unavailable:
    """A value Lightspeed does not have (an input of an unsupported dtype, ...)."""
    reason: str
