"""Pipeline parallelism on this machine, in two local stages: what one transfer costs and what micro-batches do.

    python benchmarks/pipeline_parallel.py [--batch 8] [--steps 16] [--rounds 5] [--model PATH] [--json]

1. The one-way time of a gloo send/recv (``PipeChannel``) of a SmolLM2 hidden state (576 float32) and of one
   row of logits (49152 float32), from 200 round trips per run.
2. The batched decode step of ``serve --pipeline-parallel 2`` (``PipelineBatchedStep``, ``--batch`` rows of
   ``ctx`` 256 at position 64) with 1, 2 and 4 micro-batches, alternated in each round: steps/s and row
   tokens/s, min / median over the rounds.

It starts its own two ranks (``lightspeed.parallel.launch.run_ranks``); rank 0 prints the report.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

MICRO = (1, 2, 4)


def _transfers(ch, rank: int, rounds: int) -> dict:
    out = {}
    for name, n in (("hidden_576", 576), ("logits_49152", 49152)):
        a = np.ones(n, np.float32)
        runs = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(200):
                if rank == 0:
                    ch.send(a, 1)
                    ch.recv((n,), np.float32, 1)
                else:
                    ch.send(ch.recv((n,), np.float32, 0), 0)
            runs.append((time.perf_counter() - t0) / 400 * 1e3)  # one way
        out[name] = {"one_way_ms_min": round(min(runs), 4), "one_way_ms_median": round(statistics.median(runs), 4)}
    return out


def _micro_batches(model, batch: int, steps: int, rounds: int) -> dict:
    from lightspeed.parallel.pipeline_batched import PipelineBatchedStep
    model.step.deliver = "first"
    stepped = {m: PipelineBatchedStep(model.step, batch, micro_batches=m) for m in MICRO}
    tokens, positions = np.full(batch, 17, np.int32), np.full(batch, 64, np.int32)
    for s in stepped.values():  # warm: threads started, weights paged in
        s.run(tokens, positions)
    times: dict[int, list[float]] = {m: [] for m in MICRO}
    for _ in range(rounds):
        for m, s in stepped.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                s.run(tokens, positions)
            times[m].append((time.perf_counter() - t0) / steps)
    return {f"micro_batches_{m}": {"steps_per_s_min": round(1 / max(t), 2),
                                   "steps_per_s_median": round(1 / statistics.median(t), 2),
                                   "row_tokens_per_s_median": round(batch / statistics.median(t), 1)}
            for m, t in times.items()}


def rank_main(a: argparse.Namespace) -> int:
    import lightspeed.api as lsa
    from lightspeed.backend.c import set_num_threads
    set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    model = lsa.load(a.model, ctx=256, pipeline_parallel=2, progress=False)
    rank = model.step.comm.rank
    try:
        report = {"cores": os.cpu_count(), "batch": a.batch, "steps": a.steps, "rounds": a.rounds,
                  "transfers": _transfers(model.step.channel, rank, a.rounds),
                  "decode_step": _micro_batches(model, a.batch, a.steps, a.rounds)}
    finally:
        model.step.comm.close()
    if rank == 0:
        if a.json:
            print(json.dumps(report))
        else:
            for name, t in report["transfers"].items():
                print(f"send/recv {name}: {t['one_way_ms_min']} / {t['one_way_ms_median']} ms one way (min / median)")
            for name, r in report["decode_step"].items():
                print(f"{a.batch} rows, {name}: {r['steps_per_s_min']} / {r['steps_per_s_median']} steps/s "
                      f"(min / median), {r['row_tokens_per_s_median']} row tokens/s")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--model", default=None)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if "RANK" in os.environ:
        return rank_main(a)
    from lightspeed.parallel.launch import run_ranks
    return run_ranks(2, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
