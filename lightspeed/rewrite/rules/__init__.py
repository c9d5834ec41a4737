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
# safe rules that move a constant out of a max: in a softmax exp(x - max(x)) with x = y * c they make the max
# read y while the exponential reads x, which hides the softmax from kernel formation's matchers (streaming
# attention); the e-graph still holds both forms
DENORMALISING = frozenset({"max-add-const", "max-mul-const"})
# what compiles apply by default (the torch backend, search level 1): the safe rules in normal-form direction
NORMALISE: list[Rule] = [r for r in SAFE if r.name not in DENORMALISING]


def by_name(name: str) -> Rule:
    for r in ALL:
        if r.name == name:
            return r
    raise KeyError(f"no rewrite rule named {name!r}; known: {sorted(r.name for r in ALL)}")
