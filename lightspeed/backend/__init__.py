"""Backends register themselves by name; the core never imports a backend directly."""
from __future__ import annotations

from typing import Callable

_REGISTRY: dict[str, Callable] = {}
_LAZY = {"reference": "lightspeed.backend.reference", "c": "lightspeed.backend.c",
         "opencl": "lightspeed.backend.opencl", "cuda": "lightspeed.backend.cuda"}


def register_backend(name: str):
    """Class decorator: ``@register_backend("c")`` makes ``graph.compile(..., backend="c")`` use it."""
    def wrap(cls):
        _REGISTRY[name] = cls
        return cls
    return wrap


def get_backend(name: str):
    if name not in _REGISTRY and name in _LAZY:
        import importlib
        importlib.import_module(_LAZY[name])
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; available: {sorted(set(_REGISTRY) | set(_LAZY))}") from None


def available_backends() -> list[str]:
    return sorted(set(_REGISTRY) | set(_LAZY))
