"""torch.compile(backend="lightspeed"): registration, errors, eager fallback, dtypes, parameter
binding, dynamic shapes. Models here are tiny; most tests use the reference backend (no C
compile) except where the C backend itself is the point."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from lightspeed.torch_backend import STATS, BackendOptions  # noqa: E402
from lightspeed.torch_backend.tensors import to_numpy, to_torch  # noqa: E402

REF = {"backend": "reference"}


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    STATS.reset()
    yield
    torch._dynamo.reset()


def _mlp(dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.SiLU(), nn.Linear(16, 4)).eval().to(dtype)


# registration ---------------------------------------------------------------------------

def test_entry_point_works_in_a_fresh_process():
    """backend="lightspeed" resolves through the installed entry point, without importing lightspeed."""
    code = (
        "import sys, torch\n"
        "m = torch.nn.Linear(4, 3).eval()\n"
        "x = torch.randn(2, 4)\n"
        "assert 'lightspeed' not in sys.modules\n"
        "c = torch.compile(m, backend='lightspeed', options={'backend': 'reference'})\n"
        "with torch.no_grad():\n"
        "    torch.testing.assert_close(c(x), m(x))\n"
        "assert 'lightspeed.torch_backend' in sys.modules\n"
        "print('ok')\n")
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                         cwd="/")
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_options_are_validated():
    with pytest.raises(ValueError, match="unknown Lightspeed option"):
        BackendOptions.parse({"fallbak": "eager"})
    with pytest.raises(ValueError, match="fallback must be one of"):
        BackendOptions.parse({"fallback": "maybe"})
    with pytest.raises(ValueError, match="unknown Lightspeed backend"):
        BackendOptions.parse({"backend": "tpu"})


# unsupported ops: a clear error, or an eager fallback --------------------------------------

def _two_unsupported(x):
    y = torch.special.i0(x) + 1.0            # no lowering: Bessel function
    z = torch.sin(y) * 2.0
    w = torch.special.bessel_j0(z)           # no lowering either
    return w.relu() + x


def test_unsupported_ops_are_all_listed():
    c = torch.compile(_two_unsupported, backend="lightspeed", options=REF)
    with pytest.raises(Exception) as info:
        with torch.no_grad():
            c(torch.randn(5))
    msg = str(info.value)
    assert "aten.special_i0" in msg or "aten.i0" in msg
    assert "aten.special_bessel_j0" in msg
    assert "2 op(s)" in msg
    assert "test_torch_backend.py" in msg      # where the op comes from in user code
    assert '"fallback": "eager"' in msg


def test_eager_fallback_runs_the_rest_compiled():
    x = torch.randn(5)
    c = torch.compile(_two_unsupported, backend="lightspeed", options={**REF, "fallback": "eager"})
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = c(x)
    torch.testing.assert_close(out, _two_unsupported(x))
    assert STATS.eager_nodes == 2           # exactly the two unsupported ops ran eagerly
    assert STATS.builds >= 2                # the parts around them were compiled by Lightspeed
    assert any("run in eager PyTorch" in str(w.message) for w in caught)


def test_gradients_are_refused_clearly():
    m = _mlp()
    x = torch.randn(3, 8)
    c = torch.compile(m, backend="lightspeed", options=REF)
    with pytest.raises(Exception, match="inference only"):
        c(x)  # grad mode on, parameters require grad


def test_gradients_with_eager_fallback():
    m = _mlp()
    x = torch.randn(3, 8)
    c = torch.compile(m, backend="lightspeed", options={**REF, "fallback": "eager"})
    out = c(x)
    out.sum().backward()
    assert m[0].weight.grad is not None
    torch.testing.assert_close(out.detach(), m(x).detach())


def test_inference_mode():
    m = _mlp()
    x = torch.randn(3, 8)
    c = torch.compile(m, backend="lightspeed", options=REF)
    with torch.inference_mode():
        torch.testing.assert_close(c(x), m(x))


# dtypes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
def test_half_precision_mlp(dtype, tol):
    m = _mlp(dtype)
    x = torch.randn(3, 8).to(dtype)
    c = torch.compile(m, backend="lightspeed")
    with torch.no_grad():
        out, ref = c(x), m(x)
    assert out.dtype == dtype
    # PyTorch's CPU kernels round differently inside linear layers: compare against float32 too
    with torch.no_grad():
        exact = m.float()(x.float())
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
    assert (out.float() - exact).abs().max() <= (ref.float() - exact).abs().max() * 4 + tol


class _Indexing(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.emb = nn.Embedding(20, 6)

    def forward(self, ids, mask, rows):
        e = self.emb(ids)                                   # int64 indices
        e = e.masked_fill(~mask[..., None], 0.0)            # bool mask
        picked = e.index_select(1, rows)
        counts = mask.sum(-1)                               # bool -> int64
        best = e.sum(-1).argmax(-1)                         # int64 result
        return picked, counts, best, torch.where(mask, ids, -1)


def test_int64_indices_and_bool_masks():
    m = _Indexing().eval()
    ids = torch.randint(0, 20, (3, 7))
    mask = torch.rand(3, 7) > 0.3
    rows = torch.tensor([6, 0, 3])
    c = torch.compile(m, backend="lightspeed")
    with torch.no_grad():
        got, want = c(ids, mask, rows), m(ids, mask, rows)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)


# parameters and inputs are bound without copying --------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_tensors_become_numpy_views(dtype):
    t = (torch.randn(4, 5) * 10).to(dtype)
    a = to_numpy(t)
    assert a.ctypes.data == t.data_ptr() and a.shape == (4, 5)
    back = to_torch(a, dtype)
    assert back.data_ptr() == a.ctypes.data and back.dtype == dtype
    assert torch.equal(back, t)


def test_parameters_are_read_at_call_time():
    """An in-place change to a parameter is seen by the next call, without recompiling:
    the weights are bound by reference, not baked into the compiled graph."""
    m = _mlp()
    x = torch.randn(3, 8)
    c = torch.compile(m, backend="lightspeed", options=REF)
    with torch.no_grad():
        c(x)
        builds = STATS.builds
        m[2].weight.mul_(-2.0)
        torch.testing.assert_close(c(x), m(x))
    assert STATS.builds == builds


def test_non_contiguous_input():
    m = _mlp()
    x = torch.randn(8, 3).t()                      # a transposed view
    c = torch.compile(m, backend="lightspeed", options=REF)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x))


# dynamic shapes -------------------------------------------------------------------------------

def test_dynamic_batch_does_not_recompile_and_bounds_grow():
    m = _mlp()
    c = torch.compile(m, backend="lightspeed", dynamic=True)
    with torch.no_grad():
        for b in (2, 5, 33):
            x = torch.randn(b, 8)
            torch.testing.assert_close(c(x), m(x))
        assert (STATS.fx_graphs, STATS.builds, STATS.bound_growths) == (1, 1, 0)
        # far beyond the upper bound the first compilation chose: Lightspeed rebuilds with a
        # larger bound, PyTorch does not recompile
        x = torch.randn(500, 8)
        torch.testing.assert_close(c(x), m(x))
    assert STATS.fx_graphs == 1 and STATS.bound_growths == 1


def test_symbolic_dims_come_from_pytorch_symbols():
    from lightspeed.torch_backend.symbols import SymbolTable
    import sympy
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    table = SymbolTable()
    e = table.expr(2 * s0 + s1 // 3)
    assert {v.name for v in table.vars.values()} == {"s0", "s1"}
    from lightspeed import symbolic as sym
    assert sym.evaluate(e, {"s0": 5, "s1": 10}) == 13
    with pytest.raises(ValueError, match="not supported"):
        table.expr(sympy.sin(s0))


def test_c_backend_dynamic_sequence():
    """The default C backend with a symbolic sequence length (attention-like math)."""
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(2)
            self.qkv = nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, -1)
            w = (q @ k.transpose(-1, -2) / 4.0).softmax(-1)
            return w @ v

    m = Attn().eval()
    c = torch.compile(m, backend="lightspeed", dynamic=True)
    with torch.no_grad():
        for s in (5, 9):
            x = torch.randn(2, s, 16)
            torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)
    assert STATS.fx_graphs == 1 and STATS.builds == 1


def test_outputs_alias_and_scalars():
    def f(x):
        n = x.shape[0]
        return x, x.view(-1), x * n, (x > 0).any()

    c = torch.compile(f, backend="lightspeed", options=REF, dynamic=True)
    x = torch.randn(3, 4)
    with torch.no_grad():
        got, want = c(x), f(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_numpy_views_reject_other_devices():
    t = torch.randn(2, device="meta")
    with pytest.raises(ValueError, match="CPU"):
        to_numpy(t)
    assert np.asarray(to_numpy(torch.zeros(0))).size == 0
