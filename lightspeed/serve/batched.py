"""Moved to ``lightspeed.engine.batched`` (the serving engine lives in the generation layer); these names stay
importable from here for older code."""
from ..engine.batched import KEY_BLOCK, BatchedKV, BatchedStep, build_batched, supports

__all__ = ["KEY_BLOCK", "BatchedKV", "BatchedStep", "build_batched", "supports"]
