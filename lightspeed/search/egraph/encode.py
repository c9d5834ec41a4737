"""Encode a program's float32 arithmetic as egglog terms (one ``let`` per node).

Float32 elementwise ops and reductions become constructors of the sort ``F`` (see rules/schema.egg).
Everything else — inputs, array constants, integer and bool ops, casts, gathers, scatters — is an
opaque ``(Leaf id)``: the e-graph does not look inside it, but its float32 sources are encoded too, so
extraction can improve them. Views on edges are opaque numbers: ``(View t v)`` for a mask-free view,
``(MView t v)`` for one with padding, and no wrapper at all for an identity view. Each encoded node's
e-class is the value of the function ``(Root id)`` (``(set (Root id) term)``), so extraction can find it
again after saturation, and its consumers refer to it by that lookup. (Not by ``let`` and ``union``:
egglog makes each ``let`` a global, and commands then slow down with their number; a ``set`` is about
twice as fast to load as a ``union``.) The text holds one command per line.

Lowered kernels matched by kernel formation (``search/lowering.py``) are stated as facts
``(Matched kind k e reads)``: alternative number ``k`` computes e-class ``e`` from the values ``reads``
(an ``FList``); ``rules/lowered.egg`` turns each fact into a ``Lowered`` e-node of that e-class.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ... import dtypes as dt
from ...dtypes import float32_bits
from ...graph import ArrayConst, Node, Program
from ...ops import Op
from ...shape import ShapeTracker
from ...rewrite.views import is_identity, is_total

OP_NAMES = {Op.ADD: "Add", Op.MUL: "Mul", Op.MOD: "Mod", Op.RECIP: "Recip", Op.EXP2: "Exp2", Op.LOG2: "Log2",
            Op.SQRT: "Sqrt", Op.SIN: "Sin", Op.SUM_REDUCE: "Sum", Op.MAX_REDUCE: "Max"}
NAME_OPS = {v: k for k, v in OP_NAMES.items()}


@dataclass
class Encoding:
    """The egglog text of a program and the tables its numbers refer to."""

    text: str
    nodes: dict[int, Node]  # every node of the program, by id
    views: list[ShapeTracker] = field(default_factory=list)  # View/MView numbers
    bool_edges: list[tuple[Node, ShapeTracker]] = field(default_factory=list)  # Sel numbers
    encoded: set[int] = field(default_factory=set)  # nodes with a (Root id)
    alternatives: list = field(default_factory=list)  # lowering.Alternative, by number k of (Lowered kind k ..)
    # a window's encoding (encode_window) numbers nodes by first use: number -> node id; empty: ids themselves
    numbers: list[int] = field(default_factory=list)


def _is_scalar_f32_const(n: Node) -> bool:
    return n.op is Op.CONST and not isinstance(n.arg, ArrayConst) and n.dtype is dt.float32 and not n.shape


def _encodable(n: Node) -> bool:
    if n.dtype is not dt.float32 or n.op not in OP_NAMES:
        return False
    kinds = [s.dtype for s, _ in n.srcs]
    if n.op is Op.MUL and kinds.count(dt.bool_) == 1 and dt.float32 in kinds:
        return True  # a select
    return all(k is dt.float32 for k in kinds)


class _Encoder:
    def __init__(self, program: Program, local: bool = False):
        self.program = program
        self.enc = Encoding("", {n.id: n for n in program.nodes})
        self.view_ids: dict[ShapeTracker, int] = {}
        self.lines: list[str] = []
        self.local = local
        self.number_of: dict[int, int] = {}

    def num(self, n: Node) -> int:
        """The number a node goes by in the text: its id, or (local) its number by first use."""
        if not self.local:
            return n.id
        k = self.number_of.get(n.id)
        if k is None:
            k = self.number_of[n.id] = len(self.enc.numbers)
            self.enc.numbers.append(n.id)
        return k

    def view(self, st: ShapeTracker) -> int:
        v = self.view_ids.get(st)
        if v is None:
            v = self.view_ids[st] = len(self.enc.views)
            self.enc.views.append(st)
        return v

    def ref(self, n: Node) -> str:
        if n.id in self.enc.encoded:
            return f"(Root {self.num(n)})"
        if _is_scalar_f32_const(n):
            return f"(Num {float32_bits(n.arg)})"
        return f"(Leaf {self.num(n)})"

    def edge(self, s: Node, st: ShapeTracker) -> str:
        base = self.ref(s)
        if is_identity(st, s.shape):
            return base
        return f"({'View' if is_total(st) else 'MView'} {base} {self.view(st)})"

    def node(self, n: Node) -> None:
        if not _encodable(n):
            return
        name = OP_NAMES[n.op]
        if n.op is Op.MUL and any(s.dtype is dt.bool_ for s, _ in n.srcs):
            (b, bst), = [(s, st) for s, st in n.srcs if s.dtype is dt.bool_]
            (f, fst), = [(s, st) for s, st in n.srcs if s.dtype is not dt.bool_]
            self.enc.bool_edges.append((b, bst))
            term = f"(Sel {len(self.enc.bool_edges) - 1} {self.edge(f, fst)})"
        elif n.op in (Op.SUM_REDUCE, Op.MAX_REDUCE):
            (s, st), = n.srcs
            term = f"({name} {self.edge(s, st)} {n.arg})"
        else:
            term = f"({name} {' '.join(self.edge(s, st) for s, st in n.srcs)})"
        self.enc.encoded.add(n.id)
        self.lines.append(f"(set (Root {self.num(n)}) {term})")


    def alternative(self, alt) -> None:
        if alt.root.id not in self.enc.encoded:
            return  # (not a float32 value of the e-graph: kernel formation keeps its default)
        k = len(self.enc.alternatives)
        self.enc.alternatives.append(alt)
        reads = "(FNil)"
        for r in reversed(alt.reads):
            reads = f"(FCons {self.ref(r)} {reads})"
        self.lines.append(f'(Matched "{alt.kind}" {k} {self.ref(alt.root)} {reads})')


def encode(program: Program, alternatives=()) -> Encoding:
    """The egglog encoding of ``program`` (see the module docstring), with facts for ``alternatives``
    (``search.lowering.Alternative``) whose node is encoded."""
    e = _Encoder(program)
    for n in program.nodes:
        e.node(n)
    for alt in alternatives:
        e.alternative(alt)
    e.enc.text = "\n".join(e.lines) + "\n"
    return e.enc


def encode_window(program: Program, nodes, alternatives=()) -> Encoding:
    """The encoding of ``nodes`` of ``program`` alone (every other node is a ``Leaf``), numbering nodes by
    first use (``Encoding.numbers``) and views, selects and alternatives from 0, so that two windows of
    the same structure over different nodes (two layers of a model) have the same text."""
    e = _Encoder(program, local=True)
    for n in nodes:
        e.node(n)
    for alt in alternatives:
        e.alternative(alt)
    e.enc.text = "\n".join(e.lines) + "\n"
    return e.enc
