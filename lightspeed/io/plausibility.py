"""Plausibility checks on model metadata, made before anything is allocated from it.

A model file's numbers size everything that follows (a ``block_count`` of 10^6 would build a
million layers and their caches), so each number is checked for type, finiteness and range
when it is read, and the layer count and dimensions are checked against the tensors the file
really holds. Every failure is a ``ModelFormatError`` naming the file and the key or tensor.

    n = meta_int(path, "llama.block_count", value, hi=MAX_LAYERS)
    eps = meta_float(path, "llama.attention.layer_norm_rms_epsilon", value, below=1.0)
    check_layers(path, "llama.block_count", n, lambda i: f"blk.{i}.attn_norm.weight" in weights)
    check_shapes(path, weights.shape, {"token_embd.weight": (vocab, hidden), ...})
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from .errors import ModelFormatError

MAX_LAYERS = 4096          # the largest released models have ~130
MAX_WIDTH = 1 << 20        # hidden size, feed-forward size, head counts and sizes
MAX_VOCAB = 1 << 23
MAX_CONTEXT = 1 << 24
REQUIRED = object()


def meta_int(path: str, key: str, value: Any, *, lo: int = 1, hi: int = MAX_WIDTH) -> int:
    """``value`` as an int in ``[lo, hi]`` (an integral float from JSON is accepted)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelFormatError(path, f"{key} must be an integer, got {_show(value)}")
    if not lo <= value <= hi:
        raise ModelFormatError(path, f"{key} = {value} is implausible (expected {lo} to {hi})")
    return value


def meta_float(path: str, key: str, value: Any, *, above: float = 0.0, below: float = math.inf) -> float:
    """``value`` as a finite float with ``above < value < below``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelFormatError(path, f"{key} must be a number, got {_show(value)}")
    v = float(value)
    if not math.isfinite(v) or not above < v < below:
        bound = f"between {above:g} and {below:g}" if math.isfinite(below) else f"greater than {above:g}"
        raise ModelFormatError(path, f"{key} = {value!r} is not a finite number {bound}")
    return v


def check_layers(path: str, key: str, n_layers: int, has_layer: Callable[[int], bool], probe: str) -> None:
    """Every layer ``0 .. n_layers-1`` has its tensors (``has_layer``): the count must not exceed the file's."""
    if n_layers >= 1 and has_layer(n_layers - 1) and all(has_layer(i) for i in range(n_layers)):
        return
    present = 0
    while present < MAX_LAYERS and has_layer(present):
        present += 1
    raise ModelFormatError(path, f"{key} = {n_layers}, but the file has tensors for {present} layers "
                                 f"(no {probe.format(i=present)})")


def check_shapes(path: str, shape_of: Callable[[str], tuple[int, ...]], expected: Mapping[str, tuple[int, ...]],
                 source: str, display: Callable[[str], str] = str) -> None:
    """Each tensor has the shape the metadata implies (``source`` names where those numbers came from;
    ``display`` gives a tensor's name as the file spells it)."""
    for name, want in expected.items():
        got = tuple(shape_of(name))
        if got != tuple(want):
            raise ModelFormatError(path, f"tensor {display(name)!r} has shape {got}, but {source} imply {tuple(want)}")


def arch_int(gf, name: str, default: Any = REQUIRED, **bounds: int) -> int:
    """The GGUF key ``<architecture>.<name>`` checked by ``meta_int``."""
    value = gf.arch(name) if default is REQUIRED else gf.arch(name, default)
    return meta_int(gf.path, f"{gf.architecture}.{name}", value, **bounds)


def arch_float(gf, name: str, default: Any = REQUIRED, **bounds: float) -> float:
    """The GGUF key ``<architecture>.<name>`` checked by ``meta_float``."""
    value = gf.arch(name) if default is REQUIRED else gf.arch(name, default)
    return meta_float(gf.path, f"{gf.architecture}.{name}", value, **bounds)


def gguf_layer_count(gf, has_tensor: Callable[[str], bool]) -> int:
    """``<architecture>.block_count``, bounded and checked against the file's ``blk.{i}.attn_norm.weight``
    tensors (``has_tensor``) before anything is allocated from it."""
    n_layers = arch_int(gf, "block_count", hi=MAX_LAYERS)
    check_layers(gf.path, f"{gf.architecture}.block_count", n_layers,
                 lambda i: has_tensor(f"blk.{i}.attn_norm.weight"), "tensor 'blk.{i}.attn_norm.weight'")
    return n_layers


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"
