"""Perplexity of a text under a compiled model: the evidence for choosing how quantized matmuls take their
activations (``activations="float" | "int16" | "int8"``), and a check that a model file loads correctly.

    step = lm.compile(ctx, last_only=False)     # logits for every position
    result = perplexity(step, token_ids)
    result.perplexity, result.tokens, result.mean_nll

The text runs in windows of at most ``ctx`` tokens (each window starts with an empty cache, as a
fresh sequence would), in chunks of the program's ``max_chunk``; every token after the first of a window is
scored by the log-softmax (float64) of the logits at the position before it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from .models.base import CompiledLM

__all__ = ["PerplexityResult", "perplexity", "token_nll"]


@dataclass
class PerplexityResult:
    tokens: int        # tokens scored
    total_nll: float   # the sum of their negative log-likelihoods (nats)

    @property
    def mean_nll(self) -> float:
        return self.total_nll / self.tokens if self.tokens else float("nan")

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean_nll) if self.tokens else float("nan")

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "mean_nll": round(self.mean_nll, 6), "perplexity": round(self.perplexity, 4)}


def token_nll(logits: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    """Negative log-likelihood of ``targets[i]`` under the row ``logits[i]`` (float64 log-softmax)."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 2 or z.shape[0] != len(targets):
        raise ValueError(f"token_nll: logits of shape {z.shape} for {len(targets)} targets")
    top = z.max(axis=1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(z - top).sum(axis=1))
    return log_norm - z[np.arange(len(targets)), np.asarray(targets, dtype=np.int64)]


def perplexity(step: "CompiledLM", ids: Sequence[int], window: int | None = None) -> PerplexityResult:
    """The perplexity of ``ids`` under ``step`` (compiled with ``last_only=False``), in windows of
    ``window`` tokens (default: the program's context bound)."""
    if step.last_only:
        raise ValueError("perplexity: the step program returns only the last position's logits; compile it with "
                         "last_only=False")
    window = step.ctx if window is None else window
    if not 2 <= window <= step.ctx:
        raise ValueError(f"perplexity: window {window} must lie in 2..{step.ctx} (the context bound)")
    ids = [int(i) for i in ids]
    if len(ids) < 2:
        raise ValueError(f"perplexity: the text has {len(ids)} token(s); at least 2 are needed")
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        part = ids[start:start + window]
        if len(part) < 2:
            break
        caches, pos = step.new_caches(), 0
        for c in range(0, len(part) - 1, step.max_chunk):
            chunk = part[c:c + step.max_chunk]
            logits, caches = step.run(chunk, pos, caches)
            pos += len(chunk)
            # row i predicts the token after chunk[i]; the window's last token predicts nothing scored
            targets = part[c + 1:c + 1 + len(chunk)]
            total += float(token_nll(logits[:len(targets)], targets).sum())
            count += len(targets)
    return PerplexityResult(count, total)
