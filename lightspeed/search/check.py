"""Checking candidates against the reference interpreter: random inputs, dimension values, agreement."""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .. import symbolic as sym
from ..backend.reference import interpret
from ..graph import Program

RTOL = 1e-4  # candidates may reassociate float arithmetic: compare within a few hundred ulps
ATOL = 1e-5
# quantized matmuls that round their activations per block of 32 (kernel.quantized: "int16", "int8") move their
# outputs by about that rounding, far more than reassociation does: (rtol, atol relative to the largest value)
ACTIVATION_TOLERANCE = {"int16": (2e-3, 2e-3), "int8": (5e-2, 5e-2)}


def rounded_activations(plan) -> str | None:
    """The coarsest activation rounding among ``plan``'s quantized matmul kernels ("int8", "int16"), or None
    when every one takes its activations as float32 (then the plan computes the reference's values)."""
    modes = {getattr(k.template, "activations", "float") for k in plan.kernels if k.kind == "qmatmul"}
    return next((m for m in ("int8", "int16") if m in modes), None)


def plan_tolerance(plan) -> tuple[float, float]:
    """(rtol, atol) to compare two builds of programs formed like ``plan`` with (see ``outputs_agree``)."""
    return ACTIVATION_TOLERANCE.get(rounded_activations(plan), (RTOL, ATOL))


def sample_dims(program: Program, rng: np.random.Generator, cap: int = 8,
                fixed: dict[str, int] | None = None) -> dict[str, int]:
    """A value for every symbolic dimension, within its bounds and at most ``cap`` (small and fast),
    unless ``fixed`` gives it."""
    env = {}
    for v in program.dims:
        if fixed and v.name in fixed:
            env[v.name] = int(fixed[v.name])
        else:
            env[v.name] = int(rng.integers(v.lo, max(v.lo, min(v.hi, cap)) + 1))
    return env


def random_inputs(program: Program, env: dict[str, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs for ``program``: floats in [-1, 1], small non-negative integers (valid gather indices for
    small tables), random bools."""
    out = {}
    for n in program.inputs:
        shape = tuple(int(sym.evaluate(s, env)) for s in n.shape)
        d = n.dtype
        if d is dt.bool_:
            a = rng.random(shape) < 0.5
        elif d.is_int:
            a = rng.integers(0, 4, size=shape).astype(d.np)
        else:
            a = rng.uniform(-1, 1, size=shape).astype(np.float32)
            a = dt.f32_to_bf16(a) if d is dt.bfloat16 else a.astype(d.np)
        out[n.arg] = a
    return out


def outputs_agree(expected: list[np.ndarray], got: list[np.ndarray], rtol: float = RTOL,
                  atol: float = ATOL, dtypes: list[dt.DType] | None = None) -> bool:
    """True if every output has the same shape and dtype and agrees (NaN where the other is NaN; floats
    within ``rtol`` and ``atol`` scaled by the output's largest finite magnitude). ``dtypes`` names the
    outputs' Lightspeed dtypes, so bfloat16 bits are compared as numbers (within 16-bit rounding)."""
    if len(expected) != len(got):
        return False
    for k, (a, b) in enumerate(zip(expected, got)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        low = dtypes is not None and dtypes[k] in (dt.bfloat16, dt.float16)
        if dtypes is not None and dtypes[k] is dt.bfloat16:
            a, b = dt.bf16_to_f32(a), dt.bf16_to_f32(b)
        if low:
            rtol, atol = max(rtol, 1.6e-2), max(atol, 1e-2)
        if a.dtype.kind != "f":
            if not np.array_equal(a, b):
                return False
            continue
        finite = np.isfinite(a)
        scale = float(np.abs(a[finite]).max()) if finite.any() else 1.0
        if not np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol * max(scale, 1.0),
                           equal_nan=True):
            return False
    return True


def validate_program(candidate: Program, original: Program, trials: int = 2, seed: int = 0,
                     rtol: float = RTOL) -> bool:
    """True if ``candidate`` agrees with ``original`` under the reference interpreter on ``trials``
    random inputs (and dimension values)."""
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        env = sample_dims(original, rng)
        inputs = random_inputs(original, env, rng)
        try:
            want = interpret(original, inputs, dict(env))
            got = interpret(candidate, inputs, dict(env))
        except Exception:  # noqa: BLE001 - a candidate that cannot even run is rejected, not fatal
            return False
        if not outputs_agree(want, got, rtol, dtypes=[n.dtype for n, _ in original.outputs]):
            return False
    return True


TUNE_DIM_CAP = 256  # symbolic dimensions are timed at min(upper bound, this) unless given


def tune_dims(program: Program, dims: dict[str, int] | None) -> dict[str, int]:
    """The dimension values a search times at: ``dims`` where given, else min(upper bound, TUNE_DIM_CAP)."""
    return {v.name: int(dims[v.name]) if dims and v.name in dims else max(v.lo, min(v.hi, TUNE_DIM_CAP))
            for v in program.dims}
