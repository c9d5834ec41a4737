"""Rule sets, grouped by purpose. Each is a list of ``Rule`` (data: a pattern and a builder)."""
from __future__ import annotations

from ..rule import EXACT, VALUE, Rule
from . import algebra, fold, reduce

ALGEBRA: list[Rule] = algebra.RULES
FOLD: list[Rule] = fold.RULES
REDUCE: list[Rule] = reduce.RULES
ALL: list[Rule] = FOLD + ALGEBRA + REDUCE
# what a compile may apply without changing any value: no rounding differences
SAFE: list[Rule] = [r for r in ALL if r.exactness in (EXACT, VALUE)]


def by_name(name: str) -> Rule:
    for r in ALL:
        if r.name == name:
            return r
    raise KeyError(f"no rewrite rule named {name!r}; known: {sorted(r.name for r in ALL)}")
