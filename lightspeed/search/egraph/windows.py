"""Repeated layers encoded once: the program cut into windows at its period, each distinct window saturated once.

A model of 30 decoder layers is one e-graph of ~20,000 e-nodes before any rule runs, past the size limit,
so saturation used to stop after one capped iteration. Its nodes (in topological order) are periodic
instead: ``find_windows`` finds a node signature (op, argument, dtype, shape and the views it reads) that
recurs at a regular gap and cuts the program at each occurrence. Each window is encoded on its own
(``encode_window``: nodes outside it are opaque leaves, numbered by first use), so the windows of two
layers have the same text; each distinct text is saturated once, within the limits, and its extracted
e-graph is renamed onto every window that has that text. Extraction then runs over the union as over one
e-graph (a leaf that another window computes is rebuilt from that window's choice).

What is lost: rewrites that span two windows (the e-graph of a window sees the values of the others as
leaves). What is kept: every rule, the lowered alternatives (each in the window of its root), the cost
model and the reference check of the result.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from ...graph import ArrayConst, Node, Program
from ...ops import Op
from .encode import Encoding, encode_window
from .extract import EGraphView, ENode, read_egraph
from .saturate import saturate, serialized

MIN_REPEATS = 3  # a period must recur at least this often to be worth cutting at


@dataclass
class WindowedSaturation:
    """What the windowed run did: ``windows`` cut, ``distinct`` texts saturated (each as ``saturate``
    reports it in ``runs``); ``saturated`` only if every distinct window saturated."""

    windows: int
    distinct: int
    iterations: int
    saturated: bool
    enodes: int  # e-nodes over the distinct e-graphs
    seconds: float
    stopped_by: str
    runs: list = field(default_factory=list)
    matches: dict = field(default_factory=dict)  # rule text -> matches, summed over every window of a text


def _signature(n: Node) -> tuple:
    arg = None if n.op is Op.INPUT or isinstance(n.arg, ArrayConst) else n.arg
    return (n.op, repr(arg), n.dtype.name, n.shape, tuple(st for _, st in n.srcs))


def find_windows(program: Program, min_repeats: int = MIN_REPEATS) -> list[list[Node]]:
    """The program's nodes cut into consecutive windows: before the first occurrence of a recurring
    signature, between consecutive occurrences, and after the last (a window of the gap's length, then
    the rest). The signature is the one whose most common gap covers the most nodes (a whole layer
    rather than half of one). One window (everything) when nothing recurs ``min_repeats`` times at one
    gap."""
    nodes = program.nodes
    where: dict[tuple, list[int]] = {}
    for i, n in enumerate(nodes):
        if n.srcs:  # (inputs and constants do not mark a layer)
            where.setdefault(_signature(n), []).append(i)
    best = None
    for pos in where.values():
        if len(pos) < min_repeats:
            continue
        # the period that covers the most nodes (a layer rather than half of one), then the longer one,
        # then the earliest (so that windows start near the start of a layer)
        gap, regular = Counter(b - a for a, b in zip(pos, pos[1:])).most_common(1)[0]
        key = (regular * gap, gap, -pos[0])
        if regular + 1 >= min_repeats and (best is None or key > best[0]):
            best = (key, pos, gap)
    if best is None:
        return [list(nodes)]
    _, pos, gap = best
    cuts = [0] + pos + [min(len(nodes), pos[-1] + gap), len(nodes)]
    return [list(nodes[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a]


def _rename(view: EGraphView, enc: Encoding, prefix: str, offsets: tuple[int, int, int]) -> EGraphView:
    """The local e-graph of a window with its numbers replaced by the global ones (node ids, view,
    select and alternative numbers shifted by ``offsets``) and its e-classes prefixed."""
    views, sels, alts = offsets
    out = EGraphView()

    def node(e: ENode) -> ENode:
        a = list(e.args)
        if e.op == "Leaf":
            a[0] = ("i", enc.numbers[a[0][1]])
        elif e.op in ("View", "MView"):
            a[1] = ("i", a[1][1] + views)
        elif e.op == "Sel":
            a[0] = ("i", a[0][1] + sels)
        elif e.op == "Lowered":
            a[1] = ("i", a[1][1] + alts)
        return ENode(e.op, tuple((k, prefix + v) if k == "c" else (k, v) for k, v in a))
    for cls, enodes in view.classes.items():
        out.classes[prefix + cls] = [node(e) for e in enodes]
    for num, cls in view.roots.items():
        out.roots[enc.numbers[num]] = prefix + cls
    return out


def saturate_windows(program: Program, rulesets: tuple[str, ...], max_iterations: int, max_enodes: int,
                     time_limit_s: float, extra_rules: str = "", alternatives=()):
    """(the union e-graph, its global ``Encoding``, ``WindowedSaturation``): each window of
    ``find_windows`` encoded alone, each distinct text saturated once (``max_enodes`` each, the time
    limit shared), the results renamed onto their windows and merged."""
    t0 = time.perf_counter()
    windows = find_windows(program)
    of_node = {n.id: k for k, w in enumerate(windows) for n in w}
    by_window: list[list] = [[] for _ in windows]
    for alt in alternatives:
        if alt.root.id in of_node:
            by_window[of_node[alt.root.id]].append(alt)
    encs = [encode_window(program, w, a) for w, a in zip(windows, by_window)]
    done: dict[str, tuple[EGraphView, object]] = {}
    distinct = list(dict.fromkeys(e.text for e in encs))
    runs = []
    for k, text in enumerate(distinct):
        left = time_limit_s - (time.perf_counter() - t0)
        eg, sat = saturate(text, rulesets, max_iterations, max_enodes, max(left / (len(distinct) - k), 0.05),
                           extra_rules)
        done[text] = (read_egraph(serialized(eg)), sat)
        runs.append(sat)
    merged = Encoding("", {n.id: n for n in program.nodes})
    union = EGraphView()
    for k, enc in enumerate(encs):
        local, _ = done[enc.text]
        offsets = (len(merged.views), len(merged.bool_edges), len(merged.alternatives))
        renamed = _rename(local, enc, f"w{k}.", offsets)
        union.classes.update(renamed.classes)
        union.roots.update(renamed.roots)
        merged.views += enc.views
        merged.bool_edges += enc.bool_edges
        merged.alternatives += enc.alternatives
        merged.encoded |= enc.encoded
    matches: dict[str, int] = {}
    for enc in encs:  # a distinct text's matches happen (once each) in every window of that text
        for rule, n in done[enc.text][1].matches.items():
            matches[rule] = matches.get(rule, 0) + n
    stops = {s.stopped_by for s in runs}
    report = WindowedSaturation(len(windows), len(distinct), max((s.iterations for s in runs), default=0),
                                all(s.saturated for s in runs), sum(s.enodes for s in runs),
                                time.perf_counter() - t0, "saturated" if stops == {"saturated"} else
                                ",".join(sorted(stops - {"saturated"})), runs, matches)
    return union, merged, report
