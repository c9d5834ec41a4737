"""Requantization at load (``--quant``): a GGUF model's matrices re-encoded in memory.

    lm = load_model("SmolLM2-135M-Instruct.Q4_1.gguf")
    requantize_model(lm, "q8_0")        # lm.weights now serves Q8_0 blocks; compile as usual

The model keeps reading its weights through a ``GGUFWeights`` store; only the file object
under it changes: a ``RequantizedFile`` whose tensor table holds ``RequantizedTensor``
objects (new arrays) for the converted matrices and the original memory-mapped tensors
for everything else. Tensors are converted one at a time, and the pages of the mapped file
that converted tensors occupied are handed back to the kernel (``MADV_DONTNEED``, every 16 MB), so the
process holds the new weights, not the new and the old ones.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as dt
from ..memory import ALIGN, HugePageRegion, release_file_pages
from ..quant import QType, dequantize
from .plan import byte_shape, convert, parse_target, planned_type

RELEASE_BYTES = 16 << 20  # the old pages held at most before they are handed back

# element views of the plain (unblocked) types: numpy dtype of the view, Lightspeed dtype
_PLAIN = {QType.F32: ("<f4", dt.float32), QType.F16: ("<f2", dt.float16), QType.BF16: ("<u2", dt.bfloat16)}


class RequantizedTensor:
    """A tensor held in memory with the same interface as ``io.gguf.GGUFTensor``."""

    supported = True

    def __init__(self, name: str, qtype: QType, shape: tuple[int, ...], raw: np.ndarray):
        expected = byte_shape(shape, qtype)
        if tuple(raw.shape) != expected or raw.dtype != np.uint8:
            raise ValueError(f"RequantizedTensor {name!r}: raw bytes of {qtype.name}{shape} must be uint8 "
                             f"{expected}, got {raw.dtype}{tuple(raw.shape)}")
        self.name, self.qtype, self.shape, self.raw = name, qtype, tuple(shape), raw

    @property
    def n_bytes(self) -> int:
        return int(self.raw.nbytes)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def ls_dtype(self) -> dt.DType:
        return _PLAIN.get(self.qtype, (None, dt.uint8))[1]

    def numpy(self) -> np.ndarray:
        """Element values for F32/F16/BF16 (BF16 as uint16 bits), the raw bytes otherwise (no copy)."""
        if self.qtype not in _PLAIN:
            return self.raw
        return self.raw.view(_PLAIN[self.qtype][0]).reshape(self.shape)

    def dequantize(self) -> np.ndarray:
        return dequantize(self.raw, self.qtype, self.shape)

    def __repr__(self) -> str:
        return f"RequantizedTensor({self.name!r}, {self.qtype.name}, shape={self.shape})"


class RequantizedFile:
    """A parsed GGUF file with some tensors replaced; every other attribute is the original's."""

    def __init__(self, original: Any, tensors: dict[str, Any], target: QType):
        self.original, self.tensors, self.target = original, tensors, target

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)

    def __repr__(self) -> str:
        return f"RequantizedFile({self.original!r} -> {self.target.name})"


def requantize_file(gf: Any, target: str | QType, release: bool = True) -> RequantizedFile:
    """``gf`` (a ``GGUFFile``) with its matrices re-encoded as ``target`` (see ``plan.planned_type``)."""
    target = parse_target(target)
    tensors: dict[str, Any] = {}
    done: list[np.ndarray] = []  # converted tensors whose file pages are not released yet
    plan = {name: planned_type(tuple(t.shape), t.qtype, target) for name, t in gf.tensors.items()}
    # the new weights go to one region advised for huge pages, where compiled kernels read them
    # (lightspeed/memory.py; the C backend would otherwise copy them there)
    sizes = [int(np.prod(byte_shape(tuple(t.shape), plan[n]), dtype=np.int64))
             for n, t in gf.tensors.items() if plan[n] is not t.qtype]
    region = HugePageRegion(sum(-(-b // ALIGN) * ALIGN for b in sizes) + ALIGN) if sizes else None
    for name, t in gf.tensors.items():
        to = plan[name]
        if to is t.qtype:
            tensors[name] = t
            continue
        shape = byte_shape(tuple(t.shape), to)
        raw = convert(t.raw, t.qtype, to, out=region.take(int(np.prod(shape, dtype=np.int64)), np.uint8, shape))
        tensors[name] = RequantizedTensor(name, to, tuple(t.shape), raw)
        if release:
            done.append(t.raw)
            if sum(a.nbytes for a in done) >= RELEASE_BYTES:  # batched: each release reads the process's maps
                release_file_pages(done)
                done = []
    if release:
        release_file_pages(done)
    return RequantizedFile(gf, tensors, target)


def requantize_model(lm: Any, target: str | QType) -> Any:
    """Re-encode the matrices of ``lm`` (a ``CausalLM`` loaded from GGUF) as ``target`` in memory,
    before it is compiled; returns ``lm``. Models from Hugging Face folders are not supported."""
    from ..models.weights import GGUFWeights
    weights = lm.weights
    if not isinstance(weights, GGUFWeights):
        raise ValueError(f"{weights.path}: --quant needs a GGUF model (this is a {type(weights).__name__} store); "
                         f"write one with `lightspeed quantize` from a GGUF file")
    lm.weights = GGUFWeights(requantize_file(weights.file, target))
    return lm


def stored_types(weights: Any) -> dict[str, int]:
    """Bytes per stored type name over all tensors of a GGUF weight store (e.g. {"Q8_0": ..., "F32": ...})."""
    out: dict[str, int] = {}
    for t in weights.file.tensors.values():
        out[t.qtype.name] = out.get(t.qtype.name, 0) + int(t.n_bytes)
    return out

