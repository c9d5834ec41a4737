"""The sampler as it was before candidate sets (a full float64 sort of the vocabulary every token), kept
verbatim apart from names as the oracle of tests/test_sampling_reference.py and the baseline of
benchmarks/sampling.py, plus the logits those use."""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from lightspeed.sampling import SamplingParams


def ref_penalty(logits: np.ndarray, previous: Iterable[int], penalty: float) -> np.ndarray:
    ids = np.unique(np.fromiter(previous, dtype=np.int64))
    if penalty == 1.0 or ids.size == 0:
        return logits
    out = logits.copy()
    seen = out[ids]
    out[ids] = np.where(seen > 0, seen / penalty, seen * penalty)
    return out


def ref_filter(logits: np.ndarray, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> np.ndarray:
    out = logits.astype(np.float64)
    if top_k and top_k < out.size:
        kth = np.partition(out, -top_k)[-top_k]
        out[out < kth] = -np.inf
    if top_p < 1.0 or min_p > 0.0:
        probs = ref_softmax(out)
        if top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            n_keep = int(np.searchsorted(cumulative, top_p, side="left")) + 1
            out[order[n_keep:]] = -np.inf
        if min_p > 0.0:
            out[probs < min_p * probs.max()] = -np.inf
    return out


def ref_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / e.sum()


class RefSampler:
    """The old ``Sampler``."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def distribution(self, logits: np.ndarray, previous: Sequence[int] = ()) -> np.ndarray:
        p = self.params
        x = ref_penalty(np.asarray(logits, dtype=np.float32).reshape(-1), previous, p.repetition_penalty)
        return ref_softmax(ref_filter(x.astype(np.float64) / p.temperature, p.top_k, p.top_p, p.min_p))

    def __call__(self, logits: np.ndarray, previous: Sequence[int] = ()) -> int:
        p = self.params
        x = ref_penalty(np.asarray(logits, dtype=np.float32).reshape(-1), previous, p.repetition_penalty)
        if p.temperature == 0:
            return int(np.argmax(x))
        probs = ref_softmax(ref_filter(x.astype(np.float64) / p.temperature, p.top_k, p.top_p, p.min_p))
        u = self.rng.random()
        return int(min(np.searchsorted(np.cumsum(probs), u * probs.sum(), side="right"), probs.size - 1))


# logits ------------------------------------------------------------------------------------------------
def lm_like(rng: np.random.Generator, n: int) -> np.ndarray:
    """Logits shaped like a small language model's next-token logits: a bulk with standard deviation 4 and
    a head of 256 tokens 16-23 above its middle, spaced by exponential gaps of a random scale. At
    temperature 0.8 the 0.95 nucleus of 49,152 such logits has 4 / 13 / 113 tokens at the 10th / 50th /
    90th percentile (SmolLM2-135M on a chat prompt: 2 / 7 / 180)."""
    x = rng.standard_normal(n) * 4.0
    head = rng.choice(n, min(n, 256), replace=False)
    gaps = rng.exponential(np.exp(rng.uniform(np.log(0.2), np.log(3.0))), head.size)
    x[head] = rng.uniform(16.0, 23.0) - np.cumsum(gaps)
    return x.astype(np.float32)


def logit_cases(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    one_finite = np.full(3000, -np.inf, dtype=np.float32)
    one_finite[1234] = -3.0
    few_finite = np.full(5000, -np.inf, dtype=np.float32)
    few_finite[rng.integers(0, 5000, 30)] = rng.standard_normal(30).astype(np.float32)
    huge = (rng.standard_normal(4000) * 1e30).astype(np.float32)
    huge[17] = 3e38
    return [
        ("normal", (rng.standard_normal(3000) * 3).astype(np.float32)),
        ("lm_like", lm_like(rng, 8192)),
        ("flat", (rng.standard_normal(20000) * 0.1).astype(np.float32)),
        ("integer_ties", rng.integers(0, 6, 4000).astype(np.float32)),
        ("top_ties", np.concatenate([np.full(50, 7.0), rng.standard_normal(3000)]).astype(np.float32)[
            rng.permutation(3050)]),
        ("all_equal", np.zeros(2500, dtype=np.float32)),
        ("one_finite", one_finite),
        ("few_finite", few_finite),
        ("huge", huge),
        ("scaled_1e4", (rng.standard_normal(3000) * 1e4).astype(np.float32)),
        ("tiny_vocab", rng.standard_normal(5).astype(np.float32)),
        ("single_token", np.array([0.5], dtype=np.float32)),
    ]


