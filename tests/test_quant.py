"""GGUF block formats: numpy dequantizers and quantizers, checked against the `gguf` package."""
import numpy as np
import pytest

from lightspeed import quant
from lightspeed.quant import FORMATS, QType

gguf = pytest.importorskip("gguf", reason="the gguf package is the independent oracle for these tests")

# f16 bit patterns that exercise every branch of a scale decode
EDGE_HALVES = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
               0x7E00, 0x7C01, 0x1234, 0xC321]


def _gguf_type(q: QType):
    return gguf.GGMLQuantizationType(int(q))


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as float32 bit patterns, with any NaN equal to any NaN."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    keep = ~np.isnan(a)
    return np.array_equal(a.view(np.uint32)[keep], b.view(np.uint32)[keep])


def _half_offsets(q: QType) -> list[int]:
    """Byte offsets of the float16 fields inside one block."""
    return {QType.F16: [0], QType.Q8_0: [0], QType.Q4_0: [0], QType.Q4_1: [0, 2], QType.Q5_0: [0],
            QType.Q4_K: [0, 2], QType.Q6_K: [208]}.get(q, [])


def random_blocks(q: QType, n: int, seed: int) -> np.ndarray:
    """Random block bytes whose float16 fields cycle through the edge patterns in some blocks."""
    fmt = FORMATS[q]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, fmt.block_bytes), dtype=np.uint8)
    for off in _half_offsets(q):
        for i in range(0, n, 2):  # every other block gets an edge pattern, the rest stay random
            bits = EDGE_HALVES[(i // 2 + off) % len(EDGE_HALVES)]
            raw[i, off], raw[i, off + 1] = bits & 0xFF, bits >> 8
    return raw


def test_format_table():
    expect = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20),
              "Q5_0": (32, 22), "Q4_K": (256, 144), "Q6_K": (256, 210)}
    assert {f.name: (f.block_elems, f.block_bytes) for f in FORMATS.values()} == expect
    for q, fmt in FORMATS.items():  # the gguf package agrees on every size
        assert gguf.GGML_QUANT_SIZES[_gguf_type(q)] == (fmt.block_elems, fmt.block_bytes)
        assert int(q) == int(_gguf_type(q))
    assert quant.block_format("q4_1") is FORMATS[QType.Q4_1]
    assert quant.block_format(8).name == "Q8_0"
    assert quant.type_size("Q5_K") == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q5_K]
    with pytest.raises(NotImplementedError, match="Q5_K"):
        quant.block_format("Q5_K")
    with pytest.raises(ValueError, match="unknown"):
        quant.as_qtype(999)
    with pytest.raises(ValueError, match="multiple of the block size"):
        FORMATS[QType.Q4_0].row_bytes(33)


@pytest.mark.parametrize("q", list(FORMATS), ids=lambda q: q.name)
def test_dequantize_matches_gguf(q):
    raw = random_blocks(q, 96, seed=int(q)).reshape(8, -1)   # 8 rows of 12 blocks
    mine = quant.dequantize(raw, q)
    with np.errstate(all="ignore"):
        ref = np.asarray(gguf.quants.dequantize(raw, _gguf_type(q)), np.float32)
    fmt = FORMATS[q]
    assert mine.shape == (8, 12 * fmt.block_elems)
    assert _same_bits(mine, ref.reshape(mine.shape))


def test_dequantize_shape_and_errors():
    raw = quant.quantize(np.ones((4, 64), np.float32), "Q8_0")
    assert quant.dequantize(raw, "Q8_0", shape=(2, 2, 64)).shape == (2, 2, 64)
    with pytest.raises(ValueError, match="34-byte blocks"):
        quant.dequantize(raw[:, :-1], "Q8_0")
    with pytest.raises(ValueError, match="uint8"):
        quant.dequantize(raw.astype(np.int32), "Q8_0")


def _test_data(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((48, 128)) * rng.exponential(1.0, (48, 1))).astype(np.float32)
    x[0] = 0.0                                             # an all-zero block
    x[1] = 2.5                                             # a constant block
    x[2] = np.round(x[2] * 2) / 2                          # exact halves: the rounding ties
    x[3, :64] = -x[3, :64].__abs__()                       # a block whose extreme is negative
    x[4] = x[4] * 1e-6                                     # tiny scales (f16 subnormal)
    x[5, ::7] = 3e4                                        # large values
    return x


@pytest.mark.parametrize("q", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
def test_quantize_matches_gguf_bytes(q):
    x = _test_data(1)
    mine = quant.quantize(x, q)
    ref = np.ascontiguousarray(gguf.quants.quantize(x, _gguf_type(quant.as_qtype(q)))).view(np.uint8)
    assert mine.dtype == np.uint8
    assert mine.shape == (48, FORMATS[quant.as_qtype(q)].row_bytes(128))
    assert np.array_equal(mine, ref.reshape(mine.shape))


def _round_trip_bound(x: np.ndarray, q: str) -> np.ndarray:
    """The largest error each element may have after quantize -> dequantize, from the format's rules."""
    blocks = x.reshape(-1, 32).astype(np.float64)
    if q == "Q8_0":
        d = np.abs(blocks).max(1, keepdims=True) / 127
        d16 = d.astype(np.float16).astype(np.float64)
        rel = np.abs(np.divide(d16, d, out=np.ones_like(d), where=d > 0) - 1)
        bound = 0.5 * d16 + np.abs(blocks) * rel
    elif q == "Q4_0":
        ext = np.take_along_axis(blocks, np.abs(blocks).argmax(1)[:, None], 1)
        d = np.abs(ext) / 8
        d16 = d.astype(np.float16).astype(np.float64)
        rel = np.abs(np.divide(d16, d, out=np.ones_like(d), where=d > 0) - 1)
        bound = 1.0 * d16 + np.abs(blocks) * rel             # values near -extreme clip at q = 15
    else:  # Q4_1
        lo, hi = blocks.min(1, keepdims=True), blocks.max(1, keepdims=True)
        d = (hi - lo) / 15
        d16 = d.astype(np.float16).astype(np.float64)
        rel = np.abs(np.divide(d16, d, out=np.ones_like(d), where=d > 0) - 1)
        bound = 0.5 * d16 + (blocks - lo) * rel + np.abs(lo.astype(np.float16).astype(np.float64) - lo)
    return (bound * (1 + 1e-5) + 1e-30).reshape(x.shape)     # float32 rounding slack


@pytest.mark.parametrize("q,max_rel_rms", [("Q8_0", 0.01), ("Q4_0", 0.12), ("Q4_1", 0.10)])
def test_round_trip_error(q, max_rel_rms):
    x = _test_data(2)
    x[5] = 1.0  # keep the bound's f16 scale finite
    back = quant.dequantize(quant.quantize(x, q), q)
    err = np.abs(back.astype(np.float64) - x)
    assert np.all(err <= _round_trip_bound(x, q)), f"{q}: worst excess {(err - _round_trip_bound(x, q)).max()}"
    gauss = np.random.default_rng(3).standard_normal((64, 256)).astype(np.float32)
    g_back = quant.dequantize(quant.quantize(gauss, q), q)
    rel_rms = np.sqrt(np.mean((g_back - gauss) ** 2) / np.mean(gauss ** 2))
    assert rel_rms < max_rel_rms
    assert np.all(quant.dequantize(quant.quantize(np.zeros((2, 64), np.float32), q), q) == 0)


def test_float_formats_round_trip():
    x = _test_data(4)
    assert np.array_equal(quant.dequantize(quant.quantize(x, "F32"), "F32"), x)
    assert np.array_equal(quant.dequantize(quant.quantize(x, "F16"), "F16"), x.astype(np.float16).astype(np.float32))
    bf = quant.dequantize(quant.quantize(x, "BF16"), "BF16")
    assert np.all(np.abs(bf - x) <= np.abs(x) * 2.0 ** -8)


def test_quantize_errors():
    with pytest.raises(ValueError, match="multiple of the block size 32"):
        quant.quantize(np.zeros((2, 40), np.float32), "Q4_0")
    with pytest.raises(NotImplementedError, match="Q6_K"):
        quant.quantize(np.zeros((1, 256), np.float32), "Q6_K")
