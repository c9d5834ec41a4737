"""Moving tensors between PyTorch and Lightspeed without copying.

Contiguous CPU tensors are handed to Lightspeed as numpy views of the same memory;
bfloat16 travels as its uint16 bit pattern (Lightspeed's bfloat16 storage). Results
come back as torch tensors that wrap the numpy output buffers.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import dtypes as dt

TORCH_TO_LS: dict[torch.dtype, dt.DType] = {
    torch.float32: dt.float32,
    torch.float16: dt.float16,
    torch.bfloat16: dt.bfloat16,
    torch.int64: dt.int64,
    torch.int32: dt.int32,
    torch.int16: dt.int16,
    torch.int8: dt.int8,
    torch.uint8: dt.uint8,
    torch.bool: dt.bool_,
}
LS_TO_TORCH: dict[dt.DType, torch.dtype] = {v: k for k, v in TORCH_TO_LS.items()}
# float64 values are carried as float32, and only where that cannot matter: between casts, and
# in 0-d scalar arithmetic (dynamo turns Python float attributes into 0-d float64 inputs that
# the graph combines and casts to float32); float64 tensors elsewhere are unsupported
CARRIED_AS: dict[torch.dtype, dt.DType] = {torch.float64: dt.float32}


def ls_dtype(d: torch.dtype) -> dt.DType:
    """The Lightspeed dtype of a torch dtype; ValueError for those Lightspeed lacks (float64, complex)."""
    try:
        return TORCH_TO_LS[d]
    except KeyError:
        raise ValueError(f"dtype {d} is not supported by Lightspeed (supported: "
                         f"{', '.join(str(k).replace('torch.', '') for k in TORCH_TO_LS)})") from None


def is_supported_dtype(d: torch.dtype) -> bool:
    return d in TORCH_TO_LS


def carrier_dtype(d: torch.dtype) -> dt.DType:
    """The Lightspeed dtype that holds values of torch dtype ``d`` (float64 only between casts)."""
    return CARRIED_AS[d] if d in CARRIED_AS else ls_dtype(d)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of ``t``'s memory (a copy only when ``t`` is not contiguous)."""
    if t.device.type != "cpu":
        raise ValueError(f"Lightspeed's torch backend runs on the CPU; got a tensor on {t.device}")
    t = t.detach()
    if t.dtype in CARRIED_AS:
        t = t.to(LS_TO_TORCH[CARRIED_AS[t.dtype]])  # the graph casts it to this type first anyway
    if not t.is_contiguous():
        t = t.contiguous()  # Lightspeed inputs are dense; a strided input costs one copy
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype not in TORCH_TO_LS:
        raise ValueError(f"dtype {t.dtype} is not supported by Lightspeed")
    return t.numpy()


def to_torch(a: np.ndarray, d: torch.dtype) -> torch.Tensor:
    """Wrap a Lightspeed output buffer as a torch tensor of dtype ``d`` (no copy)."""
    if not a.flags.writeable or not a.flags.c_contiguous:
        a = np.array(a, copy=True, order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
    if d is torch.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    t = torch.from_numpy(a)
    return t if t.dtype is d else t.to(d)
