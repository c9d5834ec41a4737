"""Constant folding: an op whose operands are all scalar constants becomes a constant, computed by the
reference interpreter's own semantics (so folding is exact by construction)."""
from __future__ import annotations

import numpy as np

from ...backend.reference import _compute_dtype, eval_node
from ...ops import BINARY, UNARY, Op
from ..pattern import ConstPat, Match, OpPat, scalar_value
from ..rule import EXACT, Rule
from ._build import full


def _fold(m: Match):
    n = m.node
    srcs = [np.array(scalar_value(s), dtype=_compute_dtype(s.dtype)) for s, _ in n.srcs]
    value = np.asarray(eval_node(n, srcs, {}, {}))
    if value.shape != ():
        return None
    v = value.item()
    if n.dtype.is_float:
        v = float(v)
    elif n.dtype.name == "bool":
        v = bool(v)
    else:
        v = int(v)
    return full(m, v)


def _rules() -> list[Rule]:
    out = []
    for op in sorted(UNARY, key=lambda o: o.value):
        out.append(Rule(f"fold-{op.value.lower()}", OpPat(op, (ConstPat(),)), _fold, EXACT))
    for op in sorted(BINARY, key=lambda o: o.value):
        out.append(Rule(f"fold-{op.value.lower()}", OpPat(op, (ConstPat(), ConstPat())), _fold, EXACT))
    out.append(Rule("fold-cast", OpPat(Op.CAST, (ConstPat(),)), _fold, EXACT))
    return out


RULES = _rules()
