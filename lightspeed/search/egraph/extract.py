"""Extraction: pick one e-node per e-class by the cost model, then rebuild a program from the choice.

Costs are computed bottom-up to a fixpoint (each e-class costs its cheapest e-node plus its children,
as in egg's extractor); shapes of e-classes are derived from the original nodes and views. The DAG
cost of a choice counts every reachable e-class once, so shared values are not double counted when
a choice is compared with the original program.

An e-class holding a lowered kernel (``Lowered``) is then decided on its own: the lowered kernel's cost
against the cost of the primitive e-nodes it would replace (the chosen forms below the e-class down to
the values the kernel reads, each e-class once, scaled by the model's primitive factor of that kind).
Tree costs would count a value the softmax reads twice (the scores feed both the max and the
exponential) twice, and values both forms read are paid either way.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from ... import dtypes as dt
from ...dtypes import bits_float32
from ... import symbolic as sym
from ...graph import Graph, Node, Program
from ...ops import Op
from ...shape import ShapeTracker
from ...tensor import Tensor
from ...rewrite.views import compose
from ..cost import OP_FLOPS, CostModel, numel
from ..decision import Decision
from .encode import NAME_OPS, Encoding

INF = float("inf")
EPS = 1e-12  # every e-node costs something, so a cheapest choice never forms a cycle


class ExtractionError(RuntimeError):
    """The chosen e-nodes do not form a program (a cycle or an e-class without a shape)."""


@dataclass(frozen=True)
class ENode:
    op: str
    args: tuple  # ("c", eclass) for a child e-class, ("i", int) for an integer literal, ("s", str) a string


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
        if nd["op"] == "Lowered":  # (Lowered kind k reads): the reads list becomes the child e-classes
            kind, num, lst = nd["children"]
            args = [("s", json.loads(nodes[kind]["op"])), ("i", int(nodes[num]["op"]))]
            while nodes[lst]["op"] == "FCons":
                head, lst = nodes[lst]["children"]
                args.append(("c", nodes[head]["eclass"]))
            view.classes.setdefault(cls, []).append(ENode("Lowered", tuple(args)))
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
        self.decisions = self._decide_lowered()

    # shapes -------------------------------------------------------------------
    def _enode_shape(self, e: ENode):
        a = e.args
        if e.op == "Leaf":
            return self.enc.nodes[a[0][1]].shape
        if e.op == "Num":
            return ()
        if e.op == "Lowered":
            return self.enc.alternatives[a[1][1]].root.shape
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
        if e.op == "Lowered":  # its work at its own rate; its output written and read once
            alt = self.enc.alternatives[e.args[1][1]]
            return self.model.lowered_seconds(alt.kind, alt.flops, 2 * alt.out_bytes) + EPS
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

    def _tree_cost(self, e: ENode, cls: str) -> float:
        return self.own_cost(e, cls) + sum(self.cost.get(ch, INF) for ch in {ch for k, ch in e.args if k == "c"})

    def _replaced_cost(self, e: ENode, cls: str, reads: set[str]) -> float:
        """Seconds of ``e`` and the chosen e-nodes below it down to the e-classes ``reads``, each once."""
        return self.own_cost(e, cls) + self.dag_cost([ch for k, ch in e.args if k == "c"], stop=set(reads) | {cls})

    def _decide_lowered(self) -> list:
        """Per e-class with a lowered kernel: the lowered kernel or its cheapest primitive e-node (see the
        module docstring); ``best`` is set accordingly. Returns ``Decision`` rows."""
        rows = []
        for cls, enodes in self.eg.classes.items():
            lowered = [e for e in enodes if e.op == "Lowered"]
            if not lowered or cls not in self.shape:
                continue
            prims = [e for e in enodes if e.op != "Lowered"]
            prim = min(prims, key=lambda e: self._tree_cost(e, cls), default=None)
            low = min(lowered, key=lambda e: self._tree_cost(e, cls))
            alt = self.enc.alternatives[low.args[1][1]]
            reads = {ch for k, ch in low.args if k == "c"}
            low_s = self.own_cost(low, cls)
            prim_s = INF if prim is None else \
                self._replaced_cost(prim, cls, reads) * self.model.primitive_factor(alt.kind)
            chosen = low_s < prim_s
            self.best[cls] = low if chosen else prim
            rows.append(Decision(alt.kind, alt.root.id, low_s, prim_s, chosen))
            for other in lowered:  # several matches in one e-class (equal values): one decision for all
                if other is not low:
                    a = self.enc.alternatives[other.args[1][1]]
                    rows.append(Decision(a.kind, a.root.id, self.own_cost(other, cls), prim_s, False))
        rows.sort(key=lambda d: d.node)
        return rows

    def lowered_decisions(self) -> list:
        """``Decision`` rows: each lowered alternative, its cost, its primitive form's, and the choice."""
        return list(self.decisions)

    def dag_cost(self, classes: list[str], stop: set[str] | None = None) -> float:
        """Cost of the chosen e-nodes reachable from ``classes`` (not through the e-classes ``stop``), each
        e-class counted once."""
        seen: set[str] = set(stop or ())
        total = 0.0
        stack = [c for c in classes if c not in seen]
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            e = self.best.get(c)
            if e is None:
                return INF
            total += self.own_cost(e, c)
            stack.extend(ch for k, ch in e.args if k == "c" and ch not in seen)
        return total


class Rebuilder:
    """Builds a new program from an extractor's choice: encoded nodes from their e-classes, every other
    node copied with its sources rebuilt. A chosen lowered kernel is rebuilt as the primitive nodes of its
    region, copied as they were (so kernel formation's matcher finds it again), over the rebuilt values
    it reads; ``lowered_roots`` collects the new node ids to lower (``form_kernels(lower_only=...)``)."""

    def __init__(self, program: Program, ex: Extractor):
        self.program, self.ex, self.enc = program, ex, ex.enc
        self.g = Graph()
        self.by_class: dict[str, Tensor] = {}
        self.by_node: dict[int, Tensor] = {}
        self.region_copies: dict[int, Tensor] = {}
        self.lowered_roots: set[int] = set()
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

    def region_copy(self, n: Node, region: frozenset[int]) -> Tensor:
        """Node ``n`` of a lowered kernel's region, copied with its sources (inside the region: copied too;
        outside: rebuilt values)."""
        t = self.region_copies.get(n.id)
        if t is not None:
            return t
        srcs = []
        for s, st in n.srcs:
            v = self.region_copy(s, region) if s.id in region else self.node_value(s)
            srcs.append((v.node, compose(v.st, st)))
        t = Tensor(self.g.node(n.op, srcs, n.arg, n.dtype, n.shape), ShapeTracker.contiguous(n.shape))
        self.region_copies[n.id] = t
        return t

    def _enode_value(self, e: ENode, cls: str) -> Tensor:
        a = e.args
        if e.op == "Lowered":
            alt = self.enc.alternatives[a[1][1]]
            t = self.region_copy(alt.root, alt.region)
            self.lowered_roots.add(t.node.id)
            return t
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
        self._carry_lowerings()
        new = Program.build(self.g, outs)
        new.inputs = [self.g.inputs[n.arg] for n in self.program.inputs]
        new.donated = set(self.program.donated)
        names = {v.name for v in new.dims}
        new.dims = sorted(list(new.dims) + [v for v in self.program.dims if v.name not in names],
                          key=lambda v: v.name)
        return new

    def _carry_lowerings(self) -> None:
        """Facts for lowered kernels (a decoded weight's raw blocks, ``Graph.lowerings``) follow their nodes
        to the new graph, where they were rebuilt as dense values."""
        for nid, info in self.program.graph.lowerings.items():
            raw_node = getattr(info, "raw_node", None)
            raw = None if raw_node is None else self.by_node.get(raw_node.id, self.region_copies.get(raw_node.id))
            if raw is None:
                continue
            for table in (self.by_node, self.region_copies):
                t = table.get(nid)
                if t is not None and t.st.is_contiguous and len(t.st.shape) == len(t.node.shape):
                    self.g.lowerings[t.node.id] = dataclasses.replace(info, raw_node=raw.node,
                                                                       raw_view=compose(raw.st, info.raw_view))
