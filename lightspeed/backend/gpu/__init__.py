"""The shared GPU renderer: kernel plans as OpenCL C or CUDA C kernels (see render.py, dialect.py)."""
from __future__ import annotations

from .dialect import CUDA, DIALECTS, OPENCL, Dialect
from .render import GpuKernel, GpuProgram, form_plan, render_kernel, render_program

__all__ = ["CUDA", "DIALECTS", "OPENCL", "Dialect", "GpuKernel", "GpuProgram", "form_plan", "render_kernel",
           "render_program"]
