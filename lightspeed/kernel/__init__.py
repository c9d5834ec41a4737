"""Kernel formation (fusion), the loop IR and memory planning — shared by native backends."""
from .fusion import KernelPlan, form_kernels
from .ir import Buffer, Kernel

__all__ = ["KernelPlan", "form_kernels", "Buffer", "Kernel"]
