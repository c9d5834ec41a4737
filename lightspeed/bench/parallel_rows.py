"""What the tensor- and pipeline-parallel rows of ``lightspeed bench`` share: one timed prefill + greedy decode
with the group's communication seconds, and the merge of a row into the one-process report."""
from __future__ import annotations

import time
from typing import Any

import numpy as np


def timed_run(step, caches: dict, prompt: np.ndarray, n_decode: int,
              counter) -> tuple[float, float, float, float]:
    """(prefill s, decode s, prefill communication s, decode communication s) of one prefill in the step's
    largest chunks and ``n_decode`` greedy tokens; ``counter.seconds`` is the communication time so far (a
    communicator's all-reduces, a pipe's send/recv)."""
    s0, t0 = counter.seconds, time.perf_counter()
    pos = 0
    for start in range(0, len(prompt), step.max_chunk):
        chunk = prompt[start:start + step.max_chunk]
        logits, caches = step.run(chunk, pos, caches)
        pos += len(chunk)
    s1, t1 = counter.seconds, time.perf_counter()
    token = int(np.argmax(logits[-1]))
    for _ in range(n_decode):
        logits, caches = step.run([token], pos, caches)
        token = int(np.argmax(logits[-1]))
        pos += 1
    s2, t2 = counter.seconds, time.perf_counter()
    return t1 - t0, t2 - t1, s1 - s0, s2 - s1


def merge_parallel_row(report: dict[str, Any], row: dict[str, Any], key: str, count: str,
                       wait: str) -> dict[str, Any]:
    """``report`` (one process) with ``report[key]``: the one-process row (``count`` 1, no ``wait``), ``row``,
    and the ratio of their decode and prefill tokens/s."""
    one = {count: 1, "threads_per_rank": report["threads"], "decode_tokens_per_s": report["decode_tokens_per_s"],
           "decode_tokens_per_s_best": report["decode_tokens_per_s_best"],
           "prefill_tokens_per_s": report["prefill_tokens_per_s"],
           "prefill_tokens_per_s_best": report["prefill_tokens_per_s_best"], wait: [0.0]}
    report[key] = {
        "rows": [one, row],
        "decode_ratio": row["decode_tokens_per_s"] / one["decode_tokens_per_s"],
        "prefill_ratio": row["prefill_tokens_per_s"] / one["prefill_tokens_per_s"],
    }
    return report


def table_lines(rows: list[dict[str, Any]], count: str, wait: str, wait_title: str) -> list[str]:
    """The table of a parallel entry's ``rows``: ``count`` (ranks or stages), threads, decode and prefill tokens/s
    (median and best) and the per-process ``wait`` times per decoded token under ``wait_title``."""
    width = len(count) + 1
    lines = ["", f"{count:<{width}} {'threads':>10} {'decode tok/s':>20} {'prefill tok/s':>20} {wait_title:>34}"]
    for r in rows:
        dec = f"{r['decode_tokens_per_s']:.1f} ({r['decode_tokens_per_s_best']:.1f})"
        pre = f"{r['prefill_tokens_per_s']:.1f} ({r['prefill_tokens_per_s_best']:.1f})"
        threads = f"{r['threads_per_rank']}" + (" each" if r[count] > 1 else "")
        waits = ", ".join(f"{v:.3f}" for v in r[wait])
        lines.append(f"{r[count]:<{width}} {threads:>10} {dec:>20} {pre:>20} {waits:>34}")
    return lines
