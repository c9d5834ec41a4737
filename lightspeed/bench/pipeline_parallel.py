"""The pipeline-parallel row of ``lightspeed bench --pipeline-parallel N``: decode and prefill tokens/s of N
stages (``lightspeed.parallel.pipeline.PipelineStep``) on the same random prompt as the one-process run, and
each stage's send/recv milliseconds per token.

``measure_stage`` runs in every rank (started by ``lightspeed.parallel.launch`` or torchrun). A single sequence
goes through the stages one after the other (the last stage's logits are broadcast, as in ``generate``), so
rank 0's seconds are the group's. A stage's send/recv seconds include waiting while the other stages compute:
they are the time it does not compute. After the timed runs each rank's figures are summed into one array
(each fills its own row), so rank 0 reports them all.
"""
from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from .machine import available_cores
from .parallel_rows import merge_parallel_row, table_lines, timed_run
from .runner import BenchOptions, Timings

__all__ = ["measure_stage", "merge_stage_row", "format_stage_rows"]


def measure_stage(opts: BenchOptions, world: int, log: Callable[[str], None]) -> dict[str, Any] | None:
    """Time this stage of ``world`` on ``opts``'s work (``opts.runs`` runs after an untimed one); rank 0 returns
    the pipeline row, the other ranks None. Every rank of the group must call it with the same options."""
    from ..api import default_model_path, load
    from ..backend.c import set_num_threads
    from ..cli_generate import activation_options, kv_cache_options

    if opts.prompt_tokens < 1 or opts.decode_tokens < 1 or opts.runs < 1:
        raise ValueError(f"bench: prompt tokens ({opts.prompt_tokens}), decode tokens ({opts.decode_tokens}) and "
                         f"runs ({opts.runs}) must be positive")
    path = os.path.abspath(opts.model) if opts.model else default_model_path()
    threads = opts.threads or available_cores()
    set_num_threads(threads)
    options = {**activation_options(opts.activations), **kv_cache_options(opts.kv_cache)}
    model = load(path, ctx=opts.prompt_tokens + opts.decode_tokens, max_chunk=min(opts.prompt_tokens, 512),
                 quant=opts.quant, progress=False, pipeline_parallel=world, **options)
    step, comm = model.step, model.step.comm
    try:
        if comm.rank == 0:
            log(f"{world} stages compiled ({step.compile_seconds:.1f} s on rank 0, {step.plan})")
        prompt = np.random.default_rng(opts.seed).integers(0, model.config.vocab_size, opts.prompt_tokens)
        caches = step.new_caches()
        timed_run(step, caches, prompt, opts.decode_tokens, step.channel)  # pages in the weights, starts threads
        timings, pre_wait, dec_wait = Timings(), [], []
        for r in range(opts.runs):
            pre, dec, pre_s, dec_s = timed_run(step, caches, prompt, opts.decode_tokens, step.channel)
            timings.prefill_s.append(pre)
            timings.decode_s.append(dec)
            pre_wait.append(pre_s)
            dec_wait.append(dec_s)
            if comm.rank == 0:
                log(f"{world} stages, run {r + 1}/{opts.runs}: {opts.decode_tokens / dec:.1f} tok/s decode")
        mine = np.zeros((comm.world, 4), np.float64)  # every rank's figures, each in its own row of a sum
        mine[comm.rank] = [statistics.median(dec_wait) / opts.decode_tokens,
                           statistics.median(pre_wait) / opts.prompt_tokens, step.layer_bytes(),
                           len(step.plan.layers)]
        comm.all_reduce(mine)
        if comm.rank != 0:
            return None
        row = timings.rates(opts.prompt_tokens, opts.decode_tokens)
        row.update({
            "stages": world, "threads_per_rank": threads, "communicator": type(comm).__name__,
            "layers_per_stage": [int(v) for v in mine[:, 3]],
            "sendrecv_ms_per_decode_token": [round(1e3 * v, 4) for v in mine[:, 0]],
            "sendrecv_ms_per_prompt_token": [round(1e3 * v, 4) for v in mine[:, 1]],
            "layer_weight_bytes": [int(v) for v in mine[:, 2]],
            "compile_s": step.compile_seconds,
        })
        return row
    finally:
        comm.close()


def merge_stage_row(report: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """``report`` (one process) with ``report["pipeline_parallel"]``: the one-process and N-stage rows and the
    ratio of their decode and prefill tokens/s."""
    return merge_parallel_row(report, row, "pipeline_parallel", "stages", "sendrecv_ms_per_decode_token")


def format_stage_rows(pp: dict[str, Any]) -> list[str]:
    """The text lines of a report's ``pipeline_parallel`` entry."""
    lines = table_lines(pp["rows"], "stages", "sendrecv_ms_per_decode_token", "send/recv ms/token (each stage)")
    row = pp["rows"][-1]
    lines.append(f"pipeline parallel: {row['stages']} stages decode {pp['decode_ratio']:.2f}x, prefill "
                 f"{pp['prefill_ratio']:.2f}x one process ({row['communicator']} send/recv); layers per stage "
                 + ", ".join(str(n) for n in row["layers_per_stage"]) + "; layer weights per stage "
                 + ", ".join(f"{b / 1e6:.1f} MB" for b in row["layer_weight_bytes"]))
    return lines
