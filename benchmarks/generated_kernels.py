"""SmolLM2 with the compiler's own kernels (templates off) against the hand-written templates, in one run.

Both programs are compiled from the same file (Q8_0 by default); rounds alternate them: a prefill of
``--prompt-tokens`` random token ids, then ``--decode-tokens`` single-token steps. Prints min/median over
rounds of prefill and decode tokens/s for each, and the ratio generated / templates of the medians.

    python benchmarks/generated_kernels.py [--quant q8_0] [--rounds 5] [--threads 2] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import lightspeed.api as lsa
from lightspeed.backend.c import set_num_threads
from lightspeed.bench.machine import machine_summary


def one_round(model, ids: np.ndarray, decode: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) of one prompt and ``decode`` steps on ``model``'s compiled step."""
    step = model.step
    caches = step.new_caches()
    chunk = step.max_chunk
    t = time.perf_counter()
    for p in range(0, len(ids), chunk):
        logits, caches = step.run(ids[p:p + chunk], p, caches)
    prefill = len(ids) / (time.perf_counter() - t)
    tok = int(np.argmax(logits[-1]))
    t = time.perf_counter()
    for k in range(decode):
        logits, caches = step.run([tok], len(ids) + k, caches)
        tok = int(np.argmax(logits[-1]))
    return prefill, decode / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--quant", default="q8_0")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    set_num_threads(args.threads)
    ctx = args.prompt_tokens + args.decode_tokens + 8
    models, compile_s = {}, {}
    for name, templates in (("templates", True), ("generated", False)):
        t = time.perf_counter()
        models[name] = lsa.load(args.model, quant=args.quant, templates=templates, progress=False, ctx=ctx,
                                max_chunk=args.prompt_tokens)
        compile_s[name] = time.perf_counter() - t
    ids = np.random.default_rng(0).integers(0, 1000, args.prompt_tokens)
    for m in models.values():  # warm-up: pages in the weights, starts the threads
        one_round(m, ids[:16], 2)
    runs: dict[str, list[tuple[float, float]]] = {n: [] for n in models}
    for _ in range(args.rounds):
        for name, m in models.items():
            runs[name].append(one_round(m, ids, args.decode_tokens))
            time.sleep(0.1)
    report = {"machine": machine_summary(), "threads": args.threads, "quant": args.quant,
              "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens, "rounds": args.rounds,
              "date": time.strftime("%Y-%m-%d"), "compile_s": compile_s}
    for name, rs in runs.items():
        pre, dec = [r[0] for r in rs], [r[1] for r in rs]
        report[name] = {"prefill_tokens_per_s": {"min": min(pre), "median": statistics.median(pre)},
                        "decode_tokens_per_s": {"min": min(dec), "median": statistics.median(dec)}}
    for key in ("prefill_tokens_per_s", "decode_tokens_per_s"):
        report[f"{key}_ratio"] = report["generated"][key]["median"] / report["templates"][key]["median"]
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{report['machine'].get('cpu', '')}, {args.threads} threads, {args.quant}, "
          f"{args.prompt_tokens}-token prompt, {args.decode_tokens} decode tokens, {args.rounds} rounds")
    for name in ("templates", "generated"):
        r = report[name]
        print(f"{name:10} prefill {r['prefill_tokens_per_s']['median']:8.1f} tok/s (min "
              f"{r['prefill_tokens_per_s']['min']:.1f})   decode {r['decode_tokens_per_s']['median']:7.1f} tok/s "
              f"(min {r['decode_tokens_per_s']['min']:.1f})   compile {compile_s[name]:.1f} s")
    print(f"generated / templates: prefill {report['prefill_tokens_per_s_ratio']:.2f}x, "
          f"decode {report['decode_tokens_per_s_ratio']:.2f}x")


if __name__ == "__main__":
    main()
