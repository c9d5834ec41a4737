"""One request's generation, advanced one token at a time by the engine.

``Generation`` (lightspeed.generate) pulls its own logits from a cache; a served sequence is
pushed logits instead, by whichever batched step it shares. ``Sequence.accept(logits)`` does
exactly one turn of ``Generation``'s loop (the same sampler, stop tokens, stop strings and
UTF-8-safe detokenizer, in the same order) so that a served greedy reply equals
``lightspeed generate``'s. OpenAI's ``logit_bias`` and presence/frequency penalties adjust the
logits before the sampler sees them.

With ``logprobs`` set, each sampled token's log-probabilities (``lightspeed.engine.logprobs``) are sent
as a LOGPROBS event just before the TEXT event whose text holds that token's first character; tokens
that fall inside a stop string (whose text is cut) are not reported.

With a grammar (``RequestOptions.grammar``: structured output, a forced tool call) the sequence holds a
``lightspeed.structured.Constraint``: the logits are masked to the tokens the grammar allows after
bias and penalties and before the sampler, the sampled token advances the grammar, and the sequence
ends (``stop``) as soon as the grammar is complete or the model picks an end token the grammar allows
there. The engine usually prepares the mask while the step that produces the logits runs.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import numpy as np

from ..generate import Sampler, SamplingParams, StopStringFilter
from ..structured import CompiledGrammar, GrammarError
from .logprobs import TokenLogprob, token_logprobs

# what the engine reports to the request's consumer
TEXT, DONE, ERROR, LOGPROBS = "text", "done", "error", "logprobs"
# Generation's finish reasons in OpenAI's vocabulary (running out of context is a length limit)
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length"}


@dataclass
class RequestOptions:
    """Everything about a request that is not its prompt."""

    max_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    stop: Seq[str] = ()
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False  # the tokenizer's stop tokens do not end the sequence
    logprobs: int | None = None  # report each token's log-probability and this many alternatives
    grammar: CompiledGrammar | None = None  # the output must be a sentence of this grammar


class StopFilter(StopStringFilter):
    """``StopStringFilter`` that also records which stop string ended the text (``matched``)."""

    matched: str | None = None

    def push(self, text: str) -> str:
        buf = self.pending + text
        out = super().push(text)
        if self.stopped and self.matched is None:
            # the earliest occurrence wins, as in the filter; of stops found at the same place, the first listed
            self.matched = min((s for s in self.stops if s in buf), key=buf.find)
        return out


class Sequence:
    """A prompt being prefilled, then decoded one token per engine step.

    The engine sets ``slot`` and ``pos`` (tokens in the cache); ``accept`` consumes the logits of
    the last position and sets ``next_token`` (run it at ``pos``) or ``finish_reason``. Events go
    to ``sink(kind, payload)`` from the engine thread; ``cancel()`` may be called from any thread."""

    def __init__(self, prompt_ids: Seq[int], options: RequestOptions, tokenizer, stop_ids: set[int],
                 sink: Callable[[str, object], None]):
        if not prompt_ids:
            raise ValueError("the prompt has no tokens")
        self.prompt_ids = [int(i) for i in prompt_ids]
        self.options = options
        self.sampler = Sampler(options.params)
        self.stop_ids = set() if options.ignore_eos else stop_ids
        self.decoder = tokenizer.stream(skip_special_tokens=False)
        self.stops = StopFilter(list(options.stop))
        self.sink = sink
        self.history = list(self.prompt_ids)
        self.counts: Counter[int] = Counter()
        self.token_ids: list[int] = []
        self.text = ""
        self.logprobs: list[TokenLogprob] = []  # every reported token's entry, in order
        self._unsent = 0                        # logprobs[_unsent:] are not sent yet
        self._decoded = 0                       # characters the detokenizer has produced
        self.slot: int | None = None
        self.pos = 0
        self.cached_tokens = 0  # prompt tokens whose rows came from the prefix cache
        self.next_token: int | None = None
        self.finish_reason: str | None = None
        self.submitted = time.perf_counter()
        self.first_token_at: float | None = None
        self.constraint = options.grammar.new_constraint() if options.grammar is not None else None
        self._cancelled = threading.Event()

    # from any thread ---------------------------------------------------------------------------------
    def cancel(self) -> None:
        """The consumer went away: the engine drops the sequence (and frees its slot) before its next step."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    # on the engine thread ----------------------------------------------------------------------------
    @property
    def prefill_left(self) -> list[int]:
        return self.prompt_ids[self.pos:]

    def _adjusted(self, logits: np.ndarray) -> np.ndarray:
        o = self.options
        if not (o.logit_bias or o.presence_penalty or o.frequency_penalty):
            return logits
        x = np.array(logits, dtype=np.float32)
        for token, bias in o.logit_bias.items():
            if 0 <= token < x.size:
                x[token] += bias
        if self.counts and (o.presence_penalty or o.frequency_penalty):
            ids = np.fromiter(self.counts.keys(), dtype=np.int64)
            n = np.fromiter(self.counts.values(), dtype=np.float32)
            x[ids] -= o.frequency_penalty * n + o.presence_penalty
        return x

    def accept(self, logits: np.ndarray, capacity: int) -> bool:
        """One turn of the generation loop on the next-token ``logits``. True when the sequence goes
        on (``next_token`` is to run at ``pos``); False when it finished (``finish_reason`` set)."""
        o = self.options
        if len(self.token_ids) >= o.max_tokens:
            return self._finish("length")
        p = self.sampler.params
        x = self._adjusted(logits)
        c = self.constraint
        try:
            if c is not None:
                x = c.apply(x)
            token = self.sampler(x, self.history if p.repetition_penalty != 1.0 else ())
            if token in self.stop_ids or (c is not None and token in c.stop_ids):
                return self._finish("stop")
            if c is not None:
                c.consume(token)
        except (GrammarError, ValueError) as e:  # a grammar (or its mask) that leaves nothing to sample
            if c is None:
                raise
            self.fail(f"structured output failed: {e}")
            return False
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.token_ids.append(token)
        self.history.append(token)
        self.counts[token] += 1
        if o.logprobs is not None:
            self.logprobs.append(token_logprobs(logits, token, o.logprobs, self._decoded))
        decoded = self.decoder.push(token)
        self._decoded += len(decoded)
        piece = self.stops.push(decoded)
        if piece:
            self._emit(piece)
        if self.stops.stopped or (c is not None and c.finished):
            return self._finish("stop")
        if len(self.token_ids) >= o.max_tokens:
            return self._finish("length")
        if self.pos >= capacity:
            return self._finish("context")
        self.next_token = token
        return True

    def fail(self, message: str) -> None:
        """End with an error (reported to the consumer)."""
        if self.finish_reason is None:
            self.finish_reason = "error"
            self.next_token = None
            self.sink(ERROR, message)

    def _emit(self, piece: str) -> None:
        self.text += piece
        self._send_logprobs(len(self.text))
        self.sink(TEXT, piece)

    def _send_logprobs(self, end: int | None) -> None:
        """Send the unsent entries of tokens starting before character ``end`` (all of them: None)."""
        i = self._unsent
        while i < len(self.logprobs) and (end is None or self.logprobs[i].offset < end):
            i += 1
        if i > self._unsent:
            self.sink(LOGPROBS, self.logprobs[self._unsent:i])
            self._unsent = i

    def _finish(self, reason: str) -> bool:
        if not self.stops.stopped:
            tail = self.stops.push(self.decoder.flush())
            tail += self.stops.flush() if not self.stops.stopped else ""
            if tail:
                self._emit(tail)
        if self.stops.stopped:
            del self.logprobs[self._unsent:]  # inside the stop string: cut with its text
        else:
            self._send_logprobs(None)  # tokens without text of their own at the end
        self.finish_reason = FINISH_REASONS[reason]
        self.next_token = None
        self.sink(DONE, self.finish_reason)
        return False

    @property
    def usage(self) -> dict:
        n, m = len(self.prompt_ids), len(self.token_ids)
        return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
