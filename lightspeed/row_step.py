"""A call of a compiled program that is checked once and then repeated cheaply: the decode step.

A decode step passes the same weights and KV caches every time; only a few small inputs (the token ids)
and dimension values (the position) change, and each cache output goes into rows ``pos ..`` of its cache.
``CompiledGraph.run`` validates all of that on every call (~150 us for SmolLM2's 61 inputs and 60 outputs).
A ``RowStep`` validates the fixed inputs once, when it is made, and per call only what changes:

    step = RowStep(prog, {"tokens": ids, **caches}, writes={1: "k0", 2: "v0", ...}, varying=["tokens"])
    logits, = step.run({"tokens": ids}, {"pos": 7}, row=7)   # outputs 1, 2, ... went into the caches' rows

The fixed arrays are held (so their addresses stay theirs); a caller that swaps one makes a new RowStep.
With no ``writes`` it is just the checked-once call: a program whose donated inputs (head-major KV caches) it
updates in place itself.
As with ``CompiledGraph.run(out=...)``, the written rows may overlap an input only where the program does
not read it (a decode step reads the cache rows before ``pos`` and the new rows from its own outputs).
Executors that can (the C backend: ``run_rows``) get the rows' addresses directly; others run the
ordinary path with the row slices as ``out``.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from . import symbolic as sym
from .runtime import CompiledGraph, check_donated

__all__ = ["RowStep"]


class RowStep:
    """``run(varying, dims, row)``: the outputs not in ``writes`` (a list, in output order); output ``k`` in
    ``writes`` is written into rows ``row .. row + n - 1`` (axis 0) of the input named ``writes[k]``."""

    def __init__(self, graph: CompiledGraph, inputs: Mapping[str, np.ndarray], writes: Mapping[int, str],
                 varying: Sequence[str], dims: Mapping[str, int] | None = None):
        self.graph = graph
        arrays, env = graph.bind(inputs, dims)  # every check of the ordinary path, once
        self.arrays = dict(arrays)
        self.varying = list(varying)
        unknown = [n for n in self.varying if n not in arrays]
        if unknown:
            raise ValueError(f"RowStep: varying input(s) {unknown} are not inputs of the program")
        spec = {name: (nd, npdt, axes) for name, nd, npdt, axes, _ in graph.input_spec()}
        self._varying_spec = [(n, *spec[n]) for n in self.varying]
        partial = [n for n, nd, _, axes in self._varying_spec if len(axes) != nd]
        if partial:
            raise ValueError(f"RowStep: varying input(s) {partial} have an axis sized by an expression of "
                             "dimensions; call the program directly")
        # the dimensions the fixed inputs determine stay as they are; the others come with each call
        fixed = set(arrays) - set(self.varying)
        self._fixed_env = {}
        for name in fixed:
            for k, kind, val in spec[name][2]:
                if kind == 1:
                    self._fixed_env[val] = arrays[name].shape[k]
        self._bounds = graph.dim_bounds()
        n_out = len(graph.program.outputs)
        self.writes: dict[int, str] = {}
        for k, name in writes.items():
            if not (type(k) is int and 0 <= k < n_out):
                raise ValueError(f"RowStep: output index {k!r} is not one of 0..{n_out - 1}")
            if name not in fixed:
                raise ValueError(f"RowStep: output {k} must go into a fixed input, not {name!r}")
            target = arrays[name]
            check_donated(name, target)  # written in place: writable, contiguous, aligned
            if target.ndim == 0:
                raise ValueError(f"RowStep: input {name!r} has no rows to write into")
            self.writes[k] = name
        self._kept = [k for k in range(n_out) if k not in self.writes]
        # no written outputs (a program that updates donated inputs itself): no rows to bound
        self._capacity = min((arrays[n].shape[0] for n in self.writes.values()), default=None)
        self._out_dtypes = [node.dtype.np for node, _ in graph.program.outputs]
        for k, name in self.writes.items():
            if self._out_dtypes[k] != arrays[name].dtype:
                raise ValueError(f"RowStep: output {k} is {self._out_dtypes[k]}, but {name!r} is "
                                 f"{arrays[name].dtype}")
        # the dimensions the written outputs' shapes depend on -> their row count (shapes checked)
        written_shapes = [s for k in self.writes for s in graph.program.outputs[k][1].shape]
        self._shape_dims = sorted({v.name for v in sym.free_vars(*written_shapes)})
        self._rows_by_env: dict[tuple, int] = {}
        self._rows_of(env)
        executor = graph.executor
        self._native = None
        if hasattr(executor, "prepare_rows"):
            self._native = executor.prepare_rows({k: arrays[n] for k, n in self.writes.items()}, self.varying)

    def _rows_of(self, env: Mapping[str, int]) -> int:
        """Rows of the written outputs under ``env`` (every written output must have the same count and
        its target's row shape)."""
        key = tuple(env[name] for name in self._shape_dims)
        rows = self._rows_by_env.get(key)
        if rows is not None:
            return rows
        counts = set()
        for (node, st), k in ((self.graph.program.outputs[k], k) for k in self.writes):
            shape = tuple(int(sym.evaluate(s, env)) for s in st.shape)
            target = self.arrays[self.writes[k]]
            if not shape or shape[1:] != target.shape[1:]:
                raise ValueError(f"RowStep: output {k} has shape {shape}; rows of input {self.writes[k]!r} "
                                 f"have shape {target.shape[1:]}")
            counts.add(shape[0])
        if len(counts) > 1:
            raise ValueError(f"RowStep: the written outputs have different row counts {sorted(counts)}")
        rows = counts.pop() if counts else 0
        self._rows_by_env[key] = rows
        return rows

    def run(self, varying: Mapping[str, np.ndarray], dims: Mapping[str, int], row: int) -> list[np.ndarray]:
        """One call; raises ValueError naming the problem (the call does not run)."""
        env = dict(self._fixed_env)
        for k, v in dims.items():
            if type(v) is not int:
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                    raise ValueError(f"dimension {k!r} must be an int, got {type(v).__name__}")
                v = int(v)
            env[k] = v
        arrays = self.arrays
        if len(varying) != len(self._varying_spec):
            raise ValueError(f"RowStep.run: pass exactly the varying inputs {self.varying}")
        for name, nd, npdt, axes in self._varying_spec:
            a = varying.get(name)
            if type(a) is not np.ndarray or a.dtype != npdt or a.ndim != nd:
                got = "nothing" if a is None else f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}"
                raise ValueError(f"input {name!r}: expected a {npdt} array of {nd} axes, got {got}")
            shp = a.shape
            for k, kind, val in axes:
                if kind == 0:
                    if shp[k] != val:
                        raise ValueError(f"input {name!r} axis {k} has size {shp[k]}, expected {val}")
                elif env.setdefault(val, shp[k]) != shp[k]:
                    raise ValueError(f"input {name!r} axis {k} has size {shp[k]}, but dimension {val!r} is "
                                     f"{env[val]}")
            arrays[name] = a
        for name, lo, hi in self._bounds:
            v = env.get(name)
            if v is None:
                raise ValueError(f"dimension {name!r} is unbound; pass it in dims")
            if not lo <= v <= hi:
                raise ValueError(f"dimension {name!r} = {v} is outside its bounds [{lo}, {hi}]")
        if len(env) != len(self._bounds):
            raise ValueError(f"unknown dimension(s) {sorted(set(env) - {b[0] for b in self._bounds})}")
        rows = self._rows_of(env)
        if self._capacity is not None and (type(row) is not int or row < 0 or row + rows > self._capacity):
            raise ValueError(f"RowStep.run: rows {row}..{row + rows - 1} do not fit the {self._capacity} rows "
                             "of the written inputs")
        if self._native is not None:
            outs = self.graph.executor.run_rows(arrays, env, self._native, row)
        else:
            out = {k: arrays[n][row:row + rows] for k, n in self.writes.items()}
            outs = list(self.graph.run(arrays, env, out=out))
        return [outs[k] for k in self._kept]
