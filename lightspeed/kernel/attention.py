"""Streaming attention: a lowered kernel for softmax(scores) @ V found in the primitive graph.

The frontend's attention is ordinary primitives: ``scores`` (any float32 expression over a query
index i and a key index j — typically q·k * scale with a mask), the softmax as
``E = exp2((scores - max_j scores) * c)`` and ``W = E * recip(sum_j E)``, and ``out = sum_j W * V``.
Nothing marks it. This module recognises that structure with the rewrite package's pattern matcher
and proves with index arithmetic that the max, the sum and the final reduction all run over the same
key axis of the same score element (the views between the ops may permute, broadcast or reshape).

The online-softmax identity then gives a kernel that streams over blocks of keys, keeping per query
row a running max m, a running sum l and an accumulator a (rescaled by 2^((m_old - m_new) c) whenever
the max grows), so out = a / l and no score matrix (seq x seq) is ever stored. Nodes of the softmax
and of the scores that nothing else reads are therefore never materialised.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import dtypes as dt
from .. import symbolic as sym
from ..graph import ArrayConst, Node
from ..ops import BINARY, Op
from ..rewrite.pattern import P, match
from ..shape import ShapeTracker, unravel
from . import ir
from .attention_index import index_through
from .index_values import simplify
from .attention_rows import RowSelect, row_select, split_select

MAX_VALUE_WIDTH = 256  # the value accumulator of a row lives in registers/L1: [rows][width] floats
MAX_STAGED_DEPTH = 256  # the staged key block of the product form: [depth][block] floats
# a work item of at most SPLIT_ROWS query rows (decode; a short prompt or a prefill chunk over a long context)
# splits its keys into parts of SPLIT_KEYS, one work item each, when the partial results of every part fit
# SPLIT_SCRATCH_BYTES of arena (see KeySplit). 32 rows (the renderer's row block): with 3 only decode split, and
# a 2-token call of SmolLM2 (6 rows) at position 1,500 ran its attention as one item per KV head, 1.19x the time
SPLIT_KEYS = 256  # 0: never split
SPLIT_ROWS = 32
SPLIT_SCRATCH_BYTES = 16 << 20

R_PAT = (P.w * P.v).sum()
W_PAT = P.num * P.den.sum(name="s").recip()
E_PAT = ((P.x + P.mx.max(name="m") * -1) * P.const(name="c")).exp2()


@dataclass
class _Chain:
    """The matched nodes and the views that connect them (each view in its consumer's index space)."""
    r: Node
    w: Node
    w_st: ShapeTracker  # W read in R's input space
    v: Node
    v_st: ShapeTracker  # V read in R's input space
    e: Node
    num_st: ShapeTracker  # E read in W's space (numerator)
    s: Node
    s_st: ShapeTracker  # S read in W's space (through the recip)
    den_st: ShapeTracker  # E read in S's input space
    x: Node
    x_st: ShapeTracker  # X read in E's space
    m: Node
    m_st: ShapeTracker  # M read in E's space
    mx_st: ShapeTracker  # X read in M's input space
    c: float
    inner: list[Node] = field(default_factory=list)  # the softmax's own nodes
    # a safe softmax's select Sel(q, W) (attention_rows.py): the select, q and q read in R's input space
    select: Node | None = None
    q: Node | None = None
    q_st: ShapeTracker | None = None
    rows: RowSelect | None = None  # the proof that q keeps the rows with a score above -inf


def _index(st: ShapeTracker, idx, src: Node):
    return index_through(st, idx, src)  # (with the division rule a flattened batch x heads needs)


def _same_index(a, b) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(sym.same(x, y) for x, y in zip(a, b))


def _uses(idx, var: sym.Var) -> bool:
    return any(var in sym.free_vars(x) for x in idx)


def _var(name: str, size) -> sym.Var:
    return ir.loop_var(name, size)


def _match_chain(r: Node) -> _Chain | None:
    """The softmax-then-matmul structure at reduction ``r``, by node shape only (indices unchecked)."""
    if r.op is not Op.SUM_REDUCE or r.dtype is not dt.float32 or len(r.shape) < 2:
        return None
    mr = match(R_PAT, r)
    if mr is None:
        return None
    for wname, vname in (("w", "v"), ("v", "w")):  # the weights may be either operand
        w, v = mr.bindings[wname], mr.bindings[vname]
        w_node, w_st, select = w.node, w.st, None
        sel = split_select(w.node, w.st)  # a safe softmax: Sel(q, W) (attention_rows.py)
        if sel is not None:
            (w_node, w_st), select = sel[0], (w.node, sel[1][0], sel[1][1])
        mw = match(W_PAT, w_node) if w_node.op is Op.MUL else None
        if mw is None or mw.num.node is not mw.den.node:
            continue
        e = mw.num.node
        me = match(E_PAT, e)
        if me is None or me.x.node is not me.mx.node:
            continue
        c = me.values["c"]
        if not (isinstance(c, float) and math.isfinite(c) and c > 0):
            continue
        s, m = mw.s.node, me.m.node
        recip_node = next(src for src, _ in w_node.srcs if src.op is Op.RECIP)
        exp_arg = e.srcs[0][0]
        add = next(src for src, _ in exp_arg.srcs if src.op is Op.ADD)
        neg = next(src for src, _ in add.srcs if src is not me.x.node)  # (x may be a Mul itself)
        inner = [r.srcs[0][0], w_node, recip_node, s, e, exp_arg, add, neg, m]
        ch = _Chain(r, w_node, w_st, v.node, v.st, e, mw.num.st, s, mw.s.st, mw.den.st, me.x.node, me.x.st,
                    m, me.m.st, me.mx.st, c, inner)
        if select is not None:
            ch.select, ch.q, ch.q_st = select
        return ch
    return None


@dataclass
class AttentionIndex:
    """Index expressions of one instance: R's output index ``out`` (batch..., i, e), key index ``j``."""
    out: tuple
    j: sym.Var
    full: list  # R's input index (out with j inserted)
    x: list  # the score element read for (out, j)


def _indices(ch: _Chain, out, j) -> AttentionIndex | None:
    """Follow the views from R down to X for output index ``out`` and key ``j``; None unless the max, the
    sum and the matmul provably reduce over the same key axis of the same score element."""
    r = ch.r
    full = list(out)
    full.insert(r.arg, j)
    e_var = out[-1]
    wi = _index(ch.w_st, full, ch.w)
    if wi is None or _uses(wi, e_var):
        return None
    ei = _index(ch.num_st, wi, ch.e)
    si = _index(ch.s_st, wi, ch.s)
    if ei is None or si is None or _uses(si, j) or _uses(si, e_var):
        return None
    s_in = list(si)
    s_in.insert(ch.s.arg, j)
    if not sym.same(ch.s.srcs[0][1].shape[ch.s.arg], r.srcs[0][1].shape[r.arg]):
        return None
    if not _same_index(_index(ch.den_st, s_in, ch.e), ei):
        return None
    xi = _index(ch.x_st, ei, ch.x)
    mi = _index(ch.m_st, ei, ch.m)
    if xi is None or mi is None or _uses(mi, j) or _uses(xi, e_var):
        return None
    m_in = list(mi)
    m_in.insert(ch.m.arg, j)
    if not sym.same(ch.m.srcs[0][1].shape[ch.m.arg], r.srcs[0][1].shape[r.arg]):
        return None
    if not _same_index(_index(ch.mx_st, m_in, ch.x), xi):
        return None
    return AttentionIndex(tuple(out), j, full, xi)


@dataclass(eq=False)
class StreamingAttention:
    """A matched attention at reduction ``node`` (see the module docstring). ``inlined``: nodes only this
    kernel reads (never materialised); ``forced``: nodes it reads that must be buffers."""

    node: Node
    chain: _Chain
    keys: sym.sint  # the number of keys J
    width: int  # the value width (R's last axis)
    inlined: set[int] = field(default_factory=set)
    forced: set[int] = field(default_factory=set)

    @property
    def inner_nodes(self) -> list[Node]:
        """The softmax's nodes (and a safe softmax's row predicate): what the kernel computes below ``node``."""
        return self.chain.inner

    @property
    def score_nodes(self) -> tuple[Node, ...]:
        return (self.chain.x,)

    @property
    def derivation(self) -> None:
        """None: matched by the pattern (``attention_derived.DerivedAttention`` holds the e-graph's derivation)."""
        return None

    def kernels(self, former, n: Node, buf: ir.Buffer, name: str, vars_) -> list[ir.Kernel]:
        j = _var("kj", self.keys)
        idx = _indices(self.chain, list(vars_), j)
        assert idx is not None, "attention indices were proven at match time"
        score = former._read(self.chain.x, ShapeTracker.contiguous(self.chain.x.shape), idx.x)
        value = former._read(self.chain.v, self.chain.v_st, idx.full)
        return attention_kernels(former, n, buf, name, vars_, score, value, j, self.keys, self.chain.c, self.width,
                                 zero_empty_rows=self.chain.rows is not None)


def attention_kernels(former, n: Node, buf: ir.Buffer, name: str, vars_, score: ir.IR, value: ir.IR, j: sym.Var,
                      keys: sym.sint, c: float, width: int, zero_empty_rows: bool = False) -> list[ir.Kernel]:
    """The streaming attention kernel storing ``n``: out[.., i, e] = sum_j softmax_j(score) * value, the softmax
    being exp2((score - max_j score) * c) normalised; ``score`` and ``value`` are IR over ``vars_`` and ``j``."""
    split = key_split(n.shape, keys, width)
    # the score with index-valued buffers read as the index expressions they hold: the IR the mask is
    # proven from (kernel/index_values.py); it only ever reads buffers the score reads
    masks = simplify(score, _index_loads(former))
    tmpl = AttentionKernel(score, value, j, keys, c, vars_[-2], vars_[-1], width, split,
                           zero_empty_rows=zero_empty_rows, mask_score=None if masks is score else masks)
    reads = []
    for root in (score, value):
        for x in root.walk():
            if isinstance(x, (ir.Load, ir.Bytes)) and x.buf not in reads:
                reads.append(x.buf)
    zero = ir.Const(0, dt.float32)
    kern = ir.Kernel(name, buf, n.shape, tuple(vars_), zero, "attention", template=tmpl, template_reads=reads)
    if split is not None:
        kern.scratch = [ir.Buffer("temp", dt.float32, (), f"parts{n.id}", nbytes=split.nbytes)]
    return [kern]


INDEX_DTYPES = (dt.int32, dt.int64, dt.bool_)


def _index_valued(n: Node, memo: dict[int, bool]) -> bool:
    """Whether ``n`` (an integer or bool) is computed from iotas and scalar constants only: its value at an
    index is an expression of that index (through ALU ops, casts, copies and gathers)."""
    if n.id not in memo:
        memo[n.id] = False  # (a cycle is impossible; this only bounds the recursion on shared nodes)
        ok = n.dtype in INDEX_DTYPES and (
            n.op is Op.IOTA or (n.op is Op.CONST and not isinstance(n.arg, ArrayConst))
            or (n.op in BINARY or n.op in (Op.CAST, Op.CONTIGUOUS, Op.GATHER))
            and all(_index_valued(s, memo) for s, _ in n.srcs))
        memo[n.id] = ok
    return memo[n.id]


def _index_loads(former):
    """The resolver ``kernel/index_values.py`` asks: for a load of the buffer of an index-valued node, that
    node's IR at the loaded offset (the buffer holds it densely, row-major), else None."""
    nodes = {n.id: n for n in former.nodes}
    owner = {id(buf): nid for nid, buf in former.buffers.items() if nid in nodes}
    memo: dict[int, bool] = {}

    def resolve(ld: ir.Load) -> ir.IR | None:
        nid = owner.get(id(ld.buf))
        if nid is None or not _index_valued(nodes[nid], memo):
            return None
        n = nodes[nid]
        return former._compute(n, unravel(ld.offset, n.shape))
    return resolve


@dataclass(frozen=True)
class KeySplit:
    """How a work item with few query rows (decode, a short prompt) splits its keys: parts of ``part_keys`` consecutive
    keys starting at multiples of it (so where they start depends on the key index only, never on the
    number of keys, threads or rows in a batch), one work item each, whose partial results (per row:
    the running max m, sum l, NaN flag and value accumulator, and whether masked blocks were skipped)
    are merged in a fixed order. The partials live in the kernel's arena scratch: a record of ``record``
    floats per (outer index, part) (at most ``outer`` x ``parts``), laid out as m[rows], l[rows],
    bad[rows], skipped[rows], acc[rows][width]."""
    part_keys: int
    rows: int
    width: int
    outer: int
    parts: int

    @property
    def records(self) -> int:
        return self.outer * self.parts

    @property
    def record(self) -> int:
        return self.rows * (4 + self.width)

    @property
    def nbytes(self) -> int:
        return self.records * self.record * 4


def key_split(shape, keys: sym.sint, width: int) -> KeySplit | None:
    """The key split of an attention with output ``shape`` (outer..., rows, width) over ``keys`` keys, or
    None when it never has few enough rows and many enough keys, or its partials would not fit the bound
    (decided here, once: whether a row's keys are split must not depend on the batch it runs in)."""
    rows_lo = shape[-2].lo if isinstance(shape[-2], sym.Expr) else int(shape[-2])
    keys_hi = sym.upper_bound(keys)
    if SPLIT_KEYS <= 0 or rows_lo > SPLIT_ROWS or keys_hi <= SPLIT_KEYS:
        return None
    split = KeySplit(SPLIT_KEYS, SPLIT_ROWS, width, _numel(shape[:-2]), -(-keys_hi // SPLIT_KEYS))
    return split if split.nbytes <= SPLIT_SCRATCH_BYTES else None


@dataclass(eq=False)
class AttentionKernel:
    """What the C renderer needs: out[.., i, e] = sum_j softmax_j(score(i, j)) * value(j, e), where the
    softmax is exp2((score - max) * c) normalised; ``score`` and ``value`` are IR over the loop vars."""

    score: ir.IR
    value: ir.IR
    j: sym.Var
    keys: sym.sint
    c: float
    i: sym.Var
    e: sym.Var
    width: int
    split: KeySplit | None = None  # decode's key split (partials in the kernel's scratch), if any
    # a row whose every score is -inf gives 0, not NaN (a safe softmax, see attention_rows.py)
    zero_empty_rows: bool = False
    # ``score`` with index-valued loads resolved (kernel/index_values.py), equal to it at every index: the IR
    # the key mask is proven from (None: the score itself)
    mask_score: ir.IR | None = None


def _numel(shape) -> int:
    return max(sym.upper_bound(sym.prod(shape)), 1) if shape else 1


def match_attention(former) -> list[StreamingAttention]:
    """Every streaming attention in ``former``'s nodes (a ``kernel.fusion.Former``)."""
    found: list[StreamingAttention] = []
    for r in former.nodes:
        if r.op is not Op.SUM_REDUCE or not former.may_lower(r):  # (search may keep it primitive)
            continue
        ch = _match_chain(r)
        if ch is None or not sym.is_const(r.shape[-1]) or int(r.shape[-1]) > MAX_VALUE_WIDTH:
            continue
        out = [_var(f"ao{k}", s) for k, s in enumerate(r.shape)]
        keys = r.srcs[0][1].shape[r.arg]
        idx = _indices(ch, out, _var("aj", keys))
        if idx is None:
            continue
        if ch.select is not None:  # a safe softmax: prove that its select keeps the rows with a score
            ch.rows = row_select(ch.select, ch.q, ch.q_st, idx.full, idx.j, keys, ch.x, idx.x)
            if ch.rows is None:
                continue
            ch.inner = list({n.id: n for n in ch.inner + ch.rows.nodes}.values())
        found.append(StreamingAttention(r, ch, keys, int(r.shape[-1])))
    settle_private(former, found)
    return found


def settle_private(former, found: list) -> None:
    """Set ``inlined`` of the attentions ``found`` (objects with ``node``, ``keys``, ``inner_nodes`` and
    ``score_nodes``): which nodes only these kernels read is decided for all of them together (a causal mask
    shared by every layer's attention is private to the set, not to any one of them); an attention whose
    inner nodes something else reads is left with none (kernel formation then does not lower it)."""
    ok = list(found)
    while ok:
        private = private_nodes(former, ok)
        lowered = {a.node.id for a in found}
        bad = [a for a in ok if any(u.id not in private and u.id not in lowered
                                    for n in a.inner_nodes for u, _ in former.consumers.get(n.id, []))]
        if not bad:
            for a in ok:
                a.inlined = private
            break
        ok = [a for a in ok if a not in bad]


COSTLY_OPS = (Op.SUM_REDUCE, Op.MAX_REDUCE, Op.SIN, Op.EXP2, Op.LOG2, Op.SQRT)


def _costly(n: Node, limit: int = 4096) -> bool:
    """Whether computing ``n`` from inputs and constants takes a reduction or a transcendental function: the
    queries' projection and rotation are as large as the scores when the head width equals the number of
    keys, but recomputing them for every score would cost a projection per score."""
    seen: set[int] = set()
    stack = [n]
    while stack and len(seen) < limit:
        x = stack.pop()
        if x.id in seen or x.op in (Op.INPUT, Op.CONST):
            continue
        seen.add(x.id)
        if x.op in COSTLY_OPS:
            return True
        stack.extend(s for s, _ in x.srcs)
    return len(seen) >= limit


def private_nodes(former, atts: list) -> set[int]:
    """Nodes only these kernels read: the softmax's nodes, and the nodes of the scores at least as large
    as a seq x seq score matrix (what a materialising plan would store)."""
    outputs = {n.id for n in former.outputs}
    private: set[int] = set()
    candidates: dict[int, Node] = {}
    for a in atts:
        private |= {n.id for n in a.inner_nodes}
        big = _numel(a.node.shape[-2:-1]) * max(sym.upper_bound(a.keys), 1)
        # below the scores' own reduction (q . k over the head width), what is costly to compute (a projection,
        # a rotation) is stored once rather than recomputed for every score: the queries are as large as the
        # scores when the head width equals the number of keys
        scores = {x.id for x in a.score_nodes}
        stack = [(x, False) for x in a.score_nodes]
        while stack:
            n, below = stack.pop()
            if n.id in candidates or n.op in (Op.INPUT, Op.CONST):
                continue
            reduces = n.op in (Op.SUM_REDUCE, Op.MAX_REDUCE)
            if below and _costly(n):
                continue
            if n.id in scores or _numel(n.shape) >= big:
                candidates[n.id] = n
                stack.extend((s, below or reduces) for s, _ in n.srcs)
    # consumers come later in topological order: decide from the last node back
    order = {n.id: k for k, n in enumerate(former.nodes)}
    for n in sorted(candidates.values(), key=lambda n: -order.get(n.id, -1)):
        users = former.consumers.get(n.id, [])
        if users and n.id not in outputs and all(u.id in private for u, _ in users):
            private.add(n.id)
    return private - {a.node.id for a in atts} - outputs
