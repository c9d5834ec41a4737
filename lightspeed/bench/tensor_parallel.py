"""The tensor-parallel row of ``lightspeed bench --tensor-parallel N``: decode and prefill tokens/s of N ranks
(``lightspeed.parallel.TensorParallelStep``) on the same random prompt as the one-process run, and each rank's
all-reduce milliseconds per token.

``measure_rank`` runs in every rank (started by ``lightspeed.parallel.launch`` or torchrun). The ranks advance in
lockstep (every step waits in its all-reduces), so rank 0's seconds are the group's; after the timed runs the
ranks' all-reduce seconds and shard sizes are summed into one array (each rank fills its own row), so rank 0
reports them all. ``merge_row`` adds the row to the one-process report with the ratio between the two.
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

__all__ = ["measure_rank", "merge_row", "format_rows"]


def measure_rank(opts: BenchOptions, world: int, log: Callable[[str], None]) -> dict[str, Any] | None:
    """Time this rank of ``world`` on ``opts``'s work (``opts.runs`` runs after an untimed one); rank 0 returns
    the tensor-parallel row, the other ranks None. Every rank of the group must call it with the same options."""
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
                 quant=opts.quant, progress=False, tensor_parallel=world, **options)
    step, comm = model.step, model.step.comm
    try:
        if comm.rank == 0:
            log(f"{world} ranks compiled ({step.compile_seconds:.1f} s on rank 0)")
        prompt = np.random.default_rng(opts.seed).integers(0, model.config.vocab_size, opts.prompt_tokens)
        caches = step.new_caches()
        timed_run(step, caches, prompt, opts.decode_tokens, step.comm)  # pages in the weights, starts the threads
        timings, pre_reduce, dec_reduce = Timings(), [], []
        for r in range(opts.runs):
            pre, dec, pre_s, dec_s = timed_run(step, caches, prompt, opts.decode_tokens, step.comm)
            timings.prefill_s.append(pre)
            timings.decode_s.append(dec)
            pre_reduce.append(pre_s)
            dec_reduce.append(dec_s)
            if comm.rank == 0:
                log(f"{world} ranks, run {r + 1}/{opts.runs}: {opts.decode_tokens / dec:.1f} tok/s decode")
        # every rank's figures, each in its own row of a sum
        mine = np.zeros((comm.world, 3), np.float64)
        mine[comm.rank] = [statistics.median(dec_reduce) / opts.decode_tokens,
                           statistics.median(pre_reduce) / opts.prompt_tokens, step.sharded_bytes()]
        comm.all_reduce(mine)
        if comm.rank != 0:
            return None
        row = timings.rates(opts.prompt_tokens, opts.decode_tokens)
        row.update({
            "ranks": world, "threads_per_rank": threads, "communicator": type(comm).__name__,
            "allreduce_calls_per_token": 2 * model.config.n_layers,
            "allreduce_ms_per_decode_token": [round(1e3 * v, 4) for v in mine[:, 0]],
            "allreduce_ms_per_prompt_token": [round(1e3 * v, 4) for v in mine[:, 1]],
            "sharded_weight_bytes": [int(v) for v in mine[:, 2]],
            "compile_s": step.compile_seconds,
        })
        return row
    finally:
        comm.close()


def merge_row(report: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """``report`` (one process) with ``report["tensor_parallel"]``: the one-process and N-rank rows and the
    ratio of their decode and prefill tokens/s."""
    return merge_parallel_row(report, row, "tensor_parallel", "ranks", "allreduce_ms_per_decode_token")


def format_rows(tp: dict[str, Any]) -> list[str]:
    """The text lines of a report's ``tensor_parallel`` entry."""
    lines = table_lines(tp["rows"], "ranks", "allreduce_ms_per_decode_token", "all-reduce ms/token (each rank)")
    row = tp["rows"][-1]
    lines.append(f"tensor parallel: {row['ranks']} ranks decode {tp['decode_ratio']:.2f}x, prefill "
                 f"{tp['prefill_ratio']:.2f}x one process; {row['allreduce_calls_per_token']} all-reduces per "
                 f"token ({row['communicator']}); split weights per rank "
                 + ", ".join(f"{b / 1e6:.1f} MB" for b in row["sharded_weight_bytes"]))
    return lines
