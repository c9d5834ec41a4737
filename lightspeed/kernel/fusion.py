"""Kernel formation: decide which nodes become buffers and inline everything else.

A node is *materialised* (gets a buffer and a kernel) when it must exist: a graph
output, a Scatter or Contiguous, a reduction read through a broadcasting view or by
several consumers, or an elementwise value expensive enough that recomputing it
for each consumer would cost more than storing it. Every other node is inlined
into the kernels that read it, through the index arithmetic of the views on the
way, so a permute, expand, slice or pad costs no copy and a broadcast Mul feeding
a SumReduce (a matmul) is one reduction loop.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .. import dtypes as dt
from .. import symbolic as sym
from ..graph import ArrayConst, Node, Program
from ..ops import BINARY, REDUCE, UNARY, Op
from ..shape import ShapeTracker, unravel
from ..symbolic import sint
from . import ir
from .ir import coefficient, dense_offset, loop_var
from .materialise import MaterialisePoint, node_signature, shape_text
from .matmul_form import match_matmul
from .quantized import (QuantizedMatmul, activation_mode, activation_scratch_layout, match_quantized_matmul,
                        quantized_rows_bound, quantizes_activations)

# --- lowered kernels (search hook): functions (Former) -> objects with ``node``, ``inlined`` (node ids only
# the lowered kernel reads: never materialised), ``forced`` (node ids it needs as buffers) and
# ``kernels(former, node, buf, name, vars_)``. See kernel/attention.py.
from .attention import match_attention  # noqa: E402
from .attention_derived import match_derived_attention  # noqa: E402

# the pattern first (cheap); the e-graph's derivation for the attentions it does not match
LOWERED_MATCHERS = [match_attention, match_derived_attention]

# Heuristic thresholds (a schedule search may tune these later).
RECOMPUTE_MAX_COST = 12  # a value read by several kernels is recomputed when cheaper than this
EXPAND_MAX_COST = 8  # a value read through a broadcast is recomputed when cheaper than this
TRANSCENDENTAL = {Op.EXP2: 4, Op.LOG2: 4, Op.SIN: 8, Op.SQRT: 2, Op.RECIP: 2}
# a value is recomputed by its readers, when a choice asks for it, only below this cost (the generated code of
# each reader grows with it)
RECOMPUTE_CAP = 256


@dataclass
class KernelPlan:
    """Kernels in execution order and the buffers they use."""

    kernels: list[ir.Kernel]
    inputs: list[ir.Buffer]
    consts: list[tuple[ir.Buffer, ArrayConst]]
    outputs: list[ir.Buffer]  # one per program output (may repeat a buffer)
    temps: list[ir.Buffer] = field(default_factory=list)
    arena_bytes: int = 0
    dims: list[sym.Var] = field(default_factory=list)
    # C backend: constants some kernels read in a layout of their own, made at load (backend/c/repack.py);
    # each takes a pointer slot after all the others
    repacks: list = field(default_factory=list)
    # the nodes whose buffer was a choice (materialise.py), by signature, as formation met them
    materialise_points: list[MaterialisePoint] = field(default_factory=list)


def _expands(st: ShapeTracker) -> bool:
    """True if the view reads some element more than once (a stride-0 broadcast)."""
    for v in st.views:
        for s, stv in zip(v.shape, v.strides):
            if sym.same(stv, 0) and not sym.same(s, 1):
                return True
    return False


def _injective_plain(st: ShapeTracker) -> bool:
    return len(st.views) == 1 and st.views[0].mask is None and not _expands(st)


class Former:
    """Builds a KernelPlan from a Program."""

    def __init__(self, program: Program, use_templates: bool = True, activations: str = "float",
                 lower_only: frozenset[int] | None = None, gemm: bool = True, byte_loads: bool = False,
                 fuse_reduced: bool = False, recompute_max_cost: int = RECOMPUTE_MAX_COST,
                 expand_max_cost: int = EXPAND_MAX_COST, materialise: Mapping[str, bool] | None = None):
        self.program = program
        # which values get a buffer: one read by several kernels (or through a broadcast) is recomputed by each
        # reader when it costs less than these, unless ``materialise`` decides that point (signature -> store;
        # search level 2 measures such decisions: search/measured.py)
        self.recompute_max_cost, self.expand_max_cost = recompute_max_cost, expand_max_cost
        self.materialise = dict(materialise or {})
        self.points: dict[str, MaterialisePoint] = {}
        self._signatures: dict[tuple[int, int], str] = {}
        # a value read only by one reduction, through a plain view, is computed inside the reduction loop
        # however expensive (a product with a dequantized weight): storing it saves no work, only memory
        self.fuse_reduced = fuse_reduced
        self.generate_gemm = gemm  # matmul-like reductions become "gemm" kernels (packed, register-blocked)
        self.byte_loads = byte_loads  # float16 decodes from bytes become ir.Bytes loads (Graph.byte_values)
        self.lower_only = lower_only  # None: every match lowers; else only matches at these node ids (search)
        self.activations = activation_mode(activations)
        self.graph = program.graph
        self.outputs: list[Node] = []
        # an output that is a plain reshape of a computed node is that node's buffer under another shape,
        # so other kernels read the stored values instead of recomputing them (e.g. new KV-cache rows)
        self.output_shapes: dict[int, tuple] = {}

        def claim(n: Node, shape) -> bool:  # n's buffer holds this output's shape (first claim wins)
            return _same_shape(self.output_shapes.setdefault(n.id, shape), shape)

        for node, st in program.outputs:
            stored = node.op not in (Op.INPUT, Op.CONST, Op.IOTA) and st.is_contiguous \
                and sym.same(sym.prod(st.shape), sym.prod(node.shape)) and claim(node, st.shape)
            if not stored:
                node = self.graph.node(Op.CONTIGUOUS, [(node, st)], None, node.dtype, st.shape)
                # the copy is hash-consed: it can be a node another output already stores under another
                # shape (x and x.contiguous().unsqueeze(0)); then copy once more
                while not claim(node, st.shape):
                    node = self.graph.node(Op.CONTIGUOUS, [(node, ShapeTracker.contiguous(node.shape))], None,
                                           node.dtype, node.shape)
            self.outputs.append(node)
        seen: set[int] = set()
        order: list[Node] = []
        self._topo(self.outputs, seen, order)
        self.nodes = order
        self.consumers: dict[int, list[tuple[Node, ShapeTracker]]] = {n.id: [] for n in order}
        for n in order:
            for s, st in n.srcs:
                self.consumers[s.id].append((n, st))
        self.buffers: dict[int, ir.Buffer] = {}
        self.costs: dict[int, int] = {}
        self.counter = 0
        # lowered kernels offered for primitive subgraphs (quantized matmuls), found before any decision
        lowerings = self.graph.lowerings
        self.decoded_weights = {nid for nid in lowerings if nid in self.consumers}
        # ... nor are the parts of its decode that read only the raw weight bytes (a block's scale): stored,
        # they would be recomputed into a buffer every call; inlined, they are a load per block of the kernel
        # that reads the weight (hoisted out of its inner loop)
        self.decode_parts = self._constant_parts(self.decoded_weights)
        self.quantized: dict[int, QuantizedMatmul] = {}
        if use_templates:
            for n in order:
                q = match_quantized_matmul(n, lowerings)
                if q is not None and self.may_lower(n):
                    self.quantized[n.id] = q
        self.forced = {q.x.id for q in self.quantized.values()}
        # --- lowered kernels (search hook), see LOWERED_MATCHERS
        self.lowered: dict[int, object] = {}
        self.inlined: set[int] = set()
        if use_templates:
            for matcher in LOWERED_MATCHERS:
                for low in matcher(self):
                    if not self.may_lower(low.node):
                        continue
                    self.lowered[low.node.id] = low
                    self.inlined |= low.inlined
                    self.forced |= low.forced
        # Scatters into a donated input that nothing else reads write that input in place (no copy)
        self.in_place: dict[int, Node] = {}
        for n in order:
            if n.op is Op.SCATTER:
                dest, st = n.srcs[0]
                if (dest.op is Op.INPUT and dest.arg in program.donated and st.is_contiguous
                        and sym.same(sym.prod(st.shape), sym.prod(dest.shape))
                        and len(self.consumers[dest.id]) == 1):
                    self.in_place[n.id] = dest

    def may_lower(self, n: Node) -> bool:
        """Whether a lowered kernel matched at ``n`` may replace its primitive form (graph search decides
        per node with ``lower_only``; matchers that decide things for a set of matches ask first)."""
        return self.lower_only is None or n.id in self.lower_only

    def _constant_parts(self, roots: set[int]) -> set[int]:
        """Nodes below ``roots`` (exclusive) that depend on constants only and are read only within them."""
        by_id = {n.id: n for n in self.nodes}
        below: set[int] = set()
        stack = [s for r in roots for s, _ in by_id[r].srcs]
        while stack:
            n = stack.pop()
            if n.id in below or n.op in (Op.INPUT, Op.CONST, Op.IOTA):
                continue
            below.add(n.id)
            stack += [s for s, _ in n.srcs]
        constant = {nid for nid in below if self._depends_on_constants_only(by_id[nid], {})}
        inside = roots | constant
        return {nid for nid in constant if all(c.id in inside for c, _ in self.consumers[nid])}

    @staticmethod
    def _depends_on_constants_only(n: Node, memo: dict[int, bool]) -> bool:
        if n.id not in memo:
            memo[n.id] = n.op is not Op.INPUT and all(
                Former._depends_on_constants_only(s, memo) and not sym.free_vars(*st.shape) for s, st in n.srcs)
        return memo[n.id]

    @staticmethod
    def _topo(roots, seen, order):
        stack = [(r, False) for r in reversed(roots)]
        while stack:
            n, done = stack.pop()
            if done:
                order.append(n)
                continue
            if n.id in seen:
                continue
            seen.add(n.id)
            stack.append((n, True))
            for s, _ in reversed(n.srcs):
                if s.id not in seen:
                    stack.append((s, False))

    # decisions ------------------------------------------------------------------
    def _cost(self, n: Node) -> int:
        if n.id in self.buffers or n.op in (Op.INPUT, Op.CONST, Op.IOTA):
            return 1
        if n.id in self.costs:
            return self.costs[n.id]
        own = TRANSCENDENTAL.get(n.op, 1)
        c = own + sum(self._cost(s) for s, _ in n.srcs)
        if n.op in REDUCE:
            c = 1 << 20
        self.costs[n.id] = c
        return c

    def _must_materialise(self, n: Node, is_output: bool) -> bool:
        if is_output or n.op in (Op.SCATTER, Op.CONTIGUOUS) or n.id in self.forced or n.id in self.quantized:
            return True
        if n.id in self.lowered:  # --- lowered kernels (search hook)
            return True
        if n.id in self.inlined:
            return False
        if n.id in self.decoded_weights or n.id in self.decode_parts:  # never stored: decode where it is read
            return False
        if n.op in (Op.CONST, Op.IOTA):
            return False
        uses = self.consumers[n.id]
        if n.op in REDUCE:
            if len(uses) != 1 or not _injective_plain(uses[0][1]):
                return True
            # computed inside its one reader unless its own schedule needs a buffer: storing it is a choice
            return self._reduce_schedule(n) in ("tiled", "gemm") or self._choose(n, False, may_recompute=False)
        cost = self._cost(n)
        if cost >= (1 << 20):  # contains an inlined reduction
            if len(uses) > 1 or any(not _injective_plain(st) for _, st in uses):
                return True
            return self._choose(n, False, may_recompute=False)
        if self.fuse_reduced and len(uses) == 1 and uses[0][0].op in REDUCE and _injective_plain(uses[0][1]):
            return False
        shared, expanded = len(uses) > 1, any(_expands(st) for _, st in uses)
        expensive = cost > 16 * max(self.recompute_max_cost, RECOMPUTE_MAX_COST)
        if not (shared or expanded or expensive):
            return False  # cheap, read once through a plain view: computed where it is read, no choice
        stored = (shared and cost > self.recompute_max_cost) or (expanded and cost > self.expand_max_cost) \
            or expensive
        return self._choose(n, stored, may_recompute=cost <= RECOMPUTE_CAP)

    def _choose(self, n: Node, stored: bool, may_recompute: bool) -> bool:
        """Whether to store ``n``, a materialisation point: the heuristics' answer ``stored`` unless
        ``materialise`` decides its signature (recomputing only where ``may_recompute``)."""
        sig = node_signature(n, self._signatures)
        p = self.points.get(sig)
        if p is None:
            p = self.points[sig] = MaterialisePoint(sig, n.op.value, shape_text(n), stored, may_recompute)
        p.may_recompute = p.may_recompute and may_recompute
        p.nodes += 1
        p.elements += sym.upper_bound(sym.prod(n.shape))
        want = self.materialise.get(sig)
        if want is None or (not want and not may_recompute):
            return stored
        return want

    def _reduce_schedule(self, n: Node) -> str:
        """'tiled' (accumulate a tile of the last output axis per step of the reduced axis) when that reads
        more bytes contiguously than 'loop' (one output at a time, the reduced axis innermost)."""
        if not n.shape:
            return "loop"
        vars_ = [loop_var(f"ko{k}", s) for k, s in enumerate(n.shape)]
        rvar = loop_var("kr", n.srcs[0][1].shape[n.arg])
        idx = list(vars_)
        idx.insert(n.arg, rvar)
        body = self._read(n.srcs[0][0], n.srcs[0][1], idx)
        if self.generate_gemm and _gemm_sized(n, rvar, vars_, body):
            return "gemm"
        strided_in_loop = strided_in_tiled = 0
        for ld in body.walk():
            if not isinstance(ld, ir.Load):
                continue
            size = ld.buf.nbytes or sym.upper_bound(sym.prod(ld.buf.shape))
            if coefficient(ld.offset, rvar) not in (0, 1, -1):
                strided_in_loop += size
            if coefficient(ld.offset, vars_[-1]) not in (0, 1, -1):
                strided_in_tiled += size
        return "tiled" if strided_in_loop > strided_in_tiled else "loop"

    # IR building ----------------------------------------------------------------
    def _fresh(self, prefix: str, size: sint) -> sym.Var:
        self.counter += 1
        return loop_var(f"{prefix}{self.counter}", size)

    def _read(self, src: Node, st: ShapeTracker, idx) -> ir.IR:
        off, valid = st.index(idx)
        if src.id in self.buffers:
            value: ir.IR = ir.Load(self.buffers[src.id], off, src.dtype)
        else:
            value = self._compute(src, unravel(off, src.shape))
        if sym.same(valid, 1):
            return value
        if sym.same(valid, 0):
            return ir.Const(0, src.dtype)
        return ir.Select(valid, value, src.dtype)

    def _compute(self, n: Node, idx) -> ir.IR:
        """The IR of node ``n`` at index ``idx`` (ignoring whether ``n`` itself has a buffer)."""
        if self.byte_loads and n.id in self.graph.byte_values:
            loaded = self._bytes_value(self.graph.byte_values[n.id], idx)
            if loaded is not None:
                return loaded
        op = n.op
        if op is Op.CONST:
            if isinstance(n.arg, ArrayConst):
                return ir.Load(self.buffers[n.id], dense_offset(idx, n.shape), n.dtype)
            return ir.Const(n.arg, n.dtype)
        if op is Op.INPUT:
            return ir.Load(self.buffers[n.id], dense_offset(idx, n.shape), n.dtype)
        if op is Op.IOTA:
            return ir.Index(idx[0], n.dtype)
        if op in UNARY or op in BINARY:
            args = tuple(self._read(s, st, idx) for s, st in n.srcs)
            return ir.Alu(op, args, n.dtype)
        if op is Op.CAST:
            return ir.Cast(self._read(n.srcs[0][0], n.srcs[0][1], idx), n.dtype)
        if op is Op.CONTIGUOUS:
            return self._read(n.srcs[0][0], n.srcs[0][1], idx)
        if op in REDUCE:
            src, st = n.srcs[0]
            r = self._fresh("kr", st.shape[n.arg])
            full = list(idx)
            full.insert(n.arg, r)
            return ir.Reduce(op, r, st.shape[n.arg], self._read(src, st, full), n.dtype)
        if op is Op.GATHER:
            (data, dst), (ind, ist) = n.srcs
            k = ist.ndim
            index = self._read(ind, ist, idx[:k])
            g = self._fresh("kg", dst.shape[0])
            body = self._read(data, dst, [g] + list(idx[k:]))
            return ir.Gather(index, g, dst.shape[0], body, n.dtype)
        raise NotImplementedError(f"kernel formation: cannot inline {op}")

    def _bytes_value(self, fact, idx) -> ir.Bytes | None:
        """A node that decodes a value stored in bytes (``fact``: a float16 from two, an int8 from one) as one
        load of them, when they are read from one uint8 buffer at consecutive offsets; else None (the
        primitive decode)."""
        offsets, buf = [], None
        for part, st in fact.parts:
            x = self._read(part, st, idx)
            if not (isinstance(x, ir.Cast) and isinstance(x.arg, ir.Load) and x.arg.buf.dtype is dt.uint8):
                return None
            if buf is not None and x.arg.buf is not buf:
                return None
            buf = x.arg.buf
            offsets.append(x.arg.offset)
        if len(offsets) != fact.stored.itemsize or any(not sym.same(sym.add(offsets[0], k), o)
                                                        for k, o in enumerate(offsets)):
            return None
        return ir.Bytes(buf, offsets[0], fact.stored, dt.float32)

    # plan --------------------------------------------------------------------------
    def plan(self) -> KernelPlan:
        inputs: list[ir.Buffer] = []
        consts: list[tuple[ir.Buffer, ArrayConst]] = []
        slot = 0
        name_of = {n.arg: n for n in self.program.inputs}
        for node in self.program.inputs:  # inputs keep the program's order
            b = ir.Buffer("input", node.dtype, node.shape, node.arg, slot, nbytes=_nbytes(node))
            slot += 1
            self.buffers[node.id] = b
            inputs.append(b)
        for n in self.nodes:
            if n.op is Op.INPUT and n.id not in self.buffers:  # pragma: no cover - inputs come from the program
                raise ValueError(f"input {n.arg!r} is not part of the program inputs {sorted(name_of)}")
            if n.op is Op.CONST and isinstance(n.arg, ArrayConst):
                b = ir.Buffer("const", n.dtype, n.shape, f"const{n.id}", slot, nbytes=_nbytes(n))
                slot += 1
                self.buffers[n.id] = b
                consts.append((b, n.arg))
        output_ids = {n.id for n in self.outputs}
        out_bufs: dict[int, ir.Buffer] = {}
        kernels: list[ir.Kernel] = []
        temps: list[ir.Buffer] = []
        for k, n in enumerate(self.outputs):
            if n.id in self.in_place:
                out_bufs[n.id] = self.buffers[self.in_place[n.id].id]
            elif n.id not in out_bufs:
                out_bufs[n.id] = ir.Buffer("output", n.dtype, self.output_shapes.get(n.id, n.shape), f"out{k}", slot,
                                           nbytes=_nbytes(n))
                slot += 1
        for n in self.nodes:
            if n.id in self.buffers:
                continue
            if not self._must_materialise(n, n.id in output_ids):
                continue
            buf = out_bufs.get(n.id)
            if buf is None and n.id in self.in_place:
                buf = self.buffers[self.in_place[n.id].id]
            if buf is None:
                buf = ir.Buffer("temp", n.dtype, n.shape, f"t{n.id}", nbytes=_nbytes(n))
            if buf.kind == "temp":
                temps.append(buf)
            kernels.extend(self._kernels_for(n, buf))
            self.buffers[n.id] = buf
        for kern in kernels:
            kern.reads = kernel_reads(kern)
        # drop kernels nothing reads (e.g. pieces of a weight decode that a lowered kernel replaced)
        needed = {id(b) for b in out_bufs.values()}
        kept: list[ir.Kernel] = []
        for kern in reversed(kernels):
            if id(kern.out) in needed:
                kept.append(kern)
                needed.update(id(b) for b in kern.reads)
        kernels = kept[::-1]
        temps = [b for b in temps if id(b) in needed] + [b for k in kernels for b in k.scratch]
        plan = KernelPlan(kernels, inputs, consts, [out_bufs[n.id] for n in self.outputs], temps,
                          dims=list(self.program.dims), materialise_points=list(self.points.values()))
        plan.arena_bytes = plan_memory(plan)
        return plan

    def _kernels_for(self, n: Node, buf: ir.Buffer) -> list[ir.Kernel]:
        name = f"k{n.id}"
        self.counter = 0  # loop variables are numbered per kernel: identical layers give identical IR
        vars_ = tuple(loop_var(f"ko{k}", s) for k, s in enumerate(n.shape))
        if n.op is Op.SCATTER:
            (dest, dst), (ind, ist), (src, sst) = n.srcs
            copy = None if n.id in self.in_place else \
                ir.Kernel(name + "_copy", buf, n.shape, vars_, self._read(dest, dst, list(vars_)))
            m = loop_var("km", ist.shape[0])
            rest = tuple(loop_var(f"ko{k}", s) for k, s in enumerate(n.shape[1:], start=1))
            svars = (m,) + rest
            index = self._read(ind, ist, [m])
            value = self._read(src, sst, list(svars))
            write = ir.Kernel(name, buf, (ist.shape[0],) + n.shape[1:], svars, value, "scatter", index, n.shape[0])
            return [write] if copy is None else [copy, write]
        if n.id in self.quantized:
            q = self.quantized[n.id]
            quantize = quantizes_activations(q.qtype, self.activations)
            if quantize:
                q = replace(q, activations=self.activations)
            kern = ir.Kernel(name, buf, n.shape, vars_, ir.Const(0, n.dtype), "qmatmul", template=q,
                             template_reads=[self.buffers[q.x.id], self.buffers[q.raw.id]])
            if quantize:
                rows = quantized_rows_bound(q.qtype, sym.upper_bound(q.rows))
                kern.scratch = [ir.Buffer("temp", dt.uint8, (), f"xq{n.id}",
                                          nbytes=activation_scratch_layout(rows, q.in_features, q.activations)[-1])]
            return [kern]
        if n.id in self.lowered:  # --- lowered kernels (search hook)
            return self.lowered[n.id].kernels(self, n, buf, name, vars_)
        value = self._compute(n, list(vars_))
        kind = self._reduce_schedule(n) if n.op in REDUCE else "loop"
        return [ir.Kernel(name, buf, n.shape, vars_, value, kind)]


# a matmul-like reduction runs as a packed gemm when its operands are at least this large (upper bounds)
GEMM_MIN_ROWS = 8
GEMM_MIN_COLS = 4
GEMM_MIN_DEPTH = 8


def _gemm_sized(n: Node, rvar: sym.Var, vars_, body: ir.IR) -> bool:
    """Whether reduction ``n`` (its body ``body`` over ``rvar`` at ``vars_``) is matmul-like and large enough
    that packing its operands pays (matmul_form.py)."""
    red = ir.Reduce(n.op, rvar, n.srcs[0][1].shape[n.arg], body, n.dtype)
    form = match_matmul(red, tuple(vars_))
    if form is None:
        return False
    return (sym.upper_bound(n.shape[form.m]) >= GEMM_MIN_ROWS and sym.upper_bound(n.shape[form.n]) >= GEMM_MIN_COLS
            and sym.upper_bound(red.size) >= GEMM_MIN_DEPTH)


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(sym.same(x, y) for x, y in zip(a, b))


def _nbytes(n: Node) -> int:
    return max(sym.upper_bound(sym.prod(n.shape)), 1) * n.dtype.itemsize


def kernel_reads(kern: ir.Kernel) -> list[ir.Buffer]:
    """The buffers ``kern`` reads, in order of first use."""
    out: list[ir.Buffer] = list(kern.template_reads)
    for root in kern.roots():
        for x in root.walk():
            if isinstance(x, (ir.Load, ir.Bytes)) and x.buf not in out:
                out.append(x.buf)
    return out


def plan_memory(plan: KernelPlan, align: int = 64) -> int:
    """Place temporary buffers in one arena, reusing space of buffers that are dead (first fit)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, kern in enumerate(plan.kernels):
        b = kern.out
        first.setdefault(id(b), k)
        last[id(b)] = max(last.get(id(b), k), k)
        for r in kern.reads:
            last[id(r)] = k
        for sc in kern.scratch:
            first[id(sc)] = last[id(sc)] = k
    live: list[tuple[int, int, ir.Buffer]] = []  # (offset, end, buffer)
    top = 0
    for b in sorted(plan.temps, key=lambda b: first[id(b)]):
        start = first[id(b)]
        live = [x for x in live if last[id(x[2])] >= start]
        size = (b.nbytes + align - 1) // align * align
        offset = 0
        for off, end, _ in sorted(live):
            if offset + size <= off:
                break
            offset = max(offset, end)
        b.offset = offset
        live.append((offset, offset + size, b))
        top = max(top, offset + size)
    return top


def form_kernels(program: Program, use_templates: bool = True, activations: str = "float",
                 lower_only: frozenset[int] | None = None, gemm: bool = True,
                 byte_loads: bool = False, fuse_reduced: bool = False, recompute_max_cost: int = RECOMPUTE_MAX_COST,
                 expand_max_cost: int = EXPAND_MAX_COST, materialise: Mapping[str, bool] | None = None
                 ) -> KernelPlan:
    """The kernel plan of ``program``; ``use_templates=False`` runs every subgraph as generic fused loops;
    ``activations`` is how quantized matmuls take their activations: "float" (float32, exact decode),
    "int16" or "int8" (quantized per block of 32 once per call: faster, not bit-exact);
    ``lower_only`` (graph search's choice) lets only the lowered kernels matched at these node ids replace
    their primitive forms (None: all of them); ``gemm=False`` keeps matmul-like reductions in the plain
    loop forms instead of "gemm" kernels; ``byte_loads`` reads the float16 values a decode rebuilds from two
    bytes (Graph.byte_values) with one load (a backend that renders ``ir.Bytes``); ``fuse_reduced`` computes
    a value that only one reduction reads inside that reduction however expensive it is (the GPU backends:
    a product with a dequantized weight is otherwise stored as a [seq, k, n] temporary);
    ``recompute_max_cost`` / ``expand_max_cost``: a value read by several kernels / through a broadcast is
    recomputed by its readers below that cost (counted in elementwise ops), else stored once; ``materialise``
    overrides those thresholds per materialisation point (signature -> store; see materialise.py and the
    plan's ``materialise_points``)."""
    return Former(program, use_templates, activations, lower_only, gemm, byte_loads, fuse_reduced,
                  recompute_max_cost, expand_max_cost, materialise).plan()
