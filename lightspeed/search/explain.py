"""A readable account of what a search did: ``explain(prog)`` for a program compiled with ``search=1|2``.

    prog = g.compile([y], backend="c", search=2)
    print(lightspeed.search.explain(prog))

It reports the graph candidates (modelled cost, reference check, measured time at level 2), the rewrite
rules that fired, the e-graph's saturation (windows, iterations, e-nodes, why it stopped) and its rules by
matches, what changed in the program (node and op counts), the lowered kernels kept and dropped (by the
cost model and by the template race, which names each attention region it raced with its times and the
generated kernels it summed), each attention the online-softmax rules derived with the rules it took, and
the kernel schedules tried, with the measured time of the chosen program against the heuristics' program.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (types only: the report comes from search.driver)
    from .driver import SearchReport

TOP_RULES = 8  # e-graph rules listed, by matches
RACE_REGIONS = 8  # attention regions of the template race listed one by one


def _report(what: Any) -> "SearchReport":
    report = getattr(getattr(what, "executor", None), "search_report", what)
    if report is None or not hasattr(report, "level"):
        raise ValueError("explain: pass a program compiled with search=1 or 2 (backend=\"c\"), or its "
                         "executor.search_report; this one has no search report (compiled with search=0?)")
    return report


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3g} ms"


def _check(name: str, valid, checked: bool) -> str:
    if checked:
        return "passed the reference check" if valid else "failed the reference check"
    if name == "original":
        return "(the reference)"
    return "exact rules (no check needed)" if valid else "not checked (not needed)"


def _graph(r) -> list[str]:
    out = [f"graph: chosen {r.graph}"]
    for name, cost, valid, checked in r.candidates:
        out.append(f"  candidate {name:8s} modelled {cost * 1e3:.4g} ms  {_check(name, valid, checked)}")
    if r.rewrites:
        fired = ", ".join(f"{k} x{v}" for k, v in sorted(r.rewrites.items(), key=lambda kv: -kv[1]))
        out.append(f"  rewrite rules fired: {fired}")
    else:
        out.append("  rewrite rules fired: none")
    sat = r.saturation
    if sat is not None:
        windows = f"{sat.windows} windows ({sat.distinct} distinct), " if hasattr(sat, "windows") else ""
        out.append(f"  e-graph: {windows}{sat.iterations} iterations, {sat.enodes} e-nodes, "
                   f"{'saturated' if sat.saturated else 'stopped by ' + sat.stopped_by}, {sat.seconds:.2f} s")
        top = sorted(((n, rule) for rule, n in getattr(sat, "matches", {}).items() if n), reverse=True)
        for n, rule in top[:TOP_RULES]:
            out.append(f"    {n:7d} matches  {' '.join(rule.split())[:100]}")
    m = getattr(r, "measured", None)
    if m is not None and m.seconds:
        times = ", ".join(f"{name} {_ms(t)}" for name, t in m.seconds.items())
        source = " (the stored choice: nothing compiled or timed)" if m.from_cache else ""
        out.append(f"  measured candidates: {times}; chosen {m.chosen}{source}")
    elif m is not None and m.note:
        out.append(f"  measured candidates: {m.note}")
    if m is not None and m.materialise_seconds:
        times = ", ".join(f"{name} {_ms(t)}" for name, t in m.materialise_seconds.items())
        chosen = ", ".join(m.materialise_chosen) or "the heuristics' thresholds"
        out.append(f"  measured materialisation: {times}; chosen {chosen}")
    if m is not None and m.materialise_note:
        out.append(f"  {m.materialise_note}")
    before, after = r.nodes
    change = ", ".join(f"{op} {a} -> {b}" for op, (a, b) in r.ops_changed.items()) or "no op count changed"
    if before or after:
        out.append(f"  program: {before} -> {after} nodes; {change}")
    return out


def _lowered(r) -> list[str]:
    out = []
    low = r.lowering
    if low is not None and low.decisions:
        kinds: dict[str, list[int]] = {}
        for d in low.decisions:
            k = kinds.setdefault(d.kind, [0, 0])
            k[0] += 1
            k[1] += int(d.chosen)
        out.append("lowered kernels: " + ", ".join(f"{kind} {c}/{n} chosen" for kind, (n, c) in kinds.items()))
    for nid, d in sorted((low.derived if low is not None else {}).items())[:RACE_REGIONS]:
        rules = ", ".join(f"{name} x{n}" for name, n in sorted(d.matches, key=lambda m: -m[1])
                          if n and not name.startswith("depends-"))
        out.append(f"  attention k{nid}: derived by the online-softmax rules in {d.iterations} iterations "
                   f"({d.enodes} e-nodes): {rules}")
    if r.race is not None:
        out += _race(r.race)
    return out


def _race(race) -> list[str]:
    """The template race: counts per kind, then each attention region by its kernel (the qmatmuls are many)."""
    if not race.times:  # nothing timed: why, and which attention regions could not be raced
        out = [f"template race: {race.note}"] if race.note else []
        return out + [f"  attention k{nid}: not raced: {why}" for nid, why in race.skipped.items()
                      if race.kinds.get(nid) == "attention"][:RACE_REGIONS]
    kinds: dict[str, list[int]] = {}
    for nid, kind in race.kinds.items():
        k = kinds.setdefault(kind, [0, 0, 0])
        k[0] += nid in race.times
        k[1] += nid in race.dropped
        k[2] += nid in race.skipped
    per = "; ".join(f"{kind} {n} raced, {d} dropped" + (f", {s} not raced" if s else "")
                    for kind, (n, d, s) in kinds.items())
    out = [f"template race: {len(race.times)} raced, {len(race.dropped)} templates dropped for the generated "
           f"kernels ({per})"]
    regions = [nid for nid, kind in race.kinds.items() if kind == "attention"]
    for nid in regions[:RACE_REGIONS]:
        if nid not in race.times:
            out.append(f"  attention k{nid}: not raced: {race.skipped.get(nid, '')}")
            continue
        t, g = race.times[nid]
        generated = race.kernels[nid][1]
        out.append(f"  attention k{nid}: template {_ms(t)}, generated {_ms(g)} over {len(generated)} kernels "
                   f"({' '.join(generated)}): {'dropped' if nid in race.dropped else 'kept'}")
    if len(regions) > RACE_REGIONS:
        out.append(f"  ... and {len(regions) - RACE_REGIONS} more attention regions")
    return out


def _schedule(r) -> list[str]:
    s = r.schedule
    if s is None:
        return []
    line = (f"schedules: {s.tried} configurations tried, {s.rejected} rejected, {s.from_cache} kernels from the "
            f"tuning cache, {len(s.choice)} kernels tuned ({s.stopped_by})")
    out = [line]
    if s.default_seconds is not None:
        ratio = "" if not s.tuned_seconds else f" ({s.default_seconds / s.tuned_seconds:.2f}x)"
        out.append(f"measured (the chosen graph): heuristic schedules {_ms(s.default_seconds)}, chosen "
                   f"{_ms(s.tuned_seconds)}{ratio}")
    return out


def explain(what: Any) -> str:
    """The report text (see the module docstring) of ``what``: a program compiled with ``search=1|2``
    (its ``executor.search_report`` is read) or that ``SearchReport`` itself."""
    r = _report(what)
    head = f"search level {r.level}, budget {r.budget_s:g} s, took {r.seconds:.1f} s"
    return "\n".join([head] + _graph(r) + _lowered(r) + _schedule(r)) + "\n"
