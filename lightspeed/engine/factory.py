"""An engine for a loaded model: its batched decode step where the family has one, else one call per
sequence; the prefix cache and the prefill chunk size as the caller asks."""
from __future__ import annotations

import time
from collections.abc import Callable

from ..parallel.pipeline import PipelineStep
from ..parallel.pipeline_serving import pipeline_engine
from ..parallel.serving import tensor_parallel_engine
from ..parallel.step import TensorParallelStep
from ..prefix_cache import PrefixCache
from .batched import BatchedStep, supports
from .mixed import MixedStep, supports_mixed
from .scheduler import DEFAULT_PREFILL_CHUNK, Engine, SequentialStepper


def build_engine(model, max_batch: int, *, backend: str = "c", options: dict | None = None,
                 prefix_cache_mb: int = 256, prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK, max_queue: int = 64,
                 mixed: bool = True, log: Callable[[str], None] | None = None) -> Engine:
    """An engine (not started) over ``model`` (a ``lightspeed.api.Model``: its ``lm`` and compiled ``step``)
    decoding up to ``max_batch`` sequences per step. ``options`` are the compile options the model's step was
    compiled with (activations, ...), so the batched step computes the same numbers; ``log`` hears what was
    built and how long it took. ``prefill_chunk``: prompt tokens per decode step while others decode (None:
    sized to about half a decode step, lightspeed.engine.chunking). ``mixed``: prompt chunks ride on the decode
    steps (lightspeed.engine.mixed) where the family has such a step and ``max_batch`` >= 2; else each chunk is
    a call of its own between two steps."""
    if type(max_batch) is not int or max_batch < 1:
        raise ValueError(f"max_batch must be a positive number of sequences, got {max_batch!r}")
    if prefix_cache_mb < 0:
        raise ValueError(f"prefix_cache_mb must be >= 0, got {prefix_cache_mb!r}")
    say = log or (lambda message: None)
    options = dict(options or {})
    if "activations" not in options and getattr(model.step, "activations", None) is not None:
        options["activations"] = model.step.activations  # the batched steps round as the model's step does
    if isinstance(model.step, PipelineStep):  # stage 0 of a pipeline: its calls mirrored on the other stages
        return pipeline_engine(model, max_batch, backend=backend, options=options, prefill_chunk=prefill_chunk,
                               max_queue=max_queue, log=say)
    if isinstance(model.step, TensorParallelStep):  # rank 0 of a tensor-parallel group: calls mirrored on the others
        return tensor_parallel_engine(model, max_batch, backend=backend, options=options, prefill_chunk=prefill_chunk,
                                      max_queue=max_queue, log=say)
    step = model.step
    if supports(model.lm):
        t0 = time.perf_counter()
        # the batched step shares the caches with the single-sequence program (prefill): the same type and layout
        stepper = BatchedStep(model.lm, step.ctx, max_batch, backend=backend, kv_dtype=step.kv_dtype,
                              head_major=getattr(step, "kv_update", "rows") == "heads", **options)
        say(f"compiled the batched step (up to {max_batch} sequences) in {time.perf_counter() - t0:.1f} s")
        if mixed and max_batch >= 2 and supports_mixed(model.lm):
            t0 = time.perf_counter()
            stepper = MixedStep(stepper, model.lm, step.max_chunk, backend=backend, kv_dtype=step.kv_dtype,
                                **options)
            say(f"compiled the mixed decode + prefill step in {time.perf_counter() - t0:.1f} s")
    else:
        stepper = SequentialStepper(step, max_batch)
        say(f"{type(model.lm).__name__} has no batched step: sequences decode one call each")
    cache = PrefixCache(prefix_cache_mb << 20) if prefix_cache_mb > 0 else None
    return Engine(step, stepper, max_queue=max_queue, prefix_cache=cache, prefill_chunk=prefill_chunk)
