"""PyTorch's OpInfo database through the Lightspeed torch backend: every op is classified.

Each op's first float32 sample inputs are traced by aot_autograd with Lightspeed's
decomposition table and compiled by the same ``compile_fx`` that torch.compile's
"lightspeed" backend uses; only Dynamo's bytecode capture is skipped (it would triple
the run time, and it changes nothing in what Lightspeed receives). The outputs are
compared with eager PyTorch.

Status per op: pass (every sample matched), wrong (some output differed: a bug),
crash (Lightspeed raised something other than a clean "unsupported"), unsupported (some
op in the graph has no lowering), skip (no usable float32 sample, or PyTorch itself
cannot trace it).

The checked-in floor (tests/opinfo_floor.json) holds the number of passing ops, which may
only grow, and the short list of ops known to be wrong or to crash, each with a reason.
A second test runs a representative subset through the real ``torch.compile(backend=
"lightspeed")`` (Dynamo included) on the C backend.

Run ``python tests/test_opinfo.py`` for the full table (``-v`` lists passing ops too).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal needs it
import torch.utils._pytree as pytree  # noqa: E402

# OpInfo samples trigger PyTorch's own deprecation and numerics warnings by the dozen
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning",
                                        "ignore::DeprecationWarning")

# float32 results are compared at these tolerances: Lightspeed composes exp, log, tanh, erf, ...
# from exp2/log2/sin and sums in its own order, so a few ulps of difference are expected
RTOL, ATOL = 1e-4, 1e-4
SAMPLES_PER_OP = 3
# ops whose outputs are uninitialised memory or random numbers: nothing to compare
NONDETERMINISTIC = {"empty", "new_empty", "new_empty_strided", "empty_strided", "empty_like", "empty_permuted",
                    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "normal", "uniform",
                    "multinomial", "rand_like", "randn_like", "randint_like", "randint", "nn.functional.dropout",
                    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout", "nn.functional.rrelu",
                    "nn.functional.dropout2d", "nn.functional.dropout3d"}
MAX_ELEMENTS = 2048  # skip larger samples: the numpy reference interpreter (and O(n^2) sorts) would be slow


@dataclass
class OpResult:
    name: str
    status: str
    detail: str = ""
    unsupported: list[str] = field(default_factory=list)


def _leaves_ok(sample) -> str | None:
    leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
    for x in leaves:
        if isinstance(x, torch.Tensor):
            if x.is_complex() or x.is_sparse or x.layout != torch.strided:
                return "complex/sparse input"
            if x.dtype == torch.float64:
                return "float64 input"
            if x.numel() > MAX_ELEMENTS:
                return "large input"
    if "out" in sample.kwargs:
        return "out= variant"
    return None


def _of_tensor_leaves(op, sample):
    """(a function of the sample's tensor leaves that calls ``op`` with the other leaves as constants,
    those tensor leaves)."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    is_t = [isinstance(x, torch.Tensor) for x in leaves]
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]

    def fn(*ts):
        it = iter(ts)
        full = [next(it) if t else x for x, t in zip(leaves, is_t)]
        inp, args, kwargs = pytree.tree_unflatten(full, spec)
        return op(inp, *args, **kwargs)

    return fn, tensors


def _traced(op, sample, compiler):
    """aot_autograd-compiled function of the sample's tensor leaves (other leaves are constants)."""
    from torch._functorch.aot_autograd import aot_function
    from lightspeed.torch_backend.decompositions import decomposition_table
    fn, tensors = _of_tensor_leaves(op, sample)
    return aot_function(fn, fw_compiler=compiler, decompositions=decomposition_table()), tensors


def _compare(actual, expected) -> str | None:
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if len(a_leaves) != len(e_leaves):
        return f"{len(a_leaves)} outputs, expected {len(e_leaves)}"
    for a, e in zip(a_leaves, e_leaves):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"got {type(a).__name__}, expected a tensor"
            try:
                torch.testing.assert_close(a, e, rtol=RTOL, atol=ATOL, equal_nan=True, check_stride=False)
            except AssertionError as err:
                return str(err).splitlines()[0] + " | " + " ".join(str(err).split())[-160:]
        elif a != e:
            return f"got {a!r}, expected {e!r}"
    return None


def run_op(op, backend: str = "reference", samples: int = SAMPLES_PER_OP) -> OpResult:
    """Classify one OpInfo entry (see the module docstring)."""
    from lightspeed.torch_backend import BackendOptions, UnsupportedOpsError, compile_fx
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    if torch.float32 not in op.supported_dtypes("cpu"):
        return OpResult(name, "skip", "no float32")
    if op.name in NONDETERMINISTIC:
        return OpResult(name, "skip", "random or uninitialised output")
    opts = BackendOptions(backend=backend)
    tried, unsupported, reasons = 0, [], []
    torch.manual_seed(0)  # OpInfo samples are random: the same values on every run
    try:
        gen = op.sample_inputs("cpu", torch.float32, requires_grad=False)
        picked = list(itertools.islice(gen, samples))
    except Exception as e:  # noqa: BLE001  (OpInfo's own generator failing is not our result)
        return OpResult(name, "skip", f"sample generation failed: {type(e).__name__}")
    for sample in picked:
        why = _leaves_ok(sample)
        if why:
            reasons.append(why)
            continue
        with torch.no_grad():
            try:
                expected = op(sample.input, *sample.args, **sample.kwargs)
            except Exception as e:  # noqa: BLE001
                reasons.append(f"eager failed: {type(e).__name__}")
                continue
            if any(isinstance(x, torch.Tensor) and (x.is_complex() or x.dtype == torch.float64)
                   for x in pytree.tree_leaves(expected)):
                reasons.append("complex/float64 output")
                continue
            entered = []

            def compiler(gm, ex):
                entered.append(True)
                return compile_fx(gm, ex, opts)
            compiled, tensors = _traced(op, sample, compiler)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    actual = compiled(*tensors)
            except UnsupportedOpsError as e:
                unsupported += [p.target + ": " + p.reason for p in e.problems]
                tried += 1
                continue
            except Exception as e:  # noqa: BLE001
                if not entered:  # PyTorch failed to trace: Lightspeed never saw a graph
                    reasons.append(f"not traceable: {type(e).__name__}")
                    continue
                return OpResult(name, "crash", f"{type(e).__name__}: {str(e)[:300]}")
        tried += 1
        diff = _compare(actual, expected)
        if diff:
            return OpResult(name, "wrong", diff)
    if unsupported:
        return OpResult(name, "unsupported", unsupported[0], sorted(set(unsupported)))
    if tried == 0:
        return OpResult(name, "skip", "; ".join(sorted(set(reasons)))[:200])
    return OpResult(name, "pass")


@contextlib.contextmanager
def _outside_unittest():
    """OpInfo's sample generators look for the unittest.TestCase method that runs them (sample-specific skips),
    through inspect.stack() with source lines for every frame: a third of the sweep's time under pytest's deep
    stacks. This harness runs in no TestCase, so that lookup always finds nothing: answer it at once."""
    import torch.testing._internal.common_utils as cu
    import torch.testing._internal.opinfo.core as core
    saved = cu.extract_test_fn, core.extract_test_fn
    cu.extract_test_fn = core.extract_test_fn = lambda: None
    try:
        yield
    finally:
        cu.extract_test_fn, core.extract_test_fn = saved


def sweep(ops=None, backend: str = "reference", samples: int = SAMPLES_PER_OP) -> list[OpResult]:
    from torch.testing._internal.common_methods_invocations import op_db
    results = []
    with _outside_unittest():
        for op in (ops if ops is not None else op_db):
            results.append(run_op(op, backend, samples))
    return results


def summary(results: list[OpResult]) -> Counter:
    return Counter(r.status for r in results)


FLOOR_FILE = os.path.join(os.path.dirname(__file__), "opinfo_floor.json")
# ops run through Dynamo + the C backend: one or more of each family of lowerings
C_SUBSET = ["add", "mul", "div.no_rounding_mode", "exp", "log", "tanh", "sigmoid", "erf", "abs", "floor", "pow",
            "clamp", "where", "masked_fill", "sum", "mean", "amax", "var", "cumsum", "softmax", "log_softmax",
            "linalg.vector_norm", "matmul", "bmm", "addmm", "nn.functional.conv2d", "nn.functional.max_pool2d",
            "nn.functional.avg_pool2d", "nn.functional.layer_norm", "nn.functional.gelu", "nn.functional.embedding",
            "index_select", "gather", "cat", "sort", "topk", "scatter_add", "nn.functional.pad.constant"]


def _full_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _load_floor() -> dict:
    with open(FLOOR_FILE) as f:
        return json.load(f)


def test_opinfo_sweep_reference():
    """Every OpInfo op's first float32 samples, lowered and run on the reference backend."""
    t0 = time.time()
    results = sweep(backend="reference")
    counts = summary(results)
    floor = _load_floor()
    print(f"OpInfo sweep: {dict(counts)} ({len(results)} entries, {time.time() - t0:.0f}s)")
    known = {**floor.get("known_wrong", {}), **floor.get("known_crash", {})}
    bad = [r for r in results if r.status in ("wrong", "crash") and r.name not in known]
    assert not bad, "wrong or crashing ops:\n" + "\n".join(f"{r.status} {r.name}: {r.detail}" for r in bad)
    fixed = [r.name for r in results if r.name in known and r.status == "pass"]
    assert not fixed, f"ops in the known-wrong list now pass; remove them from {FLOOR_FILE}: {fixed}"
    assert counts["pass"] >= floor["min_pass"], (
        f"{counts['pass']} ops pass, below the floor of {floor['min_pass']} in {FLOOR_FILE}")


def _compiled_op(op, sample):
    fn, tensors = _of_tensor_leaves(op, sample)
    return torch.compile(fn, backend="lightspeed", options={"backend": "c"}), tensors


def test_opinfo_subset_torch_compile_c():
    """A representative subset through the real torch.compile path (Dynamo + aot_autograd) on C."""
    from torch.testing._internal.common_methods_invocations import op_db
    by_name = {_full_name(op): op for op in op_db}
    missing = [n for n in C_SUBSET if n not in by_name]
    assert not missing, f"unknown OpInfo names {missing}"
    checked = 0
    for name in C_SUBSET:
        op = by_name[name]
        torch.manual_seed(0)
        with _outside_unittest():
            usable = [s for s in itertools.islice(op.sample_inputs("cpu", torch.float32, requires_grad=False), 8)
                      if not _leaves_ok(s)]
        assert usable, f"{name}: no usable float32 sample"
        sample = usable[0]  # one sample per op: each costs a Dynamo trace and a C compilation
        torch._dynamo.reset()
        with torch.no_grad():
            expected = op(sample.input, *sample.args, **sample.kwargs)
            compiled, tensors = _compiled_op(op, sample)
            actual = compiled(*tensors)
        diff = _compare(actual, expected)
        assert diff is None, f"{name}: {diff}"
        checked += 1
    print(f"torch.compile(backend='lightspeed') on C: {checked} ops match eager")


if __name__ == "__main__":
    import sys
    t0 = time.time()
    res = sweep()
    floor = _load_floor()
    for r in res:
        if r.status != "pass" or "-v" in sys.argv:
            print(f"{r.status:12s} {r.name:40s} {r.detail[:230]}")
    print(dict(summary(res)), f"{time.time() - t0:.0f}s", "floor:", floor["min_pass"])
    missing = Counter(u.split(":")[0] for r in res for u in r.unsupported)
    print("most common unsupported targets:", missing.most_common(40))
