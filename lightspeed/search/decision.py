"""The record of one lowered-kernel choice, shared by extraction (``egraph/extract.py``, which makes the rows)
and ``lowering.py`` / ``graph_search.py`` (which read them): a leaf module, so neither imports the other."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Decision:
    """One alternative as extraction saw it: seconds of the lowered kernel and of the primitive nodes it
    would replace (values both read are left out), and whether the lowered kernel was chosen."""

    kind: str
    node: int
    lowered_s: float
    primitive_s: float
    chosen: bool
