"""C text of values shared by the C renderers (kernels and lowered templates)."""
from __future__ import annotations

import math


def float_literal(v: float) -> str:
    """A C float literal for ``v``: exact (hexadecimal) unless it is a small integer."""
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return f"{float(v).hex()}f" if v != int(v) or abs(v) >= 2**24 else f"{float(v):.1f}f"
