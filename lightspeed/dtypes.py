"""Element types: their sizes, C names and numpy equivalents."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    """An element type. ``np`` is the numpy dtype used to hold it (bfloat16 is held as uint16 bits)."""

    name: str
    itemsize: int
    kind: str  # "f" float, "i" signed int, "u" unsigned int, "b" bool
    np: np.dtype
    c: str  # C storage type

    def __repr__(self) -> str:
        return f"ls.{self.name}"

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"


float32 = DType("float32", 4, "f", np.dtype(np.float32), "float")
float16 = DType("float16", 2, "f", np.dtype(np.float16), "_Float16")
bfloat16 = DType("bfloat16", 2, "f", np.dtype(np.uint16), "uint16_t")
int8 = DType("int8", 1, "i", np.dtype(np.int8), "int8_t")
uint8 = DType("uint8", 1, "u", np.dtype(np.uint8), "uint8_t")
int16 = DType("int16", 2, "i", np.dtype(np.int16), "int16_t")
uint16 = DType("uint16", 2, "u", np.dtype(np.uint16), "uint16_t")
int32 = DType("int32", 4, "i", np.dtype(np.int32), "int32_t")
uint32 = DType("uint32", 4, "u", np.dtype(np.uint32), "uint32_t")
int64 = DType("int64", 8, "i", np.dtype(np.int64), "int64_t")
bool_ = DType("bool", 1, "b", np.dtype(np.bool_), "uint8_t")

ALL = (float32, float16, bfloat16, int8, uint8, int16, uint16, int32, uint32, int64, bool_)
BY_NAME = {d.name: d for d in ALL}
_FROM_NP = {d.np: d for d in ALL if d is not bfloat16}


def from_numpy(dt) -> DType:
    """The Lightspeed dtype that holds numpy dtype ``dt``."""
    try:
        return _FROM_NP[np.dtype(dt)]
    except (KeyError, TypeError):
        raise ValueError(f"numpy dtype {dt} has no Lightspeed equivalent") from None


def as_dtype(x) -> DType:
    """Accept a DType, its name, or a numpy dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in BY_NAME:
        return BY_NAME[x]
    return from_numpy(x)


def float32_bits(v: float) -> int:
    """The bit pattern of ``v`` rounded to float32 (how the e-graphs spell constants)."""
    return int(np.array(v, dtype=np.float32).view(np.uint32))


def bits_float32(bits: int) -> float:
    """The float32 whose bit pattern is ``bits``."""
    return float(np.array(bits, dtype=np.uint32).view(np.float32))


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) to float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 bit patterns, rounding to nearest even (NaN stays NaN)."""
    f = np.asarray(x, dtype=np.float32)
    u = np.ascontiguousarray(f).reshape(f.shape).view(np.uint32)  # ascontiguousarray makes 0-d arrays 1-d
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded = np.where(nan, np.uint16(0x7FC0), rounded)
    return rounded


def to_compute_numpy(x: np.ndarray, dtype: DType) -> np.ndarray:
    """The numpy array a reference computation uses for values of ``dtype``."""
    if dtype is bfloat16:
        return bf16_to_f32(x)
    return x


def from_compute_numpy(x: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype is bfloat16:
        return f32_to_bf16(np.asarray(x, dtype=np.float32))
    return np.asarray(x).astype(dtype.np, copy=False)
