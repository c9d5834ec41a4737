"""The C backend's activation modes: the three of ``kernel.quantized`` (how each quantized matmul takes its
activations) and ``"auto"``, which picks per call by its number of rows.

On a CPU with AVX-512, "auto" forms the kernels as "int16" and defines ``LS_QUANT_ROWS_MAX`` in the source: a
call of at most that many activation rows (decode, batched decode) quantizes them to int16; a longer one
(prefill) runs the float kernel, which is faster for many rows (qdecode.h, ``ls_quantize_rows16``). A row's
result then depends on whether its call had more than ``AUTO_QUANT_ROWS`` rows (float) or not (int16), unlike
the fixed modes. A build that turns AVX-512 off by its flags (or ``portable``) is int16 at every row count.

Elsewhere "auto" is "float": AVX2's float prefill (qgemm.h) is called per chunk of weight rows, which the int16
kernel's per-row calls cannot fall back to, and int16 prefill there was 0.55-0.76x of float (an AVX2 build on
this project's Xeon) for 1.1-1.35x in decode: by the rule (benchmarks/README.md) prefill must not lose.
"""
from __future__ import annotations

from ...kernel.quantized import ACTIVATION_MODES, activation_mode
from .target import host_target

AUTO = "auto"
AUTO_QUANT_ROWS = 8  # the most rows a call quantizes under "auto": the row group of one pass (LS_QMM_ROWS)
MODES = (AUTO,) + ACTIVATION_MODES


def resolve_activations(activations: str, int8_activations: bool = False, avx512: bool | None = None
                        ) -> tuple[str, int | None]:
    """(the kernels' activation mode, the most rows a call quantizes or None for no limit) of a C-backend
    ``activations`` option; ValueError naming the choices for an unknown one. ``avx512``: whether the CPU has
    AVX-512 (None: this machine's)."""
    if activations == AUTO:
        if int8_activations:
            raise ValueError("int8_activations=True contradicts activations='auto'")
        if avx512 is None:
            avx512 = host_target().vector_bytes >= 64
        return ("int16", AUTO_QUANT_ROWS) if avx512 else ("float", None)
    if activations not in ACTIVATION_MODES:
        raise ValueError(f"activations={activations!r}: expected one of {', '.join(MODES)}")
    return activation_mode(activations, int8_activations), None


def source_prefix(quant_rows_max: int | None) -> str:
    """The defines the rendered source starts with for that limit (none without one)."""
    return "" if quant_rows_max is None else f"#define LS_QUANT_ROWS_MAX {int(quant_rows_max)}\n"
