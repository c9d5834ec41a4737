"""Run rule sets over an encoded program with egglog, within iteration, size and time limits."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

RULES_DIR = Path(__file__).with_name("rules")
RULESETS = ("exact", "rounding", "lowered")  # files rules/<name>.egg, each declaring ``:ruleset <name>``
RULES_PER_SET = 10  # about how many rules a set holds (sizes the per-rule match limit)
CHUNK = 50  # commands of the encoding per call into egglog (one call with all of them is quadratic)


class EgglogMissing(ImportError):
    """The ``egglog`` package is not installed (``pip install egglog``)."""


def _bindings():
    try:
        from egglog import bindings
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise EgglogMissing("graph-level search needs the egglog package: pip install egglog") from e
    return bindings


def rules_text(rulesets: tuple[str, ...]) -> str:
    """The schema and the rule files of ``rulesets``."""
    unknown = [r for r in rulesets if r not in RULESETS]
    if unknown:
        raise ValueError(f"unknown e-graph rule sets {unknown}; known: {list(RULESETS)}")
    parts = [(RULES_DIR / "schema.egg").read_text()]
    parts += [(RULES_DIR / f"{r}.egg").read_text() for r in rulesets]
    return "\n".join(parts)


@dataclass
class Saturation:
    """What a run did: iterations, whether it saturated, e-nodes at the end, why it stopped."""

    iterations: int
    saturated: bool
    enodes: int
    seconds: float
    stopped_by: str  # saturated | iterations | enodes | time
    matches: dict = field(default_factory=dict)  # rule text -> matches applied, over all iterations


def _count(out, matches: dict) -> bool:
    """Add the run reports' matches per rule in ``out`` to ``matches``; whether any report updated."""
    updated = False
    for o in out:
        report = getattr(o, "report", None)
        if report is None:
            continue
        updated |= bool(report.updated)
        for rule, n in (getattr(report, "num_matches_per_rule", None) or {}).items():
            matches[rule] = matches.get(rule, 0) + int(n)
    return updated


def _size(eg, bindings) -> int:
    out = eg.run_program(*eg.parse_program("(print-size)"))
    total = 0
    for o in out:
        for _, count in getattr(o, "sizes", []) or []:
            total += count
    return total


def saturate(text: str, rulesets: tuple[str, ...] = RULESETS, max_iterations: int = 8,
             max_enodes: int = 20_000, time_limit_s: float = 2.0, extra_rules: str = ""):
    """(the egglog EGraph, Saturation) after running ``rulesets`` over the terms in ``text``.

    ``extra_rules`` is more egglog rule text (in the ``exact`` or ``rounding`` rule sets). The ``lowered``
    rule set runs once, first: it only turns the encoder's facts into alternatives, and no other rule
    makes new facts. The other rule sets run one iteration at a time; the loop stops when nothing
    changes, or at the first limit reached (an iteration that starts is finished, so limits are checked
    between iterations)."""
    b = _bindings()
    eg = b.EGraph()
    t0 = time.perf_counter()
    eg.run_program(*eg.parse_program(rules_text(rulesets) + "\n" + extra_rules))
    lines = text.splitlines()  # (encode writes one command per line)
    for k in range(0, len(lines), CHUNK):
        eg.run_program(*eg.parse_program("\n".join(lines[k:k + CHUNK])))
    lowered = "lowered" in rulesets
    matches: dict[str, int] = {}
    if lowered:
        _count(eg.run_program(*eg.parse_program("(run lowered 1)")), matches)
    rulesets = tuple(r for r in rulesets if r != "lowered")
    if not rulesets:
        return eg, Saturation(int(lowered), True, _size(eg, b), time.perf_counter() - t0, "saturated", matches)
    stopped, iterations, enodes = "iterations", 0, _size(eg, b)
    for iterations in range(1, max_iterations + 1):
        # a back-off scheduler caps each rule's matches per iteration, so one iteration cannot grow the
        # e-graph far past the size limit (associativity alone grows it exponentially)
        limit = max(50, (max_enodes - enodes) // (4 * RULES_PER_SET * len(rulesets)))
        runs = " ".join(f"(run-with bo {r})" for r in rulesets)
        step = eg.parse_program(f"(run-schedule (let-scheduler bo (back-off :match-limit {limit})) (seq {runs}))")
        updated = _count(eg.run_program(*step), matches)
        before, enodes = enodes, _size(eg, b)
        if updated and enodes == before:
            # the back-off scheduler reports an update while it holds banned rules back, also when nothing
            # is left to add: one iteration under a fresh scheduler (no bans yet, a match limit of the room
            # left, so it cannot explode) tells whether anything is
            room = max(limit, max_enodes - enodes)
            check = eg.parse_program(f"(run-schedule (let-scheduler chk (back-off :match-limit {room})) "
                                     f"(seq {' '.join(f'(run-with chk {r})' for r in rulesets)}))")
            updated = _count(eg.run_program(*check), matches)
            enodes = _size(eg, b)
        if not updated:
            stopped = "saturated"
            break
        if enodes >= max_enodes:
            stopped = "enodes"
            break
        if time.perf_counter() - t0 >= time_limit_s:
            stopped = "time"
            break
    return eg, Saturation(iterations, stopped == "saturated", enodes, time.perf_counter() - t0, stopped, matches)


def serialized(eg) -> dict:
    """The e-graph as a dict: ``nodes`` (id -> op, children, eclass) and ``class_data``."""
    return json.loads(eg.serialize([]).to_json())
