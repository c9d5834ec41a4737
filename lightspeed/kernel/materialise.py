"""Which values get a buffer, as choices: the points where kernel formation decides by a threshold, named by
the structure around them so a decision holds for every repeat of a layer.

Kernel formation (fusion.py) must store some values (outputs, scatters, reductions read by several kernels,
values the lowered kernels need) and inlines most others. Between the two lie its thresholds: a value read by
several kernels or through a broadcast is recomputed by each reader when it costs little, else stored; a
reduction read by one kernel through a plain view is computed inside that kernel. Each such node is a
*materialisation point*. A point's *signature* hashes the node's op, argument, dtype, shape and the views
and signatures of its sources to a few levels, with inputs and constants named by dtype and shape only: the
same position in two layers has the same signature, so one decision covers all of them and a decision
stored under a signature still means the same thing when the program is built again.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .. import symbolic as sym
from ..graph import ArrayConst, Node
from ..ops import Op

SIGNATURE_DEPTH = 3  # levels of sources a signature covers: enough to tell the points of one layer apart


@dataclass
class MaterialisePoint:
    """A node group whose buffer is a choice: the signature, what it is (op, shape), whether the heuristics
    store it (``stored``), whether recomputing it is allowed at all (``may_recompute``; storing always is),
    how many nodes share the signature and their elements in all (upper bounds)."""

    signature: str
    op: str
    shape: str
    stored: bool
    may_recompute: bool
    nodes: int = 0
    elements: int = 0

    def describe(self, store: bool) -> str:
        """A short label of deciding ``store`` at this point, e.g. ``store Exp2[64, 128] x30``."""
        return f"{'store' if store else 'recompute'} {self.op}{self.shape} x{self.nodes}"


def node_signature(n: Node, memo: dict[tuple[int, int], str], depth: int = SIGNATURE_DEPTH) -> str:
    """The structural signature of ``n`` (see the module docstring); ``memo`` caches it across calls."""
    key = (n.id, depth)
    if key in memo:
        return memo[key]
    # a weight or an input: which one does not matter, so layers share signatures
    anonymous = n.op is Op.INPUT or (n.op is Op.CONST and isinstance(n.arg, ArrayConst))
    arg = "" if anonymous else repr(n.arg)
    parts = [n.op.value, arg, n.dtype.name, repr(tuple(n.shape))]
    if depth > 0:
        for s, st in n.srcs:
            parts.append(repr(st.views) + "<" + node_signature(s, memo, depth - 1))
    text = "|".join(parts)
    memo[key] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return memo[key]


def shape_text(n: Node) -> str:
    """``n``'s shape as a short text (symbolic dimensions at their upper bounds)."""
    return "[" + ", ".join(str(s) if isinstance(s, int) else str(sym.upper_bound(s)) for s in n.shape) + "]"
