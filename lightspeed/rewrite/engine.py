"""Apply rewrite rules to a program until no rule fires (a fixpoint), building a new graph.

The program's graph is never modified: every pass rebuilds the nodes bottom-up in a fresh graph,
replacing each node by what the first matching rule returns, so the original program stays the
source of truth that results are checked against.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from ..graph import Graph, Node, Program
from ..ops import Op
from ..tensor import Tensor
from .pattern import match
from .rule import Rule
from .views import compose, dense, is_identity, same_shape

MAX_PASSES = 16  # full rebuilds; each fires every applicable rule once per node
MAX_RULES_PER_NODE = 8  # rules applied in a row at one node before moving on


@dataclass
class RewriteResult:
    program: Program
    fired: Counter = field(default_factory=Counter)  # rule name -> times applied
    passes: int = 0


class RuleError(RuntimeError):
    """A rule returned a replacement of the wrong shape or dtype."""


def _index_rules(rules: list[Rule]) -> dict[Op | None, list[Rule]]:
    by_op: dict[Op | None, list[Rule]] = {}
    for r in rules:
        by_op.setdefault(r.root_op, []).append(r)
    return by_op


def _apply_rules(node: Node, by_op, frozen: bool, fired: Counter) -> Tensor:
    """The value of ``node`` after rules that match at its root (dense shape of ``node``)."""
    value = Tensor(node, dense(node.shape))
    if frozen:
        return value
    for _ in range(MAX_RULES_PER_NODE):
        cur = value.node
        if not is_identity(value.st, cur.shape):
            break  # a view of another node: its rules already ran when that node was built
        for rule in by_op.get(cur.op, []) + by_op.get(None, []):
            m = match(rule.pattern, cur)
            if m is None:
                continue
            out = rule.build(m)
            if out is None:
                continue
            if not same_shape(out.shape, cur.shape) or out.dtype is not cur.dtype:
                raise RuleError(f"rewrite rule {rule.name!r} replaced {cur!r} by a value of shape {out.shape} "
                                f"and dtype {out.dtype.name}")
            if out.node is cur and is_identity(out.st, cur.shape):
                continue
            fired[rule.name] += 1
            value = out
            break
        else:
            break
    return value


def _rebuild(program: Program, by_op, fired: Counter) -> Program:
    old = program.graph
    g = Graph()
    values: dict[int, Tensor] = {}
    frozen_ids = set(old.lowerings)
    for n in program.inputs:  # first and in order: an input no output reads any more stays an input
        values[n.id] = g.input(n.arg, n.shape, n.dtype)
    for n in program.nodes:
        if n.op is Op.INPUT:
            continue
        srcs = []
        for s, st in n.srcs:
            v = values[s.id]
            srcs.append((v.node, compose(v.st, st)))
        node = g.node(n.op, srcs, n.arg, n.dtype, n.shape)
        values[n.id] = _apply_rules(node, by_op, n.id in frozen_ids, fired)
    # facts for lowered kernels follow their nodes (their roots are never rewritten)
    for nid, info in old.lowerings.items():
        if nid in values and hasattr(info, "raw_node") and info.raw_node.id in values:
            raw = values[info.raw_node.id]
            new_raw_node, new_raw_view = raw.node, compose(raw.st, info.raw_view)
            g.lowerings[values[nid].node.id] = dataclasses.replace(info, raw_node=new_raw_node,
                                                                    raw_view=new_raw_view)
    outputs = []
    for node, st in program.outputs:
        v = values[node.id]
        outputs.append(Tensor(v.node, compose(v.st, st)))
    new = Program.build(g, outputs)
    new.inputs = [g.inputs[n.arg] for n in program.inputs]
    new.donated = set(program.donated)
    _keep_dims(new, program)
    return new


def _keep_dims(new: Program, old: Program) -> None:
    """A rewrite may drop the last use of a dimension; callers still pass it, so keep it bound."""
    names = {v.name for v in new.dims}
    extra = [v for v in old.dims if v.name not in names]
    if extra:
        new.dims = sorted(list(new.dims) + extra, key=lambda v: v.name)


def rewrite_program(program: Program, rules: list[Rule], max_passes: int = MAX_PASSES) -> RewriteResult:
    """Rewrite ``program`` with ``rules`` until a pass fires none (or ``max_passes`` passes)."""
    by_op = _index_rules(rules)
    fired: Counter = Counter()
    current = program
    passes = 0
    for passes in range(1, max_passes + 1):
        before = sum(fired.values())
        current = _rebuild(current, by_op, fired)
        if sum(fired.values()) == before:
            break
    return RewriteResult(current, fired, passes)
