"""Tensor or pipeline parallelism on this machine: decode tokens/s of one process (all cores) against N local
ranks (cores / N threads each), and the all-reduce (or send/recv) time per token, from ``lightspeed generate
--json`` runs alternated in one session (a compile cache warm-up run of each first).

    python benchmarks/tensor_parallel.py [--ranks 2] [--rounds 3] [--tokens 64] [--model PATH] [--pipeline] [--json]

Prints min / median decode tokens/s of each, their ratio, and rank 0's all-reduce milliseconds per generated
token (which include waiting for the slower rank). With ``--pipeline`` the ranks are pipeline stages
(``--pipeline-parallel N``) and the figure is rank 0's send/recv milliseconds per token: sending the hidden
state, then waiting for the last stage's logits (so it includes the other stages' compute).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROMPT = "The three laws of robotics are"


def run(ranks: int, tokens: int, model: str | None, pipeline: bool = False) -> dict:
    cmd = [sys.executable, "-m", "lightspeed", "generate", "--json", "--max-tokens", str(tokens), "--ctx", "512"]
    if model:
        cmd += ["--model", model]
    if ranks > 1:
        cmd += ["--pipeline-parallel" if pipeline else "--tensor-parallel", str(ranks)]
    out = subprocess.run(cmd + [PROMPT], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["timings"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--model", default=None)
    p.add_argument("--pipeline", action="store_true", help="pipeline stages instead of tensor-parallel ranks")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    for ranks in (1, a.ranks):  # compile caches
        run(ranks, 4, a.model, a.pipeline)
    rows = {1: [], a.ranks: []}
    for _ in range(a.rounds):
        for ranks in rows:
            rows[ranks].append(run(ranks, a.tokens, a.model, a.pipeline))
    wait = "sendrecv" if a.pipeline else "allreduce"
    report = {"cores": os.cpu_count(), "tokens": a.tokens, "rounds": a.rounds,
              "mode": "pipeline" if a.pipeline else "tensor"}
    for ranks, runs in rows.items():
        decode = [r["decode_tokens_per_s"] for r in runs]
        report[f"ranks_{ranks}"] = {"decode_min": min(decode), "decode_median": statistics.median(decode)}
        if ranks > 1:
            per_token = [1e3 * r[f"{wait}_s"] / (r["generated_tokens"] + 1) for r in runs]
            report[f"ranks_{ranks}"][f"{wait}_ms_per_token_median"] = round(statistics.median(per_token), 3)
    report["ratio_median"] = round(report[f"ranks_{a.ranks}"]["decode_median"] / report["ranks_1"]["decode_median"], 3)
    if a.json:
        print(json.dumps(report))
        return
    for ranks in rows:
        r = report[f"ranks_{ranks}"]
        name = "send/recv" if a.pipeline else "all-reduce"
        extra = f", {name} {r[f'{wait}_ms_per_token_median']} ms/token" if ranks > 1 else ""
        print(f"{ranks} rank(s): decode {r['decode_min']:.1f} / {r['decode_median']:.1f} tok/s (min / median){extra}")
    print(f"{a.ranks} {'stages' if a.pipeline else 'ranks'} / 1 process: {report['ratio_median']}x (median)")


if __name__ == "__main__":
    main()
