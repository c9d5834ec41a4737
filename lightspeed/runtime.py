"""CompiledGraph: validates inputs and dimension values, then runs a backend's executor."""
from __future__ import annotations

from typing import Mapping, Protocol

import numpy as np

from . import dtypes as dt
from . import symbolic as sym
from .graph import Program
from .shape import _shape_str


# numpy's flag bits (ndarray.flags.num) a donated input needs: C-contiguous, aligned, writeable
DONATABLE_FLAGS = 0x0001 | 0x0100 | 0x0400


def check_donated(name: str, a: np.ndarray) -> None:
    """Raise ValueError unless ``a`` can be updated in place as the donated input ``name``: native code
    writes it directly, so read-only memory would crash the process (or change immutable bytes), and a
    non-contiguous or misaligned array would be copied, leaving the caller's array unchanged."""
    flags = a.flags
    if not flags.writeable:
        raise ValueError(f"input {name!r} is donated (updated in place) but is read-only (a np.memmap opened "
                         "with mode 'r', np.frombuffer of bytes, or a read-only view?); pass a writable array, "
                         "e.g. np.array(x)")
    if not flags.c_contiguous:
        raise ValueError(f"input {name!r} is donated (updated in place) but is not C-contiguous; pass "
                         "np.ascontiguousarray(x) and use the array returned")
    if not flags.aligned:
        raise ValueError(f"input {name!r} is donated (updated in place) but its data is not aligned to its "
                         f"{a.dtype.itemsize}-byte elements; pass an aligned copy, e.g. np.array(x)")


class Executor(Protocol):
    def run(self, inputs: dict[str, np.ndarray], env: dict[str, int]) -> list[np.ndarray]: ...


class CompiledGraph:
    """A compiled program: ``prog(dims=None, **inputs)`` returns a tuple of numpy arrays."""

    def __init__(self, program: Program, executor: Executor):
        self.program = program
        self.executor = executor
        self.input_names = [n.arg for n in program.inputs]
        # a precomputed description of the inputs for the fast validation path
        self._spec = []
        self._late_checks = False
        for n in program.inputs:
            axes = []
            for k, s in enumerate(n.shape):
                if isinstance(s, sym.Var):
                    axes.append((k, 1, s.name))
                elif isinstance(s, sym.Expr):
                    self._late_checks = True
                else:
                    axes.append((k, 0, int(s)))
            self._spec.append((n.arg, len(n.shape), n.dtype.np, tuple(axes), n.arg in program.donated))
        self._bounds = [(v.name, v.lo, v.hi) for v in program.dims]
        # output dtypes and shapes for checking ``out`` arrays quickly: an axis is an int, a dimension's
        # name, or an expression
        self._out_spec = [(node.dtype, tuple(int(s) if sym.is_const(s) else s.name if isinstance(s, sym.Var) else s
                                             for s in st.shape)) for node, st in program.outputs]

    def input_spec(self) -> list[tuple]:
        """Per input: (name, number of axes, numpy dtype, axes, donated); an axis is (index, 0, size) or
        (index, 1, dimension name); an axis whose size is another expression is left out of ``axes``."""
        return list(self._spec)

    def dim_bounds(self) -> list[tuple[str, int, int]]:
        """(name, lowest, highest value) of each dimension."""
        return list(self._bounds)

    def bind(self, inputs: Mapping[str, np.ndarray], dims: Mapping[str, int] | None = None) -> tuple[dict, dict]:
        """Check every input and dimension; return (arrays, dimension values). Raises ValueError."""
        env: dict[str, int] = {}
        for k, v in (dims or {}).items():
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"dimension {k!r} must be an int, got {type(v).__name__}")
            env[k] = int(v)
        known = {v.name: v for v in self.program.dims}
        for k in env:
            if k not in known:
                raise ValueError(f"unknown dimension {k!r}; this program has dimensions {sorted(known)}")
        arrays: dict[str, np.ndarray] = {}
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise ValueError(f"missing input(s) {missing}; expected {self.input_names}")
        extra = [k for k in inputs if k not in self.input_names]
        if extra:
            raise ValueError(f"unexpected input(s) {extra}; expected {self.input_names}")
        for node in self.program.inputs:
            name = node.arg
            a = inputs[name]
            if not isinstance(a, np.ndarray):
                raise ValueError(f"input {name!r} must be a numpy array, got {type(a).__name__}")
            want = node.dtype.np
            if a.dtype != want:
                raise ValueError(f"input {name!r} has dtype {a.dtype}, expected {node.dtype.name}")
            if a.ndim != len(node.shape):
                raise ValueError(f"input {name!r} has shape {a.shape}, expected {_shape_str(node.shape)}")
            for ax, (s, actual) in enumerate(zip(node.shape, a.shape)):
                if isinstance(s, sym.Var):
                    if s.name in env and env[s.name] != actual:
                        raise ValueError(f"input {name!r} axis {ax} has size {actual}, but dimension {s.name!r} "
                                         f"is {env[s.name]}")
                    env[s.name] = actual
            if name in self.program.donated:
                check_donated(name, a)
            arrays[name] = a
        for v in self.program.dims:
            if v.name not in env:
                raise ValueError(f"dimension {v.name!r} is unbound: no input determines it; "
                                 f"pass dims={{'{v.name}': ...}}")
            if not v.lo <= env[v.name] <= v.hi:
                raise ValueError(f"dimension {v.name!r} = {env[v.name]} is outside its bounds [{v.lo}, {v.hi}]")
        for node in self.program.inputs:
            a = arrays[node.arg]
            want = tuple(int(sym.evaluate(s, env)) for s in node.shape)
            if a.shape != want:
                raise ValueError(f"input {node.arg!r} has shape {a.shape}, expected {want} "
                                 f"(from {_shape_str(node.shape)} with {env})")
        return arrays, env

    def _fast_bind(self, inputs: Mapping[str, np.ndarray], dims: Mapping[str, int] | None) -> dict | None:
        """The dimension values when every check passes, else None (then ``bind`` explains the problem)."""
        if len(inputs) != len(self._spec) or self._late_checks:
            return None
        env = {}
        if dims:
            for k, v in dims.items():
                if type(v) is not int:
                    return None
                env[k] = v
        for name, nd, npdt, axes, donated in self._spec:
            a = inputs.get(name)
            if type(a) is not np.ndarray or a.dtype != npdt or a.ndim != nd:
                return None
            if donated and a.flags.num & DONATABLE_FLAGS != DONATABLE_FLAGS:
                return None
            shp = a.shape
            for k, kind, val in axes:
                if kind == 0:
                    if shp[k] != val:
                        return None
                elif env.setdefault(val, shp[k]) != shp[k]:
                    return None
        if len(env) != len(self._bounds):
            return None
        for name, lo, hi in self._bounds:
            v = env.get(name)
            if v is None or not lo <= v <= hi:
                return None
        return env

    def __call__(self, dims: Mapping[str, int] | None = None, **inputs: np.ndarray) -> tuple[np.ndarray, ...]:
        env = self._fast_bind(inputs, dims)
        if env is None:
            inputs, env = self.bind(inputs, dims)
        return tuple(self.executor.run(inputs, env))

    def run(self, inputs: Mapping[str, np.ndarray], dims: Mapping[str, int] | None = None,
            out: Mapping[int, np.ndarray] | None = None) -> tuple[np.ndarray, ...]:
        """Like calling the program, with ``out``: output index -> a C-contiguous, writable array of that
        output's shape and dtype, which receives the output (no new array; e.g. rows of a KV cache).
        An ``out`` array may overlap an input only where the program does not read that input."""
        env = self._fast_bind(inputs, dims)
        if env is None:
            inputs, env = self.bind(inputs, dims)
        if not out:
            return tuple(self.executor.run(inputs, env))
        checked = self._check_out(out, env)
        if getattr(self.executor, "writes_into", False):
            return tuple(self.executor.run(inputs, env, out=checked))
        result = list(self.executor.run(inputs, env))
        for k, o in checked.items():
            o[...] = result[k]
            result[k] = o
        return tuple(result)

    def _check_out(self, out: Mapping[int, np.ndarray], env: Mapping[str, int]) -> dict[int, np.ndarray]:
        n = len(self._out_spec)
        checked = {}
        for k, o in out.items():
            if type(k) is not int and (isinstance(k, bool) or not isinstance(k, (int, np.integer))) or not 0 <= k < n:
                raise ValueError(f"out: output index {k!r} is not one of 0..{n - 1}")
            dtype, shape = self._out_spec[k]
            want = tuple(s if type(s) is int else env[s] if type(s) is str else int(sym.evaluate(s, env))
                         for s in shape)
            if type(o) is not np.ndarray:
                raise ValueError(f"out[{k}] must be a numpy array, got {type(o).__name__}")
            if o.dtype != dtype.np or o.shape != want:
                raise ValueError(f"out[{k}] is {o.dtype}{list(o.shape)}, but output {k} is {dtype.name}{list(want)}")
            flags = o.flags
            if not flags.c_contiguous or not flags.writeable:
                raise ValueError(f"out[{k}] must be a C-contiguous, writable array")
            checked[int(k)] = o
        return checked

    def output_shapes(self, env: Mapping[str, int]) -> list[tuple[int, ...]]:
        return [tuple(int(sym.evaluate(s, env)) for s in st.shape) for _, st in self.program.outputs]

    @property
    def arena_bytes(self) -> int:
        """Bytes of intermediate memory the executor allocates (0 where it does not plan memory)."""
        return int(getattr(self.executor, "arena_bytes", 0))


def output_dtype_numpy(d: dt.DType) -> np.dtype:
    return d.np
