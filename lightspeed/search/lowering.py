"""Lowered kernels as alternatives of graph-level search.

Kernel formation's matchers (``kernel/quantized.py`` for ``x @ dequant(raw).T``, ``kernel/attention.py``
for softmax(scores) @ V) prove in Python, with index arithmetic through every view, that a node computes
what a lowered kernel computes. Here each match becomes an ``Alternative``: the node, the region of
primitive nodes the kernel replaces, the values it reads from outside that region, and its work. The
e-graph gets the alternative as an e-node of the node's e-class (``rules/lowered.egg``), extraction picks
per e-class by the cost model, and kernel formation lowers only the chosen nodes (``lower_only``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..graph import ArrayConst, Node, Program
from ..kernel.online_softmax import Derivation
from ..ops import REDUCE, Op
from .cost import OP_FLOPS, CostModel, numel, program_cost
from .decision import Decision


@dataclass(eq=False)
class Alternative:
    """A lowered kernel matched at ``root``: it computes the nodes of ``region`` (``root`` included) from
    ``reads``, doing ``flops`` of work as ``cost.program_cost`` counts the region's primitive nodes."""

    kind: str  # "qmatmul" | "attention"
    root: Node
    region: frozenset[int]
    reads: tuple[Node, ...]
    flops: float
    out_bytes: int
    # an attention the e-graph's online-softmax rules derived (kernel/online_softmax.py): how; None when matched
    derivation: Derivation | None = None


@dataclass
class LoweringChoice:
    """Which lowered kernels to form (``lower_only``; None: all matched) and what the e-graph held."""

    decisions: list[Decision] = field(default_factory=list)
    lower_only: frozenset[int] | None = None
    enodes: int = 0
    seconds: float = 0.0
    note: str = ""
    derived: dict[int, Derivation] = field(default_factory=dict)  # node id -> how the attention there was derived

    @property
    def all_chosen(self) -> bool:
        return all(d.chosen for d in self.decisions)


def _is_scalar_const(n: Node) -> bool:
    return n.op is Op.CONST and not isinstance(n.arg, ArrayConst)


def region_of(kind: str, root: Node, inside) -> Alternative:
    """The alternative whose region grows from ``root`` through sources ``inside(node)`` accepts (scalar
    constants always: they are not read from memory); every other source is a read."""
    region: set[int] = set()
    reads: list[Node] = []
    read_ids: set[int] = set()
    flops = 0.0
    stack = [root]
    while stack:
        n = stack.pop()
        if n.id in region:
            continue
        region.add(n.id)
        if n.op in REDUCE:
            flops += numel(n.srcs[0][1].shape)
        elif n.op not in (Op.CONST, Op.INPUT):
            flops += numel(n.shape) * OP_FLOPS.get(n.op, 1)
        for s, _ in n.srcs:
            if _is_scalar_const(s) or (s is not root and inside(s)):
                stack.append(s)
            elif s.id not in read_ids:
                read_ids.add(s.id)
                reads.append(s)
    return Alternative(kind, root, frozenset(region), tuple(reads), flops, numel(root.shape) * root.dtype.itemsize)


def find_alternatives(program: Program) -> list[Alternative]:
    """Every lowered kernel kernel formation would form for ``program`` (with templates on), as
    alternatives; in the program's node order."""
    from ..kernel.fusion import Former
    return alternatives_of(Former(program))  # the matchers run when it is built


def alternatives_of(former) -> list[Alternative]:
    """The lowered kernels a ``kernel.fusion.Former`` matched (those its ``lower_only`` allows), as
    alternatives; in its program's node order. The regions are the ones that former forms: which score
    nodes are private to the attentions depends on which attentions it lowers."""
    program = former.program
    found: list[Alternative] = []
    for q in former.quantized.values():
        stop = {q.x.id, q.raw.id}
        found.append(region_of("qmatmul", q.reduce, lambda s, stop=stop: s.id not in stop and s.op is not Op.INPUT))
    for low in former.lowered.values():  # (LOWERED_MATCHERS: streaming attentions, matched or derived)
        inner = {n.id for n in low.inner_nodes} | set(low.inlined)  # the softmax, the private scores
        alt = region_of("attention", low.node, lambda s, inner=inner: s.id in inner)
        alt.derivation = low.derivation
        found.append(alt)
    order = {n.id: k for k, n in enumerate(program.nodes)}
    found.sort(key=lambda a: order.get(a.root.id, -1))
    return found


def lowered_program_cost(program: Program, model: CostModel, alternatives: list[Alternative]) -> float:
    """``cost.program_cost`` of ``program`` when ``alternatives`` replace their regions."""
    replaced: set[int] = set()
    for a in alternatives:
        replaced |= a.region
    total = program_cost(program, model, skip=replaced)
    return total + sum(model.lowered_seconds(a.kind, a.flops, 2 * a.out_bytes) for a in alternatives)


def choose_lowerings(program: Program, model: CostModel, alternatives: list[Alternative] | None = None,
                     time_limit_s: float = 10.0) -> LoweringChoice:
    """Which lowered kernels of ``program`` to form: an e-graph holding the program and every matched
    lowered kernel as an alternative (no other rules), extracted under ``model``."""
    t0 = time.perf_counter()
    alts = find_alternatives(program) if alternatives is None else alternatives
    if not alts:
        return LoweringChoice(seconds=time.perf_counter() - t0)
    from .egraph import Extractor, encode, read_egraph, saturate, serialized
    enc = encode(program, alts)
    eg, sat = saturate(enc.text, ("lowered",), time_limit_s=time_limit_s)
    ex = Extractor(read_egraph(serialized(eg)), enc, model)
    decisions = ex.lowered_decisions()
    decided = {d.node for d in decisions}
    # an alternative the e-graph could not hold (its node is not encoded) keeps the default: lowered
    keep = frozenset({d.node for d in decisions if d.chosen} | {a.root.id for a in alts if a.root.id not in decided})
    derived = {a.root.id: a.derivation for a in alts if a.derivation is not None}
    return LoweringChoice(decisions, keep, sat.enodes, time.perf_counter() - t0, derived=derived)
