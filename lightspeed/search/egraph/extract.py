"""Extraction: pick one e-node per e-class by the cost model, then rebuild a program from the choice.

Costs are computed bottom-up to a fixpoint (each e-class costs its cheapest e-node plus its children,
as in egg's extractor); shapes of e-classes are derived from the original nodes and views. The DAG
cost of a choice counts every reachable e-class once, so shared values are not double counted when
a choice is compared with the original program.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ... import dtypes as dt
from ... import symbolic as sym
from ...graph import Graph, Node, Program
from ...ops import Op
from ...shape import ShapeTracker
from ...tensor import Tensor
from ...rewrite.views import compose
from ..cost import OP_FLOPS, CostModel, numel
from .encode import NAME_OPS, Encoding, bits_float32

INF = float("inf")
EPS = 1e-12  # every e-node costs something, so a cheapest choice never forms a cycle


class ExtractionError(RuntimeError):
    """The chosen e-nodes do not form a program (a cycle or an e-class without a shape)."""


@dataclass(frozen=True)
class ENode:
    op: str
    args: tuple  # ("c", eclass) for a child e-class, ("i", int) for an integer literal


@dataclass
class EGraphView:
    """The serialized e-graph: e-classes of sort F and their e-nodes; roots of original nodes."""

    classes: dict[str, list[ENode]] = field(default_factory=dict)
    roots: dict[int, str] = field(default_factory=dict)  # original node id -> e-class


def read_egraph(data: dict) -> EGraphView:
    nodes = data["nodes"]
    kinds = {c: d.get("type") for c, d in data["class_data"].items()}
    view = EGraphView()
    for nid, nd in nodes.items():
        cls = nd["eclass"]
        if kinds.get(cls) != "F":
            continue
        args = []
        for ch in nd["children"]:
            cc = nodes[ch]["eclass"]
            args.append(("c", cc) if kinds.get(cc) == "F" else ("i", int(nodes[ch]["op"])))
        e = ENode(nd["op"], tuple(args))
        if e.op == "Root":
            view.roots[e.args[0][1]] = cls
            continue
        view.classes.setdefault(cls, []).append(e)
    return view


class Extractor:
    """Shapes, costs and the cheapest choice per e-class of ``egraph`` for the program in ``enc``."""

    def __init__(self, egraph: EGraphView, enc: Encoding, model: CostModel):
        self.eg, self.enc, self.model = egraph, enc, model
        self.shape: dict[str, tuple] = {}
        self._shapes()
        self.cost: dict[str, float] = {}
        self.best: dict[str, ENode] = {}
        self._costs()

    # shapes -------------------------------------------------------------------
    def _enode_shape(self, e: ENode):
        a = e.args
        if e.op == "Leaf":
            return self.enc.nodes[a[0][1]].shape
        if e.op == "Num":
            return ()
        if e.op in ("View", "MView"):
            return self.enc.views[a[1][1]].shape
        if e.op == "Sel":
            return self.shape.get(a[1][1])
        if e.op in ("Sum", "Max"):
            s = self.shape.get(a[0][1])
            return None if s is None else s[:a[1][1]] + s[a[1][1] + 1:]
        for kind, c in a:  # elementwise: the shape of any operand
            if kind == "c" and c in self.shape:
                return self.shape[c]
        return None

    def _shapes(self) -> None:
        changed = True
        while changed:
            changed = False
            for cls, enodes in self.eg.classes.items():
                if cls in self.shape:
                    continue
                for e in enodes:
                    s = self._enode_shape(e)
                    if s is not None:
                        self.shape[cls] = s
                        changed = True
                        break

    # costs --------------------------------------------------------------------
    def own_cost(self, e: ENode, cls: str) -> float:
        """Seconds the e-node itself costs (children excluded)."""
        if e.op == "Leaf":
            n = self.enc.nodes[e.args[0][1]]
            return self.model.seconds(0, numel(n.shape) * n.dtype.itemsize) + EPS
        if e.op in ("Num", "View", "MView"):
            return EPS
        out = numel(self.shape.get(cls, ()))
        if e.op in ("Sum", "Max"):
            src = numel(self.shape.get(e.args[0][1], ()))
            return self.model.seconds(src, 2 * 4 * out) + EPS
        op = NAME_OPS.get(e.op, Op.MUL if e.op == "Sel" else None)
        return self.model.seconds(out * OP_FLOPS.get(op, 1), 0) + EPS

    def _costs(self) -> None:
        """Cheapest e-node per e-class: Knuth's generalisation of Dijkstra's algorithm (an e-node's cost
        is known once all its child e-classes are final; e-classes are finalised cheapest first)."""
        import heapq
        cost: dict[str, float] = {c: INF for c in self.eg.classes}
        waiting: list[int] = []  # per e-node: child e-classes not yet final
        enodes: list[tuple[str, ENode, float]] = []
        parents: dict[str, list[int]] = {}
        heap: list[tuple[float, str]] = []
        for cls, ens in self.eg.classes.items():
            if cls not in self.shape:
                continue
            for e in ens:
                k = len(enodes)
                children = {ch for kind, ch in e.args if kind == "c"}
                enodes.append((cls, e, self.own_cost(e, cls)))
                waiting.append(len(children))
                for ch in children:
                    parents.setdefault(ch, []).append(k)
                if not children:
                    heapq.heappush(heap, (enodes[k][2], cls, k))
        final: set[str] = set()
        while heap:
            c, cls, k = heapq.heappop(heap)
            if cls in final:
                continue
            final.add(cls)
            cost[cls] = c
            self.best[cls] = enodes[k][1]
            for p in parents.get(cls, ()):
                waiting[p] -= 1
                if waiting[p] == 0:
                    pcls, pe, own = enodes[p]
                    if pcls not in final:
                        total = own + sum(cost[ch] for ch in {ch for kind, ch in pe.args if kind == "c"})
                        heapq.heappush(heap, (total, pcls, p))
        self.cost = cost

    def dag_cost(self, classes: list[str]) -> float:
        """Cost of the chosen e-nodes reachable from ``classes``, each e-class counted once."""
        seen: set[str] = set()
        total = 0.0
        stack = list(classes)
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            e = self.best.get(c)
            if e is None:
                return INF
            total += self.own_cost(e, c)
            stack.extend(ch for k, ch in e.args if k == "c")
        return total


class Rebuilder:
    """Builds a new program from an extractor's choice: encoded nodes from their e-classes, every other
    node copied with its sources rebuilt."""

    def __init__(self, program: Program, ex: Extractor):
        self.program, self.ex, self.enc = program, ex, ex.enc
        self.g = Graph()
        self.by_class: dict[str, Tensor] = {}
        self.by_node: dict[int, Tensor] = {}
        self.active: set[str] = set()
        for n in program.inputs:
            self.by_node[n.id] = self.g.input(n.arg, n.shape, n.dtype)

    def node_value(self, n: Node) -> Tensor:
        if n.id in self.by_node:
            return self.by_node[n.id]
        cls = self.ex.eg.roots.get(n.id) if n.id in self.enc.encoded else None
        v = self.class_value(cls) if cls is not None else self.copy(n)
        self.by_node[n.id] = v
        return v

    def copy(self, n: Node) -> Tensor:
        srcs = []
        for s, st in n.srcs:
            v = self.node_value(s)
            srcs.append((v.node, compose(v.st, st)))
        node = self.g.node(n.op, srcs, n.arg, n.dtype, n.shape)
        return Tensor(node, ShapeTracker.contiguous(n.shape))

    def class_value(self, cls: str) -> Tensor:
        if cls in self.by_class:
            return self.by_class[cls]
        if cls in self.active:
            raise ExtractionError(f"e-class {cls} depends on itself in the chosen e-nodes")
        e = self.ex.best.get(cls)
        if e is None:
            raise ExtractionError(f"e-class {cls} has no extractable e-node")
        self.active.add(cls)
        v = self._enode_value(e, cls)
        self.active.discard(cls)
        self.by_class[cls] = v
        return v

    def _op(self, op: Op, srcs: list[Tensor], arg, shape) -> Tensor:
        node = self.g.node(op, [(t.node, t.st) for t in srcs], arg, dt.float32, shape)
        return Tensor(node, ShapeTracker.contiguous(shape))

    def _enode_value(self, e: ENode, cls: str) -> Tensor:
        a = e.args
        if e.op == "Leaf":
            return self.node_value(self.enc.nodes[a[0][1]])
        if e.op == "Num":
            return self.g.constant(bits_float32(a[0][1]), dt.float32)
        if e.op in ("View", "MView"):
            t = self.class_value(a[0][1])
            return Tensor(t.node, compose(t.st, self.enc.views[a[1][1]]))
        if e.op == "Sel":
            b, bst = self.enc.bool_edges[a[0][1]]
            bv = self.node_value(b)
            f = self.class_value(a[1][1])
            node = self.g.node(Op.MUL, [(bv.node, compose(bv.st, bst)), (f.node, f.st)], None, dt.float32, f.shape)
            return Tensor(node, ShapeTracker.contiguous(f.shape))
        if e.op in ("Sum", "Max"):
            t = self.class_value(a[0][1])
            k = a[1][1]
            return self._op(NAME_OPS[e.op], [t], k, t.shape[:k] + t.shape[k + 1:])
        srcs = [self.class_value(c) for _, c in a]
        shape = srcs[0].shape
        for s in srcs[1:]:
            if len(s.shape) != len(shape) or not all(sym.same(x, y) for x, y in zip(s.shape, shape)):
                raise ExtractionError(f"{e.op}: operand shapes {shape} and {s.shape} differ")
        return self._op(NAME_OPS[e.op], srcs, None, shape)

    def program_out(self) -> Program:
        outs = []
        for node, st in self.program.outputs:
            v = self.node_value(node)
            outs.append(Tensor(v.node, compose(v.st, st)))
        new = Program.build(self.g, outs)
        new.inputs = [self.g.inputs[n.arg] for n in self.program.inputs]
        new.donated = set(self.program.donated)
        names = {v.name for v in new.dims}
        new.dims = sorted(list(new.dims) + [v for v in self.program.dims if v.name not in names],
                          key=lambda v: v.name)
        return new

