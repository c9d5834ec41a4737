"""The C backend's activation modes: the three of ``kernel.quantized`` (how each quantized matmul takes its
activations) and ``"auto"``, which picks by the CPU and, on some CPUs, per call by its number of rows.

- AVX-512 with VNNI and no AMX (AMD Zen 4): "int16" at every row count. The 16-row kernels of qdot16x16.h beat
  the float prefill kernels there (SmolLM2 Q4_1, 512-token prompt: 627 against 444 tok/s, 2 threads), and a
  row's result then does not depend on how many rows its call had, so a request's tokens do not change with the
  batch it shares.
- AVX-512 otherwise (with AMX, or without VNNI): "int16" with ``LS_QUANT_ROWS_MAX`` defined in the source: a
  call of at most ``AUTO_QUANT_ROWS`` activation rows (decode, batched decode) quantizes them to int16; a longer
  one (prefill) runs the float kernel (on AMX its first rows & ~15 on bfloat16 tiles, qamx.h), faster there for
  many rows. A row's result then depends on whether its call had more than ``AUTO_QUANT_ROWS`` rows. A build
  that turns AVX-512 off by its flags takes the AVX2 form below; ``portable`` is int16 at every row count.
- AVX2 with FMA, no AVX-512: "int16" for calls of at most ``AUTO_QUANT_ROWS`` rows too, a longer call running
  qgemm.h's float kernel, called per chunk of weight rows as under "float" (``LS_AUTO_QGEMM``): the per-row
  int16 kernels decode faster than float there (AMD Zen 1, SmolLM2 Q4_1, 2 threads: 1.2-1.5x) but lose from
  4 rows on (batched decode), and int16 prefill was 0.55-0.8x of float; by the rule (benchmarks/README.md)
  prefill must not lose.
- Elsewhere "float".
"""
from __future__ import annotations

from collections.abc import Iterable

from ...kernel.quantized import ACTIVATION_MODES, activation_mode
from .target import host_flags

AUTO = "auto"
# the most rows a call quantizes under "auto": the row group of one pass (LS_QMM_ROWS). On AVX2 too, though there
# the per-row int16 kernels beat qgemm.h's float kernel for 1-3 rows only (AMD Zen 1, one thread, SmolLM2's
# 576 x 1536: Q4_1 0.74x of float's time at 1 row, 0.94x at 3, 1.08x at 4, 1.22x at 8): with 8, a batched decode
# step of up to 8 rows rounds each row as a single-sequence step does, so served greedy tokens equal generate's
AUTO_QUANT_ROWS = 8
MODES = (AUTO,) + ACTIVATION_MODES


def auto_activations(flags: Iterable[str]) -> tuple[str, int | None]:
    """What "auto" is on a CPU with these /proc/cpuinfo ``flags``: (mode, the most rows a call quantizes or
    None for no limit)."""
    flags = set(flags)
    if "avx512f" not in flags:
        return ("int16", AUTO_QUANT_ROWS) if {"avx2", "fma"} <= flags else ("float", None)
    if "avx512_vnni" in flags and "amx_tile" not in flags:
        return "int16", None
    return "int16", AUTO_QUANT_ROWS


def resolve_activations(activations: str, int8_activations: bool = False, flags: Iterable[str] | None = None
                        ) -> tuple[str, int | None]:
    """(the kernels' activation mode, the most rows a call quantizes or None for no limit) of a C-backend
    ``activations`` option; ValueError naming the choices for an unknown one. ``flags``: the CPU's feature
    flags (None: this machine's)."""
    if activations == AUTO:
        if int8_activations:
            raise ValueError("int8_activations=True contradicts activations='auto'")
        return auto_activations(host_flags() if flags is None else flags)
    if activations not in ACTIVATION_MODES:
        raise ValueError(f"activations={activations!r}: expected one of {', '.join(MODES)}")
    return activation_mode(activations, int8_activations), None


def source_prefix(quant_rows_max: int | None) -> str:
    """The defines the rendered source starts with for that limit (none without one)."""
    return "" if quant_rows_max is None else f"#define LS_QUANT_ROWS_MAX {int(quant_rows_max)}\n"
