"""``lightspeed serve --pipeline-parallel N``: rank 0 (stage 0) serves, every other stage mirrors its engine.

The mirror of tensor-parallel serving (``lightspeed.parallel.serving``) carries over unchanged: before each
native call — a prefill chunk, a batched decode step, a slot move — rank 0 broadcasts a message with the
operation, its numbers, token ids and positions; every other rank makes the same call on its own stage
(``follow``), and the calls' transfers (hidden states to the next stage, logits back to rank 0) meet. The
decode step splits its rows into micro-batches that flow through the stages
(``lightspeed.parallel.pipeline_batched``). Only rank 0 gets logits (``deliver = "first"``): its engine
samples; a rank whose neighbour dies ends with the channel's message, rank 0 with the mirror's.

The prefix cache is off, as under tensor parallelism: its byte budget counts one stage's caches.
"""
from __future__ import annotations

import signal
import time
from collections.abc import Callable

from ..engine.scheduler import DEFAULT_PREFILL_CHUNK
from .pipeline import PipelineStep
from .pipeline_batched import PipelineBatchedStep
from .serving import Mirror, MirroredStep, MirroredStepper, TensorParallelEngine, follow

__all__ = ["build_stage_batched", "pipeline_engine", "serve_stage_follower"]


def build_stage_batched(step: PipelineStep, max_batch: int, backend: str = "c", options: dict | None = None,
                        micro_batches: int | None = None) -> tuple[PipelineBatchedStep, int]:
    """This stage's batched step and the longest row list a message carries (the same on every rank); the
    step's logits go to rank 0 only from now on."""
    step.deliver = "first"
    options = dict(options or {})
    if "activations" not in options and getattr(step, "activations", None) is not None:
        options["activations"] = step.activations  # rows computed as the stage's own program computes them
    stepper = PipelineBatchedStep(step, max_batch, micro_batches, backend=backend, **options)
    return stepper, max(max_batch, step.max_chunk)


def pipeline_engine(model, max_batch: int, *, backend: str = "c", options: dict | None = None,
                    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK, max_queue: int = 64,
                    micro_batches: int | None = None, log: Callable[[str], None] | None = None
                    ) -> TensorParallelEngine:
    """Rank 0's engine (not started) over ``model`` (``lightspeed.load(pipeline_parallel=N)``): its calls are
    mirrored on the other stages, which run ``follow`` over ``build_stage_batched``'s step."""
    step = model.step
    if not isinstance(step, PipelineStep):
        raise ValueError("pipeline_engine needs a model loaded with pipeline_parallel > 1")
    if step.comm.rank != 0:
        raise ValueError(f"rank {step.comm.rank} follows rank 0's engine (lightspeed.parallel.serving.follow)")
    t0 = time.perf_counter()
    stepper, longest = build_stage_batched(step, max_batch, backend, options, micro_batches)
    if log is not None:
        log(f"compiled {step.plan} and its batched step (up to {max_batch} "
            f"sequences in {stepper.micro_batches} micro-batches) in {time.perf_counter() - t0:.1f} s; no prefix "
            "cache under pipeline parallelism")
    mirror = Mirror(step.comm, longest)
    return TensorParallelEngine(MirroredStep(step, stepper, mirror), MirroredStepper(stepper, mirror), mirror,
                                max_queue=max_queue, prefix_cache=None, prefill_chunk=prefill_chunk)


def serve_stage_follower(world: int, model: str | None, *, ctx: int | None, quant: str | None, backend: str,
                         max_batch: int, threads: int | None, activations: dict, kv_dtype: str | None = None,
                         micro_batches: int | None = None) -> int:
    """A rank other than 0 of ``lightspeed serve --pipeline-parallel N``: load and compile this rank's stage
    as rank 0 does (the same arguments, ``micro_batches`` included), then ``follow`` its engine; the exit code.
    Ctrl-C is left to rank 0."""
    from ..api import load
    from ..backend.c import set_num_threads
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if threads is not None and backend == "c":
        set_num_threads(threads)
    m = load(model, ctx=ctx, quant=quant, backend=backend, progress=False, kv_dtype=kv_dtype,
             pipeline_parallel=world, **activations)
    stepper, longest = build_stage_batched(m.step, max_batch, backend, activations, micro_batches)
    try:
        return follow(m.step, stepper, longest)
    finally:
        m.step.comm.close()
