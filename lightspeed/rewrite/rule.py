"""A rewrite rule: a pattern, a builder of the replacement, and what is promised about the result."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..ops import Op
from ..tensor import Tensor
from .pattern import Match, OpPat, Pattern

# How closely a rule's replacement agrees with the original
EXACT = "exact"      # the same value bit for bit (NaN payloads aside)
VALUE = "value"      # the same value, but a zero may change sign (x + 0 turns -0.0 into +0.0)
ROUNDING = "rounding"  # the same in real arithmetic; float results differ by rounding (see ``note``)


@dataclass(eq=False)
class Rule:
    """``pattern`` -> ``build(match)``; ``build`` returns the replacement Tensor, or None to decline.

    The replacement must have the matched node's shape and dtype. ``exactness`` is one of EXACT,
    VALUE, ROUNDING; ``note`` states any further condition (the property tests check each rule
    against the reference interpreter within what ``exactness`` allows)."""

    name: str
    pattern: Pattern
    build: Callable[[Match], Tensor | None]
    exactness: str = EXACT
    note: str = ""

    @property
    def root_op(self) -> Op | None:
        return self.pattern.op if isinstance(self.pattern, OpPat) else None
