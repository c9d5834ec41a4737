"""Picking the next token from logits: greedy, temperature, top-k, top-p, min-p, repetition penalty.

Only a few tokens can survive top-k, top-p or min-p, so the filters work on a small candidate set
found by partial selection (``top_set``); a pass over the whole vocabulary is a vectorised max,
compare or exp-and-sum, never a sort. The repetition penalty touches only the distinct ids of the
history, which ``SeenTokens`` keeps up to date from the tokens appended since the previous call.

The kept tokens and their renormalised probabilities are those of the straightforward definition
(softmax over the whole vocabulary, stable sort by descending probability, cumulative sum), up to
rounding. Ties:

- top-k keeps every token whose logit equals the k-th largest, so more than k tokens may survive;
- top-p orders tokens by descending probability, equal probabilities by ascending token id, and keeps
  the shortest prefix whose mass reaches ``top_p`` (its last token included), so of tokens tied at the
  boundary the lower ids are kept;
- min-p keeps every token whose probability is at least ``min_p`` times the largest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

import numpy as np

# candidate-set sizes tried in turn for top-p without top-k before the full sort
_TOP_P_CANDIDATES = (64, 512, 4096)
# weights are drawn from through per-block sums above this many entries (np.cumsum over a whole
# vocabulary costs more than the rest of sampling)
_DRAW_BLOCK = 2048


@dataclass
class SamplingParams:
    """How the next token is picked. ``temperature == 0`` is greedy (argmax, first on ties);
    ``top_k == 0``, ``top_p == 1``, ``min_p == 0`` and ``repetition_penalty == 1`` switch those off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def check(self) -> None:
        if not (self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


# repetition penalty ----------------------------------------------------------------------------------
def penalise(logits: np.ndarray, ids: np.ndarray, penalty: float) -> np.ndarray:
    """``logits`` (not modified) with CTRL's penalty on the distinct token ``ids``: a logit is divided
    by ``penalty`` when positive and multiplied by it when negative."""
    if penalty == 1.0 or ids.size == 0:
        return logits
    out = logits.copy()
    seen = out[ids]
    out[ids] = np.where(seen > 0, seen / penalty, seen * penalty)
    return out


def apply_repetition_penalty(logits: np.ndarray, previous: Iterable[int], penalty: float) -> np.ndarray:
    """CTRL's penalty as Hugging Face applies it: each token seen before has its logit divided by
    ``penalty`` when positive and multiplied by it when negative."""
    return penalise(logits, np.unique(np.fromiter(previous, dtype=np.int64)), penalty)


class SeenTokens:
    """The distinct ids of a token history that grows between calls (a generation's prompt plus what it
    has produced). ``update`` looks only at the tokens appended since its previous call, after checking
    that the history still starts with the tokens it saw; any other history is taken from scratch."""

    def __init__(self) -> None:
        self._history: list[int] = []
        self._distinct: set[int] = set()
        self.ids = np.empty(0, dtype=np.int64)

    def update(self, history: Sequence[int]) -> np.ndarray:
        """The distinct ids of ``history`` (in order of first appearance)."""
        if not isinstance(history, list):
            history = [int(t) for t in history]
        n = len(self._history)
        # the prefix comparison is one C-level pass over object pointers (the same int objects)
        if len(history) < n or history[:n] != self._history:
            self._history, self._distinct, n = [], set(), 0
            self.ids = np.empty(0, dtype=np.int64)
        new = history[n:]
        if new:
            self._history.extend(new)
            fresh = [t for t in dict.fromkeys(new) if t not in self._distinct]
            if fresh:
                self._distinct.update(fresh)
                self.ids = np.concatenate([self.ids, np.asarray(fresh, dtype=np.int64)])
        return self.ids


# candidate selection ---------------------------------------------------------------------------------
def top_set(x: np.ndarray, k: int) -> np.ndarray:
    """The ascending ids of the tokens whose logit is at least the k-th largest (ties included), leaving
    out -inf logits. Exact; a strided sample of ``x`` finds a threshold that a few hundred tokens pass,
    so the exact selection partitions those only (the whole vocabulary when the sample misleads)."""
    n = x.size
    if k >= n:
        return np.flatnonzero(x > -np.inf)
    stride = max(1, n // 1024)
    # the sample holds k / stride of the top k on average; its rank-th largest is passed by about
    # 2k + 6 * stride tokens and is above the k-th largest (no shortcut) with odds near 1e-6
    rank = math.ceil(2 * k / stride) + 6
    pool = None
    if stride > 1 and rank < n // stride:
        sample = x[::stride]
        guess = np.partition(sample, sample.size - rank)[sample.size - rank]
        pool = np.flatnonzero(x >= guess)
        if pool.size < k:                        # the guess was above the k-th largest: no shortcut
            pool = None
    if pool is None:
        kth = np.partition(x, n - k)[n - k]
        if kth == -np.inf:
            return np.flatnonzero(x > -np.inf)
        return np.flatnonzero(x >= kth)
    values = x[pool]
    kth = np.partition(values, pool.size - k)[pool.size - k]
    if kth == -np.inf:
        return np.flatnonzero(x > -np.inf)
    return pool[values >= kth]


class Candidates(NamedTuple):
    """The tokens that survive the filters, in ascending id order, and their probabilities: renormalised
    (float64) after a filter; unnormalised weights when ``ids is None``, which stands for the whole
    vocabulary (normalising would cost one more pass over it, and ``draw`` does not need it)."""

    ids: np.ndarray | None
    weights: np.ndarray


def select(x: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> Candidates:
    """The distribution that the sampler draws from for (penalised) logits ``x``: softmax of
    ``x / temperature`` restricted to the top-k / top-p / min-p sets. ``x`` is float32 or float64 and
    free of NaN; a +inf logit is outside the contract, as in the plain definition."""
    n = x.size
    by_k = 0 < top_k < n
    if not (by_k or top_p < 1.0 or min_p > 0.0):
        return Candidates(None, _full_softmax(x, temperature))
    if by_k:
        # the top-k set is the whole support, so its own sum is the normaliser
        ids = top_set(x, top_k)
        return _filter(x, ids, temperature, top_p, min_p, normaliser=None)
    xmax = _finite_max(x)
    if top_p >= 1.0:
        # min-p alone keeps x / T - max / T >= log(min_p): preselect in logit space with a margin far
        # above rounding, then decide exactly on the preselected tokens
        bound = float(xmax) + temperature * math.log(min_p)
        margin = 1e-6 * (abs(float(xmax)) + abs(bound)) + 1e-30
        ids = np.flatnonzero(x >= bound - margin)
        return _filter(x, ids, temperature, top_p, min_p, normaliser=None)
    normaliser = _exp_sum(x, xmax, temperature)
    for size in _TOP_P_CANDIDATES:
        if size >= n:
            break
        ids = top_set(x, size)
        found = _filter(x, ids, temperature, top_p, min_p, normaliser, need_cover=True)
        if found is not None:
            return found
    return _filter(x, np.flatnonzero(x > -np.inf), temperature, top_p, min_p, normaliser)


def _filter(x: np.ndarray, ids: np.ndarray, temperature: float, top_p: float, min_p: float,
            normaliser: float | None, need_cover: bool = False) -> Candidates | None:
    """Apply top-p and min-p to the candidates ``ids`` (ascending; every token outside them ranks
    below all of them). ``normaliser`` is the exp-sum of the whole distribution relative to its max,
    None when the candidates are the whole support. With ``need_cover``, None when the answer depends
    on tokens outside the candidates (top-p's mass is not reached and min-p excludes none of them)."""
    if ids.size == 0:
        raise ValueError("sampling: every logit is -inf")
    # candidates are divided by T in float64, as the plain definition does, so their values are its own
    z = x[ids].astype(np.float64) / temperature
    z -= z.max()
    e = np.exp(z)
    probs = e / (e.sum() if normaliser is None else normaliser)
    keep = None
    if min_p > 0.0:
        keep = probs >= min_p * probs.max()
    if top_p < 1.0:
        order = np.argsort(-probs, kind="stable")  # ids ascend, so equal probabilities go by id
        cumulative = np.cumsum(probs[order])
        n_keep = int(np.searchsorted(cumulative, top_p, side="left")) + 1
        if need_cover and n_keep > ids.size and (keep is None or keep.all()):
            return None
        if n_keep < ids.size:
            in_p = np.zeros(ids.size, dtype=bool)
            in_p[order[:n_keep]] = True
            keep = in_p if keep is None else keep & in_p
    if keep is not None:
        ids, e = ids[keep], e[keep]
    return Candidates(ids, e / e.sum())


def _exp_sum(x: np.ndarray, xmax, temperature: float) -> float:
    """sum(exp((x - max) / T)) over the whole vocabulary, in x's precision."""
    with np.errstate(over="ignore"):  # a difference that overflows is -inf, and its exp the right 0
        buf = np.subtract(x, xmax)
        np.multiply(buf, buf.dtype.type(1.0 / temperature), out=buf)
    np.exp(buf, out=buf)
    return float(buf.sum())


def _full_softmax(x: np.ndarray, temperature: float) -> np.ndarray:
    """Unnormalised softmax weights of x / T over the whole vocabulary (the draw normalises)."""
    with np.errstate(over="ignore"):  # as in _exp_sum
        buf = np.subtract(x, _finite_max(x))
        np.multiply(buf, buf.dtype.type(1.0 / temperature), out=buf)
    return np.exp(buf, out=buf)


def _finite_max(x: np.ndarray):
    xmax = x.max()
    if xmax == -np.inf:
        raise ValueError("sampling: every logit is -inf")
    return xmax


# drawing ---------------------------------------------------------------------------------------------
def draw(weights: np.ndarray, u: float) -> int:
    """Inverse-CDF sampling: the index where the cumulative sum of ``weights`` (in index order) first
    exceeds ``u`` times their total, for a uniform ``u`` in [0, 1). Never a zero-weight index."""
    n = weights.size
    if n <= _DRAW_BLOCK:
        cumulative = np.cumsum(weights, dtype=np.float64)
        i = int(np.searchsorted(cumulative, u * float(weights.sum(dtype=np.float64)), side="right"))
        return i if i < n else _last_positive(weights)
    # the same search in two levels: which block, then where in it
    whole = n - n % _DRAW_BLOCK
    # block sums in the weights' precision (pairwise, so float32 is close to exact), accumulated in float64
    sums = weights[:whole].reshape(-1, _DRAW_BLOCK).sum(axis=1)
    if whole < n:
        sums = np.append(sums, weights[whole:].sum())
    block_cum = np.cumsum(sums, dtype=np.float64)
    target = u * float(block_cum[-1])
    b = int(np.searchsorted(block_cum, target, side="right"))
    if b >= sums.size:
        return _last_positive(weights)
    start = b * _DRAW_BLOCK
    block = weights[start:start + _DRAW_BLOCK]
    base = float(block_cum[b - 1]) if b else 0.0
    i = int(np.searchsorted(base + np.cumsum(block, dtype=np.float64), target, side="right"))
    return start + (i if i < block.size else _last_positive(block))


def _last_positive(weights: np.ndarray) -> int:
    return int(np.flatnonzero(weights > 0)[-1])


class Sampler:
    """Picks tokens from logits with ``SamplingParams``; its random generator is seeded once."""

    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()
        self.params.check()
        self.rng = np.random.default_rng(self.params.seed)
        self.seen = SeenTokens()

    def distribution(self, logits: np.ndarray, previous: Sequence[int] = ()) -> Candidates:
        """The tokens that may be drawn next and their probabilities (temperature > 0)."""
        p = self.params
        if p.temperature == 0:
            raise ValueError("greedy sampling has no distribution: the argmax is drawn")
        return select(self._penalised(logits, previous), p.temperature, p.top_k, p.top_p, p.min_p)

    def __call__(self, logits: np.ndarray, previous: Sequence[int] = ()) -> int:
        """The next token for ``logits`` (one row over the vocabulary). ``previous`` (the tokens so far,
        read only with a repetition penalty) is typically one list that grows between calls: then only
        its new tail is looked at, after a check that the rest is unchanged."""
        p = self.params
        x = self._penalised(logits, previous)
        if p.temperature == 0:
            return int(np.argmax(x))
        ids, weights = select(x, p.temperature, p.top_k, p.top_p, p.min_p)
        # one uniform draw per token: reproducible for a seed and platform-independent
        i = draw(weights, self.rng.random())
        return i if ids is None else int(ids[i])

    def _penalised(self, logits: np.ndarray, previous: Sequence[int]) -> np.ndarray:
        x = np.asarray(logits, dtype=np.float32).reshape(-1)
        if self.params.repetition_penalty == 1.0 or len(previous) == 0:
            return x
        return penalise(x, self.seen.update(previous), self.params.repetition_penalty)


def filter_logits(logits: np.ndarray, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> np.ndarray:
    """Set the logits of tokens outside the top-k / nucleus (top-p) / min-p sets to -inf (float64).
    The most likely token always survives; ties are resolved as the module docstring says."""
    x = np.asarray(logits)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    x = x.reshape(-1)
    ids = select(x, 1.0, top_k, top_p, min_p).ids
    if ids is None:
        return x.astype(np.float64)
    out = np.full(x.size, -np.inf)
    out[ids] = x[ids]
    return out
