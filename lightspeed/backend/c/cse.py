"""Common-subexpression elimination for the C renderer: name a repeated subexpression once.

Index arithmetic over expression-sized axes (``s0 - 1``) unravels into long floor divisions and modulos that
share subterms, and the IR shares operands (``x != x``); rendered as a tree, each repeat is written out
again, so the text grows with the number of occurrences, exponentially in the nesting. Here one expression
(an ``ir.IR`` value or a ``symbolic`` index) is rendered with each distinct subexpression rendered once and,
where it repeats and is long enough, declared as a ``const`` local that its uses read.

Hoisting never evaluates anything the plain rendering does not. The expression is split into regions:
the top level, and every operand that the C code evaluates only under a condition (a Select's value, a
Gather's row check and body, a Reduce's body, the dividend of an integer modulo, the guarded operand of a
product with a boolean, the right side of a symbolic ``&&``). A subexpression is declared in the outermost
enclosing region that evaluates it unconditionally (and that sees the same binding of every loop variable it
reads: a Reduce or Gather body binds its variable), so it is only ever named where the plain code would have
evaluated it anyway. Declarations open the region as a GNU statement expression, ``({ const T _xN = ...;
value; })``; a region with nothing to declare renders exactly as before. The declared value is the
unchanged C text of the subexpression, stored in its compute type (the type the plain text has, up to the
integer promotion every use applies anyway), so the arithmetic and its rounding are unchanged.
"""
from __future__ import annotations

import re
from typing import Callable

from ... import dtypes as dt
from ... import symbolic as sym
from ...kernel import ir
from ...ops import Op

MIN_SAVED = 32  # a repeated subexpression is named when that makes the text at least this much shorter
MIN_HOISTED = 24  # a loop-invariant subexpression of a loop that always runs is named (hoisted) from this length

_MARK = re.compile("\x01(\\d+)\x02|\x03(\\d+)\x04")  # a slot's text, a region's text (placeholders)


def is_node(x) -> bool:
    """Whether ``x`` can be named: an IR value other than a constant, or a compound index expression."""
    if isinstance(x, ir.IR):
        return not isinstance(x, ir.Const)
    return isinstance(x, sym.Expr) and not isinstance(x, (sym.Const, sym.Var))


def edges(x) -> tuple[list, list]:
    """(operands the C text always evaluates, [(operand, variable it binds or None)] it evaluates only
    under a condition). The renderer asks for each operand as ``expr``/``idx`` or ``guarded``
    accordingly; ``Cse`` checks that the two agree."""
    if isinstance(x, (ir.Load, ir.Bytes)):
        return [x.offset], []
    if isinstance(x, ir.Index):
        return [x.expr], []
    if isinstance(x, ir.Select):
        return [x.valid], [(x.value, None)]
    if isinstance(x, ir.Cast):
        return [x.arg], []
    if isinstance(x, ir.Reduce):
        return [x.size], [(x.body, x.var)]
    if isinstance(x, ir.Gather):
        return [x.index], [(x.rows, None), (x.body, x.var)]
    if isinstance(x, ir.Alu):
        a = x.args
        if x.op is Op.MOD and not x.dtype.is_float:  # the dividend only where the divisor is not 0 or -1
            return [a[1]], [(a[0], None)]
        if x.op is Op.MUL and (a[0].dtype is dt.bool_) != (a[1].dtype is dt.bool_):
            flag = 0 if a[0].dtype is dt.bool_ else 1  # flag ? other : 0
            return [a[flag]], [(a[1 - flag], None)]
        return list(a), []
    if isinstance(x, ir.IR):
        return [], []
    if isinstance(x, sym.Sum):
        return [t for t, _ in x.terms], []
    if isinstance(x, sym.Prod):
        return list(x.factors), []
    if isinstance(x, sym.And):  # && evaluates its right side only where the left holds
        return [x.a], [(x.b, None)]
    if isinstance(x, sym._Binary):
        return [x.a, x.b], []
    return [], []


def sym_c(e: sym.Expr, sub: Callable[[sym.sint], str], guarded: Callable[[sym.sint], str]) -> str:
    """C text of one node of an index expression with its operands rendered by ``sub`` (``guarded`` for
    the right side of ``&&``): the same text as ``symbolic.render_c``, node by node."""
    if isinstance(e, sym.Sum):
        parts = []
        for t, k in e.terms:
            s = sub(t)
            parts.append(s if k == 1 else f"{s}*{sub(k)}" if k > 0 else f"-{s}" if k == -1 else f"{s}*({sub(k)})")
        if e.const:
            parts.append(sub(e.const))
        text = parts[0]
        for p in parts[1:]:
            text += f"-{p[1:]}" if p.startswith("-") else f"+{p}"
        return f"({text})"
    if isinstance(e, sym.Prod):
        return "(" + "*".join(sub(f) for f in e.factors) + ")"
    if isinstance(e, sym.And):
        return f"({sub(e.a)}&&{guarded(e.b)})"
    a, b = sub(e.a), sub(e.b)
    if isinstance(e, (sym.FloorDiv, sym.Mod)):
        if e.a.lo < 0 or e.b.lo <= 0:
            return f"ls_floor{'div' if isinstance(e, sym.FloorDiv) else 'mod'}({a}, {b})"
        return f"({a}{'/' if isinstance(e, sym.FloorDiv) else '%'}{b})"
    if isinstance(e, (sym.Min, sym.Max)):
        return f"ls_{'min' if isinstance(e, sym.Min) else 'max'}({a}, {b})"
    if isinstance(e, sym.Lt):
        return f"({a}<{b})"
    raise NotImplementedError(f"C renderer: symbolic {type(e).__name__}")


def _always(x) -> list:
    """The operands the C text of ``x`` evaluates whenever it evaluates ``x``: the unconditional ones, and
    the body of a reduction over a constant, non-empty range (its loop runs at least once, so a part of the
    body that does not read the loop variable may be computed once before the loop)."""
    always = edges(x)[0]
    if isinstance(x, ir.Reduce) and sym.is_const(x.size) and int(x.size) >= 1:
        return always + [x.body]
    return always


class Region:
    """A part of the expression the C code evaluates as a whole or not at all."""

    def __init__(self, rid: int, parent: "Region | None", binds: frozenset, root: int):
        self.id, self.parent, self.binds, self.root = rid, parent, binds, root
        self.text = ""  # the root's text (a placeholder or a leaf)
        self.decls: list[Slot] = []


class Slot:
    """One distinct subexpression of one region: its text (with placeholders) and how often it is used."""

    def __init__(self, sid: int, region: Region, ctype: str, text: str):
        self.id, self.region, self.ctype, self.text = sid, region, ctype, text
        self.uses = 0
        self.name: str | None = None
        self.invariant = False  # asked for inside a loop whose variable it does not read


class Cse:
    """Renders one expression; the renderer asks it for every operand (``node``, ``region``)."""

    def __init__(self, new_name: Callable[[], str], min_saved: int | None = None):
        self.new_name, self.min_saved = new_name, MIN_SAVED if min_saved is None else min_saved
        self.ids: dict = {}  # structural key -> node id
        self.ir_ids: dict[int, int] = {}  # id() of an IR object -> node id
        self.nodes: list = []  # node id -> a representative object
        self.keep: list = []  # IR objects whose id() is in ir_ids (kept alive so no id is reused)
        self.fv: dict[int, frozenset] = {}
        self.closures: dict[int, frozenset] = {}
        self.regions: list[Region] = []
        self.slots: list[Slot] = []
        self.slot_of: dict[tuple[int, int], Slot] = {}
        self.order: list = []  # slots and regions in the order they were completed (operands first)
        self.current: Region | None = None
        self.rendering: list = []  # the nodes being rendered, innermost last

    # identity -------------------------------------------------------------------------------------
    def nid(self, x) -> int:
        """The id of ``x``'s structure (two equal subexpressions render to the same text)."""
        if isinstance(x, ir.IR):
            got = self.ir_ids.get(id(x))
            if got is not None:
                return got
            key = self._ir_key(x)
        else:
            key = sym.to_expr(x)
        got = self.ids.get(key)
        if got is None:
            got = self.ids[key] = len(self.nodes)
            self.nodes.append(x)
        if isinstance(x, ir.IR):
            self.ir_ids[id(x)] = got
            self.keep.append(x)
        return got

    def _ir_key(self, x: ir.IR) -> tuple:
        n, d = self.nid, x.dtype.name
        if isinstance(x, ir.Bytes):
            return ("Y", id(x.buf), n(x.offset), x.stored.name, d)
        if isinstance(x, ir.Load):
            return ("L", id(x.buf), n(x.offset), d)
        if isinstance(x, ir.Const):
            return ("C", repr(x.value), d)
        if isinstance(x, ir.Index):
            return ("I", n(x.expr), d)
        if isinstance(x, ir.Select):
            return ("S", n(x.valid), n(x.value), d)
        if isinstance(x, ir.Cast):
            return ("K", n(x.arg), d)
        if isinstance(x, ir.Alu):
            return ("A", x.op.name, d) + tuple(n(a) for a in x.args)
        if isinstance(x, ir.Reduce):
            return ("R", x.op.name, n(x.var), n(x.size), n(x.body), d)
        if isinstance(x, ir.Gather):
            return ("G", n(x.index), n(x.var), n(x.rows), n(x.body), d)
        if isinstance(x, ir.Bound):
            return ("B", x.name, d)
        raise NotImplementedError(f"C renderer: {type(x).__name__}")

    def free_vars(self, k: int) -> frozenset:
        got = self.fv.get(k)
        if got is None:
            x = self.nodes[k]
            if not isinstance(x, ir.IR):
                got = sym.to_expr(x).vars()
            else:
                always, cond = edges(x)
                got = frozenset().union(*(self.free_vars(self.nid(c)) for c in always))
                for c, bound in cond:
                    got |= self.free_vars(self.nid(c)) - ({bound} if bound is not None else set())
            self.fv[k] = got
        return got

    def closure(self, root: int) -> frozenset:
        """The nodes a region evaluates unconditionally: its root and their always-evaluated operands."""
        got = self.closures.get(root)
        if got is None:
            seen, todo = {root}, [root]
            while todo:
                for c in _always(self.nodes[todo.pop()]):
                    if is_node(c):
                        k = self.nid(c)
                        if k not in seen:
                            seen.add(k)
                            todo.append(k)
            got = self.closures[root] = frozenset(seen)
        return got

    # rendering ------------------------------------------------------------------------------------
    def run(self, root, entry: Callable) -> str:
        """The C text of ``root`` rendered by ``entry`` (the renderer's ``expr`` or ``idx``)."""
        top = self._open(root, entry, frozenset(), None)
        self._decide()
        return self._expand_region(top, {})

    def node(self, x, render: Callable[[], str], ctype: str) -> str:
        """A placeholder for operand ``x``, evaluated unconditionally where it is asked for; ``render``
        gives its text (called once per region it is placed in)."""
        k = self.nid(x)
        assert k in self.closure(self.current.root), f"C renderer: {type(x).__name__} asked for outside its region"
        target = self._target(k)
        slot = self.slot_of.get((target.id, k))
        if slot is None:
            saved, self.current = self.current, target
            self.rendering.append(x)
            try:
                text = render()
            finally:
                self.current = saved
                self.rendering.pop()
            slot = self.slot_of[(target.id, k)] = Slot(len(self.slots), target, ctype, text)
            self.slots.append(slot)
            self.order.append(slot)
        r = self.current
        while r is not target and r is not None:
            if r.binds:
                slot.invariant = True
            r = r.parent
        slot.uses += 1
        return f"\x01{slot.id}\x02"

    def region(self, x, entry: Callable, bound: sym.Var | None = None) -> str:
        """A placeholder for operand ``x`` of the node being rendered, which the C text evaluates only
        under a condition (with ``bound`` bound to a value)."""
        parent = self.rendering[-1] if self.rendering else None
        assert parent is None or any(c is x and b is bound for c, b in edges(parent)[1]), \
            f"C renderer: a conditional operand of {type(parent).__name__} that cse.edges does not list"
        reg = self._open(x, entry, frozenset([bound]) if bound is not None else frozenset(), self.current)
        return f"\x03{reg.id}\x04"

    def _open(self, x, entry: Callable, binds: frozenset, parent: Region | None) -> Region:
        reg = Region(len(self.regions), parent, binds, self.nid(x) if is_node(x) else -1)
        self.regions.append(reg)
        saved, self.current = self.current, reg
        try:
            reg.text = entry(x)
        finally:
            self.current = saved
        self.order.append(reg)
        return reg

    def _target(self, k: int) -> Region:
        """The outermost enclosing region that evaluates node ``k`` unconditionally with the same
        binding of its variables (the current region at least)."""
        fv = self.free_vars(k)
        best, r = self.current, self.current
        while r is not None:
            if r.root >= 0 and k in self.closure(r.root):
                best = r
            if r.binds & fv:
                break
            r = r.parent
        return best

    # naming and text ------------------------------------------------------------------------------
    def _decide(self) -> None:
        """Name each slot whose uses, written out, would be longer than its declaration and its name at
        every use (by ``min_saved`` characters); operands are decided before their users."""
        size: dict = {}

        def length(text: str) -> int:
            total, pos = 0, 0
            for m in _MARK.finditer(text):
                total += m.start() - pos + size[("s", int(m.group(1))) if m.group(1) else ("r", int(m.group(2)))]
                pos = m.end()
            return total + len(text) - pos

        for item in self.order:
            if isinstance(item, Slot):
                n = length(item.text)
                # const T _xN = ...; then _xN at each use (names are about 4 characters)
                if ((item.uses - 1) * n - len(item.ctype) - 12 - 4 * (item.uses + 1) >= self.min_saved
                        or (item.invariant and n >= MIN_HOISTED)):
                    item.name = self.new_name()
                    item.region.decls.append(item)
                    n = len(item.name)
                size[("s", item.id)] = n
            else:
                n = length(item.text)
                if item.decls:
                    n += 8 + sum(len(s.ctype) + len(s.name) + 12 + length(s.text) for s in item.decls)
                size[("r", item.id)] = n

    def _expand(self, text: str, memo: dict) -> str:
        def one(m: re.Match) -> str:
            if m.group(1) is not None:
                slot = self.slots[int(m.group(1))]
                if slot.name is not None:
                    return slot.name
                got = memo.get(slot)
                if got is None:
                    got = memo[slot] = self._expand(slot.text, memo)
                return got
            return self._expand_region(self.regions[int(m.group(2))], memo)
        return _MARK.sub(one, text)

    def _expand_region(self, reg: Region, memo: dict) -> str:
        got = memo.get(reg)
        if got is None:
            value = self._expand(reg.text, memo)
            if reg.decls:
                decls = "".join(f"const {s.ctype} {s.name} = {self._expand(s.text, memo)}; " for s in reg.decls)
                value = f"({{ {decls}{value}; }})"
            got = memo[reg] = value
        return got
