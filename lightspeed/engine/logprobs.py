"""Token log-probabilities of sampled tokens, as a sequence records them (OpenAI's ``logprobs``).

The values are the model's own distribution: ``log_softmax`` of the raw next-token logits (temperature 1,
before ``logit_bias``, penalties and the top-k / top-p / min-p filters), which is what a client computing
perplexities expects (vLLM's default does the same). They are computed in float64 from the float32 logits.
How an endpoint shapes them is ``lightspeed.serve.logprobs``'s business.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its id, log-probability, the ``top`` alternatives (id, logprob) in descending
    order, and ``offset``, the character offset of its text in the completion."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    offset: int


def token_logprobs(logits: np.ndarray, token: int, top_n: int, offset: int) -> TokenLogprob:
    """The log-probability of ``token`` under ``logits`` and the ``top_n`` most likely tokens (ties by id)."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    top: tuple[tuple[int, float], ...] = ()
    if top_n > 0:
        k = min(top_n, x.size)
        ids = np.argpartition(-x, k - 1)[:k]
        ids = ids[np.lexsort((ids, -x[ids]))]  # descending logit, then ascending id
        top = tuple((int(i), float(x[i] - lse)) for i in ids)
    return TokenLogprob(int(token), float(x[int(token)] - lse), top, offset)
