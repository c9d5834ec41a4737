"""A disk cache of rendered programs, keyed by the graph's structure, so that a warm compile skips
kernel formation and C rendering (for SmolLM2 these took most of a warm compile's second).

The key is a hash of an exact structural description of the program:

- every node in topological order: op, dtype, shape, argument, its sources (by position in that
  order) with their views, and any lowering hint (``Graph.lowerings``) on it;
- the outputs and their views, the symbolic dimensions (names and bounds), the donated inputs;
- the backend options that change the rendered source (templates, int8 activations, profile,
  portable);
- the contents of every source file of the ``lightspeed`` package, so any change to kernel
  formation or rendering misses, and the current values of the upper-case module constants of
  ``lightspeed.kernel`` and ``lightspeed.backend.c`` (thresholds, schedule knobs), so overriding
  one at run time misses too.

Symbolic expressions are written by their canonical sort keys (which include every variable's
bounds), floats by their bits, small embedded arrays (at most ``ArrayConst.SMALL_BYTES``) by
their contents. A large embedded array (a weight) is written by dtype, shape and whether it lies in huge-page
memory (which decides whether its matmuls read a repacked copy, repack.py) only: the
generated code never sees its values, it reads them through a pointer passed at run time, so
the cached program is exactly the program its graph compiles to whatever the values are, and
a run reads the arrays of the graph being compiled, never those of the graph that made the
entry. Nothing is keyed by Python object identity.

An entry holds the rendered source and the buffer table the executor needs (pointer slots of
inputs, constants and outputs, the arena size). The C compiler is still reached through
``compile_shared``, whose own cache is keyed by the source. An entry is written only after the
buffer table rebuilt from the program alone has been checked against the freshly formed plan,
and the full kernel plan is formed again on demand (``CachedPlan.kernels``), e.g. for profiling.

An entry carries its key and a sha256 of (key, table, source), and is written atomically (temporary
file, fsync, rename). A loaded entry is used only when the checksum matches and the table passes
``validate`` against the program being compiled (slot numbers, kinds, counts, which outputs share a
buffer; dtypes and shapes are taken from the program itself); the arena size cannot be checked without
forming the kernels, so it is covered by the checksum. Anything else is discarded with a warning and
rebuilt, so an edited or damaged entry can never reach native code.
"""
from __future__ import annotations

import enum
import hashlib
import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from ... import dtypes as dt
from ... import memory
from ... import symbolic as sym
from ...graph import ArrayConst, Node, Program
from ...kernel import Buffer, KernelPlan
from .repack import REPACK_CODES, Repack
from .scheduling import form_c_plan
from ...ops import Op
from ...shape import ShapeTracker
from . import cache_files

FORMAT = 3  # bump when the entry layout changes (2: key and checksum in the entry, 3: repacks)


class Uncacheable(Exception):
    """The program holds something the key cannot describe exactly (it is then compiled as usual)."""


@lru_cache(maxsize=None)
def code_fingerprint() -> str:
    """A hash of every source file of the package (Python, C, headers, the e-graph's rule files)."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for path in sorted(p for ext in ("*.py", "*.c", "*.h", "*.egg") for p in root.rglob(ext)):
        h.update(str(path.relative_to(root)).encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


# modules whose upper-case globals (heuristic thresholds, the renderers' defaults such as render.TILE) shape
# the plan or the source: their current values are part of the key, so changing one (a benchmark or a test
# that sets a module constant) misses instead of reusing a source rendered under other values
STATE_MODULES = ("lightspeed.kernel", "lightspeed.backend.c")


def _state_value(x: Any) -> str | None:
    """``_value`` of a module constant, functions by name, dicts by sorted items; None for other objects."""
    if callable(x) and hasattr(x, "__qualname__") and not isinstance(x, type):
        return f"F{getattr(x, '__module__', '')}.{x.__qualname__}"
    if isinstance(x, dict):
        items = [(_state_value(k), _state_value(v)) for k, v in x.items()]
        return None if any(a is None or b is None for a, b in items) else "{" + ",".join(sorted(
            f"{a}:{b}" for a, b in items)) + "}"
    if isinstance(x, (list, tuple, set, frozenset)):
        parts = [_state_value(v) for v in x]
        if any(p is None for p in parts):
            return None
        return "[" + ",".join(sorted(parts) if isinstance(x, (set, frozenset)) else parts) + "]"
    try:
        return _value(x)
    except Uncacheable:
        return None


def module_state() -> str:
    """The current values of the upper-case globals of the modules named by ``STATE_MODULES``."""
    lines = []
    for name in sorted(m for m in list(sys.modules) if m.startswith(STATE_MODULES)):
        for attr, v in sorted(vars(sys.modules[name]).items()):
            if attr.isupper() and not attr.startswith("_"):  # public constants, not private state
                text = _state_value(v)
                if text is not None:
                    lines.append(f"{name}.{attr}={text}")
    return "\n".join(lines)


def _value(x: Any) -> str:
    """An exact text for an argument, dimension or option value."""
    if x is None:
        return "n"
    if isinstance(x, enum.Enum):  # e.g. a QType (an IntEnum: before int)
        return f"E{type(x).__module__}.{type(x).__qualname__}.{x.name}"
    if isinstance(x, bool):
        return "b1" if x else "b0"
    if isinstance(x, int):
        return f"i{x}"
    if isinstance(x, float):
        return "f" + x.hex()
    if isinstance(x, str):
        return "s" + json.dumps(x)
    if isinstance(x, sym.Expr):
        return "e" + x.sort_key()
    if isinstance(x, dt.DType):
        return "d" + x.name
    if isinstance(x, (tuple, list)):
        return "(" + ",".join(_value(v) for v in x) + ")"
    if isinstance(x, ArrayConst):
        a = x.array
        head = f"a{a.dtype.str}{a.shape}"
        if a.nbytes <= ArrayConst.SMALL_BYTES:
            return head + hashlib.sha256(a.tobytes()).hexdigest()
        # values are read at run time (see the module docstring); whether the array lives in huge-page memory
        # decides whether its matmuls read a repacked copy (repack.py)
        return head + ("h" if memory.in_region(a) else "")
    raise Uncacheable(f"cannot describe {type(x).__name__} exactly")


class _Describer:
    """Writes a program's structure into a hash."""

    def __init__(self, program: Program):
        self.index = {n.id: k for k, n in enumerate(program.nodes)}
        # by value: trackers equal by value (the same view in every layer) are described once
        self.views: dict[ShapeTracker, str] = {}
        self.values: dict[Any, str] = {}

    def view(self, st: ShapeTracker) -> str:
        got = self.views.get(st)
        if got is None:
            got = self.views[st] = "|".join(
                _value(v.shape) + _value(v.strides) + _value(v.offset) + _value(v.mask) for v in st.views)
        return got

    def value(self, x: Any) -> str:
        """``_value`` of a shape or an argument, remembered by a key that tells apart everything
        ``_value`` does (types included: 1, 1.0 and True are equal in Python; floats by bits)."""
        if isinstance(x, tuple):
            if not all(type(e) is int or isinstance(e, sym.Expr) for e in x):
                return _value(x)
            key: Any = tuple((type(e), e) for e in x)
        elif isinstance(x, float):
            key = (float, x.hex())
        elif x is None or isinstance(x, (int, str)):
            key = (type(x), x)
        else:
            return _value(x)
        got = self.values.get(key)
        if got is None:
            got = self.values[key] = _value(x)
        return got

    def node_ref(self, n: Any) -> str:
        if not isinstance(n, Node) or n.id not in self.index:
            raise Uncacheable("a lowering refers to a node outside the program")
        return f"@{self.index[n.id]}"

    def lowering(self, info: Any) -> str:
        fields = getattr(info, "__dataclass_fields__", None)
        if fields is None:
            raise Uncacheable(f"cannot describe lowering {type(info).__name__}")
        parts = [type(info).__name__]
        for name in fields:
            v = getattr(info, name)
            if isinstance(v, Node):
                parts.append(self.node_ref(v))
            elif isinstance(v, ShapeTracker):
                parts.append(self.view(v))
            else:
                parts.append(_value(v))
        return ";".join(parts)


def plan_key(program: Program, options: dict[str, Any], code: str | None = None) -> str:
    """The cache key of ``program`` compiled with backend ``options`` by the package's current code and
    module constants (or by ``code``, a stand-in for both); raises Uncacheable."""
    d = _Describer(program)
    lowerings = program.graph.lowerings
    h = hashlib.sha256()
    h.update(f"lightspeed-plan-{FORMAT}\0".encode())
    h.update((code if code is not None else code_fingerprint() + "\0" + module_state()).encode())
    h.update(_value(sorted(options.items())).encode())
    lines = []
    index = d.index
    for n in program.nodes:
        srcs = ",".join(f"{index[s.id]}:{d.view(st)}" for s, st in n.srcs)
        arg = _value(n.arg) if isinstance(n.arg, ArrayConst) else d.value(n.arg)
        line = f"{n.op.value} {n.dtype.name} {d.value(n.shape)} {arg} [{srcs}]"
        if n.id in lowerings:
            line += " L" + d.lowering(lowerings[n.id])
        lines.append(line)
    for n, st in program.outputs:
        lines.append(f"out {index[n.id]}:{d.view(st)}")
    lines.append("dims " + _value(list(program.dims)))
    lines.append("donated " + _value(sorted(program.donated)))
    h.update("\n".join(lines).encode())
    return h.hexdigest()[:40]


def _nbytes(n: Node) -> int:
    return max(sym.upper_bound(sym.prod(n.shape)), 1) * n.dtype.itemsize


class CachedPlan:
    """The buffer table of a cached program: what the executor needs to call it. ``kernels`` and
    ``temps`` form the full plan again on first use (they are not needed to run)."""

    def __init__(self, program: Program, table: dict, form_options: dict[str, Any]):
        self._program, self._form_options, self._full = program, form_options, None
        nodes = program.nodes
        self.dims = list(program.dims)
        self.arena_bytes = int(table["arena_bytes"])
        if len(table["inputs"]) != len(program.inputs):
            raise Uncacheable("the entry's inputs do not match the program")
        self.inputs = [Buffer("input", n.dtype, n.shape, n.arg, slot, nbytes=_nbytes(n))
                       for n, slot in zip(program.inputs, table["inputs"])]
        self.consts: list[tuple[Buffer, ArrayConst]] = []
        for slot, k in table["consts"]:
            n = nodes[k]
            if n.op is not Op.CONST or not isinstance(n.arg, ArrayConst):
                raise Uncacheable("the entry's constants do not match the program")
            self.consts.append((Buffer("const", n.dtype, n.shape, f"const{n.id}", slot, nbytes=_nbytes(n)), n.arg))
        by_name = {b.name: b for b in self.inputs}
        self.outputs: list[Buffer] = []
        for k, (kind, slot, name, first) in enumerate(table["outputs"]):
            if first != k:
                self.outputs.append(self.outputs[first])
            elif kind == "input":
                self.outputs.append(by_name[name])
            else:
                n, st = program.outputs[k]
                self.outputs.append(Buffer(kind, n.dtype, st.shape, name, slot, nbytes=_nbytes(n)))
        self.repacks = [Repack(*r) for r in table["repacks"]]

    def full(self) -> KernelPlan:
        """The kernel plan formed from the program (same slots and arena as this table)."""
        if self._full is None:  # with the default schedules, which the cached source was rendered under
            self._full = form_c_plan(self._program, self._form_options)
        return self._full

    @property
    def kernels(self):
        return self.full().kernels

    @property
    def temps(self):
        return self.full().temps


def _table(program: Program, plan: KernelPlan) -> dict:
    """The buffer table of ``plan`` in terms of the program (raises Uncacheable when it cannot be)."""
    const_at = {id(n.arg): k for k, n in enumerate(program.nodes) if n.op is Op.CONST}
    consts = []
    for b, c in plan.consts:
        k = const_at.get(id(c))
        if k is None:
            raise Uncacheable("a constant of the plan is not a node of the program")
        consts.append((b.slot, k))
    outputs = []
    for k, b in enumerate(plan.outputs):
        first = next(j for j, o in enumerate(plan.outputs) if o is b)
        outputs.append((b.kind, b.slot, b.name, first))
    repacks = [[r.slot, r.source_slot, r.code, r.rows, r.row_bytes] for r in plan.repacks]
    return {"inputs": [b.slot for b in plan.inputs], "consts": consts, "outputs": outputs,
            "arena_bytes": plan.arena_bytes, "repacks": repacks}


def _same_buffer(a: Buffer, b: Buffer) -> bool:
    return (a.kind == b.kind and a.dtype is b.dtype and a.name == b.name and a.slot == b.slot
            and len(a.shape) == len(b.shape) and all(sym.same(x, y) for x, y in zip(a.shape, b.shape)))


def _int_list(x: Any, what: str) -> list[int]:
    if not isinstance(x, list) or not all(type(v) is int for v in x):
        raise Uncacheable(f"{what} is not a list of integers")
    return x


def validate(program: Program, table: Any) -> None:
    """Raise Uncacheable (with the reason) unless ``table`` is a buffer table that compiling ``program``
    could produce: inputs in the program's order at slots 0.., constants at distinct array-constant
    nodes, outputs that are new buffers (``out{k}``) or donated inputs of matching dtype and shape, and
    every slot used exactly once. The arena size is only checked to be a non-negative integer."""
    if not isinstance(table, dict):
        raise Uncacheable("the table is not an object")
    arena = table.get("arena_bytes")
    if type(arena) is not int or arena < 0:
        raise Uncacheable(f"arena size {arena!r} is not a non-negative integer")
    n_in = len(program.inputs)
    inputs = _int_list(table.get("inputs"), "the input slots")
    if inputs != list(range(n_in)):  # kernel formation numbers the inputs first, in the program's order
        raise Uncacheable(f"input slots {inputs} are not 0..{n_in - 1} in the program's order")
    slots = list(inputs)
    nodes = program.nodes
    consts = table.get("consts")
    if not isinstance(consts, list):
        raise Uncacheable("the constants are not a list")
    seen_nodes = set()
    for c in consts:
        slot, k = _int_list(c, "a constant entry") if isinstance(c, list) and len(c) == 2 else (None, None)
        if slot is None or not 0 <= k < len(nodes) or k in seen_nodes:
            raise Uncacheable(f"constant entry {c!r} is malformed or repeats a node")
        if nodes[k].op is not Op.CONST or not isinstance(nodes[k].arg, ArrayConst):
            raise Uncacheable(f"constant entry {c!r} does not name an array constant of the program")
        seen_nodes.add(k)
        slots.append(slot)
    outputs = table.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != len(program.outputs):
        raise Uncacheable(f"the outputs do not match the program's {len(program.outputs)}")
    input_at = {n.arg: (k, n) for k, n in enumerate(program.inputs)}
    for k, o in enumerate(outputs):
        if not (isinstance(o, list) and len(o) == 4 and type(o[1]) is int and type(o[3]) is int):
            raise Uncacheable(f"output entry {k} is malformed")
        kind, slot, name, first = o
        node = program.outputs[k][0]
        if not 0 <= first <= k or outputs[first][3] != first:
            raise Uncacheable(f"output {k} shares the buffer of output {first}, which is not a first use")
        if first != k:
            if outputs[first][:3] != o[:3] or program.outputs[first][0] is not node:
                raise Uncacheable(f"output {k} shares a buffer with output {first}, which computes another value")
        elif kind == "input":
            k_in, src = input_at.get(name, (None, None))
            if src is None or name not in program.donated or slot != k_in:
                raise Uncacheable(f"output {k} is written into {name!r}, which is not a donated input at that slot")
            if src.dtype is not node.dtype or len(src.shape) != len(node.shape) or not all(
                    sym.same(a, b) for a, b in zip(src.shape, node.shape)):
                raise Uncacheable(f"output {k} does not have the dtype and shape of input {name!r}")
        elif kind == "output" and name == f"out{k}":
            slots.append(slot)
        else:
            raise Uncacheable(f"output entry {k} has kind {kind!r} and name {name!r}")
    const_slots = {c[0]: nodes[c[1]] for c in consts}
    repacks = table.get("repacks")
    if not isinstance(repacks, list):
        raise Uncacheable("the repacks are not a list")
    for r in repacks:
        slot, source, code, rows, row_bytes = (_int_list(r, "a repack entry") if isinstance(r, list) and len(r) == 5
                                               else (None,) * 5)
        node = const_slots.get(source)
        if node is None or code not in REPACK_CODES.values() or tuple(node.shape) != (rows, row_bytes) \
                or node.dtype is not dt.uint8:
            raise Uncacheable(f"repack entry {r!r} does not name a uint8 constant of its shape")
        slots.append(slot)
    if sorted(slots) != list(range(len(slots))):
        raise Uncacheable("the slots are not numbered 0.. with each used once")


def _check(program: Program, plan: KernelPlan, table: dict, form_options: dict[str, Any]) -> None:
    """Raise Uncacheable unless the table rebuilt from the program alone equals the plan's."""
    validate(program, json.loads(json.dumps(table)))  # an entry that load would refuse is not written
    got = CachedPlan(program, json.loads(json.dumps(table)), form_options)
    ok = (got.arena_bytes == plan.arena_bytes and len(got.inputs) == len(plan.inputs)
          and all(_same_buffer(a, b) for a, b in zip(got.inputs, plan.inputs))
          and len(got.consts) == len(plan.consts)
          and all(_same_buffer(a, b) and c is d for (a, c), (b, d) in zip(got.consts, plan.consts))
          and len(got.outputs) == len(plan.outputs)
          and all(_same_buffer(a, b) for a, b in zip(got.outputs, plan.outputs))
          and [v.name for v in got.dims] == [v.name for v in plan.dims]
          and got.repacks == list(plan.repacks))
    if ok:  # which outputs share one buffer
        ok = all((got.outputs[i] is got.outputs[j]) == (plan.outputs[i] is plan.outputs[j])
                 for i in range(len(plan.outputs)) for j in range(i))
    if not ok:
        raise Uncacheable("the plan's buffers cannot be rebuilt from the program")


def _path(key: str) -> Path:
    return cache_files.cache_subdir("plans") / f"{key}.json"


def checksum(key: str, table: Any, source: str) -> str:
    """The sha256 an entry records over its key, table and source."""
    payload = json.dumps([key, table, source], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def _entry(key: str, program: Program, form_options: dict[str, Any], entry: Any) -> tuple[CachedPlan, str]:
    """(plan, source) of a parsed entry; raises Uncacheable (with the reason) when it cannot be used."""
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        raise Uncacheable("it has another format")
    if entry.get("key") != key:
        raise Uncacheable(f"it belongs to another key ({entry.get('key')!r})")
    table, source = entry.get("table"), entry.get("source")
    if not isinstance(source, str) or entry.get("sha256") != checksum(key, table, source):
        raise Uncacheable("its checksum does not match (edited or corrupted)")
    validate(program, table)
    return CachedPlan(program, table, form_options), source


def load(key: str, program: Program, form_options: dict[str, Any]) -> tuple[CachedPlan, str] | None:
    """(plan, source) of the entry ``key``, or None when there is none; an entry that is unreadable,
    fails its checksum or does not fit ``program`` is discarded with a warning (and rebuilt by the caller)."""
    path = _path(key)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        problem = f"it cannot be read ({e.strerror})"
    else:
        try:
            return _entry(key, program, form_options, json.loads(text))
        except ValueError as e:  # not JSON (UnicodeDecodeError and JSONDecodeError are ValueErrors)
            problem = f"it is not valid JSON ({e})"
        except (Uncacheable, KeyError, IndexError, TypeError) as e:
            problem = str(e) or type(e).__name__
    cache_files.warn(f"discarding the cached plan {path}: {problem}; rebuilding it")
    return None


def store(key: str, program: Program, plan: KernelPlan, source: str, form_options: dict[str, Any]) -> bool:
    """Write the entry ``key`` (atomically, with its checksum); False when the plan cannot be cached."""
    try:
        table = _table(program, plan)
        _check(program, plan, table, form_options)
    except Uncacheable:
        return False
    path = _path(key)
    cache_files.remove_stale_temps(path.parent)
    entry = {"format": FORMAT, "key": key, "sha256": checksum(key, table, source), "table": table, "source": source}
    try:
        cache_files.write_atomic(path, key, json.dumps(entry).encode())
    except OSError as e:  # a full or read-only disk costs the next compile its shortcut, nothing else
        cache_files.warn(f"cannot write the cached plan {path}: {e.strerror or e}")
        return False
    return True


class Lookup:
    """The outcome of ``lookup``: ``plan`` and ``source`` on a hit (else None); ``store`` writes a
    freshly rendered program under the key after a miss (and does nothing otherwise)."""

    def __init__(self, program: Program, key: str | None, form_options: dict[str, Any]):
        self.program, self.key, self.form_options = program, key, form_options
        self.plan: CachedPlan | None = None
        self.source: str | None = None
        if key is not None:
            got = load(key, program, form_options)
            if got is not None:
                self.plan, self.source = got

    def store(self, plan: KernelPlan, source: str) -> None:
        if self.key is not None and self.source is None:
            store(self.key, self.program, plan, source, self.form_options)


def lookup(program: Program, form_options: dict[str, Any], enabled: bool = True, **render_options: Any) -> Lookup:
    """Look ``program`` up; ``form_options`` go to ``form_kernels``, ``render_options`` are the other
    options that change the source (profile, portable)."""
    key = None
    if enabled:
        try:
            key = plan_key(program, {**form_options, **render_options})
        except Uncacheable:
            key = None
    return Lookup(program, key, form_options)
