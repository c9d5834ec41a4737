"""The reference backend: a numpy interpreter of the primitive graph, node by node.

It is the oracle every other backend is tested against, so it favours being
obviously right over being fast: views are applied by evaluating their index
and validity expressions over the whole index grid (with a strided fast path
for plain views).
"""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..graph import ArrayConst, Node, Program
from ..ops import Op
from ..shape import ShapeTracker
from . import register_backend


def _concrete(shape, env) -> tuple[int, ...]:
    return tuple(int(sym.evaluate(s, env)) for s in shape)


_INDEX_CACHE: dict[ShapeTracker, tuple] = {}


def _index_exprs(st: ShapeTracker):
    got = _INDEX_CACHE.get(st)
    if got is None:
        idx = [sym.Var(f"_i{k}", 0, max(sym.upper_bound(s) - 1, 0)) for k, s in enumerate(st.shape)]
        got = st.index(idx)
        if len(_INDEX_CACHE) > 100_000:
            _INDEX_CACHE.clear()
        _INDEX_CACHE[st] = got
    return got


def apply_view(base: np.ndarray, st: ShapeTracker, env: dict[str, int]) -> np.ndarray:
    """The values a consumer sees through ``st`` of a dense array ``base`` (0 where the view is invalid)."""
    # values may be stride-0 broadcasts (a cast of an expanded scalar): flatten a dense copy
    flat = np.ascontiguousarray(base).reshape(-1)
    shape = _concrete(st.shape, env)
    if len(st.views) == 1 and st.views[0].mask is None:
        v = st.views[0]
        strides = [int(sym.evaluate(s, env)) for s in v.strides]
        off = int(sym.evaluate(v.offset, env))
        if all(s >= 0 for s in strides) and 0 <= off <= flat.size:
            if 0 in shape:
                return np.zeros(shape, base.dtype)
            return np.lib.stride_tricks.as_strided(flat[off:], shape, [s * flat.itemsize for s in strides],
                                                   writeable=False)
    if 0 in shape:
        return np.zeros(shape, base.dtype)
    index, valid = _index_exprs(st)
    grid = np.indices(shape, dtype=np.int64) if shape else np.zeros((0,), np.int64)
    local = dict(env)
    for k in range(len(shape)):
        local[f"_i{k}"] = grid[k]
    idx = np.broadcast_to(np.asarray(sym.evaluate(index, local), dtype=np.int64), shape)
    ok = np.broadcast_to(np.asarray(sym.evaluate(valid, local)) != 0, shape)
    safe = np.where(ok, idx, 0)
    if flat.size == 0:
        return np.zeros(shape, base.dtype)
    out = flat[np.clip(safe, 0, flat.size - 1)]
    return np.where(ok, out, np.zeros((), base.dtype))


def _round(x: np.ndarray, d: dt.DType) -> np.ndarray:
    """Round compute values to the precision of ``d`` (bfloat16 is computed in float32)."""
    if d is dt.bfloat16:
        return dt.bf16_to_f32(dt.f32_to_bf16(x))
    return x.astype(d.np, copy=False)


def _compute_dtype(d: dt.DType) -> np.dtype:
    return np.dtype(np.float32) if d is dt.bfloat16 else d.np


_UNARY = {
    Op.LOG2: np.log2,
    Op.EXP2: np.exp2,
    Op.SIN: np.sin,
    Op.SQRT: np.sqrt,
    Op.RECIP: lambda x: np.reciprocal(x),
}


def _mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        safe = np.where(b == 0, 1, b)
        return np.where(b == 0, 0, np.fmod(a, safe)).astype(a.dtype)
    return np.fmod(a, b)


def _cast(x: np.ndarray, src: dt.DType, to: dt.DType) -> np.ndarray:
    if to is dt.bool_:
        return x != 0
    if to.is_float:
        return _round(x.astype(np.float32) if to is dt.bfloat16 else x, to)
    if src.is_float:
        with np.errstate(invalid="ignore"):
            t = np.trunc(x.astype(np.float64))
            info = np.iinfo(to.np)
            t = np.where(np.isnan(t), 0, np.clip(t, info.min, info.max))
            # int64's maximum rounds up to 2**63 as a float64, which astype would wrap to the minimum
            return np.where(t >= float(info.max), info.max, t.astype(to.np)).astype(to.np)
    return x.astype(to.np)


def eval_node(n: Node, srcs: list[np.ndarray], inputs: dict[str, np.ndarray], env: dict[str, int]) -> np.ndarray:
    op = n.op
    cd = _compute_dtype(n.dtype)
    if op is Op.INPUT:
        a = inputs[n.arg]
        return dt.bf16_to_f32(a) if n.dtype is dt.bfloat16 else a
    if op is Op.CONST:
        if isinstance(n.arg, ArrayConst):
            a = n.arg.array
            return dt.bf16_to_f32(a) if n.dtype is dt.bfloat16 else a
        return np.array(n.arg, dtype=cd)
    if op is Op.IOTA:
        return np.arange(_concrete(n.shape, env)[0], dtype=cd)
    with np.errstate(all="ignore"):
        if op in _UNARY:
            return _round(_UNARY[op](srcs[0]), n.dtype)
        if op is Op.ADD:
            return _round(srcs[0] + srcs[1], n.dtype)
        if op is Op.MUL:
            a, b = srcs
            if a.dtype == np.bool_ and b.dtype != np.bool_:
                return np.where(a, b, np.zeros((), b.dtype))
            if b.dtype == np.bool_ and a.dtype != np.bool_:
                return np.where(b, a, np.zeros((), a.dtype))
            if a.dtype == np.bool_:
                return a & b
            return _round(a * b, n.dtype)
        if op is Op.MOD:
            return _round(_mod(srcs[0], srcs[1]), n.dtype)
        if op is Op.LESS_THAN:
            return srcs[0] < srcs[1]
        if op in (Op.SUM_REDUCE, Op.MAX_REDUCE):
            x = srcs[0]
            if op is Op.SUM_REDUCE:
                acc = np.float32 if n.dtype.is_float and n.dtype.itemsize < 4 else x.dtype
                return _round(np.sum(x, axis=n.arg, dtype=acc), n.dtype)
            lowest = -np.inf if n.dtype.is_float else np.iinfo(x.dtype).min
            return np.max(x, axis=n.arg, initial=lowest)
        if op is Op.CAST:
            return _cast(srcs[0], n.srcs[0][0].dtype, n.dtype)
        if op is Op.CONTIGUOUS:
            return np.array(srcs[0], order="C", copy=True)  # ascontiguousarray turns 0-d into 1-d
        if op is Op.GATHER:
            data, idx = srcs
            rows = data.shape[0]
            ok = (idx >= 0) & (idx < rows)
            picked = (data[np.where(ok, idx, 0).astype(np.int64)] if rows
                      else np.zeros(idx.shape + data.shape[1:], data.dtype))
            ok = ok.reshape(ok.shape + (1,) * (data.ndim - 1))
            return np.where(ok, picked, np.zeros((), data.dtype))
        if op is Op.SCATTER:
            dest, idx, src = srcs
            out = np.array(dest, copy=True)
            ok = (idx >= 0) & (idx < dest.shape[0])
            out[idx[ok].astype(np.int64)] = src[ok]
            return out
    raise NotImplementedError(f"reference backend: no implementation of {op}")


def interpret(program: Program, inputs: dict[str, np.ndarray], env: dict[str, int]) -> list[np.ndarray]:
    """Run every node of ``program`` with numpy and return the outputs (fresh arrays)."""
    values: dict[int, np.ndarray] = {}
    for n in program.nodes:
        srcs = [apply_view(values[s.id], st, env) for s, st in n.srcs]
        out = eval_node(n, srcs, inputs, env)
        values[n.id] = np.broadcast_to(out, _concrete(n.shape, env)) if out.shape != _concrete(n.shape, env) else out
    outs = []
    for node, st in program.outputs:
        v = np.array(apply_view(values[node.id], st, env), copy=True)
        outs.append(dt.f32_to_bf16(v) if node.dtype is dt.bfloat16 else v.astype(node.dtype.np, copy=False))
    return outs


@register_backend("reference")
class ReferenceBackend:
    """Executor for ``backend="reference"``."""

    arena_bytes = 0

    def __init__(self, program: Program, **options):
        if options:
            raise ValueError(f"the reference backend takes no options, got {sorted(options)}")
        self.program = program

    def run(self, inputs: dict[str, np.ndarray], env: dict[str, int]) -> list[np.ndarray]:
        return interpret(self.program, inputs, env)
