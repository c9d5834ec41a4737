"""CUDA C -> cubin with NVRTC (the ``nvidia-cuda-nvrtc`` wheel through ``cuda.bindings.nvrtc``).

NVRTC needs no GPU and no driver, so every machine can check that the generated CUDA kernels compile.
Cubins are cached on disk under Lightspeed's cache directory (``cuda/``), keyed by source, architecture,
options and NVRTC version.
"""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache

DEFAULT_ARCH = "sm_90"
# precise division and square root (NVRTC's defaults, spelled out: the reference backend's values are
# numpy's); no fast-math intrinsics
NVRTC_OPTIONS = ("--std=c++17", "-prec-div=true", "-prec-sqrt=true", "-fmad=true")


class NvrtcError(RuntimeError):
    """NVRTC is not installed or rejected a generated kernel (the message holds its log)."""


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise NvrtcError("compiling CUDA kernels needs NVRTC: pip install nvidia-cuda-nvrtc cuda-bindings "
                         f"({e})") from None
    return nvrtc


@lru_cache(maxsize=None)
def nvrtc_version() -> str:
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(f"nvrtcVersion failed: {err}")
    return f"{major}.{minor}"


@lru_cache(maxsize=None)
def supported_archs() -> tuple[str, ...]:
    """The architectures this NVRTC compiles for ("sm_75", ..., "sm_90", ...)."""
    nvrtc = _nvrtc()
    return tuple(f"sm_{a}" for a in _check(nvrtc, nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))


def check_arch(arch: str) -> None:
    """Raise ValueError unless ``arch`` names an architecture this NVRTC supports ("sm_90", "sm_90a")."""
    if not (isinstance(arch, str) and arch.startswith("sm_") and arch[3:].rstrip("af").isdigit()):
        raise ValueError(f"arch must name a GPU architecture such as 'sm_90', got {arch!r}")
    base = "sm_" + arch[3:].rstrip("af")
    archs = supported_archs()
    if base not in archs:
        raise ValueError(f"NVRTC {nvrtc_version()} cannot compile for {arch}; it supports {', '.join(archs)}")


def available() -> str | None:
    """Why NVRTC cannot be used here, or None when it can."""
    try:
        nvrtc_version()
    except Exception as e:  # a missing wheel, or a library that does not load
        return str(e)
    return None


def _check(nvrtc, result, what: str):
    err = result[0]
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(f"{what} failed: {err}")
    return result[1] if len(result) == 2 else result[1:]


def _log(nvrtc, prog) -> str:
    size = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    buf = b" " * size
    _check(nvrtc, nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    return buf.rstrip(b"\x00").decode(errors="replace")


def compile_cubin(source: str, arch: str = DEFAULT_ARCH, name: str = "lightspeed.cu",
                  options: tuple[str, ...] = (), cache: bool = True) -> bytes:
    """The cubin (ELF) of CUDA C ``source`` for ``arch`` (e.g. "sm_90"); raises NvrtcError with NVRTC's log."""
    check_arch(arch)
    opts = (f"--gpu-architecture={arch}",) + NVRTC_OPTIONS + tuple(options)
    path = None
    if cache:
        from ..c.cache_files import cache_subdir
        key = hashlib.sha256("\0".join((source, nvrtc_version()) + opts).encode()).hexdigest()[:40]
        path = cache_subdir("cuda") / f"{key}.cubin"
        try:
            data = path.read_bytes()
            if data[:4] == b"\x7fELF":
                return data
        except OSError:
            pass
    nvrtc = _nvrtc()
    prog = _check(nvrtc, nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        encoded = [o.encode() for o in opts]
        err = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)[0]
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(f"NVRTC could not compile {name} for {arch}:\n{_log(nvrtc, prog)}")
        size = _check(nvrtc, nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    if path is not None:  # written under a private name, then renamed: concurrent compiles both succeed
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(cubin)
            os.replace(tmp, path)
        except OSError:
            pass
    return cubin
