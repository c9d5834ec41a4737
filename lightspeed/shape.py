"""Views: movement ops as index expressions, never copies.

A ``View`` maps an index into its shape to a buffer offset (``offset + sum(i*stride)``)
and a validity predicate (per-axis ranges, from padding). A ``ShapeTracker`` is a
stack of views: when a reshape cannot be expressed by the last view's strides, a
new view is pushed and its linear index is unravelled into the view below it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from . import symbolic as sym
from .symbolic import sint


def _shape_str(shape: Sequence[sint]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def contiguous_strides(shape: Sequence[sint]) -> tuple[sint, ...]:
    shape = tuple(shape)
    got = _STRIDES_MEMO.get(shape)
    if got is None:
        if len(_STRIDES_MEMO) > 100_000:
            _STRIDES_MEMO.clear()
        got = _STRIDES_MEMO[shape] = _contiguous_strides(shape)
    return got


def _contiguous_strides(shape: tuple[sint, ...]) -> tuple[sint, ...]:
    strides: list[sint] = []
    acc: sint = 1
    for s in reversed(shape):
        strides.append(0 if sym.same(s, 1) else acc)
        acc = sym.mul(acc, s)
    return tuple(reversed(strides))


def _valid_at_zero(b: sint, e: sint) -> sint:
    """1 where index 0 lies in the mask range [b, e), else 0."""
    return sym.logical_and(sym.lt(b, 1), sym.lt(0, e))


@dataclass(frozen=True)
class View:
    shape: tuple[sint, ...]
    strides: tuple[sint, ...]
    offset: sint = 0
    mask: tuple[tuple[sint, sint], ...] | None = None

    @staticmethod
    def contiguous(shape: Sequence[sint]) -> "View":
        shape = tuple(shape)
        return View(shape, contiguous_strides(shape), 0, None)

    @property
    def is_contiguous(self) -> bool:
        return (self.mask is None and sym.same(self.offset, 0)
                and all(sym.same(a, b) for a, b, s in zip(self.strides, contiguous_strides(self.shape), self.shape)
                        if not sym.same(s, 1)))

    def full_mask(self) -> tuple[tuple[sint, sint], ...]:
        return self.mask if self.mask is not None else tuple((0, s) for s in self.shape)

    def index(self, idxs: Sequence[sint]) -> tuple[sint, sint]:
        """(buffer offset, validity) for an index into this view."""
        off: sint = self.offset
        for i, st in zip(idxs, self.strides):
            off = sym.add(off, sym.mul(i, st))
        valid: sint = 1
        if self.mask is not None:
            for i, (b, e), s in zip(idxs, self.mask, self.shape):
                if not sym.same(b, 0):
                    valid = sym.logical_and(valid, sym.lt(sym.add(b, -1), i))
                if not sym.same(e, s):
                    valid = sym.logical_and(valid, sym.lt(i, e))
        return off, valid

    def _norm_mask(self, mask) -> tuple | None:
        if mask is None:
            return None
        if all(sym.same(b, 0) and sym.same(e, s) for (b, e), s in zip(mask, self.shape)):
            return None
        return tuple(mask)

    # movement ops on a single view ------------------------------------------
    def permute(self, order: Sequence[int]) -> "View":
        m = None if self.mask is None else tuple(self.mask[o] for o in order)
        return View(tuple(self.shape[o] for o in order), tuple(self.strides[o] for o in order), self.offset, m)

    def expand(self, shape: Sequence[sint]) -> "View":
        strides = tuple(0 if not sym.same(o, n) else s for o, n, s in zip(self.shape, shape, self.strides))
        mask = None
        if self.mask is not None:
            # an expanded size-1 axis is valid everywhere or nowhere: where its one element is valid
            mask = tuple((0, sym.mul(n, _valid_at_zero(b, e))) if not sym.same(o, n) else (b, e)
                         for (b, e), o, n in zip(self.mask, self.shape, shape))
        v = View(tuple(shape), strides, self.offset, None)
        return View(v.shape, v.strides, v.offset, v._norm_mask(mask))

    def shrink(self, ranges: Sequence[tuple[sint, sint]]) -> "View":
        off = self.offset
        for (b, _), st in zip(ranges, self.strides):
            off = sym.add(off, sym.mul(b, st))
        shape = tuple(sym.add(e, sym.mul(b, -1)) for b, e in ranges)
        mask = None
        if self.mask is not None:
            mask = []
            for (b, e), (mb, me), n in zip(ranges, self.mask, shape):
                lo = sym.smax(sym.add(mb, sym.mul(b, -1)), 0)
                hi = sym.smin(sym.add(me, sym.mul(b, -1)), n)
                mask.append((lo, sym.smax(lo, hi)))
        v = View(shape, self.strides, off, None)
        return View(shape, self.strides, off, v._norm_mask(mask))

    def pad(self, pads: Sequence[tuple[sint, sint]]) -> "View":
        off = self.offset
        for (b, _), st in zip(pads, self.strides):
            off = sym.add(off, sym.mul(sym.mul(b, -1), st))
        shape = tuple(sym.add(sym.add(s, b), a) for s, (b, a) in zip(self.shape, pads))
        mask = tuple((sym.add(mb, b), sym.add(me, b)) for (mb, me), (b, _) in zip(self.full_mask(), pads))
        v = View(shape, self.strides, off, None)
        return View(shape, self.strides, off, v._norm_mask(mask))

    def flip(self, axes: Sequence[int]) -> "View":
        off = self.offset
        strides = list(self.strides)
        mask = list(self.full_mask()) if self.mask is not None else None
        for ax in axes:
            n = self.shape[ax]
            off = sym.add(off, sym.mul(sym.add(n, -1), strides[ax]))
            strides[ax] = sym.mul(strides[ax], -1)
            if mask is not None:
                b, e = mask[ax]
                mask[ax] = (sym.add(n, sym.mul(e, -1)), sym.add(n, sym.mul(b, -1)))
        return View(self.shape, tuple(strides), off, None if mask is None else tuple(mask))

    def try_reshape(self, new_shape: Sequence[sint]) -> "View | None":
        """The same data under ``new_shape`` as a single view, or None if strides cannot express it."""
        new_shape = tuple(new_shape)
        if self.is_contiguous:
            return View.contiguous(new_shape)
        if self.mask is not None:
            return None
        # drop size-1 axes, then match groups of old axes to groups of new axes by product
        old = [(s, st) for s, st in zip(self.shape, self.strides) if not sym.same(s, 1)]
        oi = 0
        new_nontrivial = [k for k, s in enumerate(new_shape) if not sym.same(s, 1)]
        strides_out: dict[int, sint] = {k: 0 for k in range(len(new_shape))}
        ni = 0
        while ni < len(new_nontrivial) or oi < len(old):
            if ni >= len(new_nontrivial) or oi >= len(old):
                return None
            # grow an old group and a new group until their products match
            og = [old[oi]]
            oi += 1
            ng = [new_nontrivial[ni]]
            ni += 1
            op_, np_ = og[0][0], new_shape[ng[0]]
            for _ in range(64):
                if sym.same(op_, np_):
                    break
                # grow the side whose product is "smaller" (numerically at the upper bound)
                if sym.upper_bound(op_) < sym.upper_bound(np_) or ni >= len(new_nontrivial):
                    if oi >= len(old):
                        return None
                    og.append(old[oi])
                    op_ = sym.mul(op_, old[oi][0])
                    oi += 1
                else:
                    ng.append(new_nontrivial[ni])
                    np_ = sym.mul(np_, new_shape[new_nontrivial[ni]])
                    ni += 1
            else:
                return None
            if not sym.same(op_, np_):
                return None
            # the old group must be mergeable: stride[k] == stride[k+1] * shape[k+1]
            for (s0, st0), (s1, st1) in zip(og, og[1:]):
                if not sym.same(st0, sym.mul(st1, s1)):
                    return None
            # the merged group has stride of its innermost axis; split it into the new group
            st: sint = og[-1][1]
            for k in reversed(ng):
                strides_out[k] = st
                st = sym.mul(st, new_shape[k])
        return View(new_shape, tuple(strides_out[k] for k in range(len(new_shape))), self.offset, None)


@dataclass(frozen=True)
class ShapeTracker:
    """A stack of views; ``views[-1]`` is what the consumer sees."""

    views: tuple[View, ...]

    @staticmethod
    def contiguous(shape: Sequence[sint]) -> "ShapeTracker":
        return ShapeTracker((View.contiguous(shape),))

    @property
    def shape(self) -> tuple[sint, ...]:
        return self.views[-1].shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_contiguous(self) -> bool:
        return len(self.views) == 1 and self.views[0].is_contiguous

    def _replace_last(self, v: View) -> "ShapeTracker":
        return ShapeTracker(self.views[:-1] + (v,))

    def index(self, idxs: Sequence[sint]) -> tuple[sint, sint]:
        """(buffer offset, validity) for an index into ``self.shape``."""
        key = (self, tuple(idxs))
        got = _INDEX_MEMO.get(key)
        if got is None:
            if len(_INDEX_MEMO) > 200_000:
                _INDEX_MEMO.clear()
            got = _INDEX_MEMO[key] = self._index(idxs)
        return got

    def _index(self, idxs: Sequence[sint]) -> tuple[sint, sint]:
        off, valid = self.views[-1].index(idxs)
        for v in reversed(self.views[:-1]):
            sub = unravel(off, v.shape)
            off, vv = v.index(sub)
            valid = sym.logical_and(valid, vv)
        return off, valid

    # movement ops -------------------------------------------------------------
    def reshape(self, new_shape: Sequence[sint]) -> "ShapeTracker":
        new_shape = tuple(new_shape)
        if not sym.same(sym.prod(self.shape), sym.prod(new_shape)):
            raise ValueError(f"reshape: cannot view shape {_shape_str(self.shape)} as {_shape_str(new_shape)}: "
                             "the element counts differ")
        if all(sym.same(a, b) for a, b in zip(self.shape, new_shape)) and len(self.shape) == len(new_shape):
            return self
        v = self.views[-1].try_reshape(new_shape)
        if v is not None:
            return self._replace_last(v)
        return ShapeTracker(self.views + (View.contiguous(new_shape),))

    def permute(self, order: Sequence[int]) -> "ShapeTracker":
        if sorted(order) != list(range(self.ndim)):
            raise ValueError(f"permute: {tuple(order)} is not a permutation of the {self.ndim} axes of shape "
                             f"{_shape_str(self.shape)}")
        return self._replace_last(self.views[-1].permute(order))

    def expand(self, shape: Sequence[sint]) -> "ShapeTracker":
        shape = tuple(shape)
        if len(shape) != self.ndim or any(not sym.same(o, n) and not sym.same(o, 1) for o, n in zip(self.shape, shape)):
            raise ValueError(f"expand: cannot expand shape {_shape_str(self.shape)} to {_shape_str(shape)}")
        return self._replace_last(self.views[-1].expand(shape))

    def shrink(self, ranges: Sequence[tuple[sint, sint]]) -> "ShapeTracker":
        if len(ranges) != self.ndim:
            raise ValueError(f"slice: {len(ranges)} ranges for shape {_shape_str(self.shape)}")
        for (b, e), s in zip(ranges, self.shape):
            if sym.same(b, 0) and sym.same(e, s):
                continue  # the whole axis (interval bounds of a size expression can be too loose to prove it)
            if sym.to_expr(b).lo < 0 or not sym.proven_ge(e, b) or not sym.proven_ge(s, e):
                raise ValueError(f"slice: range [{b}, {e}) is not inside an axis of size {s} "
                                 f"(shape {_shape_str(self.shape)})")
        return self._replace_last(self.views[-1].shrink(ranges))

    def pad(self, pads: Sequence[tuple[sint, sint]]) -> "ShapeTracker":
        if len(pads) != self.ndim or any(sym.to_expr(b).lo < 0 or sym.to_expr(a).lo < 0 for b, a in pads):
            raise ValueError(f"pad: {tuple(pads)} is not a non-negative (before, after) pair per axis of shape "
                             f"{_shape_str(self.shape)}")
        return self._replace_last(self.views[-1].pad(pads))

    def flip(self, axes: Sequence[int]) -> "ShapeTracker":
        return self._replace_last(self.views[-1].flip(axes))


_STRIDES_MEMO: dict = {}  # shape -> contiguous strides: symbolic products are costly and shapes repeat
_INDEX_MEMO: dict = {}  # (tracker, index) -> (offset, validity): models repeat the same views per layer
_UNRAVEL_MEMO: dict = {}


def unravel(linear: sint, shape: Sequence[sint]) -> list[sint]:
    """Index into ``shape`` (row-major) of a linear offset."""
    key = (linear, tuple(shape))
    got = _UNRAVEL_MEMO.get(key)
    if got is None:
        if len(_UNRAVEL_MEMO) > 200_000:
            _UNRAVEL_MEMO.clear()
        got = _UNRAVEL_MEMO[key] = _unravel(linear, shape)
    return list(got)


def _unravel(linear: sint, shape: Sequence[sint]) -> list[sint]:
    out: list[sint] = []
    acc: sint = 1
    outer = next((k for k, s in enumerate(shape) if not sym.same(s, 1)), len(shape))
    for k in range(len(shape) - 1, -1, -1):
        s = shape[k]
        if sym.same(s, 1):
            out.append(0)
            continue
        # a symbolic size that can be 0 leaves no valid element to index, but the expression is still
        # evaluated (under a mask, or by a backend's loop over a padded shape): never divide by 0
        q = sym.floordiv(linear, _nonzero(acc))
        # the outermost axis needs no modulo: valid offsets are below the element count
        out.append(q if k == outer else sym.mod(q, _nonzero(s)))
        acc = sym.mul(acc, s)
    return list(reversed(out))


def _nonzero(x: sint) -> sint:
    """``x``, or ``max(x, 1)`` where ``x`` may be 0."""
    return x if sym.to_expr(x).lo > 0 else sym.smax(x, 1)
