"""The bounds a chat template renders under, and the per-render budget that enforces them.

Chat templates come from model files, so a template may loop, recurse or build strings
without end. ``TemplateLimits`` says how much one render may take; ``RenderBudget`` is
charged by the sandbox's hooks (every loop iteration, call, intercepted operator, filter
and output piece) and raises ``ChatTemplateLimitError`` as soon as a bound is crossed.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

from .errors import ChatTemplateLimitError

_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class TemplateLimits:
    """How much one chat-template render may take (all bounds apply together)."""

    max_seconds: float = 5.0              # wall clock, checked at every hook
    max_loop_iterations: int = 1_000_000  # all ``for`` iterations of one render together
    max_range: int = 100_000              # items of one ``range(...)``
    max_chars: int = 4_000_000            # characters produced in all, and of any one string or list
    max_call_depth: int = 64              # nested macro / ``loop()`` / ``caller()`` calls
    max_int_bits: int = 65_536            # the largest integer arithmetic may build


class RenderBudget:
    """What one render has used so far; each method raises ``ChatTemplateLimitError`` past its bound."""

    def __init__(self, limits: TemplateLimits):
        self.limits = limits
        self.deadline = time.monotonic() + limits.max_seconds
        self.iterations = 0
        self.chars = 0
        self.depth = 0

    def fail(self, problem: str) -> ChatTemplateLimitError:
        return ChatTemplateLimitError(f"chat template stopped: {problem}")

    def tick(self) -> None:
        """Check the deadline (called from every hook)."""
        if time.monotonic() > self.deadline:
            raise self.fail(f"rendering took longer than {self.limits.max_seconds:g} s "
                            "(a loop or recursion that does not end?)")

    def iteration(self) -> None:
        self.iterations += 1
        if self.iterations > self.limits.max_loop_iterations:
            raise self.fail(f"more than {self.limits.max_loop_iterations} loop iterations")
        self.tick()

    def output(self, n_chars: int) -> None:
        self.chars += n_chars
        if self.chars > self.limits.max_chars:
            raise self.fail(f"the output exceeds {self.limits.max_chars} characters")
        self.tick()

    def size(self, n: int, what: str) -> None:
        """A value of ``n`` characters or items is about to be built."""
        if n > self.limits.max_chars:
            raise self.fail(f"{what} would hold {n} characters or items (at most {self.limits.max_chars})")

    def int_bits(self, bits: int, what: str) -> None:
        if bits > self.limits.max_int_bits:
            raise self.fail(f"{what} would build an integer of about {bits} bits (at most {self.limits.max_int_bits})")

    def range_items(self, n: int) -> None:
        if n > self.limits.max_range:
            raise self.fail(f"range() of {n} items (at most {self.limits.max_range})")

    def enter_call(self) -> None:
        self.depth += 1
        if self.depth > self.limits.max_call_depth:
            raise self.fail(f"calls nested deeper than {self.limits.max_call_depth} (recursion through a macro?)")
        self.tick()

    def leave_call(self) -> None:
        self.depth -= 1


def format_estimate(fmt: str, values: object, limit: int) -> int:
    """An upper bound on the length of ``fmt`` formatted with ``values`` (``%`` or ``str.format``): each
    field at most as wide as the widest width anywhere (a number in ``fmt`` or an int among the values,
    which ``*`` and nested ``{}`` widths use) plus every value's text, counting no further than ``limit``."""
    fields = fmt.count("%") + fmt.count("{")
    if not fields:
        return len(fmt)
    ints = [abs(v) for v in _flat(values) if isinstance(v, int) and not isinstance(v, bool)]
    digits = max((len(run) for run in _DIGITS.findall(fmt)), default=0)
    widest = max(ints + [10 ** min(digits, 18) if digits else 0])
    return len(fmt) + fields * (widest + estimate_size(values, limit))


def _flat(values: object) -> list:
    if isinstance(values, dict):
        return list(values.values())
    if isinstance(values, (list, tuple)):
        return [x for v in values for x in (_flat(v) if isinstance(v, (list, tuple, dict)) else [v])]
    return [values]


def estimate_size(value: object, limit: int) -> int:
    """About how many characters ``str(value)`` / JSON of ``value`` has, counting no further than ``limit``
    (so that the walk itself stays bounded: a list of a million references to one long string stops early)."""
    total, stack = 0, [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 2
        elif isinstance(v, (bytes, bytearray)):
            total += len(v) + 3
        elif isinstance(v, bool) or v is None:
            total += 5
        elif isinstance(v, int):
            total += v.bit_length() // 3 + 2
        elif isinstance(v, dict):
            total += 2 + 2 * len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(v)
            stack.extend(v)
        else:
            total += 16
    return total
