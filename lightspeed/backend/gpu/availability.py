"""Whether a GPU backend can run here, asked before anything is compiled (the command line uses this so
that ``--backend cuda`` on a machine without a driver fails at once, with the reason, not after a model
has been loaded and compiled), and the error for options a GPU backend does not take."""
from __future__ import annotations

from typing import Iterable, Mapping

GPU_BACKENDS = ("opencl", "cuda")


def unavailable_reason(backend: str) -> str | None:
    """Why ``backend`` ("opencl" or "cuda") cannot run kernels here, or None when it can (and for every
    other backend name)."""
    if backend == "opencl":
        from ..opencl import unavailable_reason as opencl_reason
        return opencl_reason()
    if backend == "cuda":
        from ..cuda import device_unavailable_reason
        return device_unavailable_reason()
    return None


def require_runnable(backend: str) -> None:
    """Raise the backend's own error (OpenCLUnavailableError, CudaUnavailableError) when ``backend`` is a
    GPU backend that cannot run here; nothing for other backends."""
    if backend == "opencl":
        from ..opencl import find_device
        find_device()
    elif backend == "cuda":
        from ..cuda import CudaUnavailableError, device_unavailable_reason
        reason = device_unavailable_reason()
        if reason is not None:
            raise CudaUnavailableError(f"--backend cuda cannot run here: {reason}")


def reject_options(backend: str, options: Mapping[str, object], accepted: Iterable[str]) -> None:
    """A ValueError naming the options ``backend`` does not take (the C backend's performance switches,
    such as ``activations`` or ``templates``, have no meaning for the GPU kernels; ``activations="float"`` is what
    they do anyway and is accepted)."""
    # the GPU kernels take float32 activations: asking for exactly that is no conflict
    unknown = sorted(k for k in options if not (k == "activations" and options[k] == "float"))
    if unknown:
        raise ValueError(f"backend {backend!r} does not take the option(s) {', '.join(unknown)} (C-backend "
                         f"options; it takes: {', '.join(accepted)})")


SEARCH_BUDGET_S = 30.0  # the default time budget of a GPU backend's schedule search (search=1 or 2)


def check_search_options(backend: str, search: object, schedules: object) -> None:
    """A ValueError when a GPU backend's ``search`` is not 0, 1 or 2, or comes with ``schedules`` (the search
    chooses them)."""
    if search not in (0, 1, 2):
        raise ValueError(f"backend {backend!r}: search must be 0, 1 or 2, got {search!r}")
    if search and schedules is not None:
        raise ValueError(f"backend {backend!r}: give schedules or search, not both (the search chooses them)")
