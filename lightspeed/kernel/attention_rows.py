"""Rows a softmax leaves empty: the select by which a "safe" softmax gives 0 instead of NaN.

PyTorch's ``scaled_dot_product_attention`` decomposes into ``where(all_j(x_ij == -inf), 0, softmax_j(x))``
(fused attention kernels give 0, not NaN, for a query that may see no key). After the rewrite package's
safe rules (``mul-zero``, ``add-zero``, ``not-not``) the attention's weights read ``Sel(q_i, W_ij)``: a
bool ``q`` that does not depend on the key ``j`` selects the softmax. ``row_select`` proves, from the
primitive nodes, that ``q_i == any_j(x_ij != -inf)`` for the very score element ``x_ij`` the softmax
reads, i.e. that ``q`` is false exactly on the rows whose every score is -inf. Then the whole expression
is the streaming kernel with ``zero_empty_rows`` (such rows give 0; a row with a NaN score still gives
NaN, as ``q`` is true there and the softmax is NaN).

How ``q`` is proven: above the reduction it may only negate (``b < True``) or cast bools; the reduction
is an ``any`` (the max over ``j`` of a bool cast to a number, cast back to bool); below it, the element
predicate ``p(x)`` may only compare the score element with scalar constants and combine bools. Such a
``p`` is constant on each class of the partition of float32 into NaN, each constant, and the open
intervals between consecutive constants (with -inf, 0 and +inf among them), so evaluating it at one
point of every class decides ``p(x) == (x != -inf)`` for every float32 ``x``: a proof, not a sample.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..graph import ArrayConst, Node
from ..ops import Op
from ..rewrite.views import compose, is_total
from ..shape import ShapeTracker
from .attention_index import index_through

_NUMERIC = (dt.int8, dt.int16, dt.int32, dt.int64, dt.uint8, dt.uint16, dt.uint32, dt.float32)


@dataclass
class RowSelect:
    """``Sel(q, W)`` proven to be the softmax ``W`` where its row has a score above -inf, else 0.
    ``nodes``: the select and the nodes of ``q`` (not the scores, not constants)."""
    select: Node
    q: Node
    nodes: list[Node] = field(default_factory=list)


def split_select(w: Node, w_st: ShapeTracker):
    """(the float operand of the select ``w`` read in the same space as ``w``, the bool operand likewise,
    the bool node) when ``w`` is a Mul of a bool and a float32 value through mask-free views, else None."""
    if w.op is not Op.MUL or w.dtype is not dt.float32 or len(w.srcs) != 2:
        return None
    (a, sa), (b, sb) = w.srcs
    if b.dtype is dt.bool_ and a.dtype is dt.float32:
        (a, sa), (b, sb) = (b, sb), (a, sa)
    if a.dtype is not dt.bool_ or b.dtype is not dt.float32 or not (is_total(sa) and is_total(sb)):
        return None
    return (b, compose(sb, w_st)), (a, compose(sa, w_st))


def _index(st: ShapeTracker, idx, src: Node):
    return index_through(st, idx, src)


def _same(a, b) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(sym.same(x, y) for x, y in zip(a, b))


def _scalar(n: Node):
    if n.op is Op.CONST and not isinstance(n.arg, ArrayConst) and not n.shape:
        return n.arg
    return None


class _Predicate:
    """The element predicate below the ``any``: its nodes, the constants it compares with, and whether
    every float leaf reads one element: ``x`` at ``x_index`` (None: the first float32 node it reads that is
    not a constant, which every other leaf must then be)."""

    def __init__(self, x: Node | None, x_index):
        self.x, self.x_index = x, x_index
        self.nodes: list[Node] = []
        self.consts: set[float] = {float("-inf"), 0.0, float("inf")}

    def check(self, n: Node, idx) -> bool:
        """True if ``n`` at index ``idx`` is built only of allowed ops over the element."""
        if self.x is None and n.dtype is dt.float32 and _scalar(n) is None:
            self.x, self.x_index = n, idx
        if n is self.x:
            return _same(idx, self.x_index)
        v = _scalar(n)
        if v is not None:
            if isinstance(v, float) or n.dtype.is_float:
                self.consts.add(float(np.float32(v)))
            return True
        if n.op is Op.LESS_THAN or (n.op is Op.MUL and n.dtype is dt.bool_):
            ok = all(s.dtype is dt.bool_ for s, _ in n.srcs) if n.op is Op.MUL else True
        elif n.op is Op.CAST:
            # casts to bool (x != 0) and between bools and integers keep the value exactly
            ok = n.dtype is dt.bool_ or n.srcs[0][0].dtype is dt.bool_
        else:
            ok = False
        if not ok:
            return False
        self.nodes.append(n)
        for s, st in n.srcs:
            if not is_total(st):
                return False
            si = _index(st, idx, s)
            if si is None or not self.check(s, si):
                return False
        return True

    def evaluate(self, n: Node, points: np.ndarray):
        """``n``'s value at every score value in ``points`` (reference semantics)."""
        if n is self.x:
            return points
        v = _scalar(n)
        if v is not None:
            return np.full(points.shape, v, dtype=n.dtype.np)
        args = [self.evaluate(s, points) for s, _ in n.srcs]
        if n.op is Op.LESS_THAN:
            return args[0] < args[1]
        if n.op is Op.MUL:
            return args[0] & args[1]
        src = n.srcs[0][0].dtype
        if n.dtype is dt.bool_:
            return args[0] != 0 if src is not dt.bool_ else args[0]  # (NaN != 0 is true, as Cast's)
        return args[0].astype(n.dtype.np)

    def test_points(self) -> np.ndarray:
        pts = {float("nan")}
        for c in self.consts:
            pts.add(c)
            if c != float("inf"):
                pts.add(float(np.nextafter(np.float32(c), np.float32(np.inf))))
        return np.array(sorted(pts, key=lambda v: (v != v, v)), dtype=np.float32)


def _any_of(n: Node):
    """(the bool reduced, its reduce axis) if ``n`` is ``Cast(MaxReduce(Cast(b -> number)) -> bool)``."""
    if n.op is not Op.CAST or n.dtype is not dt.bool_:
        return None
    red, st = n.srcs[0]
    if red.op is not Op.MAX_REDUCE or red.dtype not in _NUMERIC or not is_total(st):
        return None
    inner, ist = red.srcs[0]
    if inner.op is not Op.CAST or inner.dtype is not red.dtype or inner.srcs[0][0].dtype is not dt.bool_:
        return None
    return red, st, inner, ist


@dataclass
class AnyOfElement:
    """A bool proven to be ``any_j p(x_j)`` (or its negation): ``x`` read at ``x_index`` (which uses the key
    ``j``), ``truth`` the element predicate ``p`` at every float32 class (``points``), ``nodes`` the bool's
    nodes (from the bool down to the predicate, not ``x``)."""
    negated: bool
    x: Node
    x_index: list
    points: np.ndarray
    truth: np.ndarray
    nodes: list[Node]


def any_of_element(q: Node, qi, j: sym.Var, keys, x: Node | None = None, x_index=None) -> AnyOfElement | None:
    """The proof of the module docstring for bool ``q`` at index ``qi``: negations and bool casts above an
    ``any`` over ``keys`` keys (the key ``j`` takes its axis) of a predicate that compares one float32
    element with scalar constants (``x`` at ``x_index`` when given); None unless it has that form."""
    if any(j in sym.free_vars(v) for v in qi):
        return None
    nodes: list[Node] = []
    negations = 0
    n, idx = q, qi
    while True:  # negations and bool casts above the any
        nodes.append(n)
        if n.op is Op.LESS_THAN and n.srcs[0][0].dtype is dt.bool_ and _scalar(n.srcs[1][0]) is not None \
                and bool(_scalar(n.srcs[1][0])):
            negations += 1
        elif n.op is Op.CAST and n.dtype is dt.bool_ and n.srcs[0][0].dtype is dt.bool_:
            pass
        else:
            break
        s, st = n.srcs[0]
        if not is_total(st):
            return None
        idx = _index(st, idx, s)
        if idx is None:
            return None
        n = s
    nodes.pop()  # (n is the any itself: the cast, added below with the reduction)
    found = _any_of(n)
    if found is None:
        return None
    red, st, inner, ist = found
    ri = _index(st, idx, red)
    if ri is None or not sym.same(red.srcs[0][1].shape[red.arg], keys):
        return None
    red_in = list(ri)
    red_in.insert(red.arg, j)
    ii = _index(ist, red_in, inner)
    b, bst = inner.srcs[0]
    if ii is None or not is_total(bst):
        return None
    bi = _index(bst, ii, b)
    pred = _Predicate(x, x_index)
    if bi is None or not pred.check(b, bi) or pred.x is None or not any(j in sym.free_vars(v) for v in pred.x_index):
        return None
    pts = pred.test_points()
    truth = np.asarray(pred.evaluate(b, pts), dtype=bool)
    if truth.shape != pts.shape:
        return None
    return AnyOfElement(bool(negations % 2), pred.x, list(pred.x_index), pts, truth,
                        nodes + [n, red, inner] + pred.nodes)


def row_select(w: Node, q: Node, q_st: ShapeTracker, full, j: sym.Var, keys, x: Node, x_index) -> RowSelect | None:
    """The proof described in the module docstring. ``w``: the select node; ``q`` read through ``q_st``
    (in the attention's reduction space, index ``full``, key variable ``j`` over ``keys``); ``x`` the
    softmax's score node and ``x_index`` the element it reads at ``full``. None unless proven."""
    qi = _index(q_st, full, q)
    if qi is None:
        return None
    found = any_of_element(q, qi, j, keys, x, x_index)
    # q is any_j(x_j != -inf) (NaN included)
    if found is None or found.negated or not np.array_equal(found.truth, ~np.isneginf(found.points)):
        return None
    nodes = [w] + found.nodes
    return RowSelect(w, q, list({n.id: n for n in nodes}.values()))
