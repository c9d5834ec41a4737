"""GGUF/ggml block formats: data, numpy reference codecs, and dequantisation as graph ops.

Formats (``FORMATS``, keyed by ``QType``; see ``formats`` for the byte layouts):
F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K.

Typical use::

    from lightspeed import quant
    fmt = quant.block_format("Q4_1")           # BlockFormat(Q4_1, 32 elems in 20 bytes)
    w = quant.dequantize(raw, "Q4_1")          # numpy: uint8 (rows, row_bytes) -> float32 (rows, cols)
    raw2 = quant.quantize(w, "Q8_0")           # numpy: float32 (rows, cols) -> uint8 (rows, row_bytes)

    # in a model graph: keep the weight quantized, decode inside the graph
    g = ls.Graph()
    raw_w = g.input("w", (rows, row_bytes), ls.uint8)      # or g.constant(gguf_tensor.raw)
    W = quant.dequant_matrix_graph(raw_w, "Q4_1")          # float32 (rows, cols), rows = out_features
    y = x @ W.T

``dequant_graph`` works on ``(n_blocks, block_bytes)`` and is bit-exact against
``dequantize`` on the reference backend. Quantizers exist for F32, F16, BF16, Q8_0,
Q4_0 and Q4_1 and produce the same bytes as ggml's reference quantizers.
"""
from .decode_graph import (bf16_from_bytes, bit_field, dequant_graph, dequant_matrix_graph, f32_from_bytes,
                           half_from_bytes)
from .dequant import dequantize, dequantize_blocks
from .formats import FORMATS, BlockFormat, QType, as_qtype, block_format, type_size
from .quantize import QUANTIZABLE, quantize

__all__ = ["QType", "BlockFormat", "FORMATS", "as_qtype", "block_format", "type_size", "dequantize",
           "dequantize_blocks", "quantize", "QUANTIZABLE", "dequant_graph", "dequant_matrix_graph",
           "half_from_bytes", "bf16_from_bytes", "f32_from_bytes", "bit_field"]
