"""View helpers for rewriting: composing the views on a path of edges and asking what a view does.

A value in a rewritten graph is a node seen through a ``ShapeTracker`` (a ``Tensor``). When a rule
replaces a node by a view of another node, every consumer reads the replacement through the view
it already had on its edge, composed with the replacement's own view.
"""
from __future__ import annotations

from functools import lru_cache

from .. import symbolic as sym
from ..shape import ShapeTracker


def same_shape(a, b) -> bool:
    return len(a) == len(b) and all(sym.same(x, y) for x, y in zip(a, b))


@lru_cache(maxsize=1 << 16)
def _contiguous(st: ShapeTracker) -> bool:
    # ShapeTracker.is_contiguous rebuilds symbolic strides on every call; rewriting asks it very often
    return st.is_contiguous


@lru_cache(maxsize=1 << 16)
def dense(shape: tuple) -> ShapeTracker:
    """``ShapeTracker.contiguous(shape)``, cached (building one simplifies symbolic strides)."""
    return ShapeTracker.contiguous(shape)


@lru_cache(maxsize=1 << 16)
def compose(inner: ShapeTracker, outer: ShapeTracker) -> ShapeTracker:
    """The view that reads ``outer``'s index through ``inner``.

    ``inner`` maps an index of ``inner.shape`` to a buffer offset; ``outer`` maps a consumer's index
    into a dense row-major array of ``inner.shape`` (the caller guarantees that shape). The result maps
    the consumer's index straight to the buffer offset."""
    if _contiguous(outer) and same_shape(outer.shape, inner.shape):
        return inner
    if _contiguous(inner):
        return outer
    # ShapeTracker.index unravels each view's offset into the shape of the view below it
    return ShapeTracker(inner.views + outer.views)


def is_total(st: ShapeTracker) -> bool:
    """True if every index of the view reads an element (no padding masks)."""
    return all(v.mask is None for v in st.views)


def is_identity(st: ShapeTracker, shape) -> bool:
    """True if the view reads a dense array of ``shape`` element for element."""
    return _contiguous(st) and same_shape(st.shape, shape)


def broadcast_axes(st: ShapeTracker) -> set[int]:
    """Axes of the view along which every element reads the same source element (stride 0, or size 1).

    With a padding mask, an axis qualifies only if its own mask range is the whole axis (then validity
    does not depend on the index along it). Stacked views report no axis (a safe answer)."""
    if len(st.views) != 1:
        return set()
    v = st.views[0]
    mask = v.full_mask()
    return {k for k, (s, stride, (b, e)) in enumerate(zip(v.shape, v.strides, mask))
            if (sym.same(stride, 0) or sym.same(s, 1)) and sym.same(b, 0) and sym.same(e, s)}
