"""Property tests of views: random chains of movement ops, compared element for element with numpy.

Each chain starts from an input whose shape mixes static and symbolic dimensions, applies at least
six movement ops (reshape merges/splits, permute, expand, shrink, pad, flip, strided and integer
``__getitem__``), is compiled once with the reference backend and run at two bindings of the
symbolic dimensions. The same ops are replayed with numpy on the concrete arrays.
"""
from __future__ import annotations

import random

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lightspeed as ls
import lightspeed.symbolic as sym

MAX_ELEMENTS = 4096  # upper bound on a view's element count, to keep the reference fast

NumpyOp = Callable[[np.ndarray, dict], np.ndarray]


def ev(x, env: dict) -> int:
    return int(sym.evaluate(x, env))


def lo_of(size) -> int:
    """A lower bound of a dimension (interval bounds of expressions can dip below 0; sizes cannot)."""
    return max(sym.to_expr(size).lo, 0)


def hi_of(x) -> int:
    return sym.to_expr(x).hi


@dataclass
class Chain:
    """A tensor, the factors whose product is each of its dims, and the numpy replay of its ops."""

    t: ls.Tensor
    parts: list[list]                      # parts[k]: atoms (ints or expressions) whose product is shape[k]
    replay: list[NumpyOp] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    extra_vars: dict[str, sym.Var] = field(default_factory=dict)   # dims no input determines

    @property
    def shape(self):
        return self.t.shape

    def push(self, t: ls.Tensor, parts: list[list], np_op: NumpyOp, name: str) -> None:
        self.t, self.parts = t, parts
        self.replay.append(np_op)
        self.names.append(name)
        assert len(self.t.shape) == len(self.parts)


def numel_hi(shape) -> int:
    out = 1
    for s in shape:
        out *= max(hi_of(s), 1)
    return out


# --------------------------------------------------------------------------------------------
# the movement ops, each applied to the Tensor and recorded for numpy


def op_merge(c: Chain, choose) -> bool:
    if c.t.ndim < 2:
        return False
    k = choose(0, c.t.ndim - 2)
    new = c.shape[:k] + (sym.mul(c.shape[k], c.shape[k + 1]),) + c.shape[k + 2:]
    parts = c.parts[:k] + [c.parts[k] + c.parts[k + 1]] + c.parts[k + 2:]
    c.push(c.t.reshape(new), parts, lambda a, env: a.reshape(tuple(ev(s, env) for s in new)), f"merge{k}")
    return True


def op_split(c: Chain, choose) -> bool:
    """Split an axis between two of its factors, or a static axis into two factors."""
    if c.t.ndim == 0:
        return False
    k = choose(0, c.t.ndim - 1)
    atoms = c.parts[k]
    if len(atoms) >= 2:
        cut = choose(1, len(atoms) - 1)
        left, right = atoms[:cut], atoms[cut:]
    elif sym.is_const(c.shape[k]) and int(c.shape[k]) > 1:
        n = int(c.shape[k])
        divs = [d for d in range(1, n + 1) if n % d == 0]
        d = divs[choose(0, len(divs) - 1)]
        left, right = [d], [n // d]
    else:  # a single symbolic factor: split off a unit axis
        left, right = ([1], atoms) if choose(0, 1) else (atoms, [1])
    new = c.shape[:k] + (sym.prod(left), sym.prod(right)) + c.shape[k + 1:]
    parts = c.parts[:k] + [left, right] + c.parts[k + 1:]
    c.push(c.t.reshape(new), parts, lambda a, env: a.reshape(tuple(ev(s, env) for s in new)), f"split{k}")
    return True


def op_reshape_static(c: Chain, choose) -> bool:
    """An arbitrary reshape of an all-static shape (may need a second view)."""
    if not all(sym.is_const(s) for s in c.shape):
        return False
    n = int(np.prod([int(s) for s in c.shape]))
    if n == 0:
        return False
    new = []
    rest = n
    for _ in range(choose(0, 3)):
        divs = [d for d in range(1, rest + 1) if rest % d == 0]
        d = divs[choose(0, len(divs) - 1)]
        new.append(d)
        rest //= d
    new.append(rest)
    new = tuple(new)
    c.push(c.t.reshape(new), [[s] for s in new], lambda a, env: a.reshape(new), f"reshape{new}")
    return True


def op_permute(c: Chain, choose) -> bool:
    if c.t.ndim < 2:
        return False
    order = list(range(c.t.ndim))
    for k in range(len(order) - 1, 0, -1):  # Fisher-Yates with hypothesis-driven choices
        j = choose(0, k)
        order[k], order[j] = order[j], order[k]
    order = tuple(order)
    c.push(c.t.permute(order), [c.parts[o] for o in order], lambda a, env: np.transpose(a, order), f"permute{order}")
    return True


def op_expand(c: Chain, choose) -> bool:
    """Insert a unit axis (or use an existing one) and expand it to a static or symbolic size."""
    units = [k for k, s in enumerate(c.shape) if sym.same(s, 1)]
    if not units:
        k = choose(0, c.t.ndim)
        t = c.t.unsqueeze(k)
        parts = c.parts[:k] + [[1]] + c.parts[k:]
        unsq_shape = t.shape
        c.push(t, parts, lambda a, env: a.reshape(tuple(ev(s, env) for s in unsq_shape)), f"unsqueeze{k}")
        units = [k]
    k = units[choose(0, len(units) - 1)]
    if choose(0, 2) == 0:
        name = f"e{len(c.extra_vars)}"
        size = sym.dim(name, 1, 3)
        c.extra_vars[name] = size
    else:
        size = choose(2, 3)
    if numel_hi(c.shape) * hi_of(size) > MAX_ELEMENTS:
        return True  # the unsqueeze counts as a movement op on its own
    new = c.shape[:k] + (size,) + c.shape[k + 1:]
    parts = c.parts[:k] + [[size]] + c.parts[k + 1:]
    c.push(c.t.expand(new), parts, lambda a, env: np.broadcast_to(a, tuple(ev(s, env) for s in new)), f"expand{k}")
    return True


def op_shrink(c: Chain, choose) -> bool:
    if c.t.ndim == 0:
        return False
    ranges = []
    for s in c.shape:
        if choose(0, 2) == 0:
            ranges.append((0, s))
            continue
        b = choose(0, min(2, lo_of(s)))
        if choose(0, 4) == 0:                                 # a symbolic start, to the end
            name = f"b{len(c.extra_vars)}"
            start = sym.dim(name, 0, min(2, lo_of(s)))
            c.extra_vars[name] = start
            ranges.append((start, s))
            continue
        if sym.is_const(s) or choose(0, 1):
            e = choose(b, lo_of(s)) if not sym.is_const(s) else choose(b, int(s))
        else:
            e = sym.add(s, -choose(0, lo_of(s) - b))  # a symbolic end: size - k
        ranges.append((b, e))
    ranges = tuple(ranges)
    c.push(c.t.shrink(ranges), [[sym.add(e, -b)] for b, e in ranges],
           lambda a, env: a[tuple(slice(ev(b, env), ev(e, env)) for b, e in ranges)], f"shrink{ranges}")
    return True


def op_pad(c: Chain, choose) -> bool:
    if c.t.ndim == 0:
        return False
    def amount():
        if choose(0, 5):
            return choose(0, 2)
        name = f"p{len(c.extra_vars)}"                        # a symbolic pad amount
        c.extra_vars[name] = sym.dim(name, 0, 2)
        return c.extra_vars[name]
    pads = tuple((amount(), amount()) if choose(0, 1) else (0, 0) for _ in c.shape)
    grown = [sym.add(s, b + a) for s, (b, a) in zip(c.shape, pads)]
    if numel_hi(grown) > MAX_ELEMENTS:
        return False
    c.push(c.t.pad(pads), [[g] for g in grown],
           lambda a, env: np.pad(a, [(ev(b, env), ev(e, env)) for b, e in pads]), f"pad{pads}")
    return True


def op_flip(c: Chain, choose) -> bool:
    if c.t.ndim == 0:
        return False
    axes = tuple(k for k in range(c.t.ndim) if choose(0, 1))
    if not axes:
        axes = (choose(0, c.t.ndim - 1),)
    c.push(c.t.flip(axes), [list(p) for p in c.parts], lambda a, env: np.flip(a, axes), f"flip{axes}")
    return True


def op_getitem(c: Chain, choose) -> bool:
    """Indexing with ints, strided slices, None, reversed slices and symbolic bounds."""
    if c.t.ndim == 0:
        return False
    idx, parts = [], []
    for s, p in zip(c.shape, c.parts):
        kind = choose(0, 6)
        static = sym.is_const(s)
        n = int(s) if static else lo_of(s)
        if kind == 0 and n >= 1:                              # an int index drops the axis
            i = choose(-n, n - 1)
            idx.append(i)
        elif kind == 1 and static and n >= 2:                 # a strided slice
            step, start = choose(2, 3), choose(0, n - 1)
            idx.append(slice(start, None, step))
            parts.append([len(range(start, n, step))])
        elif kind == 2:                                       # reversed
            idx.append(slice(None, None, -1))
            parts.append(list(p))
        elif kind == 3:                                       # a stop bound by a new symbolic dim
            name = f"k{len(c.extra_vars)}"
            k = sym.dim(name, 0, n)
            c.extra_vars[name] = k
            idx.append(slice(None, k))
            parts.append([k])
        elif kind == 4 and n >= 1:                            # a negative start
            start = -choose(1, n)
            idx.append(slice(start, None))
            parts.append(None)
        else:
            idx.append(slice(None))
            parts.append(list(p))
        if kind == 5 and choose(0, 1):                        # a new unit axis
            idx.append(None)
            parts.append([1])
    idx = tuple(idx)
    t = c.t[idx]
    assert len(parts) == t.ndim, f"{idx} on {c.shape} gave {t.shape}"
    # keep the known factors of an axis only where they still multiply to its size
    parts = [p if p is not None and sym.same(sym.prod(p), s) else [s] for p, s in zip(parts, t.shape)]

    def apply(a, env):
        def conv(i):
            if isinstance(i, slice):
                return slice(*(None if v is None else ev(v, env) for v in (i.start, i.stop)), i.step)
            return i
        return a[tuple(conv(i) for i in idx)]

    c.push(t, parts,
           apply, f"getitem{idx}")
    return True


def op_contiguous(c: Chain, choose) -> bool:
    """Materialise the view (a compute node): later views then apply on top of a node."""
    c.push(c.t.contiguous(), [list(p) for p in c.parts], lambda a, env: a, "contiguous")
    return True


MOVEMENT_OPS = [op_merge, op_split, op_reshape_static, op_permute, op_expand, op_shrink, op_pad, op_flip,
                op_getitem]


# --------------------------------------------------------------------------------------------
# the property


def random_input(choose):
    """A shape of rank 1..4 mixing static dims and symbolic dims (with their bounds)."""
    shape, dims = [], {}
    for k in range(choose(1, 4)):
        if choose(0, 2) == 0:
            lo = choose(1, 3)
            v = sym.dim(f"s{k}", lo, lo + choose(0, 3))
            dims[v.name] = v
            shape.append(v)
        else:
            shape.append(choose(1, 5))
    return tuple(shape), dims


def concrete_env(dims: dict[str, sym.Var], choose) -> dict[str, int]:
    return {name: choose(v.lo, v.hi) for name, v in dims.items()}


def check_random_chain(choose, backend: str = "reference") -> Chain:
    """Build a random chain with ``choose(lo, hi)`` as the source of choices and compare it with numpy."""
    shape, in_dims = random_input(choose)
    dtype = (ls.float32, ls.int32)[choose(0, 1)]
    g = ls.Graph()
    x = g.input("x", shape, dtype)
    c = Chain(x, [[s] for s in shape])
    moves = 0
    while moves < 6 or (moves < 10 and choose(0, 1)):
        if choose(0, 9) == 0:
            op_contiguous(c, choose)
        op = MOVEMENT_OPS[choose(0, len(MOVEMENT_OPS) - 1)]
        if op(c, choose):
            moves += 1
    prog = g.compile([c.t], backend=backend)
    all_dims = {**in_dims, **c.extra_vars}
    for _ in range(2):
        env = concrete_env(all_dims, choose)
        x_np = (np.arange(int(np.prod([ev(s, env) for s in shape]))) + 1).reshape([ev(s, env) for s in shape])
        x_np = x_np.astype(dtype.np)
        want = x_np
        for np_op in c.replay:
            want = np_op(want, env)
        dims = {v.name: env[v.name] for v in prog.program.dims if v.name not in in_dims}
        where = f"ops {c.names} on input shape {shape} with {env}"
        try:
            (got,) = prog(x=x_np, dims=dims)
        except Exception as e:
            raise AssertionError(f"the {backend} backend failed: {e!r}: {where}") from e
        assert got.shape == want.shape, f"shape {got.shape} != numpy {want.shape}: {where}"
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want, err_msg=where)
    return c


class Tape:
    """Choices read from a byte string that hypothesis draws (and shrinks) in one go.

    A chain needs ~150 choices; one ``data.draw`` each costs more than building and running the
    chain. When the bytes run out, a PRNG seeded by them continues, so every byte string is a chain.
    """

    def __init__(self, raw: bytes):
        self.raw, self.pos, self.rng = raw, 0, random.Random(raw)

    def __call__(self, lo: int, hi: int) -> int:
        span = hi - lo + 1
        width = 1 if span <= 256 else 2
        if span <= 0:
            raise ValueError(f"empty choice range [{lo}, {hi}]")
        if self.pos + width > len(self.raw):
            return self.rng.randint(lo, hi)
        v = int.from_bytes(self.raw[self.pos:self.pos + width], "little")
        self.pos += width
        return lo + v % span


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=64, max_size=400))
def test_random_view_chains_match_numpy(raw):
    check_random_chain(Tape(raw))


# --------------------------------------------------------------------------------------------
# a few fixed cases that the random chains rely on


def test_reshape_of_permuted_view_needs_a_second_view_and_is_still_right():
    g = ls.Graph()
    x = g.input("x", (2, 3, 4), ls.float32)
    y = x.permute(2, 0, 1).reshape(4, 6).flip(1)[1:, ::2]
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (got,) = g.compile([y], backend="reference")(x=a)
    np.testing.assert_array_equal(got, np.flip(a.transpose(2, 0, 1).reshape(4, 6), 1)[1:, ::2])


def test_symbolic_pad_and_shrink_round_trip():
    seq = ls.dim("seq", 1, 16)
    g = ls.Graph()
    x = g.input("x", (seq, 3), ls.float32)
    y = x.pad(((2, 1), (0, 0))).shrink(((2, sym.add(seq, 2)), (0, 3)))
    prog = g.compile([y], backend="reference")
    for n in (1, 7):
        a = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
        (got,) = prog(x=a)
        np.testing.assert_array_equal(got, a)


def test_view_errors_name_the_op_and_shapes():
    g = ls.Graph()
    x = g.input("x", (2, 3), ls.float32)
    with pytest.raises(ValueError, match=r"reshape.*\(2, 3\).*\(4, 2\)"):
        x.reshape(4, 2)
    with pytest.raises(ValueError, match=r"expand.*\(2, 3\).*\(2, 4\)"):
        x.expand(2, 4)
    with pytest.raises(ValueError, match=r"slice.*\[1, 5\).*size 3"):
        x.shrink(((0, 2), (1, 5)))
    with pytest.raises(ValueError, match="permute"):
        x.permute(0, 0)
