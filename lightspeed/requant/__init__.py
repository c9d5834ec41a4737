"""Requantizing a model's weights to another GGUF block type.

- at load, in memory (``--quant q8_0`` on ``generate``, ``chat``, ``bench``): ``requantize_model``;
- into a new file (``lightspeed quantize IN OUT --type q8_0``): ``quantize_gguf``.

Matrices become the target type; vectors (norms, biases) stay as stored (see ``plan``).
"""
from .gguf_file import QuantizeReport, metadata_types, quantize_gguf
from .memory import RequantizedFile, RequantizedTensor, requantize_file, requantize_model, stored_types
from .plan import TARGETS, convert, parse_target, planned_type

__all__ = ["TARGETS", "parse_target", "planned_type", "convert", "requantize_model", "requantize_file",
           "RequantizedFile", "RequantizedTensor", "stored_types", "quantize_gguf", "QuantizeReport",
           "metadata_types"]
