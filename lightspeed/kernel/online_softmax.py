"""Streaming attention derived by an e-graph: a node's value in the key-vector language, rewritten by rules.

``kernel/attention.py`` recognises one formulation of softmax(scores) @ V. This module recognises the
computation instead of a formulation: a node is translated, at a symbolic output index, into the key-vector
language of ``search/egraph/rules/online.egg`` (every value there is a function of one key index ``j``, or
a scalar that does not depend on it), and egglog rewrites it with the identities online softmax rests on:
the softmax's normaliser taken out of the weighted sum, sums and maxima split into blocks of keys, and the
rescaling 2^((a - M)c) = 2^((a - m)c) 2^((m - M)c) at each block's max. When the node's e-class then holds
the blocked form the streaming kernel computes, the node is that kernel, with the score and value terms
the e-graph found; whatever the formulation (normalised before or after the weighted sum, the scale on
both terms, a log-sum-exp), as long as the rules reach it.

The translation follows views with index arithmetic (``attention_index.index_through``): a node read at
an index is an elementwise float32 op of its sources read at theirs, a sum or max over an axis whose
length is the number of keys (the key index takes that axis; the reduction's own index must not use the
key), or otherwise a leaf ``(At k)``: that node's value at that index, computed or loaded as kernel
formation does. Two leaves are the same term only when they read the same node at the same index, so
the max, the sum and the weighted sum agree on the score element by construction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..graph import ArrayConst, Node
from ..ops import Op
from ..shape import ShapeTracker
from . import ir
from .attention_index import index_through
from .attention_rows import any_of_element

RULES = Path(__file__).resolve().parent.parent / "search" / "egraph" / "rules" / "online.egg"
ELEMENTWISE = {Op.ADD: "Add", Op.MUL: "Mul", Op.RECIP: "Recip", Op.EXP2: "Exp2", Op.LOG2: "Log2", Op.SQRT: "Sqrt"}
NAME_OPS = {v: k for k, v in ELEMENTWISE.items()}
REDUCTIONS = {Op.SUM_REDUCE: "KSum", Op.MAX_REDUCE: "KMax"}
MAX_TERMS = 256  # a larger translation is not a softmax-weighted sum worth the rewriting
MAX_ITERATIONS = 16  # the rules reach the blocked form in 8 iterations on every formulation tested
MAX_ENODES = 20_000


@dataclass
class KeyTerms:
    """A node's value at ``index`` as a term of the key-vector language, and what the term refers to."""

    text: str  # the root's term
    leaves: list[tuple[Node, tuple]] = field(default_factory=list)  # (At k): node k read at index k
    scalar: set[int] = field(default_factory=set)  # leaves whose index does not use the key
    # nodes the kernel replaces (the root included): reductions over the keys, ops above them, selects taken
    # as constants with their predicates
    inner: dict[int, Node] = field(default_factory=dict)
    # selects taken as constants (``_Translator.select``): ("nan" | "rows", the element's term), which the
    # derivation's score must equal
    guards: list[tuple[str, str]] = field(default_factory=list)
    maxed: dict[int, Node] = field(default_factory=dict)  # what the maxima over the keys read (the scores)


def _uses(idx, var: sym.Var) -> bool:
    return any(var in sym.free_vars(x) for x in idx)


def _scalar_const(n: Node) -> bool:
    return n.op is Op.CONST and not isinstance(n.arg, ArrayConst) and n.dtype is dt.float32 and not n.shape


class _Translator:
    def __init__(self, keys: sym.sint, j: sym.Var, leaves: frozenset[int]):
        self.keys, self.j, self.stop = keys, j, leaves
        self.terms: dict[tuple, str] = {}
        self.out = KeyTerms("")
        self.ops: dict[int, tuple[Node, bool]] = {}  # elementwise nodes translated: whether above a reduction

    def settle_inner(self) -> None:
        """Add to ``inner`` the elementwise nodes the kernel replaces: those above a reduction over the keys, and
        those that read what a max over the keys reads (the scores) however indirectly (a scale applied to
        them). The others (the value's projection, a bias) the kernel recomputes as it reads them, and other
        kernels may read them too."""
        marked = set(self.out.maxed)
        changed = True
        while changed:
            changed = False
            for nid, (n, above) in self.ops.items():
                if nid not in marked and (above or any(s.id in marked for s, _ in n.srcs)):
                    marked.add(nid)
                    changed = True
        for nid, (n, _) in self.ops.items():
            if nid in marked and nid not in self.out.maxed:
                self.out.inner[nid] = n

    def leaf(self, n: Node, idx) -> str:
        k = len(self.out.leaves)
        self.out.leaves.append((n, tuple(idx)))
        if not _uses(idx, self.j):
            self.out.scalar.add(k)
        return f"(At {k})"

    def term(self, n: Node, idx) -> str:
        key = (n.id, tuple(str(x) for x in idx))
        t = self.terms.get(key)
        if t is None:
            if len(self.terms) >= MAX_TERMS:
                raise _TooLarge
            t = self.terms[key] = self._term(n, list(idx))
        return t

    def _term(self, n: Node, idx) -> str:
        if _scalar_const(n):
            return f"(Num {dt.float32_bits(n.arg)})"
        if n.id in self.stop:
            return self.leaf(n, idx)
        if n.op is Op.MUL and n.dtype is dt.float32 and sorted(s.dtype.name for s, _ in n.srcs) == ["bool", "float32"]:
            return self.select(n, idx)
        if n.dtype is not dt.float32 or any(s.dtype is not dt.float32 for s, _ in n.srcs):
            return self.leaf(n, idx)
        if n.op in ELEMENTWISE or n.op is Op.CONTIGUOUS:
            args = []
            for s, st in n.srcs:
                sidx = index_through(st, idx, s)
                if sidx is None:  # (a padded view: the op does not commute with its zeros)
                    return self.leaf(n, idx)
                args.append(self.term(s, sidx))
            term = args[0] if n.op is Op.CONTIGUOUS else f"({ELEMENTWISE[n.op]} {' '.join(args)})"
            self.ops[n.id] = (n, "(KSum " in term or "(KMax " in term)
            return term
        if n.op in REDUCTIONS:
            src, st = n.srcs[0]
            if not sym.same(st.shape[n.arg], self.keys) or _uses(idx, self.j):
                return self.leaf(n, idx)
            full = list(idx)
            full.insert(n.arg, self.j)
            sidx = index_through(st, full, src)
            if sidx is None or not _uses(sidx, self.j):
                return self.leaf(n, idx)
            body = self.term(src, sidx)
            self.out.inner[n.id] = n
            if n.op is Op.MAX_REDUCE:
                self.out.maxed[src.id] = src
            return f"({REDUCTIONS[n.op]} {body})"
        return self.leaf(n, idx)

    def select(self, n: Node, idx) -> str:
        """A select ``Sel(b, t)`` by a bool proven (``attention_rows.any_of_element``) to be, over the keys of one
        element ``x``, "some x is NaN" (PyTorch's max propagating NaN) or "some x is above -inf" (the safe
        softmax's rows that see a key), or its negation: in real arithmetic, where no value is NaN or infinite,
        that bool is a constant, so the select is ``t`` or 0. ``x`` is kept as a guard (``KeyTerms.guards``):
        ``derive`` admits the derivation only if it is the score, and the kernel then gives a row with a NaN
        score NaN, and a row whose every score is -inf 0 (``zero_empty_rows``), as the select does. Else a leaf."""
        (b, bst), = [(s, st) for s, st in n.srcs if s.dtype is dt.bool_]
        (t, tst), = [(s, st) for s, st in n.srcs if s.dtype is dt.float32]
        bi, ti = index_through(bst, idx, b), index_through(tst, idx, t)
        proof = None if bi is None or ti is None else any_of_element(b, bi, self.j, self.keys)
        if proof is None or proof.x.dtype is not dt.float32:
            return self.leaf(n, idx)
        if np.array_equal(proof.truth, np.isnan(proof.points)):
            kind, holds = "nan", False  # (no value is NaN in real arithmetic)
        elif np.array_equal(proof.truth, ~np.isneginf(proof.points)):
            kind, holds = "rows", True  # (every value is above -inf)
        else:
            return self.leaf(n, idx)
        self.out.guards.append((kind, self.term(proof.x, proof.x_index)))
        self.out.inner[n.id] = n
        for m in proof.nodes:
            self.out.inner[m.id] = m
        return self.term(t, ti) if holds != proof.negated else f"(Num {dt.float32_bits(0.0)})"


class _TooLarge(Exception):
    pass


def translate(n: Node, index, keys: sym.sint, j: sym.Var, leaves: frozenset[int] = frozenset()) -> KeyTerms | None:
    """``n`` at ``index`` in the key-vector language, reductions over ``keys`` keys taking the key index
    ``j``, the nodes ``leaves`` (another lowered kernel's) always leaves; None past ``MAX_TERMS`` terms."""
    tr = _Translator(keys, j, leaves)
    try:
        tr.out.text = tr.term(n, index)
    except _TooLarge:
        return None
    tr.settle_inner()
    return tr.out


@dataclass(frozen=True)
class Derivation:
    """What the e-graph found: the node is sum_j softmax_j(score) * value, exp2((score - max) * scale)."""

    score: tuple  # a term as nested tuples: ("At", k), ("Num", bits), (op name, args...)
    value: tuple
    scale: float  # NaN where the scale is not a constant (the kernel needs one)
    iterations: int
    enodes: int
    matches: tuple[tuple[str, int], ...]  # rule name, matches applied
    zero_empty_rows: bool = False  # a row whose every score is -inf gives 0 (a safe softmax's select)


def _parse(text: str):
    """An egglog term (s-expression) as nested tuples; integers as ints."""
    tokens = text.replace("(", " ( ").replace(")", " ) ").split()
    pos = 0

    def item():
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok != "(":
            return int(tok) if tok.lstrip("-").isdigit() else tok
        out = []
        while tokens[pos] != ")":
            out.append(item())
        pos += 1
        return tuple(out)
    return item()


@lru_cache(maxsize=1)
def _rules_text() -> str:
    return RULES.read_text()


def _egglog():
    try:
        from egglog import bindings
    except ImportError:  # pragma: no cover - egglog is a dependency; without it only the matcher runs
        return None
    return bindings


def derive(terms: KeyTerms, max_iterations: int = MAX_ITERATIONS, extra_rules: str = "") -> Derivation | None:
    """Rewrite ``terms`` with the rules of ``online.egg`` (and ``extra_rules``, egglog text in the ``online``
    rule set) until its root's e-class holds the blocked online-softmax form, or until saturation or a
    limit (None). The score and value terms found (smallest first) are checked on random values against
    the translation itself (``agrees``): a derivation that does not compute it is refused (None)."""
    bindings = _egglog()
    if bindings is None:
        return None
    eg = bindings.EGraph()
    facts = [f"(set (Root 0) {terms.text})"] + [f"(Scalar (At {k}))" for k in sorted(terms.scalar)]
    facts += [f"(set (Guard {k}) {g})" for k, (_, g) in enumerate(terms.guards)]
    eg.run_program(*eg.parse_program(_rules_text() + "\n" + extra_rules + "\n" + "\n".join(facts)))
    matches: dict[str, int] = {}
    for it in range(1, max_iterations + 1):
        updated = False
        for o in eg.run_program(*eg.parse_program("(run online 1)")):
            report = getattr(o, "report", None)
            if report is not None:
                updated |= bool(report.updated)
                for rule, count in (getattr(report, "num_matches_per_rule", None) or {}).items():
                    matches[rule] = matches.get(rule, 0) + int(count)
        found = _found(eg)
        if found is not None:
            score, value, scale = found
            d = Derivation(score, value, scale, it, _size(eg), tuple(sorted(matches.items())),
                           zero_empty_rows=any(kind == "rows" for kind, _ in terms.guards))
            return d if agrees(d, terms) and _guards_are_the_score(eg, len(terms.guards)) else None
        if not updated or _size(eg) >= MAX_ENODES:
            return None
    return None


def _found(eg):
    try:
        out = eg.run_program(*eg.parse_program("(extract (StreamScore))\n(extract (StreamValue))\n"
                                               "(extract (StreamScale))"))
    except Exception:  # egglog raises its own error for a function with no value yet: not derived
        return None
    score, value, scale = (_parse(o.termdag.to_string(o.term)) for o in out[-3:])
    return score, value, constant_value(scale)


def constant_value(term) -> float:
    """The float32 value of a term of constants and elementwise ops (NaN when it reads a leaf)."""
    return float(_value(term, {}, 1, np.float32))


def _guards_are_the_score(eg, guards: int) -> bool:
    for k in range(guards):
        try:
            eg.run_program(*eg.parse_program(f"(check (= (Guard {k}) (StreamScore)))"))
        except Exception:  # egglog's check fails with its own error: the guarded element is not the score
            return False
    return True


def _size(eg) -> int:
    return sum(c for o in eg.run_program(*eg.parse_program("(print-size)")) for _, c in (getattr(o, "sizes", []) or []))


def elementwise_only(term) -> bool:
    """Whether a term is made of leaves, constants and elementwise ops (what a kernel can compute per key)."""
    if term[0] in ("At", "Num"):
        return True
    return term[0] in NAME_OPS and all(elementwise_only(a) for a in term[1:])


def leaves_of(term) -> list[int]:
    if term[0] == "At":
        return [term[1]]
    if term[0] == "Num":
        return []
    return [k for a in term[1:] for k in leaves_of(a)]


def term_ir(former, term, leaves: list[tuple[Node, tuple]]) -> ir.IR:
    """The IR of an elementwise term, its leaves read as kernel formation reads nodes (a buffer's load, or
    the node computed in place)."""
    if term[0] == "At":
        n, idx = leaves[term[1]]
        return former._read(n, ShapeTracker.contiguous(n.shape), list(idx))
    if term[0] == "Num":
        return ir.Const(dt.bits_float32(term[1]), dt.float32)
    return ir.Alu(NAME_OPS[term[0]], tuple(term_ir(former, a, leaves) for a in term[1:]), dt.float32)


CHECK_KEYS = (1, 6, 37)  # key counts the check draws values for (one key: a single block)
CHECK_RTOL = 1e-6


UNARY = {Op.RECIP: np.reciprocal, Op.EXP2: np.exp2, Op.LOG2: np.log2, Op.SQRT: np.sqrt}


def _value(term, leaves: dict[int, np.ndarray], keys: int, ftype=np.float64):
    """A term's value with ``leaves`` (by number; a missing one is NaN) over ``keys`` keys, every op rounded to
    ``ftype``."""
    head = term[0]
    if head == "At":
        return leaves.get(term[1], ftype(math.nan))
    if head == "Num":
        return ftype(dt.bits_float32(term[1]))
    if head in ("KSum", "KMax"):
        body = np.broadcast_to(_value(term[1], leaves, keys, ftype), (keys,))
        return body.sum() if head == "KSum" else body.max()
    args = [_value(a, leaves, keys, ftype) for a in term[1:]]
    op = NAME_OPS[head]
    with np.errstate(all="ignore"):
        if op is Op.ADD:
            return args[0] + args[1]
        if op is Op.MUL:
            return args[0] * args[1]
        return UNARY[op](args[0])


def agrees(d: Derivation, terms: KeyTerms, seed: int = 0) -> bool:
    """Whether ``d`` computes what ``terms`` computes, in float64 on random leaf values (a key vector for a
    leaf that depends on the key, else a scalar) for each of ``CHECK_KEYS`` key counts: a planted or
    mistaken rule that reaches the blocked form with the wrong score, value or scale is caught here."""
    if not math.isfinite(d.scale):
        return False
    rng = np.random.default_rng(seed)
    root = _parse(terms.text)
    with np.errstate(all="ignore"):
        for keys in CHECK_KEYS:
            leaves = {k: (rng.uniform(0.25, 2.0) if k in terms.scalar else rng.uniform(0.25, 2.0, keys))
                      for k in range(len(terms.leaves))}
            want = _value(root, leaves, keys)
            score = np.broadcast_to(_value(d.score, leaves, keys), (keys,))
            value = np.broadcast_to(_value(d.value, leaves, keys), (keys,))
            w = np.exp2((score - score.max()) * d.scale)
            got = (w * value).sum() / w.sum()
            if np.ndim(want) != 0 or not np.isclose(got, want, rtol=CHECK_RTOL, atol=0):
                return False
    return True
