"""Which keys an attention score masks, proven from its IR (for skipping whole key blocks).

A causal (or sliding-window) attention's score is ``where(visible(i, j), f(i, j), M)`` in some primitive
form: a select by a bool, a Mul-Add with the negated bool and a constant, ... ``split_mask`` looks for a
bool subexpression ``visible`` of the score such that the score folds to one constant M wherever it is
false, and splits ``visible`` into its conjuncts (a bool Mul is an AND). A conjunct that is monotone in
the key index j bounds the visible keys of every row: once a non-increasing conjunct ("upper") is false
for key j it is false for every later key, and once a non-decreasing one ("lower") is false for key j it
is false for every earlier key. Monotonicity is proven by rules on the IR (integer index arithmetic
with bounds that exclude wrap-around, comparisons, ANDs, casts that keep order), never assumed.

What it proves is only where the score equals M; whether dropping those keys is exact depends on the
values (their weight exp2((M - max) c) must round to 0), which the kernel checks as it runs.

An additive mask, ``scores + where(visible, 0, -inf)`` (aten's attention, e.g. torch.compile'd Hugging Face
models), is taken as -inf where hidden. That holds for every score but NaN and +inf (which give NaN): a key
whose hidden score is NaN (a NaN in its key row) or +inf (an overflowing dot product) is dropped in a skipped
block, where the computed one would make the row NaN, as a NaN in a hidden key's value row (0 * NaN) is.
Kernels may read the score with index-valued buffers resolved (``kernel/index_values.py``), so that masks of
positions stored in buffers are plain index comparisons here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..ops import Op
from . import ir
from .ir import ir_vars

# keys are skipped only when the masked score is far below any score a row can plausibly reach: the kernel
# checks the exactness anyway, but a mask of e.g. 0 would make every work item compute twice
MIN_MASK_DEPTH = 1e6  # -M * c (the exponent a masked key's weight has against a score of 0)


@dataclass(eq=False)
class KeyMask:
    """score(i, j) == ``masked`` wherever every conjunct ``upper`` and ``lower`` is not true; ``upper``
    conjuncts are non-increasing in j (true, then false), ``lower`` ones non-decreasing (false, then true).
    Conjuncts that are not provably monotone are left out (a subset still proves a key masked)."""
    masked: float
    upper: list[ir.IR]
    lower: list[ir.IR]


def _key(x: ir.IR) -> tuple:
    """A structural key: equal keys mean equal values at every index."""
    if isinstance(x, ir.Load):
        return ("load", id(x.buf), sym.to_expr(x.offset), x.dtype)
    if isinstance(x, ir.Const):
        return ("const", repr(x.value), x.dtype)
    if isinstance(x, ir.Index):
        return ("index", sym.to_expr(x.expr), x.dtype)
    if isinstance(x, ir.Alu):
        return ("alu", x.op, x.dtype) + tuple(_key(a) for a in x.args)
    if isinstance(x, ir.Cast):
        return ("cast", x.dtype, _key(x.arg))
    if isinstance(x, ir.Select):
        return ("select", sym.to_expr(x.valid), x.dtype, _key(x.value))
    return ("other", id(x))  # reductions and gathers: only identical objects are equal


def _fold(x: ir.IR, falsy: tuple):
    """The constant value of ``x`` where the bool with key ``falsy`` is false, or None if not constant."""
    if _key(x) == falsy:
        return False
    if isinstance(x, ir.Const):
        v = x.value
        if x.dtype is dt.bool_:
            return bool(v)
        return np.float32(v) if x.dtype is dt.float32 else None
    if isinstance(x, ir.Alu) and len(x.args) == 2:
        a, b = (_fold(y, falsy) for y in x.args)
        if x.op is Op.LESS_THAN and a is not None and b is not None:
            return bool(a < b)
        if x.op is Op.MUL and x.dtype is dt.bool_:
            return False if a is False or b is False else (True if a is True and b is True else None)
        if x.op is Op.MUL and x.dtype is dt.float32:
            for cond, other, arg in ((a, b, x.args[0]), (b, a, x.args[1])):
                if arg.dtype is dt.bool_:  # a select: the other operand where true, else 0
                    return np.float32(0) if cond is False else (other if cond is True else None)
            return np.float32(a * b) if a is not None and b is not None else None
        if x.op is Op.ADD and x.dtype is dt.float32 and a is not None and b is not None:
            return np.float32(a + b)
        if x.op is Op.ADD and x.dtype is dt.float32 and (a == -np.inf or b == -np.inf):
            # an additive mask, scores + where(visible, 0, -inf) (aten's attention): -inf whatever the scores,
            # but for a NaN or +inf score (see the module docstring)
            return np.float32(-np.inf)
    return None


def _conjuncts(x: ir.IR) -> list[ir.IR]:
    if isinstance(x, ir.Alu) and x.op is Op.MUL and x.dtype is dt.bool_:
        return [c for a in x.args for c in _conjuncts(a)]
    return [x]


_INT_RANGE = {d: (int(np.iinfo(d.np).min), int(np.iinfo(d.np).max)) for d in (dt.int32, dt.int64)}


def _interval(x: ir.IR) -> tuple[int, int] | None:
    """Bounds of an integer (or bool) value, None if unknown or if its arithmetic may wrap around."""
    if x.dtype is dt.bool_:
        return (0, 1)
    rng = _INT_RANGE.get(x.dtype)
    if rng is None:
        return None
    out = None
    if isinstance(x, ir.Const):
        out = (int(x.value), int(x.value))
    elif isinstance(x, ir.Index):
        e = sym.to_expr(x.expr)
        out = (e.lo, e.hi)
    elif isinstance(x, ir.Cast) and (x.arg.dtype is dt.bool_ or x.arg.dtype in _INT_RANGE):
        out = _interval(x.arg)
    elif isinstance(x, ir.Alu) and x.op in (Op.ADD, Op.MUL):
        a, b = (_interval(y) for y in x.args)
        if a is None or b is None:
            return None
        if x.op is Op.ADD:
            out = (a[0] + b[0], a[1] + b[1])
        else:
            p = [u * v for u in a for v in b]
            out = (min(p), max(p))
    if out is None or out[0] < rng[0] or out[1] > rng[1]:
        return None
    return out


def _combine(a: int | None, b: int | None) -> int | None:
    """The direction of a sum (or an AND) of two terms with directions a and b (0 = constant)."""
    if a is None or b is None:
        return None
    if a == 0 or a == b:
        return b
    return a if b == 0 else None


def direction(x: ir.IR, j: sym.Var) -> int | None:
    """+1 if ``x`` is non-decreasing in ``j`` (for every value of the other variables), -1 if
    non-increasing, 0 if independent of it, None when no rule proves either. Bools count as 0 < 1."""
    if j not in ir_vars(x):
        return 0
    if x.dtype in _INT_RANGE and _interval(x) is None:
        return None  # may wrap around (or unknown bounds)
    if isinstance(x, ir.Index):
        e = sym.to_expr(x.expr)
        diff = sym.to_expr(sym.add(e.substitute({j: sym.add(j, 1)}), sym.mul(e, -1)))
        return 0 if diff.lo >= 0 and diff.hi <= 0 else 1 if diff.lo >= 0 else -1 if diff.hi <= 0 else None
    if isinstance(x, ir.Cast):
        # int -> wider int or float, bool -> anything, float -> float32: rounding keeps the order
        src, to = x.arg.dtype, x.dtype
        keeps = (src is dt.bool_ or (src in _INT_RANGE and (to.is_float or to in _INT_RANGE))
                 or (src is dt.float32 and to is dt.float32))
        return direction(x.arg, j) if keeps and to is not dt.bool_ else None
    if not isinstance(x, ir.Alu) or len(x.args) != 2:
        return None
    a, b = x.args
    if x.op is Op.LESS_THAN:  # a < b follows the direction of b - a
        da, db = direction(a, j), direction(b, j)
        return _combine(db, None if da is None else -da)
    if x.op is Op.ADD and x.dtype is not dt.bool_:
        return _combine(direction(a, j), direction(b, j))
    if x.op is Op.MUL and x.dtype is dt.bool_:  # AND of 0/1 values
        return _combine(direction(a, j), direction(b, j))
    if x.op is Op.MUL and a.dtype is x.dtype and b.dtype is x.dtype:
        for k, other in ((a, b), (b, a)):
            if isinstance(k, ir.Const):  # scaling by a constant keeps (or flips) the order
                d = direction(other, j)
                if d is None or float(k.value) == 0:
                    return 0 if d is not None else None
                return d if float(k.value) > 0 else -d
    return None


def split_mask(score: ir.IR, j: sym.Var, c: float) -> KeyMask | None:
    """The key mask of ``score`` (a float32 IR over the key index ``j``; ``c`` the softmax's exponent
    scale), or None when no bool of it masks to a constant far enough below (see MIN_MASK_DEPTH) with a
    conjunct monotone in j."""
    if score.dtype is not dt.float32:
        return None
    seen: set[tuple] = set()
    for cand in score.walk():
        if cand.dtype is not dt.bool_ or not isinstance(cand, ir.Alu):
            continue
        key = _key(cand)
        if key in seen:
            continue
        seen.add(key)
        m = _fold(score, key)
        if m is None or np.isnan(m) or not (m == -np.inf or -float(m) * c >= MIN_MASK_DEPTH):
            continue
        upper, lower = [], []
        for part in _conjuncts(cand):
            d = direction(part, j)
            if d == -1:
                upper.append(part)
            elif d == 1:
                lower.append(part)
        if upper or lower:
            return KeyMask(float(m), upper, lower)
    return None
