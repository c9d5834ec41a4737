"""Streaming attentions the e-graph derives where ``kernel/attention.py``'s pattern does not match.

A lowered-kernel matcher (``fusion.LOWERED_MATCHERS``, after the pattern): a node that reduces over some
axis and has an exponential and a max below it is translated into the key-vector language and rewritten
by the online-softmax rules (``online_softmax.py``, ``search/egraph/rules/online.egg``); when its e-class
reaches the blocked online-softmax form, the node becomes a streaming attention kernel whose score and
value are the terms the e-graph found. The node's value does not change beyond rounding: every rule is
an identity of real arithmetic, and the kernel computes that blocked form.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import dtypes as dt
from .. import symbolic as sym
from ..graph import Node
from ..ops import Op
from . import ir
from .attention import MAX_VALUE_WIDTH, attention_kernels, settle_private
from .online_softmax import ELEMENTWISE, REDUCTIONS, Derivation, KeyTerms, derive, elementwise_only, leaves_of, \
    term_ir, translate

SEARCH_DEPTH = 12  # how far below a candidate its exponential and max may be
SEARCH_NODES = 64
NEEDED = {Op.SUM_REDUCE, Op.MAX_REDUCE, Op.EXP2}


@dataclass(eq=False)
class DerivedAttention:
    """A streaming attention at ``node`` derived by the e-graph (see the module docstring)."""

    node: Node
    keys: sym.sint
    width: int
    terms: KeyTerms  # the node's translation at the match's index
    derivation: Derivation
    stop: frozenset[int] = frozenset()  # nodes translated as leaves (other lowered kernels' nodes)
    inlined: set[int] = field(default_factory=set)
    forced: set[int] = field(default_factory=set)

    @property
    def inner_nodes(self) -> list[Node]:
        return [n for nid, n in self.terms.inner.items() if nid != self.node.id]

    @property
    def score_nodes(self) -> tuple[Node, ...]:
        """What the maxima read and the score term's leaves: where the search for nodes only the kernel reads
        (the scores, at least seq x seq) starts (``attention.private_nodes``)."""
        nodes = {n.id: n for n in self.terms.maxed.values() if n.id not in self.terms.inner}
        for k in leaves_of(self.derivation.score):
            n = self.terms.leaves[k][0]
            nodes[n.id] = n
        return tuple(nodes.values())

    def kernels(self, former, n: Node, buf: ir.Buffer, name: str, vars_) -> list[ir.Kernel]:
        j = ir.loop_var("kj", self.keys)
        terms = translate(self.node, list(vars_), self.keys, j, self.stop)
        assert terms is not None and terms.text == self.terms.text, "the translation is the match's"
        score = term_ir(former, self.derivation.score, terms.leaves)
        value = term_ir(former, self.derivation.value, terms.leaves)
        return attention_kernels(former, n, buf, name, vars_, score, value, j, self.keys, self.derivation.scale,
                                 self.width, zero_empty_rows=self.derivation.zero_empty_rows)


def _translatable(n: Node) -> bool:
    return n.dtype is dt.float32 and (n.op in ELEMENTWISE or n.op in REDUCTIONS or n.op is Op.CONTIGUOUS)


def _keys_below(n: Node) -> sym.sint | None:
    """The length of the reduction nearest below ``n`` when a sum, a max and an exponential all lie within
    ``SEARCH_DEPTH`` float32 ops of it (a cheap test before any index arithmetic), else None."""
    seen: set[int] = set()
    ops: set[Op] = set()
    keys = None
    frontier = [n]
    for _ in range(SEARCH_DEPTH):
        nxt = []
        for x in frontier:
            if x.id in seen or not _translatable(x) or len(seen) >= SEARCH_NODES:
                continue
            seen.add(x.id)
            ops.add(x.op)
            if x.op is Op.SUM_REDUCE and keys is None:
                keys = x.srcs[0][1].shape[x.arg]
            nxt.extend(s for s, _ in x.srcs)
        frontier = nxt
    return keys if NEEDED <= ops else None


def match_derived_attention(former) -> list[DerivedAttention]:
    """Streaming attentions in ``former``'s nodes that the pattern did not match and the e-graph derives."""
    taken = set(former.lowered) | set(former.inlined)
    for low in former.lowered.values():
        taken |= {n.id for n in low.inner_nodes}
    found: list[DerivedAttention] = []
    derived: dict[str, Derivation | None] = {}  # by term text: the layers of a model translate alike
    for n in reversed(former.nodes):
        if (n.id in taken or n.op not in (Op.SUM_REDUCE, Op.MUL) or n.dtype is not dt.float32 or len(n.shape) < 2
                or not sym.is_const(n.shape[-1]) or int(n.shape[-1]) > MAX_VALUE_WIDTH or not former.may_lower(n)):
            continue
        keys = _keys_below(n)
        if keys is None:
            continue
        out = [ir.loop_var(f"ao{k}", s) for k, s in enumerate(n.shape)]
        stop = frozenset(taken)  # (what the pattern lowered, and what earlier derivations took, stays whole)
        terms = translate(n, out, keys, ir.loop_var("aj", keys), stop)
        if terms is None or not all(f"({op} " in terms.text for op in ("KSum", "KMax", "Exp2")):
            continue
        if terms.text not in derived:
            derived[terms.text] = derive(terms)
        d = derived[terms.text]
        if d is None or not _usable(d, terms, out[-1]):
            continue
        found.append(DerivedAttention(n, keys, int(n.shape[-1]), terms, d, stop=stop))
        taken |= set(terms.inner)
    settle_private(former, found)
    return found


def _usable(d: Derivation, terms: KeyTerms, column: sym.Var) -> bool:
    """Whether the kernel can compute the derivation: elementwise score and value terms, a positive scale
    (``derive`` admits only finite ones), and a score that does not depend on the value's column (the output's
    last index)."""
    if not (elementwise_only(d.score) and elementwise_only(d.value) and d.scale > 0):
        return False
    return not any(column in sym.free_vars(x) for k in leaves_of(d.score) for x in terms.leaves[k][1])
