"""The graph of primitive ops: hash-consed nodes whose inputs are views of other nodes.

Each node's edges carry a ``ShapeTracker`` (the view through which the node reads
its source), so movement ops never become nodes. Structurally identical nodes are
created once (hash-consing), which shares common subexpressions by construction.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Hashable, Sequence

import numpy as np

from . import dtypes as dt
from . import symbolic as sym
from .ops import OPS, Op
from .shape import ShapeTracker, _shape_str
from .symbolic import sint

if TYPE_CHECKING:  # tensor.py builds on this module: the annotations only name its class
    from .tensor import Tensor


class ArrayConst:
    """A numpy array embedded in a graph. Small arrays are identified by content (so equal tables built
    twice, e.g. rotary frequencies in every layer, become one node); large ones by identity."""

    __slots__ = ("array", "_key")
    SMALL_BYTES = 4096

    def __init__(self, array: np.ndarray):
        self.array = array
        if array.nbytes <= self.SMALL_BYTES:
            self._key = (array.dtype.str, array.shape, np.ascontiguousarray(array).tobytes())
        else:
            self._key = id(array)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ArrayConst):
            return False
        return self.array is other.array or (type(self._key) is tuple and self._key == other._key)

    def __repr__(self) -> str:
        return f"array{self.array.shape}"


class Node:
    """One primitive op. ``srcs`` are (node, view) pairs; ``shape`` is the node's own dense shape."""

    __slots__ = ("op", "srcs", "arg", "dtype", "shape", "id", "graph", "__weakref__")

    def __init__(self, graph: "Graph", op: Op, srcs, arg, dtype: dt.DType, shape: tuple[sint, ...], nid: int):
        self.graph, self.op, self.srcs, self.arg = graph, op, srcs, arg
        self.dtype, self.shape, self.id = dtype, shape, nid

    def __repr__(self) -> str:
        srcs = ", ".join(f"%{s.id}" for s, _ in self.srcs)
        arg = f" {self.arg!r}" if self.arg is not None else ""
        return f"%{self.id} = {self.op.value}{arg}({srcs}) : {self.dtype.name}{_shape_str(self.shape)}"


def check_shape(shape: Sequence[sint], what: str) -> tuple[sint, ...]:
    out = []
    for s in shape:
        if isinstance(s, (int, np.integer)) and not isinstance(s, bool):
            if s < 0:
                raise ValueError(f"{what}: negative dimension {s} in shape {tuple(shape)}")
            out.append(int(s))
        elif isinstance(s, sym.Expr):
            out.append(sym._simplest(s))
        else:
            raise TypeError(f"{what}: dimension {s!r} must be an int or a symbolic dimension")
    return tuple(out)


class Graph:
    """A builder of primitive-op graphs. Create inputs with ``input``, compute with Tensor methods,
    then ``compile`` the outputs."""

    def __init__(self) -> None:
        self._nodes: dict[tuple, Node] = {}
        self.order: list[Node] = []
        self.inputs: dict[str, Node] = {}
        # Facts about a node's primitive subgraph that lets a backend offer a lowered kernel for it
        # (node id -> a description; e.g. "this node dequantizes these raw blocks"). The primitive
        # graph stays the source of truth: backends that ignore this run the primitives.
        self.lowerings: dict[int, Any] = {}
        # node id -> BytesValue: the node decodes a value stored in bytes (a float16 from two bytes), which a
        # backend may read with one load and conversion instead of the primitive arithmetic
        self.byte_values: dict[int, BytesValue] = {}
        self._templates: dict[tuple, _Template] = {}  # see ``memoised``

    # node creation ------------------------------------------------------------
    def node(self, op: Op, srcs: Sequence[tuple[Node, ShapeTracker]], arg: Any, dtype: dt.DType,
             shape: Sequence[sint]) -> Node:
        srcs = tuple(srcs)
        for s, _ in srcs:
            if s.graph is not self:
                raise ValueError(f"{op.value}: operands come from different graphs")
        # floats are keyed by their bits so that 0.0 and -0.0 stay distinct
        arg_key = ("f", arg.hex()) if isinstance(arg, float) else arg
        # the shape is part of the key: source nodes (Iota) differ by nothing else
        key = (op, arg_key, dtype.name, tuple((s.id, st) for s, st in srcs), tuple(shape))
        n = self._nodes.get(key)
        if n is None:
            n = Node(self, op, srcs, arg, dtype, tuple(shape), len(self.order))
            self._nodes[key] = n
            self.order.append(n)
        return n

    def input(self, name: str, shape: Sequence[sint], dtype=dt.float32) -> "Tensor":
        """A named input of static or symbolic ``shape``."""
        from .tensor import Tensor
        if name in self.inputs:
            raise ValueError(f"input {name!r} is already defined in this graph")
        if not name.isidentifier():
            raise ValueError(f"input name {name!r} must be a valid identifier")
        shape = check_shape(shape, f"input {name!r}")
        n = self.node(Op.INPUT, (), name, dt.as_dtype(dtype), shape)
        self.inputs[name] = n
        return Tensor(n, ShapeTracker.contiguous(shape))

    def constant(self, value, dtype=None) -> "Tensor":
        """A scalar constant (shape ``()``) or an embedded numpy array."""
        from .tensor import Tensor
        if isinstance(value, np.ndarray):
            d = dt.as_dtype(dtype) if dtype is not None else dt.from_numpy(value.dtype)
            arr = value if d is dt.bfloat16 else np.ascontiguousarray(value, dtype=d.np)
            n = self.node(Op.CONST, (), ArrayConst(arr), d, arr.shape)
            return Tensor(n, ShapeTracker.contiguous(arr.shape))
        d = dt.as_dtype(dtype) if dtype is not None else (
            dt.bool_ if isinstance(value, bool) else dt.int32 if isinstance(value, int) else dt.float32)
        if d.is_float:
            value = float(value)
        elif d.kind == "b":
            value = bool(value)
        else:
            value = int(value)
        n = self.node(Op.CONST, (), value, d, ())
        return Tensor(n, ShapeTracker.contiguous(()))

    def iota(self, n: sint, dtype=dt.int32) -> "Tensor":
        """The integers ``0 .. n-1`` (``n`` may be symbolic)."""
        from .tensor import Tensor
        (n,) = check_shape((n,), "iota")
        node = self.node(Op.IOTA, (), None, dt.as_dtype(dtype), (n,))
        return Tensor(node, ShapeTracker.contiguous((n,)))

    def memoised(self, key: Hashable, sources: Sequence["Tensor"], build: Callable[..., Any]) -> Any:
        """``build(*sources)`` (a Tensor or a tuple of Tensors), built once per ``key`` and then
        replayed: the nodes between the sources and the results are recreated over the new sources
        without running ``build`` again (a weight decode or a decoder layer repeated through a model
        costs one ``node`` call per node instead of the Tensor-level work). The result is the graph
        ``build`` would make, provided ``build`` depends on its sources only through their views,
        dtypes, shapes and ops (part of the key here) and on nothing else than ``key``."""
        from .tensor import Tensor
        ids = [s.node.id for s in sources]
        full_key = (key, tuple(ids.index(i) for i in ids)) + tuple(
            (s.st, s.node.op, s.node.dtype.name, s.node.shape,
             None if isinstance(s.node.arg, ArrayConst) else s.node.arg) for s in sources)
        t = self._templates.get(full_key)
        if t is None:
            result = build(*sources)
            outs = (result,) if isinstance(result, Tensor) else tuple(result)
            if not all(isinstance(o, Tensor) and o.node.graph is self for o in outs):
                raise TypeError("memoised: build must return Tensors of this graph")
            cone = _cone([o.node for o in outs], set(ids))
            facts = {n.id: self.byte_values[n.id] for n in cone if n.id in self.byte_values}
            self._templates[full_key] = _Template(tuple(ids), cone, tuple((o.node, o.st) for o in outs),
                                                  isinstance(result, Tensor), facts)
            return result
        mapping = {old: s.node for old, s in zip(t.sources, sources)}  # the key holds which sources coincide
        for n in t.nodes:
            srcs = [(mapping.get(s.id, s), st) for s, st in n.srcs]
            mapping[n.id] = self.node(n.op, srcs, n.arg, n.dtype, n.shape)
        for old, fact in t.byte_values.items():  # facts about replayed nodes hold for their copies
            self.byte_values[mapping[old].id] = BytesValue(fact.stored, tuple(
                (mapping.get(n.id, n), st) for n, st in fact.parts))
        outs = tuple(Tensor(mapping.get(n.id, n), st) for n, st in t.outs)
        return outs[0] if t.single else outs

    # compilation --------------------------------------------------------------
    def compile(self, outputs: Sequence["Tensor"], backend: str = "reference", donate: Sequence[str] = (),
                **options):
        """Compile ``outputs`` into a callable ``prog(dims=None, **inputs) -> tuple[np.ndarray, ...]``.

        ``donate`` names inputs the caller gives up: a backend may update them in place (a KV cache
        written by Scatter), so an output may then be the very array passed in. Backend options
        (e.g. ``templates=False`` or ``profile=True`` for ``"c"``) go to the backend."""
        from .backend import get_backend
        from .runtime import CompiledGraph
        from .tensor import Tensor
        if isinstance(outputs, Tensor):
            outputs = [outputs]
        for o in outputs:
            if not isinstance(o, Tensor) or o.node.graph is not self:
                raise ValueError("compile: every output must be a Tensor of this graph")
        program = Program.build(self, list(outputs))
        unknown = [d for d in donate if d not in self.inputs]
        if unknown:
            raise ValueError(f"compile: donate names {unknown}, which are not inputs of this graph")
        program.donated = set(donate)
        return CompiledGraph(program, get_backend(backend)(program, **options))


@dataclass(frozen=True)
class _Template:
    """A recorded subgraph (see ``Graph.memoised``): ``nodes`` depend on the ``sources`` (node ids), in
    creation order; ``outs`` (node, view) are the results."""

    sources: tuple[int, ...]
    nodes: tuple[Node, ...]
    outs: tuple[tuple[Node, ShapeTracker], ...]
    single: bool  # build returned one Tensor, not a tuple
    byte_values: dict = field(default_factory=dict)  # facts (Graph.byte_values) about nodes of ``nodes``


@dataclass(frozen=True)
class BytesValue:
    """A node's value is the ``stored`` (float16 or int8) value held little-endian in its ``parts``: (node,
    view) pairs of the byte values, lowest byte first, each a float32 cast of a uint8 tensor."""
    stored: dt.DType
    parts: tuple


def _cone(outs: list[Node], sources: set[int]) -> tuple[Node, ...]:
    """The nodes ``outs`` depend on that depend on a node in ``sources`` (which are excluded), in
    creation order (ids are topological: a node is created after its sources)."""
    reach: dict[int, Node] = {}
    stack = list(outs)
    while stack:
        n = stack.pop()
        if n.id in reach or n.id in sources:
            continue
        reach[n.id] = n
        stack.extend(s for s, _ in n.srcs)
    dependent = set(sources)
    cone = []
    for nid in sorted(reach):
        n = reach[nid]
        if any(s.id in dependent for s, _ in n.srcs):
            dependent.add(nid)
            cone.append(n)
    return tuple(cone)


@dataclass
class Program:
    """What a backend compiles: the outputs (as views of nodes) and everything they depend on."""

    graph: Graph
    outputs: list[tuple[Node, ShapeTracker]]
    nodes: list[Node]  # topological order, only what the outputs need
    inputs: list[Node]
    dims: list[sym.Var] = field(default_factory=list)
    donated: set[str] = field(default_factory=set)  # inputs a backend may overwrite (see Graph.compile)

    @staticmethod
    def build(graph: Graph, outputs: list) -> "Program":
        outs = [(o.node, o.st) for o in outputs]
        seen: set[int] = set()
        stack = [n for n, _ in outs]
        while stack:
            n = stack.pop()
            if n.id in seen:
                continue
            seen.add(n.id)
            stack.extend(s for s, _ in n.srcs)
        nodes = [n for n in graph.order if n.id in seen]
        inputs = [n for n in nodes if n.op is Op.INPUT]
        dims: set[sym.Var] = set()
        seen_views: set[ShapeTracker] = set()  # a model repeats the same views in every layer
        for n in nodes:
            dims |= sym.free_vars(*n.shape)
            for _, st in n.srcs:
                if st not in seen_views:
                    seen_views.add(st)
                    dims |= _tracker_vars(st)
        for _, st in outs:
            dims |= _tracker_vars(st)
        return Program(graph, outs, nodes, inputs, sorted(dims, key=lambda v: v.name))


def _tracker_vars(st: ShapeTracker) -> set[sym.Var]:
    out: set[sym.Var] = set()
    for v in st.views:
        out |= sym.free_vars(*v.shape, *v.strides, v.offset)
        if v.mask is not None:
            for b, e in v.mask:
                out |= sym.free_vars(b, e)
    return out


def describe(program: Program) -> str:
    """A readable listing of a program's nodes."""
    return "\n".join(repr(n) for n in program.nodes)


__all__ = ["Graph", "Node", "Program", "ArrayConst", "OPS"]


def _constant_dim(self: Graph, n: sint, dtype=dt.float32):
    """A scalar whose value is the (possibly symbolic) dimension ``n``, as ``dtype``."""
    if sym.is_const(n):
        return self.constant(int(n), dtype)
    return self.iota(sym.add(n, 1), dt.int32)[n].cast(dtype)


Graph.constant_dim = _constant_dim
