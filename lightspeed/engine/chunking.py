"""How many prompt tokens the engine prefills per turn: chunked prefill inside the batch.

A prompt admitted while other sequences decode is prefilled a chunk per turn, between their decode
steps, so each of their tokens waits for one chunk at most. A chunk's size trades their pace against the
new prompt's time to first token: every token of a chunk costs about as much compute as a decode row, so
a 16-token chunk can take several times a small batch's decode step.

``ChunkPolicy(max_chunk, chunk)``:

- ``chunk=N`` runs N tokens per turn while others decode;
- ``chunk=None`` ("auto", the default) sizes each chunk to take about ``share`` times a decode step
  (0.5: a running stream's gap between tokens grows by about half while a prompt arrives, whatever the
  model, the machine or the batch; the decode steps themselves also slow down somewhat, as the two
  programs take turns with the caches, so expect nearer 2x). It fits a call's time as
  ``fixed + per_token * tokens`` to moving averages over the prefill calls made so far (large chunks run
  alone and small ones run between steps pin both down) and keeps a moving average of the decode step's
  time; the size is then
  ``(share * step - fixed) / per_token``, at least ``MIN_AUTO_CHUNK`` (where a call's fixed cost alone is
  about a step, as for a tiny model, smaller chunks would only make the prompt take more turns). Until it
  has measured both, chunks are ``MIN_AUTO_CHUNK`` tokens. While more requests wait for a free slot (a
  burst of new requests), ``queued_share`` (2.0) replaces ``share``: they join the batch about four times
  sooner, and the running streams' gaps stay under about 3x.

With a mixed step (lightspeed.engine.mixed), a chunk rides on the decode step instead of running between two:
then only its own rows cost time. ``size(..., mixed=True)`` is steered by what the mixed steps cost beyond a
plain decode step (``mixed(tokens, seconds)``): after each one the size moves halfway to
``size * share * step / extra``, whose fixed point is the size whose extra time is ``share`` of a step (if
``extra = fixed + per_token * size``, the fixed point is ``(share * step - fixed) / per_token``), never below
``MIN_MIXED_CHUNK`` (the floor of a call of its own: a prompt then arrives at least as fast as between steps,
while each turn makes one pass over the weights less) unless the step has less room (``limit``). No fit is
needed, so sizes that never vary cannot stall it.

A prompt admitted while nothing decodes is prefilled in chunks of ``max_chunk`` (the program's bound),
back to back: nobody waits for them.
A prompt is therefore cut differently under load than alone; the cache rows of a prompt may then differ in the last
bits (kernels may sum a row's products in another order for another number of rows), which changes a greedy token
only where two logits tie that closely. Under the C backend's "auto" activations on AVX2 CPUs and on AVX-512 ones
with AMX or without VNNI the difference is the activations' rounding instead: int16 for calls of up to 8 rows, float
for longer ones, or with AMX bfloat16 tiles for their first rows & ~15 (about 2e-3 of a logit on SmolLM2), so near
ties flip more often; ``activations="float"`` keeps a prompt's rows the same however it is cut.
"""
from __future__ import annotations

DEFAULT_PREFILL_CHUNK = None  # auto: the chunk size follows the measured times (the servers' default)
MIN_AUTO_CHUNK = 4   # tokens of the first chunk, and the fewest of any call of its own
# the fewest of a chunk riding on a decode step: as many as the fewest of a call of its own, so a prompt arrives
# at least as fast as between steps while each turn makes one pass over the weights less
MIN_MIXED_CHUNK = MIN_AUTO_CHUNK
STEP_SMOOTHING = 0.25  # weight of the newest decode step in its moving average
CALL_SMOOTHING = 0.1   # weight of the newest prefill call in the fit (longer memory: it needs two sizes)


class CallFit:
    """``seconds = fixed + per_token * tokens`` fitted to moving averages of the calls seen."""

    def __init__(self, smoothing: float = CALL_SMOOTHING):
        self.smoothing = smoothing
        self._calls: tuple[float, float, float, float] | None = None  # averages of n, t, n*n, n*t

    def add(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            sample = (float(tokens), seconds, float(tokens * tokens), tokens * seconds)
            old = self._calls
            self._calls = sample if old is None else tuple(_average(o, s, self.smoothing)
                                                           for o, s in zip(old, sample))

    def cost(self) -> tuple[float, float] | None:
        """(seconds per call, seconds per token), or None before any call."""
        if self._calls is None:
            return None
        n, t, nn, nt = self._calls
        spread = nn - n * n
        per_token = (nt - n * t) / spread if spread > 1e-6 * nn else 0.0
        if per_token <= 0:  # one size seen (or noise): charge everything per token, the cautious reading
            return 0.0, max(t, 0.0) / n
        return max(0.0, t - per_token * n), per_token


class ChunkPolicy:
    """Chunk sizes for prefill: ``size(alone)`` before a chunk; ``decoded``, ``prefilled`` or ``mixed`` after
    each call."""

    def __init__(self, max_chunk: int, chunk: int | None = None, share: float = 0.5, queued_share: float = 2.0):
        if type(max_chunk) is not int or max_chunk < 1:
            raise ValueError(f"max_chunk must be a positive number of tokens, got {max_chunk!r}")
        if chunk is not None and (type(chunk) is not int or chunk < 1):
            raise ValueError(f"prefill_chunk must be a positive number of tokens or None (auto), got {chunk!r}")
        if not (share > 0 and queued_share > 0):
            raise ValueError(f"share and queued_share must be positive, got {share!r} and {queued_share!r}")
        self.max_chunk = max_chunk
        self.chunk = None if chunk is None else min(chunk, max_chunk)
        self.share, self.queued_share = float(share), float(queued_share)
        self.step_seconds: float | None = None  # moving average of a decode step
        self.calls = CallFit()  # prefill calls of their own
        self.mixed_size = float(MIN_AUTO_CHUNK)  # tokens of a chunk riding on a decode step (at ``share``)

    def size(self, alone: bool, queued: bool = False, mixed: bool = False, limit: int | None = None) -> int:
        """Tokens of the next chunk: ``alone`` when no other sequence decodes, ``queued`` when more requests
        wait for a slot behind this prompt, ``mixed`` when the chunk rides on a decode step; at most ``limit``
        (the mixed step's bound) when given."""
        top = self.max_chunk if limit is None else min(self.max_chunk, limit)
        if alone:
            return top
        if self.chunk is not None:
            return min(self.chunk, top)
        share = self.queued_share if queued else self.share
        if mixed:
            return min(top, max(MIN_MIXED_CHUNK, round(self.mixed_size * share / self.share)))
        least = min(MIN_AUTO_CHUNK, top)
        cost = self.call_cost()
        if self.step_seconds is None or cost is None:
            return least
        fixed, per_token = cost
        return max(least, min(top, round((share * self.step_seconds - fixed) / per_token)))

    def call_cost(self) -> tuple[float, float] | None:
        """(seconds per call, seconds per token) fitted to the recent prefill calls, or None before any."""
        return self.calls.cost()

    def decoded(self, seconds: float) -> None:
        """A decode step took ``seconds``."""
        self.step_seconds = _average(self.step_seconds, seconds, STEP_SMOOTHING)

    def prefilled(self, tokens: int, seconds: float) -> None:
        """A prefill call of ``tokens`` took ``seconds``."""
        self.calls.add(tokens, seconds)

    def mixed(self, tokens: int, seconds: float) -> None:
        """A decode step that carried ``tokens`` prompt tokens took ``seconds``."""
        if self.step_seconds is None or tokens < 1:
            return
        extra = max(seconds - self.step_seconds, 1e-6)
        # ``tokens`` ran at the queued share or the plain one; steer the plain-share size either way
        wanted = tokens * self.share * self.step_seconds / extra
        self.mixed_size = max(float(MIN_MIXED_CHUNK), min(float(self.max_chunk),
                                                          self.mixed_size + 0.5 * (wanted - self.mixed_size)))

    def describe(self) -> str | int:
        return "auto" if self.chunk is None else self.chunk


def _average(old: float | None, new: float, weight: float) -> float:
    return new if old is None else old + weight * (new - old)
