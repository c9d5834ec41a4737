"""The generated counterpart of a lowered kernel: which kernels of the plan without templates do its work.

A lowered kernel (a quantized matmul, a streaming attention) replaces a region of primitive nodes
(``lowering.Alternative.region``). Without templates, ordinary kernels compute those nodes: each kernel is
named ``k<node id>`` after the node it stores (kernel/fusion.py) and computes that node and every node
inlined into it (a node without a buffer). A streaming attention's region (scores, the softmax's max, sum
and exponentials, the weighted sum) is thus several kernels.

``counterpart`` takes, in each plan, the kernels that store a node of the region. When a kernel of one side
inlines a node that the other side stores (the activation a quantized-matmul template reads from a buffer,
which a generated gemm kernel computes as it packs its operand), the storing kernel joins its side, and so on
until both sides compute the same nodes: each side's time is then the time of the same work. A region whose
node one plan computes only inside a kernel that stores a node outside it (the attention's result inlined
into its reader) is not raced: that kernel's time cannot be split at the region's border.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..ops import Op

_NAME = re.compile(r"k(\d+)")
FREE_OPS = (Op.CONST, Op.INPUT, Op.IOTA)  # read or indexed, never computed: not work of any kernel


def kernel_node(name: str) -> int | None:
    """The id of the node a kernel stores, from its name (``k12``, ``k12_copy``); None for another name."""
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


class PlanNodes:
    """Which nodes each kernel of a plan computes (``computes``), and the kernels that store (``stores``)
    or compute (``computed_by``) each node; from the ``kernel.fusion.Former`` that formed the plan."""

    def __init__(self, former, plan):
        by_id = {n.id: n for n in former.nodes}
        stored = former.buffers  # node id -> buffer: inputs, constants and every materialised node
        self.order = {k.name: i for i, k in enumerate(plan.kernels)}
        self.computes: dict[str, frozenset[int]] = {}
        self.stores: dict[int, list[str]] = {}
        self.computed_by: dict[int, set[str]] = {}
        for k in plan.kernels:
            nid = kernel_node(k.name)
            if nid is None or nid not in by_id:  # (no kernel of the formers has such a name)
                continue
            nodes = _inlined(by_id[nid], stored)
            self.computes[k.name] = nodes
            self.stores.setdefault(nid, []).append(k.name)
            for n in nodes:
                self.computed_by.setdefault(n, set()).add(k.name)

    def storing(self, nodes: set[int]) -> list[str]:
        """The kernels that store one of ``nodes``, in the plan's order."""
        return sorted((k for n in nodes for k in self.stores.get(n, ())), key=self.order.__getitem__)


def _inlined(root, stored) -> frozenset[int]:
    """``root`` and the nodes below it that have no buffer (computed where ``root`` is)."""
    seen = {root.id}
    stack = [root]
    while stack:
        n = stack.pop()
        for s, _ in n.srcs:
            if s.id not in seen and s.id not in stored and s.op not in FREE_OPS:
                seen.add(s.id)
                stack.append(s)
    return frozenset(seen)


@dataclass
class Counterpart:
    """The kernels of the plan with templates (``templated``) and of the plan without (``generated``) that
    compute the same nodes, a region's among them; ``note``: why the region cannot be raced, if it cannot."""
    templated: tuple[str, ...] = ()
    generated: tuple[str, ...] = ()
    note: str = ""


def counterpart(region: frozenset[int], with_t: PlanNodes, without: PlanNodes, own: str,
                templates: set[str]) -> Counterpart:
    """The kernels of each plan that do the work of ``region`` (see the module docstring). ``own``: the
    lowered kernel of the region; ``templates``: every lowered kernel of the plan with templates."""
    nodes = set(region)
    while True:
        t, g = with_t.storing(nodes), without.storing(nodes)
        grown = nodes.union(*(with_t.computes[k] for k in t), *(without.computes[k] for k in g))
        if grown == nodes:
            break
        nodes = grown
    res = Counterpart(tuple(t), tuple(g))
    others = sorted(set(t) & templates - {own})
    if own not in t or not g:
        res.note = "no kernel of one plan stores a node of it"
    elif others:  # the two sides differ by another lowered kernel too: not this template's time alone
        res.note = f"its kernels overlap the template {others[0]}"
    else:
        for side, plan, chosen in (("templates", with_t, set(t)), ("generated kernels", without, set(g))):
            # a node of the region that only kernels storing something outside it compute (fusion across the
            # border); a node that kernels outside recompute as well (a shared mask) is still counted here
            cut = sorted(n for n in region if plan.computed_by.get(n) and not plan.computed_by[n] & chosen)
            if cut:
                where = min(plan.computed_by[cut[0]], key=plan.order.__getitem__)
                res.note = f"the plan with {side} computes its node {cut[0]} in {where}, which stores a node outside it"
                break
    return res
