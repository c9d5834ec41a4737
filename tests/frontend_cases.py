"""Frontend operations as test data, runnable on any backend.

A ``Case`` says how to build one op from graph inputs, how to compute the same
thing with numpy (or torch), which inputs to feed and how close the answers
must be. ``run_case(case, backend, symbolic)`` builds the graph (with static
shapes, or once with symbolic dims and then runs it at every size in
``case.sizes``), compiles it for ``backend`` and compares with the oracle.
The same list serves the reference backend (tests/test_frontend.py) and any
other backend.

Input shapes are tuples whose entries are ints or strings naming symbolic
dims, or small expressions of them ("pos+n"). The bounds of each dim are in
``DIM_BOUNDS``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import lightspeed as ls
from lightspeed import frontend as F

DIM_BOUNDS = {"n": (1, 32), "m": (1, 32), "pos": (0, 4096), "l": (4, 32)}
F32 = np.float32


# input generators: (rng, shape) -> array ----------------------------------------------------------

def normal(scale: float = 1.0):
    return lambda rng, shape: (rng.standard_normal(shape) * scale).astype(F32)


def uniform(lo: float, hi: float):
    return lambda rng, shape: rng.uniform(lo, hi, shape).astype(F32)


def small_ints(lo: int, hi: int, dtype=F32):
    """Values from a small integer set, so that ties and equalities actually occur."""
    return lambda rng, shape: rng.integers(lo, hi + 1, shape).astype(dtype)


def bools(p: float = 0.5):
    return lambda rng, shape: rng.random(shape) < p


def with_specials(base, values=(np.inf, -np.inf, np.nan), frac: float = 0.25):
    """``base`` with a fraction of entries replaced by special values."""
    def gen(rng, shape):
        a = base(rng, shape)
        hit = rng.random(shape) < frac
        return np.where(hit, rng.choice(np.asarray(values, F32), shape), a).astype(a.dtype)
    return gen


@dataclass(frozen=True)
class Input:
    shape: tuple
    gen: Callable = normal()
    dtype: object = ls.float32


Build = Callable[[ls.Graph, dict, dict], "ls.Tensor"]      # (graph, tensors, dims) -> output
Oracle = Callable[[dict, dict], np.ndarray]                # (arrays, dim values) -> expected


@dataclass(frozen=True)
class Case:
    name: str
    inputs: dict
    build: Build
    oracle: Oracle
    rtol: float = 1e-5
    atol: float = 1e-6
    sizes: tuple = ({"n": 3}, {"n": 6})
    torch: bool = False                 # the oracle needs torch
    symbolic: bool = True               # False where the op needs static shapes
    seed: int = 0
    tags: tuple = field(default=())


def _dim_value(spec, dims: dict):
    if isinstance(spec, int):
        return spec
    return eval(spec, {"__builtins__": {}}, dict(dims))  # noqa: S307 - tiny shape expressions of our own


def build_graph(case: Case, dims: dict):
    """The graph, its output tensor and the input tensors, with dims given as ints or symbolic Vars."""
    g = ls.Graph()
    tensors = {name: g.input(name, tuple(_dim_value(s, dims) for s in inp.shape), inp.dtype)
               for name, inp in case.inputs.items()}
    return g, case.build(g, tensors, dims), tensors


def make_arrays(case: Case, sizes: dict, rng: np.random.Generator) -> dict:
    out = {}
    for name, inp in case.inputs.items():
        shape = tuple(int(_dim_value(s, sizes)) for s in inp.shape)
        a = inp.gen(rng, shape)
        out[name] = a.astype(inp.dtype.np) if a.dtype != inp.dtype.np else a
    return out


def check_close(case: Case, got: np.ndarray, want: np.ndarray, where: str) -> None:
    want = np.asarray(want)
    assert got.shape == want.shape, f"{case.name} ({where}): shape {got.shape}, expected {want.shape}"
    kind = {"b": "b", "i": "i", "u": "i", "f": "f"}
    assert kind[got.dtype.kind] == kind[want.dtype.kind], \
        f"{case.name} ({where}): dtype {got.dtype}, expected the kind of {want.dtype}"
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol, equal_nan=True,
                                   err_msg=f"{case.name} ({where})")
    else:
        np.testing.assert_array_equal(got, want, err_msg=f"{case.name} ({where})")


def run_case(case: Case, backend: str, symbolic: bool, **compile_options) -> None:
    """Build, compile for ``backend`` and compare with the oracle at every size in ``case.sizes``.

    Static: one graph per size, with plain int shapes. Symbolic: one graph with ``ls.dim`` dims,
    compiled once and run at every size."""
    rng = np.random.default_rng(case.seed)
    if symbolic:
        names = set().union(*(s.keys() for s in case.sizes))
        dims = {k: ls.dim(k, *DIM_BOUNDS[k]) for k in names}
        g, out, _ = build_graph(case, dims)
        prog = g.compile([out], backend=backend, **compile_options)
        progs = [prog] * len(case.sizes)
    else:
        progs = []
        for sizes in case.sizes:
            g, out, _ = build_graph(case, sizes)
            progs.append(g.compile([out], backend=backend, **compile_options))
    for sizes, prog in zip(case.sizes, progs):
        arrays = make_arrays(case, sizes, rng)
        wanted = {v.name for v in prog.program.dims}
        (got,) = prog(dims={k: v for k, v in sizes.items() if k in wanted}, **arrays)
        want = case.oracle(arrays, sizes)
        check_close(case, got, want, f"{'symbolic' if symbolic else 'static'} {sizes}")


# numpy helpers for oracles --------------------------------------------------------------------

def _f64(a):
    return np.asarray(a, dtype=np.float64)


def _up(a):
    """float arrays as float64 (for the oracle's precision); integer and bool arrays unchanged."""
    return _f64(a) if np.asarray(a).dtype.kind == "f" else np.asarray(a)


def np_softmax(x, axis=-1):
    x = _f64(x)
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _torch():
    import torch
    return torch


def _t(a):
    """A float64 torch tensor (ints and bools stay as they are)."""
    torch = _torch()
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.double() if t.is_floating_point() else t


def hf_rope(x, positions, theta, rotary_dim, seq_axis=-3):
    """Rotate-half RoPE, written the way Hugging Face does it (cat(freqs, freqs), rotate_half)."""
    inv = (1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))).astype(F32)
    ang = (np.asarray(positions, F32)[..., None] * inv).astype(F32)                 # float32 like HF
    emb = np.concatenate([ang, ang], -1).astype(np.float64)
    emb = emb.reshape(emb.shape[:-1] + (1,) * (-seq_axis - 2) + emb.shape[-1:])
    xr, xp = _f64(x[..., :rotary_dim]), _f64(x[..., rotary_dim:])
    half = rotary_dim // 2
    rot_half = np.concatenate([-xr[..., half:], xr[..., :half]], -1)
    return np.concatenate([xr * np.cos(emb) + rot_half * np.sin(emb), xp], -1)


def complex_rope(x, positions, theta, rotary_dim):
    """Interleaved RoPE as complex multiplication (Meta's Llama reference formulation)."""
    inv = (1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))).astype(F32)
    ang = (np.asarray(positions, F32)[..., None] * inv).astype(F32).astype(np.float64)   # [seq, half]
    xr = _f64(x[..., :rotary_dim])
    z = (xr[..., 0::2] + 1j * xr[..., 1::2]) * np.exp(1j * ang)[:, None, :]
    out = np.stack([z.real, z.imag], -1).reshape(xr.shape)
    return np.concatenate([out, _f64(x[..., rotary_dim:])], -1)


def np_attention(q, k, v, allowed=None, additive=None, scale=None):
    """Attention in float64, masked keys set to the lowest float32 (so fully masked rows are uniform)."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    rep = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if allowed is not None:
        s = np.where(allowed, s, np.finfo(F32).min)
    if additive is not None:
        s = s + additive
    return np_softmax(s) @ v


def torch_conv(x, w, b=None, nd=1, pad=(), **kw):
    torch = _torch()
    conv = torch.nn.functional.conv1d if nd == 1 else torch.nn.functional.conv2d
    xt = torch.nn.functional.pad(_t(x), pad) if pad else _t(x)
    return conv(xt, _t(w), None if b is None else _t(b), **kw).numpy()


def gelu_erf_torch(x):
    return _torch().nn.functional.gelu(_t(x)).numpy()


# the cases --------------------------------------------------------------------------------------

X = {"x": Input(("n", 5))}
XY = {"x": Input(("n", 5)), "y": Input((5,))}
POS = {"x": Input(("n", 5), uniform(0.05, 4.0))}


def unary(name, fn, oracle, inputs=X, **kw) -> Case:
    return Case(name, inputs, lambda g, t, d: fn(t["x"]), lambda a, d: oracle(_up(a["x"])), **kw)


def binary(name, fn, oracle, inputs=XY, **kw) -> Case:
    return Case(name, inputs, lambda g, t, d: fn(t["x"], t["y"]), lambda a, d: oracle(a["x"], a["y"]), **kw)


CMP = {"x": Input(("n", 5), small_ints(-2, 2)), "y": Input((5,), small_ints(-2, 2))}
ELEMENTWISE = [
    unary("neg", lambda x: -x, np.negative),
    unary("exp", F.exp, np.exp, {"x": Input(("n", 5), uniform(-20, 20))}, rtol=2e-6),
    unary("log", F.log, np.log, POS),
    unary("sqrt", F.sqrt, np.sqrt, POS),
    unary("rsqrt", F.rsqrt, lambda x: 1 / np.sqrt(x), POS),
    unary("sin", F.sin, np.sin, {"x": Input(("n", 5), uniform(-50, 50))}),
    unary("cos", F.cos, np.cos, {"x": Input(("n", 5), uniform(-50, 50))}),
    unary("cos_large_angles", F.cos, lambda x: np.cos(x), {"x": Input(("n", 5), uniform(1000, 4000))}),
    unary("tanh", F.tanh, np.tanh, {"x": Input(("n", 5), uniform(-12, 12))}),
    unary("sigmoid", F.sigmoid, lambda x: 1 / (1 + np.exp(-x)), {"x": Input(("n", 5), uniform(-40, 40))}),
    unary("relu", F.relu, lambda x: np.maximum(x, 0)),
    unary("gelu_tanh", lambda x: F.gelu(x, "tanh"),
          lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
          {"x": Input(("n", 5), normal(3))}),
    unary("gelu_erf", F.gelu, gelu_erf_torch, {"x": Input(("n", 5), normal(3))}, torch=True),
    unary("erf", F.erf, lambda x: _torch().erf(_t(x)).numpy(), {"x": Input(("n", 5), normal(2))}, torch=True),
    unary("silu", F.silu, lambda x: x / (1 + np.exp(-x)), {"x": Input(("n", 5), normal(4))}),
    unary("abs", F.abs, np.abs),
    unary("abs_int", F.abs, np.abs, {"x": Input(("n", 5), small_ints(-9, 9, np.int32), ls.int32)}),
    unary("sign", F.sign, np.sign, {"x": Input(("n", 5), small_ints(-2, 2))}),
    unary("pow_int_exponent", lambda x: x ** 3, lambda x: x ** 3),
    unary("pow_negative_exponent", lambda x: x ** -2, lambda x: x ** -2.0, POS),
    unary("pow_float_exponent", lambda x: x ** 1.7, lambda x: x ** 1.7, POS),
    unary("pow_sqrt", lambda x: x ** 0.5, np.sqrt, POS),
    binary("pow_tensor_exponent", F.pow, lambda x, y: _f64(x) ** _f64(y),
           {"x": Input(("n", 5), uniform(0.1, 3)), "y": Input((5,), uniform(-2, 2))}),
    binary("sub", lambda x, y: x - y, np.subtract),
    binary("rsub_scalar", lambda x, y: 2.5 - x + y * 0, lambda x, y: 2.5 - _f64(x)),
    binary("div", lambda x, y: x / y, lambda x, y: _f64(x) / y,
           {"x": Input(("n", 5)), "y": Input((5,), uniform(0.5, 2))}),
    binary("div_int", F.div, lambda x, y: x / y,
           {"x": Input(("n", 5), small_ints(-9, 9, np.int32), ls.int32),
            "y": Input((5,), small_ints(1, 4, np.int32), ls.int32)}),
    binary("maximum", F.maximum, np.maximum),
    binary("minimum", F.minimum, np.minimum),
    binary("eq", F.eq, np.equal, CMP),
    binary("ne", F.ne, np.not_equal, CMP),
    binary("lt", F.lt, np.less, CMP),
    binary("le", F.le, np.less_equal, CMP),
    binary("gt", F.gt, np.greater, CMP),
    binary("ge", F.ge, np.greater_equal, CMP),
    binary("eq_int", lambda x, y: x == y, np.equal,
           {"x": Input(("n", 5), small_ints(0, 2, np.int32), ls.int32),
            "y": Input((5,), small_ints(0, 2, np.int32), ls.int32)}),
    unary("clamp_scalars", lambda x: x.clamp(-0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7)),
    unary("clamp_low_only", lambda x: x.clamp(lo=0.2), lambda x: np.maximum(x, 0.2)),
    Case("clamp_tensors", {"x": Input(("n", 5)), "lo": Input((5,), uniform(-1, 0)), "hi": Input((5,), uniform(0, 1))},
         lambda g, t, d: F.clamp(t["x"], t["lo"], t["hi"]), lambda a, d: np.clip(a["x"], a["lo"], a["hi"])),
    Case("where", {"c": Input(("n", 5), bools(), ls.bool_), "x": Input(("n", 5)), "y": Input((5,))},
         lambda g, t, d: F.where(t["c"], t["x"], t["y"]), lambda a, d: np.where(a["c"], a["x"], a["y"])),
    # the branch not taken holds inf and NaN: a select must not let them through
    Case("where_nonfinite_untaken", {"c": Input(("n", 5), bools(), ls.bool_),
                                     "x": Input(("n", 5), with_specials(normal())),
                                     "y": Input(("n", 5), with_specials(normal()))},
         lambda g, t, d: F.where(t["c"], t["x"], t["y"]), lambda a, d: np.where(a["c"], a["x"], a["y"])),
    Case("where_scalars", {"c": Input(("n", 5), bools(), ls.bool_)}, lambda g, t, d: F.where(t["c"], 1.5, -2.0),
         lambda a, d: np.where(a["c"], 1.5, -2.0).astype(F32)),
    Case("where_bool_branches", {"c": Input(("n", 5), bools(), ls.bool_), "x": Input(("n", 5), bools(), ls.bool_),
                                 "y": Input(("n", 5), bools(), ls.bool_)},
         lambda g, t, d: F.where(t["c"], t["x"], t["y"]), lambda a, d: np.where(a["c"], a["x"], a["y"])),
    Case("logical_ops", {"x": Input(("n", 5), bools(), ls.bool_), "y": Input(("n", 5), bools(), ls.bool_)},
         lambda g, t, d: (t["x"] & ~t["y"]) | (~t["x"] & t["y"]), lambda a, d: a["x"] ^ a["y"]),
]

R3 = {"x": Input(("n", 4, 3))}
REDUCTIONS = [
    unary("sum_last", lambda x: x.sum(-1), lambda x: x.sum(-1), R3),
    unary("sum_axes_keepdim", lambda x: x.sum((0, 2), keepdim=True), lambda x: x.sum((0, 2), keepdims=True), R3),
    unary("sum_all", lambda x: x.sum(), lambda x: x.sum(), R3),
    unary("sum_bool", lambda x: x.sum(0), lambda x: x.sum(0), {"x": Input(("n", 5), bools(), ls.bool_)}),
    unary("mean_symbolic_axis", lambda x: x.mean(0, keepdim=True), lambda x: x.mean(0, keepdims=True), R3),
    unary("mean_all", lambda x: x.mean(), lambda x: x.mean(), R3),
    unary("max_keepdim", lambda x: x.max(1, keepdim=True), lambda x: x.max(1, keepdims=True), R3),
    unary("max_symbolic_axis", lambda x: x.max(0), lambda x: x.max(0), R3),
    unary("min", lambda x: x.min(-1), lambda x: x.min(-1), R3),
    unary("min_axes_keepdim", lambda x: x.min((0, 2), keepdim=True), lambda x: x.min((0, 2), keepdims=True), R3),
    unary("min_uint8", lambda x: x.min(-1), lambda x: x.min(-1), {"x": Input(("n", 5), small_ints(0, 255, np.uint8),
                                                                             ls.uint8)}),
    unary("var", lambda x: x.var(-1), lambda x: x.var(-1), R3),
    unary("var_symbolic_axis", lambda x: x.var(0, keepdim=True), lambda x: x.var(0, keepdims=True), R3),
    unary("var_unbiased", lambda x: x.var((0, 1), correction=1), lambda x: x.var((0, 1), ddof=1), R3),
    unary("argmax_ties", lambda x: x.argmax(-1), lambda x: x.argmax(-1), {"x": Input(("n", 7), small_ints(0, 2))}),
    unary("argmax_symbolic_axis", lambda x: x.argmax(0, keepdim=True), lambda x: x.argmax(0, keepdims=True),
          {"x": Input(("n", 4), small_ints(-3, 3))}),
    unary("argmax_flat", lambda x: x.argmax(), lambda x: np.argmax(x), R3),
    unary("argmin", lambda x: x.argmin(1), lambda x: x.argmin(1), {"x": Input(("n", 6), small_ints(0, 3))}),
    unary("cumsum_symbolic_axis", lambda x: x.cumsum(0), lambda x: x.cumsum(0), R3),
    unary("cumsum_last", lambda x: x.cumsum(-1), lambda x: x.cumsum(-1), R3),
    unary("cumsum_int", lambda x: x.cumsum(1), lambda x: x.cumsum(1),
          {"x": Input(("n", 6), small_ints(-5, 5, np.int32), ls.int32)}),
]

NN = [
    unary("softmax", lambda x: x.softmax(-1), np_softmax, {"x": Input(("n", 7), normal(5))}),
    unary("softmax_symbolic_axis", lambda x: x.softmax(0), lambda x: np_softmax(x, 0), R3),
    # -inf entries (a masked score) get weight 0 and create no NaN while a row has a finite entry
    unary("softmax_neg_inf", lambda x: x.softmax(-1), np_softmax,
          {"x": Input(("n", 6), lambda r, s: np.where(np.arange(s[-1]) % 3 == 1, -np.inf,
                                                       r.standard_normal(s)).astype(F32))}),
    unary("log_softmax", lambda x: x.log_softmax(-1), lambda x: np.log(np_softmax(x)),
          {"x": Input(("n", 7), normal(5))}),
    Case("layer_norm", {"x": Input(("n", 8), normal(3)), "w": Input((8,)), "b": Input((8,))},
         lambda g, t, d: t["x"].layer_norm(t["w"], t["b"]),
         lambda a, d: (_f64(a["x"]) - _f64(a["x"]).mean(-1, keepdims=True))
         / np.sqrt(_f64(a["x"]).var(-1, keepdims=True) + 1e-5) * a["w"] + a["b"], rtol=1e-5, atol=2e-6),
    unary("layer_norm_plain", lambda x: x.layer_norm(eps=1e-3),
          lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-3), R3),
    Case("rms_norm", {"x": Input(("n", 8), normal(3)), "w": Input((8,))},
         lambda g, t, d: t["x"].rms_norm(t["w"], eps=1e-5),
         lambda a, d: _f64(a["x"]) / np.sqrt((_f64(a["x"]) ** 2).mean(-1, keepdims=True) + 1e-5) * a["w"]),
    Case("embedding", {"w": Input((10, 4)), "ids": Input((2, "n"), small_ints(0, 9, np.int32), ls.int32)},
         lambda g, t, d: F.embedding(t["w"], t["ids"]), lambda a, d: a["w"][a["ids"]]),
    Case("embedding_out_of_range_is_zero",
         {"w": Input((6, 3)), "ids": Input(("n",), small_ints(-2, 8, np.int32), ls.int32)},
         lambda g, t, d: F.embedding(t["w"], t["ids"]),
         lambda a, d: np.where(((a["ids"] >= 0) & (a["ids"] < 6))[:, None], a["w"][np.clip(a["ids"], 0, 5)], 0)),
]

LINALG = [
    Case("matmul", {"x": Input(("n", 6)), "w": Input((6, 5))}, lambda g, t, d: t["x"] @ t["w"],
         lambda a, d: _f64(a["x"]) @ a["w"]),
    Case("matmul_symbolic_inner", {"x": Input((3, "n")), "w": Input(("n", 4))}, lambda g, t, d: t["x"] @ t["w"],
         lambda a, d: _f64(a["x"]) @ a["w"]),
    Case("matvec", {"x": Input(("n", 6)), "v": Input((6,))}, lambda g, t, d: t["x"] @ t["v"],
         lambda a, d: _f64(a["x"]) @ a["v"]),
    Case("vecmat", {"v": Input(("n",)), "w": Input(("n", 3))}, lambda g, t, d: t["v"] @ t["w"],
         lambda a, d: _f64(a["v"]) @ a["w"]),
    Case("batched_matmul_broadcast", {"x": Input((2, 1, "n", 3)), "w": Input((4, 3, 5))},
         lambda g, t, d: t["x"] @ t["w"], lambda a, d: _f64(a["x"]) @ a["w"]),
    Case("linear", {"x": Input((2, "n", 6)), "w": Input((4, 6)), "b": Input((4,))},
         lambda g, t, d: t["x"].linear(t["w"], t["b"]), lambda a, d: _f64(a["x"]) @ _f64(a["w"]).T + a["b"]),
]

ROPE_SIZES = ({"n": 3, "pos": 0}, {"n": 2, "pos": 7}, {"n": 4, "pos": 3001})
ROPE_X = {"x": Input(("n", 3, 8))}


def rope_case(name, kw, oracle_kind, rotary_dim=8, theta=10000.0, seq_axis=-3, inputs=ROPE_X) -> Case:
    def oracle(a, d):
        positions = np.arange(d["pos"], d["pos"] + d["n"])
        if oracle_kind == "hf":
            return hf_rope(a["x"], positions, theta, rotary_dim, seq_axis)
        return complex_rope(a["x"], positions, theta, rotary_dim)
    return Case(name, inputs, lambda g, t, d: t["x"].rope(pos=d["pos"], theta=theta, seq_axis=seq_axis, **kw),
                oracle, rtol=1e-5, atol=2e-6, sizes=ROPE_SIZES)


ROPE = [
    rope_case("rope_rotate_half", {}, "hf"),
    rope_case("rope_interleaved", {"interleaved": True}, "complex"),
    rope_case("rope_partial_rotate_half", {"rotary_dim": 4}, "hf", rotary_dim=4),
    rope_case("rope_partial_interleaved", {"rotary_dim": 6, "interleaved": True}, "complex", rotary_dim=6),
    rope_case("rope_theta_500k", {}, "hf", theta=500000.0),
    rope_case("rope_heads_before_seq", {}, "hf", seq_axis=-2, inputs={"x": Input((2, 3, "n", 8))}),
    Case("rope_explicit_positions", {"x": Input((2, "n", 3, 4)), "p": Input((2, "n"), small_ints(0, 50, np.int32),
                                                                            ls.int32)},
         lambda g, t, d: F.rope(t["x"], t["p"]),
         lambda a, d: hf_rope(a["x"], a["p"], 10000.0, 4)),
]

CREATION = [
    Case("arange_stop", {}, lambda g, t, d: F.arange(g, 7), lambda a, d: np.arange(7), symbolic=False, sizes=({},)),
    Case("arange_step", {}, lambda g, t, d: F.arange(g, 2, 20, 3), lambda a, d: np.arange(2, 20, 3),
         symbolic=False, sizes=({},)),
    Case("arange_negative_step", {}, lambda g, t, d: F.arange(g, 10, -3, -4), lambda a, d: np.arange(10, -3, -4),
         symbolic=False, sizes=({},)),
    Case("arange_float", {}, lambda g, t, d: F.arange(g, 0.5, 3.0, 0.25),
         lambda a, d: np.arange(0.5, 3.0, 0.25, dtype=F32), symbolic=False, sizes=({},)),
    Case("arange_symbolic_offset", {}, lambda g, t, d: F.arange(g, d["pos"], d["pos"] + d["n"]),
         lambda a, d: np.arange(d["pos"], d["pos"] + d["n"]), sizes=({"n": 3, "pos": 0}, {"n": 5, "pos": 9})),
    Case("arange_symbolic_step", {}, lambda g, t, d: F.arange(g, d["pos"], d["pos"] + d["n"], 2),
         lambda a, d: np.arange(d["pos"], d["pos"] + d["n"], 2), sizes=({"n": 3, "pos": 1}, {"n": 6, "pos": 9})),
    Case("arange_symbolic_length_float", {"x": Input(("n",))}, lambda g, t, d: F.arange(g, d["n"], dtype=ls.float32)
         + t["x"] * 0, lambda a, d: np.arange(d["n"], dtype=F32)),
    unary("tril", lambda x: x.tril(), np.tril, {"x": Input(("n", 6))}),
    unary("tril_below", lambda x: x.tril(-1), lambda x: np.tril(x, -1), {"x": Input((2, "n", 6))}),
    unary("triu_above", lambda x: x.triu(2), lambda x: np.triu(x, 2), {"x": Input(("n", 6))}),
    unary("triu", lambda x: F.triu(x), np.triu, {"x": Input((5, "n"))}),
    Case("causal_mask", {}, lambda g, t, d: F.causal_mask(g, d["n"], d["pos"]),
         lambda a, d: np.tril(np.ones((d["n"], d["pos"] + d["n"]), bool), d["pos"]),
         sizes=({"n": 4, "pos": 0}, {"n": 1, "pos": 6}, {"n": 3, "pos": 2})),
    Case("causal_mask_window", {}, lambda g, t, d: F.causal_mask(g, d["n"], d["pos"], window=3),
         lambda a, d: np.tril(np.ones((d["n"], d["pos"] + d["n"]), bool), d["pos"])
         & ~np.tril(np.ones((d["n"], d["pos"] + d["n"]), bool), d["pos"] - 3),
         sizes=({"n": 5, "pos": 0}, {"n": 2, "pos": 6})),
]

COMBINE = [
    Case("concatenate_axis0", {"x": Input(("n", 3)), "y": Input((2, 3))},
         lambda g, t, d: F.concatenate([t["x"], t["y"]], 0), lambda a, d: np.concatenate([a["x"], a["y"]], 0)),
    Case("concatenate_last_axis", {"x": Input((2, "n", 2)), "y": Input((2, "n", 3)), "z": Input((2, "n", 1))},
         lambda g, t, d: F.concatenate([t["x"], t["y"], t["z"]], -1),
         lambda a, d: np.concatenate([a["x"], a["y"], a["z"]], -1)),
    # NaN and inf stay inside their own piece (the padding of the others reads exactly 0)
    Case("concatenate_nonfinite", {"x": Input(("n", 3), with_specials(normal())), "y": Input(("n", 4))},
         lambda g, t, d: F.concatenate([t["x"], t["y"]], 1), lambda a, d: np.concatenate([a["x"], a["y"]], 1)),
    Case("concatenate_symbolic_pieces", {"x": Input(("n", 2)), "y": Input(("m", 2))},
         lambda g, t, d: F.concatenate([t["x"], t["y"], t["x"]]), lambda a, d: np.concatenate([a["x"], a["y"], a["x"]]),
         sizes=({"n": 2, "m": 3}, {"n": 4, "m": 1})),
    Case("concatenate_bool", {"x": Input(("n", 3), bools(), ls.bool_), "y": Input(("n", 2), bools(), ls.bool_)},
         lambda g, t, d: F.concatenate([t["x"], t["y"]], 1), lambda a, d: np.concatenate([a["x"], a["y"]], 1)),
    Case("stack", {"x": Input(("n", 3)), "y": Input(("n", 3))}, lambda g, t, d: F.stack([t["x"], t["y"]], 1),
         lambda a, d: np.stack([a["x"], a["y"]], 1)),
]


def conv_case(name, nd, x_shape, w_shape, bias=False, pad=0, torch_pad=(), sizes=None, symbolic=True, **kw):
    inputs = {"x": Input(x_shape), "w": Input(w_shape, normal(0.5))}
    if bias:
        inputs["b"] = Input((w_shape[0],))
    fn = F.conv1d if nd == 1 else F.conv2d
    return Case(name, inputs, lambda g, t, d: fn(t["x"], t["w"], t.get("b"), padding=pad, **kw),
                lambda a, d: torch_conv(a["x"], a["w"], a.get("b"), nd, torch_pad,
                                        padding=pad if not torch_pad else 0, **kw),
                rtol=1e-5, atol=1e-5, torch=True, symbolic=symbolic,
                sizes=sizes or ({"n": 2}, {"n": 3}))


CONV = [
    conv_case("conv1d", 1, (2, 3, "l"), (4, 3, 3), bias=True, sizes=({"l": 5}, {"l": 9})),
    conv_case("conv1d_stride_pad_dilation", 1, ("n", 4, 11), (6, 4, 3), pad=2, stride=2, dilation=2),
    conv_case("conv1d_groups", 1, ("n", 6, 8), (4, 3, 2), bias=True, groups=2, stride=3),
    conv_case("conv1d_depthwise_causal", 1, (1, 4, "n"), (4, 1, 4), pad=(3, 0), torch_pad=(3, 0), groups=4,
              sizes=({"n": 4}, {"n": 10})),
    conv_case("conv1d_unbatched", 1, (3, "l"), (2, 3, 2), sizes=({"l": 4}, {"l": 6})),
    conv_case("conv2d", 2, ("n", 3, 6, 7), (4, 3, 3, 3), bias=True, pad=1),
    Case("conv2d_method", {"x": Input((1, 2, 4, "l")), "w": Input((3, 2, 2, 2))}, lambda g, t, d: t["x"].conv2d(t["w"]),
         lambda a, d: torch_conv(a["x"], a["w"], nd=2), rtol=1e-5, atol=1e-5, torch=True, sizes=({"l": 4}, {"l": 6})),
    conv_case("conv2d_stride_dilation_groups", 2, ("n", 4, 9, 8), (6, 2, 2, 3), stride=(2, 3), dilation=(2, 1),
              groups=2),
    conv_case("conv2d_symbolic_width", 2, (1, 2, 5, "n"), (3, 2, 2, 2), pad=(0, 1), sizes=({"n": 3}, {"n": 7})),
]


def sdpa_case(name, q_shape, kv_shape, build_kw, oracle_kw, extra=None, sizes=None) -> Case:
    inputs = {"q": Input(q_shape), "k": Input(kv_shape), "v": Input(kv_shape)}
    inputs.update(extra or {})

    def build(g, t, d):
        mask = t.get("mask")
        return F.scaled_dot_product_attention(t["q"], t["k"], t["v"], mask, **build_kw)

    def oracle(a, d):
        kw = {k: (v(a, d) if callable(v) else v) for k, v in oracle_kw.items()}
        return np_attention(a["q"], a["k"], a["v"], **kw)
    return Case(name, inputs, build, oracle, rtol=1e-5, atol=2e-6, sizes=sizes or ({"n": 3}, {"n": 5}))


def _causal_allowed(a, d):
    sq, skv = a["q"].shape[-2], a["k"].shape[-2]
    return np.tril(np.ones((sq, skv), bool), skv - sq)


DECODE_SIZES = ({"n": 3, "pos": 0}, {"n": 1, "pos": 6}, {"n": 2, "pos": 4})
SDPA = [
    sdpa_case("sdpa", (2, 2, "n", 4), (2, 2, "n", 4), {}, {}),
    sdpa_case("sdpa_causal", (1, 2, "n", 4), (1, 2, "n", 4), {"causal": True}, {"allowed": _causal_allowed}),
    sdpa_case("sdpa_gqa_causal_kv_cache", (1, 4, "n", 4), (1, 2, "pos+n", 4), {"causal": True},
              {"allowed": _causal_allowed}, sizes=DECODE_SIZES),
    sdpa_case("sdpa_scale", (3, "n", 4), (3, "n", 4), {"scale": 0.3}, {"scale": 0.3}),
    sdpa_case("sdpa_additive_mask_neg_inf", (2, 2, "n", 4), (2, 2, "n", 4), {},
              {"additive": lambda a, d: a["mask"]},
              extra={"mask": Input(("n", "n"), lambda r, s: np.where(np.tril(np.ones(s, bool)), 0.0, -np.inf)
                                   .astype(F32))}),
    # a bool mask per query head under GQA; some rows have every key masked: no NaN, uniform weights
    sdpa_case("sdpa_gqa_bool_mask", (1, 6, "n", 4), (1, 2, "n", 4), {}, {"allowed": lambda a, d: a["mask"]},
              extra={"mask": Input((6, "n", "n"),
                                   lambda r, s: (r.random(s) < 0.6) & (np.arange(s[1]) % 3 != 1)[:, None],
                                   ls.bool_)}),
    sdpa_case("sdpa_mask_and_causal", (2, "n", 4), (2, "n", 4), {"causal": True},
              {"allowed": lambda a, d: _causal_allowed(a, d) & a["mask"]},
              extra={"mask": Input(("n", "n"), bools(0.7), ls.bool_)}),
]



def torch_sdpa(a, mask=None, **kw):
    torch = _torch()
    return torch.nn.functional.scaled_dot_product_attention(
        _t(a["q"]), _t(a["k"]), _t(a["v"]), attn_mask=None if mask is None else _t(mask), **kw).numpy()


# the same conventions as PyTorch's own function (is_causal, enable_gqa, bool and float masks)
SDPA_TORCH = [
    Case("sdpa_torch_causal_gqa", {"q": Input((2, 6, "n", 8)), "k": Input((2, 3, "n", 8)), "v": Input((2, 3, "n", 8))},
         lambda g, t, d: F.scaled_dot_product_attention(t["q"], t["k"], t["v"], causal=True),
         lambda a, d: torch_sdpa(a, is_causal=True, enable_gqa=True), atol=2e-6, torch=True),
    Case("sdpa_torch_bool_mask_scale",
         {"q": Input((2, "n", 4)), "k": Input((2, "n", 4)), "v": Input((2, "n", 4)),
          "m": Input(("n", "n"), lambda r, s: (r.random(s) < 0.5) | np.eye(s[0], dtype=bool), ls.bool_)},
         lambda g, t, d: F.scaled_dot_product_attention(t["q"], t["k"], t["v"], t["m"], scale=0.7),
         lambda a, d: torch_sdpa(a, a["m"], scale=0.7), atol=2e-6, torch=True),
    Case("sdpa_torch_float_mask",
         {"q": Input((1, 2, "n", 4)), "k": Input((1, 2, "n", 4)), "v": Input((1, 2, "n", 4)),
          "m": Input((2, 1, "n"), normal(2))},
         lambda g, t, d: F.scaled_dot_product_attention(t["q"], t["k"], t["v"], t["m"]),
         lambda a, d: torch_sdpa(a, a["m"]), atol=2e-6, torch=True),
]

CASES: list[Case] = ELEMENTWISE + REDUCTIONS + NN + LINALG + ROPE + CREATION + COMBINE + CONV + SDPA + SDPA_TORCH
